"""Worlds moved between replicas: BeginMove and FinishMove, `dbvt-admin rebalance` after a fourth server
joins, the SDK retrying calls on a moving world, and routing by a DNS name.

A moved world answers as it did before (same tick, incarnation, pairs and query answers); a world is
never served by two servers; a move cut short is finished by running the rebalance again.
"""
from __future__ import annotations

import asyncio
import io
import socket
import threading
import time

import grpc
import numpy as np
import pytest

from dbvt_client import (AsyncClient, Client, FailedPrecondition, InvalidArgument, Moving, NotFound, Unavailable,
                         WorldInfo, WrongServer)
from dbvt_client.routing import owner
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc
from dbvt_server import admin
from dbvt_server.rebalance import MoveConflict, rebalance
from servers import ServerThread
from test_sdk_routing import free_ports
from worlds import W1World


def fill(world, seed: int) -> W1World:
    scene = W1World(200, dims=3, seed=seed)
    world.apply(create=(scene.ids, scene.boxes.astype(np.float32)))
    for _ in range(3):
        world.apply(move=scene.step())
    scene.probes = scene.query_boxes(10, half=8.0).astype(np.float32)
    return scene


def answers(world, scene: W1World) -> tuple:
    info = world.info()
    return (info.tick, info.incarnation, info.proxies, world.pairs().tobytes(),
            world.query_aabb(scene.probes).hits.tobytes())


class Joined:
    """Three servers that know each other (--peers, --advertise), and a fourth that joins: it knows all
    four; the three still know only themselves until they are restarted, as during a rolling update."""

    def __init__(self):
        self.targets = [f"127.0.0.1:{port}" for port in free_ports(4)]
        self.old, self.new = self.targets[:3], self.targets[3]
        self.servers = [ServerThread(port=int(target.rpartition(":")[2]), advertise=target,
                                     peers=tuple(self.targets if target == self.new else self.old))
                        for target in self.targets]

    def names(self, prefix: str, count: int, moving: bool = True) -> list[str]:
        """World names whose owner changes (or, `moving` False, does not) when the fourth joins."""
        found = (f"{prefix}-{i}" for i in range(10_000))
        return [name for name in found if (owner(name, self.targets) == self.new) == moving][:count]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def joined():
    replicas = Joined()
    yield replicas
    replicas.stop()


def held(target: str) -> dict[str, WorldInfo]:
    with Client(target) as direct:
        return {info.name: info for info in direct.list_worlds(details=True)}


def quiet(line: str) -> None:
    pass


def test_a_fourth_server_joins_and_rebalance_moves_only_the_worlds_it_now_owns(joined):
    names = [f"match-{i}" for i in range(24)]
    with Client(joined.old) as routed:
        scenes = {name: fill(routed.create_world(name), seed) for seed, name in enumerate(names)}
        before = {name: answers(routed.world(name), scenes[name]) for name in names}
    expected = [name for name in names if owner(name, joined.targets) == joined.new]
    assert expected and all(owner(name, joined.old) != joined.new for name in names)

    said: list[str] = []
    report = rebalance(joined.targets, Client, say=said.append)

    assert sorted(move.world for move in report.moves) == sorted(expected)
    assert report.proxies == 200 * len(expected) and len(said) == len(expected)
    where = {target: held(target) for target in joined.targets}
    for name in names:
        holders = [target for target in joined.targets if name in where[target]]
        assert holders == [owner(name, joined.targets)], (name, holders)
    with Client(joined.targets) as routed, Client(joined.old) as stale:
        for name in names:
            assert answers(routed.world(name), scenes[name]) == before[name], name
            # A client that knows only the old servers is redirected to where a world went.
            assert answers(stale.world(name), scenes[name]) == before[name], name
    assert rebalance(joined.targets, Client, say=said.append).moves == []


def test_a_leaving_server_is_drained_before_the_others_learn_the_smaller_set():
    targets = [f"127.0.0.1:{port}" for port in free_ports(4)]
    servers = [ServerThread(port=int(target.rpartition(":")[2]), peers=tuple(targets), advertise=target)
               for target in targets]
    try:
        staying, leaving = targets[:3], targets[3]
        names = [f"drain-{i}" for i in range(24)]
        with Client(targets) as routed:
            scenes = {name: fill(routed.create_world(name), seed) for seed, name in enumerate(names)}
            before = {name: answers(routed.world(name), scenes[name]) for name in names}
        report = rebalance(staying, Client, say=quiet, leaving=[leaving])
        assert sorted(move.world for move in report.moves) == sorted(
            name for name in names if owner(name, targets) == leaving)
        assert held(leaving) == {}
        for target in staying:
            assert sorted(held(target)) == sorted(name for name in names if owner(name, staying) == target)
        # Clients of the old set and of the new one both reach every world, as it was.
        with Client(targets) as old_ring, Client(staying) as new_ring:
            for name in names:
                assert answers(old_ring.world(name), scenes[name]) == before[name]
                assert answers(new_ring.world(name), scenes[name]) == before[name]
    finally:
        for server in servers:
            server.stop()


