"""A Broadphase keeps up to two partners in a list's header and moves longer lists to the heap. Here
lists cross that boundary both ways, through create, move, destroy and a round trip through bytes,
and after every change the pairs equal the reference's and validate() passes."""
import numpy as np

import dbvt
from dbvt import reference
from worlds import assert_same_pairs

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
