"""What the SDK returns: plain numpy arrays in small containers, never a generated message."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _no_rows() -> np.ndarray:
    return np.zeros((0, 2), np.uint64)


@dataclass(frozen=True)
class BatchResult:
    """The world's tick after the batch and the pairs that began and ended in that tick.

    `begun` and `ended` are (m, 2) uint64 arrays of rows (a, b), a < b, sorted. `incarnation` is the
    world's (see `WorldInfo`). `entered` and `left` are the tick's sensor events: (m, 2) uint64 rows
    `[sensor, proxy]`, sorted. `world_seconds` is how long the world's broadphase took over the batch
    on the server (its creates, moves, destroys and update): the round trip minus it is what the
    service and the network added. Two results of the same batch are equal whatever their timings.
    """

    tick: int
    begun: np.ndarray
    ended: np.ndarray
    incarnation: int = 0
    entered: np.ndarray = field(default_factory=_no_rows)
    left: np.ndarray = field(default_factory=_no_rows)
    world_seconds: float = field(default=0.0, compare=False)


class _Answer(tuple):
    """A query answer in CSR form, with the tick it reflects and the world's incarnation; unpacks as
    its columns. `world_seconds` is how long the world's broadphase took over the query set: a call's
    round trip minus it is what the service and the network added."""

    tick: int
    incarnation: int
    world_seconds: float

    def __new__(cls, *columns: np.ndarray, tick: int, incarnation: int = 0, world_seconds: float = 0.0):
        made = super().__new__(cls, columns)
        made.tick, made.incarnation, made.world_seconds = tick, incarnation, world_seconds
        return made

    @property
    def offsets(self) -> np.ndarray:
        return self[0]

    @property
    def hits(self) -> np.ndarray:
        return self[1]


class Hits(_Answer):
    """`(offsets, hits)` in CSR form, as `dbvt.Tree` returns it: the ids hit by query i are
    `hits[offsets[i]:offsets[i+1]]`. Unpacks as a pair; `tick` is the world tick the answer reflects,
    `incarnation` the world's."""


class RayHits(_Answer):
    """`(offsets, hits, fractions)` of a raycast or a cast; `fractions` (float64) is each hit's entry
    fraction (t)."""

    @property
    def fractions(self) -> np.ndarray:
        return self[2]


class NearestHits(_Answer):
    """`(offsets, hits, distances)` of `query_nearest`: for point i, `hits[offsets[i]:offsets[i+1]]` by
    distance then id, and `distances` (float32) from the point to each hit's tight box."""

    @property
    def distances(self) -> np.ndarray:
        return self[2]


@dataclass(frozen=True)
class Crossings:
    """`client.overlap(a, b)`: `pairs`, `(m, 2)` uint64 rows `[id in a, id in b]` whose tight boxes
    overlap, sorted, at the worlds' ticks `tick_a` and `tick_b` (both held still for the call)."""

    pairs: np.ndarray
    tick_a: int
    tick_b: int
    incarnation_a: int
    incarnation_b: int


@dataclass(frozen=True)
class WorldInfo:
    """A world's settings and size. `track_pairs` is False for a query-only world.

    `incarnation` is random, set when the world is created, and kept by restarts that restore the
    world's whole history and by export and import; a new one means that history was lost (the world
    was made again, or restored without the end of its journal). `ephemeral` worlds are not kept.
    `moving_to` names the server a world is being moved to, while it moves (`dbvt-admin rebalance`).
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
    sensor_margin: float = 0.0
    moving_to: str = ""


@dataclass(frozen=True)
class SensorEvents:
    """One message of `world.watch()`: the world's `tick`, the `entered` and `left` rows `[sensor,
    proxy]` of that tick (sorted), and, when `resync` is set, `inside`: the whole set at that tick,
    which replaces whatever the watcher held. Without events and resync, a heartbeat: nothing
    changed for the watched sensors up to `tick`."""

    tick: int
    entered: np.ndarray
    left: np.ndarray
    resync: bool
    inside: np.ndarray
    incarnation: int = 0


@dataclass(frozen=True)
class Snapshot:
    """A snapshot written by `world.snapshot()`: the tick it holds, the world's incarnation, its size."""

    tick: int
    incarnation: int
    size: int
