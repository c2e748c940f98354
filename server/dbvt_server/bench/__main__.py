"""`dbvt-bench` (or `python -m dbvt_server.bench`): make workloads, and run the benchmarks on them.

    dbvt-bench workload w1 N STEPS DIR [--seed S]              W1 data and its exact answers
    dbvt-bench workload w2 N STEPS DIR [--dims 2|3] [--seed S] W2 data and its exact answers
    dbvt-bench core [DIR] [--n N --steps S] [--repeat R] ...   the core, beside python-fcl
    dbvt-bench queries [--n N] [--repeat R] ...                nearest, casts and overlap, beside rtree
    dbvt-bench wire [DIR] [--target HOST:PORT] [--repeats R] ... the service over the wire
    dbvt-bench calls [DIR] [--steps S]                         a streamed tick's Python calls, beside the bare server's
    dbvt-bench secured [DIR] [--repeats R] ...                 TLS and a token against plaintext
    dbvt-bench metrics [DIR] [--repeats R] ...                 metrics on against off
    dbvt-bench socket [DIR] [--repeats R] ...                  a Unix socket against loopback TCP
    dbvt-bench persist [DIR] [--repeats R] [--journaled J] ... a data directory's cost, restarts, snapshots
    dbvt-bench sensors [DIR] [--sensors S] [--radius R] ...    moving sensors, watcher latency, many watchers
    dbvt-bench routing [--calls C] [--worlds W] ...            a routed call's cost, and a rebalance's speed
    dbvt-bench insert [--n N] [--large L] [--repeat R]         insertion at 100k beside 1M
    dbvt-bench steps [--large L] [--dense D] [--threads T] ... a step on threads against one, W1 and W2
    dbvt-bench budget [--dense D] [--worlds W] [--threads T] ...  busy worlds on threads, the thread budget against none

A benchmark given no DIR makes W1 data first, in a temporary directory, so a fresh clone needs
nothing else. Every command prints its command line, the machine and the load average first, and
the load average again at its end.
"""
from __future__ import annotations

import argparse
import sys

from dbvt_server.bench import (budget, calls, console, core, insert, paired, persist, queries, routing, sensors, steps,
                               wire, workload)

COMMANDS = {
    "workload": (workload, "make W1 or W2 data with its exact answers (expected.json)"),
    "core": (core, "the dbvt core on a W1 or W2 directory, python-fcl beside it on W1"),
    "queries": (queries, "query_nearest, cast_box, cast_sphere and overlap on W1, rtree's nearest beside them"),
    "wire": (wire, "W1 streamed through a dbvt-server, beside the in-process core"),
    "calls": (calls, "the Python calls of a streamed W1 tick by thread, beside the bare gRPC server's"),
    "secured": (paired, "W1's streamed step and box queries with TLS and a token, against plaintext"),
    "metrics": (paired, "W1's streamed step and box queries with metrics on, against off"),
    "socket": (paired, "W1's streamed step and box queries over a Unix socket, against loopback TCP"),
    "persist": (persist, "W1's streamed step with a data directory, restart time, snapshot time and size"),
    "sensors": (sensors, "W1 with moving sphere sensors: the step, a watcher's latency, 8 watchers against 1"),
    "insert": (insert, "one-at-a-time insertion and the bulk build, W1 at 100k beside 1M"),
    "steps": (steps, "a broadphase step on threads against one: W1 at 1M, W2 (2-D and 3-D) at 100k"),
    "budget": (budget, "busy W2 worlds on threads at once, with the thread budget against without it"),
    "routing": (routing, "a routed client's cost per call beyond a direct one, and a rebalance's proxies a second"),
}


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog=console.PROG, description=__doc__.split("\n\n")[0],
                                   epilog="`dbvt-bench COMMAND --help` says more about each.")
    commands = made.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, text) in COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return made


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    facts = console.header(argv)
    try:
        return args.run(args, facts)
    except workload.BadWorkload as exc:
        print(f"{console.PROG}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
