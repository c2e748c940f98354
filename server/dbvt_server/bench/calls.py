"""`dbvt-bench calls`: the Python calls a streamed W1 tick makes, thread by thread, beside the bare server's.

A dbvt-server and the bare gRPC server of `dbvt_server.bench.floor` (its pool's thread making the
same dbvt calls: move, then update()) run in this process, each on an event loop thread of its own.
The SDK's stream and a bare client step the same W1 ticks, tick by tick, the bare client's messages
made beforehand (as `dbvt-bench wire` pairs them). A profiler hook counts every Python and C function
each thread calls during --steps ticks, after the first few.

A count is not a time, but it does not move with the machine's load. A tick starts with cold caches,
and then each call costs several times its warm time: the service's calls beyond the bare server's
are where its tick's time beyond the bare server's goes (docs/benchmarks.md).
"""
from __future__ import annotations

import asyncio
import collections
import queue
import sys
import threading
from concurrent.futures import Future

import grpc

from dbvt_client import Client
from dbvt_server.app import create_server
from dbvt_server.bench import console, floor, workload
from dbvt_server.config import Config

# Ticks stepped before the counting starts: the first ones build caches and threads.
WARM_UP = 3
LOOP_THREAD = "dbvt-bench-loop"
# The prefixes of the threads that apply a tick: dbvt-server's pool, and the bare server's.
WORLD_THREADS = ("dbvt-world", "bare-world")
ROLES = ("the caller", "the client's other threads", "the server's event loop", "the world's thread")


class CallCounter:
    """Calls by thread, counted while `on`, once `install()` has hooked this thread and every thread
    started after it."""

    def __init__(self):
        self.on = False
        self.calls: collections.Counter[int] = collections.Counter()

    def install(self) -> None:
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)

    def remove(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    def _hook(self, frame, event: str, arg) -> None:
        if self.on and (event == "call" or event == "c_call"):
            self.calls[threading.get_ident()] += 1

    def by_role(self, ticks: int) -> dict[str, float]:
        """Each role's calls a tick; every thread of the process is one role's."""
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        found = dict.fromkeys(ROLES, 0.0)
        for ident, count in self.calls.items():
            found[_role(ident, names.get(ident, ""))] += count / ticks
        self.calls.clear()
        return found


def _role(ident: int, name: str) -> str:
    if ident == threading.main_thread().ident:
        return "the caller"
    if name == LOOP_THREAD:
        return "the server's event loop"
    if name.startswith(WORLD_THREADS):
        return "the world's thread"
    return "the client's other threads"


def _serving(make):
    """An event loop thread running the server `make()` starts: the loop, its thread, what it returned."""
    loop = asyncio.new_event_loop()
    started: Future = Future()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            started.set_result(loop.run_until_complete(make()))
        except BaseException as exc:
            started.set_exception(exc)
            return
        loop.run_forever()

    thread = threading.Thread(target=run, name=LOOP_THREAD, daemon=True)
    thread.start()
    return loop, thread, started.result(30)


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread, stopping) -> None:
    asyncio.run_coroutine_threadsafe(stopping, loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)
    loop.close()


def service_ticks(work: workload.Workload, counter: CallCounter) -> tuple[dict[str, float], bool]:
    """The service's calls a tick, and whether its pair counts after every step were the oracle's."""
    loop, thread, running = _serving(lambda: create_server(Config(host="127.0.0.1", port=0)))
    try:
        with Client(f"127.0.0.1:{running.port}") as client:
            world = client.create_world("calls", dims=3, margin=0.05)
            pairs = len(world.apply(create=(work.ids, work.boxes)).begun)
            counts = []
            with world.stream() as stream:
                for step in range(work.steps):
                    counter.on = step >= WARM_UP
                    result = stream.apply(move=(work.move_ids[step], work.move_boxes[step]))
                    counter.on = False
                    pairs += len(result.begun) - len(result.ended)
                    counts.append(pairs)
        # While the server's threads live: they are told apart by name.
        found = counter.by_role(work.steps - WARM_UP)
    finally:
        _stop(loop, thread, running.stop(0))
    return found, counts == work.expected["pairs_per_step"][:work.steps]


def bare_ticks(work: workload.Workload, counter: CallCounter) -> dict[str, float]:
    """The bare server's and its client's calls a tick."""
    messages = [floor.step_message(ids, boxes) for ids, boxes in zip(work.move_ids, work.move_boxes)]
    loop, thread, (server, port) = _serving(lambda: floor.started_bare_server(1, WORLD_THREADS[1]))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]) as channel:
            requests: queue.SimpleQueue = queue.SimpleQueue()
            answers = channel.stream_stream(floor.STEPS_METHOD)(iter(requests.get, None))
            requests.put(work.boxes.astype("<f4").tobytes())
            next(answers)
            for step, message in enumerate(messages):
                counter.on = step >= WARM_UP
                requests.put(message)
                next(answers)
                counter.on = False
            requests.put(None)
            list(answers)
        found = counter.by_role(work.steps - WARM_UP)
    finally:
        _stop(loop, thread, server.stop(0))
    return found


def add_arguments(parser) -> None:
    workload.add_w1_arguments(parser, __doc__)


def run(args, facts: dict) -> int:
    work = workload.w1_for(args, "calls")
    if work.steps <= WARM_UP:
        raise workload.BadWorkload(f"--steps must be more than the {WARM_UP} ticks stepped before counting")
    counter = CallCounter()
    counter.install()
    try:
        served, exact = service_ticks(work, counter)
        bare = bare_ticks(work, counter)
    finally:
        counter.remove()
    ticks = work.steps - WARM_UP
    print(f"Python and C calls a tick, over {ticks} W1 ticks streamed tick by tick (after {WARM_UP}):")
    print(f"{'':32}{'dbvt-server':>12}{'bare gRPC':>12}{'beyond':>10}")
    for role in (*ROLES, "all"):
        mine = sum(served.values()) if role == "all" else served[role]
        theirs = sum(bare.values()) if role == "all" else bare[role]
        print(f"{role:32}{mine:12.0f}{theirs:12.0f}{mine - theirs:+10.0f}")
    print(f"the service's pair counts after every step {'match' if exact else 'DIFFER FROM'} the oracle's expected.json")
    console.footer(facts)
    return 0 if exact else 1
