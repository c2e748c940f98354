"""What the server holds for batches still arriving is bounded across all streams, given back when a
stream ends, and a batch whose last part never came is answered, not forgotten."""
from __future__ import annotations

import queue

import grpc
import numpy as np
import pytest

from dbvt_client import Client
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc
from dbvt_server.local import LocalTransport
from servers import ServerThread, wait_until

BUDGET = 1 << 20


@pytest.fixture
def server():
    running = ServerThread(max_staged_bytes=BUDGET)
    with Client(running.target) as client:
        client.create_world("staged", dims=3)
    yield running
    running.stop()


def first_part(sequence: int, rows: int) -> pb.StreamBatchesRequest:
    """A first part of a batch creating `rows` proxies: 32 bytes a row."""
    ids = np.arange(sequence * 10**6, sequence * 10**6 + rows, dtype="<u8")
    boxes = np.tile(np.array([0, 0, 0, 1, 1, 1], "<f4"), rows)
    return pb.StreamBatchesRequest(world="staged", sequence=sequence, more_parts=True,
                                   batch=pb.Batch(create_ids=ids.tobytes(), create_boxes=boxes.tobytes()))


class RawStream:
    """A StreamBatches call whose messages the test writes one at a time."""

    def __init__(self, stub):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self.call = stub.StreamBatches(iter(self._requests.get, None))

    def send(self, request) -> None:
        self._requests.put(request)

    def half_close(self) -> None:
        self._requests.put(None)



def test_streams_that_never_send_their_last_part_cannot_hold_more_than_the_budget(server):
    staged = server.running.service.staged
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.BroadphaseServiceStub(channel)
        holder = RawStream(stub)
        holder.send(first_part(1, 20_000))                  # 640 kB, within the budget
        wait_until(lambda: staged.value > 600_000)
        second = RawStream(stub)
        second.send(first_part(2, 20_000))                  # 640 kB more: past it
        reply = next(second.call)
        assert reply.sequence == 2 and reply.status_code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert "--max-staged-bytes" in reply.status_message and f"at most {BUDGET}" in reply.status_message
        second.half_close()
        assert list(second.call) == []
        holder.call.cancel()                                # the client goes away mid-batch
        wait_until(lambda: staged.value == 0)
    with Client(server.target) as client:
        assert client.world("staged").info().proxies == 0


def test_a_half_closed_stream_answers_its_unfinished_batch(server):
    staged = server.running.service.staged
    with grpc.insecure_channel(server.target) as channel:
        stream = RawStream(pb_grpc.BroadphaseServiceStub(channel))
        stream.send(first_part(7, 100))
        stream.half_close()
        [reply] = list(stream.call)
    assert reply.sequence == 7 and reply.status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert reply.status_message == ("the stream ended before the last part of batch 7 for world 'staged'; "
                                    "nothing of it was applied")
    assert staged.value == 0


def test_in_process_streams_answer_an_unfinished_batch_alike():
    local = LocalTransport(max_worlds=1, max_proxies_per_world=1000)
    local.unary("CreateWorld", pb.CreateWorldRequest(name="staged"))
    [reply] = list(local.stream(iter([first_part(7, 100)]), "staged"))
    assert reply.sequence == 7 and "the stream ended before the last part of batch 7" in reply.status_message
    assert local.service.staged.value == 0
