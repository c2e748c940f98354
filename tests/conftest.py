"""Fixtures of the SDK suites: each test runs against a real server on 127.0.0.1 (port 0) and against
Client.local(), with the worlds it made deleted afterwards."""
import pytest

from dbvt_client import Client
from servers import ServerThread


@pytest.fixture(scope="module")
def server():
    running = ServerThread()
    yield running
    running.stop()


@pytest.fixture(params=["grpc", "local"])
def mode(request):
    return request.param


@pytest.fixture
def client(mode, server):
    made = Client(server.target) if mode == "grpc" else Client.local()
    yield made
    for name in made.list_worlds():
        made.delete_world(name)
    made.close()
