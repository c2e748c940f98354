"""Messages too big for one, as parts: the format the protocol defines, both ways.

A part is a copy of the message whose bytes columns (at any depth, such as a batch result's begun
and ended) hold consecutive pieces of the whole columns; its other fields are the whole message's.
The server cuts answers (`cut`), and joins a query set sent in parts (`joined_queries`); the SDK
joins answers (`joined`).
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Iterator

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from dbvt_client.errors import InvalidArgument

# Room a part leaves for its fields other than the bytes columns (a tick, a sequence, their tags).
PART_OVERHEAD = 256
# Parts never get smaller than this, whatever the message limit.
SMALLEST_PART = 64
# Trailing metadata of a query answer too big for one message (its size): ask it again with Query.
ANSWER_BYTES_KEY = "dbvt-answer-bytes"

Path = tuple[str, ...]


def _columns(message: Message, path: Path = ()) -> Iterator[tuple[Path, bytes]]:
    """Every bytes field of `message` and of the messages it holds, in field order, with its path."""
    for field in message.DESCRIPTOR.fields:
        if field.type == FieldDescriptor.TYPE_BYTES:
            yield (*path, field.name), getattr(message, field.name)
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not field.is_repeated \
                and message.HasField(field.name):
            yield from _columns(getattr(message, field.name), (*path, field.name))


def _set(message: Message, path: Path, value: bytes) -> None:
    for name in path[:-1]:
        message = getattr(message, name)
    setattr(message, path[-1], value)


def _skeleton(message: Message) -> Message:
    """`message` with its bytes columns emptied."""
    skeleton = type(message)()
    skeleton.CopyFrom(message)
    for path, _ in _columns(message):
        _set(skeleton, path, b"")
    return skeleton


def cut(message: Message, max_bytes: int) -> Iterator[Message]:
    """`message` as parts of at most `max_bytes` each (itself when it fits)."""
    if message.ByteSize() <= max_bytes:
        yield message
        return
    room = max(max_bytes - PART_OVERHEAD, SMALLEST_PART)
    skeleton = _skeleton(message)
    part, used = _skeleton(skeleton), 0
    for path, data in _columns(message):
        start = 0
        while start < len(data):
            if used == room:
                yield part
                part, used = _skeleton(skeleton), 0
            piece = data[start:start + room - used]
            _set(part, path, piece)
            used += len(piece)
            start += len(piece)
    yield part


def joined(parts: list[Message]) -> Message:
    """The whole message from its parts."""
    if len(parts) == 1:
        return parts[0]
    whole = _skeleton(parts[0])
    pieces: dict[Path, list[bytes]] = {}
    for part in parts:
        for path, data in _columns(part):
            pieces.setdefault(path, []).append(data)
    for path, data in pieces.items():
        _set(whole, path, b"".join(data))
    return whole


class StreamAnswers:
    """Joins the parts of a batch stream's answers (StreamBatchesResponse, more_parts)."""

    def __init__(self):
        self._pieces: list[Message] = []

    def whole(self, response: Message) -> Message | None:
        """`response` with its whole result once its last part has come; None before."""
        if response.more_parts:
            self._pieces.append(response.result)
            return None
        if self._pieces:
            self._pieces.append(response.result)
            response.result.CopyFrom(joined(self._pieces))
            self._pieces = []
        return response


def joined_queries(parts: list[Message]) -> Message:
    """One query request from the parts of a query set: the same world, mask and settings in each;
    the counts added up and the columns concatenated."""
    first = _skeleton(parts[0])
    first.count = 0
    for number, part in enumerate(parts[1:], 1):
        shape = _skeleton(part)
        shape.count = 0
        if shape != first:
            raise InvalidArgument(f"part {number} of the query set differs from part 0 in its world, mask or "
                                  "settings; every part of a query set must hold the same kind and settings")
    whole = joined(parts)
    whole.count = sum(part.count for part in parts)
    return whole


async def written_after(before: asyncio.Future | None, write: Callable[[bytes], Awaitable], messages: list) -> None:
    """The messages of one batch or query set written with `write`, once `before` (the writer of the
    one asked before it on the same stream) has finished, however it ended: so the parts of one go out
    together and in the order asked. Run as a task that its asker waits for without cancelling, it
    also sends them whole when the asker stops waiting, where grpc.aio would end the call (and every
    batch or set on it) under a cancelled write."""
    if before is not None:
        await asyncio.wait([before])
    for message in messages:
        await write(message)
