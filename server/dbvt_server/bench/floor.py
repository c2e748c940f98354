"""dbvt-bench's wire floor: what a tick-by-tick round trip costs in gRPC itself, with no dbvt code.

A bare grpc.aio server in a child process answers each message of a bidirectional stream once a thread
of its pool has busy-waited as long as the message asks, as dbvt-server answers a batch once a world
thread has applied it. A synchronous client sends messages of a streamed step's size and waits for
each answer, as `BatchStream.apply()` does. The round trip minus the wait is the floor: the thread
hand-offs, HTTP/2 and the kernel, which any server built this way pays.

A busy wait runs as fast after the thread has slept as before; a W1 step does not (its thread wakes to
cold caches). So `paired_steps` also serves the step itself: the same bare server, its pool's
thread making the same dbvt calls on a dbvt.Broadphase of the same W1 (move, then update), the
moves and the pair changes sent as raw columns, each step sent to it and to dbvt-server one after the
other. A streamed step's time beyond the bare server's is what the service adds to the dbvt calls:
its protocol, checks and hand-offs.

With two pool threads, the same bare server is the two busy worlds' control too
(dbvt_server.bench.parallel.over_the_wire): each of its worlds stepped on a stream of its own, or
queried by unary calls, as dbvt-server's are. With one, it is the control of the 10k box queries:
a world taken through the same W1 steps (query_asker), asked the same call as dbvt-server's world.

    python -m dbvt_server.bench.floor --serve [WORKERS]   # the child: prints its port, serves until killed
"""
from __future__ import annotations

import asyncio
import contextlib
import queue
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

import grpc
import numpy as np

FLOOR = "/dbvt_bench.Floor/"
METHOD = FLOOR + "Echo"
STEPS_METHOD = FLOOR + "Steps"
# A move of the stepping floor: its uint64 id, then (in its own column) its six float32 bounds.
MOVE_BYTES = 8 + 6 * 4
# A request: seconds to work (float64) and bytes to answer (uint32), then padding to its size.
HEADER = struct.Struct("<dI")
# What ends a step's answer: the seconds the bare server's dbvt calls took.
WORK_SECONDS = struct.Struct("<d")
ROUNDS = 40
WARM_UP = 5


def step_message(ids: np.ndarray, boxes: np.ndarray) -> bytes:
    """A step for the stepping floor: its moves' uint64 ids, then their float32 boxes (MOVE_BYTES a move)."""
    return ids.astype("<u8").tobytes() + boxes.astype("<f4").tobytes()


def _work(seconds: float, answer_bytes: int) -> bytes:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass
    return bytes(answer_bytes)


class _Stepper:
    """The stepping floor's world: a dbvt.Broadphase made by the first message's boxes, moved by the next."""

    def __init__(self):
        self.broadphase = None

    def create(self, boxes: bytes) -> bytes:
        from dbvt import Broadphase

        rows = np.frombuffer(boxes, "<f4").reshape(-1, 6)
        self.broadphase = Broadphase(dims=3, margin=0.05)
        self.broadphase.create(np.arange(len(rows), dtype=np.uint64), rows)
        self.broadphase.update()
        return b""

    def step(self, moves: bytes) -> bytes:
        """The step's pair changes, then the seconds its dbvt calls took (float64, WORK_SECONDS), as
        dbvt-server's answer carries world_seconds."""
        count = len(moves) // MOVE_BYTES
        ids = np.frombuffer(moves, "<u8", count)
        boxes = np.frombuffer(moves, "<f4", 6 * count, 8 * count).reshape(count, 6)
        started = time.perf_counter()
        self.broadphase.move(ids, boxes)
        begun, ended = self.broadphase.update()
        seconds = time.perf_counter() - started
        # W1's ids fit in 32 bits, and dbvt-server sends them so (narrow_ids) to the SDK.
        return begun.astype("<u4").tobytes() + ended.astype("<u4").tobytes() + WORK_SECONDS.pack(seconds)

    def query(self, boxes: bytes) -> bytes:
        """The hits of each float32 box, as QueryAabb answers them: int64 offsets, then 32-bit ids;
        then the seconds the dbvt call took (WORK_SECONDS), as the answer's world_seconds says."""
        rows = np.frombuffer(boxes, "<f4").reshape(-1, 6)
        started = time.perf_counter()
        offsets, hits = self.broadphase.query_aabb(rows)
        seconds = time.perf_counter() - started
        return offsets.astype("<i8").tobytes() + hits.astype("<u4").tobytes() + WORK_SECONDS.pack(seconds)


