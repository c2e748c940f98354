"""StreamQueries: query sets on one stream kept open, each answered as soon as its world has done it.

A mixin of `dbvt_server.servicer.BroadphaseServicer`, whose world queues, rights and error handling it
uses. The SDK keeps one such stream open per server and sends every query set on it: a message on an
open stream costs about half what a unary call of the same sizes does (docs/benchmarks.md), and a
game server asks queries every tick.

Answers go out in the order the worlds finish them, not the order the sets came in: a set on a busy
world must not hold back the answer of a set on an idle one. A multi-part set is staged until its
last part, within the server's budget of staged bytes, as a batch's parts are.
"""
from __future__ import annotations

import asyncio
import time

import grpc

from dbvt_client import parts
from dbvt_client.errors import InvalidArgument
from dbvt_client.query_stream import QUERY_FIELDS
from dbvt_client.serialized import serialized
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server import access
from dbvt_server.decoding import decoded
from dbvt_server.staging import Hold, QuerySet, StagedBytes, query_kind, stream_error
from dbvt_server.world_queue import failed
from dbvt_server.worlds import WORLD_RPCS, World

# The query RPCs, by the name of their field in a QueryRequest (the SDK's table, turned round).
QUERY_KINDS = {field: method for method, field in QUERY_FIELDS.items()}
# Sets of one stream being answered at once; the stream's next message is read when one is answered,
# so a client that sends faster than its worlds answer cannot make the server hold more.
SETS_IN_FLIGHT = 8


class StreamedSets:
    """A query stream's set in parts, staged (dbvt_server.staging.QuerySet) until its last part arrives."""

    def __init__(self, budget: StagedBytes, max_proxies_per_world: int):
        self._budget = budget
        self._max_proxies = max_proxies_per_world
        self._sequence: int | None = None
        self._set: QuerySet | None = None

    def add(self, request: pb.StreamQueriesRequest) -> tuple[str, object, Hold | None] | None:
        """The set's kind, its one request and what it holds of the budget once `request` is its last
        part; None before. Raises if the parts disagree or cannot be held; the set is then dropped."""
        name = f"query set {request.sequence}"
        if self._set is None and not request.more_parts:
            # A set in one message is not staged: nothing to hold, nothing to join.
            kind = query_kind(request.query, name)
            return kind, getattr(request.query, kind), None
        if self._set is not None and request.sequence != self._sequence:
            staged = self._sequence
            self.drop()
            raise InvalidArgument(f"{name} arrived before the last part of query set {staged}; that set is dropped")
        if self._set is None:
            self._sequence, self._set = request.sequence, QuerySet(self._budget, self._max_proxies, name)
        try:
            self._set.add(request.query)
            if request.more_parts:
                return None
            whole = self._set.joined()
        except Exception:
            self.drop()
            raise
        kind, hold = self._set.kind, self._set.hold
        self._sequence, self._set = None, None
        return kind, whole, hold

    def unfinished(self) -> int | None:
        """The sequence of a set whose last part never came, dropped; None if there is none."""
        sequence = self._sequence
        self.drop()
        return sequence

    def drop(self) -> None:
        if self._set is not None:
            self._set.hold.release()
        self._sequence, self._set = None, None


