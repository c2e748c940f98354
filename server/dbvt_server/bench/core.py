"""`dbvt-bench core`: dbvt.Tree and dbvt.Broadphase on a workload, python-fcl beside them (issue 2).

On W1 it times every phase of issue 2's Performance table: inserts, the three query kinds, updates,
the Broadphase step and memory. On W2, dense and all moving, it times the Broadphase step (the
moves and the update that reports pair changes). Every phase is CPU time (time.process_time) of
whole batch calls, repeated --repeat times: the MEDIAN over runs is the figure the issue's targets
apply to, and the MIN (fastest run) is printed beside it because the machine is shared. Every answer
in the directory's expected.json is checked, and a mismatch makes the exit status 1. Without a
directory, W1 data and its exact answers are made first, in a temporary directory.

python-fcl (`pip install 'dbvt-server[bench]'`), if installed, runs W1 beside dbvt as the anchor.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

import dbvt
from dbvt_server.bench import console, workload

# phase key -> (label, unit, issue target at N=100k, or None). The memory target is set against
# Bullet's btDbvt and python-fcl's tree manager: a tree with its proxy records. `Tree` is that; a
# `Broadphase` also keeps its pair lists, as Bullet's separate pair cache would, and is shown beside it.
PHASES = {
    "insert_bulk": ("insert bulk", "us/proxy", 0.25),
    "insert_incremental": ("insert one at a time", "us/proxy", 0.75),
    "query_aabb": ("box query", "us/query", 3.0),
    "raycast": ("segment, all hits", "us/query", 4.0),
    "query_aabb_again": ("  box query, the batch again", "us/query", None),
    "query_aabb_stepped": ("  box query after a step", "us/query", None),
    "raycast_stepped": ("  segment after a step", "us/query", None),
    "frustum": ("frustum (6 planes)", "us/query", 85.0),
    "update": ("update per moved proxy", "us/move", 0.75),
    "step": ("Broadphase step", "ms/step", 10.0),
    "step_guarded": ("  as a world applies it", "ms/step", None),
    "memory_tree": ("memory, Tree (after queries)", "bytes/proxy", 128.0),
    "memory_broadphase": ("memory, Broadphase + pairs", "bytes/proxy", None),
}
# W2 has no targets of its own: issue 2's are set on W1.
W2_PHASES = {
    "step": ("Broadphase step", "ms/step", None),
    "step_guarded": ("  as a world applies it", "ms/step", None),
    "step_per_move": ("step per moved proxy", "us/move", None),
    "memory_broadphase": ("memory, Broadphase + pairs", "bytes/proxy", None),
}
FCL_QUERIES = 2000      # python-fcl answers through a Python callback per hit: a subset keeps runs short
FCL_STEPS = 5


def cpu(action):
    """CPU seconds of one call and its result; no garbage collection pause lands inside."""
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        result = action()
        return time.process_time() - start, result
    finally:
        gc.enable()


def dbvt_run(w: workload.Workload) -> tuple[dict, dict]:
    """One run of every dbvt phase on W1: (figures, results kept for the correctness checks)."""
    n, moves, fig, out = w.n, w.moves, {}, {}
    tree = dbvt.Tree()
    seconds, _ = cpu(lambda: tree.insert(w.ids, w.boxes))
    fig["insert_bulk"] = seconds / n * 1e6
    for key, batch, call in (("query_aabb", w.q_aabb, tree.query_aabb), ("raycast", w.q_ray, tree.raycast),
                             ("frustum", w.q_frustum, tree.query_frustum)):
        seconds, out[key] = cpu(lambda: call(batch))
        fig[key] = seconds / len(batch) * 1e6
    fig["query_aabb_again"] = cpu(lambda: tree.query_aabb(w.q_aabb))[0] / len(w.q_aabb) * 1e6
    # after the queries: a tree keeps what its queries built (the wide view of box and segment queries)
    fig["memory_tree"] = tree.stats()["memory_bytes"] / n

    incremental = dbvt.Tree()
    incremental.insert(w.ids[:1], w.boxes[:1])      # not empty, so the batch below takes the SAH insert path
    seconds, _ = cpu(lambda: incremental.insert(w.ids[1:], w.boxes[1:]))
    fig["insert_incremental"] = seconds / (n - 1) * 1e6

    moving = dbvt.Tree(margin=0.05)
    moving.insert(w.ids, w.boxes)
    seconds, left = cpu(lambda: sum(moving.update(w.move_ids[s], w.move_boxes[s]) for s in range(w.steps)))
    fig["update"] = seconds / (w.steps * moves) * 1e6
    fig["left_fat_box_fraction"] = left / (w.steps * moves)
    out["tree_pairs_after_steps"] = len(moving.pairs())
    stepped_run(w, fig)
    broadphase_run(w, fig, out)
    return fig, out


def stepped_run(w: workload.Workload, fig: dict) -> None:
    """Queries as a world meets them: each step's moves, then one batch (boxes and segments in turn), which
    pays for anything a query structure must redo after the tree changed. Only the batch is timed."""
    stepped = dbvt.Tree(margin=0.05)
    stepped.insert(w.ids, w.boxes)
    times = {"query_aabb_stepped": [], "raycast_stepped": []}
    for s in range(w.steps):
        stepped.update(w.move_ids[s], w.move_boxes[s])
        key, batch, call = (("query_aabb_stepped", w.q_aabb, stepped.query_aabb) if s % 2 == 0
                            else ("raycast_stepped", w.q_ray, stepped.raycast))
        times[key].append(cpu(lambda: call(batch))[0] / len(batch) * 1e6)
    for key, values in times.items():
        fig[key] = statistics.median(values) if values else float("nan")


def broadphase_run(w: workload.Workload, fig: dict, out: dict) -> tuple[dict, dict]:
    """The Broadphase phases, on any workload: creation with its first update, then every step."""
    broadphase = dbvt.Broadphase(dims=w.dims)
    seconds, (begun, _) = cpu(lambda: (broadphase.create(w.ids, w.boxes), broadphase.update())[1])
    fig["broadphase_setup_ms"] = seconds * 1e3
    # after the first update, so the per-proxy pair lists a live broadphase carries are counted
    fig["memory_broadphase"] = broadphase.stats()["memory_bytes"] / w.n
    guarded = dbvt.Broadphase(dims=w.dims)
    guarded.create(w.ids, w.boxes)
    guarded.update()
    out["pairs_step0"], count, step_seconds, out["pairs_per_step"] = len(begun), len(begun), [], []
    guarded_seconds = []
    for s in range(w.steps):
        seconds, (begun, ended) = cpu(lambda: (broadphase.move(w.move_ids[s], w.move_boxes[s]),
                                               broadphase.update())[1])
        step_seconds.append(seconds)
        count += len(begun) - len(ended)
        out["pairs_per_step"].append(count)
        guarded_seconds.append(cpu(lambda: guarded_step(guarded, w.move_ids[s], w.move_boxes[s]))[0])
    fig["step"] = statistics.median(step_seconds) * 1e3
    fig["step_guarded"] = statistics.median(guarded_seconds) * 1e3
    fig["step_per_move"] = fig["step"] / w.moves * 1e3
    return fig, out


def guarded_step(broadphase, ids, boxes):
    """A step as dbvt_server's World takes it: the moved boxes copied out for an undo, and the update
    bounded by its default pair limit (dbvt_server.worlds), alternating with the plain step."""
    broadphase.move(ids, boxes, previous=np.empty_like(boxes))
    return broadphase.update(max_fat_pairs=GUARDED_FAT_PAIRS)


# The fat-pair bound of a world with the server's default pair limit (4 x 20,000,000).
GUARDED_FAT_PAIRS = 80_000_000


def check_pairs(expected: dict, out: dict, steps: int) -> list[tuple[str, bool, str]]:
    """(item, ok, detail) for the pair counts: after the first update and after every step."""
    checks = [("pairs at step 0 (begun of the first update)", out["pairs_step0"] == expected["pairs_step0"],
               f"{out['pairs_step0']} vs {expected['pairs_step0']}")]
    want = expected["pairs_per_step"][:steps]
    bad = [s for s, (got, exp) in enumerate(zip(out["pairs_per_step"], want)) if got != exp]
    checks.append((f"Broadphase pairs after each of {steps} steps", not bad and len(want) == steps,
                   f"first difference at step {bad[0]}: {out['pairs_per_step'][bad[0]]} vs {want[bad[0]]}"
                   if bad else f"last {out['pairs_per_step'][-1]}" if len(want) == steps
                   else f"expected.json covers only {len(want)} steps"))
    if "tree_pairs_after_steps" in out:
        checks.append((f"Tree.pairs() after {steps} updates", out["tree_pairs_after_steps"] == want[-1],
                       f"{out['tree_pairs_after_steps']} vs {want[-1]}"))
    return checks


def check_queries(expected: dict, out: dict) -> list[tuple[str, bool, str]]:
    """(item, ok, detail) for W1's query answers: total hits, and the hit lists of the first queries."""
    checks = []
    for key, name in (("query_aabb", "aabb"), ("raycast", "ray"), ("frustum", "frustum")):
        offsets, hits = out[key][0], out[key][1]
        checks.append((f"{name} total hits", len(hits) == expected[f"{name}_hits"],
                       f"{len(hits)} vs {expected[f'{name}_hits']}"))
        first = expected[f"{name}_first100"]
        # raycast hits come ordered by entry fraction; the oracle lists ids ascending
        got = [sorted(hits[offsets[i]:offsets[i + 1]].tolist()) for i in range(len(first))]
        bad = [i for i, (g, e) in enumerate(zip(got, first)) if g != e]
        checks.append((f"{name} hit lists of the first {len(first)} queries", not bad,
                       f"first difference at query {bad[0]}" if bad else "identical"))
    return checks


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fcl_run(w: workload.Workload, n_queries: int, steps: int, measure_memory: bool) -> tuple[dict, dict]:
    """python-fcl's DynamicAABBTreeCollisionManager on the same data (Python loops are unavoidable there)."""
    import fcl

    def box_objects(rows):
        lo, hi = rows[:, :3].astype(np.float64), rows[:, 3:].astype(np.float64)
        return [fcl.CollisionObject(fcl.Box(*side), fcl.Transform(centre))
                for side, centre in zip((hi - lo).tolist(), (lo + hi) / 2)]

    def collect(tree_object, query_object, found):
        found.append(tree_object)
        return False            # False: keep going, we want every candidate

    fig, out = {}, {}
    rss_before = rss_bytes()
    objects = box_objects(w.boxes)
    manager = fcl.DynamicAABBTreeCollisionManager()
    seconds, _ = cpu(lambda: (manager.registerObjects(objects), manager.setup()))
    fig["insert_bulk"] = seconds / w.n * 1e6
    if measure_memory:      # later runs reuse memory freed by the earlier ones, so only the first is meaningful
        out["memory_tree"] = (rss_bytes() - rss_before) / w.n

    queries = box_objects(w.q_aabb[:n_queries])

    def run_queries():
        counts = []
        for query in queries:
            found = []
            manager.collide(query, found, collect)
            counts.append(len(found))
        return counts
    seconds, out["query_counts"] = cpu(run_queries)
    fig["query_aabb"] = seconds / n_queries * 1e6

    update_seconds, step_seconds, out["pairs_per_step"] = 0.0, [], []
    for s in range(steps):
        moved = [objects[i] for i in w.move_ids[s].tolist()]
        centres = (w.move_boxes[s][:, :3].astype(np.float64) + w.move_boxes[s][:, 3:]) / 2

        def update():
            # setTranslation = setTransform for a pure translation, without building a Transform
            for obj, centre in zip(moved, centres):
                obj.setTranslation(centre)
            manager.update(moved)
        seconds, _ = cpu(update)
        pairs = []
        collide_seconds, _ = cpu(lambda: manager.collide(pairs, collect))
        update_seconds += seconds
        step_seconds.append(seconds + collide_seconds)
        out["pairs_per_step"].append(len(pairs))
    fig["update"] = update_seconds / (steps * w.moves) * 1e6
    fig["step"] = statistics.median(step_seconds) * 1e3
    return fig, out


