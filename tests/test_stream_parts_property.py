"""Pipelined batches on one stream, cut into parts by a small message size, against the reference;
and threads sharing one stream, or tasks sharing an AsyncClient's.

Random creates, moves and destroys, some with a fault (a NaN box, an id given twice, an unknown id,
a stale expected_tick), are submitted several at a time before any answer is read. Each batch is
applied whole or refused whole, in order; its answer is the reference's update; a refusal changes
nothing, so the batches after it apply to the world as it was.
"""
from __future__ import annotations

import asyncio
import copy
import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbvt import reference
from dbvt_client import AsyncClient, BatchResult, Client, InvalidArgument, TickMismatch
from servers import ServerThread
from worlds import assert_same_pairs

# 4,096 bytes of rows a message once the SDK's room for the rest is taken: 128 created rows a part.
SMALL_MESSAGES = 8192
FAULTS = [None, None, None, "nan", "twice", "unknown", "stale tick"]
_names = (f"parts-{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def small_server():
    running = ServerThread(max_message_bytes=SMALL_MESSAGES)
    yield running
    running.stop()


def boxes(rng, n: int) -> np.ndarray:
    low = rng.uniform(0, 30, (n, 3))
    return np.concatenate([low, low + rng.uniform(0.5, 3, (n, 3))], 1).astype(np.float32)


def planned(truth, live: set, tick: int, rng, fault):
    """A batch for the world as `truth` holds it, with `fault` put in where the batch allows it; and
    what must come of it: the reference after it with its update's (begun, ended), or the error
    class it must be refused with."""
    fresh = np.setdiff1d(rng.choice(5000, int(rng.integers(0, 300)), replace=False), sorted(live)).astype(np.uint64)
    held = np.array(sorted(live), np.uint64)
    moved = rng.permutation(held)[: int(rng.integers(0, len(held) + 1))]
    gone = np.setdiff1d(held, moved)[: int(rng.integers(0, 40))]
    batch = {"create": (fresh, boxes(rng, len(fresh))), "move": (moved, boxes(rng, len(moved))), "destroy": gone,
             "expected_tick": tick}
    if fault == "nan" and len(fresh):
        batch["create"][1][-1, 2] = np.nan
    elif fault == "twice" and len(fresh) and len(moved):
        batch["move"][0][-1] = fresh[0]
    elif fault == "unknown":
        batch["destroy"] = np.append(gone, np.uint64(10**6)).astype(np.uint64)
    elif fault == "stale tick":
        batch["expected_tick"] = tick - 1 if tick else tick + 1
        return batch, None, TickMismatch
    else:
        after = copy.deepcopy(truth)
        after.create(*batch["create"])
        after.move(*batch["move"])
        after.destroy(gone)
        return batch, after, after.update()
    return batch, None, InvalidArgument


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), faults=st.lists(st.sampled_from(FAULTS), min_size=1, max_size=8),
       margin=st.sampled_from([0.0, 0.1]))
def test_pipelined_batches_in_parts_apply_whole_or_not_at_all(small_server, seed, faults, margin):
    rng = np.random.default_rng(seed)
    with Client(small_server.target) as client:
        name = next(_names)
        world = client.create_world(name, dims=3, margin=margin)
        try:
            truth, live, tick, sent = reference.Broadphase(dims=3, margin=margin), set(), 0, []
            with world.stream() as stream:
                for fault in faults:
                    batch, after, outcome = planned(truth, live, tick, rng, fault)
                    sent.append((stream.submit(**batch), outcome))
                    if after is not None:
                        truth, tick = after, tick + 1
                        live = (live | set(batch["create"][0].tolist())) - set(batch["destroy"].tolist())
                for future, outcome in sent:
                    if isinstance(outcome, type):
                        with pytest.raises(outcome):
                            future.result()
                        continue
                    result = future.result()
                    assert_same_pairs(result.begun, outcome[0], "begun")
                    assert_same_pairs(result.ended, outcome[1], "ended")
            info = world.info()
            assert (info.tick, info.proxies) == (tick, len(live))
            assert_same_pairs(world.pairs(), truth.pairs())
        finally:
            client.delete_world(name)


def assert_each_got_its_answer(results: list, pairs: np.ndarray, everything: np.ndarray) -> None:
    """Batches that each created their share of `everything` took one tick each, in some order; the
    world holds the reference's pairs, and each began in exactly one batch's answer."""
    assert sorted(result.tick for result in results) == list(range(1, len(results) + 1))
    truth = reference.Broadphase(dims=3, margin=0.05)
    truth.create(np.arange(len(everything), dtype=np.uint64), everything)
    assert_same_pairs(pairs, truth.pairs())
    begun = np.concatenate([result.begun for result in results])
    assert_same_pairs(begun[np.lexsort((begun[:, 1], begun[:, 0]))], truth.pairs(), "every begun pair")


