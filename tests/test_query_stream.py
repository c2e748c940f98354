"""StreamQueries, the query stream the SDK keeps open: answers by sequence as each world finishes, sets
and answers in parts, refusals that leave the stream open, deadlines, and a shutdown that ends it."""
from __future__ import annotations

import asyncio
import gc
import logging
import queue
import threading
import time

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbvt import reference
from dbvt_client import AsyncClient, Client, DeadlineExceeded, InvalidArgument, NotFound, Unavailable
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc
from servers import ServerProcess, ServerThread, wait_until, world_held

SMALL = 16 * 1024
# A world whose proxies all overlap one spot: a query over it hits every one, and many such queries
# keep its thread busy for a while.
PILE = 2000


def pile_boxes() -> np.ndarray:
    low = np.random.default_rng(3).uniform(0, 0.4, (PILE, 3)).astype(np.float32)
    return np.concatenate([low, low + 0.6], axis=1)


QUIET = np.array([[5, 5, 5, 6, 6, 6]], np.float32)


def references() -> dict[str, reference.Broadphase]:
    """What the server's worlds hold, in the brute-force reference."""
    worlds = {"pile": reference.Broadphase(dims=3), "quiet": reference.Broadphase(dims=3)}
    worlds["pile"].create(np.arange(PILE), pile_boxes())
    worlds["quiet"].create([7], QUIET)
    return worlds


@pytest.fixture(scope="module")
def server():
    running = ServerThread(max_message_bytes=SMALL, workers=2)
    with Client(running.target) as client:
        client.create_world("pile").apply(create=(np.arange(PILE), pile_boxes()))
        client.create_world("quiet").apply(create=([7], QUIET))
    yield running
    running.stop()


def aabb(world: str, boxes, **settings) -> pb.QueryRequest:
    boxes = np.asarray(boxes, "<f4").reshape(-1, 6)
    return pb.QueryRequest(aabb=pb.QueryAabbRequest(world=world, count=len(boxes), boxes=boxes.tobytes(), **settings))


class RawStream:
    """A StreamQueries call on a stub: requests put as they are made, answers read as messages."""

    def __init__(self, channel):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._answers = pb_grpc.BroadphaseServiceStub(channel).StreamQueries(iter(self._requests.get, None),
                                                                             timeout=30)

    def send(self, sequence: int, query: pb.QueryRequest, **fields) -> None:
        self._requests.put(pb.StreamQueriesRequest(sequence=sequence, query=query, **fields))

    def read(self) -> pb.StreamQueriesResponse:
        return next(self._answers)

    def close(self) -> list[pb.StreamQueriesResponse]:
        self._requests.put(None)
        return list(self._answers)


def whole_answers(responses) -> dict[int, pb.QueryAabbResponse]:
    """Each sequence's answer, its parts joined."""
    from dbvt_client import parts

    pieces: dict[int, list] = {}
    for response in responses:
        assert response.status_code == 0, response.status_message
        pieces.setdefault(response.sequence, []).append(response.answer.aabb)
    return {sequence: parts.joined(found) for sequence, found in pieces.items()}


def test_a_set_on_an_idle_world_is_answered_before_one_on_a_busy_world(server):
    with grpc.insecure_channel(server.target) as channel:
        stream = RawStream(channel)
        with world_held(server, "pile"):
            stream.send(1, aabb("pile", [[-1, -1, -1, 2, 2, 2]] * 3))
            stream.send(2, aabb("quiet", [5, 5, 5, 6, 6, 6]))
            first = stream.read()
            assert first.sequence == 2 and np.frombuffer(first.answer.aabb.hits, "<u8").tolist() == [7]
        rest = [stream.read()]
        while rest[-1].more_parts:
            rest.append(stream.read())
        assert {response.sequence for response in rest} == {1} and len(rest) > 1, "an answer in parts"
        assert np.frombuffer(whole_answers(rest)[1].hits, "<u8").tolist() == list(range(PILE)) * 3
        assert stream.close() == []


def test_sets_and_answers_in_parts_are_joined_and_exact(server):
    boxes = np.random.default_rng(5).uniform(-1, 1.5, (1500, 3)).astype(np.float32)
    boxes = np.concatenate([boxes, boxes + 0.2], axis=1)
    with Client(server.target) as client:
        hits = client.world("pile").query_aabb(boxes)
        tick = client.world("pile").info().tick
    assert boxes.nbytes > 2 * SMALL and hits.hits.nbytes > 4 * SMALL, "the set and its answer each need parts"
    offsets, wanted = references()["pile"].query_aabb(boxes)
    assert np.array_equal(hits.offsets, offsets) and np.array_equal(hits.hits, wanted) and hits.tick == tick


