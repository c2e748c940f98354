"""How a `Client` reaches its worlds: a gRPC channel, or (`local()`) the server's service in this process.

Both raise the SDK's error classes, so everything above them is the same code for both.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import grpc

from dbvt_client.errors import from_rpc_error
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc

# Replies are as big as the answers; requests are split by the SDK to the server's own limit.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


class GrpcTransport:
    def __init__(self, target: str, timeout: float | None):
        self._channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.BroadphaseServiceStub(self._channel)
        self._timeout = timeout

    def unary(self, method: str, request):
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def stream(self, requests: Iterable[pb.StreamBatchesRequest]) -> Iterator[pb.StreamBatchesResponse]:
        try:
            yield from self._stub.StreamBatches(iter(requests))
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def close(self) -> None:
        self._channel.close()


def local_transport(asynchronous: bool, max_worlds: int, max_proxies_per_world: int):
    """The worlds of `Client.local()` and `AsyncClient.local()`: the server's service, in this process."""
    try:
        from dbvt_server import local
    except ImportError as exc:
        raise ImportError("Client.local() runs the server's worlds in this process, which needs the server "
                          f"distribution: pip install dbvt-server ({exc})") from exc
    made = local.AsyncLocalTransport if asynchronous else local.LocalTransport
    return made(max_worlds, max_proxies_per_world)
