"""`dbvt-bench wire`: W1 streamed through a dbvt-server, against the in-process dbvt.Broadphase on the same data.

DIRECTORY is a W1 directory (see dbvt_server.bench.workload; its expected.json, if present, is
checked); without one, W1 data of --n proxies and --steps steps and its exact answers are made first,
in a temporary directory. Without --target a server is started as a child process. Figures are
medians of --repeats runs; the server and this client are separate processes talking over loopback.
The steps are streamed twice, each time to a new world: tick by tick (send a step, wait for its
pair changes) and with two ticks in flight (send step t+1, then read step t's answer), which the
stream is built for; the in-process figures beside them are the median and the mean step. Each
answer says how long the server's broadphase took over its batch (world_seconds): a tick's time
beyond that is the service's and the wire's. Beside the tick-by-tick figure stand two controls:
bare gRPC with the same message sizes and work time (dbvt_server.bench.floor, measured after each
run, so that the time beyond it pairs with the run's),
the in-process step taken after its thread has slept as long as a world thread does between ticks,
and the same steps through a bare grpc.aio server whose thread makes the same dbvt calls, each
step paired with the same step through the server, on PAIRED_WORLDS new pairs of worlds, PAIRED_STEPS
steps each. Move-only ingest streams every
step's moves again, all pipelined, to a query-only world (track_pairs=False, so nothing comes back
but the tick) that has seen every step once before. The box queries and the ingest are timed in pairs, a call or pass through the
server and the same in process back to back (alternately first), and a run's ratio is the median of
its pairs' ratios: the two halves of a pair run within milliseconds of each other, so the machine's
drift, which moves these short figures by more than their difference, cancels. The box queries'
rounds hold a third call, through a bare grpc.aio server making the same dbvt call on the same tree,
the control the tick has in the bare server making the same calls. The SDK's query
stream is set against unary calls the same way (dbvt_server.bench.query_calls). The
two-busy-worlds figures are described in dbvt_server.bench.parallel. Last,
each wire target of issue 17 is shown as the issue states it, with its median and range over the
runs (the two busy worlds: over the rounds) and whether the median meets it.
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from dbvt_client import Client
from dbvt_server.bench import console, workload
from dbvt_server.bench import floor as bench_floor
from dbvt_server.bench import parallel as bench_parallel
from dbvt_server.bench import query_calls
from dbvt_server.bench.console import Progress
from dbvt_server.bench.workload import Workload

LISTENING = re.compile(r"listening on \S+:(\d+)")


def start_server(*flags: str) -> tuple[subprocess.Popen, str]:
    """A dbvt-server child process on a free port of 127.0.0.1, with `flags`, and its address."""
    # Started outside the working directory, which may be a source tree with an unbuilt `dbvt/`.
    process = subprocess.Popen([sys.executable, "-m", "dbvt_server", "--host", "127.0.0.1", "--port", "0", *flags],
                               stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    for line in process.stderr:
        found = LISTENING.search(line)
        if found:
            return process, f"127.0.0.1:{found.group(1)}"
    raise SystemExit("dbvt-server did not start")


def fresh_world(client: Client, name: str, track_pairs: bool = True):
    if name in client.list_worlds():
        client.delete_world(name)
    return client.create_world(name, dims=3, margin=0.05, track_pairs=track_pairs)


# A pass of the ingest takes about 0.1 s at W1's 100k: each run times this many pairs of passes.
INGEST_PAIRS = 5
# Calls dbvt_server.bench.paired takes the median of.
QUERY_CALLS = 5
# Rounds of the box-query calls per run, each of the three sides (paired_queries) first in two.
QUERY_TURNS = 6
# Pairs of new worlds, one on each server, whose steps are paired with each other's, and the steps of
# each pair: a pair's difference ranges over several ms (each side's step wakes to caches the other's
# left cold), and one pair of worlds runs its steps faster or slower than another by up to half a
# millisecond (dbvt_server.bench.floor.paired_steps): many pairs of worlds, each few steps.
PAIRED_WORLDS = 10
PAIRED_STEPS = 15
# Batches in flight when steps are streamed ahead: a game loop sends tick t+1 before reading tick t.
STEPS_AHEAD = 2
# Tick by tick, a world's thread sleeps for the round trip between steps; a sleeping thread wakes to
# colder caches (and, on a virtual machine, often to a core that ran something else meanwhile). The
# in-process steps are also timed after sleeping this long, to show what that alone costs.
REST_BEFORE_STEP = 0.002


def pipelined_ingest(stream, work: Workload) -> float:
    """Seconds to send every step's moves, pipelined, and collect the answers at the end."""
    started = time.perf_counter()
    pending = [stream.submit(move=(work.move_ids[step], work.move_boxes[step])) for step in range(work.steps)]
    for future in pending:
        future.result()
    return time.perf_counter() - started


