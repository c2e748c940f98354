"""dbvt-bench's two-busy-worlds figure: does a second busy world add throughput, or share the first's?

Each world is kept busy by its own thread of the benchmark, which sends requests encoded before the
clock starts and keeps the answers as raw bytes (decoding only the batch statuses, after the clock
stops). The client side is thus light, so on a small machine the cores go to the server; the share of
the benchmark process is reported beside it. Two kinds of work: calls of 10k box queries, and W1
steps streamed pipelined to pair-tracking worlds. The same work runs on two in-process
`dbvt.Broadphase` in two threads, for the scaling of the core alone. Other processes on the machine
take cores too, so each figure is the best of --repeats rounds (one world, then two, alternately),
and with the server's process id the cores it kept busy and the time its threads spent waiting for a
core are shown (from Linux's /proc/PID/task/*/schedstat).
"""
from __future__ import annotations

import os
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


class CpuMeter:
    """CPU seconds of a process, and the seconds its threads spent queued for a core.

    Another process is read from Linux's /proc/PID/task/*/schedstat (the queueing included; elsewhere
    nothing is known). This process is read with time.process_time(), which keeps counting the threads
    that have ended; its queueing is not known.
    """

    def __init__(self, pid: int | None):
        self.own = pid == os.getpid()
        self.tasks = pathlib.Path(f"/proc/{pid}/task") if pid and not self.own else None
        if self.tasks is not None and not self.tasks.is_dir():
            self.tasks = None

    def read(self) -> tuple[float, float | None] | None:
        if self.own:
            return time.process_time(), None
        if self.tasks is None:
            return None
        running = waiting = 0
        for task in self.tasks.iterdir():
            try:
                on_cpu, queued = (task / "schedstat").read_text().split()[:2]
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue  # a thread that ended meanwhile
            running, waiting = running + int(on_cpu), waiting + int(queued)
        return running / 1e9, waiting / 1e9


@dataclass
class Round:
    rate: float                         # operations per second
    cores: float | None = None          # the measured process's CPU seconds per second
    waiting: float | None = None        # its threads' seconds waiting for a core, per second
    client_cores: float | None = None   # this process's CPU seconds per second, when it is not the measured one


def timed(jobs: list[Callable[[], None]], operations: int, meter: CpuMeter, client: CpuMeter | None = None) -> Round:
    """Run `jobs` at once, one thread each; `operations` in all."""
    threads = [threading.Thread(target=job) for job in jobs]
    before, client_before, started = meter.read(), client and client.read(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    after, client_after = meter.read(), client and client.read()
    made = Round(operations / seconds)
    if before is not None and after is not None:
        made.cores = (after[0] - before[0]) / seconds
        if after[1] is not None:
            made.waiting = (after[1] - before[1]) / seconds
    if client_before and client_after:
        made.client_cores = (client_after[0] - client_before[0]) / seconds
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


def scaling(job_for: Callable[[int], Callable[[], None]], operations: int, meter: CpuMeter, repeats: int,
            client: CpuMeter | None = None) -> Scaling:
    """`job_for(i)` keeps world i busy for `operations` operations."""
    ones, twos = [], []
    for _ in range(repeats):
        ones.append(timed([job_for(0)], operations, meter, client))
        twos.append(timed([job_for(0), job_for(1)], 2 * operations, meter, client))
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
    meter, client_meter = CpuMeter(server_pid), CpuMeter(os.getpid())
    try:
        return {
            "query": scaling(lambda i: _query_job(channels[i], WORLDS[i], work.queries), QUERY_CALLS, meter,
                             repeats, client_meter),
            "steps": scaling(lambda i: _stream_job(channels[i], WORLDS[i], work), work.steps, meter, repeats,
                             client_meter),
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

    meter = CpuMeter(os.getpid())
    return {"query": scaling(query_job, QUERY_CALLS, meter, repeats),
            "steps": scaling(step_job, work.steps, meter, repeats)}


def _change(one: float | None, two: float | None) -> str:
    return "n/a" if one is None or two is None else f"{one:.2f} -> {two:.2f}"


def report(wire: dict[str, Scaling], local: dict[str, Scaling]) -> list[str]:
    lines = ["two busy worlds, best of the rounds. cores: CPU seconds per second of the server (in-process: of "
             "this process); waiting: seconds per second its threads stood queued for a core; client: this "
             "process's CPU seconds per second while it drove the server",
             f"{'':34}{'1 world':>10}{'2 worlds':>10}{'ratio':>8}{'cores':>14}{'waiting':>14}{'client':>14}"]
    for key, label in (("query", "10k-query calls/s"), ("steps", "W1 steps/s, streamed")):
        for where, figures in (("server", wire[key]), ("in-process", local[key])):
            one, two = figures.one, figures.two
            lines.append(f"{f'{label}, {where}':34}{one.rate:10.2f}{two.rate:10.2f}{figures.ratio:8.2f}"
                         f"{_change(one.cores, two.cores):>14}{_change(one.waiting, two.waiting):>14}"
                         f"{_change(one.client_cores, two.client_cores):>14}"
                         f"{'  target >= 1.6x' if where == 'server' else ''}")
    return lines
