"""Giving a deleted world's memory back to the system (glibc only; elsewhere nothing is done).

A dropped world's core frees everything it held: glibc's count of bytes in use goes back to where it
was. But glibc keeps freed memory for reuse, two ways, and without this a server that created and
deleted a 1M-proxy world three times held some 150 MB more than when it started:
- Its mmap threshold rises to the size of each big block freed (up to 32 MB), so a world's big arrays
  come from the arenas instead of their own mappings, and an arena keeps up to twice that at its top,
  which nothing hands back. `configure()` fixes the threshold, so that big arrays are mapped apart and
  unmapped when freed.
- Smaller blocks stay in the arena of the thread that freed them (every world thread and gRPC's own
  have one). `give_back()` (malloc_trim) returns their whole free pages.
"""
from __future__ import annotations

import ctypes
import os

M_MMAP_THRESHOLD = -3
# Blocks from this size on get their own mapping. Setting it turns glibc's rising threshold off. A
# block this big is filled with far more work than the page faults of mapping it afresh cost.
MMAP_THRESHOLD = 1 << 20

try:
    _libc = ctypes.CDLL(None)
    _mallopt, _malloc_trim = _libc.mallopt, _libc.malloc_trim
except AttributeError:
    _mallopt = _malloc_trim = None


def configure() -> None:
    """For a process that is the server: fix glibc's mmap threshold, unless the environment sets it."""
    if _mallopt is None or "MALLOC_MMAP_THRESHOLD_" in os.environ or \
            "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return
    _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def give_back() -> None:
    """Return every arena's free pages to the system: some milliseconds per 100 MB, without the GIL."""
    if _malloc_trim is not None:
        _malloc_trim(0)