@st.composite
def query_sets(draw):
    """A query set as the stream's messages: its world, boxes, how it is cut into parts, and whether a
    part is spoiled (another mask, which joined_queries refuses)."""
    world = draw(st.sampled_from(["pile", "quiet", "never-made"]))
    count = draw(st.integers(1, 40))
    low = np.array(draw(st.lists(st.tuples(*[st.integers(-2, 7)] * 3), min_size=count, max_size=count)), np.float32)
    boxes = np.concatenate([low, low + np.float32(draw(st.sampled_from([0.0, 0.5, 3.0])))], axis=1)
    cuts = sorted(set(draw(st.lists(st.integers(1, count - 1), max_size=3)))) if count > 1 else []
    pieces = np.split(boxes, cuts)
    spoiled = len(pieces) > 1 and draw(st.booleans())
    parts = [aabb(world, piece, **({"mask": 2} if spoiled and number == len(pieces) - 1 else {}))
             for number, piece in enumerate(pieces)]
    return world, boxes, parts, spoiled


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sets=st.lists(query_sets(), min_size=1, max_size=6))
def test_any_run_of_sets_in_parts_gets_each_its_exact_answer_or_its_refusal(server, sets):
    """Sets of random sizes, cut into random parts, on worlds that exist or not, some with a spoiled
    part: each sequence gets one answer, the reference's hits, or the refusal its fault calls for; and
    the staged parts are all given back."""
    expected = references()
    with grpc.insecure_channel(server.target) as channel:
        stream = RawStream(channel)
        for sequence, (_, _, parts, _) in enumerate(sets, 1):
            for number, part in enumerate(parts, 1):
                stream.send(sequence, part, more_parts=number < len(parts))
        responses = stream.close()
    by_sequence: dict[int, list] = {}
    for response in responses:
        by_sequence.setdefault(response.sequence, []).append(response)
    assert sorted(by_sequence) == list(range(1, len(sets) + 1))
    for sequence, (world, boxes, _, spoiled) in enumerate(sets, 1):
        answered = by_sequence[sequence]
        assert [r.more_parts for r in answered] == [True] * (len(answered) - 1) + [False]
        if spoiled:
            assert [r.status_code for r in answered] == [grpc.StatusCode.INVALID_ARGUMENT.value[0]]
        elif world == "never-made":
            assert [r.status_code for r in answered] == [grpc.StatusCode.NOT_FOUND.value[0]]
        else:
            (answer,) = whole_answers(answered).values()
            offsets, hits = expected[world].query_aabb(boxes)
            assert np.frombuffer(answer.offsets, "<i8").tolist() == offsets.tolist()
            assert np.frombuffer(answer.hits, "<u8").tolist() == hits.tolist()
    wait_until(lambda: server.running.service.staged.value == 0)


FIRST = aabb("pile", [0, 0, 0, 1, 1, 1])


