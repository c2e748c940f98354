"""The query stream a transport keeps open to its server (StreamQueries): every query set goes on it.

A message on an open stream costs less than a unary call (a small query's round trip took 0.89-0.94
of a call's, docs/benchmarks.md), and a game server asks its queries every tick. Each set is tagged with a sequence number
and answered as soon as its world has done it, so callers on several threads (or tasks) share one
stream and a set on a busy world does not hold back the answer of one on an idle world.

Queries change nothing, so a set whose stream ended before its answer (the server restarted, or
shut down and ended its streams) is asked once more on a new stream. The client's timeout bounds the
wait for each set, and travels with it (timeout_ms) so that the server drops a set whose turn comes
too late instead of answering nobody.
"""
from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from types import SimpleNamespace

import grpc

from dbvt_client import parts
from dbvt_client.errors import (DbvtError, DeadlineExceeded, Unavailable, client_closed, from_exception,
                                from_refusal, from_status_number)
from dbvt_client.serialized import passing_bytes, reader, serialized
from dbvt_proto.v1 import broadphase_pb2 as pb

METHOD = "/dbvt.v1.BroadphaseService/StreamQueries"
# Each query RPC's field in a QueryRequest.
QUERY_FIELDS = {"QueryAabb": "aabb", "QuerySphere": "sphere", "Raycast": "raycast", "QueryFrustum": "frustum",
                "QueryNearest": "nearest", "CastBox": "cast_box", "CastSphere": "cast_sphere"}
_END = object()
# Closing a client waits at most this long for the server to end its query stream.
CLOSE_SECONDS = 1.0


class StreamEnded(Exception):
    """The stream ended before answering a set: the set had no effect and may be asked again."""

    def __init__(self, error: DbvtError):
        super().__init__(error.message)
        self.error = error


def stream_method(channel):
    """`channel`'s (grpc or grpc.aio) StreamQueries, taking requests serialized and reading answers
    in place, as the unary query methods do (dbvt_client.serialized)."""
    return channel.stream_stream(METHOD, request_serializer=passing_bytes(pb.StreamQueriesRequest.SerializeToString),
                                 response_deserializer=reader(pb.StreamQueriesResponse), _registered_method=True)


def set_requests(sequence: int, method: str, requests: list, timeout: float | None) -> list[bytes]:
    """A query set's parts as the stream's messages; the last carries the time left to answer it."""
    field = QUERY_FIELDS[method]
    timeout_ms = 0 if timeout is None else max(1, min(int(timeout * 1000), 2**32 - 1))
    return [serialized(pb.StreamQueriesRequest, sequence=sequence, query={field: request.SerializeToString()},
                       more_parts=number < len(requests), timeout_ms=timeout_ms if number == len(requests) else 0)
            for number, request in enumerate(requests, 1)]


class _Answer:
    """One set's answer as the stream brings it: its parts, then its future settled (a
    concurrent.futures.Future, or an asyncio.Future resolved on its loop)."""

    def __init__(self, method: str, future):
        self.field = QUERY_FIELDS[method]
        self.future = future
        self.parts: list = []

    def take(self, response) -> bool:
        """Whether `response` was the set's last message, which settles it."""
        if response.status_code:
            return self.fail(from_refusal(response.status_code, response.status_message, response.world_server))
        part = None if response.answer is None else getattr(response.answer, self.field)
        if part is None:
            return self.fail(from_exception(ValueError(f"the answer to a {self.field} query set holds another kind")))
        self.parts.append(part)
        if response.more_parts:
            return False
        if not self.future.done():
            self.future.set_result(self._whole())
        return True

    def fail(self, error: Exception) -> bool:
        if not self.future.done():
            self.future.set_exception(error)
        return True

    def _whole(self):
        """The answer from its parts (a large box query set comes in pieces as the server finds them,
        and any answer bigger than a message in parts): each column joined, copied once; the other
        fields, the same in every part, from the first. Query answers hold no message fields."""
        if len(self.parts) == 1:
            return self.parts[0]
        return SimpleNamespace(**{name: b"".join([getattr(part, name) for part in self.parts])
                                  if isinstance(value, memoryview) else value
                                  for name, value in vars(self.parts[0]).items()})


