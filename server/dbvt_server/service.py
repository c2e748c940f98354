"""The registry of worlds and the in-process form of every unary RPC.

`Service.call(method, request)` answers any unary RPC by name (that is what `Client.local()` uses);
the gRPC servicer instead runs the world RPCs (`worlds.WORLD_RPCS`) itself, on that world's queue,
to keep the event loop free.
"""
from __future__ import annotations

import numpy as np

from dbvt_client.errors import (AlreadyExists, DbvtError, FailedPrecondition, InvalidArgument, Moving, NotFound,
                                ResourceExhausted, Unavailable, WrongServer, quoted)
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server import __version__, images
from dbvt_server.config import split_address
from dbvt_server.persistence import Store, new_incarnation
from dbvt_server.replicas import Replicas
from dbvt_server.staging import StagedBytes
from dbvt_server.watch import SensorFeed
from dbvt_server.worlds import WORLD_RPCS, World, message_fields, overlap

DEFAULT_DIMS = 3
DEFAULT_MARGIN = 0.05
MAX_NAME_LENGTH = 128
FLOAT32_MAX = float(np.finfo(np.float32).max)
# The server's default limits of pairs per world and hits per query call (--max-pairs-per-world,
# --max-hits-per-call).
DEFAULT_MAX_PAIRS = 20_000_000
DEFAULT_MAX_HITS = 25_000_000
# Ticks of sensor events a world keeps for watchers that resume (--watch-history), and ticks a
# watcher may fall behind before it gets a resync instead (--max-watch-backlog).
DEFAULT_WATCH_HISTORY = 256
DEFAULT_MAX_WATCH_BACKLOG = 1024


class Limits:
    def __init__(self, max_worlds: int, max_proxies_per_world: int, max_message_bytes: int,
                 max_staged_bytes: int = 2**62, max_queued_per_world: int = 2**62,
                 max_pairs_per_world: int = DEFAULT_MAX_PAIRS, max_hits_per_call: int = DEFAULT_MAX_HITS,
                 watch_history: int = DEFAULT_WATCH_HISTORY, max_watch_backlog: int = DEFAULT_MAX_WATCH_BACKLOG,
                 threads_per_world: int = 1):
        self.max_worlds = max_worlds
        self.max_proxies_per_world = max_proxies_per_world
        self.max_message_bytes = max_message_bytes
        self.max_staged_bytes = max_staged_bytes
        self.max_queued_per_world = max_queued_per_world
        self.max_pairs_per_world = max_pairs_per_world
        self.max_hits_per_call = max_hits_per_call
        self.watch_history = watch_history
        self.max_watch_backlog = max_watch_backlog
        # Not a limit, but every world's setting as these are: its query calls' threads.
        self.threads_per_world = threads_per_world