@pytest.mark.parametrize("sent, message", [
    ([pb.QueryRequest()], "query set 1 holds no query"),
    ([FIRST, aabb("pile", [0, 0, 0, 1, 1, 1], mask=1)], "part 1 of the query set differs from part 0"),
    ([FIRST, pb.QueryRequest(sphere=pb.QuerySphereRequest(world="pile", count=1, centers=bytes(12), radii=bytes(4)))],
     "part 1 of query set 1 holds sphere, not aabb"),
])
def test_a_bad_set_is_refused_and_the_stream_goes_on(server, sent, message):
    with grpc.insecure_channel(server.target) as channel:
        stream = RawStream(channel)
        for number, part in enumerate(sent, 1):
            stream.send(1, part, more_parts=number < len(sent))
        refused = stream.read()
        assert (refused.sequence, refused.status_code) == (1, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        assert message in refused.status_message and not refused.HasField("answer")
        stream.send(2, aabb("nowhere", [0, 0, 0, 1, 1, 1]))
        unknown = stream.read()
        assert (unknown.sequence, unknown.status_code) == (2, grpc.StatusCode.NOT_FOUND.value[0])
        stream.send(3, FIRST)
        assert stream.read().sequence == 3
        assert stream.close() == []
    wait_until(lambda: server.running.service.staged.value == 0)


def test_a_set_left_unfinished_or_cut_by_another_is_refused(server):
    with grpc.insecure_channel(server.target) as channel:
        stream = RawStream(channel)
        stream.send(1, aabb("pile", [0, 0, 0, 1, 1, 1]), more_parts=True)
        stream.send(2, aabb("pile", [0, 0, 0, 1, 1, 1]))
        cut = stream.read()
        assert cut.sequence == 2 and "arrived before the last part of query set 1" in cut.status_message
        stream.send(3, aabb("pile", [0, 0, 0, 1, 1, 1]), more_parts=True)
        (unfinished,) = stream.close()
        assert unfinished.sequence == 3 and "ended before the last part of query set 3" in unfinished.status_message
    wait_until(lambda: server.running.service.staged.value == 0)


def test_a_set_whose_turn_comes_after_its_timeout_is_refused_unanswered(server):
    with grpc.insecure_channel(server.target) as channel:
        stream = RawStream(channel)
        with world_held(server, "quiet"):
            stream.send(1, aabb("quiet", [0, 0, 0, 1, 1, 1]), timeout_ms=1)
            stream.send(2, aabb("quiet", [0, 0, 0, 1, 1, 1]), timeout_ms=60_000)
            time.sleep(0.05)
        late, in_time = stream.read(), stream.read()
        assert stream.close() == []
    assert (late.sequence, late.status_code) == (1, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
    assert "deadline passed while it waited for its turn" in late.status_message
    assert (in_time.sequence, in_time.status_code) == (2, 0)


def test_threads_share_one_client_and_each_gets_its_own_answers(server):
    rng = np.random.default_rng(11)
    sets = [np.concatenate([low, low + rng.uniform(0, 1)], axis=1)
            for low in rng.uniform(-0.5, 6, (16, 20, 3)).astype(np.float32)]
    expected = references()
    wanted = [expected["pile" if n % 4 else "quiet"].query_aabb(boxes)[1].tolist() for n, boxes in enumerate(sets)]
    got: dict[int, list] = {}
    with Client(server.target) as client:
        def ask(number: int) -> None:
            world = client.world("pile" if number % 4 else "quiet")
            got[number] = [world.query_aabb(sets[number]).hits.tolist() for _ in range(10)]

        threads = [threading.Thread(target=ask, args=(number,)) for number in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert all(got[number] == [wanted[number]] * 10 for number in range(16))
    assert any(wanted) and not all(wanted), "some sets hit proxies and some none"


def test_the_async_client_shares_its_stream_between_tasks(server):
    async def drive():
        async with AsyncClient(server.target) as client:
            boxes = [[-1, -1, -1, 2, 2, 2], [5, 5, 5, 6, 6, 6]]
            answers = await asyncio.gather(*(client.world(("pile", "quiet")[n % 2]).query_aabb(boxes[n % 2:n % 2 + 1])
                                             for n in range(40)))
            assert [len(answer.hits) for answer in answers] == [PILE, 1] * 20
            with pytest.raises(NotFound):
                await client.world("nowhere").raycast([[0, 0, 0, 1, 1, 1]])
            with pytest.raises(InvalidArgument, match="min > max"):
                await client.world("pile").query_aabb([[1, 1, 1, 0, 0, 0]])
            assert len((await client.world("quiet").query_sphere([[5.5, 5.5, 5.5]], 0.1)).hits) == 1

    asyncio.run(drive())


def test_a_task_cancelled_while_its_set_is_written_leaves_the_stream_to_the_others(server, caplog):
    """A caller that stops waiting while its set's parts go out (cancelled, or its own asyncio.wait_for)
    must not end the stream: gRPC ends a call whose write is cancelled, and every other task's set on it
    is then asked again (once: a second cut fails it). The set goes out whole, its answer is dropped,
    and nothing is left for the loop to report (a future whose exception nobody retrieved)."""
    caplog.set_level(logging.WARNING, logger="dbvt_server")
    # Thousands of boxes hitting nothing: a set of several parts at SMALL bytes a message, a small answer.
    far = np.tile(np.array([[50, 50, 50, 51, 51, 51]], np.float32), (3000, 1))
    reported = []

    async def drive():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context["message"]))
        async with AsyncClient(server.target) as client:
            for _ in range(10):
                cancelled = asyncio.ensure_future(client.world("pile").query_aabb(far))
                others = [asyncio.ensure_future(client.world("quiet").query_aabb(QUIET)) for _ in range(4)]
                await asyncio.sleep(0)      # the big set's first parts are on their way
                cancelled.cancel()
                answers = await asyncio.gather(*others)
                assert [answer.hits.tolist() for answer in answers] == [[7]] * 4
            assert len((await client.world("pile").query_aabb(far)).hits) == 0
        gc.collect()

    asyncio.run(drive())
    assert reported == []
    assert [record.getMessage() for record in caplog.records if "StreamQueries" in record.getMessage()] == []


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(asks=st.lists(st.tuples(st.integers(1, 6000), st.none() | st.integers(0, 8)), min_size=2, max_size=6))
def test_tasks_cancelled_at_any_point_leave_the_others_answers_exact(server, caplog, asks):
    """Tasks share the async query stream, each asking a set of 1 to 6,000 boxes (up to nine parts at
    SMALL bytes a message); some are cancelled after a few turns of the loop, anywhere in their set's
    writing or waiting. Every other task gets its exact answer, and the stream is never cut."""
    caplog.set_level(logging.WARNING, logger="dbvt_server")
    quiet = references()["quiet"]
    far = np.array([40, 40, 40, 41, 41, 41], np.float32)
    sets = [np.resize(np.stack([QUIET[0], far]), (rows, 6)) for rows, _ in asks]
    reported = []

    async def drive():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context["message"]))
        async with AsyncClient(server.target) as client:
            await client.world("quiet").query_aabb(QUIET)     # the stream is open, as in a game's loop
            tasks = [asyncio.ensure_future(client.world("quiet").query_aabb(boxes)) for boxes in sets]
            for turn in range(9):
                for task, (_, cancel_at) in zip(tasks, asks):
                    if cancel_at == turn:
                        task.cancel()
                await asyncio.sleep(0)
            answers = await asyncio.gather(*tasks, return_exceptions=True)
        gc.collect()
        return answers

    for answer, boxes, (_, cancel_at) in zip(asyncio.run(drive()), sets, asks):
        if isinstance(answer, asyncio.CancelledError):
            assert cancel_at is not None
            continue
        offsets, hits = quiet.query_aabb(boxes)
        assert answer.offsets.tolist() == offsets.tolist() and answer.hits.tolist() == hits.tolist()
    assert reported == []
    assert [record.getMessage() for record in caplog.records if "StreamQueries" in record.getMessage()] == []