def steps_ahead(stream, work: Workload) -> tuple[float, list[int]]:
    """Seconds to stream every step with STEPS_AHEAD batches in flight, and each step's change in the
    number of pairs."""
    in_flight: collections.deque = collections.deque()
    results = []
    started = time.perf_counter()
    for step in range(work.steps):
        in_flight.append(stream.submit(move=(work.move_ids[step], work.move_boxes[step])))
        if len(in_flight) == STEPS_AHEAD:
            results.append(in_flight.popleft().result())
    results.extend(future.result() for future in in_flight)
    seconds = time.perf_counter() - started
    return seconds, [len(r.begun) - len(r.ended) for r in results]


def median_call(call) -> float:
    seconds = []
    for _ in range(QUERY_CALLS):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def tick_by_tick(world, work: Workload, progress: Progress):
    """Each step of `work` streamed to `world` and waited for before the next, as a game's tick does:
    its seconds and its result, in turn."""
    with world.stream() as stream:
        for step in range(work.steps):
            started = time.perf_counter()
            result = stream.apply(move=(work.move_ids[step], work.move_boxes[step]))
            yield time.perf_counter() - started, result
            progress.advance()


def wire_run(client: Client, work: Workload, progress: Progress):
    """One pass over the workload through the server: creation, the steps tick by tick and then with
    STEPS_AHEAD in flight, each on a new world; the figures, and the second world, kept for the
    paired queries."""
    name = "dbvt-bench"
    world = fresh_world(client, name)
    started = time.perf_counter()
    pairs = len(world.apply(create=(work.ids, work.boxes)).begun)
    create_seconds = time.perf_counter() - started
    step_seconds, around_seconds, world_seconds, pair_counts, answer_bytes = [], [], [], [], []
    for seconds, result in tick_by_tick(world, work, progress):
        step_seconds.append(seconds)
        around_seconds.append(seconds - result.world_seconds)
        world_seconds.append(result.world_seconds)
        answer_bytes.append(result.begun.nbytes + result.ended.nbytes)
        pairs += len(result.begun) - len(result.ended)
        pair_counts.append(pairs)
    world = fresh_world(client, name)
    pairs = len(world.apply(create=(work.ids, work.boxes)).begun)
    with world.stream() as stream:
        ahead_seconds, changes = steps_ahead(stream, work)
    return dict(create=create_seconds, step=statistics.median(step_seconds), ahead=ahead_seconds / work.steps,
                step_around=statistics.median(around_seconds), step_world=statistics.median(world_seconds),
                answer_bytes=statistics.median(answer_bytes),
                pair_counts=[pair_counts, [int(c) for c in pairs + np.cumsum(changes)]]), world


def local_steps(work: Workload, progress: Progress | None = None, rest: float = 0.0):
    """A new in-process dbvt.Broadphase taken through every step: it, the seconds its creation took,
    and those of each step, each taken after the thread has slept `rest` seconds."""
    from dbvt import Broadphase

    broadphase = Broadphase(dims=3, margin=0.05)
    started = time.perf_counter()
    broadphase.create(work.ids, work.boxes)
    broadphase.update()
    create_seconds = time.perf_counter() - started
    step_seconds = []
    for step in range(work.steps):
        if rest:
            time.sleep(rest)
        started = time.perf_counter()
        broadphase.move(work.move_ids[step], work.move_boxes[step])
        broadphase.update()
        step_seconds.append(time.perf_counter() - started)
        if progress is not None:
            progress.advance()
    return broadphase, create_seconds, step_seconds


