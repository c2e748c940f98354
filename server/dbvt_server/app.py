"""Building, running and gracefully stopping the gRPC server."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import stat
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import dbvt
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server.access import Access, TokenInterceptor
from dbvt_server.config import Config, is_unix, split_address, unix_path
from dbvt_server.logs import Rejections
from dbvt_server.metrics import Metrics, MetricsEndpoint
from dbvt_server.persistence import Store
from dbvt_server.replicas import RESOLVE_SECONDS, Replicas
from dbvt_server.service import Limits, Service
from dbvt_server.servicer import BroadphaseServicer, add_to_server
from dbvt_server.tls import ServerTls
from dbvt_server.world_pool import WorldPool

log = logging.getLogger("dbvt_server")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["BroadphaseService"].full_name


class PortUnavailable(RuntimeError):
    pass


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class Running:
    """A started server and what must be shut down with it."""

    server: grpc.aio.Server
    # The first TCP port listened on (0 with Unix sockets alone), and every address as bound.
    port: int
    health: health.aio.HealthServicer
    executor: WorldPool
    rejections: Rejections
    servicer: BroadphaseServicer
    tls: ServerTls | None = None
    access: Access | None = None
    health_server: grpc.aio.Server | None = None
    health_port: int | None = None
    metrics: Metrics | None = None
    metrics_endpoint: MetricsEndpoint | None = None
    snapshots: asyncio.Task | None = None
    # Looking a DNS replica set (--peers dns:///...) up again, periodically.
    resolving: asyncio.Task | None = None
    addresses: tuple[str, ...] = ()

    @property
    def service(self) -> Service:
        return self.servicer.service

    def final_snapshots(self) -> None:
        """Once no operation runs: every changed world snapshotted, so the next start replays nothing,
        and the data directory given up."""
        started = time.monotonic()
        written = [world.files.snapshot(world) for world in self.service.worlds()
                   if world.files is not None and not world.files.current(world)]
        for future in written:
            try:
                future.result()
            except Exception:
                pass  # logged where it failed; the journal is kept and replays at the next start
        self.service.store.close()
        log.info("snapshots of %d changed worlds written in %.2f s", len(written), time.monotonic() - started)

    def reload(self) -> None:
        """Re-read the certificates and the token file (SIGHUP); a bad file keeps what is in force."""
        for reloadable in (self.tls, self.access):
            if reloadable is not None:
                reloadable.reload()

    async def stop(self, grace: float, drain: float = 0.0) -> None:
        """Say NOT_SERVING at once (health, /readyz) but serve on for `drain` seconds, so that load
        balancers move traffic away; then refuse new calls, let calls in flight finish for up to
        `grace` seconds, and cancel the rest. Operations that had not started are dropped; one that
        had started completes, even past the grace: that overrun is logged."""
        await self.health.enter_graceful_shutdown()
        if self.metrics is not None:
            self.metrics.ready = False
        if drain:
            log.info("draining: serving %.1f s more while health and /readyz say NOT_SERVING", drain)
            await asyncio.sleep(drain)
        if self.health_server is not None:
            await self.health_server.stop(None)
        self.servicer.end_query_streams()
        await self.server.stop(grace)
        if self.resolving is not None:
            self.resolving.cancel()
        waited = time.monotonic()
        self.executor.shutdown(wait=True)
        waited = time.monotonic() - waited
        if waited > OVERRUN_NOTICE:
            log.warning("an operation that had started ran %.1f s past the grace period: a started batch always "
                        "completes", waited)
        if self.service.store is not None:
            if self.snapshots is not None:
                self.snapshots.cancel()
            await asyncio.to_thread(self.final_snapshots)
        self.rejections.flush()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()


# Waiting this long for started operations after the grace is worth a line in the log.
OVERRUN_NOTICE = 0.05


async def create_server(config: Config) -> Running:
    """A started server listening on `config.host:config.port` (port 0: a free port, see `.port`).

    Raises TlsFileError or TokenFileError, naming the file, when those it is given cannot be used.
    """
    tls = ServerTls(config.tls_cert, config.tls_key, config.tls_client_ca) if config.tls_cert else None
    access = Access(config.tokens) if config.tokens else None
    rejections = Rejections()
    limits = Limits(config.max_worlds, config.max_proxies_per_world, config.max_message_bytes,
                    config.max_staged_bytes, config.max_queued_per_world, config.max_pairs_per_world,
                    config.max_hits_per_call, config.watch_history, config.max_watch_backlog,
                    config.threads_per_world)
    replicas = Replicas(config.peers, config.advertise)
    replicas.refresh()
    service = Service(limits, Store(config.data_dir, config.fsync) if config.data_dir else None, replicas)
    if service.store is not None:
        _restore(service)
    # Process-wide: every world's calls share the cores (dbvt._parallel), whichever server runs them.
    dbvt.set_thread_budget(config.cores)
    executor = WorldPool(config.workers)
    servicer = BroadphaseServicer(service, executor, rejections)
    interceptors = []
    if config.metrics_address:
        servicer.metrics = Metrics(servicer)
        # First, so that it also counts the calls the token check refuses.
        interceptors.append(servicer.metrics.interceptor())
    if access is not None:
        interceptors.append(TokenInterceptor(
            access, lambda method, error: rejections.log(method.rpartition("/")[2], None, error)))
    server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", -1),
        *SERVER_OPTIONS,
        *keepalive_options(config),
    ])
    add_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if config.reflection == "on":
        reflection.enable_server_reflection([SERVICE_NAME, HEALTH_NAME, reflection.SERVICE_NAME], server)
    running = Running(server, 0, health_servicer, executor, rejections, servicer, tls, access,
                      metrics=servicer.metrics)
    try:
        running.addresses = tuple(_listen_at(server, where, tls.credentials() if tls else None)
                                  for where in config.addresses)
        running.port = next((split_address(where)[1] for where in running.addresses if not is_unix(where)), 0)
        if config.health_port is not None:
            running.health_server = grpc.aio.server(options=SERVER_OPTIONS)
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, running.health_server)
            running.health_port = _listen(running.health_server, config.host, config.health_port, None)
        if running.metrics is not None:
            running.metrics_endpoint = _metrics_endpoint(running.metrics, config.metrics_address)
    except PortUnavailable:
        executor.shutdown()
        if service.store is not None:
            service.store.close()
        raise
    await server.start()
    if running.health_server is not None:
        await running.health_server.start()
    if service.store is not None:
        running.snapshots = asyncio.create_task(_snapshot_periodically(servicer, config.snapshot_seconds))
    if replicas.resolved_by_dns:
        running.resolving = asyncio.create_task(_resolve_periodically(replicas))
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return running


def _restore(service: Service) -> None:
    """The data directory taken (DataDirInUse when another server has it) and its worlds restored,
    before anything listens: health says SERVING only once they all are."""
    store = service.store
    store.open()
    started = time.monotonic()
    try:
        restored = service.restore()
    except BaseException:
        store.close()
        raise
    log.info("restored %d worlds from %s in %.2f s (fsync %s)", len(restored), store.path,
             time.monotonic() - started, store.fsync)


async def _resolve_periodically(replicas: Replicas) -> None:
    while True:
        await asyncio.sleep(RESOLVE_SECONDS)
        await asyncio.to_thread(replicas.refresh)


async def _snapshot_periodically(servicer: BroadphaseServicer, seconds: float) -> None:
    while True:
        await asyncio.sleep(seconds)
        servicer.snapshot_changed_worlds()


def _metrics_endpoint(metrics: Metrics, address: str) -> MetricsEndpoint:
    host, port = split_address(address)
    try:
        return MetricsEndpoint(metrics, host, port)
    except OSError as exc:
        raise PortUnavailable(f"cannot serve metrics on {address}: {exc.strerror or exc}") from None


HEALTH_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
# Two servers must never share a port silently.
SERVER_OPTIONS = [("grpc.so_reuseport", 0)]
# The least time between a client's keepalive pings that the server accepts; the SDK's are a minute
# apart (dbvt_client.transport.CHANNEL_OPTIONS). Faster pings are treated as abuse: GOAWAY.
MIN_CLIENT_PING_MS = 10_000


def keepalive_options(config: Config) -> list[tuple[str, int]]:
    """The server pings every connection that is silent for keepalive_seconds and closes it, with
    its streams, when no answer comes within as long again: a client whose host vanished (no FIN, no
    RST) holds nothing for long. A connection without calls for max_connection_idle_seconds is
    closed too (clients reconnect on their next call)."""
    keepalive_ms = int(config.keepalive_seconds * 1000)
    return [("grpc.keepalive_time_ms", keepalive_ms), ("grpc.keepalive_timeout_ms", keepalive_ms),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
            # gRPC otherwise spaces the server's own pings minutes apart, whatever keepalive_time says.
            ("grpc.http2.min_time_between_pings_ms", keepalive_ms),
            ("grpc.http2.min_sent_ping_interval_without_data_ms", keepalive_ms),
            ("grpc.http2.ping_timeout_ms", keepalive_ms),
            ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_MS),
            ("grpc.max_connection_idle_ms", int(config.max_connection_idle_seconds * 1000))]


def _listen_at(server: grpc.aio.Server, where: str, credentials: grpc.ServerCredentials | None) -> str:
    """`where` as bound: a Unix socket's address as given, a TCP address with the port it was given."""
    if not is_unix(where):
        host, port = split_address(where)
        return address(host, _listen(server, host, port, credentials))
    path = unix_path(where)
    if _socket_answers(path):
        # gRPC would unlink the file and take the address from the server answering on it.
        raise PortUnavailable(f"cannot listen on {where}: another server is listening on that socket")
    try:
        bound = server.add_secure_port(where, credentials) if credentials else server.add_insecure_port(where)
    except RuntimeError:
        bound = 0
    if not bound:
        raise PortUnavailable(f"cannot listen on {where}: {_unix_error(path)}")
    return where


