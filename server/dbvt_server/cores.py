"""The cores this process may keep busy: the default of --cores and --workers.

Those it may run on (its CPU affinity, which `docker run --cpuset-cpus` and `taskset` set), or
fewer under a CPU quota: `docker run --cpus`, Kubernetes' CPU limit, systemd's CPUQuota=. A quota is
read from the cgroup the process is in (/proc/self/cgroup) and from each cgroup above it, the
smallest one winning: cgroup v2's cpu.max, or cgroup v1's CFS quota and period. A container that has
its own cgroup namespace sees its cgroup as the root; one that has not sees the host's path to it,
which its own /sys/fs/cgroup does not hold, so the walk up ends at the root it does hold.
"""
from __future__ import annotations

import math
import os

from dbvt.validation import MAX_THREADS

CGROUP_ROOT = "/sys/fs/cgroup"
OWN_CGROUPS = "/proc/self/cgroup"
V2 = ""                             # the name /proc/self/cgroup gives the unified hierarchy


def usable_cores(root: str = CGROUP_ROOT, own: str = OWN_CGROUPS) -> int:
    """The CPU affinity's cores, or the quota's (rounded up) where it is smaller; from 1 to MAX_THREADS."""
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota(root, own)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, min(cores, MAX_THREADS))


def cpu_quota(root: str = CGROUP_ROOT, own: str = OWN_CGROUPS) -> float | None:
    """The smallest quota, in cores, on the way from the process's cgroups up to the root; None
    without any (or where none can be read)."""
    paths = _own_paths(own)
    found = [quota for directory in _upwards(root, paths.get(V2, "/"))
             if (quota := _v2_quota(directory)) is not None]
    found += [quota for directory in _upwards(os.path.join(root, "cpu"), paths.get("cpu", "/"))
              if (quota := _v1_quota(directory)) is not None]
    return min(found) if found else None


def _own_paths(own: str) -> dict[str, str]:
    """The process's cgroup by hierarchy: V2 for the unified one, and each v1 controller by name."""
    try:
        with open(own) as lines:
            rows = [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return {}
    paths = {}
    for row in rows:
        if len(row) == 3:
            for controller in row[1].split(",") if row[1] else [V2]:
                paths[controller] = row[2]
    return paths


def _upwards(root: str, path: str):
    """`root` joined with `path`, then with each of its parents, up to `root` itself."""
    parts = [part for part in path.split("/") if part]
    for end in range(len(parts), -1, -1):
        yield os.path.join(root, *parts[:end])


def _v2_quota(directory: str) -> float | None:
    try:
        with open(os.path.join(directory, "cpu.max")) as limit:
            quota, period = limit.read().split()[:2]
    except (OSError, ValueError):
        return None
    return _cores(quota, period)


def _v1_quota(directory: str) -> float | None:
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as quota, \
                open(os.path.join(directory, "cpu.cfs_period_us")) as period:
            return _cores(quota.read().strip(), period.read().strip())
    except OSError:
        return None


def _cores(quota: str, period: str) -> float | None:
    """A quota over its period, in cores; None for "max" or -1 (no quota)."""
    try:
        allowed, every = int(quota), int(period)
    except ValueError:
        return None
    return allowed / every if allowed > 0 and every > 0 else None
