"""The synchronous SDK's batch stream: batches pipelined on one bidirectional stream, answered in order.

Whoever needs an answer reads it. A caller of `apply()` reads the stream's answers itself, up to its
own, unless another thread is reading them; then it waits until that thread has read its answer or
stops reading. The futures of `submit()` have a reader thread of their own, started with the first
of them, which reads while any of them waits. So a tick applied with nothing else in flight is
answered on the caller's thread, straight from gRPC's, as a bare gRPC client's would be: no hand-off
through another thread and a future, which cost tens of microseconds a tick with the caches cold.
"""
from __future__ import annotations

import itertools
import queue
import threading
from collections import deque
from concurrent.futures import Future

from dbvt_client import batches, parts
from dbvt_client.errors import DbvtError, Unavailable, WrongServer, client_closed, from_exception
from dbvt_client.results import BatchResult

_END = object()
_UNANSWERED = object()


class _Sent:
    """A batch on the stream: its answer once read (a BatchResult, or the DbvtError it failed with),
    and the future that `submit()` returned for it, which gets the same."""

    __slots__ = ("answer", "future")

    def __init__(self, future: Future | None):
        self.answer = _UNANSWERED
        self.future = future


class BatchStream:
    """Batches pipelined on one bidirectional stream, answered in order.

    `submit(...)` sends a batch and returns a `concurrent.futures.Future` of its `BatchResult` without
    waiting; `apply(...)` waits. A rejected batch fails only its own future; the stream goes on.
    """

    def __init__(self, world):
        self._world = world
        self._header = batches.stream_header(world.name)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._responses = world._client._transport.stream(iter(self._requests.get, _END), world.name)
        self._answers = parts.StreamAnswers()
        self._sequence = itertools.count(1)
        # Guards everything below. Threads wait on `_turn` for the thread reading to finish; the reader
        # thread waits on `_submitted` for a future to read the answer of.
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)
        self._submitted = threading.Condition(self._lock)
        # The batches sent and not yet answered, in the order of their answers.
        self._sent: deque[_Sent] = deque()
        # The last batch sent by submit(), whose answer the reader thread reads up to.
        self._last_submitted: _Sent | None = None
        self._reader: threading.Thread | None = None
        # Whether a thread is reading an answer now, and how many threads wait for it on `_turn`.
        self._reading = False
        self._waiting = 0
        self._closed = False
        # Set once the stream has ended: later submits fail at once with it.
        self._failure: DbvtError | None = None
        self._cut = False

    def __enter__(self) -> "BatchStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit(self, create=None, move=None, destroy=None, *, static=None, group=None, mask=None, sensor=None,
               expected_tick: int | None = None) -> Future:
        future: Future = Future()
        self._send(_Sent(future), *self._encoded(create, move, destroy, static, group, mask, sensor, expected_tick))
        return future

    def apply(self, create=None, move=None, destroy=None, *, static=None, group=None, mask=None, sensor=None,
              expected_tick: int | None = None) -> BatchResult:
        sent = _Sent(None)
        self._send(sent, *self._encoded(create, move, destroy, static, group, mask, sensor, expected_tick))
        return self._answer(sent)

    def _apply_parts(self, cut: list[dict]) -> BatchResult:
        sent = _Sent(None)
        self._send(sent, None, cut)
        return self._answer(sent)

    def _encoded(self, create, move, destroy, static, group, mask, sensor, expected_tick) -> tuple:
        """The batch as `_send` takes it: moves alone that fit one message as their two columns, any
        other batch as the parts `batches.split` cuts it into."""
        moves = batches.moves_alone(create, move, destroy, static, group, mask, sensor, expected_tick)
        limit = self._world._client.max_message_bytes()
        if moves is not None and batches.fits_one_message(moves, limit):
            return moves, None
        ops = batches.encode(create, move, destroy, static, group, mask, sensor)
        return None, batches.split(ops, limit, expected_tick)

    def _send(self, sent: _Sent, moves: tuple | None, cut: list[dict] | None) -> None:
        with self._lock:
            if self._closed:
                raise Unavailable("the batch stream is closed")
            if self._failure is not None:
                raise self._failure
            sequence = next(self._sequence)
            if moves is not None:
                requests = [batches.moves_request(self._header, sequence, *moves)]
            else:
                requests = batches.stream_requests(self._world.name, sequence, cut)
            # Listed before it is sent: whoever reads its answer finds it.
            self._sent.append(sent)
            for request in requests:
                self._requests.put(request)
            if sent.future is not None:
                self._last_submitted = sent
                if self._reader is None:
                    self._reader = threading.Thread(target=self._read_for_futures, daemon=True,
                                                    name="dbvt-batch-stream")
                    self._reader.start()
                else:
                    self._submitted.notify()

    def _answer(self, sent: _Sent) -> BatchResult:
        self._read_until(sent)
        if isinstance(sent.answer, DbvtError):
            raise sent.answer
        return sent.answer

    def cut(self) -> None:
        """Its client is closing, which ends the call: what the stream had not answered fails saying so."""
        self._cut = True

    def close(self) -> None:
        """Stop sending and wait for the answers to everything already sent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._requests.put(_END)
        # A batch never sent is never answered: this reads until the stream has ended.
        self._read_until(_Sent(None))
        if self._reader is not None:
            self._reader.join()

    def _read_for_futures(self) -> None:
        """The reader thread: it reads while a future of submit() waits for its answer, and otherwise
        waits for the next, until the stream ends."""
        while True:
            with self._lock:
                while self._failure is None and (self._last_submitted is None
                                                 or self._last_submitted.answer is not _UNANSWERED):
                    self._submitted.wait()
                if self._failure is not None:
                    return
                last = self._last_submitted
            self._read_until(last)

    def _read_until(self, sent: _Sent) -> None:
        """Read the stream's answers until `sent` has its answer or the stream has ended; while another
        thread reads them, wait for it."""
        while True:
            with self._lock:
                while self._reading and sent.answer is _UNANSWERED and self._failure is None:
                    self._wait_turn()
                if sent.answer is not _UNANSWERED or self._failure is not None:
                    return
                self._reading = True
            try:
                self._read_one()
            finally:
                with self._lock:
                    self._reading = False
                    if self._waiting:
                        self._turn.notify_all()

    def _wait_turn(self) -> None:
        self._waiting += 1
        try:
            self._turn.wait()
        finally:
            self._waiting -= 1

    def _read_one(self) -> None:
        """Read the next message; once a batch's answer is whole, give it to the first batch waiting.
        When the stream ends, every batch still waiting fails with why."""
        try:
            response = self._answers.whole(next(self._responses))
        except StopIteration:
            self._end(Unavailable("the batch stream ended before answering"))
            return
        except DbvtError as error:
            self._end(error)
            return
        except Exception as exc:
            self._end(from_exception(exc))
            return
        except BaseException as exc:
            # Interrupted while reading (KeyboardInterrupt): an answer may be lost, so no later one
            # can be matched to its batch.
            self._end(Unavailable(f"the batch stream stopped reading: {exc!r}"))
            raise
        if response is None:
            return
        answer = batches.outcome(response)
        if isinstance(answer, WrongServer):
            # The world lives elsewhere: the next stream, and every call, goes there.
            self._world._client._transport.remember(self._world.name, answer)
        with self._lock:
            sent = self._sent.popleft() if self._sent else None
        if sent is None:
            self._end(Unavailable("the server answered a batch that was never sent"))
        else:
            _give(sent, answer)

    def _end(self, failure: DbvtError) -> None:
        if self._cut:
            failure = client_closed()
        with self._lock:
            if self._failure is None:
                self._failure = failure
            unanswered, self._sent = self._sent, deque()
            self._submitted.notify()
            # The stream is done with: nothing more is sent on it.
            self._requests.put(_END)
        for sent in unanswered:
            _give(sent, self._failure)


def _give(sent: _Sent, answer: BatchResult | DbvtError) -> None:
    sent.answer = answer
    future = sent.future
    if future is not None and not future.done():
        if isinstance(answer, DbvtError):
            future.set_exception(answer)
        else:
            future.set_result(answer)
