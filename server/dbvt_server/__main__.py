"""`dbvt-server` (or `python -m dbvt_server`): run the server until SIGTERM/SIGINT.

`dbvt-server new-token NAME ROLE WORLD-GLOB` instead prints a fresh token and its token-file line.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

# gRPC's C core writes to stderr itself, around our log: a failed bind, which we report in our own
# words, even takes two lines. It reads the variable when grpc is first imported, which the
# configuration's modules already do.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from dbvt_server.config import parse  # noqa: E402
from dbvt_server.tokens import ROLES, TokenFileError, new_token  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["new-token"]:
        return print_new_token(argv[1:])
    config = parse(argv)
    from dbvt_server import logs, memory
    from dbvt_server.app import PortUnavailable, serve
    from dbvt_server.persistence import DataDirInUse
    from dbvt_server.tls import TlsFileError

    logs.configure(config.log_level, config.log_format)
    memory.configure()
    try:
        asyncio.run(serve(config))
    except (PortUnavailable, TlsFileError, TokenFileError, DataDirInUse) as exc:
        logging.getLogger("dbvt_server").error("%s", exc)
        return 1
    return 0


def new_token_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dbvt-server new-token",
        description="Print a fresh random token, once, and the line that grants it in the token file "
                    "(--tokens). The file keeps only the token's SHA-256 digest.")
    parser.add_argument("name", help="who holds the token; the server's log names it")
    parser.add_argument("role", choices=ROLES, help="read: queries and stats; write: also batches; "
                                                    "admin: also creating and deleting worlds")
    parser.add_argument("worlds", help="glob of the world names it may touch, such as 'arena-*' or '*' "
                                       "(quote it for the shell)")
    return parser


def print_new_token(argv: list[str]) -> int:
    parser = new_token_parser()
    args = parser.parse_args(argv)
    try:
        secret, line = new_token(args.name, args.role, args.worlds)
    except TokenFileError as exc:
        parser.error(str(exc).removeprefix("the new line line 1: "))
    print(f"token (give it to the client; it is not stored anywhere): {secret}")
    print(f"line for the token file: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
