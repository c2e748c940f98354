"""The synchronous SDK: `Client` and its `World` handles (their batch streams: dbvt_client.batch_stream)."""
from __future__ import annotations

import dataclasses
import weakref

import numpy as np

from dbvt_client import batches, queries, routing, transfer, watching
from dbvt_client.batch_stream import BatchStream
from dbvt_client.errors import InvalidArgument
from dbvt_client.results import BatchResult, Crossings, Hits, NearestHits, RayHits, Snapshot, WorldInfo
from dbvt_client.transport import Connection, GrpcTransport, local_transport
from dbvt_proto.v1 import broadphase_pb2 as pb

DEFAULT_MAX_WORLDS = 64
DEFAULT_MAX_PROXIES_PER_WORLD = 10_000_000


def world_info(info: pb.WorldInfo) -> WorldInfo:
    return WorldInfo(name=info.name, dims=info.dims, margin=info.margin, max_proxies=info.max_proxies,
                     proxies=info.proxies, tick=info.tick, track_pairs=info.track_pairs, max_pairs=info.max_pairs,
                     incarnation=info.incarnation, ephemeral=info.ephemeral, sensor_margin=info.sensor_margin,
                     moving_to=info.moving_to)


# What each argument of create_world must be, for the arguments the protocol itself cannot carry.
CREATE_ARGUMENTS = {"dims": "2 or 3", "margin": "a finite number >= 0", "max_proxies": "None or an integer >= 0",
                    "max_pairs": "None or an integer >= 0", "sensor_margin": "a finite number >= 0"}


def create_request(name: str, dims: int, margin: float, max_proxies: int | None, track_pairs: bool,
                   exist_ok: bool, max_pairs: int | None = None, ephemeral: bool = False,
                   sensor_margin: float = 0.0) -> pb.CreateWorldRequest:
    """The request, or InvalidArgument naming the argument it cannot hold (the service judges the rest)."""
    if not isinstance(name, str):
        raise InvalidArgument(f"create_world: the world name must be a str, not {type(name).__name__}")
    for flag, value in (("track_pairs", track_pairs), ("exist_ok", exist_ok), ("ephemeral", ephemeral)):
        # Strict: protobuf would take any integer, and a truthy string would quietly mean True.
        if not isinstance(value, (bool, np.bool_)):
            raise InvalidArgument(f"create_world: {flag} must be True or False, not {value!r}")
    request = pb.CreateWorldRequest(name=name, track_pairs=bool(track_pairs), exist_ok=bool(exist_ok),
                                    ephemeral=bool(ephemeral))
    for argument, value in (("dims", dims), ("margin", margin), ("max_proxies", max_proxies or 0),
                            ("max_pairs", max_pairs or 0), ("sensor_margin", sensor_margin)):
        try:
            setattr(request, argument, value)
        except (TypeError, ValueError):
            raise InvalidArgument(f"create_world: {argument} must be {CREATE_ARGUMENTS[argument]}, "
                                  f"not {value!r}") from None
    return request


def server_dict(info: pb.GetServerInfoResponse) -> dict:
    return {"version": info.version, "max_message_bytes": info.max_message_bytes,
            "max_worlds": info.max_worlds, "max_proxies_per_world": info.max_proxies_per_world,
            "max_pairs_per_world": info.max_pairs_per_world, "max_hits_per_call": info.max_hits_per_call,
            "persistent": info.persistent, "fsync": info.fsync, "peers": list(info.peers),
            "advertise": info.advertise}


def stats_dict(response: pb.GetWorldStatsResponse) -> dict:
    """The core's statistics and the world's description (which wins where both name a value) in one dict."""
    return {**response.tree_counts, **response.tree_measures, **dataclasses.asdict(world_info(response.world))}


