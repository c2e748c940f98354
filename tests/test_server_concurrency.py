"""Concurrent clients: on different worlds they do not interfere; on one world every batch and query is
serialized, so replaying the batches in tick order on the reference reproduces every answer."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from dbvt.reference import Broadphase as Reference
from dbvt_client import Client
from servers import ServerThread
from worlds import W1World, assert_same_csr, assert_same_pairs

WRITERS = 3
BATCHES = 15


@pytest.fixture(scope="module")
def server():
    running = ServerThread(workers=4)
    yield running
    running.stop()


def run_threads(target, count: int) -> None:
    errors: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            target(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    if errors:
        raise errors[0]


def test_clients_on_different_worlds(server):
    gens = [W1World(1000, seed=100 + i) for i in range(WRITERS)]
    results: dict[int, list] = {}

    def writer(index: int) -> None:
        gen = gens[index]
        with Client(server.target) as client:
            world = client.create_world(f"own-{index}")
            log = [world.apply(create=(gen.ids, gen.boxes))]
            with world.stream() as stream:
                log += [stream.apply(move=gen.step()) for _ in range(BATCHES)]
            results[index] = [log, world.pairs()]

    run_threads(writer, WRITERS)
    for index in range(WRITERS):
        replay = W1World(1000, seed=100 + index)
        reference = Reference()
        reference.create(replay.ids, replay.boxes)
        log, pairs = results[index]
        for tick, result in enumerate(log, start=1):
            if tick > 1:
                reference.move(*replay.step())
            begun, ended = reference.update()
            assert result.tick == tick
            assert_same_pairs(result.begun, begun, f"world {index} tick {tick} begun")
            assert_same_pairs(result.ended, ended, f"world {index} tick {tick} ended")
        assert_same_pairs(pairs, reference.pairs())


def test_clients_on_one_world(server):
    gen = W1World(1500, seed=7)
    probes = gen.query_boxes(50)
    with Client(server.target) as client:
        client.create_world("shared").apply(create=(gen.ids, gen.boxes))
    # Each writer moves its own third of the proxies, so every batch is valid whatever the order.
    rows = np.array_split(gen.rng.permutation(gen.n), WRITERS)
    batches: dict[int, tuple] = {}
    answers: list = []
    done = threading.Event()

    def writer(index: int) -> None:
        rng = np.random.default_rng(index)
        with Client(server.target) as client:
            world = client.world("shared")
            for _ in range(BATCHES):
                chosen = rng.choice(rows[index], 50, replace=False)
                ids = gen.ids[chosen]
                boxes = (gen.boxes[chosen] + rng.normal(scale=1.5, size=(50, 1))).astype(np.float32)
                result = world.apply(move=(ids, boxes))
                batches[result.tick] = (ids, boxes, result)

    def reader() -> None:
        with Client(server.target) as client:
            world = client.world("shared")
            while not done.is_set():
                answers.append(world.query_aabb(probes))

    reading = threading.Thread(target=reader)
    reading.start()
    try:
        run_threads(writer, WRITERS)
    finally:
        done.set()
        reading.join(60)
    assert sorted(batches) == list(range(2, 2 + WRITERS * BATCHES)), "every batch got its own tick"
    reference = Reference()
    reference.create(gen.ids, gen.boxes)
    reference.update()
    expected_answers = {1: reference.query_aabb(probes)}
    for tick in sorted(batches):
        ids, boxes, result = batches[tick]
        reference.move(ids, boxes)
        begun, ended = reference.update()
        assert_same_pairs(result.begun, begun, f"tick {tick} begun")
        assert_same_pairs(result.ended, ended, f"tick {tick} ended")
        expected_answers[tick] = reference.query_aabb(probes)
    assert answers, "the reader ran"
    for answer in answers:
        assert_same_csr(answer, expected_answers[answer.tick], f"query at tick {answer.tick}")
