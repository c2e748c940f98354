"""The batches a stream has started and not yet answered, in order, at most a window of them.

One reader task adds and one answering coroutine takes, on one event loop. asyncio.Queue and
asyncio.Semaphore did the same in about twenty Python calls a batch, where this makes five: a
streamed tick runs with the caches cold (the world's update evicts them), where each call costs
microseconds.
"""
from __future__ import annotations

import asyncio
from collections import deque

# What `end()` adds: the stream has no more batches.
END = None


class InFlight:
    def __init__(self, window: int):
        self._window = window
        self._items: deque = deque()
        # Added and not yet answered, taken or not.
        self._unanswered = 0
        # The futures the taker waits on for an item, and the adder for room.
        self._taker: asyncio.Future | None = None
        self._adder: asyncio.Future | None = None

    async def room(self) -> None:
        """Return once fewer than `window` added items are unanswered."""
        while self._unanswered >= self._window:
            self._adder = asyncio.get_running_loop().create_future()
            await self._adder

    def add(self, item) -> None:
        """Add `item` (after `room()`): it counts against the window until `answered()`."""
        self._unanswered += 1
        self._put(item)

    def end(self) -> None:
        self._put(END)

    async def take(self):
        """The next item in the order added; END after the last."""
        while not self._items:
            self._taker = asyncio.get_running_loop().create_future()
            await self._taker
        return self._items.popleft()

    def answered(self) -> None:
        """An item taken has been answered: it no longer counts against the window."""
        self._unanswered -= 1
        if self._adder is not None:
            self._adder = _woken(self._adder)

    def left(self) -> list:
        """The items not taken (END left out), taken now: what a stream ended early had started."""
        items = [item for item in self._items if item is not END]
        self._items.clear()
        return items

    def _put(self, item) -> None:
        self._items.append(item)
        if self._taker is not None:
            self._taker = _woken(self._taker)


def _woken(waiter: asyncio.Future) -> None:
    """Wake whoever waits on `waiter` (a cancelled waiter is gone): the waiter is spent."""
    if not waiter.done():
        waiter.set_result(None)
    return None
