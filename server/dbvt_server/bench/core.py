#!/usr/bin/env python3
"""Core benchmark: dbvt.Tree and dbvt.Broadphase on a W1 directory, python-fcl beside it (issue 2).

    python bench/bench_core.py W1_DIR [--repeat 5] [--steps 20] [--no-fcl] [--json OUT]

W1_DIR holds raw little-endian arrays and meta.json (boxes.f32 N x 6, moves_ids.u32 S x M,
moves_box.f32 S x M x 6, q_aabb.f32 Q x 6, q_ray.f32 R x 6, q_frustum.f32 F x 24 = six planes
(nx, ny, nz, d)) and optionally expected.json, the brute-force answers; every answer present there is
checked and a mismatch makes the exit status 1. Every phase is CPU time (time.process_time) of whole
batch calls, repeated --repeat times; the MEDIAN over runs is the figure the issue's targets apply to,
the MIN (fastest run) is printed beside it because the machine is shared.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

# numpy's OpenBLAS threads spin on the other core after start-up and bill this process's CPU time;
# the benchmark does no linear algebra, so one thread is right (before numpy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import dbvt  # noqa: E402

# phase key -> (label, unit, issue target at N=100k, or None). The memory target is set against
# Bullet's btDbvt and python-fcl's tree manager: a tree with its proxy records. `Tree` is that; a
# `Broadphase` also keeps its pair lists, as Bullet's separate pair cache would, and is shown beside it.
PHASES = {
    "insert_bulk": ("insert bulk", "us/proxy", 0.25),
    "insert_incremental": ("insert one at a time", "us/proxy", 0.75),
    "query_aabb": ("box query", "us/query", 3.0),
    "raycast": ("segment, all hits", "us/query", 4.0),
    "frustum": ("frustum (6 planes)", "us/query", 85.0),
    "update": ("update per moved proxy", "us/move", 0.75),
    "step": ("Broadphase step", "ms/step", 10.0),
    "memory_tree": ("memory, Tree", "bytes/proxy", 128.0),
    "memory_broadphase": ("memory, Broadphase + pairs", "bytes/proxy", None),
}
FCL_QUERIES = 2000      # python-fcl answers through a Python callback per hit: a subset keeps runs short
FCL_STEPS = 5


def load_w1(directory: Path) -> SimpleNamespace:
    meta = json.loads((directory / "meta.json").read_text())
    n, steps, moves = meta["n"], meta["steps"], meta["moves_per_step"]

    def raw(name, dtype, shape):
        values = np.fromfile(directory / name, dtype)
        if values.size != int(np.prod(shape)):
            sys.exit(f"{directory / name}: {values.size} values, meta.json implies shape {shape}")
        # the API takes native float32 / uint64 arrays; convert once here so no timed call pays for it
        return np.ascontiguousarray(values.reshape(shape), dtype=np.uint64 if dtype == "<u4" else np.float32)

    expected_path = directory / "expected.json"
    return SimpleNamespace(
        meta=meta, n=n, moves=moves,
        ids=np.arange(n, dtype=np.uint64),
        boxes=raw("boxes.f32", "<f4", (n, 6)),
        move_ids=raw("moves_ids.u32", "<u4", (steps, moves)),
        move_boxes=raw("moves_box.f32", "<f4", (steps, moves, 6)),
        q_aabb=raw("q_aabb.f32", "<f4", (meta["n_aabb"], 6)),
        q_ray=raw("q_ray.f32", "<f4", (meta["n_ray"], 6)),
        q_frustum=raw("q_frustum.f32", "<f4", (meta["n_frustum"], 6, 4)),
        expected=json.loads(expected_path.read_text()) if expected_path.exists() else None,
    )


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


def dbvt_run(w: SimpleNamespace, steps: int) -> tuple[dict, dict]:
    """One run of every dbvt phase: (figures, results kept for the correctness checks)."""
    n, moves, fig, out = w.n, w.moves, {}, {}
    tree = dbvt.Tree()
    seconds, _ = cpu(lambda: tree.insert(w.ids, w.boxes))
    fig["insert_bulk"] = seconds / n * 1e6
    fig["memory_tree"] = tree.stats()["memory_bytes"] / n
    for key, batch, call in (("query_aabb", w.q_aabb, tree.query_aabb), ("raycast", w.q_ray, tree.raycast),
                             ("frustum", w.q_frustum, tree.query_frustum)):
        seconds, out[key] = cpu(lambda: call(batch))
        fig[key] = seconds / len(batch) * 1e6

    incremental = dbvt.Tree()
    incremental.insert(w.ids[:1], w.boxes[:1])      # not empty, so the batch below takes the SAH insert path
    seconds, _ = cpu(lambda: incremental.insert(w.ids[1:], w.boxes[1:]))
    fig["insert_incremental"] = seconds / (n - 1) * 1e6

    moving = dbvt.Tree(margin=0.05)
    moving.insert(w.ids, w.boxes)
    seconds, left = cpu(lambda: sum(moving.update(w.move_ids[s], w.move_boxes[s]) for s in range(steps)))
    fig["update"] = seconds / (steps * moves) * 1e6
    fig["left_fat_box_fraction"] = left / (steps * moves)
    out["tree_pairs_after_steps"] = len(moving.pairs())

    broadphase = dbvt.Broadphase()
    seconds, (begun, _) = cpu(lambda: (broadphase.create(w.ids, w.boxes), broadphase.update())[1])
    fig["broadphase_setup_ms"] = seconds * 1e3
    # after the first update, so the per-proxy pair lists a live broadphase carries are counted
    fig["memory_broadphase"] = broadphase.stats()["memory_bytes"] / n
    out["pairs_step0"], count, step_seconds, out["pairs_per_step"] = len(begun), len(begun), [], []
    for s in range(steps):
        seconds, (begun, ended) = cpu(lambda: (broadphase.move(w.move_ids[s], w.move_boxes[s]),
                                               broadphase.update())[1])
        step_seconds.append(seconds)
        count += len(begun) - len(ended)
        out["pairs_per_step"].append(count)
    fig["step"] = statistics.median(step_seconds) * 1e3
    return fig, out


def check_dbvt(expected: dict, out: dict, steps: int) -> list[tuple[str, bool, str]]:
    """(item, ok, detail) for every answer expected.json holds."""
    checks = [("pairs at step 0 (begun of the first update)", out["pairs_step0"] == expected["pairs_step0"],
               f"{out['pairs_step0']} vs {expected['pairs_step0']}")]
    want = expected["pairs_per_step"][:steps]
    bad = [s for s, (got, exp) in enumerate(zip(out["pairs_per_step"], want)) if got != exp]
    checks.append((f"Broadphase pairs after each of {steps} steps", not bad,
                   f"first difference at step {bad[0]}: {out['pairs_per_step'][bad[0]]} vs {want[bad[0]]}"
                   if bad else f"last {out['pairs_per_step'][-1]}"))
    checks.append((f"Tree.pairs() after {steps} updates", out["tree_pairs_after_steps"] == want[-1],
                   f"{out['tree_pairs_after_steps']} vs {want[-1]}"))
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


def fcl_run(w: SimpleNamespace, n_queries: int, steps: int, measure_memory: bool) -> tuple[dict, dict]:
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


def machine_facts() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    field = lambda name: [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith(name)]
    models, speeds = field("model name"), field("cpu MHz")
    return {"cpu": f"{models[0] if models else platform.processor()} x {len(models) or os.cpu_count()}"
                   + (f" at {speeds[0]} MHz" if speeds else ""),
            "python": platform.python_version(), "numpy": np.__version__, "dbvt": dbvt.__version__}


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def format_table(summary: dict) -> str:
    rows = [("phase", "unit", "dbvt median", "dbvt min", "fcl median", "fcl min", "speed-up", "target", "met")]
    for key, (label, unit, target) in PHASES.items():
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("w1_dir", type=Path, help="directory written by W1's workload.py")
    parser.add_argument("--repeat", type=int, default=5, help="runs per phase, at least 3 (default 5)")
    parser.add_argument("--steps", type=int, default=20, help="W1 steps for update and Broadphase (default 20)")
    parser.add_argument("--no-fcl", action="store_true", help="skip the python-fcl anchor")
    parser.add_argument("--json", type=Path, help="also write every figure and check here")
    args = parser.parse_args(argv)
    if args.repeat < 3:
        parser.error("--repeat must be at least 3 (the issue's figures are medians of >= 3 runs)")

    load_start = load_average()
    w = load_w1(args.w1_dir)
    steps = max(1, min(args.steps, w.meta["steps"]))
    print(f"W1 {args.w1_dir}: N={w.n}, {w.moves} moves/step, {steps} of {w.meta['steps']} steps, "
          f"{len(w.q_aabb)} boxes, {len(w.q_ray)} segments, {len(w.q_frustum)} frusta")

    dbvt_figures, checks = [], []
    for run in range(args.repeat):
        figures, results = dbvt_run(w, steps)
        dbvt_figures.append(figures)
        if run == 0 and w.expected is not None:
            checks = check_dbvt(w.expected, results, steps)
        print(f"dbvt run {run + 1}/{args.repeat}: step {figures['step']:.2f} ms, "
              f"box query {figures['query_aabb']:.2f} us", flush=True)
    summary = {"dbvt": summarise(dbvt_figures)}

    if not args.no_fcl:
        n_queries, fcl_steps = min(FCL_QUERIES, len(w.q_aabb)), min(FCL_STEPS, steps)
        fcl_figures = []
        for run in range(args.repeat):
            figures, fcl_results = fcl_run(w, n_queries, fcl_steps, measure_memory=run == 0)
            fcl_figures.append(figures)
            if run == 0:
                fcl_memory = fcl_results["memory_tree"]
            print(f"fcl run {run + 1}/{args.repeat}: step {figures['step']:.2f} ms, "
                  f"box query {figures['query_aabb']:.2f} us", flush=True)
        summary["fcl"] = summarise(fcl_figures)
        dbvt_counts = np.diff(results["query_aabb"][0])[:n_queries]
        print(f"fcl: register+setup of all {w.n} proxies; box query = collide(query object, callback "
              f"collecting candidates) on the first {n_queries} boxes, query objects built untimed; update and "
              f"step on the first {fcl_steps} steps (step = setTranslation + update(moved) + self collide with "
              f"the same callback); memory = RSS growth over objects + register + setup, first run only")
        print(f"fcl box-query hit counts equal dbvt's on those {n_queries} queries: "
              f"{np.array_equal(dbvt_counts, fcl_results['query_counts'])}; fcl pairs per step "
              f"{fcl_results['pairs_per_step']} vs dbvt {results['pairs_per_step'][:fcl_steps]}")
        summary["fcl"]["memory_tree"] = {"median": fcl_memory, "min": fcl_memory}

    dbvt_summary = summary["dbvt"]
    print(f"\nmoves that left their fat box in update (margin 0.05): {dbvt_summary['left_fat_box_fraction']['median']:.3f}; "
          f"Broadphase create + first update: {dbvt_summary['broadphase_setup_ms']['median']:.1f} ms (median)")
    print(f"targets are issue 2's, for N=100k (10k moves per step); CPU time, median of {args.repeat} runs; "
          f"speed-up = fcl median / dbvt median (memory: how many times more fcl uses)\n")
    print(format_table(summary))

    if w.expected is None:
        print("\nno expected.json: correctness not checked")
    else:
        print("\ncorrectness against expected.json:")
        for item, ok, detail in checks:
            print(f"  {'OK      ' if ok else 'MISMATCH'} {item}: {detail}")

    facts = machine_facts()
    load_end = load_average()
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    print(f"\ncommand: {command}\nmachine: {facts['cpu']}; python {facts['python']}, numpy {facts['numpy']}, "
          f"dbvt {facts['dbvt']}\nload average (1/5/15 min): start {load_start}, end {load_end}")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "machine": facts, "load_start": load_start,
                                         "load_end": load_end, "n": w.n, "steps": steps, "repeat": args.repeat,
                                         "figures": summary,
                                         "checks": [{"item": i, "ok": ok, "detail": d} for i, ok, d in checks]},
                                        indent=1))
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
