"""Settings, from command-line flags or the matching DBVT_* environment variables (flags win)."""
from __future__ import annotations

import argparse
import ipaddress
import math
import os
from dataclasses import dataclass, fields
from typing import Callable, NamedTuple

from dbvt.validation import MAX_THREADS
from dbvt_client.batches import MESSAGE_OVERHEAD
from dbvt_client.routing import is_dns
from dbvt_server import __version__
from dbvt_server.cores import usable_cores

# Read once, at import: both defaults below are it.
USABLE_CORES = usable_cores()
MIB = 1 << 20
MAX_GRPC_MESSAGE = (1 << 31) - 1
# Every message keeps MESSAGE_OVERHEAD bytes for the fields around its rows (the SDK's batches and
# query sets, the server's answers in parts); below twice that, rows would hardly fit, or not at all.
MIN_MESSAGE_BYTES = 2 * MESSAGE_OVERHEAD
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class Config:
    """The server's settings; `workers` defaults to the cores the process may use (usable_cores), at
    least 2.

    A Config made in code (`create_server(Config(...))`) is held to the rules the flags are: a value of
    the wrong type raises TypeError, a refused value or combination ValueError, each naming the setting.
    """

    host: str = "127.0.0.1"
    port: int = 50051
    # Addresses to listen on instead of host:port: "host:port" or "unix:///path/to.sock".
    listen: tuple[str, ...] = ()
    max_message_bytes: int = 64 * MIB
    max_worlds: int = 64
    max_proxies_per_world: int = 10_000_000
    max_pairs_per_world: int = 20_000_000
    max_hits_per_call: int = 25_000_000
    max_staged_bytes: int = 512 * MIB
    max_queued_per_world: int = 128
    keepalive_seconds: float = 30.0
    max_connection_idle_seconds: float = 600.0
    drain_seconds: float = 0.0
    grace_seconds: float = 10.0
    log_level: str = "INFO"
    log_format: str = "text"
    workers: int = max(2, USABLE_CORES)
    threads_per_world: int = 1
    cores: int = USABLE_CORES
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    tokens: str | None = None
    reflection: str = "on"
    health_port: int | None = None
    metrics_address: str | None = None
    peers: tuple[str, ...] = ()
    advertise: str | None = None
    watch_history: int = 256
    max_watch_backlog: int = 1024
    data_dir: str | None = None
    fsync: str = "everysec"
    snapshot_seconds: float = 60.0

    def __post_init__(self):
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            if setting.many and not isinstance(value, tuple):
                raise TypeError(f"Config({setting.name}={value!r}): {setting.name} must be a tuple of "
                                f"{setting.kind.__name__}")
            for one in value if setting.many else (value,):
                if one is None and setting.name in UNSET_BY_DEFAULT:
                    continue
                if not _of_kind(one, setting.kind):
                    raise TypeError(f"Config({setting.name}={one!r}): {setting.name} must be {setting.kind.__name__}")
                if not setting.check(one):
                    raise ValueError(f"Config({setting.name}={one!r}): {setting.name} {setting.rule}")
        problem = combination_problem({name: value for name in NAMES if _given(value := getattr(self, name))},
                                      lambda name: name)
        if problem:
            raise ValueError(f"Config: {problem}")

    @property
    def addresses(self) -> tuple[str, ...]:
        """Where the server listens: --listen's addresses, or host:port."""
        return self.listen or (f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}",)

    @property
    def exposed_hosts(self) -> list[str]:
        """The hosts beyond this machine the server listens on (a Unix socket is never one)."""
        return [found[0] for address in self.addresses if not is_unix(address)
                and (found := split_address(address)) and not is_loopback(found[0])]

    @property
    def exposed(self) -> bool:
        """Whether the server listens beyond this machine without both TLS and tokens."""
        return bool(self.exposed_hosts) and not (self.tls_cert and self.tokens)


# Settings that may be None: those off unless given.
UNSET_BY_DEFAULT = frozenset(field.name for field in fields(Config) if field.default is None)


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of 'host:port' or '[v6 address]:port'; None if it is neither."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        return None
    return host.strip("[]"), int(port)


def is_unix(address: str) -> bool:
    return address.startswith("unix:")


