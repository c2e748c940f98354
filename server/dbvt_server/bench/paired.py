"""What a server setting costs: two dbvt-server child processes side by side, one without it and one
with it, timed on the same W1 in the same run.

`dbvt-bench secured`: plaintext without tokens against TLS (a throwaway CA and certificate, made
with trustme) and a token file. `dbvt-bench metrics`: without against with --metrics-address.
`dbvt-bench socket`: one server listening on loopback TCP and on a Unix socket (--listen), a client
on each: what a sidecar's game server gains by the socket.

Each run takes W1 through both servers, in turn (alternately first), each time on a new world: its
steps streamed tick by tick (the median step), then one call of all W1's box queries (the median of
a few calls). A run's ratio is its figure with the setting over its figure without; the sides run
seconds apart, so the ratio cancels most of the machine's drift. DIRECTORY is a W1 directory;
without one, W1 data of --n proxies and --steps steps is made first, in a temporary directory.
"""
from __future__ import annotations

import pathlib
import statistics
import tempfile

from dbvt_client import Client
from dbvt_server.bench import console, workload
from dbvt_server.bench.console import Progress
from dbvt_server.bench.wire import fresh_world, median_call, start_server, tick_by_tick
from dbvt_server.bench.workload import Workload
from dbvt_server.tokens import new_token

# What each command compares: its two sides' names, and the target of the ratio (with / without).
COMPARED = {"secured": (("plaintext", "TLS+token"), 1.10), "metrics": (("metrics off", "metrics on"), 1.03),
            "socket": (("loopback TCP", "Unix socket"), None)}


def secured_flags(folder: pathlib.Path) -> tuple[list[str], bytes, str]:
    """Server flags for TLS and a token file in `folder`, the CA a client must trust, and the token."""
    # In the bench and test extras only: the other benchmarks run without it.
    try:
        import trustme
    except ImportError:
        raise SystemExit("dbvt-bench secured makes a throwaway CA with trustme: "
                         "pip install 'dbvt-server[bench]'") from None

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
    steps = [seconds for seconds, _ in tick_by_tick(world, work, progress)]
    query = median_call(lambda: world.query_aabb(work.q_aabb))
    client.delete_world(world.name)
    return dict(step=statistics.median(steps), query=query)


def report(work: Workload, runs: dict[str, list[dict]], target: float) -> list[str]:
    without, with_it = runs
    lines = [f"W1: N={len(work.ids)}, {work.steps} steps of {work.move_ids.shape[1]} moves, "
             f"{len(work.q_aabb)} box queries; {len(runs[without])} paired runs",
             f"{'':34}{without:>12}{with_it:>12}{'ratio':>8}{'range':>14}  target"]
    for label, key in (("streamed step, tick by tick, ms", "step"),
                       (f"{len(work.q_aabb) // 1000}k box queries in one call, ms", "query")):
        base, other = ([run[key] for run in runs[side]] for side in runs)
        ratios = [o / b for o, b in zip(other, base)]
        stated = "-" if target is None else f"<= {target:.2f}"
        lines.append(f"{label:34}{statistics.median(base) * 1e3:12.2f}{statistics.median(other) * 1e3:12.2f}"
                     f"{statistics.median(ratios):8.2f}{f'{min(ratios):.2f}-{max(ratios):.2f}':>14}  {stated}")
    return lines


def add_arguments(parser) -> None:
    workload.add_w1_arguments(parser, __doc__)
    parser.add_argument("--repeats", type=workload.at_least(1), default=7, help="paired runs; medians are reported [7]")


def run(args, facts: dict) -> int:
    work = workload.w1_for(args, args.command)
    names, target = COMPARED[args.command]
    with tempfile.TemporaryDirectory(prefix="dbvt-bench-paired-") as folder:
        if args.command == "socket":
            socket_path = f"unix://{folder}/dbvt.sock"
            one = start_server("--listen", "127.0.0.1:0", "--listen", socket_path)
            servers = {names[0]: one}
            targets = {names[0]: (one[1], {}), names[1]: (socket_path, {})}
        else:
            setting, client_settings = _setting(args.command, pathlib.Path(folder))
            servers = {names[0]: start_server(), names[1]: start_server(*setting)}
            targets = {names[0]: (servers[names[0]][1], {}), names[1]: (servers[names[1]][1], client_settings)}
        try:
            clients = {name: Client(target, **settings) for name, (target, settings) in targets.items()}
            runs: dict[str, list[dict]] = {name: [] for name in names}
            for attempt in range(args.repeats):
                for name in names[::1 if attempt % 2 == 0 else -1]:
                    progress = Progress(f"{name} run {attempt + 1}/{args.repeats}", work.steps)
                    runs[name].append(side_run(clients[name], work, progress))
            for client in clients.values():
                client.close()
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait(30)
    print("\n".join(report(work, runs, target)))
    console.footer(facts)
    return 0


def _setting(command: str, folder: pathlib.Path) -> tuple[list[str], dict]:
    """The server flags of the side with the setting, and what its client needs."""
    if command == "metrics":
        return ["--metrics-address", "127.0.0.1:0"], {}
    flags, ca, token = secured_flags(folder)
    return flags, {"tls": ca, "token": token}
