"""A W1-like world of 10k proxies streamed through a real server: every step's begun/ended, accumulated,
is the brute-force pair set, and every query kind answers exactly as dbvt.reference."""
from __future__ import annotations

import numpy as np
import pytest

from dbvt.reference import Broadphase as Reference
from dbvt_client import Client
from servers import ServerThread
from worlds import W1World, assert_same_csr, assert_same_pairs

STEPS = 8


def _apply_changes(pairs: set, result) -> None:
    ended = set(map(tuple, result.ended.tolist()))
    begun = set(map(tuple, result.begun.tolist()))
    assert ended <= pairs, "a pair ended that had not begun"
    assert not begun & (pairs - ended), "a pair began twice"
    pairs -= ended
    pairs |= begun


@pytest.fixture(scope="module")
def server():
    running = ServerThread()
    yield running
    running.stop()


@pytest.mark.parametrize("dims", [3, 2])
def test_w1_10k_streamed_exactly(server, dims):
    gen = W1World(10_000, dims=dims, seed=11 + dims)
    reference = Reference(dims=dims)
    with Client(server.target) as client:
        world = client.create_world(f"w1-{dims}d", dims=dims, margin=0.05)
        pairs: set = set()
        reference.create(gen.ids, gen.boxes)
        first = world.apply(create=(gen.ids, gen.boxes))
        reference_begun, _ = reference.update()
        assert_same_pairs(first.begun, reference_begun, "begun at creation")
        _apply_changes(pairs, first)
        with world.stream() as stream:
            for step in range(STEPS):
                ids, boxes = gen.step()
                result = stream.apply(move=(ids, boxes))
                reference.move(ids, boxes)
                begun, ended = reference.update()
                assert result.tick == step + 2
                assert_same_pairs(result.begun, begun, f"begun at step {step}")
                assert_same_pairs(result.ended, ended, f"ended at step {step}")
                _apply_changes(pairs, result)
                assert len(pairs) == len(reference.pairs()), f"pair count after step {step}"
        expected = reference.pairs()
        assert_same_pairs(np.array(sorted(pairs), np.uint64).reshape(-1, 2), expected, "accumulated pairs")
        assert_same_pairs(world.pairs(), expected)

        boxes = gen.query_boxes(500)
        assert_same_csr(world.query_aabb(boxes), reference.query_aabb(boxes), "aabb")
        centers, radii = gen.spheres(500)
        assert_same_csr(world.query_sphere(centers, radii), reference.query_sphere(centers, radii), "sphere")
        segments = gen.segments(500)
        assert_same_csr(world.raycast(segments), reference.raycast(segments), "raycast")
        assert_same_csr(world.raycast(segments, first_hit=True), reference.raycast(segments, first_hit=True),
                        "first hit")
        frusta = gen.frusta(100)
        assert_same_csr(world.query_frustum(frusta), reference.query_frustum(frusta), "frustum")
        client.delete_world(world.name)