def test_a_client_closed_while_threads_ask_ends_every_ask(server):
    """Closing a client while other threads ask on its query stream: each ask is answered or raises
    Unavailable at once, none waits for ever, and no set opens a new stream on the closed channel."""
    client = Client(server.target)
    outcomes: queue.SimpleQueue = queue.SimpleQueue()

    def ask_until_closed():
        try:
            while True:
                client.world("quiet").query_aabb(QUIET)
        except Unavailable as error:
            outcomes.put(str(error))
        except Exception as error:      # anything else is a failure of the test, reported below
            outcomes.put(repr(error))

    askers = [threading.Thread(target=ask_until_closed) for _ in range(4)]
    for asker in askers:
        asker.start()
    time.sleep(0.1)
    client.close()
    for asker in askers:
        asker.join(10)
    assert not any(asker.is_alive() for asker in askers), "an ask still waits after the client closed"
    assert [outcomes.get() for _ in askers] == ["the client is closed"] * 4
    with pytest.raises(Unavailable, match="the client is closed"):
        client.world("quiet").query_aabb(QUIET)


def test_an_async_client_closed_asks_no_more(server):
    async def drive():
        client = AsyncClient(server.target)
        assert len((await client.world("quiet").query_aabb(QUIET)).hits) == 1
        await client.close()
        with pytest.raises(Unavailable, match="the client is closed"):
            await client.world("quiet").query_aabb(QUIET)

    asyncio.run(drive())


def test_the_clients_timeout_bounds_each_set_and_the_stream_goes_on(server):
    with Client(server.target, timeout=0.2) as hurried:
        assert len(hurried.world("quiet").query_aabb([[5, 5, 5, 6, 6, 6]]).hits) == 1
        with world_held(server, "quiet"):
            started = time.monotonic()
            with pytest.raises(DeadlineExceeded, match="within the client's timeout of 0.2 s"):
                hurried.world("quiet").query_aabb([[5, 5, 5, 6, 6, 6]])
            assert time.monotonic() - started < 2
            assert len(hurried.world("pile").query_aabb([[5, 5, 5, 6, 6, 6]]).hits) == 0
        # The late set's refusal (its timeout went with it) is dropped; the stream answers the next.
        assert len(hurried.world("quiet").query_aabb([[5, 5, 5, 6, 6, 6]]).hits) == 1


