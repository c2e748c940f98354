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
from dbvt_client.errors import InvalidArgument, ResourceExhausted
from dbvt_client.serialized import serialized
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server import access
from dbvt_server.decoding import decoded
from dbvt_server.staging import STAGED_BYTES_PER_PROXY, Hold, StagedBytes, stream_error
from dbvt_server.world_queue import failed
from dbvt_server.worlds import WORLD_RPCS, World

# The query RPCs, by the name of their field in a QueryRequest.
QUERY_KINDS = {"aabb": "QueryAabb", "sphere": "QuerySphere", "raycast": "Raycast", "frustum": "QueryFrustum",
               "nearest": "QueryNearest", "cast_box": "CastBox", "cast_sphere": "CastSphere"}
# Sets of one stream being answered at once; the stream's next message is read when one is answered,
# so a client that sends faster than its worlds answer cannot make the server hold more.
SETS_IN_FLIGHT = 8


class QuerySetParts:
    """The parts of one stream's multi-part query set, until its last part arrives."""

    def __init__(self, budget: StagedBytes, limit: int):
        self._budget = budget
        self._limit = limit
        self._sequence: int | None = None
        self._pieces: list = []
        self._hold: Hold | None = None

    def add(self, request: pb.StreamQueriesRequest) -> tuple[str, object, Hold | None] | None:
        """The set's kind, its one joined request and what it holds of the budget once `request` is its
        last part; None before. Raises if the parts disagree or cannot be held; the set is then dropped."""
        kind = request.query.WhichOneof("query")
        if kind is None:
            self._drop()
            raise InvalidArgument(f"query set {request.sequence} holds no query")
        if self._sequence is None and not request.more_parts:
            return kind, getattr(request.query, kind), None
        if self._sequence is not None and request.sequence != self._sequence:
            staged = self._sequence
            self._drop()
            raise InvalidArgument(f"query set {request.sequence} arrived before the last part of query set "
                                  f"{staged}; that set is dropped")
        if self._pieces and self._pieces[0][0] != kind:
            error = InvalidArgument(f"part {len(self._pieces)} of query set {request.sequence} holds {kind}, "
                                    f"not {self._pieces[0][0]}; every part must hold the same kind")
            self._drop()
            raise error
        self._sequence = request.sequence
        self._hold = self._hold or self._budget.hold()
        try:
            self._hold.take(request.query.ByteSize(), f"part {len(self._pieces)} of query set {request.sequence}")
            if self._hold.size > self._limit:
                raise ResourceExhausted(f"a query set of more than {self._limit} bytes cannot be held (as a batch "
                                        "of a world of the server's limit of proxies could need)")
        except ResourceExhausted:
            self._drop()
            raise
        self._pieces.append((kind, getattr(request.query, kind)))
        if request.more_parts:
            return None
        pieces, hold = [piece for _, piece in self._pieces], self._hold
        self._sequence, self._pieces, self._hold = None, [], None
        try:
            return kind, parts.joined_queries(pieces), hold
        except Exception:
            hold.release()
            raise

    def unfinished(self) -> int | None:
        """The sequence of a set whose last part never came, dropped; None if there is none."""
        sequence = self._sequence
        self._drop()
        return sequence

    def _drop(self) -> None:
        if self._hold is not None:
            self._hold.release()
        self._sequence, self._pieces, self._hold = None, [], None


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
        limit = STAGED_BYTES_PER_PROXY * self.service.limits.max_proxies_per_world
        staging = QuerySetParts(self.service.staged, limit)
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
