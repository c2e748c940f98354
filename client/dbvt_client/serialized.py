"""Protocol messages serialized straight from their columns, each column copied once, and answers read
without copying theirs.

Building a generated message copies each bytes field into it (after numpy's `tobytes()` has copied it
out of its array), and serializing copies it twice more. For the protocol's columns, hundreds of
kilobytes to megabytes a call, those copies (and the fresh pages each may land on) are a large part
of what a call costs beyond the world's own work. `serialized()` writes the bytes the
generated message's `SerializeToString()` would (fields in number order, as upb writes them), taking
any C-contiguous buffer (a numpy array of the wire's dtype) for a bytes field and one copy of it.
The other way, parsing a query's answer copies its hits into the message and reading the field
copies them again: `reader()` makes a gRPC deserializer whose answers hold each bytes field as a
view of the bytes received, which numpy reads in place.
"""
from __future__ import annotations

import struct
from functools import lru_cache
from types import SimpleNamespace

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_UNSIGNED = {FieldDescriptor.TYPE_UINT32: 2**32, FieldDescriptor.TYPE_UINT64: 2**64,
             FieldDescriptor.TYPE_ENUM: 2**31, FieldDescriptor.TYPE_BOOL: 2}
_FIXED = {FieldDescriptor.TYPE_DOUBLE: (_FIXED64, struct.Struct("<d")),
          FieldDescriptor.TYPE_FLOAT: (_FIXED32, struct.Struct("<f"))}
# What reader() reads: the fields of the query answers and of the query stream's messages around them.
_READ = (FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_BOOL,
         FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_DOUBLE)
# How reader() reads a bytes field, a string field and a double; an unsigned integer is read by its
# modulus, a message by its class's reader.
_AS_VIEW, _AS_TEXT, _AS_DOUBLE = "view", "text", "double"
# The wire type of each way of reading that is not an unsigned integer's (a varint).
_WIRE_TYPES = {_AS_VIEW: _LENGTH, _AS_TEXT: _LENGTH, _AS_DOUBLE: _FIXED64}
_LENGTH_DELIMITED = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE)


def varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    # A column's length is mostly under 2 MiB: its two or three bytes written at once.
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0x200000:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@lru_cache(maxsize=None)
def _layout(message_class) -> dict:
    """Each field's name: (its number and name, which order the fields, then its key bytes, type,
    whether set-but-default values are still written, and a message field's class)."""
    layout, empty = {}, message_class()
    for field in message_class.DESCRIPTOR.fields:
        if field.is_repeated:
            continue  # no protocol message serialized here has repeated fields
        if field.type in _LENGTH_DELIMITED:
            wire_type = _LENGTH
        elif field.type in _FIXED:
            wire_type = _FIXED[field.type][0]
        elif field.type in _UNSIGNED:
            wire_type = _VARINT
        else:
            continue
        inner = type(getattr(empty, field.name)) if field.type == FieldDescriptor.TYPE_MESSAGE else None
        layout[field.name] = (field.number, field.name, varint(field.number << 3 | wire_type), field.type,
                              field.has_presence, inner)
    return layout


def field_key(message_class, name: str) -> bytes:
    """The key (field number and wire type) that starts field `name` of `message_class`."""
    return _layout(message_class)[name][2]


def serialized(message_class, **fields) -> bytes:
    """`message_class(**fields).SerializeToString()`, with each bytes field taken from any C-contiguous
    buffer (copied once, here) and each message field given as its serialized bytes or as a dict of
    its own fields. A field given as None is left out; one without presence is left out at its
    default, as protobuf does."""
    pieces, _ = _pieces(message_class, fields)
    return b"".join(pieces)


@lru_cache(maxsize=None)
def _plan(message_class, names: tuple[str, ...]) -> tuple:
    """The layout entries of the fields `names`, in field number order. Callers give the same few sets
    of fields over and over (a streamed tick gives the same five, and its batch the same two): the
    order is worked out once per set, not on every message."""
    layout = _layout(message_class)
    try:
        return tuple(sorted(layout[name] for name in names))
    except KeyError as exc:
        raise TypeError(f"{message_class.DESCRIPTOR.full_name} has no field {exc.args[0]!r} serialized here") from None


