"""threads=: a batch of queries cut over several threads answers byte for byte as one thread does, and
an update whose stages find their changes on the threads steps as one thread does.

Each query kind runs on one W1-like world held by structures that differ only in `threads`, with
batches large enough to be cut (64 rows a thread and more), too small to be cut, empty, and cut into
runs of unequal length; a hit limit must fail the same calls, wherever in the batch it is passed.
The server's --threads-per-world reaches every world's core: created, restored and imported.
"""
from __future__ import annotations

import io
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dbvt
from dbvt import reference
from dbvt_client import Client
from servers import ServerProcess, ServerThread
from worlds import W1World, assert_same_csr

N = 4000
SIZES = [0, 1, 2, 63, 127, 128, 129, 200, 1001]
THREADS = [2, 3]


@pytest.fixture(scope="module", params=[3, 2], ids=["3d", "2d"])
def world(request):
    w = W1World(N, dims=request.param, seed=17)
    structures = {}
    for threads in [1, *THREADS]:
        tree = dbvt.Tree(dims=w.dims, margin=0.1, threads=threads)
        tree.insert(w.ids, w.boxes)
        broadphase = dbvt.Broadphase(dims=w.dims, threads=threads)
        # Alternating groups, so that masked queries leave out about half the proxies.
        broadphase.create(w.ids, w.boxes, group=np.where(np.arange(N) % 2 == 0, 1, 2).astype(np.uint32))
        broadphase.update()
        structures[threads] = (tree, broadphase)
    return w, structures


def batches(w: W1World, q: int) -> dict:
    """Every batched query, as a call on a structure, for q rows."""
    boxes = w.query_boxes(q, half=8.0)
    centers, radii = w.spheres(q)
    segments = w.segments(q)
    frusta = w.frusta(max(q, 1), far=30.0)[:q]
    points = w.rng.uniform(0.0, w.side, size=(q, w.dims)).astype(np.float32)
    moves = w.rng.normal(scale=10.0, size=(q, w.dims)).astype(np.float32)
    small = w.query_boxes(q, half=1.0)
    return {
        "query_aabb": lambda s: s.query_aabb(boxes),
        "query_sphere": lambda s: s.query_sphere(centers, radii),
        "raycast": lambda s: s.raycast(segments),
        "raycast first_hit": lambda s: s.raycast(segments, first_hit=True),
        "query_frustum": lambda s: s.query_frustum(frusta),
        "query_nearest": lambda s: s.query_nearest(points, 5),
        "query_nearest max_distance": lambda s: s.query_nearest(points, 50, max_distance=6.0),
        "cast_box": lambda s: s.cast_box(small, moves),
        "cast_box first_hit": lambda s: s.cast_box(small, moves, first_hit=True),
        "cast_sphere": lambda s: s.cast_sphere(centers, radii / 4, moves),
        "cast_sphere first_hit": lambda s: s.cast_sphere(centers, radii / 4, moves, first_hit=True),
    }


def masked_batches(w: W1World, q: int) -> dict:
    """The Broadphase's own arguments: a mask, so that the proxies' groups filter."""
    boxes = w.query_boxes(q, half=8.0)
    segments = w.segments(q)
    points = w.rng.uniform(0.0, w.side, size=(q, w.dims)).astype(np.float32)
    return {
        "query_aabb mask": lambda s: s.query_aabb(boxes, mask=2),
        "raycast mask": lambda s: s.raycast(segments, mask=1),
        "query_nearest mask": lambda s: s.query_nearest(points, 3, mask=2),
    }


@pytest.mark.parametrize("q", SIZES)
def test_every_query_kind_answers_as_one_thread(world, q):
    w, structures = world
    calls = batches(w, q)
    for index, kind in enumerate(["tree", "broadphase"]):
        expected = {name: call(structures[1][index]) for name, call in calls.items()}
        if q >= 128:
            assert len(expected["query_aabb"][1]) > q, "the batch should hit something"
        for threads in THREADS:
            for name, call in calls.items():
                assert_same_csr(call(structures[threads][index]), expected[name], f"{kind} {name} threads={threads}")


@pytest.mark.parametrize("q", [0, 100, 1001])
def test_masked_broadphase_queries_answer_as_one_thread(world, q):
    w, structures = world
    for name, call in masked_batches(w, q).items():
        expected = call(structures[1][1])
        for threads in THREADS:
            assert_same_csr(call(structures[threads][1]), expected, f"{name} threads={threads}")


