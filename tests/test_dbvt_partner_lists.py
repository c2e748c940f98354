"""A Broadphase keeps up to two partners in a list's header and moves longer lists to the heap. Here
lists cross that boundary both ways, through create, move, destroy and a round trip through bytes,
and after every change the pairs equal the reference's and validate() passes. A list emptied by a
destroy and filled again by a create under the same id reports only what changed."""
import numpy as np
import pytest

import dbvt
from dbvt import reference
from worlds import assert_same_pairs, update_both

# Unit cubes along x: all overlap box 0 (at 0.0), and most overlap one another.
STARTS = [0.0, 0.5, -0.5, 0.25, -0.25, 0.75, -0.75, 0.9]


def unit_box(x: float) -> np.ndarray:
    return np.array([[x, 0, 0, x + 1, 1, 1]], np.float32)


def check(real, ref, label):
    begun, ended = real.update()
    expected_begun, expected_ended = ref.update()
    assert_same_pairs(begun, expected_begun, f"{label}: begun")
    assert_same_pairs(ended, expected_ended, f"{label}: ended")
    real.validate()
    assert_same_pairs(real.pairs(), ref.pairs(), f"{label}: pairs")


def test_partner_lists_grow_past_their_header_and_shrink_back():
    real, ref = dbvt.Broadphase(margin=0.0), reference.Broadphase(margin=0.0)
    for k, x in enumerate(STARTS):      # box 0's list grows one partner at a time, from none to seven
        for bp in (real, ref):
            bp.create([k], unit_box(x))
        check(real, ref, f"after creating {k}")
    assert len(real.pairs()) == len(ref.pairs()) > 2 * len(STARTS)

    real = dbvt.Broadphase.from_bytes(real.to_bytes())     # lists rebuilt from bytes, on the heap
    real.validate()
    assert_same_pairs(real.pairs(), ref.pairs(), "after a round trip through bytes")

    for k in (1, 2, 3):                 # partners leave by moving away...
        for bp in (real, ref):
            bp.move([k], unit_box(50.0 + 3 * k))
        check(real, ref, f"after moving {k} away")
    for k in (4, 5, 6, 7):              # ...and by being destroyed, down to an empty list
        for bp in (real, ref):
            bp.destroy([k])
        check(real, ref, f"after destroying {k}")
    assert len(real.pairs()) == 0

    for k in (1, 2, 3):                 # the emptied lists take partners again
        for bp in (real, ref):
            bp.move([k], unit_box(0.1 * k))
        check(real, ref, f"after moving {k} back")
    assert len(real.pairs()) == 6


def test_a_proxy_destroyed_and_created_again_before_the_update_changes_no_pair():
    """Destroyed and created again under the same id, still touching the same partner (and inside the
    same sensor), a proxy's pair neither begins nor ends across the update; one that comes back
    elsewhere ends it. The reference agrees."""
    for structure in (dbvt.Broadphase(dims=3), reference.Broadphase(dims=3)):
        structure.create(np.array([1, 2, 3], np.uint64), np.concatenate([unit_box(0.0), unit_box(0.5), unit_box(9.0)]))
        structure.create(np.array([10], np.uint64), unit_box(0.2), sensor="box")
        structure.update()
        structure.destroy(np.array([2, 3], np.uint64))
        structure.create(np.array([2, 3], np.uint64), np.concatenate([unit_box(0.6), unit_box(0.1)]))
        begun, ended = structure.update()
        entered, left = structure.sensor_events()
        assert begun.tolist() == [[1, 3], [2, 3]] and ended.tolist() == [], type(structure)
        assert entered.tolist() == [[10, 3]] and left.tolist() == [], type(structure)
        structure.destroy(np.array([2], np.uint64))
        structure.create(np.array([2], np.uint64), unit_box(5.0))
        begun, ended = structure.update()
        entered, left = structure.sensor_events()
        assert (begun.tolist(), ended.tolist()) == ([], [[1, 2], [2, 3]]), type(structure)
        assert (entered.tolist(), left.tolist()) == ([], [[10, 2]]), type(structure)


@pytest.mark.parametrize("dims", [2, 3])
def test_a_crowd_that_leaves_its_fat_boxes_refreshes_in_packets_as_the_reference(dims):
    """When many proxies leave their fat boxes at once (here every one, each step), their partners are
    found eight neighbours to a walk (see design.md, "Partners found in packets"). Every update's
    pairs and sensor events equal the reference's, with static proxies, groups and masks, and moving
    sensors of both kinds whose partners are found one by one among the packets."""
    rng = np.random.default_rng(dims)
    n = 1500
    side = (n / 3.0) ** (1.0 / dims)            # unit boxes, a few neighbours each
    ids = rng.choice(2**40, n, replace=False).astype(np.uint64)
    centres = rng.uniform(0, side, (n, dims))
    static = np.arange(n) % 9 == 0
    group = np.where(np.arange(n) % 5 == 0, 2, 1).astype(np.uint32)
    mask = np.where(np.arange(n) % 7 == 0, 1, 0xFFFFFFFF).astype(np.uint32)
    sensor_ids = np.arange(2**50, 2**50 + 12, dtype=np.uint64)
    sensor_centres = rng.uniform(0, side, (12, dims))
    kinds = np.where(np.arange(12) % 2, 1, 2).astype(np.uint8)
    real = dbvt.Broadphase(dims=dims, margin=0.05, sensor_margin=0.5)
    ref = reference.Broadphase(dims=dims, margin=0.05, sensor_margin=0.5)

    def boxes(at, half):
        return np.concatenate([at - half, at + half], axis=1).astype(np.float32)

    for bp in (real, ref):
        bp.create(ids, boxes(centres, 0.5), static=static, group=group, mask=mask)
        bp.create(sensor_ids, boxes(sensor_centres, 2.0), sensor=kinds)
    for step in range(6):
        update_both(real, ref)
        assert_same_pairs(real.pairs(), ref.pairs(), f"step {step}: pairs")
        # A jump of 0.3 in a new direction: past the margin and the predicted path of each fat box.
        jump = rng.normal(size=(n, dims))
        centres += 0.3 * jump / np.linalg.norm(jump, axis=1, keepdims=True)
        sensor_centres += 0.4
        for bp in (real, ref):
            bp.move(ids, boxes(centres, 0.5))
            bp.move(sensor_ids, boxes(sensor_centres, 2.0))
    update_both(real, ref)
    real.validate()
