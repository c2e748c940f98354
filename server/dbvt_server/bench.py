"""dbvt-bench: W1 streamed through a dbvt-server, against the in-process dbvt.Broadphase on the same data.

    dbvt-bench [W1_DIR] [--target HOST:PORT [--server-pid PID]] [--repeats 3]

W1_DIR is a directory made by the shared W1 workload script (boxes.f32, moves_ids.u32, moves_box.f32,
q_aabb.f32, meta.json; expected.json, if present, is checked); without one a W1-like world of --n
proxies is generated here. Without --target a server is started as a child process. Figures are
medians of --repeats runs; the server and this client are separate processes talking over loopback.
Move-only ingest streams every step's moves again, pipelined, to a pair-tracking world and to a
query-only one (track_pairs=False), each of which has seen every step once before. The two-busy-worlds figures are described in dbvt_server.bench_parallel.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from dbvt_client import Client
from dbvt_server import bench_parallel

LISTENING = re.compile(r"listening on \S+:(\d+)")


class Workload:
    def __init__(self, boxes, move_ids, move_boxes, queries, expected=None):
        self.boxes = boxes
        self.move_ids = move_ids
        self.move_boxes = move_boxes
        self.queries = queries
        self.expected = expected
        self.ids = np.arange(len(boxes), dtype=np.uint64)

    @property
    def steps(self) -> int:
        return len(self.move_ids)

    @classmethod
    def load(cls, directory: pathlib.Path) -> "Workload":
        meta = json.loads((directory / "meta.json").read_text())
        boxes = np.fromfile(directory / "boxes.f32", "<f4").reshape(-1, 6)
        move_ids = np.fromfile(directory / "moves_ids.u32", "<u4").reshape(meta["steps"], -1).astype(np.uint64)
        move_boxes = np.fromfile(directory / "moves_box.f32", "<f4").reshape(meta["steps"], -1, 6)
        queries = np.fromfile(directory / "q_aabb.f32", "<f4").reshape(-1, 6)
        expected_file = directory / "expected.json"
        expected = json.loads(expected_file.read_text()) if expected_file.exists() else None
        return cls(boxes, move_ids, move_boxes, queries, expected)

    @classmethod
    def generate(cls, n: int, steps: int, seed: int = 1) -> "Workload":
        """The W1 recipe: side 5 n^(1/3), box sides 1..4, a tenth moving per step at <= 0.5, bouncing."""
        rng = np.random.default_rng(seed)
        side = 5.0 * n ** (1 / 3)
        half = rng.uniform(0.5, 2.0, (n, 3))
        centers = rng.uniform(0, side, (n, 3))
        velocity = rng.normal(size=(n, 3))
        velocity *= rng.uniform(0, 0.5, (n, 1)) / np.linalg.norm(velocity, axis=1, keepdims=True)
        boxes = np.concatenate([centers - half, centers + half], 1).astype(np.float32)
        move_ids, move_boxes = [], []
        for _ in range(steps):
            rows = np.sort(rng.choice(n, n // 10, replace=False))
            moved = centers[rows] + velocity[rows]
            velocity[rows] = np.where((moved < 0) | (moved > side), -velocity[rows], velocity[rows])
            centers[rows] = np.clip(moved, 0, side)
            move_ids.append(rows.astype(np.uint64))
            move_boxes.append(np.concatenate([centers[rows] - half[rows], centers[rows] + half[rows]], 1))
        queries = rng.uniform(0, side, (10_000, 3))
        queries = np.concatenate([queries - 5.0, queries + 5.0], 1).astype(np.float32)
        return cls(boxes, np.array(move_ids), np.array(move_boxes, np.float32), queries)


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done = label, total, 0

    def advance(self) -> None:
        self.done += 1
        filled = 30 * self.done // max(self.total, 1)
        sys.stderr.write(f"\r{self.label:<28} [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def start_server() -> tuple[subprocess.Popen, str]:
    # Started outside the working directory, which may be a source tree with an unbuilt `dbvt/`.
    process = subprocess.Popen([sys.executable, "-m", "dbvt_server", "--host", "127.0.0.1", "--port", "0"],
                               stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    for line in process.stderr:
        found = LISTENING.search(line)
        if found:
            return process, f"127.0.0.1:{found.group(1)}"
    raise SystemExit("dbvt-server did not start")


def _fresh_world(client: Client, name: str, track_pairs: bool = True):
    if name in client.list_worlds():
        client.delete_world(name)
    return client.create_world(name, dims=3, margin=0.05, track_pairs=track_pairs)


# A pass of the ingest takes about 0.1 s at W1's 100k: each run times this many, keeping the median.
INGEST_PASSES = 3


def pipelined_ingest(stream, work: Workload, passes: int = 1) -> float:
    """Seconds to send every step's moves, pipelined, and collect the answers at the end; the median
    of `passes` passes, one after another."""
    seconds = []
    for _ in range(passes):
        started = time.perf_counter()
        pending = [stream.submit(move=(work.move_ids[step], work.move_boxes[step])) for step in range(work.steps)]
        for future in pending:
            future.result()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def wire_run(client: Client, work: Workload, progress: Progress) -> dict:
    """One pass over the workload through the server: creation, streamed steps, queries, ingest."""
    name = "dbvt-bench"
    world = _fresh_world(client, name)
    started = time.perf_counter()
    pairs = len(world.apply(create=(work.ids, work.boxes)).begun)
    create_seconds = time.perf_counter() - started
    step_seconds, pair_counts = [], []
    with world.stream() as stream:
        for step in range(work.steps):
            started = time.perf_counter()
            result = stream.apply(move=(work.move_ids[step], work.move_boxes[step]))
            step_seconds.append(time.perf_counter() - started)
            pairs += len(result.begun) - len(result.ended)
            pair_counts.append(pairs)
            progress.advance()
        ingest_seconds = pipelined_ingest(stream, work, INGEST_PASSES)
    started = time.perf_counter()
    world.query_aabb(work.queries)
    query_seconds = time.perf_counter() - started
    client.delete_world(name)
    quiet = _fresh_world(client, name + "-query-only", track_pairs=False)
    quiet.apply(create=(work.ids, work.boxes))
    with quiet.stream() as stream:
        pipelined_ingest(stream, work)      # the history the pair-tracking world had, untimed
        quiet_ingest_seconds = pipelined_ingest(stream, work, INGEST_PASSES)
    client.delete_world(quiet.name)
    return dict(create=create_seconds, step=statistics.median(step_seconds), ingest=ingest_seconds,
                quiet_ingest=quiet_ingest_seconds, query=query_seconds, pair_counts=pair_counts)


def local_run(work: Workload, progress: Progress) -> dict:
    """The same pass on an in-process dbvt.Broadphase."""
    from dbvt import Broadphase

    broadphase = Broadphase(dims=3, margin=0.05)
    started = time.perf_counter()
    broadphase.create(work.ids, work.boxes)
    broadphase.update()
    create_seconds = time.perf_counter() - started
    step_seconds = []
    for step in range(work.steps):
        started = time.perf_counter()
        broadphase.move(work.move_ids[step], work.move_boxes[step])
        broadphase.update()
        step_seconds.append(time.perf_counter() - started)
        progress.advance()
    ingest_seconds = local_ingest(broadphase, work, INGEST_PASSES)
    started = time.perf_counter()
    broadphase.query_aabb(work.queries)
    query_seconds = time.perf_counter() - started
    quiet = Broadphase(dims=3, margin=0.05, track_pairs=False)
    quiet.create(work.ids, work.boxes)
    quiet.update()
    local_ingest(quiet, work)
    return dict(create=create_seconds, step=statistics.median(step_seconds), ingest=ingest_seconds,
                quiet_ingest=local_ingest(quiet, work, INGEST_PASSES), query=query_seconds)


def local_ingest(broadphase, work: Workload, passes: int = 1) -> float:
    """The calls a server makes for the ingest's batches, timed as pipelined_ingest() is."""
    seconds = []
    for _ in range(passes):
        started = time.perf_counter()
        for step in range(work.steps):
            broadphase.move(work.move_ids[step], work.move_boxes[step])
            broadphase.update()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def report(work: Workload, wire: list[dict], local: list[dict]) -> list[str]:
    n, moves = len(work.ids), work.move_ids.shape[1]
    total_moves = moves * work.steps
    step_wire, step_local = median_of(wire, "step"), median_of(local, "step")
    query_wire, query_local = median_of(wire, "query"), median_of(local, "query")
    lines = [
        f"W1: N={n}, {work.steps} steps of {moves} moves, {len(work.queries)} box queries; "
        f"medians of {len(wire)} runs",
        f"{'':34}{'server (wire)':>16}{'in-process':>14}{'ratio':>8}  target",
        f"{'create all, ms':34}{median_of(wire, 'create') * 1e3:16.1f}{median_of(local, 'create') * 1e3:14.1f}"
        f"{median_of(wire, 'create') / median_of(local, 'create'):8.2f}",
        f"{'streamed step (moves + pairs), ms':34}{step_wire * 1e3:16.2f}{step_local * 1e3:14.2f}"
        f"{step_wire / step_local:8.2f}  <= 1.5x",
    ]
    for key, kind in (("ingest", "pair-tracking"), ("quiet_ingest", "query-only")):
        ingest_wire, ingest_local = median_of(wire, key), median_of(local, key)
        lines.append(f"{f'move-only ingest, {kind}, M/s':34}{total_moves / ingest_wire / 1e6:16.2f}"
                     f"{total_moves / ingest_local / 1e6:14.2f}{ingest_wire / ingest_local:8.2f}  >= 3 M/s")
    lines.append(f"{'10k box queries in one call, ms':34}{query_wire * 1e3:16.2f}{query_local * 1e3:14.2f}"
                 f"{query_wire / query_local:8.2f}  <= 1.5x")
    if work.expected is not None:
        expected = work.expected["pairs_per_step"][:work.steps]
        same = all(run["pair_counts"] == expected for run in wire)
        lines.append(f"pair counts after every step {'match' if same else 'DIFFER FROM'} the oracle's expected.json")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dbvt-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("w1_dir", nargs="?", type=pathlib.Path, help="a W1 directory (default: generate one)")
    parser.add_argument("--target", help="HOST:PORT of a running dbvt-server (default: start one)")
    parser.add_argument("--server-pid", type=int,
                        help="process id of the --target server, if on this machine: its CPU use is then shown")
    parser.add_argument("--n", type=int, default=100_000, help="proxies of the generated world [100000]")
    parser.add_argument("--steps", type=int, default=30, help="steps to run (at most the directory's) [30]")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side; medians are reported [3]")
    args = parser.parse_args(argv)
    if args.w1_dir:
        work = Workload.load(args.w1_dir)
        work.move_ids, work.move_boxes = work.move_ids[:args.steps], work.move_boxes[:args.steps]
    else:
        work = Workload.generate(args.n, args.steps)
    process, target = (None, args.target) if args.target else start_server()
    server_pid = args.server_pid if process is None else process.pid
    try:
        with Client(target) as client:
            wire, local = [], []
            for run in range(args.repeats):
                wire.append(wire_run(client, work, Progress(f"server run {run + 1}/{args.repeats}", work.steps)))
                local.append(local_run(work, Progress(f"in-process run {run + 1}/{args.repeats}", work.steps)))
            sys.stderr.write("two busy worlds...\n")
            parallel_wire = bench_parallel.over_the_wire(client, target, work, server_pid, args.repeats)
        parallel_local = bench_parallel.in_process(work, args.repeats)
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
    print("\n".join(report(work, wire, local) + bench_parallel.report(parallel_wire, parallel_local)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
