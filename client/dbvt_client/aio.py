"""The asyncio SDK: `AsyncClient`, with the methods of `Client`, awaitable."""
from __future__ import annotations

import asyncio
import collections
import itertools
import weakref

import grpc

from dbvt_client import batches, parts, queries, routing, transfer, watching
from dbvt_client.client import (DEFAULT_MAX_PROXIES_PER_WORLD, DEFAULT_MAX_WORLDS, create_request, server_dict,
                                stats_dict, world_info)
from dbvt_client.errors import (DbvtError, Unavailable, WrongServer, client_closed, from_exception, from_rpc_error,
                                from_stream_status)
from dbvt_client.parts import written_after
from dbvt_client.query_stream import QUERY_FIELDS, AsyncQueryStream
from dbvt_client.results import BatchResult, Crossings, Hits, NearestHits, RayHits, Snapshot, WorldInfo
from dbvt_client.transport import ANSWERED_IN_PARTS, Connection, batch_streams, local_transport
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc


class _GrpcStream:
    def __init__(self, stream_batches, metadata):
        self._call = stream_batches(metadata=metadata)

    async def write(self, request) -> None:
        try:
            await self._call.write(request)
        except (grpc.RpcError, asyncio.InvalidStateError):
            # A write fails only once the call is over, and gRPC then says "RPC already finished" or,
            # with answers still unread, "Internal error from Core": say that the stream is closed.
            raise from_stream_status(grpc.StatusCode.UNAVAILABLE, await self._call.details()) from None

    async def read(self):
        """The next response, or None at the end of the stream."""
        try:
            response = await self._call.read()
        except grpc.RpcError as error:
            raise from_stream_status(error.code(), error.details()) from None
        return None if response is grpc.aio.EOF else response

    async def done_writing(self) -> None:
        try:
            await self._call.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass  # the call is already over: the reader reports how it ended


