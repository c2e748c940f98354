"""`dbvt-bench secured`: what TLS and a token cost, against plaintext in the same run.

Two dbvt-server child processes run side by side: one in plaintext without tokens, one with TLS
(a throwaway CA and certificate, made with trustme) and a token file. Each run takes W1 through
both, in turn (alternately first), each time on a new world: its steps streamed tick by tick (the
median step), then one call of all W1's box queries (the median of a few calls). A run's ratio is
its secured figure over its plaintext one; the sides run seconds apart, so the ratio cancels most of
the machine's drift. DIRECTORY is a W1 directory; without one, W1 data of --n proxies and --steps
steps is made first, in a temporary directory.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile
import time

from dbvt_client import Client
from dbvt_server.bench import console, workload
from dbvt_server.bench.console import Progress
from dbvt_server.bench.wire import fresh_world, median_call, start_server
from dbvt_server.bench.workload import Workload
from dbvt_server.tokens import new_token

TARGET = 1.10
SIDES = ("plaintext", "secured")


def secured_flags(folder: pathlib.Path) -> tuple[list[str], bytes, str]:
    """Server flags for TLS and a token file in `folder`, the CA a client must trust, and the token."""
    # In the bench and test extras only: the other benchmarks run without it.
    import trustme

    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1")
    cert, key, tokens = folder / "server.pem", folder / "server-key.pem", folder / "tokens.txt"
    cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(key))
    token, line = new_token("bench", "admin", "*")
    tokens.write_text(line + "\n")
    return ["--tls-cert", str(cert), "--tls-key", str(key), "--tokens", str(tokens)], authority.cert_pem.bytes(), token


def side_run(client: Client, work: Workload, progress: Progress) -> dict:
    """The median streamed step, tick by tick, and the median call of every box query, in seconds."""
    world = fresh_world(client, "dbvt-bench-secured")
    world.apply(create=(work.ids, work.boxes))
    steps = []
    with world.stream() as stream:
        for step in range(work.steps):
            started = time.perf_counter()
            stream.apply(move=(work.move_ids[step], work.move_boxes[step]))
            steps.append(time.perf_counter() - started)
            progress.advance()
    query = median_call(lambda: world.query_aabb(work.q_aabb))
    client.delete_world(world.name)
    return dict(step=statistics.median(steps), query=query)


def report(work: Workload, runs: dict[str, list[dict]]) -> list[str]:
    lines = [f"W1: N={len(work.ids)}, {work.steps} steps of {work.move_ids.shape[1]} moves, "
             f"{len(work.q_aabb)} box queries; {len(runs['plaintext'])} paired runs",
             f"{'':34}{'plaintext':>11}{'TLS+token':>11}{'ratio':>8}{'range':>14}  target"]
    for label, key in (("streamed step, tick by tick, ms", "step"),
                       (f"{len(work.q_aabb) // 1000}k box queries in one call, ms", "query")):
        plain, secured = ([run[key] for run in runs[side]] for side in SIDES)
        ratios = [s / p for s, p in zip(secured, plain)]
        lines.append(f"{label:34}{statistics.median(plain) * 1e3:11.2f}{statistics.median(secured) * 1e3:11.2f}"
                     f"{statistics.median(ratios):8.2f}{f'{min(ratios):.2f}-{max(ratios):.2f}':>14}  <= {TARGET:.2f}")
    return lines


def add_arguments(parser) -> None:
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    parser.add_argument("directory", nargs="?", type=pathlib.Path,
                        help="a W1 directory (default: make W1 data with --n and --steps)")
    parser.add_argument("--n", type=workload.at_least(10), default=100_000, help="proxies of the W1 data made here [100000]")
    parser.add_argument("--steps", type=workload.at_least(1), default=30, help="steps to run (at most the directory's) [30]")
    parser.add_argument("--seed", type=int, default=workload.W1_SEED, help="seed of the W1 data made here")
    parser.add_argument("--repeats", type=workload.at_least(1), default=7, help="paired runs; medians are reported [7]")


def run(args, facts: dict) -> int:
    with workload.w1_directory(args.directory, args.n, args.steps, args.seed) as directory:
        work = workload.load(directory)
    if work.kind != "W1":
        raise workload.BadWorkload(f"{args.directory}: a {work.kind} directory; this benchmark runs on W1")
    work = work.first(args.steps)
    print(f"{args.directory or 'W1 made for this run'}: {work.describe()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="dbvt-bench-secured-") as folder:
        flags, ca, token = secured_flags(pathlib.Path(folder))
        servers = {"plaintext": start_server(), "secured": start_server(*flags)}
        try:
            clients = {"plaintext": Client(servers["plaintext"][1]),
                       "secured": Client(servers["secured"][1], tls=ca, token=token)}
            runs: dict[str, list[dict]] = {side: [] for side in SIDES}
            for attempt in range(args.repeats):
                for side in SIDES[::1 if attempt % 2 == 0 else -1]:
                    progress = Progress(f"{side} run {attempt + 1}/{args.repeats}", work.steps)
                    runs[side].append(side_run(clients[side], work, progress))
            for client in clients.values():
                client.close()
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait(30)
    print("\n".join(report(work, runs)))
    console.footer(facts)
    return 0
