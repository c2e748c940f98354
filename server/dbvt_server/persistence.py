"""Worlds kept across restarts in --data-dir: snapshots, journals, a lock, and restoring them at start.

    DATA_DIR/
      LOCK                      held (flock) while a server runs: a second server refuses to start
      RUNNING                   while a server runs: its pid, the machine's boot id, its fsync policy
      worlds/<dir>/             one per persistent world (<dir>: the name made safe, and a hash of it)
        snapshot-<tick>.dbvt    world images (dbvt_server.images); the newest two are kept
        journal-<tick>.log      the batches after <tick> (dbvt_server.journal)
        MOVING                  while the world is being moved to another server: its host:port
      quarantine/               what could not be restored, moved aside for an operator
      trash/                    deleted worlds, removed in the background

A batch goes to its world's journal before it is applied (World.apply), so a killed process loses
nothing that was answered. A snapshot is taken on the world's thread (the core's bytes, and a new
journal segment begun at that tick) and written by one background thread: to a temporary file,
fsynced, renamed, the directory fsynced; then snapshots beyond the newest two, and the journal
segments older than the oldest kept snapshot, are dropped. Keeping two lets a damaged newest
snapshot fall back to the one before it and replay the journal from there, losing nothing.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
import urllib.parse
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from google.protobuf.message import DecodeError

from dbvt_client.errors import DbvtError, Unavailable, quoted
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server import images
from dbvt_server.journal import HEADER_SIZE, Journal, JournalError, read_segment, sync_directory
from dbvt_server.logs import shown

log = logging.getLogger("dbvt_server")

FSYNC_POLICIES = ("always", "everysec", "no")
KEPT_SNAPSHOTS = 2
# A journal is snapshotted away once it holds more than its world's last snapshot, and this at least.
MIN_JOURNAL_BYTES = 1 << 20
SNAPSHOT = re.compile(r"snapshot-(\d{20})\.dbvt")
SEGMENT = re.compile(r"journal-(\d{20})\.log")
MOVING = "MOVING"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


class DataDirInUse(RuntimeError):
    pass


def new_incarnation() -> int:
    return secrets.randbits(64)


def world_directory_name(name: str) -> str:
    """A directory name for any world name (1 to 128 printable characters): readable, and unique
    through the hash even where the readable part is cut."""
    readable = urllib.parse.quote(name, safe="")[:80]
    return f"{readable}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def _boot_id() -> str:
    try:
        with open(BOOT_ID) as file:
            return file.read().strip()
    except OSError:
        return ""


def _write_file(path: str, pieces: list) -> int:
    """`pieces` in a new file at `path`, durably: a temporary file, fsynced, renamed, the directory
    fsynced. Returns its size."""
    temporary = path + ".tmp"
    size = 0
    try:
        with open(temporary, "wb") as file:
            for piece in pieces:
                size += file.write(piece)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    sync_directory(os.path.dirname(path))
    return size


def _ticked(directory: str, pattern: re.Pattern) -> list[tuple[int, str]]:
    """The files of `directory` that `pattern` names, with their ticks, oldest first."""
    found = [(int(match.group(1)), os.path.join(directory, entry))
             for entry in os.listdir(directory) if (match := pattern.fullmatch(entry))]
    return sorted(found)


class WorldFiles:
    """One persistent world's snapshots and journal. `append`, `take_back`, `applied` and `snapshot`
    run on the world's thread; the writing of snapshots on the store's writer thread."""

    def __init__(self, store: "Store", directory: str, journal: Journal, snapshot_tick: int, snapshot_bytes: int):
        self.store = store
        self.directory = directory
        self.journal = journal
        # The tick of the newest snapshot begun, and its size once written.
        self.snapshot_tick = snapshot_tick
        self.snapshot_bytes = snapshot_bytes
        self._writing: Future | None = None
        # Set when the world is deleted: a snapshot still being written is dropped quietly.
        self.discarded = False

    def append(self, world, batch: pb.Batch) -> None:
        try:
            self.journal.append(world.tick + 1, batch.SerializeToString())
        except JournalError as exc:
            self.store.journal_failures += 1
            raise Unavailable(f"world {quoted(world.name)}: {exc}; nothing of the batch was applied") from None

    def take_back(self) -> None:
        self.journal.take_back()

    def current(self, world) -> bool:
        """Whether the world's last snapshot, written or being written, holds its current tick."""
        writing = self._writing
        failed = writing is not None and writing.done() and writing.exception() is not None
        return world.tick == self.snapshot_tick and not failed

    def applied(self, world) -> None:
        """After a batch: a snapshot in the background once the journal has outgrown the last one."""
        writing = self._writing is not None and not self._writing.done()
        if not writing and self.journal.records_bytes > max(self.snapshot_bytes, MIN_JOURNAL_BYTES):
            self.snapshot(world)

    def snapshot(self, world) -> Future:
        """Take the world's image now (on its thread) and write it in the background: the future of
        (tick, bytes). A world unchanged since its last snapshot gets that snapshot's future."""
        if self.current(world) and self._writing is not None:
            return self._writing
        pieces = images.encode(world.settings(), world.broadphase)
        try:
            self._begin_segment(world)
        except OSError as exc:
            log.error("world %s: cannot begin a new journal segment in %s (%s): snapshot skipped",
                      shown(world.name), self.directory, exc.strerror or exc)
            failed: Future = Future()
            failed.set_exception(Unavailable(f"world {quoted(world.name)}: cannot write its files: {exc}"))
            return failed
        self._writing = self.store.writer.submit(self._write, world.name, world.tick, pieces)
        return self._writing

    def _begin_segment(self, world) -> None:
        path = os.path.join(self.directory, f"journal-{world.tick:020d}.log")
        journal = Journal.create(path, world.incarnation, world.tick, self.store.fsync == "always")
        old, self.journal = self.journal, journal
        old.close(sync=self.store.fsync != "no")
        if self.discarded:
            journal.close(sync=False)
        self.snapshot_tick = world.tick

    def _write(self, name: str, tick: int, pieces: list, alone: bool = False) -> tuple[int, int]:
        path = os.path.join(self.directory, f"snapshot-{tick:020d}.dbvt")
        started = time.perf_counter()
        if self.discarded:
            return tick, 0
        try:
            size = _write_file(path, pieces)
        except OSError as exc:
            self.store.snapshot_failures += 1
            log.error("world %s: cannot write snapshot %s (%s); its journal is kept", shown(name), path,
                      exc.strerror or exc)
            raise Unavailable(f"world {quoted(name)}: cannot write its snapshot: {exc.strerror or exc}") from None
        self.snapshot_bytes = size
        self.store.snapshots_written += 1
        self._prune(tick if alone else None)
        log.debug("world %s: snapshot at tick %d, %d bytes, %.1f ms", shown(name), tick, size,
                  (time.perf_counter() - started) * 1e3)
        return tick, size

    def _prune(self, only: int | None = None) -> None:
        """Drop all but the newest KEPT_SNAPSHOTS snapshots (all but `only`'s, when given) and the
        journal segments before the oldest one kept."""
        snapshots = _ticked(self.directory, SNAPSHOT)
        kept = [tick for tick, _ in snapshots if tick == only] if only is not None \
            else [tick for tick, _ in snapshots[-KEPT_SNAPSHOTS:]]
        oldest = min(kept, default=0)
        for tick, path in snapshots:
            if tick not in kept:
                os.unlink(path)
        for start, path in _ticked(self.directory, SEGMENT):
            if start < oldest:
                os.unlink(path)
        for entry in os.listdir(self.directory):
            if entry.endswith(".tmp"):
                os.unlink(os.path.join(self.directory, entry))

    def discard(self) -> None:
        """The world was deleted: its files go to the trash at once (so the name is free), and are
        removed after any snapshot still being written. The rename is made durable: a world moved away
        must not come back here after a crash."""
        self.discarded = True
        self.journal.close(sync=False)
        trash = os.path.join(self.store.path, "trash", f"{os.path.basename(self.directory)}-{secrets.token_hex(4)}")
        os.replace(self.directory, trash)
        sync_directory(os.path.dirname(self.directory))
        self.store.writer.submit(shutil.rmtree, trash, True)

    def mark_moving(self, destination: str) -> None:
        """The world's move on disk before it is answered, so that a restart brings the world back
        frozen (still moving), never served here while another server may already serve it."""
        _write_file(os.path.join(self.directory, MOVING), [destination.encode()])

    def clear_moving(self) -> None:
        os.unlink(os.path.join(self.directory, MOVING))
        sync_directory(self.directory)

    def close(self) -> None:
        self.journal.close(sync=self.store.fsync != "no")


