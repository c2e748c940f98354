"""WorldQueue, on the world threads (WorldPool): one world's operations run one at a time in
submission order, different worlds run at once and take turns, cancelled operations are dropped,
failures are reported, and operations accepted while the pool shuts down still run. And the pool
itself: its threads, its order, what a failing task leaves, and its shutdown."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import CancelledError, wait

import pytest

from dbvt_server.world_pool import WorldPool
from dbvt_server.world_queue import WorldQueue


class Recorder:
    """Operations that log their order and the most of them that ever ran at once."""

    def __init__(self):
        self.order: list = []
        self.running = self.most_at_once = 0
        self.started = threading.Event()
        self._lock = threading.Lock()

    def operation(self, tag, hold: threading.Event | None = None, pause: float = 0.0):
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.started.set()
        if hold is not None:
            assert hold.wait(30), "the operation was never released"
        time.sleep(pause)  # lets other threads run meanwhile, so overlapping operations would show
        with self._lock:
            self.order.append(tag)
            self.running -= 1
        return tag


def test_one_world_runs_its_operations_one_at_a_time_in_order():
    recorder = Recorder()
    with WorldPool(4) as pool:
        queue = WorldQueue(pool)
        futures = [queue.submit(recorder.operation, i, None, 0.001) for i in range(100)]
        assert [f.result(30) for f in futures] == list(range(100))
    assert recorder.order == list(range(100))
    assert recorder.most_at_once == 1


def test_two_worlds_run_at_once():
    """World a's operation can only finish once world b's has run, so a queue serializing both would hang."""
    b_ran = threading.Event()
    with WorldPool(2) as pool:
        a, b = WorldQueue(pool), WorldQueue(pool)
        waiting = a.submit(b_ran.wait, 30)
        b.submit(b_ran.set).result(30)
        assert waiting.result(30) is True


def test_busy_worlds_take_turns_on_one_thread():
    recorder = Recorder()
    release = threading.Event()
    with WorldPool(1) as pool:
        a, b = WorldQueue(pool), WorldQueue(pool)
        first = a.submit(recorder.operation, "a0", release)
        rest = [queue.submit(recorder.operation, f"{name}{i}")
                for i in range(1, 4) for name, queue in (("a", a), ("b", b))]
        release.set()
        wait([first, *rest], 30)
    assert recorder.order == ["a0", "b1", "a1", "b2", "a2", "b3", "a3"]


class CountingPool(WorldPool):
    """The world threads, counting the tasks posted to them."""

    posted = 0

    def post(self, task):
        self.posted += 1
        return super().post(task)


def test_a_busy_world_alone_keeps_its_thread():
    """Handing each operation to the pool again would wake another thread, with cold caches, for each."""
    release = threading.Event()
    with CountingPool(4) as pool:
        queue = WorldQueue(pool)
        first = queue.submit(release.wait, 30)
        rest = [queue.submit(time.sleep, 0.001) for _ in range(20)]
        release.set()
        wait([first, *rest], 30)
        assert pool.posted == 1


def test_cancelled_operations_are_dropped_and_failures_reported():
    recorder = Recorder()
    release = threading.Event()
    with WorldPool(2) as pool:
        queue = WorldQueue(pool)
        running = queue.submit(recorder.operation, "running", release)
        dropped = queue.submit(recorder.operation, "dropped")
        failing = queue.submit(int, "not a number")
        after = queue.submit(recorder.operation, "after")
        assert recorder.started.wait(30)
        assert dropped.cancel() and not running.cancel(), "only an operation that has not started can be dropped"
        release.set()
        assert running.result(30) == "running" and after.result(30) == "after"
        with pytest.raises(ValueError, match="not a number"):
            failing.result(30)
        with pytest.raises(CancelledError):
            dropped.result(0)
    assert recorder.order == ["running", "after"]


def test_operations_accepted_while_the_pool_shuts_down_still_run():
    recorder = Recorder()
    release = threading.Event()
    pool = WorldPool(1)
    queue = WorldQueue(pool)
    first = queue.submit(recorder.operation, "first", release)
    second = queue.submit(recorder.operation, "second")
    closing = threading.Thread(target=pool.shutdown, kwargs={"wait": True})
    closing.start()
    release.set()
    closing.join(30)
    assert first.result(0) == "first" and second.result(0) == "second"
    late = queue.submit(recorder.operation, "late")
    assert late.result(0) == "late", "after shutdown, an operation runs in the caller's thread"
    assert recorder.order == ["first", "second", "late"]


def test_operations_started_from_an_event_loop_keep_the_order_cancels_and_failures():
    """start() is submit() for the event loop: its asyncio futures take their turns among submit()'s,
    one cancelled before its turn is dropped, and a failure reaches the awaiting coroutine."""
    recorder = Recorder()
    release = threading.Event()

    async def main(queue: WorldQueue):
        first = queue.submit(recorder.operation, "first", release)
        started = queue.start(recorder.operation, "started")
        dropped = queue.start(recorder.operation, "dropped")
        failing = queue.start(int, "not a number")
        last = queue.submit(recorder.operation, "last")
        dropped.cancel()
        release.set()
        assert await started == "started"
        with pytest.raises(ValueError, match="not a number"):
            await failing
        assert dropped.cancelled()
        assert await asyncio.wrap_future(last) == "last" and first.result(0) == "first"

    with WorldPool(2) as pool:
        asyncio.run(main(WorldQueue(pool)))
    assert recorder.order == ["first", "started", "last"]


def test_an_operation_whose_loop_has_closed_still_lets_the_world_go_on():
    recorder = Recorder()
    release = threading.Event()
    with WorldPool(1) as pool:
        queue = WorldQueue(pool)

        async def abandon():
            queue.start(recorder.operation, "abandoned", release)

        asyncio.run(abandon())
        release.set()
        assert queue.submit(recorder.operation, "next").result(30) == "next"
    assert recorder.order == ["abandoned", "next"]


def test_the_world_threads_run_posted_tasks_in_order_and_outlive_a_failing_one(caplog):
    ran = []
    with WorldPool(1, "test-world") as pool:
        pool.post(lambda: ran.append(threading.current_thread().name))
        pool.post(lambda: 1 / 0)
        pool.post(lambda: ran.append("after"))
        assert pool.submit(len, "abc").result(30) == 3
        with pytest.raises(ZeroDivisionError):
            pool.submit(lambda: 1 / 0).result(30)

        async def in_executor():
            return await asyncio.get_running_loop().run_in_executor(pool, sum, [1, 2])

        assert asyncio.run(in_executor()) == 3
    assert ran == ["test-world_0", "after"]
    assert "a task on the world threads failed" in caplog.text and "ZeroDivisionError" in caplog.text


def test_the_world_threads_finish_what_was_posted_and_then_refuse():
    release = threading.Event()
    ran = []
    pool = WorldPool(2)
    pool.post(lambda: release.wait(30))
    for number in range(5):
        pool.post(lambda number=number: ran.append(number))
    closing = threading.Thread(target=pool.shutdown)
    closing.start()
    with pytest.raises(RuntimeError, match="shut down"):
        for _ in range(1000):
            pool.post(lambda: ran.append("late"))
            time.sleep(0.001)
    release.set()
    closing.join(30)
    assert not closing.is_alive() and sorted(ran) == list(range(5))
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(len, "a")