def _socket_answers(path: str) -> bool:
    """Whether a server answers on the socket file at `path`; a file left by one that is gone is
    removed."""
    if not os.path.exists(path) or not stat.S_ISSOCK(os.stat(path).st_mode):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)
            return False
        except OSError:
            return False
    return True


def _unix_error(path: str) -> str:
    if os.path.exists(path) and not stat.S_ISSOCK(os.stat(path).st_mode):
        return "a file that is not a socket is in the way"
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        return f"directory {directory} does not exist"
    return "the socket cannot be created there (permissions, or a path longer than 107 bytes)"


def _listen(server: grpc.aio.Server, host: str, port: int, credentials: grpc.ServerCredentials | None) -> int:
    """The port `server` was given on host:port, with TLS when given credentials."""
    where = address(host, port)
    try:
        bound = server.add_secure_port(where, credentials) if credentials else server.add_insecure_port(where)
    except RuntimeError:
        bound = 0
    if not bound:
        raise PortUnavailable(f"cannot listen on {where}: {_bind_error(host, port)}")
    return bound


def _security(config: Config) -> str:
    tls = "mutual TLS" if config.tls_client_ca else "TLS" if config.tls_cert else "plaintext"
    return f"{tls}, {'tokens' if config.tokens else 'no tokens'}"


