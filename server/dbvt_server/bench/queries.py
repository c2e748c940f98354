"""`dbvt-bench queries`: the k nearest, box and ball casts and the overlap of two worlds, on W1.

W1 at --n proxies (the same recipe as `dbvt-bench core`) goes into a dbvt.Broadphase(track_pairs=False),
as a query-only world holds it; a second W1 of --n, from the next seed, is the other world of the
overlap. The query sets are --points random points in the W1 cube: the points themselves for
query_nearest (k = 8), boxes of W1's sizes (sides 1 to 4) around them for cast_box, balls of radius 2 at
them for cast_sphere, each cast moved by 20 in a random direction and keeping all its hits.

Every figure is the CPU time (time.process_time) of whole batch calls, with the garbage collector off,
repeated --repeat times; the median is the figure, the range beside it. The anchor is the `rtree`
package (libspatialindex) answering `nearest` on the same boxes, one call per point as its API has it,
on the first --rtree-points points, interleaved with dbvt in every repeat; its vectorised `nearest_v`
is shown beside it. The box query of `dbvt-bench core` (W1's 10,000 boxes of side 10) runs in every
repeat too, as a control: its figure on a quiet day is known, so it tells how fast the machine is now. The answers are checked: the first 100 queries of each kind against dbvt.reference
(equal bit for bit), rtree's nearest ids against dbvt's, and the overlap against the pairs across the
two worlds that Tree.pairs() finds in their union (one box query per proxy). A mismatch makes the exit
status 1.

Threads inside one world: in every repeat W1's 10,000 box queries (side 10) and 10,000 segments (all
hits) run on the first world as it is (threads=1) and on a twin with threads=--threads, taking turns to
go first. These figures are wall time (time.perf_counter), since the CPU time of a call cut over
threads is their sum; each run's speed-up is its threads=1 time over its threads=T time, and the
median of the runs' speed-ups is the figure. The twin's answers must equal the world's byte for byte.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import gc
import statistics
import time
from pathlib import Path

import numpy as np

import dbvt
from dbvt import reference
from dbvt_server.bench import console, workload
from dbvt_server.bench.core import cpu

K = 8
CAST_LENGTH = 20.0
BALL_RADIUS = 2.0
CHECKED = 100               # queries of each kind checked against dbvt.reference

# figure key -> (label, unit, target at N = 100k: (kind, value) with kind "max" or "speed-up")
FIGURES = {
    "nearest": (f"query_nearest, k = {K}", "us/point", ("max", 4.0)),
    "rtree_nearest": (f"  rtree nearest, k = {K}, one call a point", "us/point", ("speed-up", 10.0)),
    "rtree_nearest_v": (f"  rtree nearest_v, k = {K}, one call", "us/point", None),
    "cast_box": (f"cast_box, all hits, moved {CAST_LENGTH:g}", "us/cast", ("max", 5.0)),
    "cast_sphere": (f"cast_sphere, r = {BALL_RADIUS:g}, moved {CAST_LENGTH:g}", "us/cast", ("max", 6.0)),
    "overlap": ("overlap of two W1 worlds", "ms", ("max", 25.0)),
    "query_aabb": ("query_aabb, W1's boxes of side 10 (control)", "us/query", None),
}


def add_arguments(parser) -> None:
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    parser.add_argument("--n", type=workload.at_least(10), default=100_000, help="proxies in each W1 world [100000]")
    parser.add_argument("--seed", type=int, default=workload.W1_SEED, help="seed of the first W1 world (the second: seed + 1)")
    parser.add_argument("--points", type=workload.at_least(1), default=10_000, help="queries of each kind per call [10000]")
    parser.add_argument("--rtree-points", type=workload.at_least(1), default=2_000,
                        help="points rtree answers one call at a time, of the --points [2000]")
    parser.add_argument("--repeat", type=workload.at_least(3), default=7, help="runs of every figure, at least 3 [7]")
    parser.add_argument("--no-rtree", action="store_true", help="skip the rtree anchor")
    parser.add_argument("--threads", type=workload.at_least(2), default=2,
                        help="threads of the twin world timed against threads=1 [2]")
    parser.add_argument("--json", type=Path, help="also write every figure and check here")


def query_sets(side: float, count: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    points = rng.uniform(0, side, (count, 3))
    half = rng.uniform(0.5, 2.0, (count, 3))
    direction = rng.normal(size=(count, 3))
    moves = CAST_LENGTH * direction / np.linalg.norm(direction, axis=1, keepdims=True)
    return {"points": points.astype(np.float32), "moves": moves.astype(np.float32),
            "boxes": np.concatenate([points - half, points + half], axis=1).astype(np.float32)}


def dbvt_calls(world, other, q: dict, boxes: np.ndarray) -> dict:
    return {"nearest": lambda: world.query_nearest(q["points"], K),
            "cast_box": lambda: world.cast_box(q["boxes"], q["moves"]),
            "cast_sphere": lambda: world.cast_sphere(q["points"], BALL_RADIUS, q["moves"]),
            "overlap": lambda: dbvt.overlap(world, other),
            "query_aabb": lambda: world.query_aabb(boxes)}


def wall(action):
    """Wall seconds of one call and its result; no garbage collection pause lands inside."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        result = action()
        return time.perf_counter() - start, result
    finally:
        gc.enable()