class _AsyncGrpcTransport:
    def __init__(self, connection: Connection):
        self._channel = connection.channel(grpc.aio)
        self._stub = pb_grpc.BroadphaseServiceStub(self._channel)
        self._stream_batches = batch_streams(self._channel)
        self._timeout = connection.timeout
        self._metadata = connection.metadata
        self._query_stream = AsyncQueryStream(self._channel, self._metadata, self._timeout)
        self._closed = False

    def _stub_if_open(self) -> pb_grpc.BroadphaseServiceStub:
        # grpc.aio's own refusal on a closed channel is a UsageError, which no error class maps.
        if self._closed:
            raise client_closed()
        return self._stub

    async def unary(self, method: str, request):
        try:
            call = getattr(self._stub_if_open(), method)(request, timeout=self._timeout, metadata=self._metadata)
            return parts.joined([part async for part in call]) if method in ANSWERED_IN_PARTS else await call
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    async def query(self, method: str, requests: list):
        """See `GrpcTransport.query`."""
        if method not in QUERY_FIELDS:
            return await self.unary(method, requests[0])
        return await self._query_stream.ask(method, requests)

    async def upload(self, method: str, requests: list):
        """A client-streaming call: its parts sent, its one answer."""
        try:
            return await getattr(self._stub_if_open(), method)(iter(requests), timeout=self._timeout,
                                                               metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    async def watch(self, request: pb.WatchSensorsRequest):
        call = self._stub_if_open().WatchSensors(request, metadata=self._metadata)
        return call, call.cancel

    def open_stream(self, world: str) -> _GrpcStream:
        """A batch stream of `world` (a routed client picks the server by it)."""
        self._stub_if_open()
        return _GrpcStream(self._stream_batches, self._metadata)

    async def close(self) -> None:
        self._closed = True
        await self._query_stream.close()
        await self._channel.close()


class AsyncClient:
    """`Client` for asyncio: `async with AsyncClient("127.0.0.1:50051") as client: ...`; `token` and
    `tls` as for `Client`."""

    def __init__(self, target: str | list[str], *, timeout: float | None = None, token: str | None = None,
                 tls=None, _transport=None):
        def connect(one: str) -> _AsyncGrpcTransport:
            return _AsyncGrpcTransport(Connection(one, timeout, token, tls))

        if _transport is None:
            _transport = routing.transport_for(target, connect, lambda dns: Connection(dns, timeout, token, tls),
                                               asynchronous=True)
        self._transport = _transport
        self._max_message_bytes: int | None = None
        # Sensor feeds and batch streams still open, which close() cuts: each then says why it ended.
        self._cut_on_close: weakref.WeakSet = weakref.WeakSet()

    @classmethod
    def local(cls, *, max_worlds: int = DEFAULT_MAX_WORLDS,
              max_proxies_per_world: int = DEFAULT_MAX_PROXIES_PER_WORLD) -> "AsyncClient":
        return cls("", _transport=local_transport(True, max_worlds, max_proxies_per_world))

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        for opened in list(self._cut_on_close):
            opened.cut()
        await self._transport.close()

    async def server_info(self) -> dict:
        return server_dict(await self._transport.unary("GetServerInfo", pb.GetServerInfoRequest()))

    async def max_message_bytes(self) -> int:
        if self._max_message_bytes is None:
            self._max_message_bytes = (await self.server_info())["max_message_bytes"]
        return self._max_message_bytes

    async def create_world(self, name: str, dims: int = 3, margin: float = 0.05, *, max_proxies: int | None = None,
                           track_pairs: bool = True, exist_ok: bool = False,
                           max_pairs: int | None = None, ephemeral: bool = False,
                           sensor_margin: float = 0.0) -> "AsyncWorld":
        """See `Client.create_world`, `exist_ok`, `max_pairs`, `ephemeral` and `sensor_margin` included."""
        request = create_request(name, dims, margin, max_proxies, track_pairs, exist_ok, max_pairs, ephemeral,
                                 sensor_margin)
        await self._transport.unary("CreateWorld", request)
        return AsyncWorld(self, name)

    def world(self, name: str) -> "AsyncWorld":
        return AsyncWorld(self, name)

    async def list_worlds(self, *, details: bool = False) -> list[str] | list[WorldInfo]:
        """See `Client.list_worlds`."""
        worlds = (await self._transport.unary("ListWorlds", pb.ListWorldsRequest())).worlds
        return [world_info(info) for info in worlds] if details else [info.name for info in worlds]

    async def delete_world(self, name: str) -> None:
        await self._transport.unary("DeleteWorld", pb.DeleteWorldRequest(name=name))

    async def import_world(self, name: str, source, *, ephemeral: bool = False) -> "AsyncWorld":
        """See `Client.import_world` (the file is read on this thread)."""
        requests = transfer.import_requests(name, transfer.read_image(source), ephemeral,
                                            await self.max_message_bytes())
        await self._transport.upload("ImportWorld", requests)
        return AsyncWorld(self, name)

    async def overlap(self, world_a: str, world_b: str, *, mask_a=None, mask_b=None,
                      include_sensors: bool = False) -> Crossings:
        """See `Client.overlap`."""
        return await self._run(queries.overlap(world_a, world_b, mask_a, mask_b, include_sensors))

    async def _run(self, plan: queries.Plan):
        return plan.finish(await self._transport.query(plan.method, plan.requests))


class AsyncWorld:
    """`World` for asyncio; see `World` for the semantics."""

    def __init__(self, client: AsyncClient, name: str):
        self._client = client
        self.name = name

    def __repr__(self) -> str:
        return f"AsyncWorld({self.name!r})"

    async def apply(self, create=None, move=None, destroy=None, *, static=None, group=None,
                    mask=None, sensor=None, expected_tick: int | None = None) -> BatchResult:
        ops = batches.encode(create, move, destroy, static, group, mask, sensor)
        parts = batches.split(ops, await self._client.max_message_bytes(), expected_tick)
        if len(parts) == 1:
            request = batches.apply_request(self.name, parts[0])
            return batches.decode_result((await self._client._transport.unary("ApplyBatch", request)).result)
        async with self.stream() as stream:
            return await stream._apply_parts(parts)

    def stream(self) -> "AsyncBatchStream":
        stream = AsyncBatchStream(self)
        self._client._cut_on_close.add(stream)
        return stream

    async def query_aabb(self, boxes, mask=None, include_sensors: bool = False) -> Hits:
        limit = await self._client.max_message_bytes()
        return await self._client._run(queries.aabb(self.name, boxes, mask, limit, include_sensors))

    async def query_sphere(self, centers, radii, mask=None, include_sensors: bool = False) -> Hits:
        limit = await self._client.max_message_bytes()
        return await self._client._run(queries.sphere(self.name, centers, radii, mask, limit, include_sensors))

    async def raycast(self, segments, first_hit: bool = False, mask=None, include_sensors: bool = False) -> RayHits:
        limit = await self._client.max_message_bytes()
        return await self._client._run(queries.raycast(self.name, segments, first_hit, mask, limit, include_sensors))

    async def query_frustum(self, planes, mask=None, include_sensors: bool = False) -> Hits:
        limit = await self._client.max_message_bytes()
        return await self._client._run(queries.frustum(self.name, planes, mask, limit, include_sensors))

    async def query_nearest(self, points, k: int, max_distance: float = float("inf"), mask=None,
                            include_sensors: bool = False) -> NearestHits:
        limit = await self._client.max_message_bytes()
        return await self._client._run(queries.nearest(self.name, points, k, max_distance, mask, limit,
                                                       include_sensors))

    async def cast_box(self, boxes, displacements, first_hit: bool = False, mask=None,
                       include_sensors: bool = False) -> RayHits:
        limit = await self._client.max_message_bytes()
        return await self._client._run(queries.cast_box(self.name, boxes, displacements, first_hit, mask, limit,
                                                        include_sensors))

    async def cast_sphere(self, centers, radii, displacements, first_hit: bool = False, mask=None,
                          include_sensors: bool = False) -> RayHits:
        limit = await self._client.max_message_bytes()
        return await self._client._run(queries.cast_sphere(self.name, centers, radii, displacements, first_hit,
                                                           mask, limit, include_sensors))

    async def pairs(self):
        return await self._client._run(queries.pairs(self.name))

    async def sensor_pairs(self):
        return await self._client._run(queries.sensor_pairs(self.name))

    async def watch(self, sensors=None, from_tick: int | None = None) -> watching.AsyncSensorWatch:
        """See `World.watch`: `async with await world.watch() as feed: async for events in feed: ...`"""
        request = watching.watch_request(self.name, sensors, from_tick)
        watch = watching.AsyncSensorWatch(*await self._client._transport.watch(request))
        self._client._cut_on_close.add(watch)
        return watch

    async def stats(self) -> dict:
        return stats_dict(await self._client._transport.unary("GetWorldStats", pb.GetWorldStatsRequest(world=self.name)))

    async def info(self) -> WorldInfo:
        request = pb.GetWorldStatsRequest(world=self.name)
        return world_info((await self._client._transport.unary("GetWorldStats", request)).world)

    async def snapshot(self) -> Snapshot:
        """See `World.snapshot`."""
        request = pb.SnapshotWorldRequest(world=self.name)
        return transfer.snapshot(await self._client._transport.unary("SnapshotWorld", request))

    async def export(self, destination) -> WorldInfo:
        """See `World.export` (the file is written on this thread)."""
        response = await self._client._transport.unary("ExportWorld", pb.ExportWorldRequest(world=self.name))
        transfer.write_image(response, destination)
        return world_info(response.world)

    async def begin_move(self, destination: str) -> WorldInfo:
        """See `World.begin_move`."""
        request = pb.BeginMoveRequest(world=self.name, destination=destination)
        return world_info((await self._client._transport.unary("BeginMove", request)).world)

    async def finish_move(self, *, cancel: bool = False) -> None:
        """See `World.finish_move`."""
        await self._client._transport.unary("FinishMove", pb.FinishMoveRequest(world=self.name, cancel=cancel))


class AsyncBatchStream:
    """`BatchStream` for asyncio: `async with world.stream() as s: r = await s.apply(...)`;
    `await s.submit(...)` returns an `asyncio.Future` without waiting for the answer."""

    def __init__(self, world: AsyncWorld):
        self._world = world
        self._header = batches.stream_header(world.name)
        self._call = None
        self._reader: asyncio.Task | None = None
        self._pending: collections.deque[asyncio.Future] = collections.deque()
        self._sequence = itertools.count(1)
        self._closed = False
        # Set once the stream has ended: later submits fail at once with it.
        self._failure: DbvtError | None = None
        # The task writing the last batch submitted, which the next batch's writer follows
        # (parts.written_after): tasks sharing the stream would otherwise write at once, which gRPC
        # refuses by ending the call, and parts of batches would interleave.
        self._writing: asyncio.Future | None = None
        self._cut = False

    async def __aenter__(self) -> "AsyncBatchStream":
        # Asked first (every batch needs it): a client routing by DNS also learns its servers by it.
        await self._world._client.max_message_bytes()
        self._call = self._world._client._transport.open_stream(self._world.name)
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def submit(self, create=None, move=None, destroy=None, *, static=None, group=None,
                     mask=None, sensor=None, expected_tick: int | None = None) -> asyncio.Future:
        moves = batches.moves_alone(create, move, destroy, static, group, mask, sensor, expected_tick)
        limit = await self._world._client.max_message_bytes()
        if moves is not None and batches.fits_one_message(moves, limit):
            return await self._submit(moves, None)
        ops = batches.encode(create, move, destroy, static, group, mask, sensor)
        return await self._submit(None, batches.split(ops, limit, expected_tick))

    async def apply(self, create=None, move=None, destroy=None, *, static=None, group=None,
                    mask=None, sensor=None, expected_tick: int | None = None) -> BatchResult:
        return await (await self.submit(create, move, destroy, static=static, group=group, mask=mask,
                                        sensor=sensor, expected_tick=expected_tick))

    async def _apply_parts(self, cut: list[dict]) -> BatchResult:
        return await (await self._submit(None, cut))

    async def _submit(self, moves: tuple | None, cut: list[dict] | None) -> asyncio.Future:
        """Send moves alone that fit one message (`batches.moves_alone`), or the parts of any other batch."""
        if self._closed:
            raise Unavailable("the batch stream is closed")
        if self._failure is not None:
            raise self._failure
        if self._call is None:
            raise Unavailable("the batch stream is not open (use `async with world.stream() as s`)")
        future = asyncio.get_running_loop().create_future()
        self._pending.append(future)
        sequence = next(self._sequence)
        if moves is not None:
            requests = [batches.moves_request(self._header, sequence, *moves)]
        else:
            requests = batches.stream_requests(self._world.name, sequence, cut)
        self._writing = asyncio.ensure_future(written_after(self._writing, self._call.write, requests))
        # A caller cancelled meanwhile (its own timeout) leaves the batch going out whole: part of one
        # would make the server refuse the next as cutting into it, and put every later answer out of step.
        await asyncio.shield(self._writing)
        return future

    def cut(self) -> None:
        """See `BatchStream.cut`."""
        self._cut = True

    async def close(self) -> None:
        if self._call is not None and not self._closed:
            # Batches submitted before go out whole first; later submits are refused.
            self._closed = True
            if self._writing is not None:
                await asyncio.gather(self._writing, return_exceptions=True)
            await self._call.done_writing()
            await self._reader

    async def _read(self) -> None:
        failure: DbvtError = Unavailable("the batch stream ended before answering")
        answers = parts.StreamAnswers()
        try:
            while (response := await self._call.read()) is not None:
                if (response := answers.whole(response)) is None:
                    continue
                refusal = batches.settle(self._pending.popleft(), response)
                if isinstance(refusal, WrongServer):
                    # The world lives elsewhere: the next stream, and every call, goes there.
                    self._world._client._transport.remember(self._world.name, refusal)
        except DbvtError as error:
            failure = error
        except asyncio.CancelledError:
            # gRPC cancels the call when the client's channel closes under it.
            failure = Unavailable("the batch stream was cut off: its client was closed")
        except Exception as exc:
            failure = from_exception(exc)
        if self._cut:
            failure = client_closed()
        self._failure = failure
        while self._pending:
            future = self._pending.popleft()
            if not future.done():
                future.set_exception(failure)
