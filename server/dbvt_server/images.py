"""World images: a world's settings, tick, incarnation and core in one self-checking byte string.

A snapshot file is an image, and so is what ExportWorld sends and ImportWorld takes, so a world
moves between servers exactly as it is restored from disk. The layout (little-endian):

    magic      8 bytes  b"DBVTWRLD"
    version    u32
    meta size  u32      bytes of the JSON that follows
    body size  u64      bytes of dbvt.Broadphase.to_bytes() that follow the JSON
    meta       JSON     name, dims, margin, max_proxies, track_pairs, max_pairs, tick, incarnation,
                        sensor_margin
    body       the core
    crc        u32      CRC-32 of everything before it

Reading checks the CRC before anything else, then the settings, then the core's own structure
(`Broadphase.from_bytes` validates the tree and its pair lists), so a damaged image is refused
whole with the reason, never half loaded.
"""
from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass

from dbvt import Broadphase

MAGIC = b"DBVTWRLD"
VERSION = 1
HEADER = struct.Struct("<8sIIQ")
TRAILER = struct.Struct("<I")
SETTINGS = ("name", "dims", "margin", "max_proxies", "track_pairs", "max_pairs", "tick", "incarnation",
            "sensor_margin")


class ImageError(ValueError):
    """The bytes are not an intact world image; the message says what is wrong."""


@dataclass
class Image:
    """A decoded image: the world's settings (SETTINGS, as a dict) and its core."""

    settings: dict
    broadphase: Broadphase


def encode(settings: dict, broadphase: Broadphase) -> list[bytes]:
    """The image of a world, as pieces to write one after another (no copy of the core is joined)."""
    meta = json.dumps({key: settings[key] for key in SETTINGS}, sort_keys=True).encode()
    body = broadphase.to_bytes()
    header = HEADER.pack(MAGIC, VERSION, len(meta), len(body))
    crc = zlib.crc32(body, zlib.crc32(meta, zlib.crc32(header)))
    return [header, meta, body, TRAILER.pack(crc)]


def decode(data, threads: int = 1) -> Image:
    """The world an image holds, or ImageError naming the first problem found. `threads` is the core's
    (a setting of the server, not of the image)."""
    view = memoryview(data).cast("B")
    if len(view) < HEADER.size + TRAILER.size:
        raise ImageError(f"{len(view)} bytes are too few for a world image")
    magic, version, meta_size, body_size = HEADER.unpack(view[:HEADER.size])
    if magic != MAGIC:
        raise ImageError("not a dbvt world image (bad magic)")
    if version != VERSION:
        raise ImageError(f"world image format version {version}; this server reads version {VERSION}")
    expected = HEADER.size + meta_size + body_size + TRAILER.size
    if len(view) != expected:
        raise ImageError(f"the image declares {expected} bytes but has {len(view)} (cut short or padded)")
    (crc,) = TRAILER.unpack(view[-TRAILER.size:])
    if zlib.crc32(view[:-TRAILER.size]) != crc:
        raise ImageError("the image's CRC-32 does not match its bytes: it is damaged")
    meta_end = HEADER.size + meta_size
    try:
        settings = json.loads(bytes(view[HEADER.size:meta_end]))
        settings = {key: settings[key] for key in SETTINGS}
    except (ValueError, KeyError, TypeError) as exc:
        raise ImageError(f"the image's settings cannot be read: {exc}") from None
    _check(settings)
    try:
        broadphase = Broadphase.from_bytes(view[meta_end:-TRAILER.size], threads=threads)
    except (ValueError, MemoryError) as exc:
        raise ImageError(f"the image's core is not valid: {exc}") from None
    _check_against_core(settings, broadphase)
    return Image(settings, broadphase)


def _check_against_core(settings: dict, broadphase: Broadphase) -> None:
    """The settings must describe the core they come with, as a world the server made would."""
    if broadphase.dims != settings["dims"] or broadphase.track_pairs != settings["track_pairs"]:
        raise ImageError("the image's settings do not match its core (dims or track_pairs)")
    if struct.unpack("<f", struct.pack("<f", settings["margin"]))[0] != broadphase.margin:
        raise ImageError(f"the image's margin {settings['margin']} is not its core's ({broadphase.margin})")
    if settings["sensor_margin"] != broadphase.sensor_margin:
        raise ImageError(f"the image's sensor_margin {settings['sensor_margin']} is not its core's "
                         f"({broadphase.sensor_margin})")
    if len(broadphase) > settings["max_proxies"]:
        raise ImageError(f"the image holds {len(broadphase)} proxies, more than its max_proxies "
                         f"{settings['max_proxies']}")
    if broadphase.pair_count > settings["max_pairs"]:
        raise ImageError(f"the image holds {broadphase.pair_count} pairs, more than its max_pairs "
                         f"{settings['max_pairs']}")


def _check(settings: dict) -> None:
    kinds = {"name": str, "dims": int, "margin": (int, float), "max_proxies": int, "track_pairs": bool,
             "max_pairs": int, "tick": int, "incarnation": int, "sensor_margin": (int, float)}
    for key, kind in kinds.items():
        if not isinstance(settings[key], kind) or (kind is int and isinstance(settings[key], bool)):
            raise ImageError(f"the image's {key} is {settings[key]!r}, not a {getattr(kind, '__name__', 'number')}")
    if settings["dims"] not in (2, 3):
        raise ImageError(f"the image's dims is {settings['dims']}, not 2 or 3")
    if not math.isfinite(settings["margin"]) or settings["margin"] < 0:
        raise ImageError(f"the image's margin is {settings['margin']}, not a finite number >= 0")
    # A tick of 2**64 - 1 would leave no room for the next batch.
    for key, end in (("max_proxies", 2**64), ("max_pairs", 2**64), ("tick", 2**64 - 1), ("incarnation", 2**64)):
        if not 0 <= settings[key] < end:
            raise ImageError(f"the image's {key} {settings[key]} is out of range")
