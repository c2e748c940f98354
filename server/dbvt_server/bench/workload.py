"""The benchmarks' two workloads, generated here so that a fresh clone can run every benchmark.

W1 is sparse and 3-D, the workload issue 2's targets are set on: N boxes with sides 1..4 in a cube
of side 5 N^(1/3), so a box touches about one other. Each step a new random tenth of them (ids
ascending) moves by its own velocity (a random direction, speed up to 0.5 a step) and bounces off
the walls. Beside them: 10k query boxes of side 10, 10k segments of length 50 and 1k perspective
frusta (60 degrees, near 0.1, far 50) placed at random in the cube.

W2 is dense, shaped like a 2-D physics pile (Box2D v3's "tumbler" trace: 3,553 shapes, about 3.5
pairs a proxy, nearly all moving each step, moves a fifth of a box side). Every proxy moves every
step; its velocity takes small random kicks and is capped at 0.15; its box breathes by up to a
fifth as the shape it bounds rotates, so each proxy touches about seven others. In 2-D or 3-D.

A workload directory holds raw little-endian arrays, which a C or C++ harness can fread, and JSON:

    boxes.f32      N x 2d      tight boxes (min..., max...) of proxies 0..N-1 (d = 2 or 3)
    moves_ids.u32  S x M       ids moved at each step, ascending (W2: all of them)
    moves_box.f32  S x M x 2d  their new tight boxes
    q_aabb.f32     Q x 6       W1 only: query boxes
    q_ray.f32      R x 6       W1 only: segments (from xyz, to xyz)
    q_frustum.f32  F x 24      W1 only: six inward planes (nx, ny, nz, d) each, in the order near,
                               far, and two pairs of opposite sides; a box passes when, for every
                               plane, its corner furthest along n has n.p + d >= 0
    meta.json      workload ("W1" or "W2"), n, steps, dims, moves_per_step, world_side, seed, and for
                   W1 n_aabb, n_ray, n_frustum
    expected.json  exact answers (see dbvt_server.bench.exact): pairs_step0, pairs_per_step, and for
                   W1 aabb_hits, ray_hits, frustum_hits and aabb/ray/frustum_first100

Pairs and hits are on closed intervals. A W1 directory without "workload" in meta.json, as older
generators wrote, is read as W1.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dbvt_server.bench import console, exact

W1_SEED, W2_SEED = 1, 2
W1_QUERIES = {"n_aabb": 10_000, "n_ray": 10_000, "n_frustum": 1_000}
# W2's spacing between centres, per dims: about seven neighbours a proxy, as in the traced pile.
W2_SPACING = {2: 0.29, 3: 0.36}
# W2's half sides: three sizes of shape, the middle one half of them; each axis then varies by up to 15 %.
W2_HALF_SIDES = (0.17, 0.17, 0.19, 0.14)


class BadWorkload(Exception):
    """A directory that is not a workload, or whose arrays disagree with its meta.json."""


def at_least(minimum: int):
    """An argparse type: an integer no smaller than `minimum` (W1 needs ten proxies for one to move,
    and every benchmark at least one step)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value
    parse.__name__ = f"integer >= {minimum}"
    return parse


@dataclasses.dataclass
class Workload:
    meta: dict
    boxes: np.ndarray               # (n, 2 dims) float32
    move_ids: np.ndarray            # (steps, moves) uint64, the type the API takes
    move_boxes: np.ndarray          # (steps, moves, 2 dims) float32
    q_aabb: np.ndarray | None = None        # W1's queries: (Q, 6), (R, 6), (F, 6, 4) float32
    q_ray: np.ndarray | None = None
    q_frustum: np.ndarray | None = None
    expected: dict | None = None

    @property
    def kind(self) -> str:
        return self.meta["workload"]

    @property
    def dims(self) -> int:
        return self.meta["dims"]

    @property
    def n(self) -> int:
        return len(self.boxes)

    @property
    def steps(self) -> int:
        return len(self.move_ids)

    @property
    def moves(self) -> int:
        return self.move_ids.shape[1]

    @property
    def ids(self) -> np.ndarray:
        return np.arange(self.n, dtype=np.uint64)

    def first(self, steps: int) -> "Workload":
        """The same workload cut to its first `steps` steps (expected.json covers a prefix as well)."""
        return dataclasses.replace(self, move_ids=self.move_ids[:steps], move_boxes=self.move_boxes[:steps])

    def describe(self) -> str:
        text = (f"{self.kind} {self.dims}-D: N={self.n}, {self.steps} steps of {self.moves} moves, "
                f"world side {self.meta['world_side']:.2f}")
        if self.kind == "W1":
            text += f"; {len(self.q_aabb)} boxes, {len(self.q_ray)} segments, {len(self.q_frustum)} frusta"
        return text


