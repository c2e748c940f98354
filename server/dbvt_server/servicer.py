"""The gRPC servicer: a thin adapter from `dbvt.v1.BroadphaseService` onto `dbvt_server.service`.

Each world has one queue of operations (dbvt_server.world_queue): calls on one world run one at a
time, in the order they arrived. The work itself runs on a thread pool, off the event loop, so
worlds run in parallel (the core releases the GIL). Errors become statuses through the SDK's one
error table, and each is logged (dbvt_server.logs). Each method first asks `dbvt_server.access` for
the right it needs (RIGHTS) on the world it names. The RPCs of world images, of sensors and of moves
are in their own mixins (dbvt_server.image_rpcs, dbvt_server.sensor_rpcs, dbvt_server.move_rpcs).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
import weakref

import grpc

from dbvt_client import parts
from dbvt_client.errors import DbvtError, DeadlineExceeded, ResourceExhausted, quoted
from dbvt_client.serialized import serialized
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc
from dbvt_server import access, handlers
from dbvt_server._result_bytes import stream_answer
from dbvt_server.access import by_whom
from dbvt_server.decoding import bytes_or, decoded, in_place_or, tolerant
from dbvt_server.image_rpcs import ImageRpcs
from dbvt_server.in_flight import END, InFlight
from dbvt_server.logs import Rejections, shown
from dbvt_server.memory import give_back
from dbvt_server.move_rpcs import MoveRpcs
from dbvt_server.query_stream import QUERY_KINDS, QueryStreamRpcs
from dbvt_server.sensor_rpcs import SensorRpcs
from dbvt_server.service import ANSWER_TYPES, Service
from dbvt_server.staging import BatchStaging, QuerySet, stream_error, unfinished_error
from dbvt_server.world_pool import WorldPool
from dbvt_server.world_queue import WorldQueue, failed
from dbvt_server.worlds import WORLD_RPCS, World, overlap

log = logging.getLogger("dbvt_server")

# The right each world RPC needs on its world (a token's role grants read, write or admin).
RIGHTS = {"GetWorldStats": "read", "QueryAabb": "read", "QuerySphere": "read", "Raycast": "read",
          "QueryFrustum": "read", "GetPairs": "read", "ApplyBatch": "write", "StreamBatches": "write",
          "SnapshotWorld": "admin", "ExportWorld": "admin", "GetSensorPairs": "read", "WatchSensors": "read",
          "QueryNearest": "read", "CastBox": "read", "CastSphere": "read", "Overlap": "read"}
# The world RPCs that also reach a world being moved: what its mover reads.
MOVER_RPCS = {"ExportWorld"}


def _timed(function):
    """With --log-level DEBUG, each world operation logs how long it took on its thread, and how much of
    that was CPU (the rest was waiting for the GIL or a core); what the client sees beyond it is wire."""

    def timed(world: World, request):
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return function(world, request)
        finally:
            log.debug("%s on world %r: %.3f ms, %.3f ms CPU", function.__name__, world.name,
                      (time.perf_counter() - started) * 1e3, (time.thread_time() - cpu) * 1e3)

    return timed


class BroadphaseServicer(ImageRpcs, SensorRpcs, MoveRpcs, QueryStreamRpcs, pb_grpc.BroadphaseServiceServicer):
    def __init__(self, service: Service, executor: WorldPool, rejections: Rejections):
        self.service = service
        # Batch streams open now (on the event loop's thread only).
        self.open_streams = 0
        # The reader tasks of the query streams open now, which a shutdown stops (end_query_streams).
        self.query_stream_readers: set[asyncio.Task] = set()
        self.query_streams_ended = False
        # dbvt_server.metrics.Metrics, when the server publishes metrics.
        self.metrics = None
        self._executor = executor
        self._rejections = rejections
        self._queues: weakref.WeakKeyDictionary[World, WorldQueue] = weakref.WeakKeyDictionary()
        # What each world RPC runs on the world's thread: the worlds' own, but batches through
        # apply_batch, which also counts them for the metrics.
        self._world_functions = {**WORLD_RPCS, "ApplyBatch": self.apply_batch, "SnapshotWorld": self._snapshot}
        # The same, each answer serialized there too (answers sent whole or in parts, not SnapshotWorld's).
        self._serializing_functions = {method: _serializing(function, ANSWER_TYPES[method])
                                       for method, function in self._world_functions.items()}

    def _applied(self, world: World, batch: pb.Batch, narrow_ids: bool) -> bytes:
        """On the world's thread: a batch applied, and counted when metrics are on; its BatchResult
        serialized there, straight from the pair arrays."""
        result = world.applied(batch, narrow_ids)
        if self.metrics is not None:
            self.metrics.count_batch(batch)
        return result

    def apply_streamed(self, world: World, job: tuple[int, pb.Batch, bool]) -> bytes:
        """A streamed batch (its sequence, the batch, and whether its last part allowed ids of 32 bits)
        applied: the stream's answer to it, serialized whole."""
        sequence, batch, narrow_ids = job
        return stream_answer(sequence, self._applied(world, batch, narrow_ids))

    def apply_batch(self, world: World, request: pb.ApplyBatchRequest) -> bytes:
        return serialized(pb.ApplyBatchResponse, result=self._applied(world, request.batch, request.narrow_ids))

    def queue_depths(self) -> dict[str, int]:
        """Each world's operations waiting for their turn."""
        return {world.name: queue.depth for world, queue in list(self._queues.items())}

    def _start(self, world: World, function, request, deadline: float | None = None) -> asyncio.Future:
        """`function(world, request)` queued on the world; the future of its answer.

        A call cancelled before its turn (client gone, or shutdown past its grace) is dropped; once
        started it runs to the end, and the world's next operation waits for it, so no call ever sees
        a world half-way through another.
        """
        queue = self._queue(world)
        if log.isEnabledFor(logging.DEBUG):
            function = _timed(function)
        if deadline is not None:
            function = _unless_late(function, deadline)
        return queue.start(function, world, request)

    def _queue(self, world: World) -> WorldQueue:
        queue = self._queues.get(world)
        if queue is None:
            queue = self._queues[world] = WorldQueue(self._executor, self.service.limits.max_queued_per_world,
                                                     f"world {quoted(world.name)} is busy")
        return queue

    @property
    def _max_message_bytes(self) -> int:
        return self.service.limits.max_message_bytes

    async def _world_rpc(self, method: str, request, context, serialize: bool = False):
        """The world function's answer; with `serialize`, serialized on the world's thread (bytes)."""
        try:
            decoded(request)
            access.require(RIGHTS[method], request.world)
            world = self.service.held(request.world) if method in MOVER_RPCS else self.service.world(request.world)
            functions = self._serializing_functions if serialize else self._world_functions
            return await self._start(world, functions[method], request, _deadline(context))
        except Exception as exc:
            await self._abort(context, method, request, exc)

    async def _query_rpc(self, method: str, request, context):
        """A query whose answer goes in one message, or a RESOURCE_EXHAUSTED that says to use Query."""
        answer = await self._world_rpc(method, request, context, serialize=True)
        if len(answer) > self._max_message_bytes:
            error = ResourceExhausted(f"the answer of {len(answer)} bytes exceeds the server's "
                                      f"{self._max_message_bytes}-byte messages: ask it with Query, which sends it "
                                      "in parts (the SDK does)")
            # Not logged: the SDK asks again with Query, as the protocol says to.
            await context.abort(error.code, error.message,
                                trailing_metadata=((parts.ANSWER_BYTES_KEY, str(len(answer))),))
        return answer

    async def _answer_in_parts(self, method: str, request, context, wrapper_bytes: int = 0):
        """The answer, serialized, or cut so that each part, inside a message of `wrapper_bytes` more,
        fits the limit (then messages)."""
        answer = await self._world_rpc(method, request, context, serialize=method not in CUT_AS_MESSAGES)
        for part in _cut(answer, ANSWER_TYPES[method], self._max_message_bytes - wrapper_bytes):
            yield part

    async def _registry_rpc(self, method: str, function, request, context):
        try:
            decoded(request)
            return function(request)
        except Exception as exc:
            await self._abort(context, method, request, exc)

    async def _abort(self, context, method: str, request, exc: Exception):
        error = self._rejections.log(method, getattr(request, "world", getattr(request, "name", None)), exc)
        await context.abort(error.code, error.message, trailing_metadata=error.metadata)

    async def GetServerInfo(self, request, context):
        return await self._registry_rpc("GetServerInfo", self._server_info, request, context)

    def _server_info(self, request: pb.GetServerInfoRequest) -> pb.GetServerInfoResponse:
        access.require("read")
        return self.service.server_info(request)

    async def CreateWorld(self, request, context):
        return await self._registry_rpc("CreateWorld", self._create_world, request, context)

    def _create_world(self, request: pb.CreateWorldRequest) -> pb.CreateWorldResponse:
        access.require("admin", request.name)
        response = self.service.create_world(request)
        if response.created:
            world = response.world
            log.info("created world %s (dims=%d, margin=%g, track_pairs=%s, max_proxies=%d)%s", shown(world.name),
                     world.dims, world.margin, world.track_pairs, world.max_proxies, by_whom())
        return response

    async def DeleteWorld(self, request, context):
        return await self._registry_rpc("DeleteWorld", self._delete_world, request, context)

    def _delete_world(self, request: pb.DeleteWorldRequest) -> pb.DeleteWorldResponse:
        access.require("admin", request.name)
        world = self.service.world(request.name)
        response = self.service.delete_world(request)
        # Operations already queued on the world still run: its memory is given back once they are done
        # and the world is gone.
        weakref.finalize(world, self._give_back_memory, asyncio.get_running_loop()).atexit = False
        log.info("deleted world %s (%d proxies)%s", shown(world.name), len(world.broadphase), by_whom())
        return response

    def _give_back_memory(self, loop: asyncio.AbstractEventLoop) -> None:
        # Runs on whichever thread drops the world, possibly in the garbage collector while that thread
        # holds a lock (the pool's own, inside submit): so take none here, and let the loop submit.
        try:
            loop.call_soon_threadsafe(self._trim)
        except RuntimeError:
            pass  # the loop has closed: the server has stopped

    def _trim(self) -> None:
        """On a world thread: trimming takes milliseconds."""
        try:
            self._executor.submit(give_back)
        except RuntimeError:
            pass  # the pool has shut down: the server is stopping

    async def ListWorlds(self, request, context):
        return await self._registry_rpc("ListWorlds", self._list_worlds, request, context)

    def _list_worlds(self, request: pb.ListWorldsRequest) -> pb.ListWorldsResponse:
        access.require("read")
        return self.service.list_worlds(request, access.visible)

    async def GetWorldStats(self, request, context):
        return await self._world_rpc("GetWorldStats", request, context)

    async def ApplyBatch(self, request, context):
        async for part in self._answer_in_parts("ApplyBatch", request, context):
            yield part

    async def QueryAabb(self, request, context):
        return await self._query_rpc("QueryAabb", request, context)

    async def QuerySphere(self, request, context):
        return await self._query_rpc("QuerySphere", request, context)

    async def Raycast(self, request, context):
        return await self._query_rpc("Raycast", request, context)

    async def QueryFrustum(self, request, context):
        return await self._query_rpc("QueryFrustum", request, context)

    async def GetPairs(self, request, context):
        async for part in self._answer_in_parts("GetPairs", request, context):
            yield part

    async def QueryNearest(self, request, context):
        return await self._query_rpc("QueryNearest", request, context)

    async def CastBox(self, request, context):
        return await self._query_rpc("CastBox", request, context)

    async def CastSphere(self, request, context):
        return await self._query_rpc("CastSphere", request, context)

    async def Overlap(self, request, context):
        """Both worlds held still (held in the order of their names, so that two opposite calls cannot
        wait for each other), the crossings found on a worker thread, the answer sent in parts."""
        try:
            decoded(request)
            for name in (request.world_a, request.world_b):
                access.require(RIGHTS["Overlap"], name)
            a, b = self.service.world(request.world_a), self.service.world(request.world_b)
            response = await self._holding(sorted({a, b}, key=lambda world: world.name), overlap, a, b, request,
                                           self.service.limits.max_hits_per_call)
        except Exception as exc:
            await self._abort(context, "Overlap", request, exc)
        for part in parts.cut(response, self._max_message_bytes):
            yield part

    async def _holding(self, worlds: list[World], function, *args):
        """`function(*args)` on a worker thread while every one of `worlds` is held still."""
        held = []
        try:
            for world in worlds:
                hold = self._queue(world).hold()
                held.append((world, hold))
                await asyncio.wrap_future(hold)
            return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)
        finally:
            for world, hold in held:
                # A hold that can no longer be cancelled has been (or is being) reached: release it.
                if not hold.cancel():
                    self._queue(world).release()

    async def Query(self, request_iterator, context):
        """The parts of a query set, joined, answered at one tick as one operation on the world, in parts."""
        # The set's bytes count against the staging budget until the call ends, however it ends.
        query_set = QuerySet(self.service.staged, self.service.limits.max_proxies_per_world, "the query set")
        try:
            try:
                async for request in request_iterator:
                    decoded(request)
                    query_set.add(request)
                request = query_set.joined()
            except Exception as exc:
                await self._abort(context, QUERY_KINDS.get(query_set.kind, "Query"), None, exc)
            async for part in self._answer_in_parts(QUERY_KINDS[query_set.kind], request, context,
                                                    parts.PART_OVERHEAD):
                yield serialized(pb.QueryResponse, **{query_set.kind: part}) if isinstance(part, bytes) else \
                    pb.QueryResponse(**{query_set.kind: part})
        finally:
            query_set.hold.release()

    async def StreamBatches(self, request_iterator, context):
        """Answers in order of arrival, while the next batches are already being read and started.

        A reader task takes messages off the stream and queues each complete batch on its world at
        once (a world's queue runs them one at a time, in order). So a client that pipelines its
        batches keeps the world busy while this task answers and the next message is parsed, instead
        of the world idling between batches. At most STREAM_READ_AHEAD batches wait for their answers,
        so a fast writer cannot make the server hold more.
        """
        in_flight = InFlight(STREAM_READ_AHEAD)
        reader = asyncio.create_task(self._start_batches(request_iterator, in_flight))
        max_bytes = self._max_message_bytes
        self.open_streams += 1
        try:
            while (answer := await in_flight.take()) is not END:
                sequence, world, outcome = answer
                try:
                    applied = await outcome
                except Exception as exc:
                    error = self._rejections.log("StreamBatches", world, exc)
                    self._count_streamed_batch(error.code)
                    yield stream_error(sequence, error)
                else:
                    self._count_streamed_batch(grpc.StatusCode.OK)
                    if len(applied) <= max_bytes - parts.PART_OVERHEAD:
                        yield applied
                    else:
                        for response in _answer_cut(sequence, applied, max_bytes):
                            yield response
                in_flight.answered()
            try:
                await reader
            except DbvtError as exc:
                # A message that is not a StreamBatchesRequest: the stream cannot go on.
                await self._abort(context, "StreamBatches", None, exc)
        finally:
            self.open_streams -= 1
            reader.cancel()
            # After a stream ends early (client gone, shutdown): the batches already started finish, so
            # that no world is left half-way through one, and their answers are dropped.
            await asyncio.gather(reader, *(outcome for _, _, outcome in in_flight.left()), return_exceptions=True)

    async def _start_batches(self, request_iterator, in_flight: InFlight) -> None:
        """Each complete batch of the stream, started on its world, added with its sequence number."""
        staging = BatchStaging(self.service.limits.max_proxies_per_world, self.service.staged)
        try:
            async for request in request_iterator:
                decoded(request)
                try:
                    batch = staging.add(request)
                except Exception as exc:
                    await in_flight.room()
                    in_flight.add((request.sequence, request.world, failed(exc)))
                    continue
                if batch is not None:
                    await in_flight.room()
                    in_flight.add((request.sequence, request.world,
                                   self._start_batch(request.world, request.sequence, batch, request.narrow_ids)))
            # The client closed its side with a batch half sent: that batch is answered, not forgotten.
            unfinished = staging.unfinished()
            if unfinished is not None:
                await in_flight.room()
                in_flight.add((unfinished[1], unfinished[0], failed(unfinished_error(unfinished))))
        finally:
            staging.unfinished()
            in_flight.end()

    def _count_streamed_batch(self, code: grpc.StatusCode) -> None:
        if self.metrics is not None:
            self.metrics.count_streamed_batch(code)

    def _start_batch(self, name: str, sequence: int, batch: pb.Batch, narrow_ids: bool) -> asyncio.Future:
        try:
            access.require(RIGHTS["StreamBatches"], name)
            return self._start(self.service.world(name), self.apply_streamed, (sequence, batch, narrow_ids))
        except Exception as exc:
            return failed(exc)