def test_a_moving_world_answers_unavailable_naming_its_destination_and_the_sdk_waits_it_out(joined):
    name = joined.names("arena", 1)[0]
    source = owner(name, joined.old)
    with Client(source) as client:
        scene = fill(client.create_world(name), seed=7)
        expected = answers(client.world(name), scene)
        frozen = client.world(name).begin_move(joined.new)
        assert (frozen.tick, frozen.moving_to) == (4, joined.new)
        with grpc.insecure_channel(source) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.BroadphaseServiceStub(channel).GetWorldStats(pb.GetWorldStatsRequest(world=name), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.value.details() == f"world {name!r} is moving to {joined.new}; retry"
        assert dict(refused.value.trailing_metadata())["dbvt-moving"] == joined.new

        waited: dict = {}

        def call_while_moving():
            started = time.monotonic()
            waited["answers"] = answers(client.world(name), scene)
            waited["seconds"] = time.monotonic() - started

        caller = threading.Thread(target=call_while_moving)
        caller.start()
        time.sleep(0.3)
        assert caller.is_alive(), "a call on a moving world waits for the move"
        report = rebalance(joined.targets, Client, say=quiet)
        caller.join(30)
    assert [move.world for move in report.moves] == [name]
    assert waited["answers"] == expected and waited["seconds"] >= 0.3
    assert name in held(joined.new) and name not in held(source)


def test_a_move_cut_short_after_any_step_is_finished_by_running_the_rebalance_again(joined):
    names = joined.names("lobby", 2)
    with Client(joined.old) as routed, Client(joined.new) as there:
        scenes = [fill(routed.create_world(name), seed) for seed, name in enumerate(names)]
        expected = [answers(routed.world(name), scene) for name, scene in zip(names, scenes)]
        # The mover stopped after freezing the first, and after copying the second.
        routed.world(names[0]).begin_move(joined.new)
        routed.world(names[1]).begin_move(joined.new)
        image = io.BytesIO()
        routed.world(names[1]).export(image)
        image.seek(0)
        there.import_world(names[1], image)
    report = rebalance(joined.targets, Client, say=quiet)
    assert {move.world: move.copied for move in report.moves} == {names[0]: True, names[1]: False}
    with Client(joined.new) as there:
        for name, scene, answer in zip(names, scenes, expected):
            assert answers(there.world(name), scene) == answer
    assert not set(names) & {name for target in joined.old for name in held(target)}


def test_a_conflicting_copy_stops_the_move_and_keeps_both(joined):
    name = joined.names("clash", 1)[0]
    with Client(joined.old) as routed, Client(joined.new) as there:
        world = routed.create_world(name)
        fill(world, seed=1)
        image = io.BytesIO()
        world.export(image)
        image.seek(0)
        there.import_world(name, image)
        world.apply(destroy=[int(world.pairs()[0, 0])])
        with pytest.raises(MoveConflict, match="already holds another world of that name"):
            rebalance(joined.targets, Client, say=quiet)
        assert held(owner(name, joined.old))[name].moving_to == joined.new and name in held(joined.new)
        world.finish_move(cancel=True)
        assert world.info().tick == 5


def test_begin_and_finish_move_refuse_what_makes_no_sense(joined):
    name = joined.names("odd", 1)[0]
    source = owner(name, joined.old)
    with Client(source) as client:
        world = client.create_world(name)
        with pytest.raises(FailedPrecondition, match=f"world {name!r} is not moving"):
            world.finish_move()
        with pytest.raises(InvalidArgument, match=f"world {name!r} is already on {source}"):
            world.begin_move(source)
        world.begin_move(joined.new)
        other = next(target for target in joined.old if target != source)
        with pytest.raises(FailedPrecondition, match=f"already moving to {joined.new}"):
            world.begin_move(other)
        world.finish_move(cancel=True)
        assert client.list_worlds(details=True)[0].moving_to == "" and world.info().tick == 0


def test_the_old_server_redirects_creates_of_a_world_it_moved_away(joined):
    name = joined.names("gone", 1)[0]
    source = owner(name, joined.old)
    with Client(source) as client:
        client.create_world(name)
        rebalance(joined.targets, Client, say=quiet)
        with grpc.insecure_channel(source) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.BroadphaseServiceStub(channel).CreateWorld(pb.CreateWorldRequest(name=name), timeout=10)
        assert dict(refused.value.trailing_metadata())["dbvt-owner"] == joined.new
        assert client.create_world(name, exist_ok=True).info().tick == 0      # followed to where it went
    assert name in held(joined.new) and name not in held(source)


def test_dbvt_admin_rebalance_prints_each_move_and_the_rate(joined, capsys):
    names = joined.names("cli", 3) + joined.names("stay", 2, moving=False)
    with Client(joined.old) as routed:
        for seed, name in enumerate(names):
            fill(routed.create_world(name), seed)
    peers = ",".join(joined.targets)
    assert admin.main(["rebalance", "--peers", peers, "--dry-run"]) == 0
    planned = capsys.readouterr().out.splitlines()
    assert sorted(planned) == sorted(f"would move {name!r} (200 proxies) from {owner(name, joined.old)} to "
                                     f"{joined.new}" for name in names[:3])
    assert admin.main(["rebalance", "--peers", peers]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 and printed[-1].startswith("3 worlds moved (600 proxies) in ")
    assert sorted(held(joined.new)) == sorted(names[:3])
    with pytest.raises(SystemExit):
        admin.main(["rebalance", "--peers", "nowhere"])
    assert "must be distinct host:port addresses" in capsys.readouterr().err


# ---- routing by a DNS name --------------------------------------------------------------------------
FAKE_NAME = "dbvt-headless.test"


class FakeDns:
    """A name that the system resolver answers with `hosts` (as cluster DNS does for a headless
    Service); any other name is resolved as usual."""

    def __init__(self, monkeypatch, hosts: list[str], port: int):
        self.hosts, self.port, self.real = list(hosts), port, socket.getaddrinfo
        monkeypatch.setattr(socket, "getaddrinfo", self.getaddrinfo)

    def getaddrinfo(self, host, *args, **kwargs):
        if host == FAKE_NAME:
            if not self.hosts:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, self.port)) for ip in self.hosts]
        return self.real(host, *args, **kwargs)


