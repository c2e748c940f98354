"""Tokens on a real server: who is let in, what each role may do, on which worlds; refusals change nothing."""
from __future__ import annotations

import logging

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dbvt_client import Client, PermissionDenied, Unauthenticated
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc
from security import TokenFile
from servers import ServerThread

GRANTS = [("ops", "admin", "*"), ("arena-writer", "write", "arena-*"), ("viewer", "read", "*"),
          ("arena-admin", "admin", "arena-*")]
BOXES = np.array([[0, 0, 0, 1, 1, 1], [0.5, 0.5, 0.5, 2, 2, 2]], dtype=np.float32)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    return TokenFile(tmp_path_factory.mktemp("tokens") / "tokens", *GRANTS)


@pytest.fixture(scope="module")
def server(tokens):
    running = ServerThread(tokens=str(tokens.path))
    yield running
    running.stop()


@pytest.fixture
def worlds(server, tokens):
    """Worlds arena-1 and lobby, each with two overlapping proxies, made by the admin token."""
    with Client(server.target, token=tokens.secret["ops"]) as admin:
        for name in ("arena-1", "lobby"):
            admin.create_world(name).apply(create=([1, 2], BOXES))
        yield admin
        for name in admin.list_worlds():
            admin.delete_world(name)


def state(admin: Client) -> dict:
    """Every world, its proxies' ids and its pairs: what a refused call must leave as it was."""
    return {name: (admin.world(name).info(), admin.world(name).pairs().tolist()) for name in admin.list_worlds()}


def as_token(server, tokens, name: str | None) -> Client:
    return Client(server.target, token=None if name is None else tokens.secret.get(name, name))


@pytest.mark.parametrize("token", [None, "not-a-token-of-this-server"])
def test_a_call_without_a_known_token_is_unauthenticated(server, tokens, worlds, token):
    before = state(worlds)
    with as_token(server, tokens, token) as stranger:
        for call in (stranger.list_worlds, stranger.server_info, lambda: stranger.world("lobby").pairs(),
                     lambda: stranger.delete_world("lobby"),
                     lambda: stranger.world("lobby").apply(destroy=[1]),
                     lambda: stranger.world("lobby").query_aabb(BOXES)):
            with pytest.raises(Unauthenticated):
                call()
    assert state(worlds) == before


def test_a_token_without_the_bearer_scheme_is_unauthenticated(server, tokens, worlds):
    with grpc.insecure_channel(server.target) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.BroadphaseServiceStub(channel).ListWorlds(
                pb.ListWorldsRequest(), metadata=(("authorization", tokens.secret["ops"]),))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "Bearer" in refused.value.details()


def test_a_read_token_may_query_but_not_change(server, tokens, worlds):
    before = state(worlds)
    with as_token(server, tokens, "viewer") as viewer:
        world = viewer.world("arena-1")
        assert world.pairs().tolist() == [[1, 2]]
        assert world.query_aabb(BOXES[:1]).hits.tolist() == [1, 2]
        assert viewer.list_worlds() == ["arena-1", "lobby"]
        with pytest.raises(PermissionDenied, match="token 'viewer' may not write on world 'arena-1'"):
            world.apply(destroy=[1])
        with world.stream() as stream:
            with pytest.raises(PermissionDenied, match="may not write on world 'arena-1'"):
                stream.apply(destroy=[2])
        with pytest.raises(PermissionDenied, match="may not admin on world 'lobby'"):
            viewer.delete_world("lobby")
    assert state(worlds) == before


def test_a_token_limited_to_arena_worlds_cannot_touch_the_lobby(server, tokens, worlds):
    before = state(worlds)
    with as_token(server, tokens, "arena-writer") as writer:
        assert writer.list_worlds() == ["arena-1"]
        writer.world("arena-1").apply(destroy=[2])
        for call in (lambda: writer.world("lobby").pairs(), lambda: writer.world("lobby").apply(destroy=[1]),
                     lambda: writer.world("lobby").query_aabb(BOXES)):
            with pytest.raises(PermissionDenied, match="limited to worlds 'arena-\\*'"):
                call()
        # A world it may not see is refused the same whether or not it exists.
        with pytest.raises(PermissionDenied):
            writer.world("no-such-world").stats()
    before["arena-1"] = state(worlds)["arena-1"]
    assert state(worlds) == before


def test_a_write_token_cannot_create_or_delete_worlds(server, tokens, worlds):
    before = state(worlds)
    with as_token(server, tokens, "arena-writer") as writer:
        with pytest.raises(PermissionDenied, match="may not admin on world 'arena-2': its role is write"):
            writer.create_world("arena-2")
        with pytest.raises(PermissionDenied):
            writer.delete_world("arena-1")
    assert state(worlds) == before


def test_an_admin_token_is_held_to_its_worlds(server, tokens, worlds):
    with as_token(server, tokens, "arena-admin") as arena_admin:
        arena_admin.create_world("arena-2")
        arena_admin.delete_world("arena-2")
        with pytest.raises(PermissionDenied):
            arena_admin.create_world("lobby-2")
    assert "lobby-2" not in worlds.list_worlds()


def test_creations_and_deletions_are_logged_with_the_token_name_never_the_token(server, tokens, worlds, caplog):
    with caplog.at_level(logging.INFO, logger="dbvt_server"):
        with as_token(server, tokens, "arena-admin") as arena_admin:
            arena_admin.create_world("arena-logged")
            arena_admin.delete_world("arena-logged")
    lines = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("created world 'arena-logged'") and line.endswith("by token 'arena-admin'")
               for line in lines), lines
    assert any(line.startswith("deleted world 'arena-logged'") and line.endswith("by token 'arena-admin'")
               for line in lines), lines
    assert not any(secret in line for line in lines for secret in tokens.secret.values())


def test_the_health_service_needs_no_token(server):
    with grpc.insecure_channel(server.target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
