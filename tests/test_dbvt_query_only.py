"""Broadphase(track_pairs=False): a world that is only queried. Moves cost only the tree's work,
update() reports nothing, and every query and pairs() still equal a tracking twin's answers."""
import numpy as np

import dbvt
from worlds import W1World, assert_same_csr


def test_query_only_broadphase_answers_like_a_tracking_one():
    world = W1World(n=3000, dims=3, seed=5)
    quiet = dbvt.Broadphase(track_pairs=False)
    tracking = dbvt.Broadphase()
    for bp in (quiet, tracking):
        bp.create(world.ids, world.boxes, group=world.ids % 3 + 1)
    assert quiet.track_pairs is False and quiet.stats()["track_pairs"] is False
    probes = world.query_boxes(200)
    for _ in range(4):
        ids, boxes = world.step()
        assert quiet.move(ids, boxes) == tracking.move(ids, boxes)
        begun, ended = quiet.update()
        assert begun.shape == ended.shape == (0, 2)
        tracking.update()
        quiet.validate()
        assert np.array_equal(quiet.pairs(), tracking.pairs())
        for mask in (None, 2):
            assert_same_csr(quiet.query_aabb(probes, mask=mask), tracking.query_aabb(probes, mask=mask))
    assert quiet.stats()["fat_pairs"] == 0
    restored = dbvt.Broadphase.from_bytes(quiet.to_bytes())
    assert restored.track_pairs is False
    assert np.array_equal(restored.pairs(), tracking.pairs())
