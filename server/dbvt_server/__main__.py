"""`dbvt-server` (or `python -m dbvt_server`): run the server until SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import logging
import sys

from dbvt_server.app import PortUnavailable, serve
from dbvt_server.config import parse


def main(argv: list[str] | None = None) -> int:
    config = parse(argv)
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(config))
    except PortUnavailable as exc:
        logging.getLogger("dbvt_server").error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