class _Waiting:
    """The sets a stream has not answered, by sequence number; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._answers: dict[int, _Answer] = {}
        self.ended: DbvtError | None = None

    def add(self, sequence: int, answer: _Answer) -> bool:
        """Whether the set was taken: not once the stream has ended (a new one must carry it)."""
        with self._lock:
            if self.ended is None:
                self._answers[sequence] = answer
            return self.ended is None

    def forget(self, sequence: int) -> None:
        """A set its caller stopped waiting for: its answer, if one comes, is dropped."""
        with self._lock:
            self._answers.pop(sequence, None)

    def take(self, response) -> None:
        with self._lock:
            answer = self._answers.get(response.sequence)
        if answer is not None and answer.take(response):
            self.forget(response.sequence)

    def end(self, error: DbvtError) -> None:
        """The stream is over: every set still waiting fails with StreamEnded."""
        with self._lock:
            self.ended = error
            answers, self._answers = self._answers, {}
        for answer in answers.values():
            answer.fail(StreamEnded(error))


def _stream_error(failure: Exception | None) -> DbvtError:
    """How a stream's end is told to the sets it had not answered."""
    if failure is None:
        return Unavailable("the server ended the query stream (it is shutting down)")
    if not isinstance(failure, grpc.RpcError):
        return from_exception(failure)
    if failure.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return Unavailable(f"the query stream was cut off ({failure.details() or failure.code().name})")
    return from_status_number(failure.code().value[0], failure.details() or "")


def _ask_again(error: DbvtError) -> bool:
    """Whether a set whose stream ended with `error` is worth asking on a new stream: only when the
    stream was cut off or ended, not when the server refused it (a token it does not know)."""
    return type(error) is Unavailable


def _timed_out(timeout: float | None) -> DeadlineExceeded:
    return DeadlineExceeded(f"no answer to the query set within the client's timeout of {timeout} s")