def local_run(work: Workload, progress: Progress):
    """The same pass on an in-process dbvt.Broadphase; the figures, and the broadphase, kept for the
    paired queries. It can only go tick by tick, so the figure beside the wire's steps in flight
    (total time / steps) is its mean step."""
    broadphase, create_seconds, step_seconds = local_steps(work, progress)
    rested_seconds = local_steps(work, rest=REST_BEFORE_STEP)[2]
    return dict(create=create_seconds, step=statistics.median(step_seconds), ahead=statistics.mean(step_seconds),
                rested_step=statistics.median(rested_seconds)), broadphase


def local_ingest(broadphase, work: Workload) -> float:
    """The calls a server makes for the ingest's batches, timed as pipelined_ingest() is."""
    started = time.perf_counter()
    for step in range(work.steps):
        broadphase.move(work.move_ids[step], work.move_boxes[step])
        broadphase.update()
    return time.perf_counter() - started


def in_turns(sides, rounds: int) -> list[list[float]]:
    """Each side's seconds, `rounds` times, the sides back to back, each round started by the next side
    in turn. Each side runs twice in a row and the second is timed: a call right after another side's
    finds the caches of its core holding the other process's data (a call through the server took
    16-17 ms after one of its own, 19-20 ms after an in-process one; the in-process call 12-13 ms and
    14-15 ms), and a round must not set one side's warm call against another's cold one."""
    seconds: list[list[float]] = [[] for _ in sides]
    for turn in range(rounds):
        for index in range(turn, turn + len(sides)):
            side = sides[index % len(sides)]
            side()
            started = time.perf_counter()
            side()
            seconds[index % len(sides)].append(time.perf_counter() - started)
    return seconds


def in_pairs(wire_side, local_side, pairs: int) -> tuple[list[float], list[float]]:
    """`in_turns` of two sides, alternately first."""
    wire, local = in_turns((wire_side, local_side), pairs)
    return wire, local


def paired_queries(world, broadphase, work: Workload, wire: dict, local: dict) -> None:
    """Every box query in one call three ways, on the same tree: through the server, in process, and
    through a bare grpc.aio server making the same dbvt call (dbvt_server.bench.floor.query_asker, its
    request made beforehand and its answer left as bytes). QUERY_TURNS rounds after one untimed call
    each (which rebuilds the wide view after the steps), whose answers must agree. The run's ratios are
    the medians of the rounds' ratios to the in-process call; beside them, the median of each round's
    call through the server less the bare server's, as it is and with each side's time in its dbvt
    call taken out (the answer's world_seconds; the bare server's own): what the service and the SDK
    add to the call, whichever world's memory lies better."""
    expected_offsets, expected_hits = broadphase.query_aabb(work.q_aabb)
    queries = work.q_aabb.astype("<f4").tobytes()
    served_calls: list[float] = []
    bare_calls: list[float] = []

    def served():
        served_calls.append(world.query_aabb(work.q_aabb).world_seconds)

    with bench_floor.query_asker(work.boxes, work.move_ids, work.move_boxes) as ask_bare:
        def bare():
            bare_calls.append(bench_floor.answer_seconds(ask_bare(queries)))

        for where, (offsets, hits) in (("server's", world.query_aabb(work.q_aabb)),
                                       ("bare server's", bench_floor.query_answer(ask_bare(queries), len(work.q_aabb)))):
            if not (np.array_equal(offsets, expected_offsets) and np.array_equal(hits, expected_hits)):
                raise SystemExit(f"the {where} box queries differ from the in-process dbvt.Broadphase's")
        served_seconds, bare_seconds, in_process = in_turns(
            (served, bare, lambda: broadphase.query_aabb(work.q_aabb)), QUERY_TURNS)
    # Each side runs twice a round, and the second call is the timed one.
    around = [(s - s_call) - (b - b_call) for s, s_call, b, b_call
              in zip(served_seconds, served_calls[1::2], bare_seconds, bare_calls[1::2])]
    wire["query"], local["query"] = statistics.median(served_seconds), statistics.median(in_process)
    wire["query_ratio"] = statistics.median(s / l for s, l in zip(served_seconds, in_process))
    wire["bare_query"] = statistics.median(bare_seconds)
    wire["bare_query_ratio"] = statistics.median(b / l for b, l in zip(bare_seconds, in_process))
    wire["query_beyond_bare"] = statistics.median(s - b for s, b in zip(served_seconds, bare_seconds))
    wire["query_around_bare"] = statistics.median(around)


