"""The staging of multi-part batches: a stream's parts of one batch, held until its last part arrives."""
from __future__ import annotations

from dbvt_client import wire
from dbvt_client.errors import DbvtError, InvalidArgument, ResourceExhausted, quoted
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server.service import Limits

# Generous: creating (41 bytes a row), moving (32) and destroying (8) every proxy of a full 3-D world.
STAGED_BYTES_PER_PROXY = 96
_COLUMNS = ("create_ids", "create_boxes", "create_static", "create_group", "create_mask",
            "move_ids", "move_boxes", "destroy_ids")


class BatchStaging:
    """The parts of one multi-part batch of a stream, until its last part arrives.

    Staged rows are bounded by the server's proxies-per-world limit, so a stream cannot make the
    server hold more than a world could.
    """

    def __init__(self, limits: Limits):
        self._limit = limits.max_proxies_per_world
        self._key: tuple[str, int] | None = None
        self._parts: dict[str, list[bytes]] = {}

    def add(self, request: pb.StreamBatchesRequest) -> pb.Batch | None:
        """The whole batch once `request` is its last part, else None. Raises if the parts disagree."""
        key = (request.world, request.sequence)
        if self._key is None and not request.more_parts:
            return request.batch
        if self._key is not None and key != self._key:
            expected, self._key, self._parts = self._key, None, {}
            raise InvalidArgument(f"batch {request.sequence} for world {quoted(request.world)} arrived before the "
                                  f"last part of batch {expected[1]} for world {quoted(expected[0])}; "
                                  f"that batch is dropped")
        self._key = key
        for column in _COLUMNS:
            data = getattr(request.batch, column)
            if data:
                self._parts.setdefault(column, []).append(data)
        self._check_size()
        if request.more_parts:
            return None
        parts, self._key, self._parts = self._parts, None, {}
        return pb.Batch(**{column: b"".join(chunks) for column, chunks in parts.items()})

    def _check_size(self) -> None:
        for column in ("create_ids", "move_ids", "destroy_ids"):
            rows = sum(len(chunk) for chunk in self._parts.get(column, ())) // wire.IDS.itemsize
            if rows > self._limit:
                self._drop(f"a batch with more than {self._limit} {column} rows cannot be staged "
                           f"(the server's limit of proxies per world)")
        staged = sum(len(chunk) for chunks in self._parts.values() for chunk in chunks)
        if staged > STAGED_BYTES_PER_PROXY * self._limit:
            self._drop(f"a batch of more than {STAGED_BYTES_PER_PROXY * self._limit} bytes cannot be staged "
                       f"(more than a world of the server's limit of {self._limit} proxies could need)")

    def _drop(self, message: str) -> None:
        self._key, self._parts = None, {}
        raise ResourceExhausted(message)


def stream_error(sequence: int, error: DbvtError) -> pb.StreamBatchesResponse:
    return pb.StreamBatchesResponse(sequence=sequence, status_code=error.code.value[0], status_message=error.message)
