"""What dbvt-server logs: worlds created and deleted, every rejected request (but never a flood of them),
and nothing but its own lines."""
from __future__ import annotations

import asyncio
import json
import logging

import grpc
import numpy as np
import pytest

from dbvt_client import Client, InvalidArgument, NotFound
from dbvt_server.logs import BURST, Rejections
from servers import OWN_LINE, ServerProcess

BOXES = np.array([[0, 0, 0, 1, 1, 1]] * 3, dtype=np.float32)


@pytest.fixture
def server():
    running = ServerProcess()
    yield running
    running.kill()


def _stopped(server: ServerProcess) -> list[str]:
    """The server's whole output, from start to SIGTERM, each line checked to be the server's own; without
    their time."""
    assert server.terminate() == 0
    lines = server.output()
    assert [line for line in lines if not OWN_LINE.match(line)] == []
    return [line.split(" ", 2)[2] for line in lines]


def test_worlds_created_and_deleted(server):
    with Client(server.target) as client:
        world = client.create_world("alpha", dims=3, margin=0.25, track_pairs=False)
        world.apply(create=(np.arange(3, dtype=np.uint64), BOXES))
        client.delete_world("alpha")
    said = _stopped(server)
    assert said[1:3] == [
        "INFO dbvt_server: created world 'alpha' (dims=3, margin=0.25, track_pairs=False, max_proxies=10000000)",
        "INFO dbvt_server: deleted world 'alpha' (3 proxies)"]
    assert len(said) == 5, said  # listening, those two, stopping, stopped


def test_rejections_are_logged_but_a_flood_is_counted(server):
    floods = BURST + 15
    with Client(server.target) as client:
        for _ in range(floods):
            with pytest.raises(NotFound):
                client.world("nope").stats()
        with pytest.raises(InvalidArgument):
            client.create_world("odd", dims=7)
        with client.world("ghost").stream() as stream:
            with pytest.raises(NotFound):
                stream.apply(create=(np.arange(3, dtype=np.uint64), BOXES))
    said = _stopped(server)
    assert said.count("WARNING dbvt_server: rejected GetWorldStats on world 'nope': NOT_FOUND: "
                      "no world named 'nope'") == BURST
    assert "WARNING dbvt_server: rejected CreateWorld on world 'odd': INVALID_ARGUMENT: dims must be 2 or 3, " \
           "not 7" in said
    assert "WARNING dbvt_server: rejected StreamBatches on world 'ghost': NOT_FOUND: no world named 'ghost'" in said
    # Said as the server stops, before the interval of 60 s has ended.
    assert said[-3:] == ["INFO dbvt_server: stopping: finishing calls in flight (grace 10.0 s)",
                         "WARNING dbvt_server: rejected GetWorldStats: NOT_FOUND: 15 more in the last 60 s, "
                         "not logged",
                         "INFO dbvt_server: stopped"]


def test_each_interval_says_what_it_left_out(caplog):
    caplog.set_level(logging.WARNING, logger="dbvt_server")

    async def flood():
        rejections = Rejections(burst=2, interval=0.2)
        for _ in range(5):
            rejections.log("QueryAabb", "w", NotFound("no world named 'w'"))
        await asyncio.sleep(0.3)
        rejections.log("QueryAabb", "w", NotFound("no world named 'w'"))
        rejections.flush()

    asyncio.run(flood())
    assert [record.getMessage() for record in caplog.records] == [
        "rejected QueryAabb on world 'w': NOT_FOUND: no world named 'w'",
        "rejected QueryAabb on world 'w': NOT_FOUND: no world named 'w'",
        "rejected QueryAabb: NOT_FOUND: 3 more in the last 0.2 s, not logged",
        "rejected QueryAabb on world 'w': NOT_FOUND: no world named 'w'",
    ]


def test_long_names_are_cut(server):
    name = "x" * 5000
    with Client(server.target) as client:
        with pytest.raises(NotFound):
            client.delete_world(name)
    [line] = [line for line in _stopped(server) if line.startswith("WARNING")]
    assert line.startswith("WARNING dbvt_server: rejected DeleteWorld on world 'xxxxxxxx")
    assert "... (5000 characters): NOT_FOUND: no world named 'xxxx" in line
    assert len(line) < 500


def test_undecodable_requests_are_rejected_without_a_traceback(server):
    with grpc.insecure_channel(server.target) as channel:
        for method in ("ApplyBatch", "CreateWorld"):
            with pytest.raises(grpc.RpcError) as raised:
                channel.unary_unary(f"/dbvt.v1.BroadphaseService/{method}")(b"\xff\xff\xff", timeout=30)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert raised.value.details() == f"the request is not a valid dbvt.v1.{method}Request message"
        stream = channel.stream_stream("/dbvt.v1.BroadphaseService/StreamBatches")
        with pytest.raises(grpc.RpcError) as raised:
            list(stream(iter([b"\xff\xff"]), timeout=30))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    said = _stopped(server)
    for method in ("ApplyBatch", "CreateWorld", "StreamBatches"):
        assert f"WARNING dbvt_server: rejected {method}: INVALID_ARGUMENT: the request is not a valid " \
               f"dbvt.v1.{method}Request message" in said


def test_a_hundred_undecodable_requests_write_a_few_lines(server):
    with grpc.insecure_channel(server.target) as channel:
        create = channel.unary_unary("/dbvt.v1.BroadphaseService/CreateWorld")
        for _ in range(100):
            with pytest.raises(grpc.RpcError):
                create(b"\xff\xff\xff", timeout=30)
    said = [line for line in _stopped(server) if "CreateWorld" in line]
    assert len(said) == BURST + 1
    assert said[-1] == "WARNING dbvt_server: rejected CreateWorld: INVALID_ARGUMENT: 90 more in the last 60 s, not logged"


def test_json_lines_carry_a_rejected_requests_fields():
    server = ServerProcess("--log-format", "json")
    try:
        with Client(server.target) as client, pytest.raises(NotFound):
            client.world("nowhere").pairs()
        assert server.terminate() == 0
        lines = [json.loads(line) for line in server.output()]
    finally:
        server.kill()
    assert {"time", "level", "logger", "message"} <= set(lines[0]) and "listening on" in lines[0]["message"]
    [rejected] = [line for line in lines if line["level"] == "WARNING"]
    assert (rejected["method"], rejected["world"], rejected["code"]) == ("GetPairs", "nowhere", "NOT_FOUND")
    assert rejected["message"] == "rejected GetPairs on world 'nowhere': NOT_FOUND: no world named 'nowhere'"


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