class QueryStreamRpcs:
    async def StreamQueries(self, request_iterator, context):
        """Each set's answer (or refusal) as soon as it is ready, while a reader task reads and starts
        the next sets; at most SETS_IN_FLIGHT sets wait for their answers."""
        if self.query_streams_ended:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down: ask another")
        answers: asyncio.Queue = asyncio.Queue()
        window = asyncio.Semaphore(SETS_IN_FLIGHT)
        reader = asyncio.create_task(self._start_query_sets(request_iterator, answers, window))
        self.query_stream_readers.add(reader)
        try:
            while (answer := await answers.get()) is not None:
                sequence, kind, outcome, started = answer
                try:
                    result = outcome.result()
                except Exception as exc:
                    error = self._rejections.log("StreamQueries", None, exc)
                    self._count_set(kind, started, error.code)
                    yield stream_error(sequence, error, pb.StreamQueriesResponse)
                else:
                    self._count_set(kind, started, grpc.StatusCode.OK)
                    for response in _answer_parts(sequence, kind, result, self._max_message_bytes):
                        yield response
                window.release()
            # Cancelled (at shutdown), the reader has answered what it started: the stream ends with OK.
            (ended,) = await asyncio.gather(reader, return_exceptions=True)
            if isinstance(ended, Exception):
                # A message that is not a StreamQueriesRequest: the stream cannot go on.
                await self._abort(context, "StreamQueries", None, ended)
        finally:
            self.query_stream_readers.discard(reader)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    def end_query_streams(self) -> None:
        """At shutdown: stop reading every query stream. Each answers the sets it has started and then
        ends with OK, so that a client kept idle on one does not hold the shutdown for its grace."""
        self.query_streams_ended = True
        for reader in list(self.query_stream_readers):
            reader.cancel()

    async def _start_query_sets(self, request_iterator, answers: asyncio.Queue, window: asyncio.Semaphore) -> None:
        """Each complete set of the stream started on its world; its answer queued when it is done."""
        staging = StreamedSets(self.service.staged, self.service.limits.max_proxies_per_world)
        started: set[asyncio.Future] = set()

        def answer_when_done(sequence: int, kind: str | None, outcome: asyncio.Future, hold: Hold | None) -> None:
            began = time.perf_counter()
            started.add(outcome)

            def done(_) -> None:
                started.discard(outcome)
                if hold is not None:
                    hold.release()
                answers.put_nowait((sequence, kind, outcome, began))

            outcome.add_done_callback(done)

        try:
            async for request in request_iterator:
                decoded(request)
                await window.acquire()
                try:
                    whole = staging.add(request)
                except Exception as exc:
                    answer_when_done(request.sequence, request.query.WhichOneof("query"), failed(exc), None)
                    continue
                if whole is None:
                    window.release()
                    continue
                kind, query, hold = whole
                answer_when_done(request.sequence, kind,
                                 self._start_query(request.sequence, kind, query, request.timeout_ms), hold)
            unfinished = staging.unfinished()
            if unfinished is not None:
                await window.acquire()
                answer_when_done(unfinished, None, failed(InvalidArgument(
                    f"the stream ended before the last part of query set {unfinished}; it was not asked")), None)
        finally:
            staging.unfinished()
            # Sets already started are answered (or, the stream gone, let finish) before the stream ends.
            await asyncio.gather(*started, return_exceptions=True)
            answers.put_nowait(None)

    def _start_query(self, sequence: int, kind: str, query, timeout_ms: int) -> asyncio.Future:
        """The set asked on its world; its future, of the stream's message that answers it, serialized
        there with the answer's columns copied once."""
        answer_fields = WORLD_RPCS[QUERY_KINDS[kind]]

        def answer(world: World, request) -> bytes:
            return serialized(pb.StreamQueriesResponse, sequence=sequence, answer={kind: answer_fields(world, request)})

        answer.__name__ = answer_fields.__name__
        try:
            access.require("read", query.world)
            world = self.service.world(query.world)
            deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms else None
            return self._start(world, answer, query, deadline)
        except Exception as exc:
            return failed(exc)

    def _count_set(self, kind: str | None, started: float, code: grpc.StatusCode) -> None:
        if self.metrics is not None:
            self.metrics.count_query_set(QUERY_KINDS.get(kind, "unknown"), started, code)


def _answer_parts(sequence: int, kind: str, response: bytes, max_bytes: int):
    """The stream's message that answers a set, itself or, too big for one, cut into parts."""
    if len(response) <= max_bytes:
        yield response
        return
    whole = getattr(pb.StreamQueriesResponse.FromString(response).answer, kind)
    pieces = list(parts.cut(whole, max_bytes - parts.PART_OVERHEAD))
    for number, piece in enumerate(pieces, 1):
        yield pb.StreamQueriesResponse(sequence=sequence, answer=pb.QueryResponse(**{kind: piece}),
                                       more_parts=number < len(pieces))