def _boxes(centres: np.ndarray, half: np.ndarray) -> np.ndarray:
    return np.concatenate([centres - half, centres + half], axis=1).astype(np.float32)


def _bounce(centres: np.ndarray, velocity: np.ndarray, side: float) -> None:
    """A component that left [0, side] turns back, and the centre is put back on the wall."""
    outside = (centres < 0) | (centres > side)
    velocity[outside] *= -1
    np.clip(centres, 0, side, out=centres)


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def frusta(eyes: np.ndarray, forward: np.ndarray, up: np.ndarray, fov: float = math.radians(60),
           near: float = 0.1, far: float = 50.0) -> np.ndarray:
    """(F, 6, 4) inward planes of symmetric perspective frusta: near, far, right, left, top, bottom."""
    f = _unit(forward)
    right = _unit(np.cross(f, up))
    top = np.cross(right, f)
    normals = [f, -f]
    points = [eyes + near * f, eyes + far * f]
    for side in (right, -right, top, -top):
        # A side plane contains the eye and leans out from the axis by fov / 2: f tan - side is inward.
        normals.append(_unit(f * math.tan(fov / 2) - side))
        points.append(eyes)
    n = np.stack(normals, axis=1)
    d = -np.einsum("fpk,fpk->fp", n, np.stack(points, axis=1))
    return np.concatenate([n, d[..., None]], axis=2).astype(np.float32)


def make_w1(n: int, steps: int, seed: int = W1_SEED) -> Workload:
    """W1 in memory, without its answers (see `answers`)."""
    rng = np.random.default_rng(seed)
    side = 5.0 * n ** (1 / 3)
    half = rng.uniform(0.5, 2.0, (n, 3))
    centres = rng.uniform(0, side, (n, 3))
    velocity = _unit(rng.normal(size=(n, 3))) * rng.uniform(0, 0.5, (n, 1))
    boxes = _boxes(centres, half)
    moves = n // 10
    move_ids = np.empty((steps, moves), np.uint64)
    move_boxes = np.empty((steps, moves, 6), np.float32)
    for step in range(steps):
        rows = np.sort(rng.choice(n, moves, replace=False))
        moved, heading = centres[rows] + velocity[rows], velocity[rows]
        _bounce(moved, heading, side)
        centres[rows], velocity[rows] = moved, heading
        move_ids[step], move_boxes[step] = rows, _boxes(moved, half[rows])
    count = W1_QUERIES
    q_centres = rng.uniform(0, side, (count["n_aabb"], 3))
    q_aabb = _boxes(q_centres, np.full(3, 5.0))
    starts = rng.uniform(0, side, (count["n_ray"], 3))
    q_ray = np.concatenate([starts, starts + 50.0 * _unit(rng.normal(size=(count["n_ray"], 3)))], 1).astype(np.float32)
    q_frustum = frusta(rng.uniform(0, side, (count["n_frustum"], 3)),
                       rng.normal(size=(count["n_frustum"], 3)), rng.normal(size=(count["n_frustum"], 3)))
    meta = dict(workload="W1", n=n, steps=steps, dims=3, moves_per_step=moves, world_side=side, seed=seed, **count)
    return Workload(meta, boxes, move_ids, move_boxes, q_aabb, q_ray, q_frustum)