def unix_path(address: str) -> str:
    """The file of a unix: address (unix:///abs/path, or unix:path)."""
    rest = address[len("unix:"):]
    return rest[2:] if rest.startswith("//") else rest


def listen_address(address: str) -> bool:
    if is_unix(address):
        return bool(unix_path(address))
    return split_address(address) is not None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Setting(NamedTuple):
    name: str
    env: str
    kind: type
    help: str
    # Whether a value is acceptable, and what a refused one is told: "<name> <rule>".
    check: Callable[..., bool] = lambda value: True
    rule: str = ""
    # The default as --help states it, where Config's depends on the machine.
    stated_default: str | None = None
    # Given any number of times (the variable: comma-separated); the value is a tuple.
    many: bool = False


def _of_kind(value, kind: type) -> bool:
    """Whether a value made in code is of a setting's kind: a bool is no number, an int is a float."""
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if kind is float else kind)


def _given(value) -> bool:
    return value is not None and value != ()


def _positive(value) -> bool:
    return value > 0


SETTINGS = [
    Setting("host", "DBVT_HOST", str, "address to listen on (0.0.0.0 for every interface)"),
    Setting("listen", "DBVT_LISTEN", str,
            "listen on exactly this address instead of --host/--port: host:port, or unix:///path/to.sock for a "
            "Unix socket (a game server's sidecar); repeat it, or give several comma-separated", listen_address,
            "must be host:port or unix:///path", stated_default="none: --host and --port", many=True),
    Setting("port", "DBVT_PORT", int, "TCP port; 0 picks a free one (the start-up log line names it)",
            lambda port: 0 <= port <= 65535, "must be between 0 and 65535"),
    Setting("max_message_bytes", "DBVT_MAX_MESSAGE_BYTES", int,
            "largest message received or sent, in bytes; bigger batches, query sets and answers go in parts",
            lambda size: MIN_MESSAGE_BYTES <= size <= MAX_GRPC_MESSAGE,
            f"must be between {MIN_MESSAGE_BYTES} (room for rows beside a message's other fields) and "
            f"{MAX_GRPC_MESSAGE} (gRPC's limit)"),
    Setting("max_worlds", "DBVT_MAX_WORLDS", int, "most worlds held at once", _positive, "must be positive"),
    Setting("max_proxies_per_world", "DBVT_MAX_PROXIES_PER_WORLD", int, "most proxies in one world",
            _positive, "must be positive"),
    Setting("max_pairs_per_world", "DBVT_MAX_PAIRS_PER_WORLD", int,
            "most overlapping pairs in one world (a world's own max_pairs may be lower); a batch that would pass "
            "it is refused whole", _positive, "must be positive"),
    Setting("max_hits_per_call", "DBVT_MAX_HITS_PER_CALL", int,
            "most hits one query call may return (8 bytes each); past it the call is refused before its answer "
            "is built", _positive, "must be positive"),
    Setting("max_staged_bytes", "DBVT_MAX_STAGED_BYTES", int,
            "most bytes held, across all streams, for batches and query sets whose last part has not come",
            _positive, "must be positive"),
    Setting("max_queued_per_world", "DBVT_MAX_QUEUED_PER_WORLD", int,
            "operations waiting for their turn on one world; past it calls fail at once (RESOURCE_EXHAUSTED)",
            _positive, "must be positive"),
    Setting("keepalive_seconds", "DBVT_KEEPALIVE_SECONDS", float,
            "ping a silent connection after this long, and close it with its streams if no answer comes within "
            "as long again", lambda seconds: math.isfinite(seconds) and seconds >= 1, "must be at least 1"),
    Setting("max_connection_idle_seconds", "DBVT_MAX_CONNECTION_IDLE_SECONDS", float,
            "close a connection without calls for this long (clients reconnect on their next call)",
            lambda seconds: math.isfinite(seconds) and seconds >= 1, "must be at least 1"),
    Setting("drain_seconds", "DBVT_DRAIN_SECONDS", float,
            "on SIGTERM/SIGINT, how long to go on serving while health and /readyz say NOT_SERVING, so that a load "
            "balancer moves traffic away first", lambda seconds: math.isfinite(seconds) and seconds >= 0,
            "must be a finite number >= 0"),
    Setting("grace_seconds", "DBVT_GRACE_SECONDS", float,
            "on SIGTERM/SIGINT, how long calls in flight may take to finish before they are cancelled",
            lambda seconds: math.isfinite(seconds) and seconds >= 0, "must be a finite number >= 0"),
    Setting("log_level", "DBVT_LOG_LEVEL", str, "DEBUG, INFO, WARNING or ERROR",
            lambda level: level.upper() in LOG_LEVELS, f"must be one of {', '.join(LOG_LEVELS)}"),
    Setting("log_format", "DBVT_LOG_FORMAT", str, "text, or json: one JSON object a line, for log collectors",
            lambda value: value in ("text", "json"), "must be text or json"),
    Setting("workers", "DBVT_WORKERS", int, "threads running world operations (different worlds run in parallel)",
            _positive, "must be positive", stated_default="the cores this process may use, at least 2"),
    Setting("threads_per_world", "DBVT_THREADS_PER_WORLD", int,
            "threads one world's query call, bulk build (the first batch into an empty world) or step may use: a "
            "call of at least 64 queries a thread, a build of 4,096 proxies, or the pair finding of a batch that "
            "moves 512, is cut over them, with the same answer, while --cores has room",
            lambda threads: 1 <= threads <= MAX_THREADS, f"must be between 1 and {MAX_THREADS}"),
    Setting("cores", "DBVT_CORES", int,
            "threads that may work at once, the worlds' own and the threads inside them: a call is cut over "
            "--threads-per-world threads only while fewer than this many work, and runs whole on its world's "
            "thread otherwise, with the same answer",
            lambda cores: 1 <= cores <= MAX_THREADS, f"must be between 1 and {MAX_THREADS}",
            stated_default="the cores this process may use: its CPU affinity, or fewer under a CPU quota"),
    Setting("tls_cert", "DBVT_TLS_CERT", str, "PEM certificate chain: with --tls-key, the server speaks only TLS",
            stated_default="none, plaintext"),
    Setting("tls_key", "DBVT_TLS_KEY", str, "PEM private key of --tls-cert", stated_default="none"),
    Setting("tls_client_ca", "DBVT_TLS_CLIENT_CA", str,
            "PEM CA bundle: clients must present a certificate it signed (mutual TLS)", stated_default="none"),
    Setting("tokens", "DBVT_TOKENS", str,
            "token file (lines '<name> <role> <world-glob> sha256:<hex>'): every call but health needs a token",
            stated_default="none, no tokens needed"),
    Setting("reflection", "DBVT_REFLECTION", str, "serve gRPC server reflection: on or off",
            lambda value: value in ("on", "off"), "must be on or off"),
    Setting("health_port", "DBVT_HEALTH_PORT", int,
            "also serve only the health service, in plaintext, on this port (for probes that cannot speak TLS)",
            lambda port: 0 <= port <= 65535, "must be between 0 and 65535", stated_default="none"),
    Setting("metrics_address", "DBVT_METRICS_ADDRESS", str,
            "HOST:PORT serving Prometheus metrics at /metrics, and /healthz and /readyz, over HTTP",
            lambda address: split_address(address) is not None, "must be HOST:PORT, such as 0.0.0.0:9464",
            stated_default="none, off"),
    Setting("peers", "DBVT_PEERS", str,
            "every server of the replica set as host:port (this one too, as --advertise names it), or one "
            "DNS name, dns:///name:port, resolved to all of them and again every 30 s: a world belongs to the "
            "one its name hashes to, and a call for a world this server neither holds nor owns is answered "
            "FAILED_PRECONDITION naming the owner (dbvt-owner)",
            lambda address: split_address(address) is not None, "must be host:port",
            stated_default="none: every world is this server's", many=True),
    Setting("advertise", "DBVT_ADVERTISE", str, "this server's own host:port among --peers",
            lambda address: split_address(address) is not None, "must be host:port", stated_default="none"),
    Setting("watch_history", "DBVT_WATCH_HISTORY", int,
            "ticks of sensor events each world keeps, so that a watcher resuming from a tick within them gets "
            "what it missed instead of a resync", lambda ticks: ticks >= 0, "must be >= 0"),
    Setting("max_watch_backlog", "DBVT_MAX_WATCH_BACKLOG", int,
            "ticks a sensor watcher may fall behind; past it its backlog is dropped and it gets a resync",
            _positive, "must be positive"),
    Setting("data_dir", "DBVT_DATA_DIR", str,
            "directory where worlds are kept across restarts (snapshots and a journal per world); one server "
            "per directory", stated_default="none, worlds live in memory only"),
    Setting("fsync", "DBVT_FSYNC", str,
            "with --data-dir: always (every batch on disk before its answer), everysec (a power loss loses at most "
            "the last second), or no (the system decides); a killed process loses no answered batch with any",
            lambda value: value in ("always", "everysec", "no"), "must be always, everysec or no"),
    Setting("snapshot_seconds", "DBVT_SNAPSHOT_SECONDS", float,
            "with --data-dir: snapshot every world changed since its last snapshot this often (also on SIGTERM, "
            "and when a journal outgrows its snapshot)", lambda seconds: math.isfinite(seconds) and seconds > 0,
            "must be a finite number > 0"),
]

