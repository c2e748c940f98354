"""Settings, from command-line flags or the matching DBVT_* environment variables (flags win)."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

MIB = 1 << 20
MAX_GRPC_MESSAGE = (1 << 31) - 1


@dataclass(frozen=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 50051
    max_message_bytes: int = 64 * MIB
    max_worlds: int = 64
    max_proxies_per_world: int = 10_000_000
    grace_seconds: float = 10.0
    log_level: str = "INFO"
    workers: int = max(2, os.cpu_count() or 1)


# flag, environment variable, type, help; the defaults are Config's.
SETTINGS = [
    ("host", "DBVT_HOST", str, "address to listen on (0.0.0.0 for every interface)"),
    ("port", "DBVT_PORT", int, "TCP port; 0 picks a free one (the start-up log line names it)"),
    ("max_message_bytes", "DBVT_MAX_MESSAGE_BYTES", int,
     "largest request message accepted, in bytes; the SDK splits bigger batches and queries to fit"),
    ("max_worlds", "DBVT_MAX_WORLDS", int, "most worlds held at once"),
    ("max_proxies_per_world", "DBVT_MAX_PROXIES_PER_WORLD", int, "most proxies in one world"),
    ("grace_seconds", "DBVT_GRACE_SECONDS", float,
     "on SIGTERM/SIGINT, how long calls in flight may take to finish before they are cancelled"),
    ("log_level", "DBVT_LOG_LEVEL", str, "DEBUG, INFO, WARNING or ERROR"),
    ("workers", "DBVT_WORKERS", int, "threads running world operations (different worlds run in parallel)"),
]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _positive(name: str, value) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be positive, not {value}")


def parse(argv: list[str] | None = None, environ=os.environ) -> Config:
    defaults = Config()
    parser = argparse.ArgumentParser(
        prog="dbvt-server",
        description="Serve dbvt broadphase worlds over gRPC (service dbvt.v1.BroadphaseService, with the "
                    "standard health service and server reflection). Every flag can also be set by the "
                    "environment variable shown; a flag given on the command line wins.")
    for name, env, kind, text in SETTINGS:
        default = getattr(defaults, name)
        if env in environ:
            try:
                default = kind(environ[env])
            except ValueError:
                parser.error(f"environment variable {env}={environ[env]!r} is not a valid {kind.__name__}")
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=default,
                            help=f"{text} [env {env}; default {getattr(defaults, name)}]")
    config = Config(**vars(parser.parse_args(argv)))
    try:
        for name in ("max_message_bytes", "max_worlds", "max_proxies_per_world", "workers"):
            _positive(name, getattr(config, name))
        if config.max_message_bytes > MAX_GRPC_MESSAGE:
            raise ValueError(f"max_message_bytes must be at most {MAX_GRPC_MESSAGE} (gRPC's limit), "
                             f"not {config.max_message_bytes}")
        if config.grace_seconds < 0:
            raise ValueError(f"grace_seconds must be >= 0, not {config.grace_seconds}")
        if not 0 <= config.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, not {config.port}")
        if config.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {config.log_level!r}")
    except ValueError as exc:
        parser.error(str(exc))
    return config