def make_w2(n: int, steps: int, dims: int = 2, seed: int = W2_SEED) -> Workload:
    """W2 in memory, without its answers (see `answers`)."""
    rng = np.random.default_rng(seed)
    side = W2_SPACING[dims] * n ** (1 / dims)
    centres = rng.uniform(0, side, (n, dims))
    base = rng.choice(W2_HALF_SIDES, (n, 1)) * rng.uniform(0.85, 1.15, (n, dims))
    phase, spin = rng.uniform(0, 2 * np.pi, (n, 1)), rng.uniform(-0.3, 0.3, (n, 1))
    velocity = rng.normal(0, 0.045, (n, dims))

    def boxes_at(t: int) -> np.ndarray:
        return _boxes(centres, base * (1 + 0.2 * np.abs(np.sin(phase + spin * t))))

    boxes = boxes_at(0)
    move_boxes = np.empty((steps, n, 2 * dims), np.float32)
    for step in range(steps):
        velocity += rng.normal(0, 0.015, velocity.shape)
        speed = np.linalg.norm(velocity, axis=1, keepdims=True)
        velocity *= np.minimum(1.0, 0.15 / np.maximum(speed, 1e-12))
        centres += velocity
        _bounce(centres, velocity, side)
        move_boxes[step] = boxes_at(step + 1)
    move_ids = np.tile(np.arange(n, dtype=np.uint64), (steps, 1))
    meta = dict(workload="W2", n=n, steps=steps, dims=dims, moves_per_step=n, world_side=side, seed=seed)
    return Workload(meta, boxes, move_ids, move_boxes)


def answers(work: Workload) -> dict:
    """The exact expected.json of a workload."""
    if work.kind == "W1":
        return exact.w1_expected(work.boxes, work.move_ids, work.move_boxes, work.q_aabb, work.q_ray,
                                 work.q_frustum)
    return exact.w2_expected(work.boxes, work.move_ids, work.move_boxes, work.dims)


ARRAYS = {"boxes": "boxes.f32", "move_ids": "moves_ids.u32", "move_boxes": "moves_box.f32",
          "q_aabb": "q_aabb.f32", "q_ray": "q_ray.f32", "q_frustum": "q_frustum.f32"}


