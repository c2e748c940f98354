"""What spreading worlds over replicas costs: a routed call beside a direct one, and a rebalance.

Four dbvt-server child processes on 127.0.0.1: three that know each other (--peers, --advertise),
and a fourth that knows all four, as when a replica joins.

- call: a world on each of the three; the same small calls (`info()`, and a query of one box) made
  through a Client of the world's owner alone and through a Client of the three (which hashes the
  world's name to find the owner), alternating call by call, --calls of each per world. The routed
  client's cost is the median of the per-pair differences.
- rebalance: --worlds worlds of --proxies proxies each made on the three, then `rebalance` (what
  `dbvt-admin rebalance` runs) moves those the fourth now owns: proxies moved a second. Beside it,
  the floor: the same worlds only exported and imported, with no freeze or finish, alternating run
  by run.
"""
from __future__ import annotations

import argparse
import io
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from dbvt_client import Client
from dbvt_client.routing import owner
from dbvt_server.bench import console, workload
from dbvt_server.bench.wire import LISTENING
from dbvt_server.rebalance import rebalance

CALL_TARGET_US = 20.0


def free_ports(count: int) -> list[int]:
    probes = [socket.socket() for _ in range(count)]
    for probe in probes:
        probe.bind(("127.0.0.1", 0))
    ports = [probe.getsockname()[1] for probe in probes]
    for probe in probes:
        probe.close()
    return ports


def start(target: str, peers: list[str]) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "dbvt_server", "--host", "127.0.0.1", "--port",
                                target.rpartition(":")[2], "--peers", ",".join(peers), "--advertise", target],
                               stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    for line in process.stderr:
        if LISTENING.search(line):
            return process
    raise SystemExit(f"dbvt-server did not start on {target}")


def boxes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """W1's recipe: sides 1 to 4 in a cube of side 5 n^(1/3)."""
    centres = rng.uniform(0, 5 * n ** (1 / 3), size=(n, 3))
    half = rng.uniform(0.5, 2.0, size=(n, 3))
    return np.arange(1, n + 1, dtype=np.uint64), np.concatenate([centres - half, centres + half], 1).astype(np.float32)


def call_costs(old: list[str], args) -> list[float]:
    """Per-call (routed - direct) in microseconds, over every pair of calls."""
    names = [next(f"routed-{i}" for i in range(1000) if owner(f"routed-{i}", old) == target) for target in old]
    probe = np.array([[0, 0, 0, 10, 10, 10]], np.float32)
    differences = []
    with Client(old) as routed:
        directs = {target: Client(target) for target in old}
        for name in names:
            routed.create_world(name).apply(create=boxes(np.random.default_rng(1), 1000))
        for name in names:
            direct, via = directs[owner(name, old)].world(name), routed.world(name)
            for call in range(args.calls):
                timed = []
                for world in ((direct, via) if call % 2 == 0 else (via, direct)):
                    started = time.perf_counter()
                    world.info()
                    world.query_aabb(probe)
                    timed.append((world is via, time.perf_counter() - started))
                routed_s = next(seconds for is_routed, seconds in timed if is_routed)
                direct_s = next(seconds for is_routed, seconds in timed if not is_routed)
                differences.append((routed_s - direct_s) / 2 * 1e6)      # two calls a pair
        for name in names:
            routed.delete_world(name)
        for client in directs.values():
            client.close()
    return differences


def make_worlds(old: list[str], args, run: int) -> list[str]:
    names = [f"rebalance-{run}-{i}" for i in range(args.worlds)]
    rng = np.random.default_rng(run)
    with Client(old) as routed:
        for name in names:
            routed.create_world(name).apply(create=boxes(rng, args.proxies))
    return names


def copy_only(old: list[str], new: str, names: list[str]) -> float:
    """The floor: export from each world's owner and import on the fourth, timed; then cleaned up."""
    moving = [name for name in names if owner(name, [*old, new]) == new]
    with Client(new) as there:
        started = time.perf_counter()
        for name in moving:
            with Client(owner(name, old)) as source:
                image = io.BytesIO()
                source.world(name).export(image)
                image.seek(0)
                there.import_world(name, image)
        seconds = time.perf_counter() - started
        for name in moving:
            there.delete_world(name)
    return seconds


def add_arguments(parser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--calls", type=workload.at_least(10), default=2000, help="pairs of calls per world [2000]")
    parser.add_argument("--worlds", type=workload.at_least(1), default=24, help="worlds made for the rebalance [24]")
    parser.add_argument("--proxies", type=workload.at_least(1), default=20_000, help="proxies per world [20000]")
    parser.add_argument("--repeats", type=workload.at_least(1), default=3, help="runs of the rebalance [3]")


def run(args, facts: dict) -> int:
    targets = [f"127.0.0.1:{port}" for port in free_ports(4)]
    old, new = targets[:3], targets[3]
    processes = [start(target, targets if target == new else old) for target in targets]
    try:
        costs = call_costs(old, args)
        rates, floors = [], []
        for attempt in range(args.repeats):
            for kind in (("rebalance", "floor") if attempt % 2 == 0 else ("floor", "rebalance")):
                names = make_worlds(old, args, 2 * attempt + (kind == "floor"))
                moved = sum(owner(name, targets) == new for name in names) * args.proxies
                if kind == "floor":
                    floors.append(moved / copy_only(old, new, names))
                    with Client(old) as routed:
                        for name in names:
                            routed.delete_world(name)
                    continue
                report = rebalance(targets, Client, say=lambda line: None)
                rates.append(report.proxies / report.seconds)
                with Client(targets) as routed:
                    for name in names:
                        routed.delete_world(name)
    finally:
        for process in processes:
            process.terminate()
            process.wait(60)
    print("\n".join(report_lines(args, costs, rates, floors)))
    console.footer(facts)
    return 0


def report_lines(args, costs: list[float], rates: list[float], floors: list[float]) -> list[str]:
    return [
        f"routed call beyond a direct one (info() and a one-box query, {len(costs)} pairs): median "
        f"{statistics.median(costs):.1f} us (25th-75th percentile {np.percentile(costs, 25):.1f} to "
        f"{np.percentile(costs, 75):.1f} us)  target <= {CALL_TARGET_US:.0f} us",
        f"rebalance of {args.worlds} worlds of {args.proxies} proxies onto a fourth server: median "
        f"{statistics.median(rates):,.0f} proxies/s moved (range {min(rates):,.0f}-{max(rates):,.0f}; {args.repeats} runs)",
        f"export and import alone (the floor): median {statistics.median(floors):,.0f} proxies/s "
        f"(range {min(floors):,.0f}-{max(floors):,.0f}); rebalance / floor "
        + (f"{statistics.median(rates) / statistics.median(floors):.2f}" if statistics.median(floors) else "n/a")
        + ("" if statistics.median(rates) else " (no world changed owner: give more --worlds)"),
    ]
