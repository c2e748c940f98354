"""dbvt-bench's two-busy-worlds figure: does a second busy world add throughput, or share the first's?

Each world is kept busy by its own thread of the benchmark, which sends requests encoded before the
clock starts and keeps the answers as raw bytes (decoding only the batch statuses, after the clock
stops). The client side is thus light, so on a small machine the cores go to the server; the cores
the benchmark process used are reported beside it. Two kinds of work: calls of 10k box queries, and
W1 steps streamed pipelined to pair-tracking worlds. The same work runs on two in-process
`dbvt.Broadphase` in two threads, for the scaling of the core alone.

Other processes on the machine take cores too, so each figure is the best of --repeats rounds (one
world, then two, alternately), and where Linux tells (/proc/.../schedstat) the cores the worlds'
threads ran on are shown beside how many of them were runnable on average: running, or ready and
queued for a core. Threads that wait for a lock or the GIL sleep instead, so a second world that adds
about one runnable thread is not held back by us, whatever share of the cores the machine gives it.
"""
from __future__ import annotations

import pathlib
import threading
import time
from dataclasses import dataclass
from typing import Callable

import grpc

from dbvt_client.transport import CHANNEL_OPTIONS
from dbvt_proto.v1 import broadphase_pb2 as pb

WORLDS = ("parallel-a", "parallel-b")
QUERY_CALLS = 6
SERVICE = "/dbvt.v1.BroadphaseService/"
THREAD_SELF = pathlib.Path("/proc/thread-self/schedstat")


def schedstat(path: pathlib.Path) -> tuple[float, float] | None:
    """Seconds a thread has run on a core, and seconds it stood queued for one; None where unknown."""
    try:
        on_cpu, queued = path.read_text().split()[:2]
        return int(on_cpu) / 1e9, int(queued) / 1e9
    except (OSError, ValueError):
        return None


class ServerMeter:
    """The summed schedstat of every thread of another process."""

    def __init__(self, pid: int | None):
        self.tasks = pathlib.Path(f"/proc/{pid}/task") if pid else None

    def read(self) -> tuple[float, float] | None:
        if self.tasks is None or not self.tasks.is_dir():
            return None
        # A thread that ends meanwhile drops out; the server's threads live as long as it does.
        threads = [found for task in self.tasks.iterdir() if (found := schedstat(task / "schedstat"))]
        if not threads:
            return None
        return sum(t[0] for t in threads), sum(t[1] for t in threads)


@dataclass
class Round:
    rate: float                   # operations per second
    used: float | None = None       # cores the worlds' threads ran on (CPU seconds per second)
    runnable: float | None = None   # how many of them were running or queued for a core, on average
    client: float | None = None   # cores this process used while it drove a server


def _measured(job: Callable[[], None], totals: list) -> Callable[[], None]:
    def run() -> None:
        before = schedstat(THREAD_SELF)
        job()
        after = schedstat(THREAD_SELF)
        if before and after:
            totals.append((after[0] - before[0], after[1] - before[1]))

    return run


def timed(jobs: list[Callable[[], None]], operations: int, server: ServerMeter | None) -> Round:
    """Run `jobs` at once, one thread each, `operations` in all. The worlds' threads are the server's
    if a server is given, else the jobs' own (in-process)."""
    own: list[tuple[float, float]] = []
    threads = [threading.Thread(target=_measured(job, own)) for job in jobs]
    server_before, client_before = server and server.read(), time.process_time()
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    made = Round(operations / seconds)
    if server is None:
        totals = own if len(own) == len(jobs) else None
    else:
        server_after = server.read()
        totals = [(a - b) for a, b in zip(server_after, server_before)] if server_before and server_after else None
        totals = [tuple(totals)] if totals else None
        made.client = (time.process_time() - client_before) / seconds
    if totals:
        used = sum(t[0] for t in totals)
        made.used, made.runnable = used / seconds, (used + sum(t[1] for t in totals)) / seconds
    return made


def best(rounds: list[Round]) -> Round:
    return max(rounds, key=lambda r: r.rate)


@dataclass
class Scaling:
    one: Round
    two: Round

    @property
    def ratio(self) -> float:
        return self.two.rate / self.one.rate


