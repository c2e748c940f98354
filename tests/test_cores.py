"""The cores the server counts by default: the CPU affinity, or fewer under a CPU quota read from the
process's own cgroup and those above it (v2's cpu.max, v1's CFS quota), on made-up cgroup trees."""
from __future__ import annotations

import os

import pytest

from dbvt_server.cores import cpu_quota, usable_cores

AFFINITY = len(os.sched_getaffinity(0))
# /proc/self/cgroup of a process in a systemd service, on cgroup v2 and on v1.
IN_A_SERVICE_V2 = "0::/system.slice/game.service\n"
IN_A_SERVICE_V1 = "4:memory:/system.slice/game.service\n2:cpu,cpuacct:/system.slice/game.service\n0::/\n"
AT_THE_ROOT = "0::/\n"


def _tree(tmp_path, own: str, files: dict[str, str]) -> tuple[str, str]:
    (tmp_path / "fs").mkdir(parents=True)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    (tmp_path / "cgroup").write_text(own)
    return str(tmp_path / "fs"), str(tmp_path / "cgroup")


@pytest.mark.parametrize("own, files, cores", [
    (AT_THE_ROOT, {"cpu.max": "max 100000\n"}, None),
    (AT_THE_ROOT, {"cpu.max": "150000 100000\n"}, 1.5),
    (AT_THE_ROOT, {"cpu.max": "garbage"}, None),
    (AT_THE_ROOT, {}, None),
    (IN_A_SERVICE_V2, {"system.slice/game.service/cpu.max": "50000 100000\n"}, 0.5),
    (IN_A_SERVICE_V2, {"system.slice/cpu.max": "300000 100000\n",
                       "system.slice/game.service/cpu.max": "max 100000\n"}, 3.0),
    (IN_A_SERVICE_V2, {"cpu.max": "200000 100000\n", "system.slice/cpu.max": "400000 100000\n"}, 2.0),
    (IN_A_SERVICE_V1, {"cpu/system.slice/game.service/cpu.cfs_quota_us": "100000\n",
                       "cpu/system.slice/game.service/cpu.cfs_period_us": "100000\n"}, 1.0),
    (IN_A_SERVICE_V1, {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    # A container without its own cgroup namespace: the host's path, which its tree does not hold.
    ("0::/docker/0123abcd\n", {"cpu.max": "250000 100000\n"}, 2.5),
])
def test_the_smallest_quota_from_the_process_s_cgroup_up(tmp_path, own, files, cores):
    assert cpu_quota(*_tree(tmp_path, own, files)) == cores


def test_the_usable_cores_are_the_affinity_or_the_quota_rounded_up(tmp_path):
    assert usable_cores(*_tree(tmp_path / "none", AT_THE_ROOT, {})) == AFFINITY
    assert usable_cores(*_tree(tmp_path / "half", AT_THE_ROOT, {"cpu.max": "50000 100000\n"})) == 1
    assert usable_cores(*_tree(tmp_path / "big", AT_THE_ROOT, {"cpu.max": "6400000 100000\n"})) == AFFINITY


def test_an_unreadable_own_cgroup_reads_the_root(tmp_path):
    root, _ = _tree(tmp_path, AT_THE_ROOT, {"cpu.max": "100000 100000\n"})
    assert cpu_quota(root, str(tmp_path / "missing")) == 1.0