async def started_bare_server(workers: int, thread_name_prefix: str = "") -> tuple[grpc.aio.Server, int]:
    """The bare server, started on this event loop: Echo (the busy wait), Steps (each stream its own
    world, made by its first message), and Create, Step and Query (worlds by a one-byte index) for
    the two busy worlds and the paired query calls; and its port on 127.0.0.1."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix)
    worlds: dict[int, _Stepper] = {}

    async def echo(requests, context):
        loop = asyncio.get_running_loop()
        async for request in requests:
            seconds, answer_bytes = HEADER.unpack_from(request)
            yield await loop.run_in_executor(pool, _work, seconds, answer_bytes)

    async def steps(requests, context):
        loop = asyncio.get_running_loop()
        stepper = _Stepper()
        async for request in requests:
            work = stepper.step if stepper.broadphase is not None else stepper.create
            yield await loop.run_in_executor(pool, work, request)

    async def create(request, context):
        worlds[request[0]] = _Stepper()
        return await asyncio.get_running_loop().run_in_executor(pool, worlds[request[0]].create, request[1:])

    def on_world(method: str):
        """A handler running `method` of the request's world (its first byte) on the rest of it."""
        async def handle(request, context):
            return await asyncio.get_running_loop().run_in_executor(pool, getattr(worlds[request[0]], method),
                                                                    request[1:])
        return handle

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1)])
    handlers = {"Echo": grpc.stream_stream_rpc_method_handler(echo),
                "Steps": grpc.stream_stream_rpc_method_handler(steps),
                "Create": grpc.unary_unary_rpc_method_handler(create),
                "Step": grpc.unary_unary_rpc_method_handler(on_world("step")),
                "Query": grpc.unary_unary_rpc_method_handler(on_world("query"))}
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("dbvt_bench.Floor", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def _serve(workers: int) -> None:
    """Serve until killed, the port printed first."""
    server, port = await started_bare_server(workers)
    print(port, flush=True)
    await server.wait_for_termination()


@contextlib.contextmanager
def bare_server(workers: int = 1):
    """A bare server in a child process, its pool `workers` threads: its target and process id."""
    process = subprocess.Popen([sys.executable, "-m", "dbvt_server.bench.floor", "--serve", str(workers)],
                               stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    try:
        yield f"127.0.0.1:{int(process.stdout.readline())}", process.pid
    finally:
        process.kill()
        process.wait()


@contextlib.contextmanager
def _bare_channel():
    """A channel to a bare server of one pool thread, as dbvt-server's one world runs on one at a time."""
    with bare_server() as (target, _), \
            grpc.insecure_channel(target, options=[("grpc.max_send_message_length", -1)]) as channel:
        yield channel


def _round_trips(channel, method: str, messages) -> list[float]:
    """Seconds from sending each message to its answer, one message at a time on one stream."""
    requests: queue.SimpleQueue = queue.SimpleQueue()
    answers = channel.stream_stream(method)(iter(requests.get, None))
    seconds = []
    for message in messages:
        started = time.perf_counter()
        requests.put(message)
        next(answers)
        seconds.append(time.perf_counter() - started)
    requests.put(None)
    list(answers)
    return seconds


@contextlib.contextmanager
def query_asker(boxes: np.ndarray, move_ids: np.ndarray, move_boxes: np.ndarray):
    """`ask(queries)`: the raw answer (int64 offsets, then 32-bit ids) of float32 box queries, made
    beforehand as bytes, in one unary call to a bare server's world taken through the same W1 steps as
    dbvt-server's and the in-process one's (created, then moved and updated step by step), so that all
    three query the same tree."""
    with _bare_channel() as channel:
        channel.unary_unary(FLOOR + "Create")(b"\0" + boxes.astype("<f4").tobytes())
        step = channel.unary_unary(FLOOR + "Step")
        for ids, rows in zip(move_ids, move_boxes):
            step(b"\0" + step_message(ids, rows))
        query = channel.unary_unary(FLOOR + "Query")
        yield lambda queries: query(b"\0" + queries)


def query_answer(answer: bytes, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`query_asker`'s answer as the SDK returns it: int64 offsets and uint64 ids."""
    hits_at = 8 * (count + 1)
    hits = np.frombuffer(answer, "<u4", (len(answer) - hits_at - WORK_SECONDS.size) // 4, hits_at)
    return np.frombuffer(answer, "<i8", count + 1), hits.astype(np.uint64)


def answer_seconds(answer: bytes) -> float:
    """The seconds the bare server's dbvt calls took, which end its answer (a step's or a query's)."""
    return WORK_SECONDS.unpack_from(answer, len(answer) - WORK_SECONDS.size)[0]


def floor(work_seconds: float, request_bytes: int, answer_bytes: int, rounds: int = ROUNDS) -> float:
    """Median seconds a round trip takes beyond `work_seconds` of work on the server's thread."""
    request = HEADER.pack(work_seconds, answer_bytes).ljust(request_bytes, b"\0")
    with _bare_channel() as channel:
        seconds = _round_trips(channel, METHOD, [request] * (WARM_UP + rounds))
    return statistics.median(seconds[WARM_UP:]) - work_seconds


def paired_steps(passes: Iterable[Callable[[int], object]], boxes: np.ndarray, move_ids: np.ndarray,
                 move_boxes: np.ndarray) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Each W1 step, tick by tick, through each pass's `apply_step(step)` (a dbvt-server stream on a
    world of its own, answering a BatchResult) and through the bare server making the same dbvt calls
    on a world of its own, made for the pass: the two sent one after the other, alternately first. For
    each side, each step's seconds and those its dbvt calls took (world_seconds; the bare server's own).

    Pairing step by step cancels the machine's drift, which moves a run's median step by more than the
    difference. It does not cancel the worlds themselves: one world's dbvt calls run faster than
    another's made the same way (their memory lies elsewhere), and a step's calls vary by
    milliseconds. In an A/A pair, two dbvt-servers stepped this way, the median difference of a pair
    of worlds' 28 W1 steps ranged from -0.96 to +0.69 ms over 18 pairs of worlds, and that of the
    dbvt calls alone from -0.76 to +0.58 ms. So each side's time for its dbvt calls, which each side
    measures around them, is what a caller subtracts to compare the rest; and each pass pairs two new
    worlds, its first step left out. Each world's thread rests while the other steps, so both steps
    start colder than tick by tick alone. The bare server's messages are made beforehand, as the
    busy-waiting floor's are, so the difference includes the SDK's encoding of each step."""
    def timed(send, work) -> tuple[float, float]:
        started = time.perf_counter()
        answer = send()
        return time.perf_counter() - started, work(answer)

    messages = [step_message(ids, rows) for ids, rows in zip(move_ids, move_boxes)]
    served: list[tuple[float, float]] = []
    bare: list[tuple[float, float]] = []
    with _bare_channel() as channel:
        for apply_step in passes:
            requests: queue.SimpleQueue = queue.SimpleQueue()
            answers = channel.stream_stream(STEPS_METHOD)(iter(requests.get, None))

            def bare_step(message: bytes) -> bytes:
                requests.put(message)
                return next(answers)

            # The stream's world: made by its first message.
            bare_step(boxes.astype("<f4").tobytes())
            # Each side's first step on its new world and stream is left out: on the server it took
            # 0.6 to 6.7 ms longer than the bare server's (ten pairs of worlds of ten), which a running
            # game's ticks do not pay.
            apply_step(0)
            bare_step(messages[0])
            for step, message in enumerate(messages[1:], 1):
                if len(served) % 2:
                    bare.append(timed(lambda: bare_step(message), answer_seconds))
                    served.append(timed(lambda: apply_step(step), _world_seconds))
                else:
                    served.append(timed(lambda: apply_step(step), _world_seconds))
                    bare.append(timed(lambda: bare_step(message), answer_seconds))
            requests.put(None)
            list(answers)
    return served, bare


def _world_seconds(result) -> float:
    return result.world_seconds


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    asyncio.run(_serve(int(sys.argv[2]) if len(sys.argv) > 2 else 1))