def test_tasks_sharing_an_async_stream_each_get_their_own_answer(small_server):
    """Tasks of an AsyncClient submitting on one stream at once, each batch in several parts: gRPC
    takes one write at a time on a call, so a batch's parts go out together, and every task gets its
    own answer, as threads sharing a synchronous stream do. (Before, the second writer ended the call.)"""
    rows, tasks = 600, 6
    everything = boxes(np.random.default_rng(5), rows * tasks)

    async def run():
        async with AsyncClient(small_server.target) as client:
            world = await client.create_world(next(_names), dims=3)
            async with world.stream() as stream:
                async def create(k: int):
                    ids = np.arange(k * rows, (k + 1) * rows, dtype=np.uint64)
                    return await stream.apply(create=(ids, everything[k * rows:(k + 1) * rows]))

                results = await asyncio.gather(*(create(k) for k in range(tasks)))
            pairs = await world.pairs()
            await client.delete_world(world.name)
            return results, pairs

    assert_each_got_its_answer(*asyncio.run(run()), everything)


def test_threads_sharing_a_stream_each_get_their_own_answer(small_server):
    """The same with threads on one synchronous stream: a batch's parts are queued together, under the
    stream's lock, with its future."""
    rows, threads = 600, 6
    everything = boxes(np.random.default_rng(6), rows * threads)
    with Client(small_server.target) as client:
        world = client.create_world(next(_names), dims=3)
        try:
            with world.stream() as stream, ThreadPoolExecutor(threads) as pool:
                def create(k: int):
                    ids = np.arange(k * rows, (k + 1) * rows, dtype=np.uint64)
                    return stream.apply(create=(ids, everything[k * rows:(k + 1) * rows]))

                results = list(pool.map(create, range(threads)))
            pairs = world.pairs()
        finally:
            client.delete_world(world.name)
    assert_each_got_its_answer(results, pairs, everything)


def test_a_caller_cancelled_while_its_batch_is_written_leaves_the_stream_in_step(small_server):
    """A task cancelled while its batch's parts are going out (a caller's own timeout) must not leave
    part of a batch on the stream: the server would wait for the rest, refuse the next batch as cutting
    into it, and every answer after would go to the wrong future. The batch goes out whole and is
    applied; the caller just does not wait for it."""
    rows = 3000
    everything = boxes(np.random.default_rng(7), rows + 1)

    async def run():
        async with AsyncClient(small_server.target) as client:
            world = await client.create_world(next(_names), dims=3)
            async with world.stream() as stream:
                big = asyncio.ensure_future(stream.submit(create=(np.arange(rows, dtype=np.uint64), everything[:rows])))
                await asyncio.sleep(0)      # its first parts are on their way
                big.cancel()
                late = await asyncio.wait_for(stream.apply(create=(np.array([rows], np.uint64), everything[rows:])), 20)
            pairs = await world.pairs()
            info = await world.info()
            await client.delete_world(world.name)
            return late, pairs, info

    late, pairs, info = asyncio.run(run())
    assert (info.tick, info.proxies, late.tick) == (2, rows + 1, 2)
    truth = reference.Broadphase(dims=3, margin=0.05)
    truth.create(np.arange(rows + 1, dtype=np.uint64), everything)
    assert_same_pairs(pairs, truth.pairs())


def test_a_cancelled_apply_of_a_batch_in_parts_applies_all_of_it_or_none(small_server):
    """`AsyncWorld.apply` sends a batch bigger than a message on a stream of its own. Cancelled at any
    moment, it never leaves a part of it: once its first part is out it sends them all and the world
    holds the whole batch at the next tick; cancelled before, the world holds nothing of it."""
    rows = 3000
    everything = boxes(np.random.default_rng(11), rows)
    truth = reference.Broadphase(dims=3, margin=0.05)
    truth.create(np.arange(rows, dtype=np.uint64), everything)

    async def run(delay: float):
        async with AsyncClient(small_server.target) as client:
            world = await client.create_world(next(_names), dims=3)
            applying = asyncio.ensure_future(world.apply(create=(np.arange(rows, dtype=np.uint64), everything)))
            await asyncio.sleep(delay)
            applying.cancel()
            outcome = (await asyncio.gather(applying, return_exceptions=True))[0]
            pairs, info = await world.pairs(), await world.info()
            await client.delete_world(world.name)
            return outcome, pairs, info

    for delay in (0, 0.0005, 0.001, 0.002, 0.004):
        outcome, pairs, info = asyncio.run(run(delay))
        assert isinstance(outcome, (asyncio.CancelledError, BatchResult))
        if info.tick == 0:
            assert info.proxies == 0 and len(pairs) == 0
        else:
            assert (info.tick, info.proxies) == (1, rows)
            assert_same_pairs(pairs, truth.pairs())