def format_table(summary: dict, phases: dict) -> str:
    rows = [("phase", "unit", "dbvt median", "dbvt min", "fcl median", "fcl min", "speed-up", "target", "met")]
    for key, (label, unit, target) in phases.items():
        dbvt_median, dbvt_min = summary["dbvt"][key]["median"], summary["dbvt"][key]["min"]
        fcl = summary.get("fcl", {}).get(key)
        rows.append((label, unit, f"{dbvt_median:.3f}", f"{dbvt_min:.3f}",
                     f"{fcl['median']:.3f}" if fcl else "-", f"{fcl['min']:.3f}" if fcl else "-",
                     f"{fcl['median'] / dbvt_median:.1f}x" if fcl else "-",
                     "-" if target is None else f"<= {target:g}",
                     "-" if target is None else "yes" if dbvt_median <= target else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def summarise(runs: list[dict]) -> dict:
    return {key: {"median": statistics.median(run[key] for run in runs), "min": min(run[key] for run in runs),
                  "runs": [run[key] for run in runs]} for key in runs[0]}


def add_arguments(parser) -> None:
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    parser.add_argument("directory", nargs="?", type=Path,
                        help="a W1 or W2 directory (default: make W1 data with --n and --steps)")
    parser.add_argument("--n", type=workload.at_least(10), default=100_000, help="proxies of the W1 data made here [100000]")
    parser.add_argument("--steps", type=workload.at_least(1), default=20, help="steps to run (at most the directory's) [20]")
    parser.add_argument("--seed", type=int, default=workload.W1_SEED, help="seed of the W1 data made here")
    parser.add_argument("--repeat", type=workload.at_least(3), default=5,
                        help="runs per phase, at least 3: the issue's figures are medians of 3 or more [5]")
    parser.add_argument("--no-fcl", action="store_true", help="skip the python-fcl anchor")
    parser.add_argument("--json", type=Path, help="also write every figure and check here")


def run(args, facts: dict) -> int:
    with workload.w1_directory(args.directory, args.n, args.steps, args.seed) as directory:
        whole = workload.load(directory)
    w = whole.first(args.steps)
    print(f"{args.directory}: {w.describe()} (of {whole.steps} in the directory)" if args.directory
          else f"W1 made for this run: {w.describe()}")
    w1 = w.kind == "W1"

    dbvt_figures, checks = [], []
    for attempt in range(args.repeat):
        figures, results = dbvt_run(w) if w1 else broadphase_run(w, {}, {})
        dbvt_figures.append(figures)
        if attempt == 0 and w.expected is not None:
            checks = check_pairs(w.expected, results, w.steps) + (check_queries(w.expected, results) if w1 else [])
        print(f"dbvt run {attempt + 1}/{args.repeat}: step {figures['step']:.2f} ms"
              + (f", box query {figures['query_aabb']:.2f} us" if w1 else ""), flush=True)
    summary = {"dbvt": summarise(dbvt_figures)}

    if not w1:
        print("python-fcl: not run, it is the anchor on W1 only")
    elif not args.no_fcl and not fcl_installed():
        print("python-fcl: not installed, so no anchor beside dbvt (pip install 'dbvt-server[bench]')")
    elif not args.no_fcl:
        summary["fcl"] = fcl_anchor(w, results, args.repeat)

    dbvt_summary = summary["dbvt"]
    left = dbvt_summary.get("left_fat_box_fraction")
    print(("\n" if left is None else f"\nmoves that left their fat box in update (margin 0.05): {left['median']:.3f}; ")
          + f"Broadphase create + first update: {dbvt_summary['broadphase_setup_ms']['median']:.1f} ms (median)")
    print((f"targets are issue 2's, for W1 at N=100k (10k moves per step); CPU time, median of {args.repeat} runs; "
           "speed-up = fcl median / dbvt median (memory: how many times more fcl uses)\n") if w1 else
          f"no targets: issue 2 sets them on W1; CPU time, median of {args.repeat} runs\n")
    print(format_table(summary, PHASES if w1 else W2_PHASES))

    if w.expected is None:
        print("\nno expected.json: correctness not checked")
    else:
        print("\ncorrectness against expected.json:")
        for item, ok, detail in checks:
            print(f"  {'OK      ' if ok else 'MISMATCH'} {item}: {detail}")
    console.footer(facts)
    if args.json:
        args.json.write_text(json.dumps({**facts, "workload": w.meta, "n": w.n, "steps": w.steps,
                                         "repeat": args.repeat, "figures": summary,
                                         "checks": [{"item": i, "ok": ok, "detail": d} for i, ok, d in checks]},
                                        indent=1))
    return 0 if all(ok for _, ok, _ in checks) else 1


def fcl_installed() -> bool:
    return importlib.util.find_spec("fcl") is not None


def fcl_anchor(w: workload.Workload, results: dict, repeat: int) -> dict:
    """python-fcl's figures on W1, summarised over `repeat` runs, with how its answers compare."""
    n_queries, fcl_steps = min(FCL_QUERIES, len(w.q_aabb)), min(FCL_STEPS, w.steps)
    fcl_figures = []
    for attempt in range(repeat):
        figures, fcl_results = fcl_run(w, n_queries, fcl_steps, measure_memory=attempt == 0)
        fcl_figures.append(figures)
        if attempt == 0:
            fcl_memory = fcl_results["memory_tree"]
        print(f"fcl run {attempt + 1}/{repeat}: step {figures['step']:.2f} ms, "
              f"box query {figures['query_aabb']:.2f} us", flush=True)
    summary = summarise(fcl_figures)
    dbvt_counts = np.diff(results["query_aabb"][0])[:n_queries]
    print(f"fcl: register+setup of all {w.n} proxies; box query = collide(query object, callback "
          f"collecting candidates) on the first {n_queries} boxes, query objects built untimed; update and "
          f"step on the first {fcl_steps} steps (step = setTranslation + update(moved) + self collide with "
          f"the same callback); memory = RSS growth over objects + register + setup, first run only")
    print(f"fcl box-query hit counts equal dbvt's on those {n_queries} queries: "
          f"{np.array_equal(dbvt_counts, fcl_results['query_counts'])}; fcl pairs per step "
          f"{fcl_results['pairs_per_step']} vs dbvt {results['pairs_per_step'][:fcl_steps]}")
    summary["memory_tree"] = {"median": fcl_memory, "min": fcl_memory}
    return summary