def scaling(job_for: Callable[[int], Callable[[], None]], operations: int, server: ServerMeter | None,
            repeats: int) -> Scaling:
    """`job_for(i)` keeps world i busy for `operations` operations."""
    ones, twos = [], []
    for _ in range(repeats):
        ones.append(timed([job_for(0)], operations, server))
        twos.append(timed([job_for(0), job_for(1)], 2 * operations, server))
    return Scaling(best(ones), best(twos))


def _query_job(channel: grpc.Channel, world: str, queries) -> Callable[[], None]:
    call = channel.unary_unary(SERVICE + "QueryAabb")
    request = pb.QueryAabbRequest(world=world, count=len(queries), boxes=queries.tobytes()).SerializeToString()

    def job() -> None:
        for _ in range(QUERY_CALLS):
            call(request)

    return job


def _stream_job(channel: grpc.Channel, world: str, work) -> Callable[[], None]:
    call = channel.stream_stream(SERVICE + "StreamBatches")
    requests = [pb.StreamBatchesRequest(world=world, sequence=step, batch=pb.Batch(
        move_ids=work.move_ids[step].astype("<u8").tobytes(),
        move_boxes=work.move_boxes[step].astype("<f4").tobytes())).SerializeToString() for step in range(work.steps)]

    def job() -> None:
        answers = list(call(iter(requests)))
        refused = [r for r in map(pb.StreamBatchesResponse.FromString, answers) if r.status_code]
        if len(answers) != len(requests) or refused:
            raise RuntimeError(f"streamed steps were not all applied: {refused[:1]}")

    return job


def over_the_wire(client, target: str, work, server_pid: int | None, repeats: int) -> dict[str, Scaling]:
    """Both kinds of work on two worlds of the server at `target`, each thread on its own channel."""
    for name in WORLDS:
        if name in client.list_worlds():
            client.delete_world(name)
        client.create_world(name).apply(create=(work.ids, work.boxes))
    channels = [grpc.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in WORLDS]
    server = ServerMeter(server_pid)
    try:
        return {
            "query": scaling(lambda i: _query_job(channels[i], WORLDS[i], work.queries), QUERY_CALLS, server, repeats),
            "steps": scaling(lambda i: _stream_job(channels[i], WORLDS[i], work), work.steps, server, repeats),
        }
    finally:
        for channel in channels:
            channel.close()
        for name in WORLDS:
            client.delete_world(name)


def in_process(work, repeats: int) -> dict[str, Scaling]:
    """The same work on two in-process dbvt.Broadphase, one thread each."""
    from dbvt import Broadphase

    worlds = []
    for _ in WORLDS:
        broadphase = Broadphase(dims=3, margin=0.05)
        broadphase.create(work.ids, work.boxes)
        broadphase.update()
        worlds.append(broadphase)

    def query_job(i: int) -> Callable[[], None]:
        def job() -> None:
            for _ in range(QUERY_CALLS):
                worlds[i].query_aabb(work.queries)
        return job

    def step_job(i: int) -> Callable[[], None]:
        def job() -> None:
            for step in range(work.steps):
                worlds[i].move(work.move_ids[step], work.move_boxes[step])
                worlds[i].update()
        return job

    return {"query": scaling(query_job, QUERY_CALLS, None, repeats),
            "steps": scaling(step_job, work.steps, None, repeats)}


def _change(one: float | None, two: float | None) -> str:
    return "n/a" if one is None or two is None else f"{one:.2f} -> {two:.2f}"


def report(wire: dict[str, Scaling], local: dict[str, Scaling]) -> list[str]:
    lines = ["two busy worlds, best of the rounds. Of the worlds' threads (the server's; in-process, the benchmark's):",
             "cores used, and how many were runnable (running or queued for a core); client: cores this process used",
             f"{'':34}{'1 world':>10}{'2 worlds':>10}{'ratio':>8}{'cores used':>14}{'runnable':>14}{'client':>14}"]
    for key, label in (("query", "10k-query calls/s"), ("steps", "W1 steps/s, streamed")):
        for where, figures in (("server", wire[key]), ("in-process", local[key])):
            one, two = figures.one, figures.two
            lines.append(f"{f'{label}, {where}':34}{one.rate:10.2f}{two.rate:10.2f}{figures.ratio:8.2f}"
                         f"{_change(one.used, two.used):>14}{_change(one.runnable, two.runnable):>14}"
                         f"{_change(one.client, two.client):>14}"
                         f"{'  target >= 1.6x' if where == 'server' else ''}")
    return lines
