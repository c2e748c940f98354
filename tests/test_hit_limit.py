"""A query call's hits are bounded: past --max-hits-per-call the call is refused before its answer
is built, and smaller calls go through."""
from __future__ import annotations

import numpy as np
import pytest

import dbvt
from dbvt_client import Client, ResourceExhausted
from servers import ServerThread

LIMIT = 5000
PILE = 1000


@pytest.fixture(scope="module")
def world():
    server = ServerThread(max_hits_per_call=LIMIT)
    with Client(server.target) as client:
        made = client.create_world("crowded")
        made.apply(create=(np.arange(PILE, dtype=np.uint64), np.tile([[0, 0, 0, 1, 1, 1]], (PILE, 1))))
        yield client, made
    server.stop()


def every_kind(world, count: int) -> dict:
    cube = [[1, 0, 0, 1], [-1, 0, 0, 2], [0, 1, 0, 1], [0, -1, 0, 2], [0, 0, 1, 1], [0, 0, -1, 2]]
    return {"aabb": lambda: world.query_aabb(np.tile([[-1, -1, -1, 2, 2, 2]], (count, 1))),
            "sphere": lambda: world.query_sphere(np.full((count, 3), 0.5), 3.0),
            "raycast": lambda: world.raycast(np.tile([[0.5, 0.5, -1, 0.5, 0.5, 2]], (count, 1))),
            "frustum": lambda: world.query_frustum(np.tile([cube], (count, 1, 1)))}


def test_a_call_past_the_hit_limit_is_refused_naming_it(world):
    client, crowded = world
    assert client.server_info()["max_hits_per_call"] == LIMIT
    for kind, ask in every_kind(crowded, LIMIT // PILE + 1).items():
        with pytest.raises(ResourceExhausted, match=f"hit more than {LIMIT} proxies.*--max-hits-per-call.*smaller"):
            ask()
    for kind, ask in every_kind(crowded, LIMIT // PILE).items():
        assert len(ask().hits) == LIMIT, kind


def test_the_core_stops_at_its_limit_and_has_none_by_default():
    tree = dbvt.Tree()
    tree.insert(np.arange(10, dtype=np.uint64), np.tile(np.float32([0, 0, 0, 1, 1, 1]), (10, 1)))
    assert tree.max_hits == -1 and len(tree.query_aabb(np.tile(np.float32([0, 0, 0, 1, 1, 1]), (100, 1)))[1]) == 1000
    tree.max_hits = 999
    with pytest.raises(dbvt.HitLimit, match="more than 999"):
        tree.query_aabb(np.tile(np.float32([0, 0, 0, 1, 1, 1]), (100, 1)))
