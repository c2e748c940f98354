"""Requests that may not decode, and answers that may already be serialized.

gRPC runs a method's deserializer before the handler, and one that raised would make gRPC log a
traceback and answer UNKNOWN; `tolerant` deserializers hand the handler an `Undecodable` instead,
which `decoded()` turns into INVALID_ARGUMENT; `in_place_or` reads a batch stream's requests in
place first. `bytes_or` lets a handler send bytes serialized once
for many calls (a tick shared by a world's watchers).
"""
from __future__ import annotations

from google.protobuf.message import DecodeError

from dbvt_client.errors import InvalidArgument
from dbvt_client.serialized import passing_bytes
from dbvt_server._stream_request import read as read_in_place


class Undecodable:
    """What reaches the servicer for bytes that are not the method's request message. A deserializer
    that raised would instead make gRPC log a traceback and answer UNKNOWN."""

    def __init__(self, message_class):
        self.error = InvalidArgument(f"the request is not a valid {message_class.DESCRIPTOR.full_name} message")


def decoded(request) -> None:
    if isinstance(request, Undecodable):
        raise request.error


def tolerant(message_class):
    def deserialize(data: bytes):
        try:
            return message_class.FromString(data)
        except DecodeError:
            return Undecodable(message_class)

    return deserialize


def in_place_or(message_class):
    """StreamBatches' deserializer: the request read in place (dbvt_server._stream_request), its
    columns views of the bytes received, or where that reader leaves it to protobuf, `tolerant`'s."""
    parse = tolerant(message_class)

    def deserialize(data: bytes):
        request = read_in_place(data)
        return request if request is not None else parse(data)

    return deserialize


def bytes_or(serialize):
    """A serializer that also passes on messages already serialized (a tick shared by watchers, an
    answer serialized on its world's thread)."""
    return passing_bytes(serialize)
