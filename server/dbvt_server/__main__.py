"""`dbvt-server` (or `python -m dbvt_server`): run the server until SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import logging
import os
import sys

from dbvt_server.config import parse


def main(argv: list[str] | None = None) -> int:
    config = parse(argv)
    # gRPC's C core writes to stderr itself, around our log: a failed bind, which we report in our own
    # words, even takes two lines. It reads the variable when grpc is first imported, so only now.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from dbvt_server import logs, memory
    from dbvt_server.app import PortUnavailable, serve

    logs.configure(config.log_level)
    memory.configure()
    try:
        asyncio.run(serve(config))
    except PortUnavailable as exc:
        logging.getLogger("dbvt_server").error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
