"""dbvt-bench's two-busy-worlds figure: does a second busy world add throughput, or share the first's?

Each world is kept busy by its own thread of the benchmark, which sends requests encoded beforehand
and keeps the answers as raw bytes (decoding only the batch statuses, after the round). The client
side is thus light, so on a small machine the cores go to the server; the cores the benchmark
process used are reported beside it. Two kinds of work: calls of 10k box queries, and W1 steps
streamed to pair-tracking worlds with a few in flight, over and over. The same work runs on two
in-process `dbvt.Broadphase` in two threads, for the scaling of the core alone; and through a bare
grpc.aio server making the same dbvt calls on as many pool threads as dbvt-server's default
(dbvt_server.bench.floor), its rounds interleaved with dbvt-server's, driven by the same kind of
client: how far any Python gRPC server of this design scales on the machine, whose cores its client
shares. dbvt-server's scaling over the bare server's is what the service itself costs a second world.

Throughput is counted while every world is busy. All worlds start at once, run for a warm-up, and
keep running until a window of --window seconds has closed; only the work done inside the window
counts, interpolated linearly between one answer and the next. A round that ran a fixed amount of
work per world instead would end with one world alone while the other finishes its share, and that
tail, up to a third of a round on this kind of machine, is not two busy worlds.

The machine's speed drifts from minute to minute, so the rounds alternate one world and two,
--repeats times, and the ratio is the median of the ratios of each two-world round to the one-world
round just before it; the rates shown are the rounds' medians. Where Linux tells
(/proc/.../schedstat), the cores the worlds' threads ran on in the window are shown beside how many
of them were runnable on average: running, or ready and queued for a core. Threads that wait for a
lock or the GIL sleep instead, so a second world that adds about one runnable thread is not held
back by us, whatever share of the cores the machine gives it.
"""
from __future__ import annotations

import bisect
import dataclasses
import itertools
import os
import pathlib
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import grpc

from dbvt_client.transport import CHANNEL_OPTIONS
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server.bench import floor as bench_floor
from dbvt_server.config import Config

WORLDS = ("parallel-a", "parallel-b")
SERVICE = "/dbvt.v1.BroadphaseService/"
# Seconds every world runs before the window opens (at least until each has answered once): the
# streams are open and the first, slower steps of a round are behind them.
WARM_UP = 0.15
# Seconds of each round that are counted, by default.
WINDOW = 0.5
# Streamed steps sent before the oldest is answered, as the server's own read-ahead.
STEPS_IN_FLIGHT = 4

# A job keeps one world busy until `stop` is set, appending the time each operation completed.
Job = Callable[[threading.Event, list], None]


def schedstat(path: pathlib.Path) -> tuple[float, float] | None:
    """Seconds a thread has run on a core, and seconds it stood queued for one; None where unknown."""
    try:
        on_cpu, queued = path.read_text().split()[:2]
        return int(on_cpu) / 1e9, int(queued) / 1e9
    except (OSError, ValueError):
        return None


class ThreadMeter:
    """The summed schedstat of a set of threads: every thread of a process, or the given ones."""

    def __init__(self, pid: int | None, thread_ids: Iterable[int] | None = None):
        self.tasks = pathlib.Path(f"/proc/{pid}/task") if pid else None
        self.thread_ids = None if thread_ids is None else {str(tid) for tid in thread_ids}

    def read(self) -> tuple[float, float] | None:
        if self.tasks is None or not self.tasks.is_dir():
            return None
        # A thread that ends meanwhile drops out; the server's threads live as long as it does.
        threads = [found for task in self.tasks.iterdir()
                   if (self.thread_ids is None or task.name in self.thread_ids)
                   and (found := schedstat(task / "schedstat"))]
        if not threads:
            return None
        return sum(t[0] for t in threads), sum(t[1] for t in threads)


@dataclass
class Round:
    rate: float                     # operations per second while every world was busy
    used: float | None = None       # cores the worlds' threads ran on (CPU seconds per second)
    runnable: float | None = None   # how many of them were running or queued for a core, on average
    client: float | None = None     # cores this process used while it drove a server


def completed_by(stamps: list[float], moment: float) -> float:
    """Operations a world had completed at `moment`, counting the one under way by its elapsed share."""
    done = bisect.bisect_right(stamps, moment)
    if done == 0 or done == len(stamps):
        raise RuntimeError("a world was not busy for the whole window: it had no answer before the window "
                           "opened, or none after it closed")
    previous, following = stamps[done - 1], stamps[done]
    return done + (moment - previous) / (following - previous)


