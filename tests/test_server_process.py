"""dbvt-server as users run it: a child process, its flags and environment, its port, SIGTERM."""
from __future__ import annotations

import subprocess
import time

import numpy as np
import pytest

from dbvt_client import Client, DbvtError, Unavailable
from servers import NEUTRAL_DIR, ServerProcess, server_command

ENVIRONMENT = ["DBVT_HOST", "DBVT_PORT", "DBVT_MAX_MESSAGE_BYTES", "DBVT_MAX_WORLDS", "DBVT_MAX_PROXIES_PER_WORLD",
               "DBVT_GRACE_SECONDS", "DBVT_LOG_LEVEL", "DBVT_WORKERS"]


def test_help_documents_every_setting():
    shown = subprocess.run([*server_command(), "--help"], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_DIR)
    assert shown.returncode == 0
    for variable in ENVIRONMENT:
        flag = "--" + variable[len("DBVT_"):].lower().replace("_", "-")
        assert flag in shown.stdout and variable in shown.stdout, variable


def test_environment_configures_and_flags_win():
    server = ServerProcess("--max-worlds", "5", env={"DBVT_MAX_WORLDS": "2", "DBVT_MAX_PROXIES_PER_WORLD": "7",
                                                     "DBVT_MAX_MESSAGE_BYTES": "100000"})
    try:
        with Client(server.target) as client:
            info = client.server_info()
        assert (info["max_worlds"], info["max_proxies_per_world"], info["max_message_bytes"]) == (5, 7, 100000)
        assert [line for line in server.lines if "listening on" in line] == server.lines[-1:]
        assert server.terminate() == 0
    finally:
        server.kill()


def test_bad_setting_is_refused_clearly():
    shown = subprocess.run(server_command(), capture_output=True, text=True, timeout=60, cwd=NEUTRAL_DIR,
                           env={"DBVT_PORT": "fifty", "PATH": "/usr/bin:/bin", **_python_env()})
    assert shown.returncode == 2
    assert "DBVT_PORT='fifty' is not a valid int" in shown.stderr


def _python_env() -> dict:
    import os

    return {key: value for key, value in os.environ.items() if key.startswith(("PYTHON", "VIRTUAL_ENV"))}


def test_busy_port_is_refused():
    first = ServerProcess()
    try:
        second = subprocess.run([*server_command(), "--host", "127.0.0.1", "--port", str(first.port)],
                                capture_output=True, text=True, timeout=60, cwd=NEUTRAL_DIR)
        assert second.returncode == 1
        assert f"cannot listen on 127.0.0.1:{first.port}: the port is in use" in second.stderr
        with Client(first.target) as client:
            assert client.list_worlds() == []
        assert first.terminate() == 0
    finally:
        first.kill()


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
