"""from_bytes() on damaged data: every index is range-checked, so a flipped byte gives ValueError (or,
where it hits padding or a box corner in a way that breaks nothing, a valid structure), never a crash
or a hang."""
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dbvt


def sample(kind):
    rng = np.random.default_rng(3)
    centers = rng.uniform(0, 30, size=(60, 3))
    boxes = np.concatenate([centers, centers + rng.uniform(0.5, 3, size=(60, 3))], axis=1)
    if kind is dbvt.Tree:
        tree = dbvt.Tree(margin=0.1)
        tree.insert(np.arange(60), boxes)
        tree.update(np.arange(20), boxes[:20] + 1.5)
        return tree
    bp = dbvt.Broadphase()
    bp.create(np.arange(60), boxes)
    bp.update()
    bp.move(np.arange(20), boxes[:20] + 1.5)
    return bp


@pytest.mark.parametrize("kind", [dbvt.Tree, dbvt.Broadphase])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_damaged_bytes_are_rejected_or_valid(kind, data):
    original = sample(kind).to_bytes()
    damaged = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(damaged) - 1))
        damaged[at] ^= 1 << data.draw(st.integers(0, 7))
    if data.draw(st.booleans()):
        damaged = damaged[: data.draw(st.integers(0, len(damaged)))]
    try:
        restored = kind.from_bytes(bytes(damaged))
    except ValueError:
        return
    restored.validate()
    everything = np.array([[-1e30] * 3 + [1e30] * 3], np.float32)
    # A flipped flag may make a proxy a sensor, which queries skip unless asked.
    asked = {"include_sensors": True} if kind is dbvt.Broadphase else {}
    offsets, hits = restored.query_aabb(everything, **asked)
    assert len(hits) == len(restored)


@pytest.mark.parametrize("kind", [dbvt.Tree, dbvt.Broadphase])
def test_a_3d_world_relabelled_2d_is_rejected(kind):
    """The header's dims flipped from 3 to 2: the boxes still have a z extent, which a 2-D tree never has."""
    data = bytearray(sample(kind).to_bytes())
    assert data[12] == 3
    data[12] = 2
    with pytest.raises(ValueError, match="2-D tree has a z extent"):
        kind.from_bytes(bytes(data))



def settled_lists(bp):
    """A settled broadphase's bytes, its per-slot list lengths, and a copy of its list entries
    (partner << 1 | touching), which end the bytes when nothing is pending."""
    data = bytearray(bp.to_bytes())
    slots = struct.unpack_from("<4sIIif7i", data)[8]     # the header's proxy capacity
    total = 2 * bp.stats()["fat_pairs"]
    counts = np.frombuffer(data, np.int32, count=slots, offset=len(data) - 4 * total - 4 * slots)
    items = np.frombuffer(data, np.int32, count=total, offset=len(data) - 4 * total)
    return data, counts.copy(), items.copy()


@pytest.mark.parametrize("damage, problem", [
    ("one side's bit", "listed differently on its two sides"),
    ("both sides' bits", "touching bit disagrees with the tight boxes"),
    ("two entries swapped", "partner list is not sorted"),
    ("a sensor pair's bits", "sensor pair is inside where it must not be"),
])
def test_each_broken_partner_list_invariant_is_named(damage, problem):
    """Lists damaged in ways that keep every index in range: the check names what broke."""
    bp = dbvt.Broadphase()
    x = np.arange(20, dtype=np.float32)
    bp.create(np.arange(20), np.stack([x, 0 * x, 0 * x, x + 2.5, 0 * x + 1, 0 * x + 1], axis=1))
    if damage == "a sensor pair's bits":
        bp.create([1000], [[7, -3, -3, 13, 3, 3]], sensor="sphere")
    bp.update()
    data, counts, items = settled_lists(bp)
    starts = np.concatenate([[0], np.cumsum(counts)])
    # Slot 0 lists slots 1 and 2, and is checked first; the sensor's list is the longest.
    owner = int(np.argmax(counts)) if damage == "a sensor pair's bits" else 0
    row = starts[owner]
    partner = items[row] >> 1
    if damage == "two entries swapped":
        items[[row, row + 1]] = items[[row + 1, row]]
    else:
        items[row] ^= 1
        if damage != "one side's bit":
            theirs = starts[partner] + np.flatnonzero(items[starts[partner]:starts[partner + 1]] >> 1 == owner)[0]
            items[theirs] ^= 1
    data[len(data) - 4 * len(items):] = items.astype("<i4").tobytes()
    with pytest.raises(ValueError, match=problem):
        dbvt.Broadphase.from_bytes(bytes(data))
