"""--listen: exactly the addresses given, TCP and Unix sockets, for a sidecar beside its game server; a
stale socket file is replaced, one a server answers on is not; bad addresses are refused by name."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from dbvt_client import Client
from dbvt_server.config import parse
from servers import NEUTRAL_DIR, ServerProcess, server_command


def test_a_server_listens_on_a_unix_socket_and_tcp_at_once(tmp_path):
    sock = tmp_path / "dbvt.sock"
    # TCP first: the start-up line then names its port where ServerProcess looks for it.
    server = ServerProcess("--listen", "127.0.0.1:0", "--listen", f"unix://{sock}", host=None)
    try:
        line = server.wait_for_line("listening on")
        assert f"unix://{sock}" in line and "127.0.0.1:" in line
        with Client(f"unix://{sock}") as over_socket, Client(server.target) as over_tcp:
            world = over_socket.create_world("sidecar")
            result = world.apply(create=([1, 2], np.array([[0, 0, 0, 1, 1, 1], [0.5, 0, 0, 2, 1, 1]], np.float32)))
            np.testing.assert_array_equal(result.begun, [[1, 2]])
            assert over_tcp.world("sidecar").info().tick == 1
    finally:
        assert server.terminate() == 0


def test_a_stale_socket_file_is_replaced_and_a_live_one_is_not(tmp_path):
    sock = tmp_path / "dbvt.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()                                    # the file stays, nobody answers on it
    # TCP first: the start-up line then names its port where ServerProcess looks for it.
    server = ServerProcess("--listen", "127.0.0.1:0", "--listen", f"unix://{sock}", host=None)
    try:
        with Client(f"unix://{sock}") as client:
            assert client.list_worlds() == []
        second = subprocess.run([*server_command(), "--listen", f"unix://{sock}"], capture_output=True, text=True,
                                timeout=60, cwd=NEUTRAL_DIR)
        assert second.returncode == 1
        assert f"cannot listen on unix://{sock}: another server is listening on that socket" in second.stderr
    finally:
        server.terminate()


def test_listen_addresses_come_from_flags_or_the_variable_and_bad_ones_are_named(capsys):
    assert parse(["--listen", "unix:///run/dbvt.sock", "--listen", "0.0.0.0:7000"]).listen == (
        "unix:///run/dbvt.sock", "0.0.0.0:7000")
    assert parse([], {"DBVT_LISTEN": "127.0.0.1:1, unix:///a.sock"}).addresses == ("127.0.0.1:1", "unix:///a.sock")
    assert parse(["--port", "9"]).addresses == ("127.0.0.1:9",)
    assert parse(["--listen", "unix:///a.sock"]).exposed is False
    assert parse(["--listen", "10.0.0.7:50051"]).exposed_hosts == ["10.0.0.7"]
    with pytest.raises(SystemExit):
        parse(["--listen", "no-port-here"])
    assert "--listen no-port-here: listen must be host:port or unix:///path" in capsys.readouterr().err


def test_a_missing_directory_is_named(tmp_path):
    missing = tmp_path / "nowhere" / "dbvt.sock"
    run = subprocess.run([sys.executable, "-m", "dbvt_server", "--listen", f"unix://{missing}"], capture_output=True,
                         text=True, timeout=60, cwd=NEUTRAL_DIR, env={**os.environ})
    assert run.returncode == 1 and f"directory {missing.parent} does not exist" in run.stderr
