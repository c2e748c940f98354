"""`world.watch()`: a world's sensor events as they happen, for any client with read rights.

The server sends a resync first (the whole set of `[sensor, proxy]` inside, at a tick), then one
message per tick with events for the watched sensors, in tick order, and a heartbeat (no events)
at least once a second while nothing happens. `SensorSet` folds them: after each message it holds
the exact set at that message's tick.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable, Iterator

import grpc
import numpy as np

from dbvt_client import parts, wire
from dbvt_client.errors import InvalidArgument, client_closed, from_rpc_error
from dbvt_client.results import SensorEvents
from dbvt_proto.v1 import broadphase_pb2 as pb


def watch_request(world: str, sensors, from_tick) -> pb.WatchSensorsRequest:
    request = pb.WatchSensorsRequest(world=world, narrow_ids=True)
    if sensors is not None:
        request.sensors = wire.ids_array(sensors, "sensors").tobytes()
    if from_tick is not None:
        if isinstance(from_tick, bool) or not isinstance(from_tick, (int, np.integer)) or from_tick < 0:
            raise InvalidArgument(f"from_tick must be None or a tick >= 0, not {from_tick!r}")
        request.from_tick = int(from_tick)
    return request


def decoded(response: pb.WatchSensorsResponse) -> SensorEvents:
    narrow = response.narrow_ids
    return SensorEvents(tick=response.tick, incarnation=response.incarnation,
                        entered=wire.decode_id_rows(response.entered, narrow, "entered"),
                        left=wire.decode_id_rows(response.left, narrow, "left"),
                        resync=response.resync,
                        inside=wire.decode_id_rows(response.inside, narrow, "inside"))


class _Joiner:
    """Whole messages from a feed whose big messages (a resync) come in parts."""

    def __init__(self):
        self._pieces: list = []

    def whole(self, response: pb.WatchSensorsResponse) -> SensorEvents | None:
        self._pieces.append(response)
        if response.more_parts:
            return None
        message, self._pieces = parts.joined(self._pieces), []
        return decoded(message)


class SensorWatch:
    """`for events in world.watch(): ...`; a context manager, or call `close()` to stop."""

    def __init__(self, responses: Iterator, stop: Callable[[], None]):
        self._responses = responses
        self._stop = stop
        self._joiner = _Joiner()
        self._closed = False
        # Set when its client closed under it: the feed then raises what every call of a closed client does.
        self._cut = False

    def __iter__(self) -> "SensorWatch":
        return self

    def __next__(self) -> SensorEvents:
        try:
            for response in self._responses:
                events = self._joiner.whole(response)
                if events is not None:
                    return events
        except grpc.RpcError as error:
            if self._closed:
                raise StopIteration from None
            if self._cut:
                raise client_closed() from None
            raise from_rpc_error(error) from None
        if self._cut and not self._closed:
            raise client_closed()
        raise StopIteration

    def __enter__(self) -> "SensorWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._stop()

    def cut(self) -> None:
        """Its client is closing: the feed stops, and says why."""
        self._cut = True
        self._stop()


class AsyncSensorWatch:
    """`async with world.watch() as feed: async for events in feed: ...`"""

    def __init__(self, responses: AsyncIterator, stop: Callable[[], None]):
        self._responses = responses
        self._stop = stop
        self._joiner = _Joiner()
        self._closed = False
        self._cut = False

    def __aiter__(self) -> "AsyncSensorWatch":
        return self

    async def __anext__(self) -> SensorEvents:
        try:
            async for response in self._responses:
                events = self._joiner.whole(response)
                if events is not None:
                    return events
        except (grpc.RpcError, asyncio.CancelledError) as error:
            if self._closed:
                raise StopAsyncIteration from None
            if self._cut:
                # grpc.aio ends a cancelled call's reader with CancelledError, as if the task had been.
                raise client_closed() from None
            if isinstance(error, asyncio.CancelledError):
                raise
            raise from_rpc_error(error) from None
        if self._cut and not self._closed:
            raise client_closed()
        raise StopAsyncIteration

    async def __aenter__(self) -> "AsyncSensorWatch":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._stop()

    def cut(self) -> None:
        """See `SensorWatch.cut`."""
        self._cut = True
        self._stop()


class SensorSet:
    """The set a feed describes, folded message by message: `inside` (rows `[sensor, proxy]`,
    sorted) is exact at `tick` after each `fold`."""

    def __init__(self):
        self.tick: int | None = None
        self._rows: set[tuple[int, int]] = set()

    def fold(self, events: SensorEvents) -> None:
        if events.resync:
            self._rows = set(map(tuple, events.inside.tolist()))
        else:
            self._rows -= set(map(tuple, events.left.tolist()))
            self._rows |= set(map(tuple, events.entered.tolist()))
        self.tick = events.tick

    @property
    def inside(self) -> np.ndarray:
        return np.array(sorted(self._rows), np.uint64).reshape(-1, 2)