def test_a_hit_limit_fails_the_same_calls(world):
    """The serial loop fails exactly when the hits of the whole batch pass max_hits; cut over threads,
    the batch must fail then too, whether one run alone passes it or only the runs' sum does."""
    w, structures = world
    boxes = w.query_boxes(1000, half=6.0)
    total = len(structures[1][0].query_aabb(boxes)[1])
    first_run = len(structures[1][0].query_aabb(boxes[:500])[1])
    # Passed by the whole batch only; by its first run alone; exactly reached; one below; none at all.
    limits = [total - 1, first_run - 1, total, total + 1, 0, -1]
    for limit in limits:
        outcomes = []
        for threads in [1, *THREADS]:
            tree = structures[threads][0]
            tree.max_hits = limit
            try:
                outcomes.append(tree.query_aabb(boxes))
            except dbvt.HitLimit as exc:
                outcomes.append(str(exc))
            finally:
                tree.max_hits = -1
        fails = limit >= 0 and total > limit
        for got in outcomes[1:]:
            if fails:
                assert got == outcomes[0] == f"the queries hit more than {limit} proxies (max_hits)"
            else:
                assert_same_csr(got, outcomes[0], f"max_hits={limit}")


def test_a_hit_limit_passed_within_one_chunk(world):
    """All the hits in a few rows in the middle of the batch: one chunk alone passes the limit, the
    chunks before it hold nothing, and those after it nothing either."""
    w, structures = world
    far = np.tile(np.float32([-100] * w.dims + [-99] * w.dims), (1000, 1))
    boxes = far.copy()
    boxes[600:603] = np.float32([0] * w.dims + [w.side] * w.dims)
    for threads in [1, *THREADS]:
        tree = structures[threads][0]
        for limit, fails in ((N - 1, True), (3 * N - 1, True), (3 * N, False)):
            tree.max_hits = limit
            try:
                if fails:
                    with pytest.raises(dbvt.HitLimit, match=f"more than {limit} proxies"):
                        tree.query_aabb(boxes)
                else:
                    offsets, hits = tree.query_aabb(boxes)
                    assert len(hits) == 3 * N and offsets[600] == 0 and offsets[603] == 3 * N
            finally:
                tree.max_hits = -1


def test_a_hit_limit_counts_nearest_and_casts_too(world):
    w, structures = world
    points = w.rng.uniform(0.0, w.side, size=(600, w.dims)).astype(np.float32)
    moves = w.rng.normal(scale=10.0, size=(600, w.dims)).astype(np.float32)
    boxes = w.query_boxes(600, half=1.0)
    calls = [lambda s: s.query_nearest(points, 4), lambda s: s.cast_box(boxes, moves)]
    for call in calls:
        total = len(call(structures[1][1])[1])
        for limit in (total - 1, total):
            for threads in THREADS:
                broadphase = structures[threads][1]
                broadphase.max_hits = limit
                try:
                    if limit < total:
                        with pytest.raises(dbvt.HitLimit):
                            call(broadphase)
                    else:
                        assert len(call(broadphase)[1]) == total
                finally:
                    broadphase.max_hits = -1


@pytest.mark.parametrize("make", [dbvt.Tree, dbvt.Broadphase])
@pytest.mark.parametrize("bad", [0, -1, 1.0, 2.5, "2", True, None, 1025, math.inf])
def test_threads_must_be_a_small_positive_int(make, bad):
    with pytest.raises(ValueError, match=r"threads must be an int from 1 to 1024, not "):
        make(threads=bad)
    with pytest.raises(ValueError, match="threads must be"):
        make.from_bytes(make().to_bytes(), threads=bad)


@pytest.mark.parametrize("make", [dbvt.Tree, dbvt.Broadphase])
def test_threads_is_a_read_only_runtime_setting(make):
    structure = make(threads=np.int64(3))
    assert structure.threads == 3 and type(structure.threads) is int
    assert make().threads == 1
    with pytest.raises(AttributeError):
        structure.threads = 2
    # Not state: neither the bytes nor a pickle keep it; from_bytes takes it anew.
    assert make.from_bytes(structure.to_bytes()).threads == 1
    assert make.from_bytes(structure.to_bytes(), threads=2).threads == 2
    assert pickle.loads(pickle.dumps(structure)).threads == 1
    assert structure.to_bytes() == make().to_bytes()


def random_boxes(rng, n, dims, side, grid):
    """n boxes in a cube of `side`; on a grid of halves when `grid`, where touching faces and ties are common."""
    lows = rng.uniform(-side, side, size=(n, dims))
    sides = rng.uniform(0.0, side / 4, size=(n, dims)) * (rng.random((n, 1)) < 0.9)
    if grid:
        lows, sides = np.round(lows * 2) / 2, np.round(sides * 2) / 2
    return np.concatenate([lows, lows + sides], axis=1).astype(np.float32)


# The rows are drawn by numpy from a seed that hypothesis picks, beside the sizes and the shape of the
# world: hypothesis drawing hundreds of rows one float at a time is slow and shrinks no better.
@settings(max_examples=60, deadline=None)
@given(dims=st.sampled_from([2, 3]), n=st.integers(0, 400), q=st.integers(0, 400), seed=st.integers(0, 2**32 - 1),
       side=st.sampled_from([5.0, 40.0, 400.0]), grid=st.booleans())
