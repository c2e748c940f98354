"""A world's journal: the batches applied since a snapshot, one record each, appended before applying.

A segment file holds the records after one tick (the tick of the snapshot it follows):

    header  magic b"DBVTJRNL", version u32, incarnation u64, start tick u64, CRC-32 u32 of the rest
    record  length u32 (of the batch), CRC-32 u32 (of tick and batch), tick u64, CRC-32 u32 of those
            16 bytes, then the batch as received

Records are written with one writev on the world's thread, before the batch is applied and
answered: a process that is killed loses no answered batch, whatever the fsync policy, because the
bytes are in the kernel's page cache before the answer leaves. fsync only matters when the machine
itself goes down.

A record cut short by the end of the file is a torn write: the batch was never answered (the answer
follows the write). Any other bad record is damage. The header's own CRC tells a torn record from a
damaged length: a flipped bit in a length must not pass for a record cut short.
"""
from __future__ import annotations

import os
import struct
import threading
import zlib
from dataclasses import dataclass, field

MAGIC = b"DBVTJRNL"
VERSION = 1
HEADER = struct.Struct("<8sIQQ")
HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = HEADER.size + HEADER_CRC.size
RECORD = struct.Struct("<IIQI")
RECORD_HEAD = struct.Struct("<IIQ")
TICK = struct.Struct("<Q")
# No batch is larger: the server's staging bounds them far below it.
MAX_RECORD = 2**32 - 1


class JournalError(OSError):
    """A journal could not be written; `cause` is the system's words."""


def segment_header(incarnation: int, start_tick: int) -> bytes:
    header = HEADER.pack(MAGIC, VERSION, incarnation, start_tick)
    return header + HEADER_CRC.pack(zlib.crc32(header))


def record_crc(tick: int, payload) -> int:
    return zlib.crc32(payload, zlib.crc32(TICK.pack(tick)))


class Journal:
    """The open segment of one world. `append` and `take_back` run on the world's thread only;
    `sync` and `close` may run on others (the once-a-second flusher; a deletion), so every use of
    the file descriptor holds the lock: a descriptor closed and reused elsewhere is never written."""

    def __init__(self, path: str, always_sync: bool):
        self.path = path
        self._always_sync = always_sync
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.size = os.fstat(self._fd).st_size
        # Where the last record began, so that a batch refused after its append can be taken back.
        self._before = self.size
        self._dirty = False

    @classmethod
    def create(cls, path: str, incarnation: int, start_tick: int, always_sync: bool) -> "Journal":
        """A new, empty segment (replacing any file of that name). With fsync=always its header and
        its directory entry are on disk before the first record is answered; otherwise they reach
        the disk with the records (the flusher) and the snapshot that follows (its directory fsync):
        a world's thread does not wait for an fsync that the policy does not promise."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, [segment_header(incarnation, start_tick)])
            if always_sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if always_sync:
            sync_directory(os.path.dirname(path))
        journal = cls(path, always_sync)
        journal._dirty = True
        return journal

    @property
    def records_bytes(self) -> int:
        return self.size - HEADER_SIZE

    def append(self, tick: int, payload: bytes) -> None:
        """Write one record (and, with fsync=always, sync it); raises JournalError, the segment as it
        was, when it cannot."""
        if len(payload) > MAX_RECORD:
            raise JournalError(f"a batch of {len(payload)} bytes is larger than a journal record can hold")
        head = RECORD_HEAD.pack(len(payload), record_crc(tick, payload), tick)
        record = head + HEADER_CRC.pack(zlib.crc32(head))
        with self._lock:
            if self._fd < 0:
                raise JournalError(f"journal {self.path} is closed: its world was deleted")
            self._before = self.size
            try:
                _write_all(self._fd, [record, payload])
                if self._always_sync:
                    os.fdatasync(self._fd)
            except OSError as exc:
                self._truncate(self._before)
                raise JournalError(f"cannot write journal {self.path}: {exc.strerror or exc}") from None
            self.size += len(record) + len(payload)
            self._dirty = True

    def take_back(self) -> None:
        """Remove the record just appended: its batch was refused after all (the pair limit)."""
        with self._lock:
            if self._fd >= 0:
                self._truncate(self._before)
            self.size = self._before

    def sync(self) -> None:
        with self._lock:
            if self._fd >= 0 and self._dirty:
                self._dirty = False
                os.fdatasync(self._fd)

    def close(self, sync: bool) -> None:
        with self._lock:
            if self._fd >= 0:
                if sync and self._dirty:
                    os.fdatasync(self._fd)
                os.close(self._fd)
                self._fd = -1

    def _truncate(self, size: int) -> None:
        try:
            os.ftruncate(self._fd, size)
        except OSError:
            # The record stays, but replay passes over it: its batch is refused again, on the same
            # world, and the next record carries the same tick (persistence.Store._replay).
            pass


def _write_all(fd: int, pieces: list) -> None:
    views = [memoryview(piece).cast("B") for piece in pieces]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def sync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Segment:
    """What a segment file holds, read back. `problem` is None when every byte was a good record;
    otherwise records stop at `cut_at` (the offset of the first bad byte) and `torn` tells whether
    the file simply ended inside that record. Each record is (offset, tick, batch bytes)."""

    path: str
    incarnation: int = 0
    start_tick: int = 0
    records: list[tuple[int, int, memoryview]] = field(default_factory=list)
    cut_at: int | None = None
    torn: bool = False
    problem: str | None = None


def read_segment(path: str) -> Segment:
    with open(path, "rb") as file:
        data = memoryview(file.read())
    segment = Segment(path)
    if len(data) < HEADER_SIZE:
        segment.cut_at, segment.torn, segment.problem = 0, True, "the segment header is cut short"
        return segment
    magic, version, incarnation, start_tick = HEADER.unpack(data[:HEADER.size])
    (crc,) = HEADER_CRC.unpack(data[HEADER.size:HEADER_SIZE])
    if magic != MAGIC or version != VERSION or zlib.crc32(data[:HEADER.size]) != crc:
        segment.cut_at, segment.problem = 0, "the segment header is damaged"
        return segment
    segment.incarnation, segment.start_tick = incarnation, start_tick
    at = HEADER_SIZE
    while at < len(data):
        if len(data) - at < RECORD.size:
            segment.cut_at, segment.torn, segment.problem = at, True, "a record is cut short (a torn write)"
            break
        length, crc, tick, head_crc = RECORD.unpack(data[at:at + RECORD.size])
        if zlib.crc32(data[at:at + RECORD_HEAD.size]) != head_crc:
            segment.cut_at, segment.problem = at, "a record's header is damaged (its CRC-32 does not match)"
            break
        end = at + RECORD.size + length
        if end > len(data):
            segment.cut_at, segment.torn, segment.problem = at, True, "a record is cut short (a torn write)"
            break
        payload = data[at + RECORD.size:end]
        if record_crc(tick, payload) != crc:
            segment.cut_at, segment.problem = at, "a record's CRC-32 does not match its bytes"
            break
        segment.records.append((at, tick, payload))
        at = end
    return segment
