"""A batch's answer serialized in one pass (dbvt_server._result_bytes) is, byte for byte, what the
generated message serializes from the same columns narrowed by the rule of `id_columns`; and the
stream's message around it what `dbvt_client.serialized` writes."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_client.serialized import serialized
from dbvt_server._result_bytes import batch_result, stream_answer
from dbvt_server.worlds import id_columns, message_fields

U64 = 2**64 - 1


@st.composite
def id_rows(draw, widest: int) -> np.ndarray:
    rows = draw(st.lists(st.tuples(st.integers(0, widest), st.integers(0, widest)), max_size=6))
    return np.array(rows, dtype=np.uint64).reshape(-1, 2)


@st.composite
def columns(draw) -> dict:
    # Mostly ids that fit 32 bits, so that narrowing is decided by the odd wide one.
    widest = draw(st.sampled_from([2**32 - 1, 2**32, U64]))
    return {name: draw(id_rows(widest if draw(st.booleans()) else 2**32 - 1))
            for name in ("begun", "ended", "entered", "left")}


@settings(max_examples=300, deadline=None)
@given(columns(), st.integers(0, U64), st.integers(0, U64), st.booleans(),
       st.one_of(st.just(0.0), st.floats(0, 1e9, exclude_min=True)))
def test_the_bytes_are_the_generated_message_of_the_same_columns(rows, tick, incarnation, narrow_allowed, seconds):
    expected = pb.BatchResult(tick=tick, incarnation=incarnation, world_seconds=seconds,
                              **message_fields(id_columns(narrow_allowed, **rows))).SerializeToString()
    assert batch_result(tick, incarnation, rows["begun"], rows["ended"], rows["entered"], rows["left"],
                        narrow_allowed, seconds) == expected


def test_a_tick_of_many_pairs_narrows_only_when_every_id_fits():
    rng = np.random.default_rng(7)
    pairs = np.sort(rng.integers(0, 2**32, size=(5000, 2), dtype=np.uint64), axis=1)
    empty = np.zeros((0, 2), np.uint64)
    narrow = pb.BatchResult.FromString(batch_result(9, 3, pairs, pairs[::-1].copy(), empty, empty, True))
    assert narrow.narrow_ids and np.array_equal(np.frombuffer(narrow.begun, "<u4").reshape(-1, 2), pairs)
    pairs[1234, 1] = 2**32
    wide = pb.BatchResult.FromString(batch_result(9, 3, empty, empty, empty, pairs, True))
    assert not wide.narrow_ids and np.array_equal(np.frombuffer(wide.left, "<u8").reshape(-1, 2), pairs)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, U64), columns(), st.integers(0, U64), st.booleans())
def test_the_streams_message_is_the_one_serialized_writes(sequence, rows, tick, narrow_allowed):
    result = batch_result(tick, 1, rows["begun"], rows["ended"], rows["entered"], rows["left"], narrow_allowed)
    answer = stream_answer(sequence, result)
    assert answer == serialized(pb.StreamBatchesResponse, sequence=sequence, result=result)
    parsed = pb.StreamBatchesResponse.FromString(answer)
    assert parsed.sequence == sequence and parsed.result.SerializeToString() == result
