"""dbvt-server as users run it: a child process, its flags and environment, its port, SIGTERM."""
from __future__ import annotations

import errno
import os
import subprocess

from dbvt_client import Client
from servers import NEUTRAL_DIR, OWN_LINE, ServerProcess, server_command

ENVIRONMENT = ["DBVT_HOST", "DBVT_PORT", "DBVT_MAX_MESSAGE_BYTES", "DBVT_MAX_WORLDS", "DBVT_MAX_PROXIES_PER_WORLD",
               "DBVT_GRACE_SECONDS", "DBVT_LOG_LEVEL", "DBVT_WORKERS", "DBVT_TLS_CERT", "DBVT_TLS_KEY",
               "DBVT_TLS_CLIENT_CA", "DBVT_TOKENS", "DBVT_REFLECTION", "DBVT_HEALTH_PORT"]


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
    return {key: value for key, value in os.environ.items() if key.startswith(("PYTHON", "VIRTUAL_ENV"))}


def test_busy_port_is_refused():
    first = ServerProcess()
    try:
        second = subprocess.run([*server_command(), "--host", "127.0.0.1", "--port", str(first.port)],
                                capture_output=True, text=True, timeout=60, cwd=NEUTRAL_DIR)
        assert second.returncode == 1
        # Only our line: not gRPC's own log of the failed bind, nor its hint to set GRPC_VERBOSITY.
        [line] = second.stderr.splitlines()
        assert OWN_LINE.match(line), line
        assert line.endswith(f" ERROR dbvt_server: cannot listen on 127.0.0.1:{first.port}: "
                             f"{os.strerror(errno.EADDRINUSE)}")
        with Client(first.target) as client:
            assert client.list_worlds() == []
        assert first.terminate() == 0
    finally:
        first.kill()