class Service:
    def __init__(self, limits: Limits, store: Store | None = None, replicas: Replicas | None = None):
        self.limits = limits
        # The replica set and this server in it (--peers, --advertise): a world belongs to one of them.
        self.replicas = replicas or Replicas()
        # Where worlds moved away from here went: calls for them are redirected there.
        self._moved: dict[str, str] = {}
        # The data directory, when worlds are kept across restarts (--data-dir).
        self.store = store
        self._worlds: dict[str, World] = {}
        # Names of worlds being imported: taken, though the worlds are not there yet.
        self._arriving: set[str] = set()
        # What every stream and query set holds while its parts arrive.
        self.staged = StagedBytes(limits.max_staged_bytes)

    def worlds(self) -> list[World]:
        """Every world, as a list that later creations and deletions leave as it is."""
        return list(self._worlds.values())

    def world(self, name: str) -> World:
        """The world to serve a call on: Moving while it moves, WrongServer or NotFound when not here."""
        world = self.held(name)
        if world.moving_to:
            raise Moving(f"world {quoted(name)} is moving to {world.moving_to}; retry", world.moving_to)
        return world

    def held(self, name: str) -> World:
        """The world, moving or not (what the mover reads)."""
        try:
            return self._worlds[name]
        except KeyError:
            self._check_owned(name)
            raise NotFound(f"no world named {quoted(name)}") from None

    def _check_owned(self, name: str) -> None:
        """WrongServer when the world moved away, or belongs to another server of the replica set. A
        world held here is served here whoever owns it (until it is moved)."""
        if name in self._moved:
            raise WrongServer(f"world {quoted(name)} was moved to {self._moved[name]}", self._moved[name])
        found = self.replicas.owner(name)
        if found is not None and found != self.replicas.advertise:
            raise WrongServer(f"world {quoted(name)} belongs to {found}, not to this server "
                              f"({self.replicas.advertise})", found)

    def server_info(self, request: pb.GetServerInfoRequest) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(version=__version__, max_message_bytes=self.limits.max_message_bytes,
                                        max_worlds=self.limits.max_worlds,
                                        max_proxies_per_world=self.limits.max_proxies_per_world,
                                        max_pairs_per_world=self.limits.max_pairs_per_world,
                                        max_hits_per_call=self.limits.max_hits_per_call,
                                        persistent=self.store is not None,
                                        fsync=self.store.fsync if self.store else "",
                                        peers=self.replicas.members, advertise=self.replicas.advertise or "")

    def create_world(self, request: pb.CreateWorldRequest) -> pb.CreateWorldResponse:
        name = request.name
        self._check_name(name)
        settings = self._settings(request)
        if name in self._worlds:
            return pb.CreateWorldResponse(world=self._reattach(self._worlds[name], request, settings).info(),
                                          created=False)
        self._check_owned(name)
        self._check_room(name)
        world = World(name, **settings, max_hits=self.limits.max_hits_per_call, incarnation=new_incarnation(),
                      threads=self.limits.threads_per_world)
        if not world.ephemeral:
            world.files = self.store.create(world)
        self._adopt(world)
        return pb.CreateWorldResponse(world=world.info(), created=True)

    def _adopt(self, world: World) -> None:
        """Into the registry, with a feed for its sensors' watchers."""
        world.feed = SensorFeed(world.tick, world.incarnation, self.limits.watch_history,
                                self.limits.max_watch_backlog)
        self._worlds[world.name] = world

    @staticmethod
    def _check_name(name: str) -> None:
        if not 1 <= len(name) <= MAX_NAME_LENGTH or not name.isprintable():
            raise InvalidArgument(f"world name must be 1 to {MAX_NAME_LENGTH} printable characters, not {quoted(name)}")

    def _check_room(self, name: str) -> None:
        if name in self._arriving:
            raise AlreadyExists(f"a world named {quoted(name)} is being imported")
        if len(self._worlds) + len(self._arriving) >= self.limits.max_worlds:
            raise ResourceExhausted(f"the server already holds its limit of {self.limits.max_worlds} worlds")

    def _settings(self, request: pb.CreateWorldRequest) -> dict:
        """The world's settings asked for, defaults filled in, or the error naming a bad one."""
        dims = request.dims or DEFAULT_DIMS
        if dims not in (2, 3):
            raise InvalidArgument(f"dims must be 2 or 3, not {dims}")
        margin = request.margin if request.HasField("margin") else DEFAULT_MARGIN
        # The core keeps the margin as a float32: a larger one would be infinite there.
        if not np.isfinite(margin) or not 0 <= margin <= FLOAT32_MAX:
            raise InvalidArgument(f"margin must be a finite number >= 0 that fits a float32 "
                                  f"(at most {FLOAT32_MAX:.8g}), not {margin}")
        limit = self.limits.max_proxies_per_world
        max_proxies = request.max_proxies or limit
        if max_proxies > limit:
            raise ResourceExhausted(f"max_proxies {max_proxies} is above the server's limit of {limit} per world")
        pair_limit = self.limits.max_pairs_per_world
        max_pairs = request.max_pairs or pair_limit
        if max_pairs > pair_limit:
            raise ResourceExhausted(f"max_pairs {max_pairs} is above the server's limit of {pair_limit} per world")
        track_pairs = request.track_pairs if request.HasField("track_pairs") else True
        sensor_margin = request.sensor_margin if request.HasField("sensor_margin") else 0.0
        if not np.isfinite(sensor_margin) or not 0 <= sensor_margin <= FLOAT32_MAX:
            raise InvalidArgument(f"sensor_margin must be a finite number >= 0, not {sensor_margin}")
        # Without a data directory every world is ephemeral.
        ephemeral = request.ephemeral or self.store is None
        return dict(dims=dims, margin=margin, max_proxies=max_proxies, track_pairs=track_pairs, max_pairs=max_pairs,
                    ephemeral=ephemeral, sensor_margin=sensor_margin)

    @staticmethod
    def _reattach(world: World, request: pb.CreateWorldRequest, settings: dict) -> World:
        """With exist_ok, the world already there, if it is the one asked for. Its max_proxies is compared
        only when the request names one: a client that leaves it to the server takes the world's."""
        if not request.exist_ok:
            raise AlreadyExists(f"a world named {quoted(world.name)} already exists "
                                f"(exist_ok=True returns it instead)")
        differences = [f"{key}={getattr(world, key)!r}, not {value!r}" for key, value in settings.items()
                       if getattr(world, key) != value and (key not in ("max_proxies", "max_pairs")
                                                            or getattr(request, key))]
        if differences:
            raise AlreadyExists(f"world {quoted(world.name)} exists with {'; '.join(differences)}")
        return world

    def delete_world(self, request: pb.DeleteWorldRequest) -> pb.DeleteWorldResponse:
        self._drop(self.world(request.name), NotFound(f"world {quoted(request.name)} was deleted"))
        return pb.DeleteWorldResponse()

    def _drop(self, world: World, why: DbvtError) -> None:
        """The world out of the registry and its files discarded; its watchers told `why`."""
        del self._worlds[world.name]
        world.feed.close(why)
        if world.files is not None:
            self.store.forget(world.files)
            world.files.discard()
            world.files = None

    # ---- moves to another server (dbvt-admin rebalance) ----------------------------------------
    def begin_move(self, request: pb.BeginMoveRequest) -> World:
        """The world frozen for its move: refused to every call from now on, across restarts too."""
        world = self.held(request.world)
        if world.moving_to == request.destination:
            return world
        if world.moving_to:
            raise FailedPrecondition(f"world {quoted(world.name)} is already moving to {world.moving_to}")
        if split_address(request.destination) is None:
            raise InvalidArgument(f"the destination must be host:port, not {request.destination!r}")
        if request.destination == self.replicas.advertise:
            raise InvalidArgument(f"world {quoted(world.name)} is already on {request.destination}")
        if world.files is not None:
            try:
                world.files.mark_moving(request.destination)
            except OSError as exc:
                raise Unavailable(f"cannot record the move of world {quoted(world.name)}: {exc.strerror or exc}; "
                                  "it was not started") from None
        world.moving_to = request.destination
        return world

    def finish_move(self, request: pb.FinishMoveRequest) -> pb.FinishMoveResponse:
        """The moved world deleted here, and calls for it redirected to where it went; or, with
        `cancel`, served here again."""
        world = self.held(request.world)
        if not world.moving_to:
            raise FailedPrecondition(f"world {quoted(world.name)} is not moving")
        destination = world.moving_to
        if request.cancel:
            if world.files is not None:
                world.files.clear_moving()
            world.moving_to = ""
            return pb.FinishMoveResponse()
        self._drop(world, WrongServer(f"world {quoted(world.name)} was moved to {destination}", destination))
        self._moved[world.name] = destination
        return pb.FinishMoveResponse()

    # ---- restarts, snapshots, export and import ------------------------------------------------
    def restore(self) -> list[World]:
        """Every world of the data directory, back in the registry (before the server serves)."""
        restored = self.store.restore(lambda image: World.from_image(image, self.limits.max_hits_per_call),
                                      self.limits.threads_per_world)
        for world in restored:
            self._adopt(world)
        return restored

    def snapshot_files(self, world: World):
        """The world's files, or why it has none."""
        if world.files is None:
            why = "the server has no data directory (--data-dir)" if self.store is None else "the world is ephemeral"
            raise FailedPrecondition(f"world {quoted(world.name)} has no snapshots: {why}")
        return world.files

    def overlap(self, request: pb.OverlapRequest) -> pb.OverlapResponse:
        """In-process: the caller holds every world still."""
        return overlap(self.world(request.world_a), self.world(request.world_b), request,
                       self.limits.max_hits_per_call)

    def snapshot_world(self, request: pb.SnapshotWorldRequest) -> pb.SnapshotWorldResponse:
        """A snapshot written now (in-process: the caller holds the world still)."""
        world = self.world(request.world)
        tick, size = self.snapshot_files(world).snapshot(world).result()
        return pb.SnapshotWorldResponse(tick=tick, incarnation=world.incarnation, snapshot_bytes=size)

    def import_world(self, requests: list[pb.ImportWorldRequest]) -> pb.ImportWorldResponse:
        """An import whose parts are all here (in-process)."""
        if not requests:
            raise InvalidArgument("the import sent no parts")
        name = requests[0].name
        self.import_reserve(name)
        world = None
        try:
            world = self.import_build(name, requests[0].ephemeral, b"".join(request.data for request in requests))
        finally:
            self.import_finish(name, world)
        return pb.ImportWorldResponse(world=world.info())

    def import_reserve(self, name: str) -> None:
        """Take the name of a world about to be imported (on the registry's thread)."""
        self._check_name(name)
        if name in self._worlds:
            raise AlreadyExists(f"a world named {quoted(name)} already exists; import under another name, "
                                "or delete it first")
        # Not checked against the replica set: an import is an admin's decision of where a world
        # lives, and a rebalance moves worlds before every server has learned the new set.
        self._check_room(name)
        self._arriving.add(name)

    def import_build(self, name: str, ephemeral: bool, data) -> World:
        """The world an image holds, checked against the server's limits, its files written: the
        slow part of an import, on a worker thread, for a name already reserved."""
        try:
            image = images.decode(data, self.limits.threads_per_world)
        except images.ImageError as exc:
            raise InvalidArgument(f"cannot import world {quoted(name)}: {exc}; nothing was created") from None
        settings = image.settings
        for key, limit in (("max_proxies", self.limits.max_proxies_per_world),
                           ("max_pairs", self.limits.max_pairs_per_world)):
            if settings[key] > limit:
                raise ResourceExhausted(f"cannot import world {quoted(name)}: its {key} {settings[key]} is above "
                                        f"this server's limit of {limit}; nothing was created")
        world = World.from_image(image, self.limits.max_hits_per_call, name=name,
                                 ephemeral=ephemeral or self.store is None)
        if not world.ephemeral:
            world.files = self.store.create(world)
        return world

    def import_finish(self, name: str, world: World | None) -> None:
        """The reserved name freed, and the imported world (None: the import failed) registered."""
        self._arriving.discard(name)
        if world is not None:
            self._moved.pop(name, None)     # a world moved back
            self._adopt(world)

    def list_worlds(self, request: pb.ListWorldsRequest, visible=lambda name: True) -> pb.ListWorldsResponse:
        """The worlds, sorted by name; only those `visible(name)` accepts."""
        return pb.ListWorldsResponse(worlds=[self._worlds[name].info() for name in sorted(self._worlds)
                                             if visible(name)])

    def call(self, method: str, request):
        """Any unary RPC, in-process."""
        if method in WORLD_RPCS:
            answer = WORLD_RPCS[method](self.world(request.world), request)
            # A query's answer comes as its fields, arrays where the wire has bytes.
            return ANSWER_TYPES[method](**message_fields(answer)) if isinstance(answer, dict) else answer
        return getattr(self, REGISTRY_RPCS[method])(request)


# The message each RPC answers with.
ANSWER_TYPES = {method.name: getattr(pb, method.output_type.name)
                for method in pb.DESCRIPTOR.services_by_name["BroadphaseService"].methods}
REGISTRY_RPCS = {
    "GetServerInfo": "server_info",
    "CreateWorld": "create_world",
    "DeleteWorld": "delete_world",
    "ListWorlds": "list_worlds",
    "SnapshotWorld": "snapshot_world",
    "Overlap": "overlap",
}