NAMES = [setting.name for setting in SETTINGS]
# Settings that mean nothing without another one.
NEEDS = {"tls_cert": "tls_key", "tls_key": "tls_cert", "tls_client_ca": "tls_cert", "peers": "advertise",
         "advertise": "peers"}


def combination_problem(values: dict, named: Callable[[str], str]) -> str | None:
    """What is wrong with the settings given (`values`, by name) taken together, each called `named(name)`."""
    for setting, needed in NEEDS.items():
        if setting in values and needed not in values:
            return f"{named(setting)} needs {named(needed)} as well"
    peers = values.get("peers", ())
    if any(is_dns(peer) for peer in peers) and len(peers) > 1:
        return f"{named('peers')} takes host:port addresses or one dns:/// name, not both: {','.join(peers)}"
    if "advertise" in values and not is_dns(peers[0]) and values["advertise"] not in peers:
        return f"{named('advertise')} {values['advertise']} must be one of {named('peers')} {','.join(peers)}"
    return None


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse(argv: list[str] | None = None, environ=os.environ) -> Config:
    defaults = Config()
    parser = argparse.ArgumentParser(
        prog="dbvt-server",
        description="Serve dbvt broadphase worlds over gRPC (service dbvt.v1.BroadphaseService, with the "
                    "standard health service and server reflection). Every flag can also be set by the "
                    "environment variable shown; a flag given on the command line wins.",
        epilog="gRPC's own log (its C core) stays off unless the environment sets GRPC_VERBOSITY.")
    parser.add_argument("--version", action="version", version=f"dbvt-server {__version__}")
    for setting in SETTINGS:
        # Unset flags stay None, so that a refused value can be traced to the flag or the variable.
        parser.add_argument("--" + setting.name.replace("_", "-"), dest=setting.name, type=setting.kind,
                            action="append" if setting.many else "store",
                            help=f"{setting.help} [env {setting.env}; default "
                                 f"{setting.stated_default or getattr(defaults, setting.name)}]")
    flags = parser.parse_args(argv)
    values = {}
    for setting in SETTINGS:
        flag = getattr(flags, setting.name)
        if flag is not None:
            given = [part.strip() for value in flag for part in value.split(",")] if setting.many else [flag]
            sources = [f"{_flag(setting.name)} {value}" for value in given]
        elif setting.env in environ:
            raw = environ[setting.env]
            try:
                given = [setting.kind(part.strip()) for part in (raw.split(",") if setting.many else [raw])]
            except ValueError:
                parser.error(f"environment variable {setting.env}={raw!r} is not a valid {setting.kind.__name__}")
            sources = [f"environment variable {setting.env}={raw}"] * len(given)
        else:
            continue
        for value, source in zip(given, sources):
            if not setting.check(value):
                parser.error(f"{source}: {setting.name} {setting.rule}")
        values[setting.name] = tuple(given) if setting.many else given[0]
    problem = combination_problem(values, _flag)
    if problem:
        parser.error(problem)
    return Config(**values)