def paired_ingest(client: Client, work: Workload, wire: dict, local: dict) -> None:
    """The move-only ingest through the server and in process, each on a query-only world that has
    seen every step once (untimed), INGEST_PAIRS pairs of passes. The run's ratio is the median of
    the pairs' in-process seconds over the wire's (throughput over throughput)."""
    from dbvt import Broadphase

    quiet = fresh_world(client, "dbvt-bench-query-only", track_pairs=False)
    quiet.apply(create=(work.ids, work.boxes))
    broadphase = Broadphase(dims=3, margin=0.05, track_pairs=False)
    broadphase.create(work.ids, work.boxes)
    broadphase.update()
    with quiet.stream() as stream:
        pipelined_ingest(stream, work)
        local_ingest(broadphase, work)
        seconds = in_pairs(lambda: pipelined_ingest(stream, work), lambda: local_ingest(broadphase, work),
                           INGEST_PAIRS)
    client.delete_world(quiet.name)
    wire["quiet_ingest"], local["quiet_ingest"] = statistics.median(seconds[0]), statistics.median(seconds[1])
    wire["ingest_ratio"] = statistics.median(l / w for w, l in zip(*seconds))


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def ratios(wire: list[dict], local: list[dict], key: str, local_key: str | None = None) -> list[float]:
    """Each run's wire/in-process ratio: the two sides of a run ran seconds apart, so pairing them
    cancels most of the machine's drift from run to run."""
    return [w[key] / l[local_key or key] for w, l in zip(wire, local)]


def ratio_of(wire: list[dict], local: list[dict], key: str, local_key: str | None = None) -> float:
    """The median over runs of each run's wire/in-process ratio."""
    return statistics.median(ratios(wire, local, key, local_key))


def wire_floor(work: Workload, wire: dict, local: dict) -> float:
    """Seconds bare gRPC adds to a tick-by-tick step of a run: the same message sizes, the same work
    time, measured right after the run, so that the figure beyond it is paired as the ratios are."""
    request_bytes = work.move_ids.shape[1] * (8 + 4 * work.move_boxes.shape[2])   # uint64 ids, float32 boxes
    return bench_floor.floor(local["step"], request_bytes, int(wire["answer_bytes"]))


def beside_same_calls(client: Client, work: Workload) -> dict:
    """W1's steps after its first, PAIRED_STEPS of them, tick by tick on a new world, PAIRED_WORLDS
    times, each step paired with the same step through a bare grpc.aio server making the same dbvt
    calls on a new world of its own (dbvt_server.bench.floor.paired_steps): the medians of the bare
    server's steps and of each step's time beyond it, the quartiles of the latter, and the median of
    each step's time around its dbvt calls beyond the bare server's (each side's calls taken out)."""
    steps = min(work.steps, PAIRED_STEPS + 1)

    def passes():
        for _ in range(PAIRED_WORLDS):
            world = fresh_world(client, "dbvt-bench-paired")
            world.apply(create=(work.ids, work.boxes))
            with world.stream() as stream:
                yield lambda step: stream.apply(move=(work.move_ids[step], work.move_boxes[step]))
            client.delete_world(world.name)

    served, bare = bench_floor.paired_steps(passes(), work.boxes, work.move_ids[:steps], work.move_boxes[:steps])
    beyond = statistics.quantiles([s - b for (s, _), (b, _) in zip(served, bare)], n=4)
    around = [(s - s_calls) - (b - b_calls) for (s, s_calls), (b, b_calls) in zip(served, bare)]
    return dict(same_calls=statistics.median(b for b, _ in bare), beyond_same_calls=beyond[1],
                beyond_quartiles=(beyond[0], beyond[2]), paired_steps=len(served),
                around_same_calls=statistics.median(around),
                bare_around=statistics.median(b - b_calls for b, b_calls in bare))


