"""`dbvt-bench insert`: insertion at scale, W1 at --n proxies beside W1 at --large.

One at a time is the SAH insertion path: a tree holding one proxy takes all the others in one call,
each descending the tree on its own (what a game's spawns cost, and every insert into a world that
is not empty). The bulk build fills an empty tree in one binned-SAH build. Both sizes are built in
every run, alternately first, and each figure is the CPU time (time.process_time) of the call,
with the garbage collector off, per proxy: the median of --repeat runs, the range beside it. The
issue's target is the large tree's one-at-a-time figure, and how far it stays from the small one's.

With --threads T (2), the bulk build of the large W1 also runs on T threads beside one, alternately
first in each run: the wall time of each, and the median of the runs' own ratios (T against 1). The
trees they build are compared byte for byte.

The trees are checked: each must pass its own invariant check, and the one-at-a-time tree must find
the same pairs as the bulk-built one.
"""
from __future__ import annotations

import argparse
import statistics
import time

import dbvt
from dbvt_server.bench import console, workload
from dbvt_server.bench.core import cpu

ONE_AT_A_TIME_TARGET_US = 1.2       # at --large
THREADED_BULK_TARGET = 0.65         # the bulk build at --large on 2 threads against 1


def add_arguments(parser) -> None:
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    parser.add_argument("--n", type=workload.at_least(10), default=100_000, help="proxies of the small W1 [100000]")
    parser.add_argument("--large", type=workload.at_least(10), default=1_000_000,
                        help="proxies of the large W1 [1000000]")
    parser.add_argument("--repeat", type=workload.at_least(1), default=5, help="runs of each size [5]")
    parser.add_argument("--seed", type=int, default=workload.W1_SEED, help="seed of the W1 data")
    parser.add_argument("--threads", type=workload.at_least(2), default=2,
                        help="threads of the bulk build set beside one [2]")


def one_run(work: workload.Workload) -> dict:
    """Both insertions of one W1, µs a proxy, and whether the trees check out and agree."""
    bulk = dbvt.Tree()
    seconds, _ = cpu(lambda: bulk.insert(work.ids, work.boxes))
    figures = {"bulk": seconds / work.n * 1e6}
    single = dbvt.Tree()
    single.insert(work.ids[:1], work.boxes[:1])
    seconds, _ = cpu(lambda: single.insert(work.ids[1:], work.boxes[1:]))
    figures["one_at_a_time"] = seconds / (work.n - 1) * 1e6
    figures["height"] = single.stats()["height"]
    return figures, (bulk, single)


def threaded_bulk(work: workload.Workload, threads: int, first: int) -> tuple[float, float, bool]:
    """Wall seconds of the bulk build on one thread and on `threads`, the one `first` first; same tree?"""
    seconds, built = {}, {}
    for count in ((threads, 1) if first == threads else (1, threads)):
        tree = dbvt.Tree(threads=count)
        started = time.perf_counter()
        tree.insert(work.ids, work.boxes)
        seconds[count] = time.perf_counter() - started
        built[count] = tree.to_bytes()
        del tree
    return seconds[1], seconds[threads], built[1] == built[threads]


def checked(trees) -> bool:
    bulk, single = trees
    bulk.validate()
    single.validate()
    return len(bulk.pairs()) == len(single.pairs())


def run(args, facts: dict) -> int:
    sizes = (args.n, args.large)
    works = {n: workload.make_w1(n, 1, args.seed) for n in sizes}
    print(f"W1 of {args.n} and of {args.large} proxies, {args.repeat} runs of each, alternately first", flush=True)
    runs = {n: [] for n in sizes}
    threaded = []
    agree = True
    for attempt in range(args.repeat):
        for n in (sizes if attempt % 2 == 0 else sizes[::-1]):
            figures, trees = one_run(works[n])
            runs[n].append(figures)
            if attempt == 0:
                agree = checked(trees) and agree
            del trees
        one, many, same = threaded_bulk(works[args.large], args.threads, args.threads if attempt % 2 else 1)
        threaded.append((one, many))
        agree = agree and same
    for n in sizes:
        for key, label in (("one_at_a_time", "one at a time"), ("bulk", "bulk build")):
            values = [figures[key] for figures in runs[n]]
            print(f"N={n:>9}: {label:<14} median {statistics.median(values):.3f} us/proxy "
                  f"(range {min(values):.3f}-{max(values):.3f})")
    small = statistics.median(f["one_at_a_time"] for f in runs[args.n])
    large = statistics.median(f["one_at_a_time"] for f in runs[args.large])
    print(f"one at a time at {args.large} / at {args.n}: {large / small:.2f}; "
          f"at {args.large}: {large:.3f} us/proxy  target <= {ONE_AT_A_TIME_TARGET_US} "
          f"({'met' if large <= ONE_AT_A_TIME_TARGET_US else 'NOT met'})")
    ratios = [many / one for one, many in threaded]
    print(f"bulk build of {args.large}, wall time: 1 thread {statistics.median(o for o, _ in threaded) * 1e3:.0f} ms, "
          f"{args.threads} threads {statistics.median(m for _, m in threaded) * 1e3:.0f} ms; {args.threads} against 1: "
          f"median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})  "
          f"target <= {THREADED_BULK_TARGET} ({'met' if statistics.median(ratios) <= THREADED_BULK_TARGET else 'NOT met'})")
    print(f"height of the one-at-a-time trees: {runs[args.n][0]['height']} and {runs[args.large][0]['height']}")
    print(f"trees checked, one at a time finds the bulk build's pairs, and the threads build the same tree: "
          f"{'OK' if agree else 'MISMATCH'}")
    console.footer(facts)
    return 0 if agree else 1
