"""The world threads: `--workers` threads that run the worlds' turns, and whatever else the server
does off its event loop.

concurrent.futures.ThreadPoolExecutor made every world's turn a Future and a work item, and counted
its idle threads with a Semaphore: about a dozen Python calls a tick on the event loop and the
world's thread, each several microseconds with the caches cold (the world's update leaves them so).
Nothing waits on a turn's future, so `post()` only puts the turn where the threads take their work.
`submit()` is the Executor's, for the rest: an overlap, an import, asyncio's run_in_executor.
"""
from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Executor, Future
from typing import Callable

log = logging.getLogger(__name__)


class WorldPool(Executor):
    def __init__(self, workers: int, name: str = "dbvt-world"):
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        # Held while a task is put and while the pool shuts down: nothing is put after the threads'
        # stop marks, where no thread would take it.
        self._lock = threading.Lock()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{number}", daemon=True)
                         for number in range(workers)]
        for thread in self._threads:
            thread.start()

    def post(self, task: Callable[[], None]) -> None:
        """Run `task()` on a thread of the pool, in the order posted; nothing waits for it, and what it
        raises is logged. Raises RuntimeError once the pool has shut down."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the world threads have shut down")
            self._tasks.put(task)

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        self.post(run)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more tasks; those posted before still run. `cancel_futures` is not supported: a
        world's turn, once accepted, always runs."""
        with self._lock:
            if not self._closed:
                self._closed = True
                for _ in self._threads:
                    self._tasks.put(None)
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                task()
            except BaseException:
                log.exception("a task on the world threads failed")
