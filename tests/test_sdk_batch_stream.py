"""Who reads a batch stream's answers: a tick applied alone is read by its caller, with no thread of the
SDK's between; threads sharing a stream, some waiting on futures and some applying, each get their own
answers in order; an ending stream fails every batch still waiting, whoever waits for it."""
from __future__ import annotations

import sys
import threading
import time
from concurrent import futures

import numpy as np
import pytest

from dbvt import Broadphase
from dbvt_client import Client, Unavailable
from dbvt_proto.v1 import broadphase_pb2 as pb
from servers import batch_stream_peer, wait_until

GUARD = 20  # seconds: a regression fails here instead of hanging the suite
READER = "dbvt-batch-stream"


def _readers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == READER]


def _threads_in_the_sdk() -> list[str]:
    """The threads other than this one whose stacks hold a frame of the SDK's own code."""
    return [thread.name for thread in threading.enumerate() if thread is not threading.current_thread()
            and any("dbvt_client" in frame.f_code.co_filename
                    for frame in _stack(sys._current_frames().get(thread.ident)))]


def _stack(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def test_ticks_applied_alone_are_read_by_their_caller(server):
    rng = np.random.default_rng(5)
    ids = np.arange(300, dtype=np.uint64)
    low = rng.uniform(0, 20, (300, 3))
    boxes = np.concatenate([low, low + 1], 1).astype(np.float32)
    reference = Broadphase(dims=3, margin=0.05)
    with Client(server.target) as client:
        world = client.create_world("read-by-caller", dims=3, margin=0.05)
        already = len(_readers())
        with world.stream() as stream:
            for step in range(20):
                if step == 0:
                    result = stream.apply(create=(ids, boxes))
                    reference.create(ids, boxes)
                else:
                    moved = ids[rng.random(300) < 0.3]
                    low = rng.uniform(0, 20, (len(moved), 3))
                    moved_boxes = np.concatenate([low, low + 1], 1).astype(np.float32)
                    result = stream.apply(move=(moved, moved_boxes))
                    reference.move(moved, moved_boxes)
                begun, ended = reference.update()
                assert result.tick == step + 1
                assert np.array_equal(result.begun, begun) and np.array_equal(result.ended, ended)
            assert len(_readers()) == already, "a stream only applied to needs no reader thread"
            assert _threads_in_the_sdk() == [], "no thread of the SDK's waits on the stream between ticks"
        client.delete_world(world.name)


def test_threads_sharing_a_stream_each_get_their_own_answers(server):
    """Each batch creates one proxy on an anchor of its own: its answer's one begun pair names it."""
    threads, batches = 4, 30
    anchors = np.arange(threads * batches, dtype=np.uint64)
    low = np.stack([anchors * 10.0, np.zeros(len(anchors)), np.zeros(len(anchors))], 1)
    anchor_boxes = np.concatenate([low, low + 1], 1).astype(np.float32)
    answers: dict[int, list] = {}
    with Client(server.target) as client:
        world = client.create_world("shared-stream", dims=3, margin=0.0)
        with world.stream() as stream:
            stream.apply(create=(anchors, anchor_boxes))

            def run(thread: int) -> None:
                mine = []
                for number in range(batches):
                    anchor = thread * batches + number
                    create = (np.array([1000 + anchor], np.uint64), anchor_boxes[anchor:anchor + 1] + 0.5)
                    if number % 3 == 2:
                        mine.append((anchor, stream.apply(create=create)))
                    else:
                        mine.append((anchor, stream.submit(create=create)))
                answers[thread] = [(anchor, got if not isinstance(got, futures.Future) else got.result(GUARD))
                                   for anchor, got in mine]

            workers = [threading.Thread(target=run, args=(thread,)) for thread in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(GUARD)
            assert not any(worker.is_alive() for worker in workers)
        client.delete_world(world.name)
    ticks = []
    for thread, got in answers.items():
        for anchor, result in got:
            assert result.begun.tolist() == [[anchor, 1000 + anchor]], "an answer went to another batch"
            ticks.append(result.tick)
        assert [result.tick for _, result in got] == sorted(result.tick for _, result in got)
    assert sorted(ticks) == list(range(2, threads * batches + 2))


def test_an_ending_stream_fails_every_waiting_batch_whoever_waits():
    """A peer answers the first batch and ends the call; the others were sent before it answered."""
    sent = threading.Event()

    def answer_one(requests, context):
        for request in requests:
            assert sent.wait(GUARD)
            yield pb.StreamBatchesResponse(sequence=request.sequence, result=pb.BatchResult(tick=1))
            return

    with batch_stream_peer(answer_one) as target, Client(target) as client:
        client._max_message_bytes = 1 << 20     # the peer has no GetServerInfo
        with client.world("w").stream() as stream:
            first = stream.submit(destroy=[1])
            second = stream.submit(destroy=[2])
            failed = []

            def apply() -> None:
                try:
                    stream.apply(destroy=[3])
                except Unavailable as exc:
                    failed.append(exc)

            applying = threading.Thread(target=apply)
            applying.start()
            sent.set()
            assert first.result(GUARD).tick == 1
            with pytest.raises(Unavailable, match="ended before answering"):
                second.result(GUARD)
            applying.join(GUARD)
            assert [str(exc) for exc in failed] == ["the batch stream ended before answering"]
            with pytest.raises(Unavailable, match="ended before answering"):
                stream.submit(destroy=[4])


def test_a_result_says_how_long_the_broadphase_took_within_the_round_trip(client):
    """world_seconds: the core's part of a batch, on every path (unary, stream, in-process)."""
    rng = np.random.default_rng(9)
    low = rng.uniform(0, 50, (2000, 3))
    ids, boxes = np.arange(2000, dtype=np.uint64), np.concatenate([low, low + 1], 1).astype(np.float32)
    world = client.create_world("timed", dims=3)
    started = time.perf_counter()
    created = world.apply(create=(ids, boxes))
    assert 0 < created.world_seconds < time.perf_counter() - started
    with world.stream() as stream:
        for _ in range(3):
            started = time.perf_counter()
            moved = stream.apply(move=(ids, boxes + 0.5))
            assert 0 < moved.world_seconds < time.perf_counter() - started
    again = world.apply()
    assert again.world_seconds < created.world_seconds, "an empty batch is a cheap update"


def test_a_streams_call_starts_when_the_stream_opens(server):
    """The first batch does not pay for setting up the call: the server has the stream before it."""
    with Client(server.target) as client:
        world = client.create_world("opened", dims=3)
        already = server.running.servicer.open_streams
        with world.stream() as stream:
            wait_until(lambda: server.running.servicer.open_streams == already + 1)
            assert stream.apply().tick == 1
        client.delete_world(world.name)