def test_random_worlds_and_batches_answer_as_one_thread(dims, n, q, seed, side, grid):
    rng = np.random.default_rng(seed)
    boxes, queries = random_boxes(rng, n, dims, side, grid), random_boxes(rng, q, dims, side, grid)
    moves = rng.normal(scale=side / 4, size=(q, dims)).astype(np.float32)
    centers = queries[:, :dims]
    radii = (queries[:, dims] - queries[:, 0]).astype(np.float32)
    serial, split = dbvt.Tree(dims=dims), dbvt.Tree(dims=dims, threads=2)
    ids = rng.permutation(np.arange(n, dtype=np.uint64) * 7919)
    for tree in (serial, split):
        tree.insert(ids, boxes)
    calls = {
        "query_aabb": lambda t: t.query_aabb(queries),
        "query_sphere": lambda t: t.query_sphere(centers, radii),
        "raycast": lambda t: t.raycast(queries),
        "query_nearest": lambda t: t.query_nearest(centers, 3),
        "cast_box": lambda t: t.cast_box(queries, moves, first_hit=True),
        "cast_sphere": lambda t: t.cast_sphere(centers, radii, moves),
    }
    for name, call in calls.items():
        assert_same_csr(call(split), call(serial), name)


def server_answers(client: Client, name: str, w: W1World, q: int) -> dict:
    """Every query kind of the SDK on the world `name`, q rows each, from the world's own generator."""
    world = client.world(name)
    boxes = w.query_boxes(q, half=8.0)
    centers, radii = w.spheres(q)
    segments = w.segments(q)
    frusta = w.frusta(q, far=30.0)
    moves = w.rng.normal(scale=10.0, size=(q, w.dims)).astype(np.float32)
    return {
        "query_aabb": world.query_aabb(boxes),
        "query_sphere": world.query_sphere(centers, radii),
        "raycast": world.raycast(segments),
        "query_frustum": world.query_frustum(frusta, mask=2),
        "query_nearest": world.query_nearest(centers, 4),
        "cast_box": world.cast_box(w.query_boxes(q, half=1.0), moves, first_hit=True),
        "cast_sphere": world.cast_sphere(centers, radii / 4, moves),
    }


def test_a_server_with_threads_per_world_answers_as_one_thread(tmp_path):
    """Worlds created, restored from the data directory and imported, on a server cut over 2 threads a
    world, answer every query kind as one in-process Broadphase does."""
    w = W1World(N, seed=23)
    groups = np.where(np.arange(N) % 3 == 0, 1, 2).astype(np.uint32)
    local = Client.local()
    local.create_world("serial").apply(create=(w.ids, w.boxes), group=groups)
    seed = w.rng.bit_generator.state

    def expected():
        w.rng.bit_generator.state = seed
        return server_answers(local, "serial", w, 1000)

    def check(client, name):
        w.rng.bit_generator.state = seed
        for kind, got in server_answers(client, name, w, 1000).items():
            assert_same_csr(tuple(got), tuple(answers[kind]), f"{name} {kind}")

    answers = expected()
    server = ServerProcess("--threads-per-world", "2", "--data-dir", str(tmp_path))
    try:
        assert "threads_per_world=2" in server.wait_for_line("listening on")
        with Client(server.target) as client:
            client.create_world("created").apply(create=(w.ids, w.boxes), group=groups)
            check(client, "created")
            image = io.BytesIO()
            client.world("created").export(image)
            image.seek(0)
            client.import_world("imported", image)
            check(client, "imported")
    finally:
        server.terminate()
    server = ServerProcess("--threads-per-world", "2", "--data-dir", str(tmp_path))
    try:
        with Client(server.target) as client:
            check(client, "created")
    finally:
        server.terminate()


def test_every_world_of_a_server_gets_its_threads(tmp_path):
    """The setting reaches the core of a world created, imported and restored (the last two are decoded
    from an image, which does not hold it)."""
    def threads_of(server):
        return {world.name: world.broadphase.threads for world in server.running.servicer.service.worlds()}

    server = ServerThread(threads_per_world=3, data_dir=str(tmp_path))
    try:
        with Client(server.target) as client:
            client.create_world("created").apply(create=([1, 2], [[0, 0, 0, 1, 1, 1], [1, 1, 1, 2, 2, 2]]))
            image = io.BytesIO()
            client.world("created").export(image)
            image.seek(0)
            client.import_world("imported", image)
        assert threads_of(server) == {"created": 3, "imported": 3}
    finally:
        server.stop()
    server = ServerThread(threads_per_world=2, data_dir=str(tmp_path))
    try:
        assert threads_of(server) == {"created": 2, "imported": 2}
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["Tree", "Broadphase"])
def test_the_reference_takes_threads_as_the_core_does(kind):
    made = getattr(reference, kind)(threads=3)
    assert made.threads == 3 and getattr(reference, kind).from_bytes(made.to_bytes(), threads=2).threads == 2
    with pytest.raises(ValueError, match="threads"):
        getattr(reference, kind)(threads=0)


