"""The server's log: its own lines only, and rejected requests logged without letting a flood fill a disk."""
from __future__ import annotations

import asyncio
import json
import logging
import sys

import grpc

from dbvt_client.errors import DbvtError, from_exception

log = logging.getLogger("dbvt_server")

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Characters of a client-chosen name, and of an error message (which may quote one), shown in a line.
NAME_CHARS = 64
MESSAGE_CHARS = 240
# Rejected requests of one method with one status: at most BURST lines in each INTERVAL seconds.
BURST = 10
INTERVAL = 60.0


# What a rejected request's line carries as fields of its own in --log-format json.
REQUEST_FIELDS = ("method", "world", "code")


class JsonLines(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and a rejected request's fields."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                "message": record.getMessage()}
        line.update({field: getattr(record, field) for field in REQUEST_FIELDS if hasattr(record, field)})
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(level: str, log_format: str = "text") -> None:
    """The server's lines from `level` up; other libraries' only from WARNING: at DEBUG, grpc alone logs
    lines such as "[_cygrpc] Loaded running loop" for every call."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(FORMAT))
    logging.basicConfig(level=max(logging.WARNING, logging.getLevelName(level.upper())), handlers=[handler])
    log.setLevel(level.upper())


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def shown(name: str) -> str:
    """A world name as a log line shows it: quoted, escaped, and cut short."""
    return repr(name) if len(name) <= NAME_CHARS else f"{name[:NAME_CHARS]!r}... ({len(name)} characters)"


class Rejections:
    """Logs requests answered with an error status: the client's errors at WARNING ("rejected"), the
    server's own at ERROR with their traceback ("failed"). Past `burst` lines for one (method, status)
    in `interval` seconds, the rest are only counted, and one line at the end of the interval says how
    many were left out."""

    def __init__(self, burst: int = BURST, interval: float = INTERVAL):
        self._burst = burst
        self._interval = interval
        self._windows: dict[tuple[str, grpc.StatusCode], _Window] = {}

    def log(self, method: str, world: str | None, exc: Exception) -> DbvtError:
        """The error status that answers `exc`, logged."""
        error = from_exception(exc)
        key = (method, error.code)
        window = self._windows.get(key)
        if window is None:
            timer = asyncio.get_running_loop().call_later(self._interval, self._close, key)
            window = self._windows[key] = _Window(timer)
        if window.logged == self._burst:
            window.left_out += 1
            return error
        window.logged += 1
        on = "" if world is None else f" on world {shown(world)}"
        level, verb = _how(error.code)
        log.log(level, "%s %s%s: %s: %s", verb, method, on, error.code.name, cut(error.message, MESSAGE_CHARS),
                exc_info=exc if level == logging.ERROR else None,
                extra={"method": method, "world": None if world is None else cut(world, NAME_CHARS),
                       "code": error.code.name})
        return error

    def _close(self, key: tuple[str, grpc.StatusCode]) -> None:
        window = self._windows.pop(key)
        if window.left_out:
            method, code = key
            level, verb = _how(code)
            log.log(level, "%s %s: %s: %d more in the last %g s, not logged", verb, method, code.name,
                    window.left_out, self._interval)

    def flush(self) -> None:
        """Say now what the open intervals left out (the server is stopping)."""
        for key, window in list(self._windows.items()):
            window.timer.cancel()
            self._close(key)


def _how(code: grpc.StatusCode) -> tuple[int, str]:
    """The level and verb of a line about a request answered with `code`."""
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        return logging.ERROR, "failed"
    return logging.WARNING, "rejected"


class _Window:
    def __init__(self, timer: asyncio.TimerHandle):
        self.timer = timer
        self.logged = 0
        self.left_out = 0