def _pieces(message_class, fields: dict) -> tuple[list, int]:
    """The message's serialized pieces, not yet joined, and their total size."""
    pieces: list = []
    total = 0
    for _, name, key, kind, presence, inner_class in _plan(message_class, tuple(fields)):
        value = fields[name]
        if value is None:
            continue
        if kind in _LENGTH_DELIMITED:
            if isinstance(value, dict):
                inner, size = _pieces(inner_class, value)
            else:
                if kind == FieldDescriptor.TYPE_STRING:
                    value = value.encode()
                inner, size = [value], memoryview(value).nbytes
            if size or presence:
                length = varint(size)
                pieces += (key, length, *inner)
                total += len(key) + len(length) + size
        elif kind in _FIXED:
            if value or presence:
                pieces += (key, _FIXED[kind][1].pack(value))
                total += len(pieces[-2]) + len(pieces[-1])
        else:
            value = int(value)
            if not 0 <= value < _UNSIGNED[kind]:
                raise ValueError(f"{message_class.DESCRIPTOR.full_name}.{name} cannot hold {value}")
            if value or presence:
                pieces += (key, varint(value))
                total += len(pieces[-2]) + len(pieces[-1])
    return pieces, total


def passing_bytes(serialize):
    """A gRPC serializer that passes on messages already serialized (bytes) and serializes the rest."""

    def serialized_message(message) -> bytes:
        return message if isinstance(message, bytes) else serialize(message)

    return serialized_message


@lru_cache(maxsize=None)
def _fields_read(message_class) -> dict[int, tuple[str, object]]:
    """Each field's number: its name and how it is read (_AS_VIEW, _AS_TEXT, an unsigned integer's
    modulus, or a message field's reader)."""
    fields: dict[int, tuple[str, object]] = {}
    empty = message_class()
    for field in message_class.DESCRIPTOR.fields:
        if field.is_repeated or field.type not in _READ:
            raise TypeError(f"{message_class.DESCRIPTOR.full_name}.{field.name} is not read by dbvt_client.serialized")
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            how: object = reader(type(getattr(empty, field.name)))
        elif field.type == FieldDescriptor.TYPE_BYTES:
            how = _AS_VIEW
        elif field.type == FieldDescriptor.TYPE_STRING:
            how = _AS_TEXT
        elif field.type == FieldDescriptor.TYPE_DOUBLE:
            how = _AS_DOUBLE
        else:
            how = _UNSIGNED[field.type]
        fields[field.number] = (field.name, how)
    return fields


def _default(how):
    if how == _AS_VIEW:
        return memoryview(b"")
    if how == _AS_TEXT:
        return ""
    if how == _AS_DOUBLE:
        return 0.0
    if callable(how):
        return None
    return False if how == 2 else 0


def _varint_at(data: bytes, at: int) -> tuple[int, int]:
    """The varint at `at`, and where the next field starts."""
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise DecodeError("a varint runs past the message or past ten bytes")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def reader(message_class):
    """A gRPC deserializer of `message_class`'s serialized bytes into an object with its fields as
    attributes, read as protobuf reads them (a field given twice keeps the last; unknown fields, and
    known ones with another wire type, are passed over), but with each bytes field a memoryview of
    the data rather than a copy. A message field is read the same way (None when absent; given twice,
    the last is kept where protobuf would merge the two)."""
    fields = _fields_read(message_class)
    defaults = {name: _default(how) for name, how in fields.values()}

    def read(data) -> SimpleNamespace:
        values = dict(defaults)
        view = memoryview(data)
        at = 0
        while at < len(view):
            key, at = _varint_at(view, at)
            number, wire_type = key >> 3, key & 7
            if wire_type == _VARINT:
                value, at = _varint_at(view, at)
            elif wire_type == _LENGTH:
                size, at = _varint_at(view, at)
                value, at = view[at:at + size], at + size
            elif wire_type in (_FIXED64, _FIXED32):
                size = 8 if wire_type == _FIXED64 else 4
                value, at = view[at:at + size], at + size
            else:
                raise DecodeError(f"wire type {wire_type} (field {number}) is not used by the protocol")
            if at > len(view):
                raise DecodeError(f"field {number} runs past the end of the message")
            name, how = fields.get(number, ("", None))
            if how is None or wire_type != _WIRE_TYPES.get(how, _LENGTH if callable(how) else _VARINT):
                continue    # unknown, or known with another wire type, which protobuf keeps as unknown
            if how == _AS_VIEW:
                values[name] = value
            elif how == _AS_DOUBLE:
                values[name] = _FIXED[FieldDescriptor.TYPE_DOUBLE][1].unpack(value)[0]
            elif how == _AS_TEXT:
                values[name] = _text(value, message_class, name)
            elif callable(how):
                values[name] = how(value)
            else:
                values[name] = value != 0 if how == 2 else value % how
        return SimpleNamespace(**values)

    return read


def _text(value: memoryview, message_class, name: str) -> str:
    try:
        return str(value, "utf-8")
    except UnicodeDecodeError:
        raise DecodeError(f"{message_class.DESCRIPTOR.full_name}.{name} is not UTF-8") from None