@pytest.mark.parametrize("layout", ["w1", "one spot", "a line"])
@pytest.mark.parametrize("make", [dbvt.Tree, dbvt.Broadphase])
def test_a_bulk_build_and_a_rebuild_on_threads_make_the_same_tree(make, layout):
    n = 20_000                                   # past the size from which a build splits over threads
    world = W1World(n, 3, seed=11)
    boxes = world.boxes.astype(np.float32)
    if layout == "one spot":
        boxes[:] = boxes[0]
    elif layout == "a line":
        boxes[:, [1, 2, 4, 5]] = boxes[0, [1, 2, 4, 5]]
    built = {}
    for threads in (1, 2, 3):
        structure = make(threads=threads)
        structure.insert(world.ids, boxes) if make is dbvt.Tree else structure.create(world.ids, boxes)
        structure.validate()
        first = structure.to_bytes()
        structure.rebuild()
        built[threads] = (first, structure.to_bytes())
    assert built[2] == built[1] and built[3] == built[1]


@pytest.mark.parametrize("make", [dbvt.Tree, dbvt.Broadphase])
def test_large_batches_grow_the_pools_and_check_ids_on_threads_as_one_thread(make):
    """From 65,536 rows the pools are set up, and the new ids checked, on the threads: the bytes are
    the same, and a bad row is the first one a single pass finds, with the structure unchanged."""
    n = 70_000
    world = W1World(n, 3, seed=12)
    first_half, second_half = slice(0, 1000), slice(1000, n)
    built = {}
    for threads in (1, 2, 3):
        structure = make(threads=threads)
        add = structure.insert if make is dbvt.Tree else structure.create
        add(world.ids[first_half], world.boxes[first_half])
        before = structure.to_bytes()
        ids = world.ids[second_half].copy()
        ids[[5_000, 60_000]] = ids[[4_000, 50_000]]          # rows 5,000 and 60,000 repeat earlier ones
        with pytest.raises(ValueError, match="row 5000: id .* appears twice"):
            add(ids, world.boxes[second_half])
        ids[[30_000, 50_000]] = world.ids[[10, 20]]           # row 30,000 is present already
        with pytest.raises(ValueError, match="row 5000: id .* appears twice"):
            add(ids, world.boxes[second_half])
        ids[5_000] = world.ids[1000 + 5_000]
        with pytest.raises(ValueError, match="row 30000: id .* is already present"):
            add(ids, world.boxes[second_half])
        assert structure.to_bytes() == before
        add(world.ids[second_half], world.boxes[second_half])
        empty = make(threads=threads)
        (empty.insert if make is dbvt.Tree else empty.create)(world.ids, world.boxes)
        structure.validate()
        empty.validate()
        built[threads] = (structure.to_bytes(), empty.to_bytes())
    assert built[2] == built[1] and built[3] == built[1]


@pytest.mark.parametrize("sensors", [True, False], ids=["sensors", "no-sensors"])
@pytest.mark.parametrize("dense", [False, True], ids=["w1", "w2"])
def test_a_broadphase_on_threads_steps_as_one_thread(dense, sensors):
    """Both stages of an update run on the threads (finding the partners of proxies with new fat boxes,
    then the pairs that flip; without sensors, the threads change the lists too): every update's
    pairs and sensor events, and the partner lists they leave, are those of one thread. Between
    steps some proxies are destroyed and created again, in slots that other proxies had, and some
    are static or filtered out by group and mask."""
    from dbvt_server.bench.workload import make_w2

    if dense:
        work = make_w2(3000, 6, dims=2, seed=5)
        ids, boxes, dims = work.ids, work.boxes, 2
        steps = [(work.move_ids[s], work.move_boxes[s]) for s in range(6)]
    else:
        world = W1World(6000, 3, seed=23, moving_fraction=0.3)      # 1,800 moves: enough to cut
        ids, boxes, dims = world.ids, world.boxes, 3
        steps = [world.step() for _ in range(6)]
    rng = np.random.default_rng(9)
    centres = rng.uniform(boxes[:, :dims].min(0), boxes[:, dims:].max(0), size=(40, dims))
    sensor_boxes = np.concatenate([centres - 6, centres + 6], axis=1).astype(np.float32)
    sensor_ids = np.arange(10**9, 10**9 + (40 if sensors else 0), dtype=np.uint64)
    sensor_boxes = sensor_boxes[:len(sensor_ids)]
    kinds = np.where(np.arange(len(sensor_ids)) % 2, 1, 2).astype(np.uint8)
    static = np.arange(len(ids)) % 7 == 0
    group = np.where(np.arange(len(ids)) % 5 == 0, 2, 1).astype(np.uint32)
    mask = np.where(np.arange(len(ids)) % 11 == 0, 1, 0xFFFFFFFF).astype(np.uint32)
    worlds = [dbvt.Broadphase(dims=dims, sensor_margin=0.5, threads=threads) for threads in (1, 2, 3)]
    for bp in worlds:
        bp.create(ids, boxes, static=static, group=group, mask=mask)
        bp.create(sensor_ids, sensor_boxes, sensor=kinds)
    current = boxes.copy()
    by_id = np.argsort(ids)
    for step, (moved_ids, moved_boxes) in enumerate([(ids[:0], boxes[:0]), *steps]):     # at first all are new
        still = step % 2 == 0        # the moved proxies re-test standing sensors themselves
        if not still:
            sensor_boxes += np.float32(0.7)
        current[by_id[np.searchsorted(ids[by_id], moved_ids)]] = moved_boxes
        reborn = rng.choice(len(ids), 40, replace=False)
        answers = []
        for bp in worlds:
            bp.move(moved_ids, moved_boxes)
            bp.move(sensor_ids[:0] if still else sensor_ids, sensor_boxes[:0] if still else sensor_boxes)
            if step:
                bp.destroy(ids[reborn])
                bp.create(ids[reborn][::-1], current[reborn][::-1], static=static[reborn][::-1],
                          group=group[reborn][::-1], mask=mask[reborn][::-1])
            answers.append([*bp.update(), *bp.sensor_events(), bp.pair_count])
        for answer in answers[1:]:
            for got, expected in zip(answer, answers[0]):
                np.testing.assert_array_equal(got, expected)
        assert worlds[1].to_bytes() == worlds[0].to_bytes() == worlds[2].to_bytes()
    worlds[1].validate()
    expected = reference.Broadphase(dims=dims)
    expected.create(ids, current, static=static, group=group, mask=mask)
    np.testing.assert_array_equal(worlds[2].pairs(), expected.update()[0])