class Client:
    """A connection to dbvt-server (`Client("127.0.0.1:50051")`), or in-process (`Client.local()`).

    Use as a context manager, or call `close()`.

    token: sent with every call, for a server started with --tokens (see `dbvt-server new-token`).
    tls: True (trust the system's CAs), a CA bundle's path or PEM bytes, or `TLS(ca=, cert=, key=)`
    for mutual TLS. Without tls a token is sent only to a loopback address or a Unix socket.

    A list of targets spreads worlds over those servers: each world lives on the one its name hashes
    to (rendezvous hashing, `dbvt_client.routing`), every call on a world goes to it, and
    `list_worlds()` merges them all.
    """

    def __init__(self, target: str | list[str], *, timeout: float | None = None, token: str | None = None, tls=None,
                 _transport=None):
        def connect(one: str) -> GrpcTransport:
            return GrpcTransport(Connection(one, timeout, token, tls))

        if _transport is None:
            _transport = routing.transport_for(target, connect, lambda dns: Connection(dns, timeout, token, tls),
                                               asynchronous=False)
        self._transport = _transport
        self._max_message_bytes: int | None = None
        # Sensor feeds and batch streams still open, which close() cuts: each then says why it ended.
        self._cut_on_close: weakref.WeakSet = weakref.WeakSet()

    @classmethod
    def local(cls, *, max_worlds: int = DEFAULT_MAX_WORLDS,
              max_proxies_per_world: int = DEFAULT_MAX_PROXIES_PER_WORLD) -> "Client":
        """The same API on in-process `dbvt.Broadphase` worlds: no server, no network."""
        return cls("", _transport=local_transport(False, max_worlds, max_proxies_per_world))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for opened in list(self._cut_on_close):
            opened.cut()
        self._transport.close()

    def server_info(self) -> dict:
        return server_dict(self._transport.unary("GetServerInfo", pb.GetServerInfoRequest()))

    def max_message_bytes(self) -> int:
        if self._max_message_bytes is None:
            self._max_message_bytes = self.server_info()["max_message_bytes"]
        return self._max_message_bytes

    def create_world(self, name: str, dims: int = 3, margin: float = 0.05, *, max_proxies: int | None = None,
                     track_pairs: bool = True, exist_ok: bool = False, max_pairs: int | None = None,
                     ephemeral: bool = False, sensor_margin: float = 0.0) -> "World":
        """A new, empty world. `track_pairs=False` makes a query-only world: moves cost only the tree's
        work, batches report no begun or ended pairs, and `pairs()` is computed when asked.

        `exist_ok=True` returns the world of that name if it is already there (a restarted game server
        reattaches to it, proxies and all), provided it has the same `dims`, `margin` and `track_pairs`
        (and, on a server with a data directory, `ephemeral`); otherwise it raises `AlreadyExists`
        naming the difference. `max_proxies` is compared only when
        given: `None` takes the existing world's limit, whatever it is.

        `max_pairs` limits the world's overlapping pairs (None: the server's limit): a batch that would
        pass it raises `ResourceExhausted` and changes nothing. The fat boxes' pairs are held to 4 times
        the limit while a batch is applied (docs/operations.md, Limits), so leave it some room. Compared on
        reattaching as `max_proxies` is.

        On a server with a data directory every world is kept across restarts, unless `ephemeral=True`
        (a throwaway match): such a world is gone when the server stops.

        `sensor_margin`: how far beyond a sensor's shape a proxy inside it may go before it leaves
        (see `World.watch`).
        """
        request = create_request(name, dims, margin, max_proxies, track_pairs, exist_ok, max_pairs, ephemeral,
                                 sensor_margin)
        self._transport.unary("CreateWorld", request)
        return World(self, name)

    def world(self, name: str) -> "World":
        """A handle on an existing world (no call is made until it is used)."""
        return World(self, name)

    def list_worlds(self, *, details: bool = False) -> list[str] | list[WorldInfo]:
        """The worlds' names, sorted; with `details=True`, each world's `WorldInfo`."""
        worlds = self._transport.unary("ListWorlds", pb.ListWorldsRequest()).worlds
        return [world_info(info) for info in worlds] if details else [info.name for info in worlds]

    def delete_world(self, name: str) -> None:
        self._transport.unary("DeleteWorld", pb.DeleteWorldRequest(name=name))

    def import_world(self, name: str, source, *, ephemeral: bool = False) -> "World":
        """A new world named `name` from an image written by `world.export()` (a path or a binary
        file), with the image's proxies, tick and incarnation. A damaged image raises InvalidArgument
        and creates nothing; a world of that name must not exist (AlreadyExists)."""
        requests = transfer.import_requests(name, transfer.read_image(source), ephemeral, self.max_message_bytes())
        self._transport.upload("ImportWorld", requests)
        return World(self, name)

    def overlap(self, world_a: str, world_b: str, *, mask_a=None, mask_b=None,
                include_sensors: bool = False) -> Crossings:
        """Every `[id in world_a, id in world_b]` whose tight boxes overlap, sorted, with both worlds'
        ticks: both are held still for the call. Worlds of different dims raise InvalidArgument."""
        return self._run(queries.overlap(world_a, world_b, mask_a, mask_b, include_sensors))

    def _run(self, plan: queries.Plan):
        return plan.finish(self._transport.query(plan.method, plan.requests))


