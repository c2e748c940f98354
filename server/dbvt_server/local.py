"""The service in-process, for `Client.local()` and `AsyncClient.local()`: no server, no network.

These transports speak the SDK's transport interface (`unary`, `query`, `stream`/`open_stream`, `close`) and
raise the SDK's error classes, so everything above them is the same code for local and remote worlds.
The SDK imports this module only when `local()` is called, so it installs without the server.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Callable, Iterable, Iterator

from dbvt_client import parts
from dbvt_client.errors import client_closed, from_exception
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server.service import Limits, Service
from dbvt_server.staging import BatchStaging, stream_error, unfinished_error
from dbvt_server.watch import heartbeat, watched_sensors

# A watcher that has had no message for this long gets a heartbeat, as from the server.
HEARTBEAT_SECONDS = 1.0

# In-process calls carry no messages, so nothing needs splitting.
UNLIMITED_MESSAGE_BYTES = 2**62


class LocalTransport:
    """The service in-process; one lock makes it safe to share between threads."""

    def __init__(self, max_worlds: int, max_proxies_per_world: int):
        self.service = Service(Limits(max_worlds, max_proxies_per_world, UNLIMITED_MESSAGE_BYTES))
        self._lock = threading.Lock()
        self.closed = False

    def refuse_if_closed(self) -> None:
        """As a closed channel's client does: the same code behaves the same on both."""
        if self.closed:
            raise client_closed()

    def unary(self, method: str, request):
        self.refuse_if_closed()
        with self._lock:
            try:
                return self.service.call(method, request)
            except Exception as exc:
                raise from_exception(exc) from None

    def query(self, method: str, requests: list):
        """A query set in parts, as the server does with Query: joined, then answered at once."""
        try:
            request = parts.joined_queries(requests) if len(requests) > 1 else requests[0]
        except Exception as exc:
            raise from_exception(exc) from None
        return self.unary(method, request)

    def upload(self, method: str, requests: list):
        """A client-streaming call (ImportWorld) whose parts are all here."""
        self.refuse_if_closed()
        with self._lock:
            try:
                return self.service.import_world(requests)
            except Exception as exc:
                raise from_exception(exc) from None

    def watch(self, request: pb.WatchSensorsRequest) -> tuple[Iterator[pb.WatchSensorsResponse], Callable[[], None]]:
        """A world's sensor feed, as the server sends it, and what stops it."""
        self.refuse_if_closed()
        woken, stopped = threading.Event(), threading.Event()
        with self._lock:
            try:
                world = self.service.world(request.world)
                from_tick = request.from_tick if request.HasField("from_tick") else None
                watcher = world.feed.watch(watched_sensors(request.sensors), from_tick, woken.set)
            except Exception as exc:
                raise from_exception(exc) from None

        def feed() -> Iterator[pb.WatchSensorsResponse]:
            try:
                while not stopped.is_set():
                    if watcher.needs_resync:
                        with self._lock:
                            world.feed.resync(watcher, world.broadphase.sensor_pairs())
                    woken.clear()
                    items, tick, closed = watcher.take()
                    for events in items:
                        yield events.message(request.narrow_ids)
                    if closed is not None and not items:
                        raise closed
                    if not items and not watcher.needs_resync and not woken.wait(HEARTBEAT_SECONDS):
                        yield heartbeat(tick, world.incarnation)
            finally:
                world.feed.unwatch(watcher)

        def stop() -> None:
            stopped.set()
            woken.set()

        return feed(), stop

    def stream(self, requests: Iterable, world: str) -> Iterator[pb.StreamBatchesResponse]:
        self.refuse_if_closed()
        staging = self.staging()
        try:
            for request in requests:
                response = self.stream_step(staging, request)
                if response is not None:
                    yield response
            ending = self.stream_end(staging)
            if ending is not None:
                yield ending
        finally:
            staging.unfinished()

    def staging(self) -> BatchStaging:
        return BatchStaging(self.service.limits.max_proxies_per_world, self.service.staged)

    def stream_step(self, staging: BatchStaging, request) -> pb.StreamBatchesResponse | None:
        """The answer to one stream message (as the SDK sends it, serialized, or the message): None while a
        multi-part batch is still arriving."""
        if isinstance(request, bytes):
            request = pb.StreamBatchesRequest.FromString(request)
        try:
            batch = staging.add(request)
            if batch is None:
                return None
            with self._lock:
                result = self.service.world(request.world).apply(batch, request.narrow_ids)
            return pb.StreamBatchesResponse(sequence=request.sequence, result=result)
        except Exception as exc:
            return stream_error(request.sequence, from_exception(exc))

    @staticmethod
    def stream_end(staging: BatchStaging) -> pb.StreamBatchesResponse | None:
        """The answer to a batch whose last part never came, when its stream ends."""
        unfinished = staging.unfinished()
        if unfinished is None:
            return None
        return stream_error(unfinished[1], unfinished_error(unfinished))

    def close(self) -> None:
        """Nothing to release: the worlds go with the client, and every call after this is refused."""
        self.closed = True


class _LocalStream:
    """A stream on the in-process service: each message is handled as it is written."""

    def __init__(self, local: LocalTransport):
        self._local = local
        self._staging = local.staging()
        self._responses: asyncio.Queue = asyncio.Queue()

    async def write(self, request) -> None:
        response = await asyncio.to_thread(self._local.stream_step, self._staging, request)
        if response is not None:
            self._responses.put_nowait(response)

    async def read(self):
        return await self._responses.get()

    async def done_writing(self) -> None:
        ending = self._local.stream_end(self._staging)
        if ending is not None:
            self._responses.put_nowait(ending)
        self._responses.put_nowait(None)


class AsyncLocalTransport:
    """`LocalTransport` for `AsyncClient`: each call runs on a thread, off the event loop."""

    def __init__(self, max_worlds: int, max_proxies_per_world: int):
        self._local = LocalTransport(max_worlds, max_proxies_per_world)

    async def unary(self, method: str, request):
        return await asyncio.to_thread(self._local.unary, method, request)

    async def query(self, method: str, requests: list):
        return await asyncio.to_thread(self._local.query, method, requests)

    async def upload(self, method: str, requests: list):
        return await asyncio.to_thread(self._local.upload, method, requests)

    async def watch(self, request: pb.WatchSensorsRequest):
        """The in-process feed, read on a thread."""
        feed, stop = await asyncio.to_thread(self._local.watch, request)

        async def messages():
            while (message := await asyncio.to_thread(next, feed, None)) is not None:
                yield message

        return messages(), stop

    def open_stream(self, world: str) -> _LocalStream:
        self._local.refuse_if_closed()
        return _LocalStream(self._local)

    async def close(self) -> None:
        """See `LocalTransport.close`."""
        self._local.close()
