"""View-frustum planes from view-projection matrices."""
from __future__ import annotations

import numpy as np


def frustum_planes(view_proj) -> np.ndarray:
    """Turn `(q, 4, 4)` view-projection matrices into `(q, 6, 4)` inward planes `(nx, ny, nz, d)`.

    The matrices map column vectors, `clip = M @ (x, y, z, 1)`, with OpenGL clip space
    (`-w <= x, y, z <= w`); a point p is inside when `n.p + d >= 0` for all six planes, which is the
    convention `query_frustum` expects. Planes come in the order left, right, bottom, top, near, far
    and are normalised so that `n.p + d` is a distance (Gribb & Hartmann's extraction).
    """
    m = np.asarray(view_proj, dtype=np.float64)
    if m.ndim == 2:
        m = m[None]
    if m.ndim != 3 or m.shape[1:] != (4, 4):
        raise ValueError(f"view_proj must have shape (q, 4, 4), got {m.shape}")
    if not np.isfinite(m).all():
        row = int(np.flatnonzero(~np.isfinite(m).reshape(len(m), -1).all(axis=1))[0])
        raise ValueError(f"view_proj row {row}: NaN or infinite value")
    r0, r1, r2, r3 = m[:, 0], m[:, 1], m[:, 2], m[:, 3]
    planes = np.stack([r3 + r0, r3 - r0, r3 + r1, r3 - r1, r3 + r2, r3 - r2], axis=1)
    norms = np.linalg.norm(planes[:, :, :3], axis=2, keepdims=True)
    if (norms == 0).any():
        row = int(np.flatnonzero((norms == 0).any(axis=(1, 2)))[0])
        raise ValueError(f"view_proj row {row}: degenerate matrix, a frustum plane has no normal")
    return (planes / norms).astype(np.float32)
