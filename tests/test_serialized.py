"""dbvt_client.serialized writes exactly the bytes the generated messages' SerializeToString() does, and
reads the query answers as their FromString() does."""
from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from dbvt_client import batches
from dbvt_client.serialized import reader, serialized, varint
from dbvt_proto.v1 import broadphase_pb2 as pb

IDS = np.array([0, 1, 2**64 - 1], np.uint64)
BOXES = np.arange(18, dtype=np.float32).reshape(3, 6)


def _as_message_fields(fields: dict) -> dict:
    return {name: value.tobytes() if isinstance(value, np.ndarray) else value for name, value in fields.items()}


@pytest.mark.parametrize("message_class, fields", [
    (pb.Batch, dict(move_ids=IDS, move_boxes=BOXES)),
    (pb.Batch, dict(create_ids=IDS, create_boxes=BOXES, create_static=np.array([1, 0, 1], np.uint8),
                    destroy_ids=IDS[:0], expected_tick=0)),
    (pb.Batch, dict(expected_tick=2**64 - 1)),
    (pb.BatchResult, dict(tick=0, begun=IDS[:2], ended=np.zeros((0, 2), np.uint64), incarnation=2**63)),
    (pb.QueryAabbResponse, dict(tick=7, incarnation=1, offsets=np.array([0, 2, 3], np.int64), hits=IDS)),
    (pb.QueryNearestRequest, dict(world="wörld", count=3, points=BOXES[:, :3].copy(), k=8, max_distance=0.0, mask=0)),
    (pb.QueryNearestRequest, dict(world="", count=0, k=0)),
    (pb.RaycastRequest, dict(world="w", count=1, segments=BOXES[:1], mode=pb.RAYCAST_MODE_FIRST_HIT,
                             include_sensors=True)),
])
def test_fields_serialize_as_the_generated_message_does(message_class, fields):
    assert serialized(message_class, **fields) == message_class(**_as_message_fields(fields)).SerializeToString()


def test_message_fields_are_given_serialized():
    batch = pb.Batch(move_ids=IDS.tobytes(), move_boxes=BOXES.tobytes())
    expected = pb.StreamBatchesRequest(world="a", sequence=300, batch=batch, more_parts=True).SerializeToString()
    assert serialized(pb.StreamBatchesRequest, world="a", sequence=300, batch=batch.SerializeToString(),
                      more_parts=True) == expected
    # Or as its fields, serialized in place: each column copied once.
    assert serialized(pb.StreamBatchesRequest, world="a", sequence=300, batch=dict(move_ids=IDS, move_boxes=BOXES),
                      more_parts=True) == expected
    # An empty message that is set is written, as HasField() would say.
    empty = pb.StreamBatchesResponse(sequence=1, result=pb.BatchResult()).SerializeToString()
    assert serialized(pb.StreamBatchesResponse, sequence=1, result=b"") == empty
    assert serialized(pb.QueryResponse, aabb=b"") == pb.QueryResponse(aabb=pb.QueryAabbResponse()).SerializeToString()
    assert serialized(pb.ApplyBatchRequest, batch={}) == pb.ApplyBatchRequest(batch=pb.Batch()).SerializeToString()


def test_what_cannot_be_serialized_is_refused():
    with pytest.raises(TypeError, match="no field 'bogus'"):
        serialized(pb.Batch, bogus=b"")
    with pytest.raises(ValueError, match="cannot hold -1"):
        serialized(pb.BatchResult, tick=-1)
    with pytest.raises(ValueError, match="cannot hold 4294967296"):
        serialized(pb.QueryAabbRequest, count=2**32)


ANSWERS = [pb.QueryAabbResponse, pb.RaycastResponse, pb.QueryNearestResponse]


def _read_fields(message_class, read) -> dict:
    return {field.name: getattr(read, field.name) for field in message_class.DESCRIPTOR.fields}


def _message_fields(message) -> dict:
    return {field.name: getattr(message, field.name) for field in message.DESCRIPTOR.fields}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ANSWERS), st.data())
