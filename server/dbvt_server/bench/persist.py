"""What keeping worlds on disk costs: the streamed step with a data directory, restarts, snapshots.

Three measures, all on W1 (DIRECTORY, or W1 data of --n proxies made first in a temporary
directory):

- step: three dbvt-server child processes side by side, without --data-dir, with --fsync everysec
  and with --fsync always, each run streaming W1's steps tick by tick on a new world, the servers in
  turn (rotated each run). A run's ratio is its median step with a data directory over the median
  step without, seconds apart; the mean step is reported too, since snapshots (when the journal
  outgrows the last one) make a few steps slower without moving the median.
- restart: a server with a data directory takes W1's creation and --journaled steps (W1's steps
  again and again), is killed with SIGKILL (so it restarts from its last snapshot and replays the
  journal after it) or stopped with SIGTERM (a snapshot, nothing to replay), and started again; the
  time from starting the process until its health service answers SERVING.
- snapshot: in this process, the time to take a world's image on its thread and to write it
  (temporary file, fsync, rename), and its size, for worlds of --n and of --snapshot-n proxies.
"""
from __future__ import annotations

import os
import re
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dbvt_client import Client
from dbvt_server.bench import console, workload
from dbvt_server.bench.console import Progress
from dbvt_server.bench.wire import LISTENING, fresh_world, start_server, tick_by_tick
from dbvt_server.bench.workload import Workload

REPLAYED = re.compile(r"(\d+) batches replayed from its journal")
SIDES = {"no data dir": [], "everysec": ["--fsync", "everysec"], "always": ["--fsync", "always"]}
STEP_TARGET = 1.10
RESTART_TARGET = 5.0


def step_run(client: Client, work: Workload, progress: Progress) -> tuple[float, float]:
    """The median and the mean streamed step, tick by tick, in seconds, on a new world."""
    world = fresh_world(client, "dbvt-bench-persist")
    world.apply(create=(work.ids, work.boxes))
    steps = [seconds for seconds, _ in tick_by_tick(world, work, progress)]
    client.delete_world(world.name)
    return statistics.median(steps), statistics.fmean(steps)


def steps_side_by_side(work: Workload, repeats: int, folder: pathlib.Path) -> dict[str, list[tuple[float, float]]]:
    servers = {}
    try:
        for name, flags in SIDES.items():
            data = ["--data-dir", str(folder / name)] if flags else []
            servers[name] = start_server(*data, *flags)
        clients = {name: Client(target) for name, (_, target) in servers.items()}
        runs: dict[str, list] = {name: [] for name in SIDES}
        names = list(SIDES)
        for attempt in range(repeats):
            for name in names[attempt % len(names):] + names[:attempt % len(names)]:
                progress = Progress(f"{name} run {attempt + 1}/{repeats}", work.steps)
                runs[name].append(step_run(clients[name], work, progress))
        for client in clients.values():
            client.close()
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(60)
    return runs


def _serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
    return answer.status == health_pb2.HealthCheckResponse.SERVING