def threads_round(sides: list, work: workload.Workload, first: bool) -> tuple[dict, list]:
    """One paired run: each side's wall seconds for the box queries and the segments, the threads=1 side
    first when `first`; and every answer, for the check."""
    seconds, answers = {}, []
    for count, world in (sides if first else sides[::-1]):
        for key, call in (("box", lambda: world.query_aabb(work.q_aabb)), ("segment", lambda: world.raycast(work.q_ray))):
            seconds[key, count], answer = wall(call)
            answers.append((key, count, answer))
    return seconds, answers


def threads_table(runs: list[dict], threads: int, work: workload.Workload) -> str:
    lines = [f"threads inside one world: threads={threads} against threads=1, wall time, {len(runs)} paired runs",
             f"{'':34}{'threads=1 ms':>13}{f'threads={threads} ms':>13}{'speed-up':>10}{'range':>12}"]
    for key, label in (("box", f"{len(work.q_aabb)} box queries, side 10"),
                       ("segment", f"{len(work.q_ray)} segments, all hits")):
        serial, split = ([run[key, count] for run in runs] for count in (1, threads))
        gains = [a / b for a, b in zip(serial, split)]
        lines.append(f"{label:34}{statistics.median(serial) * 1e3:13.2f}{statistics.median(split) * 1e3:13.2f}"
                     f"{statistics.median(gains):10.2f}{f'{min(gains):.2f}-{max(gains):.2f}':>12}")
    return "\n".join(lines)


def same_answers(answers: list, threads: int) -> tuple[str, bool, str]:
    by_side = {(key, count): answer for key, count, answer in answers}
    same = all(len(by_side[key, 1]) == len(by_side[key, threads])
               and all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(by_side[key, 1], by_side[key, threads]))
               for key in ("box", "segment"))
    return (f"threads={threads}: box queries and segments against threads=1", same,
            "identical" if same else "different")


def rtree_index(boxes: np.ndarray):
    from rtree import index

    properties = index.Property()
    properties.dimension = 3
    return index.Index(((i, tuple(row), None) for i, row in enumerate(boxes.astype(np.float64).tolist())),
                       properties=properties)


def rtree_calls(tree, points: np.ndarray) -> dict:
    coordinates = [tuple(p) + tuple(p) for p in points.astype(np.float64).tolist()]
    as_float64 = points.astype(np.float64)
    return {"rtree_nearest": lambda: [list(tree.nearest(c, K)) for c in coordinates],
            "rtree_nearest_v": lambda: tree.nearest_v(as_float64, as_float64, num_results=K)}


def per_unit(key: str, seconds: float, counts: dict) -> float:
    if key == "overlap":
        return seconds * 1e3
    return seconds / counts[key] * 1e6


