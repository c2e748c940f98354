"""Fixtures of the SDK suites: each test runs against a real server on 127.0.0.1 (port 0), against the
same server through its Unix socket, and against Client.local(), with the worlds it made deleted
afterwards."""
import tempfile

import pytest

from dbvt_client import Client
from servers import ServerThread


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory(prefix="dbvt-") as folder:
        running = ServerThread(listen=("127.0.0.1:0", f"unix://{folder}/dbvt.sock"))
        yield running
        running.stop()


@pytest.fixture(params=["grpc", "unix", "local"])
def mode(request):
    return request.param


@pytest.fixture
def client(mode, server):
    targets = {"grpc": server.target, "unix": server.unix_target}
    made = Client(targets[mode]) if mode in targets else Client.local()
    yield made
    for name in made.list_worlds():
        made.delete_world(name)
    made.close()
