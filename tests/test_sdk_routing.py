"""A client of several servers: every world lives on the one server its name hashes to (rendezvous
hashing), every call on it goes there and answers as a single server would, `list_worlds()` merges
them, and a server added moves only the worlds whose owner it becomes."""
from __future__ import annotations

import numpy as np
import pytest

from dbvt_client import Client, InvalidArgument
from dbvt_client.routing import owner
from servers import ServerThread
from worlds import W1World


@pytest.fixture(scope="module")
def three():
    servers = [ServerThread() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


def test_sixty_worlds_land_each_on_its_one_owner(three):
    targets = [server.target for server in three]
    names = [f"match-{i}" for i in range(60)]
    with Client(targets) as routed:
        for name in names:
            routed.create_world(name, dims=2)
        assert routed.list_worlds() == sorted(names)
        held = []
        for server in three:
            with Client(server.target) as direct:
                held.append(set(direct.list_worlds()))
        for name in names:
            routed.delete_world(name)
    assert all(10 <= len(worlds) <= 30 for worlds in held), [len(worlds) for worlds in held]
    assert set().union(*held) == set(names) and sum(map(len, held)) == len(names), "a world on two servers"
    for name in names:
        assert name in held[targets.index(owner(name, targets))]


def test_every_call_answers_as_a_single_server_would(three):
    scene = W1World(500, dims=3, seed=5)
    boxes = scene.boxes.astype(np.float32)
    queries = scene.query_boxes(20).astype(np.float32)
    with Client([server.target for server in three]) as routed, Client(three[0].target) as single:
        answers = []
        for client, name in ((routed, "routed-arena"), (single, "single-arena")):
            world = client.create_world(name)
            first = world.apply(create=(scene.ids, boxes))
            with world.stream() as stream:
                streamed = stream.apply(move=(scene.ids[:50], boxes[:50] + 0.5))
            answers.append((first.begun, streamed.ended, world.pairs(), world.query_aabb(queries).hits,
                            world.query_nearest(queries[:, :3], 4).hits, world.info().tick))
            client.delete_world(name)
    for routed_answer, single_answer in zip(*answers):
        np.testing.assert_array_equal(routed_answer, single_answer)


def test_an_added_server_takes_only_the_worlds_it_now_owns(three):
    names = [f"world-{i}" for i in range(200)]
    before = [server.target for server in three[:2]]
    after = [server.target for server in three]
    moved = [name for name in names if owner(name, before) != owner(name, after)]
    assert all(owner(name, after) == three[2].target for name in moved)
    assert 40 <= len(moved) <= 95, len(moved)                  # about a third


def test_an_overlap_of_worlds_on_two_servers_is_refused_by_name(three):
    targets = [server.target for server in three]
    first = "left-0"
    second = next(f"right-{i}" for i in range(100) if owner(f"right-{i}", targets) != owner(first, targets))
    with Client(targets) as routed:
        routed.create_world(first)
        routed.create_world(second)
        with pytest.raises(InvalidArgument, match="live on different servers"):
            routed.overlap(first, second)
        routed.delete_world(first)
        routed.delete_world(second)