@pytest.fixture
def dns_replicas(monkeypatch):
    """Three servers on 127.0.0.1-3, one port, each with --peers the DNS name of all three."""
    port = free_ports(1)[0]
    dns = FakeDns(monkeypatch, ["127.0.0.1", "127.0.0.2", "127.0.0.3"], port)
    target = f"dns:///{FAKE_NAME}:{port}"
    servers = {f"{host}:{port}": ServerThread(host=host, port=port, peers=(target,), advertise=f"{host}:{port}")
               for host in dns.hosts}
    yield target, dns, servers
    for server in servers.values():
        server.stop()


def test_a_dns_target_routes_over_every_address_and_agrees_with_the_servers(dns_replicas):
    target, _, servers = dns_replicas
    addresses = sorted(servers)
    names = [f"dns-{i}" for i in range(30)]
    with Client(target) as routed:
        assert routed.server_info()["peers"] == addresses
        for name in names:
            routed.create_world(name, dims=2).apply(create=([1], [[0, 0, 1, 1]]))
        assert routed.list_worlds() == sorted(names)
    for address in addresses:
        assert sorted(held(address)) == sorted(name for name in names if owner(name, addresses) == address)
    stranger = next(name for name in names if owner(name, addresses) != addresses[0])
    with grpc.insecure_channel(addresses[0]) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.BroadphaseServiceStub(channel).GetWorldStats(pb.GetWorldStatsRequest(world=stranger), timeout=10)
    assert dict(refused.value.trailing_metadata())["dbvt-owner"] == owner(stranger, addresses)


def test_a_replica_gone_from_dns_is_dropped_by_servers_and_by_a_client_that_cannot_reach_it(dns_replicas):
    target, dns, servers = dns_replicas
    addresses = sorted(servers)
    with Client(target) as routed:
        routed.server_info()                                     # the ring as it is now
        gone = addresses[2]
        name = next(f"late-{i}" for i in range(100) if owner(f"late-{i}", addresses) == gone)
        servers.pop(gone).stop()
        dns.hosts.remove(gone.rpartition(":")[0])
        for server in servers.values():
            server.running.service.replicas.refresh()           # what each server does every 30 s
        world = routed.create_world(name)                        # the owner is unreachable: looked up again
        assert routed.server_info()["peers"] == addresses[:2]
        assert name in held(owner(name, addresses[:2])) and world.info().tick == 0
        dns.hosts.clear()                                        # a DNS failure keeps the set it had
        for server in servers.values():
            server.running.service.replicas.refresh()
            assert server.running.service.replicas.members == addresses[:2]