def _deadline(context) -> float | None:
    """The call's deadline on time.monotonic()'s clock, or None."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def _unless_late(function, deadline: float):
    """`function`, refused unapplied if its turn comes after the call's deadline: the client has
    already been told DEADLINE_EXCEEDED, so it must not take effect. Once started, it completes."""

    def unless_late(world: World, request):
        if time.monotonic() > deadline:
            raise DeadlineExceeded(f"the call's deadline passed while it waited for its turn on world "
                                   f"{quoted(world.name)}; nothing of it was applied")
        return function(world, request)

    return unless_late


# Batches of one stream started before the oldest of them has been answered.
STREAM_READ_AHEAD = 4


def _answer_cut(sequence: int, answer: bytes, max_bytes: int):
    """A batch's answer, serialized whole on the world's thread (`stream_answer`) but past the message
    size, as messages each holding a part of its result."""
    result = pb.StreamBatchesResponse.FromString(answer).result
    pieces = list(parts.cut(result, max_bytes - parts.PART_OVERHEAD))
    for number, piece in enumerate(pieces, 1):
        yield pb.StreamBatchesResponse(sequence=sequence, result=piece, more_parts=number < len(pieces))


def _serializing(function, message_class):
    """`function`, its answer serialized where it runs (the world's thread): the event loop then only
    sends the bytes, and they are made once (an upb message's ByteSize() serializes it). A query's
    answer comes as its fields (dbvt_server.worlds.World._answer)."""

    @functools.wraps(function)
    def serializing(world: World, request) -> bytes:
        answer = function(world, request)
        if isinstance(answer, dict):
            return serialized(message_class, **answer)
        return answer if isinstance(answer, bytes) else answer.SerializeToString()

    return serializing


def _cut(answer, message_class, max_bytes: int):
    """An answer (a message, or serialized) in parts of at most `max_bytes`: a serialized one that fits
    as it is, else messages."""
    if isinstance(answer, bytes):
        if len(answer) <= max_bytes:
            return [answer]
        answer = message_class.FromString(answer)
    return parts.cut(answer, max_bytes)


# Answers cut from their message, not serialized first: a world's image mostly needs several parts.
CUT_AS_MESSAGES = {"ExportWorld"}



def add_to_server(servicer: BroadphaseServicer, server: grpc.aio.Server) -> None:
    """What the generated add_BroadphaseServiceServicer_to_server does, with requests decoded by
    `tolerant` deserializers (dbvt_server.decoding)."""
    service = pb.DESCRIPTOR.services_by_name["BroadphaseService"]
    method_handlers = {
        method.name: handlers.HANDLER_MAKERS[method.client_streaming, method.server_streaming](
            getattr(servicer, method.name),
            request_deserializer=(in_place_or if method.name == "StreamBatches" else tolerant)(
                getattr(pb, method.input_type.name)),
            response_serializer=bytes_or(getattr(pb, method.output_type.name).SerializeToString))
        for method in service.methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, method_handlers),))
    server.add_registered_method_handlers(service.full_name, method_handlers)
