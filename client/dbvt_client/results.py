"""What the SDK returns: plain numpy arrays in small containers, never a generated message."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchResult:
    """The world's tick after the batch and the pairs that began and ended in that tick.

    `begun` and `ended` are (m, 2) uint64 arrays of rows (a, b), a < b, sorted.
    """

    tick: int
    begun: np.ndarray
    ended: np.ndarray


class Hits(tuple):
    """`(offsets, hits)` in CSR form, as `dbvt.Tree` returns it: the ids hit by query i are
    `hits[offsets[i]:offsets[i+1]]`. Unpacks as a pair; `tick` is the world tick the answer reflects."""

    tick: int

    def __new__(cls, offsets: np.ndarray, hits: np.ndarray, tick: int):
        made = super().__new__(cls, (offsets, hits))
        made.tick = tick
        return made

    @property
    def offsets(self) -> np.ndarray:
        return self[0]

    @property
    def hits(self) -> np.ndarray:
        return self[1]


class RayHits(tuple):
    """`(offsets, hits, fractions)` of a raycast; `fractions` (float64) is each hit's entry fraction."""

    tick: int

    def __new__(cls, offsets: np.ndarray, hits: np.ndarray, fractions: np.ndarray, tick: int):
        made = super().__new__(cls, (offsets, hits, fractions))
        made.tick = tick
        return made

    @property
    def offsets(self) -> np.ndarray:
        return self[0]

    @property
    def hits(self) -> np.ndarray:
        return self[1]

    @property
    def fractions(self) -> np.ndarray:
        return self[2]


@dataclass(frozen=True)
class WorldInfo:
    """A world's settings and size. `track_pairs` is False for a query-only world."""

    name: str
    dims: int
    margin: float
    max_proxies: int
    proxies: int
    tick: int
    track_pairs: bool
    max_pairs: int