class World:
    """One world of a `Client`. Methods mirror `dbvt.Broadphase`; see `apply` for batches."""

    def __init__(self, client: Client, name: str):
        self._client = client
        self.name = name

    def __repr__(self) -> str:
        return f"World({self.name!r})"

    def apply(self, create=None, move=None, destroy=None, *, static=None, group=None, mask=None, sensor=None,
              expected_tick: int | None = None) -> BatchResult:
        """Apply one batch atomically as one tick: all of it or, on any error, none of it.

        `create=(ids, boxes)` (with `static=`, `group=`, `mask=`, `sensor=`, each a scalar or one per
        row) or `create=Create(...)`; `move=(ids, boxes)`; `destroy=ids`. An id may appear once per
        batch. A sensor ("box", "sphere") reports who enters and leaves it in `entered` and `left`.

        `expected_tick=t` applies the batch only if the world is at tick t; otherwise it raises
        `TickMismatch` (with the world's `tick` and `incarnation`) and changes nothing. Retrying a batch
        whose answer was lost with the same t applies it exactly once.
        """
        ops = batches.encode(create, move, destroy, static, group, mask, sensor)
        parts = batches.split(ops, self._client.max_message_bytes(), expected_tick)
        transport = self._client._transport
        if len(parts) == 1:
            response = transport.unary("ApplyBatch", batches.apply_request(self.name, parts[0]))
            return batches.decode_result(response.result)
        with self.stream() as stream:
            return stream._apply_parts(parts)

    def stream(self) -> "BatchStream":
        stream = BatchStream(self)
        self._client._cut_on_close.add(stream)
        return stream

    def query_aabb(self, boxes, mask=None, include_sensors: bool = False) -> Hits:
        """Every query skips sensors unless `include_sensors=True`."""
        return self._client._run(queries.aabb(self.name, boxes, mask, self._client.max_message_bytes(),
                                              include_sensors))

    def query_sphere(self, centers, radii, mask=None, include_sensors: bool = False) -> Hits:
        return self._client._run(queries.sphere(self.name, centers, radii, mask, self._client.max_message_bytes(),
                                                include_sensors))

    def raycast(self, segments, first_hit: bool = False, mask=None, include_sensors: bool = False) -> RayHits:
        return self._client._run(queries.raycast(self.name, segments, first_hit, mask,
                                                 self._client.max_message_bytes(), include_sensors))

    def query_frustum(self, planes, mask=None, include_sensors: bool = False) -> Hits:
        return self._client._run(queries.frustum(self.name, planes, mask, self._client.max_message_bytes(),
                                                 include_sensors))

    def query_nearest(self, points, k: int, max_distance: float = float("inf"), mask=None,
                      include_sensors: bool = False) -> NearestHits:
        """For each point, up to k proxies nearest to it (distance to the tight box, 0 inside), no
        farther than `max_distance`, by distance then id: `(offsets, hits, distances)`."""
        return self._client._run(queries.nearest(self.name, points, k, max_distance, mask,
                                                 self._client.max_message_bytes(), include_sensors))

    def cast_box(self, boxes, displacements, first_hit: bool = False, mask=None,
                 include_sensors: bool = False) -> RayHits:
        """What each box touches when moved by t * displacement, t in [0, 1], and the first t at which
        (0 when it touches at the start), by t then id: `(offsets, hits, fractions)`."""
        return self._client._run(queries.cast_box(self.name, boxes, displacements, first_hit, mask,
                                                  self._client.max_message_bytes(), include_sensors))

    def cast_sphere(self, centers, radii, displacements, first_hit: bool = False, mask=None,
                    include_sensors: bool = False) -> RayHits:
        """As `cast_box`, for balls (a ball touches a box when its centre is within its radius of it)."""
        return self._client._run(queries.cast_sphere(self.name, centers, radii, displacements, first_hit, mask,
                                                     self._client.max_message_bytes(), include_sensors))

    def pairs(self):
        """All current pairs, (m, 2) uint64, rows (a, b) with a < b, sorted."""
        return self._client._run(queries.pairs(self.name))

    def sensor_pairs(self):
        """Every `[sensor, proxy]` inside now, (m, 2) uint64, sorted."""
        return self._client._run(queries.sensor_pairs(self.name))

    def watch(self, sensors=None, from_tick: int | None = None) -> watching.SensorWatch:
        """The world's sensor events as they happen (`for events in world.watch(): ...`, or as a
        context manager): a resync first, then each tick with events for `sensors` (None: all), and
        a heartbeat at least once a second. `from_tick=t` replays the ticks after t while the world
        still holds them. Fold them with `dbvt_client.SensorSet`."""
        request = watching.watch_request(self.name, sensors, from_tick)
        watch = watching.SensorWatch(*self._client._transport.watch(request))
        self._client._cut_on_close.add(watch)
        return watch

    def stats(self) -> dict:
        return stats_dict(self._client._transport.unary("GetWorldStats", pb.GetWorldStatsRequest(world=self.name)))

    def info(self) -> WorldInfo:
        return world_info(self._client._transport.unary("GetWorldStats", pb.GetWorldStatsRequest(world=self.name)).world)

    def snapshot(self) -> Snapshot:
        """Write a snapshot of this world to the server's data directory now (admin); its tick."""
        return transfer.snapshot(self._client._transport.unary("SnapshotWorld",
                                                               pb.SnapshotWorldRequest(world=self.name)))

    def export(self, destination) -> WorldInfo:
        """Write this world's image at one tick to `destination` (a path or a binary file): what
        `client.import_world()` takes, here or on another server. Returns the world as exported."""
        response = self._client._transport.unary("ExportWorld", pb.ExportWorldRequest(world=self.name))
        transfer.write_image(response, destination)
        return world_info(response.world)

    def begin_move(self, destination: str) -> WorldInfo:
        """Freeze this world for its move to the server `destination` (admin): every other call on it
        is refused with Moving (which the SDK retries) until `finish_move()`, across restarts too.
        Returns the world as frozen. `dbvt-admin rebalance` moves worlds with this."""
        request = pb.BeginMoveRequest(world=self.name, destination=destination)
        return world_info(self._client._transport.unary("BeginMove", request).world)

    def finish_move(self, *, cancel: bool = False) -> None:
        """Delete this frozen world here, its calls redirected to its destination from then on; or,
        with `cancel=True`, serve it here again (admin)."""
        self._client._transport.unary("FinishMove", pb.FinishMoveRequest(world=self.name, cancel=cancel))
