"""The server's log: its own lines only."""
from __future__ import annotations

import logging
import sys

log = logging.getLogger("dbvt_server")

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str) -> None:
    """The server's lines from `level` up; other libraries' only from WARNING: at DEBUG, grpc alone logs
    lines such as "[_cygrpc] Loaded running loop" for every call."""
    logging.basicConfig(level=max(logging.WARNING, logging.getLevelName(level.upper())), stream=sys.stderr,
                        format=FORMAT)
    log.setLevel(level.upper())
