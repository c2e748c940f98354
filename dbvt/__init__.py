"""dbvt: a dynamic AABB tree (DBVT) and broadphase, in Cython.

`Tree` is the dynamic tree (as Bullet's btDbvt and Box2D's b2DynamicTree); `Broadphase` tracks the
pairs of overlapping proxies as they move (as btDbvtBroadphase); `overlap` finds the overlapping pairs
of two of them (as Bullet's collideTT). `dbvt.reference` has the same API,
computed by brute force, for checking. All results are exact on the proxies' tight boxes.
"""
try:
    from dbvt import _broadphase
    from dbvt._broadphase import FatPairLimit
    from dbvt._tree import HitLimit, Tree, overlap
except ModuleNotFoundError as exc:   # the repository's dbvt/ shadows the installed package
    if not (exc.name or "").startswith("dbvt._"):
        raise
    raise ImportError(
        f"dbvt's compiled core is missing from {__path__[0]}: this is the source tree, not an installed "
        "package. Install it (pip install ./client .) and run Python from outside the repository."
    ) from exc
from dbvt.frustum import frustum_planes


class Broadphase(_broadphase.Broadphase):
    __doc__ = _broadphase.Broadphase.__doc__ + """
    With `threads` > 1, a batch of queries of at least 64 rows a thread is cut over that many threads,
    with the same answer. It is a runtime setting: `to_bytes()` does not keep it, `from_bytes()` takes it.
    """
    # `threads` is taken here rather than in _broadphase.pyx only while that file is being rewritten
    # on another branch; it belongs in Broadphase.__init__ and from_bytes, as Tree has it.
    __slots__ = ()

    def __init__(self, *args, threads=1, **kwargs):
        super().__init__(*args, **kwargs)
        self._use_threads(threads)

    @classmethod
    def from_bytes(cls, data, *, threads=1):
        broadphase = super().from_bytes(data)
        broadphase._use_threads(threads)
        return broadphase


__all__ = ["Tree", "Broadphase", "FatPairLimit", "HitLimit", "frustum_planes", "overlap"]
__version__ = "0.1.0"