def check(world_twin, world, other, q: dict, results: dict, rtree_results: dict | None) -> list[tuple[str, bool, str]]:
    """(item, ok, detail): the answers of the first run."""
    checks = []
    first = {key: value[:CHECKED] for key, value in q.items()}
    for key, ours, theirs in (
            ("nearest", world.query_nearest(first["points"], K), world_twin.query_nearest(first["points"], K)),
            ("cast_box", world.cast_box(first["boxes"], first["moves"]),
             world_twin.cast_box(first["boxes"], first["moves"])),
            ("cast_sphere", world.cast_sphere(first["points"], BALL_RADIUS, first["moves"]),
             world_twin.cast_sphere(first["points"], BALL_RADIUS, first["moves"]))):
        same = all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(ours, theirs))
        checks.append((f"{key}: the first {CHECKED} queries against dbvt.reference", same,
                       "identical" if same else "different"))
    pairs = results["overlap"]
    union = dbvt.Tree()
    ids_a, ids_b = world_ids(world), world_ids(other)
    union.insert(np.concatenate([ids_a * 2, ids_b * 2 + 1]),
                 np.concatenate([world.get(ids_a), other.get(ids_b)]))
    crossing = union.pairs()
    crossing = crossing[(crossing[:, 0] % 2) != (crossing[:, 1] % 2)]
    a_side = np.where(crossing[:, 0] % 2 == 0, crossing[:, 0], crossing[:, 1]) // 2
    b_side = np.where(crossing[:, 0] % 2 == 0, crossing[:, 1], crossing[:, 0]) // 2
    expected = np.stack([a_side, b_side], axis=1)
    expected = expected[np.lexsort((expected[:, 1], expected[:, 0]))]
    same = np.array_equal(pairs, expected)
    checks.append(("overlap: the pairs across the worlds of Tree.pairs() on their union", same,
                   f"{len(pairs)} pairs" if same else f"{len(pairs)} vs {len(expected)} pairs"))
    if rtree_results is not None:
        offsets, hits = results["nearest"][0], results["nearest"][1]
        found = rtree_results["rtree_nearest"]
        agree = sum(set(hits[offsets[i]:offsets[i + 1]].tolist()) <= set(found[i]) for i in range(len(found)))
        checks.append((f"rtree nearest: its ids hold dbvt's {K} nearest (it adds ties)", agree == len(found),
                       f"{agree} of {len(found)} points"))
    return checks


def world_ids(world) -> np.ndarray:
    """The ids of a W1 world made here: 0 .. n-1."""
    return np.arange(len(world), dtype=np.uint64)


def rtree_installed() -> bool:
    return importlib.util.find_spec("rtree") is not None


