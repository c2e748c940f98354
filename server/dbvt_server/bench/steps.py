"""`dbvt-bench steps`: a broadphase step on threads against one, W1 at --large and W2 at --dense.

Two `dbvt.Broadphase` hold the same world, one with `threads=1` and one with `threads=--threads`,
and take the same steps (every step's moves, then update()); which of the two goes first alternates
step by step, and each step's ratio (T threads against 1, wall time of move() and update()) is
paired within the step. W1 at --large moves a tenth of its proxies a step; W2 (2-D, then 3-D) at
--dense moves every proxy every step. After every step the two answers must be equal, and at the
end the two worlds' bytes.

The figure is the median of the steps' ratios over --repeat runs, its range beside it. A second
thread helps only with a free core: the load average is printed at the start and the end.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import dbvt
from dbvt_server.bench import console, workload

THREADED_STEP_TARGET = 0.62         # a step on 2 threads against 1, W1 at 1M and W2 at 100k


def add_arguments(parser) -> None:
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    parser.add_argument("--large", type=workload.at_least(10), default=1_000_000, help="proxies of W1 [1000000]")
    parser.add_argument("--dense", type=workload.at_least(10), default=100_000, help="proxies of W2 [100000]")
    parser.add_argument("--steps", type=workload.at_least(1), default=6, help="steps a run [6]")
    parser.add_argument("--repeat", type=workload.at_least(1), default=3, help="runs of each workload [3]")
    parser.add_argument("--threads", type=workload.at_least(2), default=2, help="threads set beside one [2]")


def one_run(work: workload.Workload, threads: int) -> tuple[list[float], bool]:
    """Each step's wall time on `threads` threads over one thread's, and whether the answers agreed."""
    worlds = {count: dbvt.Broadphase(dims=work.dims, threads=count) for count in (1, threads)}
    for world in worlds.values():
        world.create(work.ids, work.boxes)
        world.update()
    ratios, agree = [], True
    for step in range(work.steps):
        seconds, answers = {}, {}
        for count in ((1, threads) if step % 2 == 0 else (threads, 1)):
            world = worlds[count]
            started = time.perf_counter()
            world.move(work.move_ids[step], work.move_boxes[step])
            answers[count] = world.update()
            seconds[count] = time.perf_counter() - started
        ratios.append(seconds[threads] / seconds[1])
        agree = agree and all(np.array_equal(a, b) for a, b in zip(answers[1], answers[threads]))
    return ratios, agree and worlds[1].to_bytes() == worlds[threads].to_bytes()


def run(args, facts: dict) -> int:
    works = {f"W1 at {args.large}": workload.make_w1(args.large, args.steps),
             f"W2 2-D at {args.dense}": workload.make_w2(args.dense, args.steps, dims=2),
             f"W2 3-D at {args.dense}": workload.make_w2(args.dense, args.steps, dims=3)}
    print(f"{args.steps} steps a run, {args.repeat} runs; {args.threads} threads against 1", flush=True)
    agree = True
    for name, work in works.items():
        ratios = []
        for _ in range(args.repeat):
            run_ratios, same = one_run(work, args.threads)
            ratios += run_ratios
            agree = agree and same
        median = statistics.median(ratios)
        print(f"{name}: step on {args.threads} threads / on 1: median {median:.2f} "
              f"(range {min(ratios):.2f}-{max(ratios):.2f})  target <= {THREADED_STEP_TARGET} "
              f"({'met' if median <= THREADED_STEP_TARGET else 'NOT met'})", flush=True)
    print(f"every step's pairs, and the worlds' bytes, the same on both: {'OK' if agree else 'MISMATCH'}")
    console.footer(facts)
    return 0 if agree else 1
