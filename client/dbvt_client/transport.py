"""How a `Client` reaches its worlds: a gRPC channel, or (`local()`) the server's service in this process.

Both raise the SDK's error classes, so everything above them is the same code for both.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

import grpc

from dbvt_client import parts
from dbvt_client.errors import client_closed, from_rpc_error, from_stream_status
from dbvt_client.query_stream import QUERY_FIELDS, QueryStream
from dbvt_client.security import call_metadata, open_channel, tls_settings
from dbvt_client.serialized import passing_bytes
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc

# Replies are as big as the answers; requests are split by the SDK to the server's own limit. A
# keepalive ping each minute on a silent connection with calls open finds a dead server (the server
# accepts pings 10 s apart at the most frequent).
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                   ("grpc.keepalive_time_ms", 60_000), ("grpc.keepalive_timeout_ms", 20_000)]
# gRPC's name-resolver schemes whose addresses are paths or names, which take no port.
PORTLESS_SCHEMES = ("unix", "unix-abstract", "vsock")
HOST_AND_PORT = re.compile(r"(\[[^\]]*\]|[^:\[\]]+):\d+")
# RPCs that answer with a stream of parts of one answer.
ANSWERED_IN_PARTS = ("ApplyBatch", "GetPairs", "ExportWorld", "GetSensorPairs", "Overlap")


def batch_streams(channel):
    """`channel`'s (grpc or grpc.aio) StreamBatches method, which sends the requests
    `batches.stream_requests` serialized as they are."""
    return channel.stream_stream("/dbvt.v1.BroadphaseService/StreamBatches",
                                 request_serializer=passing_bytes(pb.StreamBatchesRequest.SerializeToString),
                                 response_deserializer=pb.StreamBatchesResponse.FromString, _registered_method=True)


def checked_target(target: str) -> str:
    """`target`, refused when it names a host without a port: gRPC would quietly dial port 443 instead
    (or, for the ipv4:/ipv6: forms, fail on the first call with "the target uri is not valid").

    Every address of the forms gRPC resolves by host must carry its port (`host:port`, `[::1]:port`,
    `dns:///host:port`, `ipv4:a.b.c.d:port,...`, `ipv6:[addr]:port,...`); unix sockets and other
    schemes (`unix:path`, `unix:///path`, `xds:///name`) are passed on as they are.
    """
    if not isinstance(target, str):
        raise TypeError(f"target must be a str such as '127.0.0.1:50051', not {target!r}")
    scheme, _, rest = target.partition(":")
    if scheme in PORTLESS_SCHEMES:
        return target
    if scheme == "dns":
        # dns:[//authority/]host:port
        addresses = [rest[2:].partition("/")[2] if rest.startswith("//") else rest]
    elif scheme in ("ipv4", "ipv6"):
        addresses = rest.split(",")
    elif "://" in target:
        return target
    else:
        addresses = [target]
    if not all(HOST_AND_PORT.fullmatch(address) for address in addresses):
        raise ValueError(f"target {target!r} has no port: give it as host:port, "
                         f"such as '127.0.0.1:50051' or '[::1]:50051'")
    return target


class Connection:
    """What every call of a Client carries: where, over what, with which token."""

    def __init__(self, target: str, timeout: float | None, token: str | None, tls):
        self.target = checked_target(target)
        self.tls = tls_settings(tls)
        self.metadata = call_metadata(token, self.target, self.tls)
        self.timeout = timeout

    def channel(self, grpc_module):
        return open_channel(grpc_module, self.target, self.tls, CHANNEL_OPTIONS)


class GrpcTransport:
    def __init__(self, connection: Connection):
        self._channel = connection.channel(grpc)
        self._stub = pb_grpc.BroadphaseServiceStub(self._channel)
        self._stream_batches = batch_streams(self._channel)
        self._timeout = connection.timeout
        self._metadata = connection.metadata
        self._query_stream = QueryStream(self._channel, self._metadata, self._timeout)
        self._closed = False

    def _stub_if_open(self) -> pb_grpc.BroadphaseServiceStub:
        # gRPC's own refusal on a closed channel is a ValueError, which would read as a bad argument.
        if self._closed:
            raise client_closed()
        return self._stub

    def unary(self, method: str, request):
        try:
            answer = getattr(self._stub_if_open(), method)(request, timeout=self._timeout, metadata=self._metadata)
            return parts.joined(list(answer)) if method in ANSWERED_IN_PARTS else answer
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def query(self, method: str, requests: list):
        """The answer to a query set at one tick, asked on the transport's query stream."""
        if method not in QUERY_FIELDS:
            return self.unary(method, requests[0])
        return self._query_stream.ask(method, requests)

    def upload(self, method: str, requests: list):
        """A client-streaming call: its parts sent, its one answer."""
        try:
            return getattr(self._stub_if_open(), method)(iter(requests), timeout=self._timeout,
                                                         metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def watch(self, request: pb.WatchSensorsRequest):
        """The world's sensor feed (an iterator of messages), and what stops it."""
        call = self._stub_if_open().WatchSensors(request, metadata=self._metadata)
        return call, call.cancel

    def stream(self, requests: Iterable[bytes], world: str) -> Iterator[pb.StreamBatchesResponse]:
        """A batch stream of `world` (a routed client picks the server by it), its call started now:
        the first batch does not wait for the call to be set up."""
        self._stub_if_open()
        return _stream_statuses(self._stream_batches(iter(requests), metadata=self._metadata))

    def close(self) -> None:
        self._closed = True
        self._query_stream.close()
        self._channel.close()


def local_transport(asynchronous: bool, max_worlds: int, max_proxies_per_world: int):
    """The worlds of `Client.local()` and `AsyncClient.local()`: the server's service, in this process."""
    for name, value in (("max_worlds", max_worlds), ("max_proxies_per_world", max_proxies_per_world)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"local({name}={value!r}): {name} must be int")
        if value < 1:
            raise ValueError(f"local({name}={value!r}): {name} must be positive")
    try:
        from dbvt_server import local
    except ImportError as exc:
        raise ImportError("Client.local() runs the server's worlds in this process, which needs the server "
                          f"distribution: pip install dbvt-server ({exc})") from exc
    made = local.AsyncLocalTransport if asynchronous else local.LocalTransport
    return made(max_worlds, max_proxies_per_world)


def _stream_statuses(responses) -> Iterator[pb.StreamBatchesResponse]:
    """A batch stream's answers, and the status it ended with as the SDK's error."""
    try:
        yield from responses
    except grpc.RpcError as error:
        raise from_stream_status(error.code(), error.details()) from None