def seconds_to_serving(data_dir: pathlib.Path) -> tuple[float, int]:
    """Start a server on `data_dir` and wait for SERVING; the seconds it took and the batches it
    replayed (the server is stopped)."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "dbvt_server", "--port", "0", "--data-dir", str(data_dir)],
                               stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    replayed = 0
    try:
        for line in process.stderr:
            if found := REPLAYED.search(line):
                replayed += int(found.group(1))
            found = LISTENING.search(line)
            if found:
                target = f"127.0.0.1:{found.group(1)}"
                break
        else:
            raise SystemExit("dbvt-server did not start on the data directory")
        while not _serving(target):
            time.sleep(0.01)
        return time.perf_counter() - started, replayed
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=120)


def restart_times(work: Workload, journaled: int, folder: pathlib.Path) -> dict[str, float]:
    times = {}
    for ending in ("SIGKILL", "SIGTERM"):
        data_dir = folder / f"restart-{ending}"
        process, target = start_server("--data-dir", str(data_dir))
        with Client(target) as client:
            world = client.create_world("restarted", dims=3)
            world.apply(create=(work.ids, work.boxes))
            progress = Progress(f"{journaled} journaled steps, then {ending}", journaled)
            with world.stream() as stream:
                for step in range(journaled):
                    stream.submit(move=(work.move_ids[step % work.steps], work.move_boxes[step % work.steps]))
                    progress.advance()
            journal = sum(path.stat().st_size for path in data_dir.glob("worlds/*/journal-*.log"))
        process.send_signal(getattr(signal, ending))
        process.communicate(timeout=120)
        times[ending], times[f"{ending} replayed"] = seconds_to_serving(data_dir)
        times[f"{ending} journal bytes"] = journal
    return times


def snapshot_figures(n: int, seed: int, folder: pathlib.Path) -> dict:
    """Taking and writing one snapshot of a W1 world of n proxies, in this process."""
    from dbvt_proto.v1 import broadphase_pb2 as pb
    from dbvt_server.persistence import Store
    from dbvt_server.service import Limits, Service

    boxes = workload.make_w1(n, 1, seed).boxes
    store = Store(str(folder / f"snapshot-{n}"), "no")
    store.open()
    try:
        service = Service(Limits(1, 2 * n, 2**31 - 1), store)
        service.create_world(pb.CreateWorldRequest(name="snapshotted", dims=3))
        world = service.world("snapshotted")
        world.apply(pb.Batch(create_ids=np.arange(n, dtype="<u8").tobytes(), create_boxes=boxes.tobytes()))
        # The creation's journal outgrew the first snapshot: let that one finish, and change the world
        # by one small batch, so that the snapshot timed here is taken anew.
        world.files.snapshot(world).result()
        world.apply(pb.Batch(move_ids=np.arange(1, dtype="<u8").tobytes(), move_boxes=boxes[:1].tobytes()))
        started = time.perf_counter()
        written = world.files.snapshot(world)
        taken = time.perf_counter() - started
        _, size = written.result()
        total = time.perf_counter() - started
    finally:
        store.close()
    return {"n": n, "take": taken, "write": total - taken, "bytes": size}


def report(work: Workload, runs: dict, restarts: dict, journaled: int, snapshots: list[dict]) -> list[str]:
    base = runs["no data dir"]
    lines = [f"W1: N={work.n}, {work.steps} steps of {work.moves} moves; {len(base)} runs of each side",
             f"{'streamed step, tick by tick':30}{'median ms':>10}{'mean ms':>9}{'ratio':>7}{'range':>12}{'mean ratio':>11}"]
    for name, side in runs.items():
        medians, means = [run[0] for run in side], [run[1] for run in side]
        ratios = [run[0] / b[0] for run, b in zip(side, base)]
        mean_ratios = [run[1] / b[1] for run, b in zip(side, base)]
        target = f"  <= {STEP_TARGET:.2f}" if name == "everysec" else ""
        lines.append(f"{name:30}{statistics.median(medians) * 1e3:10.2f}{statistics.median(means) * 1e3:9.2f}"
                     f"{statistics.median(ratios):7.2f}{f'{min(ratios):.2f}-{max(ratios):.2f}':>12}"
                     f"{statistics.median(mean_ratios):11.2f}{target}")
    lines.append(f"restart to SERVING, {work.n} proxies, {journaled} journaled steps (target <= {RESTART_TARGET:.0f} s):")
    for ending in ("SIGKILL", "SIGTERM"):
        lines.append(f"  after {ending}: {restarts[ending]:.2f} s, {restarts[f'{ending} replayed']} batches replayed "
                     f"(journal on disk before: {restarts[f'{ending} journal bytes'] / 1e6:.1f} MB)")
    lines.append(f"{'snapshot of W1':30}{'take ms':>10}{'write ms':>10}{'MB':>8}")
    for figure in snapshots:
        lines.append(f"{figure['n']:>12,} proxies{'':11}{figure['take'] * 1e3:10.1f}{figure['write'] * 1e3:10.1f}"
                     f"{figure['bytes'] / 1e6:8.1f}")
    return lines


def add_arguments(parser) -> None:
    workload.add_w1_arguments(parser, __doc__)
    parser.add_argument("--repeats", type=workload.at_least(1), default=5, help="runs of each side [5]")
    parser.add_argument("--journaled", type=workload.at_least(1), default=1000,
                        help="steps journaled before the restart [1000]")
    parser.add_argument("--snapshot-n", type=workload.at_least(10), default=1_000_000,
                        help="proxies of the larger snapshotted world [1000000]")


def run(args, facts: dict) -> int:
    work = workload.w1_for(args, "persist")
    with tempfile.TemporaryDirectory(prefix="dbvt-bench-persist-", dir=os.environ.get("TMPDIR")) as folder:
        folder = pathlib.Path(folder)
        runs = steps_side_by_side(work, args.repeats, folder)
        restarts = restart_times(work, args.journaled, folder)
        snapshots = [snapshot_figures(n, args.seed, folder) for n in (work.n, args.snapshot_n)]
    print("\n".join(report(work, runs, restarts, args.journaled, snapshots)))
    console.footer(facts)
    return 0