def save(work: Workload, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for field, name in ARRAYS.items():
        values = getattr(work, field)
        if values is not None:
            values.astype("<u4" if field == "move_ids" else "<f4").tofile(directory / name)
    (directory / "meta.json").write_text(json.dumps(work.meta))
    if work.expected is not None:
        (directory / "expected.json").write_text(json.dumps(work.expected))


def load(directory: Path) -> Workload:
    """A workload directory, in the types the API takes (converted once, so no timed call pays for it)."""
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise BadWorkload(f"{directory}: no readable meta.json ({exc})") from None
    meta.setdefault("dims", 3)
    meta.setdefault("workload", "W1" if meta["dims"] == 3 and (directory / "q_aabb.f32").exists() else "W2")
    needed = ("n", "steps", "moves_per_step", "world_side") + (tuple(W1_QUERIES) if meta["workload"] == "W1" else ())
    missing = [key for key in needed if key not in meta]
    if missing:
        raise BadWorkload(f"{directory / 'meta.json'}: no {', '.join(missing)}")
    if meta["steps"] < 1 or meta["moves_per_step"] < 1:
        raise BadWorkload(f"{directory}: no moves to run (steps {meta['steps']}, {meta['moves_per_step']} a step)")
    width, steps, moves = 2 * meta["dims"], meta["steps"], meta["moves_per_step"]

    def raw(field: str, shape: tuple) -> np.ndarray:
        path = directory / ARRAYS[field]
        values = np.fromfile(path, "<u4" if field == "move_ids" else "<f4") if path.exists() else np.zeros(0)
        if values.size != math.prod(shape):
            raise BadWorkload(f"{path}: {values.size} values, meta.json implies shape {shape}")
        return np.ascontiguousarray(values.reshape(shape), np.uint64 if field == "move_ids" else np.float32)

    work = Workload(meta, raw("boxes", (meta["n"], width)), raw("move_ids", (steps, moves)),
                    raw("move_boxes", (steps, moves, width)))
    if work.kind == "W1":
        work.q_aabb = raw("q_aabb", (meta["n_aabb"], 6))
        work.q_ray = raw("q_ray", (meta["n_ray"], 6))
        work.q_frustum = raw("q_frustum", (meta["n_frustum"], 6, 4))
    expected = directory / "expected.json"
    work.expected = json.loads(expected.read_text()) if expected.exists() else None
    return work


def generate(kind: str, n: int, steps: int, directory: Path, dims: int = 3, seed: int | None = None) -> Workload:
    """Make a workload with its exact answers and write it to `directory`, saying on stderr how long
    each part took (the answers take the longer: about half a minute at W1's N = 100k and 100 steps)."""
    started = time.perf_counter()
    work = (make_w1(n, steps, W1_SEED if seed is None else seed) if kind == "W1"
            else make_w2(n, steps, dims, W2_SEED if seed is None else seed))
    made = time.perf_counter()
    sys.stderr.write(f"{kind} data made in {made - started:.1f} s; computing the exact answers...\n")
    work.expected = answers(work)
    sys.stderr.write(f"exact answers computed in {time.perf_counter() - made:.1f} s\n")
    save(work, directory)
    return work


@contextlib.contextmanager
def w1_directory(directory: Path | None, n: int, steps: int, seed: int = W1_SEED):
    """`directory` if given, else a temporary one holding new W1 data, removed afterwards."""
    if directory is not None:
        yield directory
        return
    with tempfile.TemporaryDirectory(prefix="dbvt-bench-w1-") as made:
        sys.stderr.write(f"no directory given: making W1 data, N={n} with {steps} steps, in {made}\n")
        generate("W1", n, steps, Path(made), seed=seed)
        yield Path(made)


def w1_for(args, benchmark: str) -> Workload:
    """The W1 data a benchmark's arguments name (DIRECTORY, or --n, --steps, --seed to make it),
    cut to --steps, and said on standard output."""
    with w1_directory(args.directory, args.n, args.steps, args.seed) as directory:
        work = load(directory)
    if work.kind != "W1":
        raise BadWorkload(f"{args.directory}: a {work.kind} directory; the {benchmark} benchmark runs on W1")
    work = work.first(args.steps)
    print(f"{args.directory or 'W1 made for this run'}: {work.describe()}", flush=True)
    return work


def add_w1_arguments(parser, description: str, seed_help: str = "seed of the W1 data made here") -> None:
    """The arguments every benchmark on W1 takes: DIRECTORY, or --n, --steps and --seed to make it."""
    parser.description, parser.formatter_class = description, argparse.RawDescriptionHelpFormatter
    parser.add_argument("directory", nargs="?", type=Path,
                        help="a W1 directory (default: make W1 data with --n and --steps)")
    parser.add_argument("--n", type=at_least(10), default=100_000, help="proxies of the W1 data made here [100000]")
    parser.add_argument("--steps", type=at_least(1), default=30, help="steps to run (at most the directory's) [30]")
    parser.add_argument("--seed", type=int, default=W1_SEED, help=seed_help)


def add_arguments(parser) -> None:
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="{w1,w2}")
    for kind, text in (("w1", "sparse, 3-D, a tenth moving"), ("w2", "dense, every proxy moving")):
        sub = kinds.add_parser(kind, help=f"{kind.upper()}: {text}", description=f"{kind.upper()}: {text}")
        sub.add_argument("n", type=at_least(10), help="proxies")
        sub.add_argument("steps", type=at_least(1), help="steps of moves")
        sub.add_argument("directory", type=Path, help="where to write (made if missing)")
        if kind == "w2":
            sub.add_argument("--dims", type=int, choices=(2, 3), default=2, help="2-D or 3-D [2]")
        sub.add_argument("--seed", type=int, default=W1_SEED if kind == "w1" else W2_SEED,
                         help=f"random seed [{W1_SEED if kind == 'w1' else W2_SEED}]")


def run(args, facts: dict) -> int:
    work = generate(args.kind.upper(), args.n, args.steps, args.directory, getattr(args, "dims", 3), args.seed)
    final = work.expected["pairs_per_step"][-1] if work.steps else work.expected["pairs_step0"]
    print(f"wrote {args.directory}: {work.describe()}")
    print(f"pairs at step 0: {work.expected['pairs_step0']}, after the last step: {final} "
          f"({final / max(work.n, 1):.2f} per proxy)")
    console.footer(facts)
    return 0
