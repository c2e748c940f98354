"""dbvt_client.serialized writes exactly the bytes the generated messages' SerializeToString() does."""
from __future__ import annotations

import numpy as np
import pytest

from dbvt_client.serialized import serialized
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
