"""Restart safety through the SDK: world incarnations, `expected_tick` on batches (unary, streamed, in
parts, async), and SnapshotWorld / ExportWorld / ImportWorld.

Checks that every answer of a world carries its one incarnation and a world made again gets another;
that a batch sent with a tick the world is not at is refused whole with the world's tick and
incarnation, so that a retried batch whose answer was lost goes in exactly once; that an exported
world imports on another server (or in-process) as the same world, answering everything identically,
and a damaged image creates nothing; that snapshots land in the data directory, need the admin role,
and that SIGTERM snapshots every changed world so that a restart replays nothing. Real servers on
127.0.0.1 (threads, and `dbvt-server` processes for SIGTERM) and Client.local(); nothing mocked.
"""
from __future__ import annotations

import asyncio
import dataclasses
import io
import itertools
import os
import re

import numpy as np
import pytest

from dbvt_client import (AlreadyExists, Client, FailedPrecondition, InvalidArgument, PermissionDenied,
                         Snapshot, TickMismatch, WorldInfo)
from dbvt_server import images
from dbvt_server.journal import read_segment
from security import TokenFile
from servers import ServerProcess, ServerThread, async_client
from worlds import W1World, assert_same_csr, assert_same_pairs

_names = (f"world-{i}" for i in itertools.count())
EVERYTHING = np.array([[-1e9] * 3 + [1e9] * 3], np.float32)
# Small enough that a create of a couple of thousand proxies, and a world's image, go in parts.
SMALL_MESSAGES = 16 * 1024


def row_boxes(n: int, start: float = 0.0) -> np.ndarray:
    """Boxes in a row along x, each overlapping the next."""
    x = start + np.arange(n, dtype=np.float32) * 1.0
    return np.stack([x, np.zeros(n), np.zeros(n), x + 1.5, np.ones(n), np.ones(n)], axis=1).astype(np.float32)


def state(world) -> tuple:
    """What a refused call must leave as it was: the world's description, its pairs, every proxy."""
    return world.info(), world.pairs().tolist(), world.query_aabb(EVERYTHING).hits.tolist()


