"""Sensor feeds: each world's sensor events, kept for a while and handed to any number of watchers.

The world's thread publishes each tick's events once (`SensorFeed.publish`, inside `World.apply`),
and each watcher's consumer (a gRPC stream, or an in-process iterator) takes what has piled up for
it. Publishing does O(1) work per watcher that watches every sensor (it shares the tick's one
message, encoded once) and a filter of the tick's rows per watcher of some sensors; it never waits
for a consumer. A consumer that falls more than `backlog` ticks behind loses its backlog and gets a
resync: the whole set, taken on the world's thread, at the tick it holds at.

The feed's lock orders publishing, taking and resyncing, so that every watcher sees its ticks in
order, each once: a resync is put in a watcher's queue on the world's thread between two batches,
where the world's tick and the feed's are the same.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from dbvt_client import wire
from dbvt_client.errors import DbvtError, InvalidArgument
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server.worlds import id_columns, message_fields

NO_ROWS = np.zeros((0, 2), np.uint64)


@dataclass
class TickEvents:
    """One tick's events for one audience: rows [sensor, proxy], sorted; or a resync (`inside`)."""

    tick: int
    incarnation: int
    entered: np.ndarray = field(default_factory=lambda: NO_ROWS)
    left: np.ndarray = field(default_factory=lambda: NO_ROWS)
    inside: np.ndarray | None = None
    # The message and its bytes, by whether the watchers they are for allow ids of 32 bits.
    _messages: dict = field(default_factory=dict, compare=False, repr=False)
    _serialized: dict = field(default_factory=dict, compare=False, repr=False)

    def message(self, narrow_ids: bool) -> pb.WatchSensorsResponse:
        """The tick as the protocol sends it to watchers that allow (`narrow_ids`) ids of 32 bits or
        not, built once however many watchers share it."""
        if narrow_ids not in self._messages:
            rows = dict(entered=self.entered, left=self.left)
            if self.inside is not None:
                rows["inside"] = self.inside
            self._messages[narrow_ids] = pb.WatchSensorsResponse(
                tick=self.tick, incarnation=self.incarnation, resync=self.inside is not None,
                **message_fields(id_columns(narrow_ids, **rows)))
        return self._messages[narrow_ids]

    def serialized(self, narrow_ids: bool) -> bytes:
        """The message's bytes, serialized once however many watchers send them."""
        if narrow_ids not in self._serialized:
            self._serialized[narrow_ids] = self.message(narrow_ids).SerializeToString()
        return self._serialized[narrow_ids]

    def only(self, sensors: np.ndarray) -> "TickEvents | None":
        """These events for some sensors (sorted ids), or None when none of them are about those."""
        entered = self.entered[np.isin(self.entered[:, 0], sensors)]
        left = self.left[np.isin(self.left[:, 0], sensors)]
        if not len(entered) and not len(left):
            return None
        return TickEvents(self.tick, self.incarnation, entered, left)


class Watcher:
    """One consumer's queue of ticks."""

    def __init__(self, feed: "SensorFeed", sensors: np.ndarray | None, wake: Callable[[], None]):
        self.feed = feed
        self.sensors = sensors
        self.wake = wake
        self.queue: collections.deque[TickEvents] = collections.deque()
        # Set until a resync has been queued: the consumer asks the world for one.
        self.needs_resync = False
        self.closed: DbvtError | None = None

    def offer(self, events: TickEvents) -> None:
        """Called under the feed's lock: queue a tick (or resync, past the backlog)."""
        if self.needs_resync:
            return
        if self.sensors is not None:
            events = events.only(self.sensors)
            if events is None:
                return
        if len(self.queue) >= self.feed.backlog:
            self.queue.clear()
            self.needs_resync = True
        else:
            self.queue.append(events)
        self.wake()

    def take(self) -> tuple[list[TickEvents], int, DbvtError | None]:
        """Everything queued, the feed's tick now (a heartbeat may say it), and why the feed ended."""
        with self.feed.lock:
            items = list(self.queue)
            self.queue.clear()
            return items, self.feed.tick, self.closed


class SensorFeed:
    """A world's sensor events of the last `history` ticks, and its watchers."""

    def __init__(self, tick: int, incarnation: int, history: int = 256, backlog: int = 1024):
        self.lock = threading.Lock()
        self.tick = tick
        self.incarnation = incarnation
        self.history_ticks = history
        self.backlog = backlog
        # The ticks with events after `covered_from`, oldest first: the feed can replay from there.
        self._history: collections.deque[TickEvents] = collections.deque()
        self.covered_from = tick
        self._watchers: set[Watcher] = set()

    def publish(self, tick: int, entered: np.ndarray, left: np.ndarray) -> None:
        """On the world's thread, after each applied batch."""
        with self.lock:
            self.tick = tick
            if len(entered) or len(left):
                events = TickEvents(tick, self.incarnation, entered, left)
                self._history.append(events)
                for watcher in self._watchers:
                    watcher.offer(events)
            self.covered_from = max(self.covered_from, tick - self.history_ticks)
            while self._history and self._history[0].tick <= self.covered_from:
                self._history.popleft()

    def watch(self, sensors: np.ndarray | None, from_tick: int | None, wake: Callable[[], None]) -> Watcher:
        """A new watcher: its queue replays the ticks after `from_tick` when the feed still has them,
        else it needs a resync first."""
        watcher = Watcher(self, sensors, wake)
        with self.lock:
            if from_tick is not None and from_tick > self.tick:
                raise InvalidArgument(f"from_tick {from_tick} is ahead of the world's tick {self.tick}")
            if from_tick is not None and from_tick >= self.covered_from:
                for events in self._history:
                    if events.tick > from_tick:
                        watcher.offer(events)
            else:
                watcher.needs_resync = True
            self._watchers.add(watcher)
        return watcher

    def resync(self, watcher: Watcher, inside: np.ndarray) -> None:
        """On the world's thread (so the world's tick is the feed's): the watcher's queue becomes the
        whole set for its sensors, at this tick."""
        if watcher.sensors is not None:
            inside = inside[np.isin(inside[:, 0], watcher.sensors)]
        with self.lock:
            watcher.queue.clear()
            watcher.queue.append(TickEvents(self.tick, self.incarnation, inside=inside))
            watcher.needs_resync = False
        watcher.wake()

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            self._watchers.discard(watcher)

    def close(self, error: DbvtError) -> None:
        """The world is gone: every watcher ends with `error` once it has read what it had."""
        with self.lock:
            watchers = list(self._watchers)
            for watcher in watchers:
                watcher.closed = error
        for watcher in watchers:
            watcher.wake()

    @property
    def watchers(self) -> int:
        return len(self._watchers)


def watched_sensors(data: bytes) -> np.ndarray | None:
    """A WatchSensorsRequest's sensors: sorted unique uint64 ids, or None for all."""
    if not data:
        return None
    if len(data) % wire.IDS.itemsize:
        raise InvalidArgument(f"sensors has {len(data)} bytes, not a whole number of uint64 ids")
    return np.unique(np.frombuffer(data, wire.IDS))


def heartbeat(tick: int, incarnation: int) -> pb.WatchSensorsResponse:
    return pb.WatchSensorsResponse(tick=tick, incarnation=incarnation)