def format_table(summary: dict) -> str:
    rows = [("figure", "unit", "median", "range", "target", "met")]
    for key, (label, unit, target) in FIGURES.items():
        if key not in summary:
            continue
        runs = summary[key]
        median = statistics.median(runs)
        met, stated = "-", "-"
        if target is not None and target[0] == "max":
            stated, met = f"<= {target[1]:g}", "yes" if median <= target[1] else "NO"
        elif target is not None:
            ratio = median / statistics.median(summary["nearest"])
            stated = f">= {target[1]:g}x dbvt"
            met = f"{ratio:.1f}x: " + ("yes" if ratio >= target[1] else "NO")
        rows.append((label, unit, f"{median:.3f}", f"{min(runs):.3f}-{max(runs):.3f}", stated, met))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def run(args, facts: dict) -> int:
    first, second = workload.make_w1(args.n, 1, args.seed), workload.make_w1(args.n, 1, args.seed + 1)
    world, other = dbvt.Broadphase(track_pairs=False), dbvt.Broadphase(track_pairs=False)
    world.create(first.ids, first.boxes)
    other.create(second.ids, second.boxes)
    split = dbvt.Broadphase(track_pairs=False, threads=args.threads)
    split.create(first.ids, first.boxes)
    world_twin = reference.Broadphase(track_pairs=False)
    world_twin.create(first.ids, first.boxes)
    q = query_sets(first.meta["world_side"], args.points, args.seed + 2)
    counts = {"nearest": args.points, "cast_box": args.points, "cast_sphere": args.points,
              "query_aabb": len(first.q_aabb),
              "rtree_nearest": min(args.rtree_points, args.points),
              "rtree_nearest_v": min(args.rtree_points, args.points)}
    print(f"W1 3-D: two worlds of N={args.n} (seeds {args.seed} and {args.seed + 1}), side "
          f"{first.meta['world_side']:.2f}, in dbvt.Broadphase(track_pairs=False); {args.points} points, boxes "
          f"and balls, casts moved by {CAST_LENGTH:g}")

    anchor = None
    if args.no_rtree:
        print("rtree: skipped (--no-rtree)")
    elif not rtree_installed():
        print("rtree: not installed, so no anchor beside dbvt (pip install 'dbvt-server[bench]')")
    else:
        anchor = rtree_calls(rtree_index(first.boxes), q["points"][:counts["rtree_nearest"]])

    runs: dict[str, list[float]] = {}
    threads_runs: list[dict] = []
    checks, hit_counts = [], {}
    for attempt in range(args.repeat):
        # dbvt and rtree take turns going first, so that neither always meets the machine warmer.
        order = [("dbvt", dbvt_calls(world, other, q, first.q_aabb)), ("rtree", anchor)]
        if attempt % 2:
            order.reverse()
        results, rtree_results = {}, None
        for side, calls in order:
            if calls is None:
                continue
            for key, call in calls.items():
                seconds, answer = cpu(call)
                runs.setdefault(key, []).append(per_unit(key, seconds, counts))
                if side == "dbvt":
                    results[key] = answer
                else:
                    rtree_results = rtree_results or {}
                    rtree_results[key] = answer
        paired, answers = threads_round([(1, world), (args.threads, split)], first, attempt % 2 == 0)
        threads_runs.append(paired)
        if attempt == 0:
            checks = check(world_twin, world, other, q, results, rtree_results) + [same_answers(answers, args.threads)]
            hit_counts = {key: len(results[key][1]) / args.points for key in ("nearest", "cast_box", "cast_sphere")}
            hit_counts["overlap"] = len(results["overlap"])
        print(f"run {attempt + 1}/{args.repeat}: nearest {runs['nearest'][-1]:.2f} us, cast_box "
              f"{runs['cast_box'][-1]:.2f} us, cast_sphere {runs['cast_sphere'][-1]:.2f} us, overlap "
              f"{runs['overlap'][-1]:.1f} ms" + (f", rtree nearest {runs['rtree_nearest'][-1]:.1f} us"
                                                 if anchor is not None else ""), flush=True)

    print(f"\nhits per query: nearest {hit_counts['nearest']:.2f}, cast_box {hit_counts['cast_box']:.2f}, "
          f"cast_sphere {hit_counts['cast_sphere']:.2f}; overlap: {hit_counts['overlap']} pairs")
    print(f"targets are the project's, for W1 at N=100k; CPU time, median of {args.repeat} runs, range beside it; "
          "speed-up = rtree median / dbvt median\n")
    print(format_table(runs))
    print()
    print(threads_table(threads_runs, args.threads, first))
    print("\ncorrectness:")
    for item, ok, detail in checks:
        print(f"  {'OK      ' if ok else 'MISMATCH'} {item}: {detail}")
    console.footer(facts)
    if args.json:
        args.json.write_text(json.dumps({**facts, "n": args.n, "points": args.points, "repeat": args.repeat,
                                         "runs": runs, "hits": hit_counts, "threads": args.threads,
                                         "threads_runs": [{f"{key}_threads_{count}": value
                                                           for (key, count), value in run.items()}
                                                          for run in threads_runs],
                                         "checks": [{"item": i, "ok": ok, "detail": d} for i, ok, d in checks]},
                                        indent=1))
    return 0 if all(ok for _, ok, _ in checks) else 1