def test_the_async_clients_timeout_bounds_each_set_too(server):
    async def drive():
        async with AsyncClient(server.target, timeout=0.2) as hurried:
            with world_held(server, "quiet"):
                with pytest.raises(DeadlineExceeded, match="within the client's timeout of 0.2 s"):
                    await hurried.world("quiet").query_aabb(QUIET)
                assert len((await hurried.world("pile").query_aabb(QUIET)).hits) == 0
            return len((await hurried.world("quiet").query_aabb(QUIET)).hits)

    assert asyncio.run(drive()) == 1


@pytest.fixture
def deaf_server():
    """A gRPC server that answers GetServerInfo and reads nothing of a query stream: the SDK's writes
    fill the connection's window and stay there, as with a hung dbvt-server."""
    ready: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    async def serve():
        async def read_nothing(requests, context):
            while not stop.is_set():
                await asyncio.sleep(0.05)
            yield b""

        info = pb.GetServerInfoResponse(max_message_bytes=4 << 20).SerializeToString()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("dbvt.v1.BroadphaseService", {
            "StreamQueries": grpc.stream_stream_rpc_method_handler(read_nothing),
            "GetServerInfo": grpc.unary_unary_rpc_method_handler(lambda request, context: info)})])
        ready.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await server.stop(0)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    yield f"127.0.0.1:{ready.get(timeout=10)}"
    stop.set()
    thread.join(10)


def test_against_a_server_that_reads_nothing_each_set_times_out_on_time_and_close_returns(deaf_server):
    # 9.6 MB a set: more than the connection's window holds.
    big = np.zeros((400_000, 6), np.float32)

    async def drive():
        client = AsyncClient(deaf_server, timeout=0.3)
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(DeadlineExceeded, match="within the client's timeout of 0.3 s"):
                await client.world("any").query_aabb(big)
            assert time.monotonic() - started < 2
        started = time.monotonic()
        await client.close()
        return time.monotonic() - started

    assert asyncio.run(drive()) < 3
    with Client(deaf_server, timeout=0.3) as hurried:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="within the client's timeout of 0.3 s"):
            hurried.world("any").query_aabb(big)
        assert time.monotonic() - started < 2


def test_an_open_query_stream_does_not_hold_a_shutdown(tmp_path):
    server = ServerProcess("--grace-seconds", "30")
    try:
        client = Client(server.target)
        world = client.create_world("w")
        world.apply(create=([1], [[0, 0, 0, 1, 1, 1]]))
        assert world.query_aabb([[0, 0, 0, 1, 1, 1]]).hits.tolist() == [1]
        started = time.monotonic()
        server.process.send_signal(15)
        assert server.wait(20) == 0
        assert time.monotonic() - started < 10, "the idle query stream held the server in its grace period"
        with pytest.raises(Unavailable):
            world.query_aabb([[0, 0, 0, 1, 1, 1]])
        client.close()
    finally:
        server.kill()


def test_a_set_the_server_read_but_never_started_is_asked_again_on_a_new_stream():
    """At shutdown the server answers the sets it started and ends the stream; one it read but had no
    room to start yet (SETS_IN_FLIGHT were waiting on a held world) is asked again, on a new stream,
    which the stopping server refuses: that refusal, not the old stream's end, is what the caller sees."""
    from dbvt_server.query_stream import SETS_IN_FLIGHT

    server = ServerThread(workers=2)
    try:
        with Client(server.target) as client:
            client.create_world("quiet").apply(create=([7], QUIET))
            outcomes: list = []

            def ask() -> None:
                try:
                    outcomes.append(client.world("quiet").query_aabb(QUIET).hits.tolist())
                except Unavailable as refused:
                    outcomes.append(refused.message)

            with world_held(server, "quiet"):
                askers = [threading.Thread(target=ask) for _ in range(SETS_IN_FLIGHT + 1)]
                for asker in askers:
                    asker.start()
                wait_until(lambda: server.running.servicer.queue_depths()["quiet"] == SETS_IN_FLIGHT)
                time.sleep(0.2)
                server._loop.call_soon_threadsafe(server.running.servicer.end_query_streams)
                time.sleep(0.2)
            for asker in askers:
                asker.join(30)
        assert sorted(outcomes, key=str) == [[7]] * SETS_IN_FLIGHT + [
            "the query stream was cut off (the server is shutting down: ask another)"]
    finally:
        server.stop()