def test_answers_read_in_place_as_the_generated_message_reads_them(message_class, data):
    """Each field read as protobuf reads it: also given twice (the last counts), among unknown fields
    of every wire type, and beside a known field number with the wrong wire type (passed over, as
    an unknown field is); bytes come as views."""
    def fields():
        values = {}
        for field in message_class.DESCRIPTOR.fields:
            if data.draw(st.booleans()):
                values[field.name] = data.draw(st.binary(max_size=40) if field.type == field.TYPE_BYTES
                                               else st.booleans() if field.type == field.TYPE_BOOL
                                               else st.floats(allow_nan=False) if field.type == field.TYPE_DOUBLE
                                               else st.integers(0, 2**64 - 1))
        return values

    pieces = [message_class(**fields()).SerializeToString() for _ in range(data.draw(st.integers(1, 3)))]
    unknown = [varint(99 << 3 | 0) + varint(2**63), varint(1 << 3 | 2) + varint(1) + b"x",
               varint(1 << 3 | 1) + bytes(8), varint(3 << 3 | 0) + varint(7), varint(98 << 3 | 1) + bytes(8), varint(97 << 3 | 5) + bytes(4),
               varint(96 << 3 | 2) + varint(3) + b"abc"]
    # world_seconds, a double, given as a varint: protobuf keeps it as unknown, and so does the reader.
    seconds_field = message_class.DESCRIPTOR.fields_by_name["world_seconds"].number
    unknown.append(varint(seconds_field << 3 | 0) + varint(3))
    pieces += data.draw(st.lists(st.sampled_from(unknown), max_size=3))
    wire = b"".join(data.draw(st.permutations(pieces)))
    read = reader(message_class)(wire)
    expected = _message_fields(message_class.FromString(wire))
    assert {name: bytes(value) if isinstance(value, memoryview) else value
            for name, value in _read_fields(message_class, read).items()} == expected
    hits = read.hits
    assert isinstance(hits, memoryview) and (not len(hits) or hits.obj is wire), "a view of the answer received"


@pytest.mark.parametrize("wire, problem", [
    (b"\x1a\x05ab", "runs past the end"),                       # hits: 5 bytes announced, 2 given
    (b"\x08" + b"\xff" * 11, "varint runs past"),                # tick: an endless varint
    (b"\x0b", "wire type 3"),                                   # a group, which proto3 has not
])
def test_answers_that_protobuf_refuses_are_refused(wire, problem):
    with pytest.raises(DecodeError):
        pb.QueryAabbResponse.FromString(wire)
    with pytest.raises(DecodeError, match=problem):
        reader(pb.QueryAabbResponse)(wire)


def test_integers_past_their_width_are_cut_to_it_as_protobuf_cuts_them():
    wire = varint(1 << 3) + varint(2**69 + 5)        # tick: ten bytes, 70 bits
    assert reader(pb.QueryAabbResponse)(wire).tick == pb.QueryAabbResponse.FromString(wire).tick == 5


def test_only_messages_of_bytes_strings_unsigned_and_double_fields_and_such_messages_are_read():
    assert reader(pb.QueryNearestRequest)(pb.QueryNearestRequest(max_distance=2.5).SerializeToString()).max_distance == 2.5
    with pytest.raises(TypeError, match="RaycastRequest.mode is not read"):
        reader(pb.RaycastRequest)
    with pytest.raises(TypeError, match="RaycastRequest.mode is not read"):
        reader(pb.QueryRequest)          # the messages within are checked too


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.integers(1, 2**64 - 1), st.integers(1, 40), st.data())
def test_a_tick_of_moves_is_written_as_the_general_path_writes_it(world, sequence, rows, data):
    """batches.moves_request, the streamed tick's one-join message, is byte for byte what the general
    encode, split and stream_requests write for the same batch, and what protobuf writes."""
    ids = np.array(data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=rows, max_size=rows)), np.uint64)
    boxes = np.array(data.draw(st.lists(st.floats(width=32, allow_nan=False), min_size=6 * rows, max_size=6 * rows)),
                     np.float32).reshape(rows, 6)
    moves = batches.moves_alone(None, (ids, boxes), None, None, None, None, None, None)
    assert batches.fits_one_message(moves, 1 << 22)
    written = batches.moves_request(batches.stream_header(world), sequence, *moves)
    (general,) = batches.stream_requests(world, sequence, batches.split(batches.encode(move=(ids, boxes)), 1 << 22))
    assert written == general
    message = pb.StreamBatchesRequest(world=world, sequence=sequence, narrow_ids=True,
                                      batch=pb.Batch(move_ids=ids.astype("<u8").tobytes(), move_boxes=boxes.tobytes()))
    assert written == message.SerializeToString()


def test_only_a_batch_of_moves_alone_takes_the_tick_path():
    move = (IDS, BOXES)
    assert batches.moves_alone(None, move, None, None, None, None, None, None) is not None
    for other in [dict(create=move), dict(destroy=IDS), dict(static=True), dict(group=2), dict(mask=1),
                  dict(sensor="box"), dict(expected_tick=3)]:
        arguments = {**dict(create=None, destroy=None, static=None, group=None, mask=None, sensor=None,
                            expected_tick=None), **other}
        assert batches.moves_alone(arguments["create"], move, arguments["destroy"], arguments["static"],
                                   arguments["group"], arguments["mask"], arguments["sensor"],
                                   arguments["expected_tick"]) is None, other
    assert batches.moves_alone(None, (IDS[:0], BOXES[:0]), None, None, None, None, None, None) is None
    assert not batches.fits_one_message((IDS, BOXES), batches.MESSAGE_OVERHEAD + IDS.nbytes + BOXES.nbytes - 1)
