"""World images between a file and the server: `world.export(...)` and `client.import_world(...)`.

An image (the server's world image format, with its own CRC-32) travels in parts of at most the
server's message size; the SDK joins an export's parts and cuts an import into them.
"""
from __future__ import annotations

import os

from dbvt_client import parts
from dbvt_client.batches import MESSAGE_OVERHEAD
from dbvt_client.errors import Internal
from dbvt_client.results import Snapshot
from dbvt_proto.v1 import broadphase_pb2 as pb


def read_image(source) -> bytes:
    """The bytes of `source`: a path, or a binary file object open for reading."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as file:
            return file.read()
    if not hasattr(source, "read"):
        raise TypeError(f"import_world takes a path or a binary file open for reading, not {type(source).__name__}")
    return source.read()


def write_image(response: pb.ExportWorldResponse, destination) -> None:
    """The export's image to `destination`: a path (written whole, then renamed into place), or a
    binary file object open for writing."""
    if len(response.data) != response.total_bytes:
        raise Internal(f"the export sent {len(response.data)} of its {response.total_bytes} bytes; nothing was written")
    if isinstance(destination, (str, os.PathLike)):
        temporary = f"{os.fspath(destination)}.partial"
        with open(temporary, "wb") as file:
            file.write(response.data)
        os.replace(temporary, destination)
        return
    if not hasattr(destination, "write"):
        raise TypeError(f"export takes a path or a binary file open for writing, not {type(destination).__name__}")
    destination.write(response.data)


def import_requests(name: str, data: bytes, ephemeral: bool, max_message_bytes: int) -> list[pb.ImportWorldRequest]:
    room = max(max_message_bytes - MESSAGE_OVERHEAD, parts.SMALLEST_PART)
    view = memoryview(data)
    return [pb.ImportWorldRequest(name=name, ephemeral=bool(ephemeral), data=bytes(view[start:start + room]))
            for start in range(0, max(len(data), 1), room)]


def snapshot(response: pb.SnapshotWorldResponse) -> Snapshot:
    return Snapshot(tick=response.tick, incarnation=response.incarnation, size=response.snapshot_bytes)