def spread(values: list[float], digits: int = 2) -> str:
    """The median and the range of `values`."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def verdict(values: list[float], at_most: float | None = None, at_least: float | None = None,
            unit: str = "runs") -> str:
    """Whether the median of `values` meets its target, and in how many of the runs (or rounds)."""
    met = [(at_most is None or v <= at_most) and (at_least is None or v >= at_least) for v in values]
    median = statistics.median(values)
    whole = (at_most is None or median <= at_most) and (at_least is None or median >= at_least)
    return f"{'met' if whole else 'NOT met'} ({sum(met)} of {len(met)} {unit})"


def targets(wire: list[dict], local: list[dict], queries: int, parallel_wire: dict | None = None,
            parallel_bare: dict | None = None, parallel_local: dict | None = None) -> list[str]:
    """The wire targets of issue 17, each a figure per run (the two busy worlds: per round), its
    median and range, and whether the median meets it."""
    figures = [
        ("streamed step, 2 ticks in flight, x in-process", ratios(wire, local, "ahead"), "<= 1.3x", 1.3, None, "runs"),
        # A bare grpc.aio round trip of the same sizes and work: the bare server making the same dbvt
        # calls, step by step beside the service, each side's own time in its calls taken out (the
        # service's is each answer's world_seconds).
        ("tick by tick, beyond bare gRPC making the same calls, ms", [w["around_same_calls"] * 1e3 for w in wire],
         "<= 0.3 ms", 0.3, None, "runs"),
        # Beside it, the busy-waiting floor, measured apart: it pays none of what the work costs the
        # rest of a round trip (the threads waking to caches the work has left cold), which the bare
        # server making the same calls pays as the service does.
        ("  the same beyond the busy-waiting floor, ms", [(w["step_around"] - w["floor"]) * 1e3 for w in wire],
         "<= 0.3 ms", 0.3, None, "runs"),
        # Throughput against throughput: the in-process seconds over the wire's, for the same moves.
        ("move-only ingest, x in-process throughput", [w["ingest_ratio"] for w in wire], ">= 0.6x", None, 0.6,
         "runs"),
        (f"{queries // 1000}k box queries in one call, x in-process", [w["query_ratio"] for w in wire],
         "<= 1.3x", 1.3, None, "runs"),
        # Beside it, as for the tick: the same call through a bare grpc.aio server, on the same tree.
        ("  the same call through bare gRPC, x in-process", [w["bare_query_ratio"] for w in wire],
         "<= 1.3x", 1.3, None, "runs"),
    ]
    for key, label in (("query", "query calls"), ("steps", "W1 steps")):
        if parallel_wire is not None:
            # Each round's scaling over the in-process control's (its median: it ran apart from them).
            control = parallel_local[key].ratio
            figures.append((f"two busy worlds, {label}: scaling, x in-process scaling",
                            [r / control for r in parallel_wire[key].round_ratios], ">= 0.9x", None, 0.9, "rounds"))
            # Beside it, as for the tick: each round's scaling over the bare server's round beside it.
            figures.append(("  the same, x bare gRPC's scaling (the same calls)",
                            [r / b for r, b in zip(parallel_wire[key].round_ratios, parallel_bare[key].round_ratios)],
                            ">= 0.9x", None, 0.9, "rounds"))
    lines = ["the wire targets (issue 17): median (range) of the runs"]
    for label, values, target, at_most, at_least, unit in figures:
        lines.append(f"  {label:54}{spread(values):>20}  {target}: {verdict(values, at_most, at_least, unit)}")
    return lines


def report(work: Workload, wire: list[dict], local: list[dict]) -> list[str]:
    n, moves = len(work.ids), work.move_ids.shape[1]
    total_moves = moves * work.steps

    def row(label: str, key: str, scale: float, digits: int) -> str:
        # Where the sides ran in pairs, the run's ratio is its pairs' median (paired_queries).
        ratio = statistics.median(w[key + "_ratio"] for w in wire) if key + "_ratio" in wire[0] else \
            ratio_of(wire, local, key)
        return (f"{label:40}{median_of(wire, key) * scale:14.{digits}f}{median_of(local, key) * scale:12.{digits}f}"
                f"{ratio:8.2f}")

    lines = [
        f"W1: N={n}, {work.steps} steps of {moves} moves, {len(work.q_aabb)} box queries; "
        f"medians of {len(wire)} runs; ratio: median of the runs' own ratios",
        f"{'':40}{'server (wire)':>14}{'in-process':>12}{'ratio':>8}",
        row("create all, ms", "create", 1e3, 1),
        row("streamed step, tick by tick, ms", "step", 1e3, 2),
        f"{'  beyond the in-process step, ms':40}{(median_of(wire, 'step') - median_of(local, 'step')) * 1e3:14.2f}",
        f"{'  bare gRPC, same sizes and work, ms':40}{median_of(wire, 'floor') * 1e3:14.2f}"
        "  (dbvt_server.bench.floor, after each run)",
        f"{'  the broadphase itself, ms':40}{median_of(wire, 'step_world') * 1e3:14.2f}"
        "  (each answer's world_seconds: the server's time in the core's calls)",
        f"{'  the rest beyond bare gRPC, ms':40}"
        f"{statistics.median((w['step_around'] - w['floor']) * 1e3 for w in wire):14.2f}"
        "  (the step minus its world_seconds, beyond the floor: median of the runs)",
        f"{f'  in-process after {REST_BEFORE_STEP * 1e3:.0f} ms asleep, ms':40}{'':14}"
        f"{median_of(local, 'rested_step') * 1e3:12.2f}{ratio_of(wire, local, 'step', 'rested_step'):8.2f}"
        "  (the tick-by-tick step against it)",
        # Not the target's figure: the bare server's work is a busy wait, which no idle time slows.
        f"{'  beyond it and bare gRPC, ms':40}"
        f"{statistics.median((w['step'] - l['rested_step'] - w['floor']) * 1e3 for w, l in zip(wire, local)):14.2f}"
        "  (median of the runs)",
        f"{'  bare gRPC making the same dbvt calls, ms':40}{median_of(wire, 'same_calls') * 1e3:14.2f}"
        "  (the same W1 steps, each paired with one through the server)",
        f"{'  the step beyond it, ms':40}{median_of(wire, 'beyond_same_calls') * 1e3:14.2f}"
        f"  (median of {wire[0]['paired_steps']} pairs a run, {PAIRED_WORLDS} pairs of worlds; quartiles "
        + ", ".join(f"{w['beyond_quartiles'][0] * 1e3:.2f} to {w['beyond_quartiles'][1] * 1e3:.2f}" for w in wire) + ")",
        f"{'  around the dbvt calls, beyond it, ms':40}{median_of(wire, 'around_same_calls') * 1e3:14.2f}"
        "  (each side's own time in its dbvt calls taken out: what the service adds)",
        f"{'  the bare step around its calls, ms':40}"
        f"{statistics.median((w['bare_around'] - w['floor']) * 1e3 for w in wire):14.2f}"
        "  (beyond the floor: what a bare server pays for real work, which a busy wait does not)",
        row(f"streamed step, {STEPS_AHEAD} ticks in flight, ms", "ahead", 1e3, 2),
        f"{'  the same, M moves/s with pair changes':40}{moves / median_of(wire, 'ahead') / 1e6:14.2f}"
        f"{moves / median_of(local, 'ahead') / 1e6:12.2f}",
        f"{'move-only ingest (query-only world), M/s':40}{total_moves / median_of(wire, 'quiet_ingest') / 1e6:14.2f}"
        f"{total_moves / median_of(local, 'quiet_ingest') / 1e6:12.2f}"
        f"{statistics.median(w['ingest_ratio'] for w in wire):8.2f}",
        row(f"{len(work.q_aabb) // 1000}k box queries in one call, ms", "query", 1e3, 2),
        f"{'  bare gRPC making the same call, ms':40}{median_of(wire, 'bare_query') * 1e3:14.2f}{'':12}"
        f"{statistics.median(w['bare_query_ratio'] for w in wire):8.2f}"
        "  (a bare grpc.aio server's world through the same steps, in the same rounds)",
        f"{'  the call beyond it, ms':40}{median_of(wire, 'query_beyond_bare') * 1e3:14.2f}"
        "  (median of the runs' medians)",
        f"{'  around the dbvt call, beyond it, ms':40}{median_of(wire, 'query_around_bare') * 1e3:14.2f}"
        "  (each side's own time in its dbvt call taken out: what the service and the SDK add)",
        f"{'on the query stream, x a unary call':40}{'stream':>14}{'call':>12}",
        *(f"{label:40}{median_of(wire, 'stream_' + key) * 1e3:14.3f}{median_of(wire, 'call_' + key) * 1e3:12.3f}"
          f"{statistics.median(w[f'stream_{key}_ratio'] for w in wire):8.3f}"
          for key, label in (("whole", f"  {len(work.q_aabb) // 1000}k box queries, ms"), ("one", "  1 box query, ms"))),
    ]
    if work.expected is not None:
        expected = work.expected["pairs_per_step"][:work.steps]
        same = all(counts == expected for run in wire for counts in run["pair_counts"])
        lines.append(f"pair counts after every step {'match' if same else 'DIFFER FROM'} the oracle's expected.json")
    return lines


def add_arguments(parser) -> None:
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    parser.add_argument("directory", nargs="?", type=pathlib.Path,
                        help="a W1 directory (default: make W1 data with --n and --steps)")
    parser.add_argument("--target", help="HOST:PORT of a running dbvt-server (default: start one)")
    parser.add_argument("--server-pid", type=int,
                        help="process id of the --target server, if on this machine: its CPU use is then shown")
    parser.add_argument("--n", type=workload.at_least(10), default=100_000, help="proxies of the W1 data made here [100000]")
    parser.add_argument("--steps", type=workload.at_least(1), default=30, help="steps to run (at most the directory's) [30]")
    parser.add_argument("--seed", type=int, default=workload.W1_SEED, help="seed of the W1 data made here")
    parser.add_argument("--repeats", type=workload.at_least(1), default=3, help="runs of each side; medians are reported [3]")
    parser.add_argument("--window", type=float, default=bench_parallel.WINDOW,
                        help=f"seconds of each two-busy-worlds round that are counted [{bench_parallel.WINDOW}]")


def run(args, facts: dict) -> int:
    work = workload.w1_for(args, "wire")
    process, target = (None, args.target) if args.target else start_server()
    server_pid = args.server_pid if process is None else process.pid
    try:
        with Client(target) as client:
            wire, local = [], []
            for attempt in range(args.repeats):
                label = f"run {attempt + 1}/{args.repeats}"
                stepped = {}

                def on_wire():
                    figures, stepped["wire"] = wire_run(client, work, Progress(f"server {label}", work.steps))
                    wire.append(figures)

                def in_process():
                    figures, stepped["local"] = local_run(work, Progress(f"in-process {label}", work.steps))
                    local.append(figures)

                # Alternately first, so that neither side always runs right after the other.
                for side in (on_wire, in_process)[::1 if attempt % 2 == 0 else -1]:
                    side()
                sys.stderr.write(f"box queries and ingest, in pairs, {label}\n")
                paired_queries(stepped["wire"], stepped["local"], work, wire[-1], local[-1])
                wire[-1].update(query_calls.stream_against_calls(target, stepped["wire"], client.max_message_bytes(),
                                                                 work.q_aabb, in_pairs))
                client.delete_world(stepped["wire"].name)
                paired_ingest(client, work, wire[-1], local[-1])
                sys.stderr.write(f"bare gRPC round trips {label}\n")
                wire[-1]["floor"] = wire_floor(work, wire[-1], local[-1])
                wire[-1].update(beside_same_calls(client, work))
            sys.stderr.write("two busy worlds...\n")
            parallel_wire, parallel_bare = bench_parallel.over_the_wire(client, target, work, server_pid,
                                                                       args.window, args.repeats)
        parallel_local = bench_parallel.in_process(work, args.window, args.repeats)
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
    lines = (report(work, wire, local) + bench_parallel.report(parallel_wire, parallel_bare, parallel_local, args.window)
             + targets(wire, local, len(work.q_aabb), parallel_wire, parallel_bare, parallel_local))
    print("\n".join(lines))
    console.footer(facts)
    return 0
