"""`python -m dbvt_server.healthcheck`, the container image's HEALTHCHECK, against real servers."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dbvt_server.healthcheck import default_address, main
from servers import NEUTRAL_DIR, ServerProcess, ServerThread


@pytest.fixture
def server():
    running = ServerThread()
    yield running
    running.stop()


def test_serving_server_passes(server, capsys):
    assert main(["--address", server.target]) == 0
    assert capsys.readouterr().out.strip() == f"{server.target}: SERVING"


def test_the_broadphase_service_itself_is_checked_by_name(server):
    assert main(["--address", server.target, "--service", "dbvt.v1.BroadphaseService"]) == 0


def test_unknown_service_fails_naming_the_status(server, capsys):
    assert main(["--address", server.target, "--service", "no.such.Service"]) == 1
    assert "health check failed: NOT_FOUND" in capsys.readouterr().err


def test_no_server_fails_naming_the_status(capsys):
    stopped = ServerThread()
    address = stopped.target
    stopped.stop()
    assert main(["--address", address, "--timeout", "1"]) == 1
    assert f"{address}: health check failed: UNAVAILABLE" in capsys.readouterr().err


@pytest.mark.parametrize("host, expected", [
    (None, "127.0.0.1:7000"),
    ("0.0.0.0", "127.0.0.1:7000"),
    ("::", "127.0.0.1:7000"),
    ("127.0.0.2", "127.0.0.2:7000"),
    ("::1", "[::1]:7000"),
])
def test_default_address_follows_the_server_settings(host, expected):
    environ = {"DBVT_PORT": "7000"} if host is None else {"DBVT_HOST": host, "DBVT_PORT": "7000"}
    assert default_address(environ) == expected


def test_default_port_is_the_servers():
    assert default_address({}) == "127.0.0.1:50051"


def test_image_command_follows_the_environment_until_sigterm():
    """What HEALTHCHECK runs: no arguments, the server's own DBVT_* settings, exit status only."""
    server = ServerProcess()
    command = [sys.executable, "-m", "dbvt_server.healthcheck", "--timeout", "5"]
    env = {**os.environ, "DBVT_HOST": "0.0.0.0", "DBVT_PORT": str(server.port)}
    try:
        serving = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=NEUTRAL_DIR)
        assert (serving.returncode, serving.stdout.strip()) == (0, f"127.0.0.1:{server.port}: SERVING")
        assert server.terminate() == 0
        gone = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=NEUTRAL_DIR)
        assert gone.returncode == 1
        assert "health check failed" in gone.stderr
    finally:
        server.kill()