@pytest.mark.parametrize("threads", [2, 3])
def test_a_fat_pair_limit_stops_an_update_on_threads_with_the_lists_agreeing(threads):
    """Under max_fat_pairs the threads count what the lists gain as they merge, and stop soon past the
    limit: the proxies merged keep their new lists, the others their flag for the next update, and
    every list agrees with its partners' (validate() checks both sides and the counts). Undoing the
    batch and updating again gives the pairs from before, as on one thread. Where the threads stop
    depends on their timing, so the stop is tried on several worlds."""
    for seed in range(8):
        world = W1World(6000, 3, seed=seed)
        ids, boxes = world.ids, world.boxes.astype(np.float32)
        rng = np.random.default_rng(seed)
        piled = rng.choice(len(ids), 3000, replace=False)
        pile = boxes[piled].copy()
        pile[:, :3] = rng.uniform(0, 12, (3000, 3))
        pile[:, 3:] = pile[:, :3] + 2
        for count in (1, threads) if seed == 0 else (threads,):
            structure = dbvt.Broadphase(dims=3, threads=count)
            structure.create(ids, boxes)
            structure.update()
            before = structure.pairs()
            structure.move(ids[piled], pile)
            with pytest.raises(dbvt.FatPairLimit):
                structure.update(max_fat_pairs=20_000)
            structure.validate()
            assert structure.stats()["fat_pairs"] < 20_000 + count * 3000     # a few lists past it
            structure.move(ids[piled], boxes[piled])
            structure.update()
            structure.validate()
            np.testing.assert_array_equal(structure.pairs(), before)


def test_a_server_with_threads_per_world_steps_as_one_thread():
    """Batches that move thousands of proxies (and sensors, standing or moving) through a server cut over
    2 threads a world give the pairs and sensor events of one thread in process, tick by tick."""
    w = W1World(6000, seed=31, moving_fraction=0.3)
    sensor_ids = np.arange(10**9, 10**9 + 30, dtype=np.uint64)
    centres = np.random.default_rng(4).uniform(0, w.side, size=(30, 3))
    local = Client.local()
    server = ServerThread(threads_per_world=2)
    try:
        with Client(server.target) as client:
            worlds = [local.create_world("serial"), client.create_world("threaded")]
            for world in worlds:
                world.apply(create=(w.ids, w.boxes))
                world.apply(create=(sensor_ids, np.concatenate([centres - 8, centres + 8], 1).astype(np.float32)),
                            sensor="sphere")
            for step in range(6):
                ids, boxes = w.step()
                if step % 2:
                    centres += 0.6
                sensors = np.concatenate([centres - 8, centres + 8], 1).astype(np.float32)
                results = [world.apply(move=(np.concatenate([ids, sensor_ids]), np.concatenate([boxes, sensors]))
                                       if step % 2 else (ids, boxes)) for world in worlds]
                for field in ("begun", "ended", "entered", "left"):
                    np.testing.assert_array_equal(getattr(results[1], field), getattr(results[0], field), field)
                assert len(results[0].begun) + len(results[0].ended) > 0
    finally:
        server.stop()


