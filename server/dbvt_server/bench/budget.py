"""`dbvt-bench budget`: busy worlds on threads, with the thread budget against without it.

--worlds `dbvt.Broadphase` of W2 (2-D, --dense proxies, every proxy moving every step), each with
`threads=--threads`, take --steps steps at once, each on a Python thread of its own inside
`dbvt.working()`, as the server's workers run them. Without a budget every world cuts each step
over its --threads threads, so --worlds x --threads threads take turns on the cores; with the
budget at --cores (the server's --cores) a step takes a pooled thread only while fewer than that
many work. The same worlds on one thread each are the control: what the budget can reach when every
core has a world. One world alone, each way, shows that a world busy alone keeps its threads.

Each round runs the three kinds in turn, in an order that alternates, --repeat times, and the
figures are the medians of the rounds' paired ratios of steps a second. Every step's pair changes
must be the same in every world and every round.
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import dbvt
from dbvt_server.bench import console, workload


def add_arguments(parser) -> None:
    cores = len(os.sched_getaffinity(0))
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    parser.add_argument("--dense", type=workload.at_least(10), default=30_000, help="proxies of W2 [30000]")
    parser.add_argument("--steps", type=workload.at_least(1), default=20, help="steps a world takes a round [20]")
    parser.add_argument("--worlds", type=workload.at_least(2), default=max(2, cores),
                        help=f"busy worlds [{max(2, cores)}: the cores, at least 2]")
    parser.add_argument("--threads", type=workload.at_least(2), default=max(2, cores),
                        help=f"threads= of each world [{max(2, cores)}]")
    parser.add_argument("--cores", type=workload.at_least(1), default=cores, help=f"the budget [{cores}]")
    parser.add_argument("--repeat", type=workload.at_least(1), default=5, help="rounds of each kind [5]")


def one_round(work: workload.Workload, worlds: int, threads: int) -> tuple[float, list]:
    """Steps a second of `worlds` worlds stepping at once, and each world's pair changes a step."""
    made = []
    for _ in range(worlds):
        world = dbvt.Broadphase(dims=work.dims, threads=threads)
        world.create(work.ids, work.boxes)
        world.update()
        made.append(world)
    changes: list[list] = [[] for _ in made]
    start = threading.Barrier(worlds + 1)

    def steps(index: int) -> None:
        world = made[index]
        start.wait()
        with dbvt.working():
            for step in range(work.steps):
                world.move(work.move_ids[step], work.move_boxes[step])
                begun, ended = world.update()
                changes[index].append((len(begun), len(ended)))

    runners = [threading.Thread(target=steps, args=(index,)) for index in range(worlds)]
    for runner in runners:
        runner.start()
    start.wait()
    started = time.perf_counter()
    for runner in runners:
        runner.join()
    return worlds * work.steps / (time.perf_counter() - started), changes


def run(args, facts: dict) -> int:
    work = workload.make_w2(args.dense, args.steps, dims=2)
    print(f"W2 2-D at {args.dense}, {args.steps} steps a world a round, threads={args.threads}; "
          f"budget {args.cores} against none, {args.repeat} rounds of each", flush=True)
    seen: list = []
    # Each kind of round: (the budget, threads= of each world).
    kinds = {"without a budget": (0, args.threads), "with the budget": (args.cores, args.threads),
             "on one thread each": (0, 1)}
    try:
        for worlds in (args.worlds, 1):
            rates: dict[str, list[float]] = {kind: [] for kind in kinds}
            for round_index in range(args.repeat):
                order = list(kinds) if round_index % 2 == 0 else list(reversed(kinds))
                for kind in order:
                    dbvt.set_thread_budget(kinds[kind][0])
                    rate, changes = one_round(work, worlds, kinds[kind][1])
                    rates[kind].append(rate)
                    seen.extend(changes)
            print(f"{worlds} busy world{'s' if worlds > 1 else ''}, steps/s: "
                  + ", ".join(f"{kind} {statistics.median(rates[kind]):.1f}" for kind in kinds), flush=True)
            for over in ("without a budget", "on one thread each"):
                ratios = [a / b for a, b in zip(rates["with the budget"], rates[over])]
                print(f"  with the budget / {over}: median {statistics.median(ratios):.3f} "
                      f"(range {min(ratios):.3f}-{max(ratios):.3f})", flush=True)
    finally:
        dbvt.set_thread_budget(0)
    same = all(changes == seen[0] for changes in seen)
    print(f"every world's pair changes, step by step, the same in every round: {'OK' if same else 'MISMATCH'}")
    console.footer(facts)
    return 0 if same else 1
