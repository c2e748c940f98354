"""The operations of one world, run one at a time in order of submission, on the shared thread pool.

A thread that finishes an operation of a world takes the world's next queued operation itself rather
than handing back to the event loop and waiting for it to start the next one, so a client that
pipelines its batches keeps the world busy even while the event loop waits for a core. While another
world waits for a thread of the pool (or the turn has run TURN_SECONDS), the world goes back in line
after each operation instead, so that busy worlds share the threads fairly; alone, it keeps its
thread, which saves waking another (and the caches it would start cold).

The event loop queues its calls with `start()`, whose asyncio future the world's thread settles on the
loop; threads use `submit()`'s concurrent.futures.Future.

An operation on several worlds (the overlap of two) holds each still with `hold()`, in a fixed order
of worlds, and runs once all are held: a held world runs nothing until `release()`, and no thread
waits meanwhile, so holds cannot starve the pool.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Callable

import dbvt
from dbvt_client.errors import ResourceExhausted
from dbvt_server.world_pool import WorldPool


# The longest a world keeps a thread of the pool, operation after operation, while no other world
# waits for one: work given to the pool outside the worlds' queues (an overlap, a snapshot) waits at
# most this long for a thread.
TURN_SECONDS = 0.05


class _Line:
    """How many worlds' turns wait for a thread of one pool."""

    def __init__(self):
        self.waiting = 0
        self.lock = threading.Lock()


# Each pool's line, shared by the queues of all the worlds it runs.
_LINES: weakref.WeakKeyDictionary[WorldPool, _Line] = weakref.WeakKeyDictionary()
_LINES_LOCK = threading.Lock()


def _line_of(pool: WorldPool) -> _Line:
    with _LINES_LOCK:
        line = _LINES.get(pool)
        if line is None:
            line = _LINES[pool] = _Line()
        return line


class WorldQueue:
    def __init__(self, pool: WorldPool, max_queued: int = 2**62, busy: str = "the world is busy"):
        self._pool = pool
        self._line = _line_of(pool)
        # Past this many operations waiting, submit refuses at once: memory never grows with a backlog.
        self._max_queued = max_queued
        self._busy = busy
        self._lock = threading.Lock()
        self._jobs: collections.deque[tuple[Future | asyncio.Future, Callable, tuple]] = collections.deque()
        # Whether a turn of this world is on the pool (queued or running): then it takes new jobs too.
        self._in_line = False

    def hold(self) -> Future:
        """The future of the moment every operation submitted before has run; from then the world runs
        nothing more until `release()`. Cancelling the future before that moment drops the hold."""
        return self.submit(_HOLD)

    def release(self) -> None:
        with self._lock:
            if not self._jobs:
                self._in_line = False
                return
        self._get_in_line()

    def submit(self, function: Callable, *args) -> Future:
        """The future of `function(*args)`, run after every operation submitted before it.

        Cancelling the future before the operation starts drops it; once started it runs to the end.
        Raises ResourceExhausted when `max_queued` operations are already waiting.
        """
        job: Future = Future()
        self._add(job, function, args)
        return job

    def start(self, function: Callable, *args) -> asyncio.Future:
        """`submit()` for the event loop: the asyncio future of `function(*args)`, settled on the loop
        that called. Wrapping submit()'s future would make a second future and a chain between them,
        which cost a tick about twenty Python calls with the caches cold."""
        job = asyncio.Future()
        self._add(job, function, args)
        return job

    def _add(self, job: Future | asyncio.Future, function: Callable, args: tuple) -> None:
        with self._lock:
            if len(self._jobs) >= self._max_queued:
                raise ResourceExhausted(f"{self._busy}: {len(self._jobs)} operations are queued on it, the most "
                                        "the server queues (--max-queued-per-world); try again when it has caught up")
            self._jobs.append((job, function, args))
            if self._in_line:
                return
            self._in_line = True
        self._get_in_line()

    @property
    def depth(self) -> int:
        """Operations waiting for their turn (not counting one running)."""
        return len(self._jobs)

    def _get_in_line(self) -> None:
        with self._line.lock:
            self._line.waiting += 1
        try:
            self._pool.post(self._turn)
        except RuntimeError:
            with self._line.lock:
                self._line.waiting -= 1
            # The pool is shutting down: what was accepted still runs, here and now.
            while self._run_next():
                pass

    def _turn(self) -> None:
        with self._line.lock:
            self._line.waiting -= 1
        ends = time.monotonic() + TURN_SECONDS
        # The turn's thread counts against the thread budget: a call elsewhere takes no thread it uses.
        with dbvt.working():
            while self._run_next():
                if self._line.waiting or time.monotonic() > ends:
                    self._get_in_line()
                    return

    def _run_next(self) -> bool:
        """Run the next job that was not cancelled; whether more are waiting (the turn goes on)."""
        while True:
            with self._lock:
                if not self._jobs:
                    self._in_line = False
                    return False
                job, function, args = self._jobs.popleft()
            # An asyncio future is only read here: it is cancelled (and settled) on its loop.
            if job.cancelled() if type(job) is asyncio.Future else not job.set_running_or_notify_cancel():
                continue
            break
        if function is _HOLD:
            # The turn ends here and the world stays in line, so that nothing else runs until release().
            job.set_result(None)
            return False
        try:
            result, error = function(*args), None
        except BaseException as exc:
            result, error = None, exc
        if type(job) is asyncio.Future:
            _settle_on_loop(job, result, error)
        elif error is None:
            job.set_result(result)
        else:
            job.set_exception(error)
        with self._lock:
            if self._jobs:
                return True
            self._in_line = False
            return False


def _settle_on_loop(job: asyncio.Future, result, error: BaseException | None) -> None:
    try:
        job.get_loop().call_soon_threadsafe(_settle, job, result, error)
    except RuntimeError:
        pass    # the loop has closed: no one waits for the answer


def _settle(job: asyncio.Future, result, error: BaseException | None) -> None:
    """On the job's loop: its answer, unless it was cancelled meanwhile."""
    if job.done():
        return
    if error is None:
        job.set_result(result)
    else:
        job.set_exception(error)


def _HOLD() -> None:
    """The marker of a hold in a world's queue; never called."""


def failed(exc: Exception) -> asyncio.Future:
    """An operation's answer refused before it was queued (an unknown world, a missing right)."""
    future = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    return future