def timed(jobs: list[Job], window: float, server: ThreadMeter | None) -> Round:
    """Run `jobs` at once, one thread each, and count their work within a window after the warm-up.
    The worlds' threads are the server's if a server is given, else the jobs' own (in-process)."""
    stop = threading.Event()
    stamps: list[list[float]] = [[] for _ in jobs]
    failures: list[BaseException] = []

    def run(job: Job, own: list[float]) -> None:
        try:
            job(stop, own)
        except BaseException as exc:
            failures.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=pair) for pair in zip(jobs, stamps)]
    for thread in threads:
        thread.start()
    meter = server or ThreadMeter(os.getpid(), [thread.native_id for thread in threads])
    time.sleep(WARM_UP)
    # On a loaded machine a first answer can take longer than the warm-up: the window waits for it.
    while not stop.is_set() and not all(stamps):
        time.sleep(0.01)
    before, client_before, opened = meter.read(), time.process_time(), time.perf_counter()
    stop.wait(window)
    after, client_after, closed = meter.read(), time.process_time(), time.perf_counter()
    stop.set()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    seconds = closed - opened
    made = Round(sum(completed_by(own, closed) - completed_by(own, opened) for own in stamps) / seconds)
    if server is not None:
        made.client = (client_after - client_before) / seconds
    if before and after:
        used = after[0] - before[0]
        made.used, made.runnable = used / seconds, (used + after[1] - before[1]) / seconds
    return made


def _median(values: list) -> float | None:
    return None if None in values else statistics.median(values)


def typical(rounds: list[Round]) -> Round:
    """Each figure's median over the rounds."""
    return Round(*(_median([getattr(r, field.name) for r in rounds]) for field in dataclasses.fields(Round)))


@dataclass
class Scaling:
    ones: list[Round]
    twos: list[Round]

    @property
    def round_ratios(self) -> list[float]:
        """Each two-world round's rate against the one-world round's just before it, so that the
        machine's changes of speed from minute to minute cancel."""
        return [two.rate / one.rate for one, two in zip(self.ones, self.twos)]

    @property
    def ratio(self) -> float:
        """The median of the rounds' own ratios."""
        return statistics.median(self.round_ratios)


def scaling(job_for: Callable[[int], Job], window: float, server: ThreadMeter | None, repeats: int) -> Scaling:
    """`job_for(i)` keeps world i busy until told to stop."""
    return scalings({"": (job_for, server)}, window, repeats)[""]


def scalings(sides: dict[str, tuple[Callable[[int], Job], ThreadMeter | None]], window: float,
             repeats: int) -> dict[str, Scaling]:
    """Each side's scaling, its rounds interleaved with the other sides' repeat by repeat, so that the
    machine's drift reaches every side alike and their rounds pair."""
    made = {name: Scaling([], []) for name in sides}
    for _ in range(repeats):
        for name, (job_for, meter) in sides.items():
            made[name].ones.append(timed([job_for(0)], window, meter))
            made[name].twos.append(timed([job_for(0), job_for(1)], window, meter))
    return made


def _calls_job(call, request: bytes) -> Job:
    """The same unary call, over and over."""

    def job(stop: threading.Event, stamps: list) -> None:
        while not stop.is_set():
            call(request)
            stamps.append(time.perf_counter())

    return job


def _query_job(channel: grpc.Channel, world: str, queries) -> Job:
    # Allowing hits in 32 bits, as the SDK's requests do.
    return _calls_job(channel.unary_unary(SERVICE + "QueryAabb"),
                      pb.QueryAabbRequest(world=world, count=len(queries), boxes=queries.tobytes(),
                                          narrow_ids=True).SerializeToString())


def _streaming_job(call, messages, opening: bytes | None = None, check=None) -> Job:
    """The messages of `messages()` (endless) sent on one stream, STEPS_IN_FLIGHT of them unanswered at
    a time, until told to stop; `opening` first, answered before any step counts; `check(answers)`
    once the stream has ended."""

    def job(stop: threading.Event, stamps: list) -> None:
        room = threading.Semaphore(STEPS_IN_FLIGHT)

        def requests():
            if opening is not None:
                yield opening
            for message in messages():
                room.acquire()
                if stop.is_set():
                    return
                yield message

        answers = call(requests())
        if opening is not None:
            next(answers)
        kept = []
        for answer in answers:
            stamps.append(time.perf_counter())
            kept.append(answer)
            room.release()
        if check is not None:
            check(kept)

    return job


def _stream_job(channel: grpc.Channel, world: str, work) -> Job:
    steps = [(work.move_ids[step].astype("<u8").tobytes(), work.move_boxes[step].astype("<f4").tobytes())
             for step in range(work.steps)]

    def messages():
        for sequence, (ids, boxes) in enumerate(itertools.cycle(steps), 1):
            yield pb.StreamBatchesRequest(world=world, sequence=sequence, narrow_ids=True,
                                          batch=pb.Batch(move_ids=ids, move_boxes=boxes)).SerializeToString()

    def all_applied(answers: list) -> None:
        refused = [r for r in map(pb.StreamBatchesResponse.FromString, answers) if r.status_code]
        if refused:
            raise RuntimeError(f"streamed steps were not all applied: {refused[:1]}")

    return _streaming_job(channel.stream_stream(SERVICE + "StreamBatches"), messages, check=all_applied)


def _bare_query_job(channel: grpc.Channel, world: int, queries) -> Job:
    return _calls_job(channel.unary_unary(bench_floor.FLOOR + "Query"), bytes([world]) + queries.astype("<f4").tobytes())


