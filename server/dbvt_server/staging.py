"""What the server holds for requests still arriving: the parts of multi-part batches and query sets.

Held bytes are bounded twice. Each stream's batch may hold no more than a world under the server's
limits could need (`STAGED_BYTES_PER_PROXY` a proxy). All streams and query sets together hold at
most `--max-staged-bytes` (`StagedBytes`), so that many streams which never send their last part
cannot fill the memory. Whatever is held is given back when its batch completes or fails, and when
its stream ends.
"""
from __future__ import annotations

import threading

from dbvt_client import parts, wire
from dbvt_client.errors import DbvtError, InvalidArgument, Moving, ResourceExhausted, TickMismatch, WrongServer, quoted
from dbvt_proto.v1 import broadphase_pb2 as pb

# Generous: creating (41 bytes a row), moving (32) and destroying (8) every proxy of a full 3-D world.
STAGED_BYTES_PER_PROXY = 96
_COLUMNS = ("create_ids", "create_boxes", "create_static", "create_group", "create_mask", "create_sensor",
            "move_ids", "move_boxes", "destroy_ids")


class StagedBytes:
    """The bytes held for incomplete requests across the server, within `limit`. Thread-safe: the
    in-process transport stages on its callers' threads."""

    def __init__(self, limit: int):
        self.limit = limit
        self.value = 0
        self._lock = threading.Lock()

    def take(self, size: int, what: str) -> None:
        with self._lock:
            if self.value + size > self.limit:
                raise ResourceExhausted(f"{what} cannot be held: the server already holds {self.value} bytes of "
                                        f"incomplete batches and query sets, and holds at most {self.limit} "
                                        "(--max-staged-bytes); it was dropped")
            self.value += size

    def give_back(self, size: int) -> None:
        with self._lock:
            self.value -= size

    def hold(self) -> "Hold":
        return Hold(self)


class Hold:
    """What one batch or query set holds of the budget, given back all at once."""

    def __init__(self, budget: StagedBytes):
        self._budget = budget
        self.size = 0

    def take(self, size: int, what: str) -> None:
        self._budget.take(size, what)
        self.size += size

    def release(self) -> None:
        self._budget.give_back(self.size)
        self.size = 0


class BatchStaging:
    """The parts of one multi-part batch of a stream, until its last part arrives."""

    def __init__(self, max_proxies_per_world: int, budget: StagedBytes):
        self._limit = max_proxies_per_world
        self._hold = budget.hold()
        self._key: tuple[str, int] | None = None
        self._parts: dict[str, list[bytes]] = {}

    def add(self, request: pb.StreamBatchesRequest) -> pb.Batch | None:
        """The whole batch once `request` is its last part, else None. Raises if the parts disagree
        or cannot be held; the batch is then dropped."""
        key = (request.world, request.sequence)
        if self._key is None and not request.more_parts:
            return request.batch
        if self._key is not None and key != self._key:
            expected = self._key
            self._drop()
            raise InvalidArgument(f"batch {request.sequence} for world {quoted(request.world)} arrived before the "
                                  f"last part of batch {expected[1]} for world {quoted(expected[0])}; "
                                  f"that batch is dropped")
        self._key = key
        try:
            self._hold.take(request.batch.ByteSize(), f"part of batch {request.sequence}")
        except ResourceExhausted:
            self._drop()
            raise
        for column in _COLUMNS:
            data = getattr(request.batch, column)
            if data:
                self._parts.setdefault(column, []).append(data)
        self._check_size()
        if request.more_parts:
            return None
        parts = self._parts
        self._drop()
        whole = pb.Batch(**{column: b"".join(chunks) for column, chunks in parts.items()})
        if request.batch.HasField("expected_tick"):
            whole.expected_tick = request.batch.expected_tick
        return whole

    def unfinished(self) -> tuple[str, int] | None:
        """The (world, sequence) of a batch whose last part has not come, its parts given back."""
        key = self._key
        self._drop()
        return key

    def _check_size(self) -> None:
        for column in ("create_ids", "move_ids", "destroy_ids"):
            rows = sum(len(chunk) for chunk in self._parts.get(column, ())) // wire.IDS.itemsize
            if rows > self._limit:
                self._drop()
                raise ResourceExhausted(f"a batch with more than {self._limit} {column} rows cannot be staged "
                                        f"(the server's limit of proxies per world)")
        if self._hold.size > STAGED_BYTES_PER_PROXY * self._limit:
            self._drop()
            raise ResourceExhausted(f"a batch of more than {STAGED_BYTES_PER_PROXY * self._limit} bytes cannot be "
                                    f"staged (more than a world of the server's limit of {self._limit} proxies "
                                    "could need)")

    def _drop(self) -> None:
        self._hold.release()
        self._key, self._parts = None, {}


def query_kind(query: pb.QueryRequest, name: str, number: int = 0, kind: str | None = None) -> str:
    """The kind of part `number` of query set `name`, which must be `kind` when one is known."""
    found = query.WhichOneof("query")
    if found is None or (kind is not None and found != kind):
        raise InvalidArgument(f"part {number} of {name} holds {found or 'no query'}, not {kind or 'a query'}; "
                              "every part must hold the same kind")
    return found


class QuerySet:
    """The parts of one query set (a Query call's, or one set of a query stream) until the last: one
    kind, their bytes held within the budget and within what a batch of a world of the server's limit
    of proxies could need. Whatever raises leaves the caller to release `hold`."""

    def __init__(self, budget: StagedBytes, max_proxies_per_world: int, name: str):
        self.name = name
        self.hold = budget.hold()
        self.kind: str | None = None
        self._limit = STAGED_BYTES_PER_PROXY * max_proxies_per_world
        self._pieces: list = []

    def add(self, query: pb.QueryRequest) -> None:
        self.kind = query_kind(query, self.name, len(self._pieces), self.kind)
        self._pieces.append(getattr(query, self.kind))
        self.hold.take(query.ByteSize(), f"part {len(self._pieces) - 1} of {self.name}")
        if self.hold.size > self._limit:
            raise ResourceExhausted(f"a query set of more than {self._limit} bytes cannot be held (as a batch of a "
                                    "world of the server's limit of proxies could need)")

    def joined(self):
        """The set's one request: its parts' counts added up and columns concatenated."""
        if not self._pieces:
            raise InvalidArgument(f"{self.name} has no parts")
        return self._pieces[0] if len(self._pieces) == 1 else parts.joined_queries(self._pieces)


def unfinished_error(key: tuple[str, int]) -> InvalidArgument:
    world, sequence = key
    return InvalidArgument(f"the stream ended before the last part of batch {sequence} for world {quoted(world)}; "
                           "nothing of it was applied")


def stream_error(sequence: int, error: DbvtError, response_class=pb.StreamBatchesResponse):
    """The answer to a stream's batch refused with `error`; with pb.StreamQueriesResponse, to a query set
    (which cannot meet a TickMismatch)."""
    response = response_class(sequence=sequence, status_code=error.code.value[0], status_message=error.message)
    if isinstance(error, TickMismatch):
        response.world_tick, response.world_incarnation = error.tick, error.incarnation
    elif isinstance(error, (Moving, WrongServer)):
        response.world_server = error.destination if isinstance(error, Moving) else error.owner
    return response
