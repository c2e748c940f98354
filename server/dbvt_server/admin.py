"""`dbvt-admin`: operations on a replica set of dbvt-servers.

    dbvt-admin rebalance --peers host-0:50051,host-1:50051,... [--leaving host-3:50051] [--dry-run]

moves every world to the server that owns it among --peers (dbvt_server.rebalance), keeping its
tick and incarnation: the worlds of the servers in --peers, and all those of the servers --leaving
the set. Run it with the new list once a new replica runs, or before a replica is removed; run it
again to finish moves that were cut short. It needs an admin token on servers started with --tokens
(DBVT_TOKEN), and --tls-ca (and --tls-cert, --tls-key for mutual TLS) on servers that speak TLS.
"""
from __future__ import annotations

import argparse
import os
import sys

from dbvt_client import TLS, Client, DbvtError
from dbvt_server.config import split_address
from dbvt_server.rebalance import MoveConflict, rebalance


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="dbvt-admin", description="Operations on a replica set of dbvt-servers.")
    commands = made.add_subparsers(dest="command", required=True)
    moving = commands.add_parser("rebalance", help="move every world to its owner among --peers",
                                 description="Move every world to the server that owns it among --peers.")
    moving.add_argument("--peers", required=True, type=_peers,
                        help="every server of the replica set as host:port, comma-separated (as their --peers)")
    moving.add_argument("--leaving", type=_peers, default=[],
                        help="servers leaving the replica set, as host:port, comma-separated: all their worlds move")
    moving.add_argument("--dry-run", action="store_true", help="only print the moves")
    moving.add_argument("--tls-ca", help="PEM CA bundle the servers' certificates are checked against")
    moving.add_argument("--tls-cert", help="PEM client certificate, for servers that ask for one")
    moving.add_argument("--tls-key", help="PEM private key of --tls-cert")
    return made


def _peers(text: str) -> list[str]:
    peers = [peer.strip() for peer in text.split(",") if peer.strip()]
    if not peers or any(split_address(peer) is None for peer in peers) or len(set(peers)) != len(peers):
        raise argparse.ArgumentTypeError(f"must be distinct host:port addresses, comma-separated, not {text!r}")
    return peers


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    tls = TLS(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key) if args.tls_ca or args.tls_cert else None
    token = os.environ.get("DBVT_TOKEN")
    try:
        report = rebalance(args.peers, lambda address: Client(address, token=token, tls=tls), dry_run=args.dry_run,
                           leaving=args.leaving)
    except (DbvtError, MoveConflict) as exc:
        print(f"dbvt-admin rebalance: {exc}; run it again to finish", file=sys.stderr)
        return 1
    if not args.dry_run:
        rate = report.proxies / report.seconds if report.seconds else 0.0
        print(f"{len(report.moves)} worlds moved ({report.proxies} proxies) in {report.seconds:.2f} s "
              f"({rate:,.0f} proxies a second)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
