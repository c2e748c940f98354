"""Giving a deleted world's memory back to the system (glibc only; elsewhere nothing is done).

A dropped world's core frees everything it held: glibc's count of bytes in use goes back to where it
was. But glibc keeps freed memory for reuse, two ways, and without this a server that created and
deleted a 1M-proxy world three times held some 150 MB more than when it started:
- Its mmap threshold rises to the size of each big block freed (up to 32 MB), so a world's big arrays
  come from the arenas instead of their own mappings, and an arena keeps up to twice that at its top,
  which nothing hands back. `configure()` fixes the thresholds, so that big arrays are mapped apart
  and unmapped when freed, and an arena keeps at most TRIM_THRESHOLD free at its top.
- Smaller blocks stay in the arena of the thread that freed them (every world thread and gRPC's own
  have one). `give_back()` (malloc_trim) returns their whole free pages.

The thresholds also decide what each call pays for its buffers: a block that is mapped afresh, or
that lands on pages an arena has just handed back, faults in every page it touches. A query answer
of a megabyte or two, and the copies a step makes of its moves, are made and dropped on every call,
so they must come from memory the arenas keep: with the mmap threshold at 1 MB and glibc's default
128 kB trim threshold a W1 query call took some 3,000 page faults and a step 36, now some 200 and 5.
"""
from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks from this size on get their own mapping. Setting it turns glibc's rising thresholds off. A
# block this big is filled with far more work than the page faults of mapping it afresh cost.
MMAP_THRESHOLD = 4 << 20
# Free memory an arena keeps at its top (and reuses) before handing it back: a call's buffers.
TRIM_THRESHOLD = 8 << 20

try:
    _libc = ctypes.CDLL(None)
    _mallopt, _malloc_trim = _libc.mallopt, _libc.malloc_trim
except AttributeError:
    _mallopt = _malloc_trim = None


def configure() -> None:
    """For a process that is the server: fix glibc's mmap and trim thresholds, each unless the
    environment sets it."""
    if _mallopt is None:
        return
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", "mmap_threshold"),
                (M_TRIM_THRESHOLD, TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", "trim_threshold"))
    for option, value, variable, tunable in settings:
        if variable not in os.environ and tunable not in os.environ.get("GLIBC_TUNABLES", ""):
            _mallopt(option, value)


def give_back() -> None:
    """Return every arena's free pages to the system: some milliseconds per 100 MB, without the GIL."""
    if _malloc_trim is not None:
        _malloc_trim(0)