def built(world, seed: int = 0, n: int = 40, steps: int = 2) -> int:
    """`world` with `n` proxies in a row and `steps` ticks of moves after their creation; its tick."""
    world.apply(create=(np.arange(1, n + 1, dtype=np.uint64), row_boxes(n)))
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        moved = np.sort(rng.choice(np.arange(1, n + 1), n // 4, replace=False)).astype(np.uint64)
        world.apply(move=(moved, row_boxes(len(moved), float(rng.uniform(0, n)))))
    return 1 + steps


def assert_mismatch(error: TickMismatch, world_info: WorldInfo, expected: int) -> None:
    """A TickMismatch that carries the world's tick and incarnation and says both (and the tick asked)."""
    assert isinstance(error, FailedPrecondition)
    assert (error.tick, error.incarnation) == (world_info.tick, world_info.incarnation)
    assert re.search(rf"(?<!expected )tick {world_info.tick}\b", error.message), error.message
    assert re.search(rf"\b{world_info.incarnation}\b", error.message), error.message
    assert f"expected tick {expected}" in error.message and "nothing of the batch was applied" in error.message


# ---- 1. incarnations -------------------------------------------------------------------------------

def test_a_world_has_one_nonzero_64_bit_incarnation_in_every_answer(client):
    world = client.create_world(next(_names))
    info = world.info()
    incarnation = info.incarnation
    assert isinstance(incarnation, int) and 0 < incarnation < 2**64
    assert world.stats()["incarnation"] == incarnation
    gen = W1World(300, seed=1)
    results = [world.apply(create=(gen.ids, gen.boxes))] + [world.apply(move=gen.step()) for _ in range(3)]
    with world.stream() as stream:
        results += [stream.apply(move=gen.step()), stream.submit(move=gen.step()).result()]
    assert [r.tick for r in results] == list(range(1, 7))
    assert {r.incarnation for r in results} == {incarnation}
    centers, radii = gen.spheres(20)
    answers = [world.query_aabb(gen.query_boxes(20)), world.query_sphere(centers, radii),
               world.raycast(gen.segments(20)), world.raycast(gen.segments(20), first_hit=True),
               world.query_frustum(gen.frusta(5))]
    assert sum(len(answer.hits) for answer in answers) > 0
    assert [(answer.tick, answer.incarnation) for answer in answers] == [(6, incarnation)] * len(answers)
    assert world.info().incarnation == incarnation


def test_a_world_made_again_under_its_name_has_a_new_incarnation(client):
    name = next(_names)
    first = client.create_world(name)
    first.apply(create=([1], row_boxes(1)))
    before = first.info().incarnation
    # Reattaching is the same world, not a new one.
    assert client.create_world(name, exist_ok=True).info().incarnation == before
    client.delete_world(name)
    again = client.create_world(name)
    info = again.info()
    assert (info.tick, info.proxies) == (0, 0)
    assert 0 < info.incarnation < 2**64 and info.incarnation != before
    assert again.apply().incarnation == info.incarnation
    # Another world at once has another incarnation too.
    assert client.create_world(next(_names)).info().incarnation not in (before, info.incarnation)


# ---- 2. expected_tick ------------------------------------------------------------------------------

def _unary(world, **batch):
    return world.apply(**batch)


def _stream_apply(world, **batch):
    with world.stream() as stream:
        return stream.apply(**batch)


def _stream_submit(world, **batch):
    with world.stream() as stream:
        return stream.submit(**batch).result()


SENDERS = {"unary": _unary, "stream-apply": _stream_apply, "stream-submit": _stream_submit}


@pytest.mark.parametrize("send", SENDERS.values(), ids=SENDERS.keys())
def test_a_stale_or_future_expected_tick_is_refused_and_changes_nothing(client, send):
    world = client.create_world(next(_names))
    tick = built(world)
    before = state(world)
    batch = dict(create=([1000], row_boxes(1, 3.0)), move=([1, 2], row_boxes(2, 30.0)), destroy=[3])
    for wrong in (0, tick - 1, tick + 1, 2**64 - 1):
        with pytest.raises(TickMismatch) as refused:
            send(world, **batch, expected_tick=wrong)
        assert_mismatch(refused.value, before[0], wrong)
        assert state(world) == before
    result = send(world, **batch, expected_tick=np.uint64(tick))
    assert (result.tick, result.incarnation) == (tick + 1, before[0].incarnation)
    after = world.info()
    assert (after.tick, after.proxies) == (tick + 1, before[0].proxies)
    assert 3 not in world.query_aabb(EVERYTHING).hits.tolist()


def test_a_refused_tick_fails_only_its_own_batch_on_a_stream(client):
    world = client.create_world(next(_names))
    with world.stream() as stream:
        first = stream.submit(create=([1, 2], row_boxes(2)), expected_tick=0)
        stale = stream.submit(create=([3], row_boxes(1, 2.4)), expected_tick=0)
        right = stream.submit(create=([3], row_boxes(1, 2.4)), expected_tick=1)
        unchecked = stream.submit(destroy=[1])
    assert first.result().tick == 1
    with pytest.raises(TickMismatch) as refused:
        stale.result()
    assert refused.value.tick == 1
    assert right.result().tick == 2 and right.result().begun.tolist() == [[2, 3]]
    assert unchecked.result().tick == 3
    assert world.query_aabb(EVERYTHING).hits.tolist() == [2, 3]


@pytest.mark.parametrize("send", SENDERS.values(), ids=SENDERS.keys())
def test_a_retried_batch_whose_answer_was_lost_goes_in_exactly_once(client, send):
    world = client.create_world(next(_names))
    tick = built(world)
    batch = dict(create=([500, 501], row_boxes(2, 100.0)), move=([1], row_boxes(1, 200.0)))
    first = send(world, **batch, expected_tick=tick)     # its answer is "lost": the client only retries
    with pytest.raises(TickMismatch) as retried:
        send(world, **batch, expected_tick=tick)
    assert (retried.value.tick, retried.value.incarnation) == (tick + 1, first.incarnation)
    info = world.info()
    assert (info.tick, info.proxies, info.incarnation) == (tick + 1, 42, first.incarnation)
    assert world.query_aabb(row_boxes(1, 200.0)).hits.tolist() == [1]
    assert world.query_aabb([[99, -1, -1, 104, 2, 2]]).hits.tolist() == [500, 501]


def test_a_retry_that_finds_the_world_made_again_sees_another_incarnation(client):
    """The answer is lost and, before the retry, the world is deleted, made again and brought to the very
    tick the client expects next: only the incarnation tells the client that its batch is not there."""
    name = next(_names)
    world = client.create_world(name)
    first = world.apply(create=([1], row_boxes(1)), expected_tick=0)
    client.delete_world(name)
    again = client.create_world(name)
    again.apply(create=([7], row_boxes(1, 50.0)))
    with pytest.raises(TickMismatch) as retried:
        again.apply(create=([1], row_boxes(1)), expected_tick=0)
    assert retried.value.tick == first.tick == 1
    assert retried.value.incarnation == again.info().incarnation != first.incarnation
    assert again.query_aabb(EVERYTHING).hits.tolist() == [7]


@pytest.mark.parametrize("bad", [-1, 1.0, 0.5, True, False, 2**64, "1", np.float64(1.0)],
                         ids=["negative", "float", "fraction", "True", "False", "2**64", "str", "numpy-float"])
def test_a_bad_expected_tick_is_an_invalid_argument(client, bad):
    world = client.create_world(next(_names))
    world.apply(create=([1], row_boxes(1)))
    before = state(world)
    with pytest.raises(InvalidArgument, match="expected_tick must be None or an integer tick >= 0"):
        world.apply(destroy=[1], expected_tick=bad)
    with world.stream() as stream:
        with pytest.raises(InvalidArgument, match="expected_tick"):
            stream.submit(destroy=[1], expected_tick=bad)
        with pytest.raises(InvalidArgument, match="expected_tick"):
            stream.apply(destroy=[1], expected_tick=bad)
        assert stream.apply(expected_tick=1).tick == 2      # the stream goes on
    assert state(world)[1:] == before[1:]


def test_the_async_client_checks_expected_tick(mode, server):
    async def scenario():
        client = async_client(mode, server)
        async with client:
            world = await client.create_world("async-ticks")
            try:
                created = await world.apply(create=([1, 2], row_boxes(2)), expected_tick=0)
                info = await world.info()
                with pytest.raises(TickMismatch) as unary:
                    await world.apply(create=([1, 2], row_boxes(2)), expected_tick=0)    # the lost answer
                async with world.stream() as stream:
                    with pytest.raises(TickMismatch) as streamed:
                        await stream.apply(destroy=[1], expected_tick=5)
                    with pytest.raises(TickMismatch) as submitted:
                        await (await stream.submit(destroy=[1], expected_tick=0))
                    moved = await stream.apply(move=([1], row_boxes(1, 10.0)), expected_tick=1)
                with pytest.raises(InvalidArgument, match="expected_tick"):
                    await world.apply(expected_tick=-1)
                return created, info, (unary.value, streamed.value, submitted.value), moved, await world.info()
            finally:
                await client.delete_world("async-ticks")

    created, info, refusals, moved, after = asyncio.run(scenario())
    assert (created.tick, created.incarnation) == (1, info.incarnation) and info.tick == 1
    for error, expected in zip(refusals, (0, 5, 0)):
        assert_mismatch(error, info, expected)
    assert (moved.tick, moved.incarnation, moved.ended.tolist()) == (2, info.incarnation, [[1, 2]])
    assert (after.tick, after.proxies) == (2, 2)


def test_the_async_client_exports_imports_and_snapshots(mode, server, tmp_path):
    async def scenario():
        client = async_client(mode, server)
        async with client:
            world = await client.create_world("async-source")
            try:
                await world.apply(create=(np.arange(1, 31, dtype=np.uint64), row_boxes(30)))
                await world.apply(move=([1, 2], row_boxes(2, 60.0)))
                memory, path = io.BytesIO(), tmp_path / "async.dbvt"
                exported = await world.export(memory)
                assert await world.export(str(path)) == exported
                memory.seek(0)
                copy = await client.import_world("async-copy", memory)
                with pytest.raises(AlreadyExists):
                    await client.import_world("async-copy", path)
                with pytest.raises(InvalidArgument, match="CRC-32"):
                    await client.import_world("async-damaged", io.BytesIO(_flipped(lambda n: n // 2)(path.read_bytes())))
                with pytest.raises(FailedPrecondition, match="no data directory"):
                    await world.snapshot()
                return (exported, await copy.info(), (await copy.pairs()).tolist(), (await world.pairs()).tolist(),
                        await client.list_worlds())
            finally:
                for name in await client.list_worlds():
                    await client.delete_world(name)

    exported, copied, copy_pairs, pairs, names = asyncio.run(scenario())
    assert dataclasses.replace(copied, name="async-source") == exported and exported.tick == 2
    assert copy_pairs == pairs and len(pairs) == 28
    assert names == ["async-copy", "async-source"]


@pytest.fixture(scope="module")
def small_server():
    """A server whose messages are too small for a big create or a world's image: they go in parts."""
    running = ServerThread(max_message_bytes=SMALL_MESSAGES)
    yield running
    running.stop()


@pytest.mark.parametrize("send", [_unary, _stream_apply], ids=["unary", "stream"])
def test_a_batch_in_parts_with_expected_tick_applies_or_is_refused_whole(small_server, send):
    gen = W1World(2000, seed=3)
    assert gen.ids.nbytes + gen.boxes.nbytes > 3 * SMALL_MESSAGES
    with Client(small_server.target) as client:
        world = client.create_world(next(_names))
        try:
            world.apply(create=([2**63], row_boxes(1, -100.0)))
            before = state(world)
            for wrong in (0, 2):
                with pytest.raises(TickMismatch) as refused:
                    send(world, create=(gen.ids, gen.boxes), expected_tick=wrong)
                assert_mismatch(refused.value, before[0], wrong)
                assert state(world) == before
            result = send(world, create=(gen.ids, gen.boxes), expected_tick=1)
            assert (result.tick, result.incarnation) == (2, before[0].incarnation) and len(result.begun) > 0
            # The lost answer of a batch in parts: the retry is refused whole, the world holds it once.
            with pytest.raises(TickMismatch) as retried:
                send(world, create=(gen.ids, gen.boxes), expected_tick=1)
            assert (retried.value.tick, retried.value.incarnation) == (2, before[0].incarnation)
            info = world.info()
            assert (info.tick, info.proxies) == (2, 2001)
            moved = send(world, move=(gen.ids, gen.boxes + 1.0), expected_tick=2)
            assert moved.tick == 3
        finally:
            client.delete_world(world.name)


# ---- 3. export and import --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def other_server():
    running = ServerThread()
    yield running
    running.stop()


def w1_source(world, n: int = 3000, seed: int = 7, steps: int = 5) -> W1World:
    """`world` made from a W1 world: its proxies created (some static, in groups), then `steps` moves."""
    gen = W1World(n, seed=seed)
    rng = np.random.default_rng(seed)
    world.apply(create=(gen.ids, gen.boxes), static=rng.random(n) < 0.1, group=rng.integers(1, 8, n),
                mask=rng.integers(1, 8, n))
    for _ in range(steps):
        world.apply(move=gen.step())
    return gen


def assert_same_world(copy, original, gen: W1World, name: str) -> None:
    """`copy` is `original` under another name: description, pairs and every kind of query answer."""
    got, expected = copy.info(), original.info()
    assert got.name == name
    for key in ("dims", "margin", "max_proxies", "proxies", "tick", "incarnation", "track_pairs", "max_pairs"):
        assert getattr(got, key) == getattr(expected, key), key
    assert_same_pairs(copy.pairs(), original.pairs())
    boxes = gen.query_boxes(200)
    centers, radii = gen.spheres(200)
    segments = gen.segments(200)
    planes = gen.frusta(30)
    for what, ask in (("aabb", lambda w: w.query_aabb(boxes)), ("masked aabb", lambda w: w.query_aabb(boxes, mask=2)),
                      ("sphere", lambda w: w.query_sphere(centers, radii)),
                      ("raycast", lambda w: w.raycast(segments)),
                      ("first hit", lambda w: w.raycast(segments, first_hit=True)),
                      ("frustum", lambda w: w.query_frustum(planes))):
        answer, truth = ask(copy), ask(original)
        assert len(truth.hits) > 0, what
        assert_same_csr(answer, truth, what)
        assert (answer.tick, answer.incarnation) == (truth.tick, truth.incarnation) == (expected.tick,
                                                                                        expected.incarnation)


def assert_same_futures(copy, original, gen: W1World, steps: int = 3) -> None:
    """The same further batches give the same BatchResults on both."""
    extra = np.arange(1, 21, dtype=np.uint64)
    kept = np.ones(gen.n, bool)
    kept[:10] = False                               # destroyed by the last batch, so not moved in it
    batches = [dict(move=gen.step()) for _ in range(steps)]
    batches.append(dict(create=(extra, gen.query_boxes(20, half=2.0)), move=gen.step(kept), destroy=gen.ids[:10]))
    for batch in batches:
        a, b = copy.apply(**batch), original.apply(**batch)
        assert (a.tick, a.incarnation) == (b.tick, b.incarnation)
        assert_same_pairs(a.begun, b.begun, "begun")
        assert_same_pairs(a.ended, b.ended, "ended")
    assert_same_pairs(copy.pairs(), original.pairs())


def test_an_exported_world_imports_on_another_server_as_the_same_world(server, other_server, tmp_path):
    with Client(server.target) as here, Client(other_server.target) as there:
        original = here.create_world("exported", max_pairs=1_000_000)
        try:
            gen = w1_source(original)
            path, memory = tmp_path / "exported.dbvt", io.BytesIO()
            exported = original.export(str(path))
            assert exported == original.info() and exported.tick == 6 and exported.proxies == 3000
            assert original.export(memory) == exported
            assert memory.getvalue() == path.read_bytes()
            assert os.listdir(tmp_path) == ["exported.dbvt"]          # no partial file left behind
            assert path.stat().st_size > SMALL_MESSAGES

            copy = there.import_world("imported", path)
            assert copy.name == "imported" and there.list_worlds() == ["imported"]
            memory.seek(0)
            second = there.import_world("imported-again", memory)
            assert_same_world(copy, original, gen, "imported")
            assert_same_world(second, original, gen, "imported-again")
            assert_same_futures(copy, original, gen)
            # The import is a world of its own: the copy moved on, the second import did not.
            assert second.info().tick == 6
        finally:
            for client in (here, there):
                for name in client.list_worlds():
                    client.delete_world(name)


def test_export_and_import_in_process_and_between_in_process_and_a_server(server):
    with Client.local() as local, Client(server.target) as remote:
        original = local.create_world("local-original")
        gen = w1_source(original, n=2000, seed=11)
        image = io.BytesIO()
        original.export(image)
        image.seek(0)
        copy = local.import_world("local-copy", image)
        assert_same_world(copy, original, gen, "local-copy")
        try:
            remote_copy = remote.import_world("from-local", io.BytesIO(image.getvalue()))
            assert_same_world(remote_copy, original, gen, "from-local")
            back = io.BytesIO()
            remote_copy.export(back)
            back.seek(0)
            assert_same_world(local.import_world("round-trip", back), original, gen, "round-trip")
            assert_same_futures(copy, original, gen)
        finally:
            remote.delete_world("from-local")


def test_an_import_over_an_existing_name_is_refused_and_changes_nothing(client, tmp_path):
    source = client.create_world(next(_names))
    built(source, n=30)
    image = tmp_path / "source.dbvt"
    source.export(image)
    target = client.create_world("taken")
    built(target, seed=1, n=10, steps=1)
    before = {name: state(client.world(name)) for name in client.list_worlds()}
    for name in ("taken", source.name):
        with pytest.raises(AlreadyExists, match=f"a world named '{name}' already exists"):
            client.import_world(name, image)
    assert {name: state(client.world(name)) for name in client.list_worlds()} == before


def _flipped(at):
    def damage(image: bytes) -> bytes:
        damaged = bytearray(image)
        damaged[at(len(image))] ^= 0x10
        return bytes(damaged)

    return damage


META_START = images.HEADER.size
DAMAGES = {
    "magic": (_flipped(lambda n: 0), "not a dbvt world image \\(bad magic\\)"),
    "version": (_flipped(lambda n: 8), "world image format version 17; this server reads version 1"),
    "meta-size": (_flipped(lambda n: 12), "the image declares \\d+ bytes but has \\d+"),
    "body-size": (_flipped(lambda n: 16), "the image declares \\d+ bytes but has \\d+"),
    "settings": (_flipped(lambda n: META_START + 3), "CRC-32 does not match its bytes: it is damaged"),
    "core-start": (_flipped(lambda n: META_START + 200), "CRC-32 does not match"),
    "core-middle": (_flipped(lambda n: n // 2), "CRC-32 does not match"),
    "core-end": (_flipped(lambda n: n - 5), "CRC-32 does not match"),
    "crc": (_flipped(lambda n: n - 1), "CRC-32 does not match"),
    "truncated": (lambda image: image[:-1], "declares \\d+ bytes but has \\d+ \\(cut short or padded\\)"),
    "half": (lambda image: image[:len(image) // 2], "declares \\d+ bytes but has \\d+"),
    "padded": (lambda image: image + b"\0", "declares \\d+ bytes but has \\d+"),
    "header-only": (lambda image: image[:10], "10 bytes are too few for a world image"),
    "random": (lambda image: np.random.default_rng(5).bytes(len(image)), "bad magic"),
    "empty": (lambda image: b"", "0 bytes are too few for a world image"),
}


@pytest.mark.parametrize("damage, problem", DAMAGES.values(), ids=DAMAGES.keys())
def test_a_damaged_image_is_refused_and_creates_nothing(client, tmp_path, damage, problem):
    source = client.create_world(next(_names))
    built(source, n=300)
    image = io.BytesIO()
    source.export(image)
    damaged = damage(image.getvalue())
    assert damaged != image.getvalue()
    before = client.list_worlds()
    path = tmp_path / "damaged.dbvt"
    path.write_bytes(damaged)
    for given in (path, io.BytesIO(damaged)):
        with pytest.raises(InvalidArgument, match=f"cannot import world 'copy': .*{problem}.*; nothing was created"):
            client.import_world("copy", given)
        assert client.list_worlds() == before
    # The name is free: the intact image imports under it.
    image.seek(0)
    assert client.import_world("copy", image).info().tick == source.info().tick


CONTRADICTIONS = {
    "margin-not-the-cores": (dict(margin=0.5), "margin"),
    "negative-margin": (dict(margin=-1.0), "margin"),
    "nan-margin": (dict(margin=float("nan")), "margin"),
    "more-proxies-than-max_proxies": (dict(max_proxies=10), "max_proxies"),
    "more-pairs-than-max_pairs": (dict(max_pairs=3), "max_pairs"),
}


@pytest.mark.parametrize("changes, named", CONTRADICTIONS.values(), ids=CONTRADICTIONS.keys())
def test_an_image_whose_settings_contradict_its_core_is_refused(client, changes, named):
    """An intact image (its CRC right) whose settings say what its core is not, or what no world may be
    (create_world refuses such a margin; a batch may never leave more proxies or pairs than the limits):
    refused like a damaged one, rather than imported as a world whose WorldInfo misdescribes it."""
    source = client.create_world(next(_names), margin=0.05)
    built(source, n=40)
    assert len(source.pairs()) > 3
    exported = io.BytesIO()
    source.export(exported)
    image = images.decode(exported.getvalue())
    crafted = b"".join(images.encode({**image.settings, **changes}, image.broadphase))
    before = client.list_worlds()
    with pytest.raises(InvalidArgument, match=f"cannot import world 'crafted': .*{named}.*; nothing was created"):
        client.import_world("crafted", io.BytesIO(crafted))
    assert client.list_worlds() == before


def test_a_damaged_image_leaves_no_files_in_the_data_directory(tmp_path):
    running = ServerThread(data_dir=str(tmp_path / "data"))
    try:
        with Client(running.target) as client:
            source = client.create_world("source")
            built(source, n=200)
            image = io.BytesIO()
            source.export(image)
            listed = sorted(os.listdir(tmp_path / "data" / "worlds"))
            for damage, problem in DAMAGES.values():
                with pytest.raises(InvalidArgument, match=problem):
                    client.import_world("copy", io.BytesIO(damage(image.getvalue())))
            assert client.list_worlds() == ["source"]
            assert sorted(os.listdir(tmp_path / "data" / "worlds")) == listed
            image.seek(0)
            copy = client.import_world("copy", image)
            assert copy.info().ephemeral is False and copy.snapshot().tick == source.info().tick
    finally:
        running.stop()


def test_an_image_bigger_than_a_message_goes_in_parts(small_server, server, tmp_path):
    with Client(server.target) as big, Client(small_server.target) as small:
        assert small.server_info()["max_message_bytes"] == SMALL_MESSAGES
        original = big.create_world(next(_names))
        try:
            gen = w1_source(original, n=2500, seed=4, steps=3)
            path = tmp_path / "big.dbvt"
            original.export(path)
            assert path.stat().st_size > 10 * SMALL_MESSAGES
            copy = small.import_world("in-parts", path)
            assert_same_world(copy, original, gen, "in-parts")
            # Exported from the small server in parts too, it imports back as the same world.
            again = io.BytesIO()
            assert copy.export(again).name == "in-parts"
            back = big.import_world("round-trip", io.BytesIO(again.getvalue()))
            assert_same_world(back, original, gen, "round-trip")
            assert_same_futures(copy, original, gen, steps=2)
        finally:
            for client in (big, small):
                for name in client.list_worlds():
                    client.delete_world(name)


# ---- 4. snapshots ----------------------------------------------------------------------------------

def test_a_snapshot_needs_a_data_directory(client):
    world = client.create_world(next(_names))
    world.apply(create=([1], row_boxes(1)))
    assert world.info().ephemeral is True
    assert client.server_info()["persistent"] is False
    with pytest.raises(FailedPrecondition, match="has no snapshots: the server has no data directory"):
        world.snapshot()
    assert world.info().tick == 1


SNAPSHOT_FILE = re.compile(r"snapshot-(\d{20})\.dbvt")


def test_a_snapshot_is_written_to_the_data_directory_at_the_current_tick(tmp_path):
    running = ServerThread(data_dir=str(tmp_path))
    try:
        with Client(running.target) as client:
            assert client.server_info()["persistent"] is True
            world = client.create_world("kept")
            tick = built(world, n=500, steps=4)
            info = world.info()
            assert info.ephemeral is False
            taken = world.snapshot()
            assert isinstance(taken, Snapshot)
            assert (taken.tick, taken.incarnation) == (tick, info.incarnation) and taken.size > 0
            files = list(tmp_path.glob(f"worlds/*/snapshot-{tick:020d}.dbvt"))
            assert len(files) == 1 and files[0].stat().st_size == taken.size
            assert files[0].parent.name.startswith("kept-")
            written = images.decode(files[0].read_bytes())
            assert (written.settings["tick"], written.settings["incarnation"]) == (tick, info.incarnation)
            assert len(written.broadphase) == 500
            # Unchanged since: the same snapshot; one more tick: a new one.
            assert world.snapshot() == taken
            world.apply()
            later = world.snapshot()
            assert (later.tick, later.incarnation) == (tick + 1, info.incarnation)
            assert list(tmp_path.glob(f"worlds/*/snapshot-{tick + 1:020d}.dbvt"))
            assert world.info() == dataclasses.replace(info, tick=tick + 1)
    finally:
        running.stop()


def test_an_ephemeral_world_has_no_snapshots(tmp_path):
    running = ServerThread(data_dir=str(tmp_path))
    try:
        with Client(running.target) as client:
            match = client.create_world("match", ephemeral=True)
            match.apply(create=([1, 2], row_boxes(2)))
            assert match.info().ephemeral is True
            with pytest.raises(FailedPrecondition, match="world 'match' has no snapshots: the world is ephemeral"):
                match.snapshot()
            image = io.BytesIO()
            match.export(image)
            image.seek(0)
            imported = client.import_world("match-copy", image, ephemeral=True)
            assert imported.info().ephemeral is True
            with pytest.raises(FailedPrecondition, match="ephemeral"):
                imported.snapshot()
            assert not list(tmp_path.glob("worlds/*/snapshot-*.dbvt"))
            assert match.info().tick == 1
    finally:
        running.stop()


# ---- 5. the admin role -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    return TokenFile(tmp_path_factory.mktemp("tokens") / "tokens", ("ops", "admin", "*"), ("writer", "write", "*"))


@pytest.fixture(scope="module")
def token_server(tokens, tmp_path_factory):
    running = ServerThread(tokens=str(tokens.path), data_dir=str(tmp_path_factory.mktemp("data")))
    yield running
    running.stop()


def test_snapshot_export_and_import_need_the_admin_role(token_server, tokens, tmp_path):
    with Client(token_server.target, token=tokens.secret["ops"]) as admin, \
            Client(token_server.target, token=tokens.secret["writer"]) as writer:
        world = admin.create_world("arena")
        try:
            built(world, n=50)
            image = tmp_path / "arena.dbvt"
            admin.world("arena").export(image)
            before = {name: state(admin.world(name)) for name in admin.list_worlds()}
            # A write token may still apply batches: only these three calls are refused.
            assert writer.world("arena").apply(expected_tick=3).tick == 4
            before["arena"] = state(admin.world("arena"))
            with pytest.raises(PermissionDenied, match="token 'writer' may not admin on world 'arena'"):
                writer.world("arena").snapshot()
            refused_export = tmp_path / "refused.dbvt"
            with pytest.raises(PermissionDenied, match="may not admin on world 'arena'"):
                writer.world("arena").export(refused_export)
            assert not refused_export.exists() and not list(tmp_path.glob("refused*"))
            with pytest.raises(PermissionDenied, match="may not admin on world 'arena-copy'"):
                writer.import_world("arena-copy", image)
            assert {name: state(admin.world(name)) for name in admin.list_worlds()} == before

            taken = admin.world("arena").snapshot()
            assert taken.tick == 4 and taken.incarnation == before["arena"][0].incarnation
            exported = tmp_path / "by-admin.dbvt"
            assert admin.world("arena").export(exported).tick == 4
            copy = admin.import_world("arena-copy", exported)
            assert copy.info().incarnation == taken.incarnation and admin.list_worlds() == ["arena", "arena-copy"]
        finally:
            for name in admin.list_worlds():
                admin.delete_world(name)


# ---- 6. SIGTERM --------------------------------------------------------------------------------------

def _world_dir(data, name: str):
    found = [entry for entry in (data / "worlds").iterdir() if entry.name.startswith(f"{name}-")]
    assert len(found) == 1, found
    return found[0]


def test_sigterm_snapshots_every_changed_world_and_a_restart_replays_nothing(tmp_path):
    data = tmp_path / "data"
    first = ServerProcess("--data-dir", str(data))
    try:
        with Client(first.target) as client:
            kept = client.create_world("kept")
            gen = W1World(1000, seed=6)
            kept.apply(create=(gen.ids, gen.boxes))
            with kept.stream() as stream:
                for _ in range(4):
                    stream.submit(move=gen.step())
            assert kept.apply(move=gen.step(), expected_tick=5).tick == 6
            client.create_world("still")                        # unchanged since its first snapshot
            client.create_world("match", ephemeral=True).apply(create=([1], row_boxes(1)))
            before, pairs = kept.info(), kept.pairs()
            still = client.world("still").info()
        assert first.terminate() == 0
    finally:
        first.kill()
    log = "\n".join(first.output())
    assert "snapshots of 1 changed worlds written" in log, log

    directory = _world_dir(data, "kept")
    snapshots = sorted(int(m.group(1)) for entry in os.listdir(directory) if (m := SNAPSHOT_FILE.fullmatch(entry)))
    assert snapshots[-1] == before.tick == 6
    image = images.decode((directory / f"snapshot-{6:020d}.dbvt").read_bytes())
    assert (image.settings["tick"], image.settings["incarnation"]) == (6, before.incarnation)
    segments = sorted(directory.glob("journal-*.log"))
    assert segments and segments[-1].name == f"journal-{6:020d}.log"
    records = [tick for segment in segments for _, tick, _ in read_segment(str(segment)).records]
    assert all(tick <= 6 for tick in records), records
    assert not read_segment(str(segments[-1])).records
    assert not [entry for entry in (data / "worlds").iterdir() if entry.name.startswith("match-")]

    second = ServerProcess("--data-dir", str(data))
    try:
        line = second.wait_for_line("restored world 'kept'")
        assert "at tick 6 (1000 proxies; 0 batches replayed from its journal)" in line, line
        assert "restored world 'still' at tick 0 (0 proxies; 0 batches replayed from its journal)" in \
            "".join(second.lines)
        with Client(second.target) as client:
            assert client.list_worlds() == ["kept", "still"]
            assert client.world("kept").info() == before
            assert client.world("still").info() == still
            assert_same_pairs(client.world("kept").pairs(), pairs)
            # The restored world goes on from its tick, in its incarnation.
            with pytest.raises(TickMismatch) as stale:
                client.world("kept").apply(move=gen.step(), expected_tick=5)
            assert (stale.value.tick, stale.value.incarnation) == (6, before.incarnation)
            assert client.world("kept").apply(move=gen.step(), expected_tick=6).incarnation == before.incarnation
        assert second.terminate() == 0
    finally:
        second.kill()