def _unmix(mixed: int) -> int:
    """The id whose splitmix64 finaliser (the id table's hash, _core.pxd's mix64) is `mixed`."""
    def unshift(y: int, s: int) -> int:
        x = y
        for _ in range(64 // s + 1):
            x = y ^ (x >> s)
        return x
    y = unshift(mixed, 31)
    y = y * pow(0x94D049BB133111EB, -1, 2**64) % 2**64
    y = unshift(y, 27)
    y = y * pow(0xBF58476D1CE4E5B9, -1, 2**64) % 2**64
    return unshift(y, 30)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_id_table_filled_by_regions_finds_every_proxy(threads):
    """A bulk build fills the id table region by region (65,536 slots each), leaving the probes that
    run past a region's end for a last pass: ids made to crowd a region's last slot and the table's
    last slot (whose probes wrap to slot 0) are found, removed and found again like any other."""
    n, table = 100_000, 262_144                  # the table holds at least twice the proxies
    rng = np.random.default_rng(21)
    crowded = [_unmix((int(rng.integers(1, 2**40)) << 18) | home)
               for home in [65_535] * 40 + [65_530] * 10 + [table - 1] * 40 + [table - 3] * 10]
    others = np.setdiff1d(rng.choice(2**40, n, replace=False).astype(np.uint64), np.array(crowded, np.uint64))
    ids = np.unique(np.concatenate([np.array(crowded, np.uint64), others[: n - len(crowded)]]))
    assert len(ids) == n
    boxes = np.hstack([rng.uniform(0, 1000, (len(ids), 3)), np.zeros((len(ids), 3))]).astype(np.float32)
    boxes[:, 3:] = boxes[:, :3] + 1
    tree = dbvt.Tree(threads=threads)
    tree.insert(ids, boxes)
    tree.validate()
    assert all(i in tree for i in crowded)
    assert np.array_equal(tree.get(ids), boxes)
    tree.remove(np.array(crowded[::2], np.uint64))
    tree.validate()
    assert np.array_equal(tree.get(np.array(crowded[1::2], np.uint64)), boxes[np.searchsorted(ids, crowded[1::2])])
    assert not any(i in tree for i in crowded[::2])
    loaded = dbvt.Tree.from_bytes(tree.to_bytes(), threads=threads)   # a load fills its table by regions too
    loaded.validate()
    assert all(i in loaded for i in crowded[1::2]) and len(loaded) == len(ids) - len(crowded[::2])


@pytest.mark.parametrize("make", [dbvt.Tree, dbvt.Broadphase])
def test_a_large_batch_names_its_first_bad_box_on_threads_as_one_thread(make):
    """From 65,536 rows the boxes are checked on the threads: a NaN anywhere is named before an
    inverted row anywhere, the first of each kind, and nothing is added."""
    n = 300_000
    rng = np.random.default_rng(22)
    low = rng.uniform(0, 1000, (n, 3))
    boxes = np.hstack([low, low + 1]).astype(np.float32)
    ids = np.arange(1, n + 1, dtype=np.uint64)
    bad = boxes.copy()
    bad[[10, 200_000], 1] = 2000.0                          # min > max on axis 1
    bad[[290_000, 299_999], 5] = np.nan
    for threads in (1, 2, 3):
        structure = make(threads=threads)
        add = structure.insert if make is dbvt.Tree else structure.create
        with pytest.raises(ValueError, match=r"boxes row 290000: NaN or infinite"):
            add(ids, bad)
        without_nan = bad.copy()
        without_nan[[290_000, 299_999], 5] = boxes[[290_000, 299_999], 5]
        with pytest.raises(ValueError, match=r"boxes row 10: min > max on axis 1"):
            add(ids, without_nan)
        without_nan[10] = boxes[10]
        with pytest.raises(ValueError, match=r"boxes row 200000: min > max on axis 1"):
            add(ids, without_nan)
        assert len(structure) == 0
        add(ids, boxes)
        assert len(structure) == n


@pytest.mark.parametrize("make", [dbvt.Tree, dbvt.Broadphase])
def test_large_batches_look_up_their_ids_on_threads_as_one_thread(make):
    """From 65,536 rows a batch's ids are looked up on the threads: an unknown or repeated id is named
    at the first bad row, the structure unchanged, and a good batch moves and removes as on one."""
    n = 80_000
    world = W1World(n, 3, seed=23)
    rng = np.random.default_rng(23)
    moved = world.boxes + rng.uniform(-2, 2, (n, 1)).astype(np.float32)
    built = {}
    for threads in (1, 2, 3):
        structure = make(threads=threads)
        (structure.insert if make is dbvt.Tree else structure.create)(world.ids, world.boxes)
        move = structure.update if make is dbvt.Tree else structure.move
        before = structure.to_bytes()
        ids = world.ids.copy()
        ids[[70_000, 79_000]] = ids[[10, 40_000]]            # rows 70,000 and 79,000 repeat earlier ones
        with pytest.raises(ValueError, match="row 70000: id .* appears twice"):
            move(ids, moved)
        ids[50_000] = 2**63                                  # and row 50,000 is unknown
        with pytest.raises(KeyError, match="row 50000: unknown id"):
            move(ids, moved)
        with pytest.raises(KeyError, match="row 50000: unknown id"):
            structure.remove(ids) if make is dbvt.Tree else structure.destroy(ids)
        assert structure.to_bytes() == before
        move(world.ids[::-1].copy(), moved[::-1].copy())
        structure.validate()
        structure.remove(world.ids[::2]) if make is dbvt.Tree else structure.destroy(world.ids[::2])
        structure.validate()
        built[threads] = structure.to_bytes()
    assert built[2] == built[1] and built[3] == built[1]


@pytest.mark.parametrize("dims", [3, 2])
def test_a_large_batch_of_moves_edits_subtrees_on_threads_as_one_thread(dims):
    """From 65,536 moves (and no sensors) the tree's subtrees are edited on the threads, the moves
    that reach above their subtree made last: on 1, 2 and 3 threads the trees are the same byte for
    byte, every step's pairs are the reference's, `previous` gets the old boxes, and the tree stays
    valid and shallow. Some proxies jump across the world, so that some edits must wait."""
    n = 70_000
    world = W1World(n, dims, seed=31)
    rng = np.random.default_rng(31)
    oracle = reference.Broadphase(dims=dims)
    worlds = [dbvt.Broadphase(dims=dims, threads=threads) for threads in (1, 2, 3)]
    boxes = world.boxes.astype(np.float32)
    for structure in (oracle, *worlds):
        structure.create(world.ids, boxes)
        structure.update()
    side = float(boxes[:, dims:].max())
    for step in range(4):
        old = boxes
        boxes = boxes + rng.normal(0, 1.5, (n, 1)).astype(np.float32)
        jumpers = rng.choice(n, 300, replace=False)
        boxes[jumpers] += rng.uniform(-side, side, (300, 1)).astype(np.float32)
        order = rng.permutation(n)
        expected = oracle.move(world.ids[order], boxes[order]), oracle.update()
        previous = []
        for structure in worlds:
            before = np.empty((n, 2 * dims), np.float32)
            left = structure.move(world.ids[order], boxes[order], previous=before)
            begun, ended = structure.update()[:2]
            np.testing.assert_array_equal(begun, expected[1][0])
            np.testing.assert_array_equal(ended, expected[1][1])
            previous.append((left, before))
        assert worlds[0].to_bytes() == worlds[1].to_bytes() == worlds[2].to_bytes()
        for left, before in previous:
            assert left == previous[0][0]
            np.testing.assert_array_equal(before, old[order])
        worlds[0].validate()
        assert worlds[0].stats()["height"] <= 2 * math.log2(n)


@pytest.mark.parametrize("sensors", [False, True], ids=["no-sensors", "sensors"])
def test_both_stages_picked_at_once_on_threads_as_one_thread(sensors):
    """From 32,768 moved proxies the threads pick both stages' proxies in one pass over their flags,
    each its own run of the moved, sorted: a slot listed twice (a proxy destroyed, and a new one
    created in its slot) is taken once, a destroyed proxy not at all, one that stayed in its fat box
    only by stage 2, and moving sensors by stage 1 after the other proxies, never by stage 2.
    Updates, sensor events, lists and trees are one thread's, and the pairs the reference's."""
    n = 40_000
    world = W1World(n, 3, seed=37)
    rng = np.random.default_rng(37)
    boxes = world.boxes.astype(np.float32)
    ids = world.ids.copy()
    centres = rng.uniform(boxes[:, :3].min(0), boxes[:, 3:].max(0), size=(30 if sensors else 0, 3))
    sensor_ids = np.arange(2 * 10**12, 2 * 10**12 + len(centres), dtype=np.uint64)
    oracle = reference.Broadphase(dims=3)
    worlds = [dbvt.Broadphase(dims=3, threads=threads) for threads in (1, 2, 3)]
    for structure in (oracle, *worlds):
        structure.create(ids, boxes)
        structure.create(sensor_ids, np.hstack([centres - 8, centres + 8]).astype(np.float32), sensor="sphere")
        structure.update()
    for step in range(3):
        boxes = boxes + rng.normal(0, 0.05 if step % 2 else 1.5, (n, 1)).astype(np.float32)
        centres = centres + rng.normal(0, 2.0, centres.shape)
        gone = rng.choice(n, 400, replace=False)
        new_ids = np.arange(10**9 + 400 * step, 10**9 + 400 * (step + 1), dtype=np.uint64)
        answers = []
        for structure in (oracle, *worlds):
            structure.move(ids, boxes)
            structure.move(sensor_ids, np.hstack([centres - 8, centres + 8]).astype(np.float32))
            structure.destroy(ids[gone[:200]])          # moved, then destroyed: no stage takes them
            structure.destroy(ids[gone[200:]])
            structure.create(new_ids[:200], boxes[gone[200:]])     # new ones in moved proxies' slots
            answers.append([*structure.update()[:2], *structure.sensor_events()])
        for got in answers[1:]:
            for rows, expected in zip(got, answers[0]):
                np.testing.assert_array_equal(rows, expected)
        ids[gone[200:]] = new_ids[:200]
        for structure in (oracle, *worlds):
            structure.create(ids[gone[:200]] + np.uint64(10**12), boxes[gone[:200]])
            structure.update()
        ids[gone[:200]] += np.uint64(10**12)
        assert worlds[0].to_bytes() == worlds[1].to_bytes() == worlds[2].to_bytes()
    worlds[2].validate()
    np.testing.assert_array_equal(worlds[2].pairs(), oracle.pairs())
    np.testing.assert_array_equal(worlds[2].sensor_pairs(), oracle.sensor_pairs())


def test_a_large_batch_moving_a_fraction_of_the_world_labels_subtrees_by_climbing_as_one_thread():
    """When fewer than a quarter of the proxies move (here 68,000 of 280,000), the threads find each
    moved leaf's subtree by climbing from it rather than labelling every leaf from the top down: the
    trees and pairs must still be one thread's."""
    n, moving = 280_000, 68_000
    world = W1World(n, 3, seed=33)
    rng = np.random.default_rng(33)
    boxes = world.boxes.astype(np.float32)
    worlds = [dbvt.Broadphase(dims=3, threads=threads) for threads in (1, 2)]
    for structure in worlds:
        structure.create(world.ids, boxes)
        structure.update()
    for step in range(2):
        rows = rng.choice(n, moving, replace=False)
        boxes[rows] += rng.normal(0, 1.5, (moving, 1)).astype(np.float32)
        answers = []
        for structure in worlds:
            structure.move(world.ids[rows], boxes[rows])
            answers.append(structure.update()[:2])
        for got, expected in zip(answers[1], answers[0]):
            np.testing.assert_array_equal(got, expected)
        assert worlds[0].to_bytes() == worlds[1].to_bytes()
    worlds[1].validate()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dims", [3, 2])
def test_a_large_batch_of_moves_refits_the_nodes_above_the_subtrees(dims, threads):
    """The subtrees' edits stop at their roots, and the nodes above them are refitted after: when the
    outermost proxy steps inward, and nothing else moves, every box up to the root shrinks with it
    (validate() requires each node's box to be exactly its children's union)."""
    n = 70_000
    rng = np.random.default_rng(32)
    low = rng.uniform(0, 1000, (n, dims))
    boxes = np.hstack([low, low + 1]).astype(np.float32)
    ids = np.arange(1, n + 1, dtype=np.uint64)
    for axis in range(dims):
        for outermost, step in ((int(np.argmin(boxes[:, axis])), 0.5), (int(np.argmax(boxes[:, dims + axis])), -0.5)):
            structure = dbvt.Broadphase(dims=dims, threads=threads)
            structure.create(ids, boxes)
            structure.update()
            moved = boxes.copy()
            moved[outermost, [axis, dims + axis]] += step
            assert structure.move(ids, moved) == 1
            structure.validate()


def _step_and_query(threads: int, seed: int) -> list:
    """A dense world's steps and a batch of box queries on `threads` threads: every answer, in order."""
    from dbvt_server.bench.workload import make_w2

    work = make_w2(3000, 4, dims=2, seed=seed)
    structure = dbvt.Broadphase(dims=2, threads=threads)
    structure.create(work.ids, work.boxes)
    answers = [*structure.update()]
    for step in range(work.steps):
        structure.move(work.move_ids[step], work.move_boxes[step])
        answers.extend(structure.update())
    boxes = np.repeat(work.boxes[:400], 2, axis=0)
    answers.extend(structure.query_aabb(boxes))
    return answers


def test_worlds_on_several_python_threads_share_the_pooled_workers_and_answer_as_one_thread():
    """The workers are pooled: calls on different threads, each cut over workers, take different ones
    (a worker given two parts at once would lose one, or run one twice)."""
    from concurrent.futures import ThreadPoolExecutor

    seeds = range(6)
    expected = [_step_and_query(1, seed) for seed in seeds]
    for _ in range(3):
        with ThreadPoolExecutor(max_workers=len(seeds)) as callers:
            got = list(callers.map(lambda seed: _step_and_query(3, seed), seeds))
        for answers, wanted in zip(got, expected):
            for a, b in zip(answers, wanted, strict=True):
                np.testing.assert_array_equal(a, b)


def _child_answers(threads: int, out) -> None:
    out.send(_step_and_query(threads, 3))
    out.close()


# From Python 3.12 a fork in a process with other threads warns; the pool's threads are the point here.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_starts_its_own_workers():
    """The pooled workers' threads are not copied into a forked child: it must start its own, not wait
    for workers the parent had (the child would hang)."""
    import multiprocessing

    expected = _step_and_query(2, 3)        # the parent's pool has workers now
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child_answers, args=(2, sender))
    child.start()
    sender.close()
    try:
        assert receiver.poll(120), "the forked child gave no answer: it waits for its parent's workers"
        got = receiver.recv()
        child.join(30)
        assert child.exitcode == 0
    finally:
        child.kill()
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
