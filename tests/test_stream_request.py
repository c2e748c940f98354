"""A batch stream's request read in place (dbvt_server._stream_request) holds what protobuf parses
from the same bytes, each column a view of them; where it cannot be sure to (a field given twice, an
unknown field, a malformed message) it leaves the message to protobuf."""
from __future__ import annotations

import grpc
import numpy as np
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from dbvt_client import Client
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server._stream_request import read

COLUMNS = ("create_ids", "create_boxes", "create_static", "create_group", "create_mask", "move_ids",
           "move_boxes", "destroy_ids", "create_sensor")
# The field numbers the reader is compiled with.
NUMBERS = {"world": 1, "sequence": 2, "batch": 3, "more_parts": 4, "narrow_ids": 5}
BATCH_NUMBERS = {"create_ids": 1, "create_boxes": 2, "create_static": 3, "create_group": 4, "create_mask": 5,
                 "move_ids": 6, "move_boxes": 7, "destroy_ids": 8, "expected_tick": 9, "create_sensor": 10}


def test_the_field_numbers_are_the_protos():
    assert {f.name: f.number for f in pb.StreamBatchesRequest.DESCRIPTOR.fields} == NUMBERS
    assert {f.name: f.number for f in pb.Batch.DESCRIPTOR.fields} == BATCH_NUMBERS


@st.composite
def requests(draw) -> pb.StreamBatchesRequest:
    batch = pb.Batch(**{name: draw(st.binary(max_size=48)) for name in COLUMNS if draw(st.booleans())})
    if draw(st.booleans()):
        batch.expected_tick = draw(st.integers(0, 2**63 - 1))
    fields = dict(world=draw(st.text(max_size=12)), sequence=draw(st.integers(0, 2**63 - 1)),
                  more_parts=draw(st.booleans()), narrow_ids=draw(st.booleans()))
    request = pb.StreamBatchesRequest(**{name: value for name, value in fields.items() if draw(st.booleans())})
    if draw(st.booleans()):
        request.batch.CopyFrom(batch)
    return request


def assert_same(read_request, parsed: pb.StreamBatchesRequest) -> None:
    assert read_request.world == parsed.world and read_request.sequence == parsed.sequence
    assert read_request.more_parts == parsed.more_parts and read_request.narrow_ids == parsed.narrow_ids
    batch = read_request.batch
    for name in COLUMNS:
        assert bytes(getattr(batch, name)) == getattr(parsed.batch, name), name
    assert batch.HasField("expected_tick") == parsed.batch.HasField("expected_tick")
    assert batch.expected_tick == parsed.batch.expected_tick
    assert pb.Batch.FromString(batch.SerializeToString()) == parsed.batch
    assert batch.ByteSize() == len(batch.SerializeToString())


@settings(max_examples=300, deadline=None)
@given(requests())
def test_a_request_reads_as_protobuf_reads_it(request):
    data = request.SerializeToString()
    read_request = read(data)
    assert read_request is not None, "each known field once, with its own wire type: read in place"
    assert_same(read_request, pb.StreamBatchesRequest.FromString(data))


def test_the_columns_are_views_of_the_bytes_received():
    ids = np.arange(1000, dtype="<u8")
    data = pb.StreamBatchesRequest(world="w", batch=pb.Batch(move_ids=ids.tobytes())).SerializeToString()
    column = read(data).batch.move_ids
    assert isinstance(column, memoryview) and column.obj is data
    assert np.array_equal(np.frombuffer(column, "<u8"), ids)


@settings(max_examples=300, deadline=None)
@given(requests(), requests(), st.data())
def test_what_it_cannot_be_sure_of_it_leaves_to_protobuf(first, second, data):
    """Two messages joined (protobuf merges them: fields given twice), a message cut short, a field
    protobuf does not know: read in place only where the result is protobuf's."""
    joined = first.SerializeToString() + second.SerializeToString()
    whole = first.SerializeToString()
    cut = whole[:data.draw(st.integers(0, len(whole)))]
    unknown = whole + b"\x78\x01"    # field 15, a varint
    for candidate in (joined, cut, unknown):
        read_request = read(candidate)
        try:
            parsed = pb.StreamBatchesRequest.FromString(candidate)
        except DecodeError:
            assert read_request is None
            continue
        if read_request is not None:
            assert_same(read_request, parsed)
    assert read(unknown) is None


def test_a_world_name_that_is_not_utf8_is_left_to_protobuf():
    assert read(b"\x0a\x02\xff\xfe") is None


def test_a_server_applies_a_request_left_to_protobuf_as_protobuf_reads_it(server):
    """Over the wire: a request whose batch comes in two pieces (field 3 given twice, which protobuf
    merges) is applied whole; one the server reads in place, beside it, the same; a batch refused
    by the world leaves it as it was."""
    ids = np.array([1, 2], "<u8")
    boxes = np.array([[0, 0, 0, 1, 1, 1], [0.5, 0.5, 0.5, 2, 2, 2]], "<f4")
    merged = (pb.StreamBatchesRequest(world="in-place", sequence=1, batch=pb.Batch(create_ids=ids.tobytes()))
              .SerializeToString()
              + pb.StreamBatchesRequest(batch=pb.Batch(create_boxes=boxes.tobytes())).SerializeToString())
    assert read(merged) is None
    in_place = pb.StreamBatchesRequest(world="in-place", sequence=2, batch=pb.Batch(
        move_ids=ids[:1].tobytes(), move_boxes=(boxes[:1] + 5).tobytes())).SerializeToString()
    refused = pb.StreamBatchesRequest(world="in-place", sequence=3, batch=pb.Batch(
        move_ids=np.array([7], "<u8").tobytes(), move_boxes=boxes[:1].tobytes())).SerializeToString()
    assert read(in_place) is not None and read(refused) is not None
    with Client(server.target) as client:
        client.create_world("in-place", dims=3, margin=0.0)
        with grpc.insecure_channel(server.target) as channel:
            stream = channel.stream_stream("/dbvt.v1.BroadphaseService/StreamBatches",
                                           response_deserializer=pb.StreamBatchesResponse.FromString)
            first, second, third = list(stream(iter([merged, in_place, refused]), timeout=30))
        assert first.status_code == 0 and np.frombuffer(first.result.begun, "<u8").tolist() == [1, 2]
        assert second.status_code == 0 and np.frombuffer(second.result.ended, "<u8").tolist() == [1, 2]
        assert third.status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "7" in third.status_message
        info = client.world("in-place").info()
        assert info.proxies == 2 and info.tick == 2
        client.delete_world("in-place")
