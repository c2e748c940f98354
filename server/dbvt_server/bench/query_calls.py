"""What the SDK's query stream saves: a query set asked on it against the same set as a unary call.

Part of `dbvt-bench wire`. The unary side is what the SDK did before it kept a stream open: the
`QueryAabb` RPC, its request made by the SDK's own plan and its answer read in place as the SDK reads
it, then finished into `Hits` the same way. Both sides ask the same world of the same server, in
pairs back to back (dbvt_server.bench.wire.in_pairs, alternately first), for W1's whole query set and
for a set of one box; a run's figure for each is the median of its pairs' ratios, stream over call.
"""
from __future__ import annotations

import statistics

import grpc

from dbvt_client import queries
from dbvt_client.serialized import reader
from dbvt_client.transport import CHANNEL_OPTIONS
from dbvt_proto.v1 import broadphase_pb2 as pb

METHOD = "/dbvt.v1.BroadphaseService/QueryAabb"
# Pairs of calls for W1's whole set (each call some milliseconds), and for one box (under one).
WHOLE_SET_PAIRS = 5
ONE_BOX_PAIRS = 200


def unary_asker(channel: grpc.Channel, world: str, max_message_bytes: int):
    """`ask(boxes)`: the box queries as one unary QueryAabb call, as the SDK made it before."""
    call = channel.unary_unary(METHOD, request_serializer=pb.QueryAabbRequest.SerializeToString,
                               response_deserializer=reader(pb.QueryAabbResponse))

    def ask(boxes):
        plan = queries.aabb(world, boxes, None, max_message_bytes)
        return plan.finish(call(plan.requests[0]))

    return ask


def stream_against_calls(target: str, world, max_message_bytes: int, boxes, in_pairs) -> dict:
    """Each set's median ratio (stream over unary call) and the two sides' median seconds."""
    figures = {}
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        ask = unary_asker(channel, world.name, max_message_bytes)
        streamed, called = world.query_aabb(boxes), ask(boxes)
        if not (called.hits.tolist() == streamed.hits.tolist() and called.offsets.tolist() == streamed.offsets.tolist()):
            raise SystemExit("the unary call's answer differs from the query stream's")
        for name, chosen, pairs in (("whole", boxes, WHOLE_SET_PAIRS), ("one", boxes[:1], ONE_BOX_PAIRS)):
            stream_seconds, call_seconds = in_pairs(lambda: world.query_aabb(chosen), lambda: ask(chosen), pairs)
            figures[f"stream_{name}"] = statistics.median(stream_seconds)
            figures[f"call_{name}"] = statistics.median(call_seconds)
            figures[f"stream_{name}_ratio"] = statistics.median(s / c for s, c in zip(stream_seconds, call_seconds))
    return figures
