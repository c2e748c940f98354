"""A world with a backlog refuses at once instead of growing memory, and a call whose deadline passes
while it waits is never applied."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dbvt_client import Client, DeadlineExceeded, ResourceExhausted
from servers import ServerThread, wait_until

QUEUED = 3
BOX = np.array([[0, 0, 0, 1, 1, 1]], np.float32)



@pytest.fixture
def held():
    """A server with one world thread, held by the test until it releases it: world operations then
    wait in their queues, as behind a long batch."""
    server = ServerThread(workers=1, max_queued_per_world=QUEUED)
    with Client(server.target) as client:
        client.create_world("busy")
    release = threading.Event()
    holding = server.running.executor.submit(release.wait, 60)
    yield server, release
    release.set()
    holding.result(60)
    server.stop()


def test_past_the_queue_limit_calls_fail_at_once(held):
    server, release = held
    with Client(server.target) as client, ThreadPoolExecutor(QUEUED) as callers:
        world = client.world("busy")
        client.server_info()
        waiting = [callers.submit(world.apply, create=([i], BOX)) for i in range(QUEUED)]
        wait_until(lambda: server.running.servicer.queue_depths().get("busy") == QUEUED)
        with pytest.raises(ResourceExhausted) as refused:
            world.stats()
        assert str(refused.value).startswith(f"world 'busy' is busy: {QUEUED} operations are queued on it")
        assert "--max-queued-per-world" in str(refused.value)
        with world.stream() as stream:
            with pytest.raises(ResourceExhausted, match="is busy"):
                stream.apply(destroy=[0])
            release.set()
            assert sorted(future.result(60).tick for future in waiting) == [1, 2, 3]
            assert stream.apply(destroy=[0]).tick == 4


def test_a_call_whose_deadline_passes_in_the_queue_is_not_applied(held):
    server, release = held
    with Client(server.target, timeout=0.3) as hurried, Client(server.target) as patient:
        with pytest.raises(DeadlineExceeded):
            hurried.world("busy").apply(create=([1], BOX))
        release.set()
        info = patient.world("busy").info()
        assert (info.tick, info.proxies) == (0, 0)
