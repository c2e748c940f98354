"""`python -m dbvt_server.healthcheck`, the container image's HEALTHCHECK, against real servers."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from dbvt_server.healthcheck import default_address, main
from security import Pki, TokenFile
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


def test_the_health_port_is_dialled_when_set():
    assert default_address({"DBVT_HOST": "0.0.0.0", "DBVT_PORT": "50051", "DBVT_HEALTH_PORT": "50052"}) == \
        "127.0.0.1:50052"


def test_image_command_passes_while_the_main_port_needs_tls_and_tokens(tmp_path):
    """The image's HEALTHCHECK with TLS and tokens on: it dials the plaintext health port."""
    pki = Pki(tmp_path)
    tokens = TokenFile(tmp_path / "tokens", ("ops", "admin", "*"))
    server = ServerProcess(*pki.server_flags(), "--tokens", str(tokens.path), "--health-port", "0")
    health_port = re.search(r"health service on \S+:(\d+)", "".join(server.output())).group(1)
    command = [sys.executable, "-m", "dbvt_server.healthcheck", "--timeout", "5"]
    try:
        for port, answer in ((health_port, 0), (None, 1)):
            env = {**os.environ, "DBVT_HOST": "0.0.0.0", "DBVT_PORT": str(server.port)}
            if port:
                env["DBVT_HEALTH_PORT"] = port
            checked = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=NEUTRAL_DIR)
            # Without the health port the check dials the TLS port in plaintext, and fails.
            assert checked.returncode == answer, checked.stderr
        assert server.terminate() == 0
    finally:
        server.kill()
