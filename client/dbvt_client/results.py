"""What the SDK returns: plain numpy arrays in small containers, never a generated message."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchResult:
    """The world's tick after the batch and the pairs that began and ended in that tick.

    `begun` and `ended` are (m, 2) uint64 arrays of rows (a, b), a < b, sorted. `incarnation` is the
    world's (see `WorldInfo`).
    """

    tick: int
    begun: np.ndarray
    ended: np.ndarray
    incarnation: int = 0


class Hits(tuple):
    """`(offsets, hits)` in CSR form, as `dbvt.Tree` returns it: the ids hit by query i are
    `hits[offsets[i]:offsets[i+1]]`. Unpacks as a pair; `tick` is the world tick the answer reflects,
    `incarnation` the world's."""

    tick: int
    incarnation: int

    def __new__(cls, offsets: np.ndarray, hits: np.ndarray, tick: int, incarnation: int = 0):
        made = super().__new__(cls, (offsets, hits))
        made.tick, made.incarnation = tick, incarnation
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
    incarnation: int

    def __new__(cls, offsets: np.ndarray, hits: np.ndarray, fractions: np.ndarray, tick: int, incarnation: int = 0):
        made = super().__new__(cls, (offsets, hits, fractions))
        made.tick, made.incarnation = tick, incarnation
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
    """A world's settings and size. `track_pairs` is False for a query-only world.

    `incarnation` is random, set when the world is created, and kept by restarts that restore the
    world's whole history and by export and import; a new one means that history was lost (the world
    was made again, or restored without the end of its journal). `ephemeral` worlds are not kept.
    """

    name: str
    dims: int
    margin: float
    max_proxies: int
    proxies: int
    tick: int
    track_pairs: bool
    max_pairs: int
    incarnation: int = 0
    ephemeral: bool = True


@dataclass(frozen=True)
class Snapshot:
    """A snapshot written by `world.snapshot()`: the tick it holds, the world's incarnation, its size."""

    tick: int
    incarnation: int
    size: int