class Store:
    """The data directory of one server."""

    def __init__(self, path: str, fsync: str = "everysec"):
        self.path = os.path.abspath(path)
        self.fsync = fsync
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dbvt-snapshot")
        self._open: dict[int, WorldFiles] = {}
        self._lock_fd: int | None = None
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        # Counted for the metrics (on the writer's and the worlds' threads; read at scrapes).
        self.snapshots_written = self.snapshot_failures = self.journal_failures = 0
        # Set when the previous server did not stop cleanly and the machine has restarted since:
        # batches it answered in its last moments may never have reached the disk.
        self.unsynced_policy: str | None = None

    @property
    def worlds_dir(self) -> str:
        return os.path.join(self.path, "worlds")

    # ---- the directory ---------------------------------------------------------------------------
    def open(self) -> None:
        """Take the data directory (DataDirInUse if another server has it) and start flushing."""
        for sub in ("", "worlds", "quarantine", "trash"):
            os.makedirs(os.path.join(self.path, sub), exist_ok=True)
        self._lock()
        shutil.rmtree(os.path.join(self.path, "trash"), ignore_errors=True)
        os.makedirs(os.path.join(self.path, "trash"), exist_ok=True)
        self._read_marker()
        _write_file(os.path.join(self.path, "RUNNING"),
                    [json.dumps({"pid": os.getpid(), "boot_id": _boot_id(), "fsync": self.fsync}).encode()])
        if self.fsync == "everysec":
            self._flusher = threading.Thread(target=self._flush, name="dbvt-fsync", daemon=True)
            self._flusher.start()

    def _lock(self) -> None:
        fd = os.open(os.path.join(self.path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirInUse(f"data directory {self.path} is in use by another dbvt-server (pid {holder}); "
                               "two servers must not share one") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _read_marker(self) -> None:
        try:
            with open(os.path.join(self.path, "RUNNING")) as file:
                previous = json.load(file)
        except (OSError, ValueError):
            return
        if previous.get("boot_id") != _boot_id() and previous.get("fsync") != "always":
            self.unsynced_policy = str(previous.get("fsync"))

    def _flush(self) -> None:
        while not self._stop.wait(1.0):
            for files in list(self._open.values()):
                try:
                    files.journal.sync()
                except OSError as exc:
                    log.error("cannot fsync journal %s: %s", files.journal.path, exc.strerror or exc)

    def close(self) -> None:
        """After the final snapshots: every journal synced and closed, the directory given up."""
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        self.writer.shutdown(wait=True)
        for files in list(self._open.values()):
            files.close()
        self._open.clear()
        os.unlink(os.path.join(self.path, "RUNNING"))
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ---- worlds ----------------------------------------------------------------------------------
    def create(self, world, image_pieces: list | None = None) -> WorldFiles:
        """Files for a new world: its first snapshot (the image given, or the world as it is) and an
        empty journal, on disk before the world is announced."""
        directory = os.path.join(self.worlds_dir, world_directory_name(world.name))
        try:
            if os.path.exists(directory):
                os.replace(directory, os.path.join(self.path, "trash", f"{os.path.basename(directory)}-stale"))
            os.makedirs(directory)
            pieces = image_pieces or images.encode(world.settings(), world.broadphase)
            size = _write_file(os.path.join(directory, f"snapshot-{world.tick:020d}.dbvt"), pieces)
            journal = Journal.create(os.path.join(directory, f"journal-{world.tick:020d}.log"), world.incarnation,
                                     world.tick, self.fsync == "always")
        except OSError as exc:
            self.snapshot_failures += 1
            shutil.rmtree(directory, ignore_errors=True)
            raise Unavailable(f"cannot write the files of world {quoted(world.name)} in {self.path}: "
                              f"{exc.strerror or exc}; it was not created") from None
        self.snapshots_written += 1
        return self._opened(WorldFiles(self, directory, journal, world.tick, size))

    def _opened(self, files: WorldFiles) -> WorldFiles:
        self._open[id(files)] = files
        return files

    def forget(self, files: WorldFiles) -> None:
        self._open.pop(id(files), None)

    def restore(self, make_world: Callable, threads: int = 1) -> list:
        """Every world of the data directory, as it was: `make_world(image)` builds each from its
        newest good snapshot, then its journal is replayed. A world that cannot be restored is left
        out with an ERROR and its files moved to quarantine/; the others come up. `threads` is each
        core's (--threads-per-world): a runtime setting, which snapshots do not hold."""
        worlds = []
        for entry in sorted(os.listdir(self.worlds_dir)):
            world = self._restore(os.path.join(self.worlds_dir, entry), make_world, threads)
            if world is not None:
                worlds.append(world)
        return worlds

    def _restore(self, directory: str, make_world: Callable, threads: int):
        snapshots = _ticked(directory, SNAPSHOT)
        image, damaged = None, []
        for tick, path in reversed(snapshots):
            try:
                with open(path, "rb") as file:
                    image = images.decode(file.read(), threads)
                break
            except (OSError, images.ImageError) as exc:
                log.error("world directory %s: snapshot %s cannot be used (%s); trying the one before it",
                          directory, os.path.basename(path), exc)
                damaged.append(path)
        if image is None:
            self._quarantine(directory)
            log.error("world directory %s left out: none of its %d snapshots can be used; its files are in %s",
                      directory, len(snapshots), os.path.join(self.path, "quarantine"))
            return None
        world = make_world(image)
        if os.path.exists(os.path.join(directory, MOVING)):
            with open(os.path.join(directory, MOVING)) as file:
                world.moving_to = file.read()
            log.warning("world %s is being moved to %s: it stays frozen until the move is finished "
                        "(dbvt-admin rebalance)", shown(world.name), world.moving_to)
        snapshot_tick = world.tick
        lost, replayed = self._replay(world, directory)
        if self.unsynced_policy is not None:
            # Which journals held unsynced records cannot be known after the fact (a lost segment
            # leaves no trace), so every world takes a new incarnation.
            log.warning("world %s: the machine restarted while the server ran with --fsync %s; batches answered in "
                        "its last second may be lost, so the world gets a new incarnation", shown(world.name),
                        self.unsynced_policy)
            lost = True
        for path in damaged:
            os.replace(path, os.path.join(self.path, "quarantine", f"{os.path.basename(directory)}-"
                                                                    f"{os.path.basename(path)}"))
        if lost:
            world.incarnation = new_incarnation()
        files = WorldFiles(self, directory, Journal.create(
            os.path.join(directory, f"journal-{world.tick:020d}.log"), world.incarnation, world.tick,
            self.fsync == "always"), snapshot_tick, os.path.getsize(os.path.join(
                directory, f"snapshot-{snapshot_tick:020d}.dbvt")))
        if lost or damaged:
            # What is on disk must say the new incarnation (or no longer lean on a damaged snapshot).
            pieces = images.encode(world.settings(), world.broadphase)
            files.snapshot_tick = world.tick
            files._write(world.name, world.tick, pieces, alone=lost)
        world.files = self._opened(files)
        log.info("restored world %s at tick %d (%d proxies; %d batches replayed from its journal)",
                 shown(world.name), world.tick, len(world.broadphase), replayed)
        return world

    def _replay(self, world, directory: str) -> tuple[bool, int]:
        """Apply the journal's batches after the world's tick; (history lost, batches replayed)."""
        segments = _ticked(directory, SEGMENT)
        replayed = 0
        for index, (_, path) in enumerate(segments):
            segment = read_segment(path)
            problem, cut_at = segment.problem, segment.cut_at
            for offset, tick, payload in segment.records:
                if tick <= world.tick:
                    continue
                if tick != world.tick + 1 or segment.incarnation != world.incarnation:
                    problem, cut_at, segment.torn = (f"record of tick {tick} does not follow tick {world.tick} "
                                                     "of this incarnation"), offset, False
                    break
                try:
                    world.apply(pb.Batch.FromString(payload))
                except DecodeError:
                    problem, cut_at, segment.torn = "a record is not a batch", offset, False
                    break
                except DbvtError:
                    continue  # refused when it first came as well, after its append: taken back then
                replayed += 1
            if problem is None:
                continue
            later = segments[index + 1:]
            log.warning("world %s: journal %s is cut at offset %d: %s", shown(world.name), path, cut_at, problem)
            with open(path, "r+b") as file:
                file.truncate(max(cut_at, 0))
            if cut_at < HEADER_SIZE:
                os.unlink(path)
            lost_later = any(os.path.getsize(later_path) > HEADER_SIZE for _, later_path in later)
            for _, later_path in later:
                os.unlink(later_path)
            # A torn last record was never answered (the answer follows the write): nothing was lost.
            return not segment.torn or lost_later, replayed
        return False, replayed

    def _quarantine(self, directory: str) -> None:
        target = os.path.join(self.path, "quarantine", f"{os.path.basename(directory)}-{int(time.time())}")
        os.replace(directory, target)