class QueryStream:
    """The query stream of a `GrpcTransport`: opened at its first set, and again after it ends."""

    def __init__(self, channel, metadata, timeout: float | None):
        self._method = stream_method(channel)
        self._metadata = metadata
        self._timeout = timeout
        self._lock = threading.Lock()
        self._sequence = itertools.count(1)
        self._requests: queue.SimpleQueue | None = None
        self._waiting: _Waiting | None = None
        self._reader: threading.Thread | None = None
        # Set by close(): a set asked after it (or asked again after it) opens no stream.
        self._closed = False

    def ask(self, method: str, requests: list):
        """The answer to a query set, or the error it was refused with."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        for attempt in range(2):
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            future: Future = Future()
            waiting, sequence = self._send(method, requests, remaining, future)
            try:
                return future.result(remaining)
            except FutureTimeout:
                waiting.forget(sequence)
                raise _timed_out(self._timeout) from None
            except StreamEnded as ended:
                if attempt or not _ask_again(ended.error):
                    raise ended.error from None
        raise AssertionError("a set is asked at most twice")

    def _send(self, method: str, requests: list, timeout: float | None, future: Future) -> tuple[_Waiting, int]:
        with self._lock:
            if self._closed:
                raise client_closed()
            sequence, answer = next(self._sequence), _Answer(method, future)
            if self._requests is None or not self._waiting.add(sequence, answer):
                self._open(sequence, answer)
            # Under the lock, so that the parts of one set go out one after another.
            for message in set_requests(sequence, method, requests, timeout):
                self._requests.put(message)
            return self._waiting, sequence

    def _open(self, sequence: int, answer: _Answer) -> None:
        """A new stream, waiting for set `sequence` before its reader starts (which may find the stream
        ended at once)."""
        requests, waiting = queue.SimpleQueue(), _Waiting()
        waiting.add(sequence, answer)
        # Made first: should the call fail, the stream before is left as it was.
        responses = self._method(iter(requests.get, _END), metadata=self._metadata)
        self._requests, self._waiting = requests, waiting
        self._reader = threading.Thread(target=_read, args=(responses, waiting), daemon=True, name="dbvt-query-stream")
        self._reader.start()

    def close(self) -> None:
        """End the stream: the server answers what it has and ends it with OK (a stream cut off by the
        channel's closing would count as CANCELLED in the server's metrics)."""
        with self._lock:
            self._closed = True
            if self._requests is None:
                return
            self._requests.put(_END)
            self._requests, reader = None, self._reader
        reader.join(CLOSE_SECONDS)


def _read(responses, waiting: _Waiting) -> None:
    failure = None
    try:
        for response in responses:
            waiting.take(response)
    except Exception as error:
        failure = error
    waiting.end(_stream_error(failure))


class AsyncQueryStream:
    """`QueryStream` for `AsyncClient`: the stream is a grpc.aio call, read by a task of its loop."""

    def __init__(self, channel, metadata, timeout: float | None):
        self._method = stream_method(channel)
        self._metadata = metadata
        self._timeout = timeout
        self._sequence = itertools.count(1)
        self._call = None
        self._waiting: _Waiting | None = None
        self._reading: asyncio.Task | None = None
        # The task writing the call's last set, which the next set's writer follows (parts.written_after).
        self._writing: asyncio.Task | None = None
        self._closed = False

    async def ask(self, method: str, requests: list):
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        for attempt in range(2):
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            future = asyncio.get_running_loop().create_future()
            call, waiting, sequence, written = self._send(method, requests, remaining, future)
            try:
                return await asyncio.wait_for(_answered(written, future), remaining)
            except asyncio.TimeoutError:
                if not written.done():
                    # The timeout bounds the sending too: a server that reads nothing holds the write
                    # back, and the stream is of no more use.
                    call.cancel()
                raise _timed_out(self._timeout) from None
            except StreamEnded as ended:
                if attempt or not _ask_again(ended.error):
                    raise ended.error from None
            finally:
                # Answered, refused, timed out or cancelled: an answer still to come is dropped.
                waiting.forget(sequence)
        raise AssertionError("a set is asked at most twice")

    def _send(self, method: str, requests: list, timeout: float | None, future):
        """The set registered on the open stream (opened if need be) and its writer started: the call,
        its waiting sets, the set's sequence, and its writer."""
        if self._closed:
            raise client_closed()
        sequence, answer = next(self._sequence), _Answer(method, future)
        messages = set_requests(sequence, method, requests, timeout)
        if self._call is None or not self._waiting.add(sequence, answer):
            self._call, self._waiting, self._writing = self._method(metadata=self._metadata), _Waiting(), None
            self._waiting.add(sequence, answer)
            self._reading = asyncio.create_task(_read_async(self._call, self._waiting))
        self._writing = asyncio.create_task(_written(self._writing, self._call, messages))
        return self._call, self._waiting, sequence, self._writing

    async def close(self) -> None:
        """See `QueryStream.close`."""
        self._closed = True
        if self._call is None:
            return
        call, reading, writing, self._call = self._call, self._reading, self._writing, None
        if writing is not None:
            # Sets asked before go out whole first, unless the server reads nothing.
            await asyncio.wait([writing], timeout=CLOSE_SECONDS)
        if writing is None or writing.done():
            try:
                await call.done_writing()
            except (grpc.RpcError, asyncio.InvalidStateError):
                pass    # the call is already over
            await asyncio.wait([reading], timeout=CLOSE_SECONDS)
        if not reading.done():
            call.cancel()
            await asyncio.wait([reading])


async def _answered(written: asyncio.Task, future: asyncio.Future):
    """The set's answer once its writer is done; cancelled meanwhile, the writer goes on."""
    await asyncio.wait([written])
    return await future


async def _written(before: asyncio.Task | None, call, messages: list[bytes]) -> None:
    """A set's messages, written in its turn (`parts.written_after`)."""
    try:
        await parts.written_after(before, call.write, messages)
    except (grpc.RpcError, asyncio.InvalidStateError):
        pass    # the call is over: its reader fails the set with how it ended
    except asyncio.CancelledError:
        if not call.cancelled():
            raise
        # The call was cancelled under the write (a set's timeout): its reader fails its sets.


async def _read_async(call, waiting: _Waiting) -> None:
    failure = None
    try:
        async for response in call:
            waiting.take(response)
    except asyncio.CancelledError:
        if not call.cancelled():
            raise
        # This client cancelled the call: a set's write was held back past its timeout, or close()
        # found the server not ending the stream.
        failure = Unavailable("the query stream was cut off: the server did not read it, or end it, in time")
    except Exception as error:
        failure = error
    finally:
        # Also when the task is cancelled (a client closed while its server hung).
        waiting.end(_stream_error(failure))
