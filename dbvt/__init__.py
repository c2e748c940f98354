"""dbvt: a dynamic AABB tree (DBVT) and broadphase, in Cython.

`Tree` is the dynamic tree (as Bullet's btDbvt and Box2D's b2DynamicTree); `Broadphase` tracks the
pairs of overlapping proxies as they move (as btDbvtBroadphase); `overlap` finds the overlapping pairs
of two of them (as Bullet's collideTT). `dbvt.reference` has the same API,
computed by brute force, for checking. All results are exact on the proxies' tight boxes.

With `threads=` above 1, large calls are cut over pooled threads. `set_thread_budget(n)` caps the
threads working at once across the process (those inside `with working():` and the pooled ones),
and `thread_stats()` shows where the parts ran.
"""
try:
    from dbvt._broadphase import Broadphase, FatPairLimit
    from dbvt._parallel import set_thread_budget, thread_stats, working
    from dbvt._tree import HitLimit, Tree, overlap
except ModuleNotFoundError as exc:   # the repository's dbvt/ shadows the installed package
    if not (exc.name or "").startswith("dbvt._"):
        raise
    raise ImportError(
        f"dbvt's compiled core is missing from {__path__[0]}: this is the source tree, not an installed "
        "package. Install it (pip install ./client .) and run Python from outside the repository."
    ) from exc
from dbvt.frustum import frustum_planes


__all__ = ["Tree", "Broadphase", "FatPairLimit", "HitLimit", "frustum_planes", "overlap", "set_thread_budget",
           "thread_stats", "working"]
__version__ = "0.1.0"
