"""The gRPC servicer: a thin adapter from `dbvt.v1.BroadphaseService` onto `dbvt_client.service`.

Each world has one asyncio lock: calls on one world run one at a time, in the order they took the
lock. The work itself runs on a thread pool, off the event loop, so worlds run in parallel (the
core releases the GIL). Errors become statuses through the SDK's one error table.
"""
from __future__ import annotations

import asyncio
import logging
import time
import weakref
from concurrent.futures import Executor

from dbvt_client.errors import from_exception
from dbvt_client.service import BatchStaging, Service, stream_error
from dbvt_client.worlds import WORLD_RPCS, World
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc

log = logging.getLogger("dbvt_server")


def _timed(function):
    """With --log-level DEBUG, each world operation logs how long the core took (the rest is wire)."""

    def timed(world: World, request):
        started = time.perf_counter()
        try:
            return function(world, request)
        finally:
            log.debug("%s on world %r: %.3f ms", function.__name__, world.name, (time.perf_counter() - started) * 1e3)

    return timed


class BroadphaseServicer(pb_grpc.BroadphaseServiceServicer):
    def __init__(self, service: Service, executor: Executor):
        self._service = service
        self._executor = executor
        self._locks: weakref.WeakKeyDictionary[World, asyncio.Lock] = weakref.WeakKeyDictionary()

    async def _on_world(self, world: World, function, request):
        """`function(world, request)` on the pool, under the world's lock.

        If the call is cancelled (client gone, or shutdown past its grace) the lock is still held
        until the thread is done, so that no other call can touch the world half-way through.
        """
        lock = self._locks.setdefault(world, asyncio.Lock())
        async with lock:
            if log.isEnabledFor(logging.DEBUG):
                function = _timed(function)
            running = asyncio.get_running_loop().run_in_executor(self._executor, function, world, request)
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                await asyncio.wait({running})
                raise

    async def _world_rpc(self, method: str, request, context):
        try:
            return await self._on_world(self._service.world(request.world), WORLD_RPCS[method], request)
        except Exception as exc:
            error = from_exception(exc)
            await context.abort(error.code, error.message)

    async def _registry_rpc(self, function, request, context):
        try:
            return function(request)
        except Exception as exc:
            error = from_exception(exc)
            await context.abort(error.code, error.message)

    async def GetServerInfo(self, request, context):
        return await self._registry_rpc(self._service.server_info, request, context)

    async def CreateWorld(self, request, context):
        return await self._registry_rpc(self._service.create_world, request, context)

    async def DeleteWorld(self, request, context):
        return await self._registry_rpc(self._service.delete_world, request, context)

    async def ListWorlds(self, request, context):
        return await self._registry_rpc(self._service.list_worlds, request, context)

    async def GetWorldStats(self, request, context):
        return await self._world_rpc("GetWorldStats", request, context)

    async def ApplyBatch(self, request, context):
        return await self._world_rpc("ApplyBatch", request, context)

    async def QueryAabb(self, request, context):
        return await self._world_rpc("QueryAabb", request, context)

    async def QuerySphere(self, request, context):
        return await self._world_rpc("QuerySphere", request, context)

    async def Raycast(self, request, context):
        return await self._world_rpc("Raycast", request, context)

    async def QueryFrustum(self, request, context):
        return await self._world_rpc("QueryFrustum", request, context)

    async def GetPairs(self, request, context):
        return await self._world_rpc("GetPairs", request, context)

    async def StreamBatches(self, request_iterator, context):
        staging = BatchStaging(self._service.limits)
        async for request in request_iterator:
            try:
                batch = staging.add(request)
                if batch is None:
                    continue
                result = await self._on_world(self._service.world(request.world), World.apply, batch)
                yield pb.StreamBatchesResponse(sequence=request.sequence, result=result)
            except Exception as exc:
                yield stream_error(request.sequence, from_exception(exc))
