"""Building, running and gracefully stopping the gRPC server."""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server.config import Config
from dbvt_server.logs import Rejections
from dbvt_server.service import Limits, Service
from dbvt_server.servicer import BroadphaseServicer, add_to_server

log = logging.getLogger("dbvt_server")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["BroadphaseService"].full_name


class PortUnavailable(RuntimeError):
    pass


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Running:
    """A started server and what must be shut down with it."""

    def __init__(self, server: grpc.aio.Server, port: int, health_servicer, executor: ThreadPoolExecutor,
                 rejections: Rejections):
        self.server = server
        self.port = port
        self.health = health_servicer
        self.executor = executor
        self.rejections = rejections

    async def stop(self, grace: float) -> None:
        """Refuse new calls, let calls in flight finish for up to `grace` seconds, then cancel them."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        # An operation that had started when its call was cancelled runs to its end (see world_queue).
        self.executor.shutdown(wait=True)
        self.rejections.flush()


async def create_server(config: Config) -> Running:
    """A started server listening on `config.host:config.port` (port 0: a free port, see `.port`)."""
    executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="dbvt-world")
    limits = Limits(config.max_worlds, config.max_proxies_per_world, config.max_message_bytes)
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", -1),
        # Two servers must never share a port silently.
        ("grpc.so_reuseport", 0),
    ])
    rejections = Rejections()
    add_to_server(BroadphaseServicer(Service(limits), executor, rejections), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server)
    where = address(config.host, config.port)
    try:
        port = server.add_insecure_port(where)
    except RuntimeError:
        port = 0
    if not port:
        executor.shutdown()
        raise PortUnavailable(f"cannot listen on {where}: {_bind_error(config.host, config.port)}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Running(server, port, health_servicer, executor, rejections)


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
    log.info("dbvt-server listening on %s (workers=%d, max_message_bytes=%d, max_worlds=%d, "
             "max_proxies_per_world=%d)", address(config.host, running.port), config.workers,
             config.max_message_bytes, config.max_worlds, config.max_proxies_per_world)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("stopping: finishing calls in flight (grace %.1f s)", config.grace_seconds)
    await running.stop(config.grace_seconds)
    log.info("stopped")
