"""How a `Client` reaches its worlds: a gRPC channel, or a `Service` in this process.

Both raise the SDK's error classes, so everything above them is the same code for both.
"""
from __future__ import annotations

import threading
from typing import Iterable, Iterator

import grpc

from dbvt_client.errors import from_exception, from_rpc_error
from dbvt_client.service import BatchStaging, Limits, Service, stream_error
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


class LocalTransport:
    """The service in-process; one lock makes it safe to share between threads."""

    def __init__(self, limits: Limits, broadphase_class):
        self.service = Service(limits, broadphase_class)
        self._lock = threading.Lock()

    def unary(self, method: str, request):
        with self._lock:
            try:
                return self.service.call(method, request)
            except Exception as exc:
                raise from_exception(exc) from None

    def stream(self, requests: Iterable[pb.StreamBatchesRequest]) -> Iterator[pb.StreamBatchesResponse]:
        staging = self.staging()
        for request in requests:
            response = self.stream_step(staging, request)
            if response is not None:
                yield response

    def staging(self) -> BatchStaging:
        return BatchStaging(self.service.limits)

    def stream_step(self, staging: BatchStaging, request: pb.StreamBatchesRequest) -> pb.StreamBatchesResponse | None:
        """The answer to one stream message: None while a multi-part batch is still arriving."""
        try:
            batch = staging.add(request)
            if batch is None:
                return None
            with self._lock:
                result = self.service.world(request.world).apply(batch)
            return pb.StreamBatchesResponse(sequence=request.sequence, result=result)
        except Exception as exc:
            return stream_error(request.sequence, from_exception(exc))

    def close(self) -> None:
        """Nothing to release: the worlds go with the client."""


def local_transport(max_worlds: int, max_proxies_per_world: int) -> LocalTransport:
    """The worlds of `Client.local()`: `dbvt.Broadphase` in this process."""
    try:
        from dbvt import Broadphase
    except ImportError as exc:
        raise ImportError(f"Client.local() runs the dbvt core in-process; install dbvt-server for it ({exc})") from exc
    # In-process calls carry no messages, so nothing needs splitting.
    return LocalTransport(Limits(max_worlds, max_proxies_per_world, max_message_bytes=2**62), Broadphase)

