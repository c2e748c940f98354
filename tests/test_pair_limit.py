"""A world's pair limit: a batch that would pass it is refused whole, fast and without the memory a
pile of boxes would take, and the world is exactly as it was, through the server and in-process."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dbvt
from dbvt import reference
from dbvt_client import Client, Create, ResourceExhausted
from servers import ServerThread
from worlds import assert_a_pair_limit_refusal

LIMIT = 1000


def unit_boxes(n: int, at: float = 0.0) -> np.ndarray:
    return np.tile(np.array([at, at, at, at + 1, at + 1, at + 1], np.float32), (n, 1))


def scattered(n: int, seed: int) -> np.ndarray:
    low = np.random.default_rng(seed).uniform(0, 60, (n, 3))
    return np.concatenate([low, low + 2], 1).astype(np.float32)


def state(world) -> tuple:
    """What a refused batch must leave as it was: tick, proxies, pairs, and where every box is."""
    info = world.info()
    hits = world.query_aabb(np.array([[-1e6] * 3 + [1e6] * 3], np.float32))
    boxes = scattered(50, 9)
    return info.tick, info.proxies, world.pairs().tolist(), hits.hits.tolist(), world.query_aabb(boxes).hits.tolist()


@pytest.mark.parametrize("margin", [0.0, 0.05])
def test_a_batch_past_the_limit_is_refused_and_changes_nothing(client, margin):
    world = client.create_world("limited", margin=margin, max_pairs=LIMIT)
    assert world.info().max_pairs == LIMIT
    ids = np.arange(1, 201, dtype=np.uint64)
    world.apply(create=(ids, scattered(200, 1)))
    before = state(world)
    pile = np.arange(1000, 1100, dtype=np.uint64)          # 100 identical boxes: 4,950 pairs
    refusals = [dict(create=(pile, unit_boxes(100))),
                dict(move=(ids[:100], unit_boxes(100, 30.0))),
                dict(create=(pile[:60], unit_boxes(60, 30.0)), move=(ids[:60], unit_boxes(60, 30.0)),
                     destroy=ids[150:])]
    for batch in refusals:
        with pytest.raises(ResourceExhausted, match=f"past its limit of {LIMIT} pairs"):
            world.apply(**batch)
        assert state(world) == before
        with world.stream() as stream, pytest.raises(ResourceExhausted):
            stream.apply(**batch)
        assert state(world) == before
    assert world.apply(create=(pile[:40], unit_boxes(40, 100.0))).tick == before[0] + 1    # 780 pairs fit


@pytest.mark.parametrize("sensor", [False, True], ids=["plain", "with-a-sensor"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_pile_is_refused_before_its_fat_pairs_fill_the_memory(threads, sensor):
    """The 136-million-pair batch, scaled down: a world allowed 100 pairs refuses 20,000 boxes on one
    spot at once; the core stops after 4 times the limit of fat pairs, not after 200 million. On
    threads too, whether they make the changes (no sensors) or only find them: finding stops as
    soon as what it found would pass the limit, and the lists still agree."""
    local = dbvt.Broadphase(dims=3, margin=0.05, threads=threads)
    if sensor:
        local.create(np.array([10**9], np.uint64), unit_boxes(1, 50.0), sensor="sphere")
    local.create(np.arange(20_000, dtype=np.uint64), unit_boxes(20_000))
    with pytest.raises(dbvt.FatPairLimit):
        local.update(max_fat_pairs=400)
    assert local.stats()["fat_pairs"] < 2 * 20_000
    local.validate()
    local.destroy(np.arange(20_000, dtype=np.uint64))
    assert [len(pairs) for pairs in local.update()] == [0, 0] and local.stats()["fat_pairs"] == 0
    with Client.local() as client:
        world = client.create_world("pile", max_pairs=100)
        with pytest.raises(ResourceExhausted, match="pairs of boxes grown by the margin"):
            world.apply(create=(np.arange(20_000, dtype=np.uint64), unit_boxes(20_000)))
        assert (world.info().proxies, world.info().tick, len(world.pairs())) == (0, 0, 0)


def test_a_server_with_threads_refuses_a_pile_in_a_world_with_a_sensor():
    """Through a real server whose worlds step on 2 threads, in a world with a sensor (where the
    threads only find the partners): the pile is refused with RESOURCE_EXHAUSTED, and the world,
    its sensor pairs included, is as it was and takes the next batch."""
    server = ServerThread(threads_per_world=2)
    try:
        with Client(server.target) as client:
            world = client.create_world("pile", max_pairs=100)
            world.apply(create=Create(np.array([10**9], np.uint64), unit_boxes(1, 0.0), sensor="sphere"))
            world.apply(create=(np.arange(6, dtype=np.uint64), np.concatenate([scattered(5, 3), unit_boxes(1, 0.0)])))
            before, inside = state(world), world.sensor_pairs().tolist()
            assert inside == [[10**9, 5]]
            with pytest.raises(ResourceExhausted, match="pairs of boxes grown by the margin"):
                world.apply(create=(np.arange(100, 20_100, dtype=np.uint64), unit_boxes(20_000)))
            assert state(world) == before and world.sensor_pairs().tolist() == inside
            assert world.apply(create=(np.array([7_000], np.uint64), unit_boxes(1, 40.0))).tick == before[0] + 1
    finally:
        server.stop()


PILE_IN_A_GIGABYTE = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
import numpy as np
import dbvt
boxes = np.zeros((20_001, 6), np.float32)
boxes[:, 3:] = 1
boxes[0] += 50
pile = dbvt.Broadphase(dims=3, margin=0.05, threads=2)
pile.create(np.array([10**9], np.uint64), boxes[:1], sensor="sphere")
pile.create(np.arange(20_000, dtype=np.uint64), boxes[1:])
try:
    pile.update(max_fat_pairs=400)
except dbvt.FatPairLimit:
    print("refused")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the address-space limit (RLIMIT_AS) is Linux's")
def test_a_pile_on_threads_is_refused_within_a_gigabyte(tmp_path):
    """The pile above, in a world with a sensor and 2 threads, whose threads only find the partners:
    in a process that may map 1 GB, the update is refused with FatPairLimit, not MemoryError. Had
    the threads found every partner before the first merge counted them (400 million), it would
    need about 5 GB."""
    run = subprocess.run([sys.executable, "-c", PILE_IN_A_GIGABYTE], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert run.stdout.strip() == "refused", run.stderr[-2000:]


def test_limits_are_reported_and_held_to_the_servers(client):
    assert client.server_info()["max_pairs_per_world"] == 20_000_000
    assert client.create_world("default").info().max_pairs == 20_000_000
    with pytest.raises(ResourceExhausted, match="max_pairs 20000001 is above the server's limit"):
        client.create_world("greedy", max_pairs=20_000_001)


OPS = st.sampled_from(["create", "move", "destroy", "mixed"])


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(OPS, st.integers(1, 40), st.integers(0, 2**31)), min_size=1, max_size=12))
def test_the_world_equals_a_reference_that_refuses_the_same_batches(steps):
    """A small world with a small limit and no margin against the brute-force reference: a batch
    the reference takes past the limit is refused, naming the pairs it would have made; a refusal for
    the pairs themselves happens only then. The world may also refuse a batch for its fat boxes' pairs
    (FAT_PAIRS_PER_PAIR times the limit): without a margin a fat box still covers the predicted next
    moves, up to the box's own size on each axis, and proxies that each move about their size in this
    small world make several times the pairs (a soak of 320 examples found one). Either way the world
    is as it was."""
    limit = 60
    truth = reference.Broadphase(dims=3, margin=0.0)
    live: list[int] = []
    next_id = 1
    with Client.local() as client:
        world = client.create_world("checked", margin=0.0, max_pairs=limit)
        for op, count, seed in steps:
            rng = np.random.default_rng(seed)
            batch, trial = {}, reference.Broadphase.from_bytes(truth.to_bytes())
            if op in ("create", "mixed"):
                ids = np.arange(next_id, next_id + count, dtype=np.uint64)
                next_id += count
                low = rng.uniform(0, 6, (count, 3))
                boxes = np.concatenate([low, low + 1], 1).astype(np.float32)
                batch["create"] = (ids, boxes)
                trial.create(ids, boxes)
            if op in ("move", "mixed") and live:
                moved = rng.choice(live, min(count, len(live)), replace=False).astype(np.uint64)
                low = rng.uniform(0, 6, (len(moved), 3))
                boxes = np.concatenate([low, low + 1], 1).astype(np.float32)
                batch["move"] = (moved, boxes)
                trial.move(moved, boxes)
            if op == "destroy" and live:
                gone = rng.choice(live, min(count, len(live)), replace=False).astype(np.uint64)
                batch["destroy"] = gone
                trial.destroy(gone)
            if not batch:
                continue
            trial.update()
            try:
                world.apply(**batch)
            except ResourceExhausted as refusal:
                assert_a_pair_limit_refusal(refusal, len(trial.pairs()), limit)
            else:
                assert len(trial.pairs()) <= limit
                truth = trial
                created = {int(i) for i in batch.get("create", ([], None))[0]}
                live = sorted((set(live) | created) - {int(i) for i in batch.get("destroy", [])})
            assert world.pairs().tolist() == truth.pairs().tolist()
            assert world.info().proxies == len(live)


@pytest.mark.parametrize("spare", [0, -1])
def test_a_limit_every_pair_can_fit_under_takes_every_pair(client, spare):
    """A world whose proxies cannot make more pairs than its limit keeps no undo (a copy of the moved
    boxes each tick) and needs none; one pair less and the same batch is refused, and undone."""
    n = 40
    world = client.create_world("within-reach", max_pairs=n * (n - 1) // 2 + spare)
    ids = np.arange(n, dtype=np.uint64)
    world.apply(create=(ids, scattered(n, 3)))
    before = state(world)
    pile = dict(move=(ids, unit_boxes(n, 20.0)))
    if spare == 0:
        world.apply(**pile)
        assert len(world.pairs()) == n * (n - 1) // 2
    else:
        with pytest.raises(ResourceExhausted, match="past its limit"):
            world.apply(**pile)
        assert state(world) == before