def _bind_error(host: str, port: int) -> str:
    """Why the address cannot be listened on, in the system's words: gRPC's own error says only to set
    GRPC_VERBOSITY=debug and look at its log."""
    try:
        family, kind, protocol, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, protocol) as probe:
            # As gRPC's listener does, so that only a port really in use fails.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
    except OSError as exc:
        return exc.strerror or str(exc)
    return "the port is in use or the address is not available"


async def serve(config: Config) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully."""
    running = await create_server(config)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Before the start-up line: whoever waits for it may signal at once.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    loop.add_signal_handler(signal.SIGHUP, running.reload)
    if running.health_port is not None:
        log.info("health service on %s, plaintext, without tokens", address(config.host, running.health_port))
    if running.metrics_endpoint is not None:
        log.info("metrics on http://%s/metrics (and /healthz, /readyz)",
                 address(split_address(config.metrics_address)[0], running.metrics_endpoint.port))
    log.info("dbvt-server listening on %s (%s, workers=%d, threads_per_world=%d, cores=%d, max_message_bytes=%d, "
             "max_worlds=%d, max_proxies_per_world=%d)", ", ".join(running.addresses), _security(config),
             config.workers, config.threads_per_world, config.cores, config.max_message_bytes, config.max_worlds,
             config.max_proxies_per_world)
    if config.exposed:
        log.warning("listening on %s, beyond this machine, without %s: anyone who can reach the port may read, "
                    "change and delete every world (see docs/operations.md, Security)",
                    ", ".join(config.exposed_hosts),
                    " and ".join(what for what, given in (("TLS", config.tls_cert), ("tokens", config.tokens))
                                 if not given))
    await stopping.wait()
    log.info("stopping: finishing calls in flight (grace %.1f s)", config.grace_seconds)
    await running.stop(config.grace_seconds, config.drain_seconds)
    log.info("stopped")
