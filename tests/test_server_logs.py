"""What dbvt-server logs: nothing but its own lines."""
from __future__ import annotations

import numpy as np

from dbvt_client import Client
from servers import OWN_LINE, ServerProcess

BOXES = np.array([[0, 0, 0, 1, 1, 1]] * 3, dtype=np.float32)


def _stopped(server: ServerProcess) -> list[str]:
    """The server's whole output, from start to SIGTERM, each line checked to be the server's own; without
    their time."""
    assert server.terminate() == 0
    lines = server.output()
    assert [line for line in lines if not OWN_LINE.match(line)] == []
    return [line.split(" ", 2)[2] for line in lines]


def test_debug_shows_only_the_servers_lines():
    """gRPC logs every call at DEBUG ("[_cygrpc] Loaded running loop"), and asyncio its selector."""
    server = ServerProcess("--log-level", "DEBUG")
    try:
        with Client(server.target) as client:
            world = client.create_world("beta")
            world.apply(create=(np.arange(3, dtype=np.uint64), BOXES))
            world.query_aabb(BOXES)
            client.delete_world("beta")
        said = _stopped(server)
        assert any(line.startswith("DEBUG dbvt_server: apply_batch on world 'beta'") for line in said), said
    finally:
        server.kill()
