"""The RPCs of sensors: GetSensorPairs and WatchSensors, each watcher fed from its world's feed.

A mixin of `dbvt_server.servicer.BroadphaseServicer`, whose world queues and error handling it uses.
"""
from __future__ import annotations

import asyncio

from dbvt_client import parts
from dbvt_client.errors import ResourceExhausted
from dbvt_server import access
from dbvt_server.decoding import decoded
from dbvt_server.watch import Watcher, heartbeat, watched_sensors
from dbvt_server.worlds import World


class SensorRpcs:
    async def GetSensorPairs(self, request, context):
        async for part in self._answer_in_parts("GetSensorPairs", request, context):
            yield part

    async def WatchSensors(self, request, context):
        """A world's sensor events, as its feed hands them to this watcher, each tick's message encoded
        once for all the watchers that share it; a heartbeat after each second without a message."""
        try:
            decoded(request)
            access.require("read", request.world)
            world = self.service.world(request.world)
            loop, ready = asyncio.get_running_loop(), asyncio.Event()
            from_tick = request.from_tick if request.HasField("from_tick") else None
            watcher = world.feed.watch(watched_sensors(request.sensors), from_tick,
                                       lambda: loop.call_soon_threadsafe(ready.set))
        except Exception as exc:
            await self._abort(context, "WatchSensors", request, exc)
        try:
            while True:
                if watcher.needs_resync:
                    await self._resync(world, watcher)
                ready.clear()
                items, tick, closed = watcher.take()
                for events in items:
                    for part in _watch_parts(events, request.narrow_ids, self._max_message_bytes):
                        yield part
                if closed is not None and not items:
                    await self._abort(context, "WatchSensors", request, closed)
                if items or watcher.needs_resync:
                    continue
                try:
                    await asyncio.wait_for(ready.wait(), WATCH_HEARTBEAT_SECONDS)
                except asyncio.TimeoutError:
                    yield heartbeat(tick, world.incarnation).SerializeToString()
        finally:
            world.feed.unwatch(watcher)

    async def _resync(self, world: World, watcher: Watcher) -> None:
        """The world's whole sensor set put in the watcher's queue, on the world's thread; a busy
        world is asked again shortly."""
        while watcher.needs_resync and watcher.closed is None:
            try:
                await self._start(world, _resync_on_world, watcher)
                return
            except ResourceExhausted:
                await asyncio.sleep(RESYNC_RETRY_SECONDS)


def _resync_on_world(world: World, watcher: Watcher) -> None:
    world.feed.resync(watcher, world.broadphase.sensor_pairs())


def _watch_parts(events, narrow_ids: bool, max_bytes: int):
    """A tick's message, serialized once for every watcher of the same id width, or its parts when it
    does not fit (a big resync)."""
    serialized = events.serialized(narrow_ids)
    if len(serialized) <= max_bytes:
        yield serialized
        return
    pieces = list(parts.cut(events.message(narrow_ids), max_bytes - parts.PART_OVERHEAD))
    for number, piece in enumerate(pieces, 1):
        piece.more_parts = number < len(pieces)
        yield piece


# A watcher that has had no message for this long gets a heartbeat with the world's tick.
WATCH_HEARTBEAT_SECONDS = 1.0
RESYNC_RETRY_SECONDS = 0.05
