"""A deleted world's memory goes back to the system: dbvt-server shrinks again once its worlds are gone.

The core frees all of a world; what this guards is glibc keeping freed memory in its arenas
(dbvt_server.memory), which made a server that had held a 1M-proxy world three times 150 MB bigger.
"""
from __future__ import annotations

import time

import numpy as np

from dbvt_client import Client
from servers import ServerProcess

PROXIES = 1_000_000
ROUNDS = 3
ALLOWANCE_MB = 100


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _settled_rss_mb(pid: int, limit: float, seconds: float = 10) -> float:
    """The size once at most `limit`, or after `seconds`: the memory goes back after the delete has
    been answered."""
    deadline = time.monotonic() + seconds
    while (rss := _rss_mb(pid)) > limit and time.monotonic() < deadline:
        time.sleep(0.1)
    return rss


def test_deleted_worlds_give_their_memory_back():
    rng = np.random.default_rng(0)
    ids = np.arange(PROXIES, dtype=np.uint64)
    corners = rng.random((PROXIES, 3), dtype=np.float32) * 1000
    boxes = np.concatenate([corners, corners + 1], axis=1)
    server = ServerProcess()
    pid = server.process.pid
    try:
        with Client(server.target) as client:
            client.list_worlds()
            before = _rss_mb(pid)
            sizes = []
            for _ in range(ROUNDS):
                world = client.create_world("big")
                world.apply(create=(ids, boxes))
                sizes.append(_rss_mb(pid))
                client.delete_world("big")
            after = _settled_rss_mb(pid, before + ALLOWANCE_MB)
            assert client.list_worlds() == []
        assert after <= before + ALLOWANCE_MB, \
            f"{before:.0f} MB before, {after:.0f} MB after {ROUNDS} worlds of {PROXIES} proxies (full: {sizes})"
        assert server.terminate() == 0
    finally:
        server.kill()
