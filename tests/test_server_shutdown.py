"""dbvt-server stopping as users stop it: SIGTERM and SIGINT, with calls in flight and calls arriving late."""
from __future__ import annotations

import time

import numpy as np
import pytest

from dbvt_client import Client, DbvtError, Unavailable
from servers import ServerProcess


def test_sigterm_finishes_batches_in_flight_then_exits_zero():
    server = ServerProcess("--grace-seconds", "20")
    try:
        client = Client(server.target)
        world = client.create_world("w")
        n = 2000
        ids = np.arange(20 * n)
        boxes = np.repeat(ids[:, None] * 2.0, 6, axis=1)
        boxes[:, 3:] += 1.0
        with world.stream() as stream:
            assert stream.apply().tick == 1  # the stream is established before the signal
            pending = [stream.submit(create=(ids[i * n:(i + 1) * n], boxes[i * n:(i + 1) * n])) for i in range(20)]
            server.process.send_signal(15)
        assert [future.result().tick for future in pending] == list(range(2, 22))
        assert server.wait(30) == 0
        log = "".join(server.lines)
        assert "stopping" in log and "stopped" in log
        client.close()
    finally:
        server.kill()


def test_sigterm_refuses_new_calls_and_exits_within_the_grace_period():
    server = ServerProcess("--grace-seconds", "3")
    try:
        client = Client(server.target)
        world = client.create_world("w")
        stream = world.stream()
        stream.apply()
        started = time.monotonic()
        server.process.send_signal(15)
        time.sleep(0.5)
        assert server.process.poll() is None, "the open stream keeps the server in its grace period"
        with pytest.raises(Unavailable):
            with Client(server.target, timeout=5) as late:
                late.list_worlds()
        assert server.wait(30) == 0
        assert time.monotonic() - started < 3 + 5
        with pytest.raises(DbvtError):
            stream.apply()
        stream.close()
        client.close()
    finally:
        server.kill()