def test_a_server_without_peers_is_the_whole_ring_and_moving_is_an_unavailable():
    server = ServerThread()
    try:
        with Client(f"dns:///127.0.0.1:{server.running.port}") as client:
            assert client.server_info()["peers"] == [] and client.list_worlds() == []
    finally:
        server.stop()
    assert issubclass(Moving, Unavailable)


def test_an_async_client_of_a_dns_target_streams_on_its_first_call(dns_replicas):
    target, _, servers = dns_replicas
    addresses = sorted(servers)

    async def run():
        async with AsyncClient(target) as routed:
            world = routed.world(next(f"first-{i}" for i in range(100) if owner(f"first-{i}", addresses) == addresses[1]))
            async with AsyncClient(addresses[1]) as direct:
                await direct.create_world(world.name)
            async with world.stream() as stream:
                return (await stream.apply(create=([1], [[0, 0, 0, 1, 1, 1]]))).tick, world.name

    tick, name = asyncio.run(run())
    assert tick == 1 and held(addresses[1])[name].proxies == 1


def test_a_stream_hears_the_move_and_the_next_stream_goes_where_the_world_went(joined):
    name = joined.names("streamed", 1)[0]
    source = owner(name, joined.old)
    with Client(joined.old) as client:
        world = client.create_world(name)
        with world.stream() as stream:
            assert stream.apply(create=([1], [[0, 0, 0, 1, 1, 1]])).tick == 1
            world.begin_move(joined.new)
            with pytest.raises(Moving, match=f"moving to {joined.new}") as refused:
                stream.apply(move=([1], [[1, 1, 1, 2, 2, 2]]))
            assert refused.value.destination == joined.new
            rebalance(joined.targets, Client, say=quiet)
            with pytest.raises(WrongServer) as redirected:
                stream.apply(move=([1], [[1, 1, 1, 2, 2, 2]]), expected_tick=1)
            assert redirected.value.owner == joined.new
        with world.stream() as stream:                            # straight to the new server
            assert stream.apply(move=([1], [[1, 1, 1, 2, 2, 2]]), expected_tick=1).tick == 2
    assert held(joined.new)[name].tick == 2 and name not in held(source)


def test_a_query_stream_says_where_a_world_moves_and_the_sdk_follows_it(joined):
    name = joined.names("asked", 1)[0]
    source = owner(name, joined.old)
    box = np.array([[0, 0, 0, 1, 1, 1]], "<f4")
    query = pb.QueryRequest(aabb=pb.QueryAabbRequest(world=name, count=1, boxes=box.tobytes()))
    with Client(source) as client, grpc.insecure_channel(source) as channel:
        world = client.create_world(name)
        world.apply(create=([1], box))
        assert world.query_aabb(box).hits.tolist() == [1]         # the client's query stream is open
        world.begin_move(joined.new)
        (moving,) = pb_grpc.BroadphaseServiceStub(channel).StreamQueries(
            iter([pb.StreamQueriesRequest(sequence=1, query=query)]), timeout=30)
        assert (moving.status_code, moving.world_server) == (grpc.StatusCode.UNAVAILABLE.value[0], joined.new)
        rebalance(joined.targets, Client, say=quiet)
        (moved,) = pb_grpc.BroadphaseServiceStub(channel).StreamQueries(
            iter([pb.StreamQueriesRequest(sequence=2, query=query)]), timeout=30)
        assert (moved.status_code, moved.world_server) == (grpc.StatusCode.FAILED_PRECONDITION.value[0], joined.new)
        answer = world.query_aabb(box)                            # refused on the stream, asked at the owner
        assert answer.hits.tolist() == [1] and answer.tick == 1
    assert name in held(joined.new) and name not in held(source)


def test_a_move_to_a_malformed_destination_or_of_an_unknown_world_changes_nothing(joined):
    name = joined.names("bad", 1)[0]
    source = owner(name, joined.old)
    with Client(source) as client:
        world = client.create_world(name)
        world.apply(create=([1], [[0, 0, 0, 1, 1, 1]]))
        with pytest.raises(InvalidArgument, match="the destination must be host:port, not 'nowhere'"):
            world.begin_move("nowhere")
        with pytest.raises(NotFound, match="no world named 'absent'"):
            client.world("absent").begin_move(joined.new)
        info = world.info()
        assert (info.moving_to, info.tick) == ("", 1) and world.apply(move=([1], [[1, 1, 1, 2, 2, 2]])).tick == 2
        client.delete_world(name)
