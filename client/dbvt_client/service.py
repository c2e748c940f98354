"""The registry of worlds, the in-process form of every RPC, and the staging of multi-part batches.

`Service.call(method, request)` answers any unary RPC by name; the gRPC servicer instead runs the
world RPCs (`worlds.WORLD_RPCS`) itself, to hold that world's lock and keep the event loop free.
"""
from __future__ import annotations

import numpy as np

from dbvt_client import wire
from dbvt_client.errors import AlreadyExists, DbvtError, InvalidArgument, NotFound, ResourceExhausted
from dbvt_client.worlds import WORLD_RPCS, World
from dbvt_proto.v1 import broadphase_pb2 as pb

DEFAULT_DIMS = 3
DEFAULT_MARGIN = 0.05
MAX_NAME_LENGTH = 128
VERSION = "0.1.0"


class Limits:
    def __init__(self, max_worlds: int, max_proxies_per_world: int, max_message_bytes: int):
        self.max_worlds = max_worlds
        self.max_proxies_per_world = max_proxies_per_world
        self.max_message_bytes = max_message_bytes


class Service:
    def __init__(self, limits: Limits, broadphase_class):
        self.limits = limits
        self._broadphase_class = broadphase_class
        self._worlds: dict[str, World] = {}

    def world(self, name: str) -> World:
        try:
            return self._worlds[name]
        except KeyError:
            raise NotFound(f"no world named {name!r}") from None

    def server_info(self, request: pb.GetServerInfoRequest) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(version=VERSION, max_message_bytes=self.limits.max_message_bytes,
                                        max_worlds=self.limits.max_worlds,
                                        max_proxies_per_world=self.limits.max_proxies_per_world)

    def create_world(self, request: pb.CreateWorldRequest) -> pb.CreateWorldResponse:
        name = request.name
        if not 1 <= len(name) <= MAX_NAME_LENGTH or not name.isprintable():
            raise InvalidArgument(f"world name must be 1 to {MAX_NAME_LENGTH} printable characters, not {name!r}")
        dims = request.dims or DEFAULT_DIMS
        if dims not in (2, 3):
            raise InvalidArgument(f"dims must be 2 or 3, not {dims}")
        margin = request.margin if request.HasField("margin") else DEFAULT_MARGIN
        if not np.isfinite(margin) or margin < 0:
            raise InvalidArgument(f"margin must be a finite number >= 0, not {margin}")
        limit = self.limits.max_proxies_per_world
        max_proxies = request.max_proxies or limit
        if max_proxies > limit:
            raise ResourceExhausted(f"max_proxies {max_proxies} is above the server's limit of {limit} per world")
        if name in self._worlds:
            raise AlreadyExists(f"a world named {name!r} already exists")
        if len(self._worlds) >= self.limits.max_worlds:
            raise ResourceExhausted(f"the server already holds its limit of {self.limits.max_worlds} worlds")
        track_pairs = request.track_pairs if request.HasField("track_pairs") else True
        world = World(name, dims, margin, max_proxies, track_pairs, self._broadphase_class)
        self._worlds[name] = world
        return pb.CreateWorldResponse(world=world.info())

    def delete_world(self, request: pb.DeleteWorldRequest) -> pb.DeleteWorldResponse:
        self.world(request.name)
        del self._worlds[request.name]
        return pb.DeleteWorldResponse()

    def list_worlds(self, request: pb.ListWorldsRequest) -> pb.ListWorldsResponse:
        return pb.ListWorldsResponse(worlds=[self._worlds[name].info() for name in sorted(self._worlds)])

    def call(self, method: str, request):
        """Any unary RPC, in-process."""
        if method in WORLD_RPCS:
            return WORLD_RPCS[method](self.world(request.world), request)
        return getattr(self, REGISTRY_RPCS[method])(request)


REGISTRY_RPCS = {
    "GetServerInfo": "server_info",
    "CreateWorld": "create_world",
    "DeleteWorld": "delete_world",
    "ListWorlds": "list_worlds",
}

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
            raise InvalidArgument(f"batch {request.sequence} for world {request.world!r} arrived before the last "
                                  f"part of batch {expected[1]} for world {expected[0]!r}; that batch is dropped")
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