def _bare_stream_job(channel: grpc.Channel, work) -> Job:
    """Each world of the bare server is its stream's own, made by the stream's first message."""
    steps = [bench_floor.step_message(work.move_ids[step], work.move_boxes[step]) for step in range(work.steps)]
    return _streaming_job(channel.stream_stream(bench_floor.FLOOR + "Steps"), lambda: itertools.cycle(steps),
                          opening=work.boxes.astype("<f4").tobytes())


def over_the_wire(client, target: str, work, server_pid: int | None, window: float,
                  repeats: int) -> tuple[dict[str, Scaling], dict[str, Scaling]]:
    """Both kinds of work on two worlds of the server at `target`, each thread on its own channel; and,
    interleaved round by round, on two worlds of a bare grpc.aio server making the same dbvt calls with
    as many pool threads as dbvt-server's default (dbvt_server.bench.floor): the server's scalings,
    then the bare server's."""
    for name in WORLDS:
        if name in client.list_worlds():
            client.delete_world(name)
        client.create_world(name).apply(create=(work.ids, work.boxes))
    with bench_floor.bare_server(Config.workers) as (bare_target, bare_pid):
        channels = [grpc.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in WORLDS]
        bare_channels = [grpc.insecure_channel(bare_target, options=CHANNEL_OPTIONS) for _ in WORLDS]
        server, bare = ThreadMeter(server_pid), ThreadMeter(bare_pid)
        try:
            create = bare_channels[0].unary_unary(bench_floor.FLOOR + "Create")
            for number in range(len(WORLDS)):
                create(bytes([number]) + work.boxes.astype("<f4").tobytes())
            query = scalings({"server": (lambda i: _query_job(channels[i], WORLDS[i], work.q_aabb), server),
                              "bare": (lambda i: _bare_query_job(bare_channels[i], i, work.q_aabb), bare)},
                             window, repeats)
            steps = scalings({"server": (lambda i: _stream_job(channels[i], WORLDS[i], work), server),
                              "bare": (lambda i: _bare_stream_job(bare_channels[i], work), bare)}, window, repeats)
        finally:
            for channel in channels + bare_channels:
                channel.close()
            for name in WORLDS:
                client.delete_world(name)
    return ({"query": query["server"], "steps": steps["server"]},
            {"query": query["bare"], "steps": steps["bare"]})


def in_process(work, window: float, repeats: int) -> dict[str, Scaling]:
    """The same work on two in-process dbvt.Broadphase, one thread each."""
    from dbvt import Broadphase

    worlds = []
    for _ in WORLDS:
        broadphase = Broadphase(dims=3, margin=0.05)
        broadphase.create(work.ids, work.boxes)
        broadphase.update()
        worlds.append(broadphase)

    def query_job(i: int) -> Job:
        def job(stop: threading.Event, stamps: list) -> None:
            while not stop.is_set():
                worlds[i].query_aabb(work.q_aabb)
                stamps.append(time.perf_counter())
        return job

    def step_job(i: int) -> Job:
        def job(stop: threading.Event, stamps: list) -> None:
            for step in itertools.cycle(range(work.steps)):
                if stop.is_set():
                    return
                worlds[i].move(work.move_ids[step], work.move_boxes[step])
                worlds[i].update()
                stamps.append(time.perf_counter())
        return job

    return {"query": scaling(query_job, window, None, repeats),
            "steps": scaling(step_job, window, None, repeats)}


def _change(one: float | None, two: float | None) -> str:
    return "n/a" if one is None or two is None else f"{one:.2f} -> {two:.2f}"


def report(wire: dict[str, Scaling], bare: dict[str, Scaling], local: dict[str, Scaling], window: float) -> list[str]:
    lines = [f"two busy worlds: work done in a {window:.2f} s window while every world was busy; medians of the",
             "rounds, and the ratio the median of the rounds' own ratios.",
             "Of the worlds' threads (the servers' processes; in-process, the benchmark's) in that window: cores",
             "used, and how many were runnable (running or queued for a core); client: cores this process used",
             f"{'':34}{'1 world':>10}{'2 worlds':>10}{'ratio':>8}{'cores used':>14}{'runnable':>14}{'client':>14}"]
    for key, label in (("query", "10k-query calls/s"), ("steps", "W1 steps/s, streamed")):
        for where, figures in (("server", wire[key]), ("bare gRPC", bare[key]), ("in-process", local[key])):
            one, two = typical(figures.ones), typical(figures.twos)
            lines.append(f"{f'{label}, {where}':34}{one.rate:10.2f}{two.rate:10.2f}{figures.ratio:8.2f}"
                         f"{_change(one.used, two.used):>14}{_change(one.runnable, two.runnable):>14}"
                         f"{_change(one.client, two.client):>14}"
                         f"{'' if where == 'in-process' else f'  {figures.ratio / local[key].ratio:.2f}x in-process'}")
    return lines
