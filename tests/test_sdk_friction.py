"""Frictions users met, each pinned down: reattaching to a world, targets without a port, shapes in
messages, the forms of create=/move=, margins beyond float32, huge names, overflow warnings, and a
stream whose server went away. Over gRPC and through Client.local(), with the same answers."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from dbvt_client import AlreadyExists, AsyncClient, Client, Create, InvalidArgument, NotFound, Unavailable
from dbvt_proto.v1 import broadphase_pb2 as pb
from servers import ServerThread, async_client

UNIT = np.array([[0, 0, 0, 1, 1, 1]], np.float32)


def stream_apply(world, **batch):
    with world.stream() as stream:
        return stream.apply(**batch)


def failure(call) -> tuple[type, str]:
    with pytest.raises(Exception) as caught:
        call()
    return type(caught.value), str(caught.value)


# ---- 1. create_world(..., exist_ok=True) ---------------------------------------------------------------
def test_exist_ok_returns_the_world_already_there(client):
    made = client.create_world("loop", dims=2, margin=0.1, max_proxies=500)
    made.apply(create=([7], UNIT[:, [0, 1, 3, 4]]))
    again = client.create_world("loop", dims=2, margin=0.1, exist_ok=True)
    assert again.info() == made.info() and again.info().proxies == 1
    assert client.create_world("loop", dims=2, margin=0.1, max_proxies=500, exist_ok=True).info().tick == 1
    assert client.create_world("fresh", exist_ok=True).info().proxies == 0
    assert client.list_worlds() == ["fresh", "loop"]


@pytest.mark.parametrize("settings, message", [
    (dict(margin=0.1), "world 'loop' exists with dims=2, not 3"),
    (dict(dims=2, margin=0.05), "world 'loop' exists with margin=0.1, not 0.05"),
    (dict(dims=2, margin=0.1, track_pairs=False), "world 'loop' exists with track_pairs=True, not False"),
    (dict(dims=2, margin=0.1, max_proxies=50), "world 'loop' exists with max_proxies=500, not 50"),
    (dict(dims=3, margin=0.0), "world 'loop' exists with dims=2, not 3; margin=0.1, not 0.0"),
])
def test_exist_ok_names_each_difference(client, settings, message):
    client.create_world("loop", dims=2, margin=0.1, max_proxies=500)
    with pytest.raises(AlreadyExists) as caught:
        client.create_world("loop", exist_ok=True, **settings)
    assert str(caught.value) == message
    with pytest.raises(AlreadyExists, match=r"a world named 'loop' already exists \(exist_ok=True returns it"):
        client.create_world("loop", dims=2, margin=0.1)


def test_create_world_response_says_whether_it_created(client):
    """`created`, for the server's log: true only for the call that made the world."""
    request = pb.CreateWorldRequest(name="loop", dims=2, exist_ok=True)
    answers = [client._transport.unary("CreateWorld", request) for _ in range(2)]
    assert [answer.created for answer in answers] == [True, False]
    assert answers[1].world.dims == 2


@pytest.mark.parametrize("arguments, message", [
    (dict(exist_ok="yes"), "create_world: exist_ok must be True or False, not 'yes'"),
    (dict(exist_ok=None), "create_world: exist_ok must be True or False, not None"),
    (dict(track_pairs=1), "create_world: track_pairs must be True or False, not 1"),
    (dict(dims=-1), "create_world: dims must be 2 or 3, not -1"),
    (dict(dims="3"), "create_world: dims must be 2 or 3, not '3'"),
    (dict(margin="0.1"), "create_world: margin must be a finite number >= 0, not '0.1'"),
    (dict(max_proxies=-5), "create_world: max_proxies must be None or an integer >= 0, not -5"),
    (dict(name=5), "create_world: the world name must be a str, not int"),
])
def test_create_world_names_the_bad_argument(client, arguments, message):
    with pytest.raises(InvalidArgument) as caught:
        client.create_world(**{"name": "loop", **arguments})
    assert str(caught.value) == message
    assert client.list_worlds() == []


def test_async_create_world_exist_ok(mode, server):
    async def scenario():
        async with async_client(mode, server) as client:
            made = await client.create_world("async-loop", dims=2)
            await made.apply(create=([1], [[0, 0, 1, 1]]))
            again = await client.create_world("async-loop", dims=2, exist_ok=True)
            with pytest.raises(AlreadyExists, match="world 'async-loop' exists with dims=2, not 3"):
                await client.create_world("async-loop", exist_ok=True)
            proxies = (await again.info()).proxies
            await client.delete_world("async-loop")
            return proxies

    assert asyncio.run(scenario()) == 1


# ---- 2. targets without a port ----------------------------------------------------------------------
@pytest.mark.parametrize("target", ["127.0.0.1", "localhost", "::1", "[::1]", "dns:///localhost", "dns:localhost",
                                    "ipv4:127.0.0.1", "ipv6:::1", "localhost:"])
@pytest.mark.parametrize("kind", [Client, AsyncClient])
def test_a_target_without_a_port_is_refused(kind, target):
    with pytest.raises(ValueError) as caught:
        kind(target)
    assert str(caught.value) == (f"target {target!r} has no port: give it as host:port, "
                                 f"such as '127.0.0.1:50051' or '[::1]:50051'")


def test_a_target_must_be_a_str():
    with pytest.raises(TypeError, match="target must be a str such as '127.0.0.1:50051', not 50051"):
        Client(50051)


@pytest.mark.parametrize("target", ["localhost:50051", "[::1]:50051", "dns:///localhost:50051",
                                    "dns://8.8.8.8/example.com:50051", "ipv4:127.0.0.1:1,127.0.0.2:2",
                                    "ipv6:[::1]:50051", "unix:relative.sock", "unix:///tmp/dbvt.sock"])
def test_targets_with_a_port_or_a_path_are_taken(target):
    Client(target).close()

    async def make():
        await AsyncClient(target).close()

    asyncio.run(make())


def test_scheme_forms_reach_the_server(server):
    port = server.target.rsplit(":", 1)[1]
    for target in (f"dns:///127.0.0.1:{port}", f"ipv4:127.0.0.1:{port}"):
        with Client(target) as client:
            assert client.server_info()["max_worlds"] > 0


# ---- 3. shapes, not bytes -----------------------------------------------------------------------------
@pytest.mark.parametrize("dims, call, message", [
    (3, lambda w: w.apply(create=([1], np.zeros((1, 4)))), "create_boxes must be (n, 6) for a 3-D world, got (1, 4)"),
    (3, lambda w: w.apply(move=([1], np.zeros((1, 4)))), "move_boxes must be (n, 6) for a 3-D world, got (1, 4)"),
    (2, lambda w: w.apply(create=([1, 2], np.zeros((2, 6)))),
     "create_boxes must be (n, 4) for a 2-D world, got (2, 6)"),
    (3, lambda w: w.query_aabb(np.zeros((5, 4))), "boxes must be (n, 6) for a 3-D world, got (5, 4)"),
    (3, lambda w: w.raycast(np.zeros((2, 4))), "segments must be (n, 6) for a 3-D world, got (2, 4)"),
    (3, lambda w: w.query_sphere(np.zeros((3, 2)), 1.0), "centers must be (n, 3) for a 3-D world, got (3, 2)"),
    (3, lambda w: w.query_frustum(np.zeros((1, 6, 3))), "planes must be (q, k, 4) for a 3-D world, got (1, 6, 3)"),
    (2, lambda w: w.query_frustum(np.zeros((2, 4, 4))), "planes must be (q, k, 3) for a 2-D world, got (2, 4, 4)"),
])
def test_wrong_widths_are_told_in_shapes(client, dims, call, message):
    world = client.create_world("shapes", dims=dims)
    with pytest.raises(InvalidArgument) as caught:
        call(world)
    assert str(caught.value) == message


def test_a_split_batch_is_told_in_the_whole_batch_s_shape():
    """A batch sent in parts is judged once its parts are joined: the shape named is the caller's."""
    server = ServerThread(max_message_bytes=16 * 1024)
    try:
        answers = []
        for client in (Client(server.target), Client.local()):
            with client:
                world = client.create_world("split")
                answers.append(failure(lambda: world.apply(create=(np.arange(5000), np.zeros((5000, 4))))))
        expected = (InvalidArgument, "create_boxes must be (n, 6) for a 3-D world, got (5000, 4)")
        assert answers[0] == answers[1] == expected
    finally:
        server.stop()


def test_a_scalar_radius_serves_every_center(client):
    world = client.create_world("spheres")
    world.apply(create=([1, 2], np.array([[0, 0, 0, 1, 1, 1], [5, 5, 5, 6, 6, 6]], np.float32)))
    offsets, hits = world.query_sphere(np.array([[0, 0, 0], [5, 5, 5], [9, 9, 9]], np.float32), 0.5)
    assert offsets.tolist() == [0, 1, 2, 2] and hits.tolist() == [1, 2]


# ---- 4. create= and move= need (ids, boxes) -----------------------------------------------------------
CREATE_FORMS = "create= takes (ids, boxes) or Create(ids, boxes, static=, group=, mask=, sensor=), not "


@pytest.mark.parametrize("batch, message", [
    (dict(create=np.arange(4)), CREATE_FORMS + "an array of shape (4,)"),
    (dict(create=np.arange(2)), CREATE_FORMS + "an array of shape (2,)"),
    (dict(create=[[1], UNIT]), CREATE_FORMS + "a list"),
    (dict(create=([1], UNIT, True)), CREATE_FORMS + "a tuple of 3 items"),
    (dict(move=np.zeros((2, 6))), "move= takes (ids, boxes), not an array of shape (2, 6)"),
    (dict(move=Create([1], UNIT)), "move= takes (ids, boxes), not a Create"),
])
def test_a_bare_array_for_create_or_move_is_a_type_error(client, batch, message):
    world = client.create_world("forms")
    for apply in (world.apply, lambda **batch: stream_apply(world, **batch)):
        with pytest.raises(TypeError) as caught:
            apply(**batch)
        assert str(caught.value) == message
    assert world.info().tick == 0


# ---- 5. margins beyond float32 ------------------------------------------------------------------------
@pytest.mark.parametrize("margin", [1e300, 3.5e38])
def test_a_margin_beyond_float32_is_refused(client, margin):
    with pytest.raises(InvalidArgument) as caught:
        client.create_world("wide", margin=margin)
    assert str(caught.value) == ("margin must be a finite number >= 0 that fits a float32 (at most 3.4028235e+38), "
                                 f"not {margin}")
    assert client.list_worlds() == []
    assert client.create_world("wide", margin=3.4e38).info().margin == 3.4e38


# ---- 6. huge names are cut in messages -----------------------------------------------------------------
# 10 KB each; the second is also 10,000 characters once its message is percent-encoded three times over.
HUGE_NAMES = ["x" * 10_000, "é" * 5_000]


@pytest.mark.parametrize("name", HUGE_NAMES, ids=["ascii", "accented"])
def test_a_huge_name_is_cut_in_every_message(client, name):
    shown = f"{name[:40] + '…'!r} ({len(name)} characters)"
    for _ in range(5):  # past gRPC's soft metadata limit, a message was refused only now and then
        with pytest.raises(InvalidArgument) as caught:
            client.create_world(name)
        assert str(caught.value) == f"world name must be 1 to 128 printable characters, not {shown}"
        for call in (client.world(name).pairs, client.world(name).stats, lambda: client.delete_world(name),
                     lambda: client.world(name).apply(destroy=[1]), lambda: stream_apply(client.world(name))):
            with pytest.raises(NotFound) as caught:
                call()
            assert str(caught.value) == f"no world named {shown}"


def test_a_long_valid_name_is_cut_too(client):
    name = "n" * 100
    client.create_world(name)
    with pytest.raises(AlreadyExists, match=r"^world 'n{40}…' \(100 characters\) exists with dims=3, not 2$"):
        client.create_world(name, dims=2, exist_ok=True)
    with pytest.raises(AlreadyExists, match=r"^a world named 'n{40}…' \(100 characters\) already exists"):
        client.create_world(name)


# ---- 7. no overflow warning before the error ----------------------------------------------------------
@pytest.mark.filterwarnings("error")
def test_values_beyond_float32_raise_without_a_warning(client):
    world = client.create_world("huge-values")
    with pytest.raises(InvalidArgument, match="create_boxes row 0: NaN or infinite value"):
        world.apply(create=([1], [[0, 0, 0, 1e40, 1, 1]]))
    with pytest.raises(InvalidArgument, match="boxes row 0: NaN or infinite value"):
        world.query_aabb([[0, 0, 0, 1e40, 1, 1]])
    with pytest.raises(InvalidArgument, match="radii row 0: NaN or infinite value"):
        world.query_sphere([[0, 0, 0]], 1e40)


# ---- 8. a stream whose server went away ---------------------------------------------------------------
SERVER_CLOSED = r"^the server closed the batch stream \(.+\)$"


def test_a_stream_says_its_server_closed_it():
    server = ServerThread()
    with Client(server.target) as client:
        stream = client.create_world("cut").stream()
        assert stream.apply().tick == 1
        server.stop()
        with pytest.raises(Unavailable, match=SERVER_CLOSED):
            stream.apply()
        stream.close()


def test_an_async_stream_says_its_server_closed_it():
    async def scenario():
        server = ServerThread()
        async with AsyncClient(server.target) as client:
            world = await client.create_world("cut")
            # A stream read by nobody, to write on once its call has ended: asyncio's InvalidStateError then.
            unread = client._transport.open_stream("cut")
            await unread.write(pb.StreamBatchesRequest(world="cut", sequence=1))
            async with world.stream() as stream:
                assert (await stream.apply()).tick == 2
                await asyncio.to_thread(server.stop)
                with pytest.raises(Unavailable, match=SERVER_CLOSED):
                    await stream.apply()
            with pytest.raises(Unavailable, match=SERVER_CLOSED):
                await unread.write(pb.StreamBatchesRequest(world="cut", sequence=2))

    asyncio.run(scenario())


# ---- local and remote answer alike ---------------------------------------------------------------------
BAD_CALLS = {
    "exists": lambda c: c.create_world("w"),
    "exist_ok differs": lambda c: c.create_world("w", dims=2, margin=1.0, track_pairs=False, exist_ok=True),
    "exist_ok type": lambda c: c.create_world("w", exist_ok=1),
    "margin": lambda c: c.create_world("m", margin=1e39),
    "huge name": lambda c: c.create_world("\0" * 10_000),
    "not found": lambda c: c.world("é" * 5_000).pairs(),
    "width": lambda c: c.world("w").apply(create=([1], np.zeros((1, 4)))),
    "streamed width": lambda c: stream_apply(c.world("w"), move=([1], np.zeros((1, 2)))),
    "query width": lambda c: c.world("w").query_frustum(np.zeros((2, 6, 3))),
    "bare create": lambda c: c.world("w").apply(create=np.zeros((1, 6))),
    "overflow": lambda c: c.world("w").apply(move=([1], [[1e40] * 6])),
}


@pytest.mark.parametrize("call", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_local_and_remote_answer_alike(server, call):
    with Client(server.target) as remote, Client.local() as local:
        answers = []
        for client in (remote, local):
            client.create_world("w")
            answers.append(failure(lambda: call(client)))
            client.delete_world("w")
        assert answers[0] == answers[1]


@pytest.mark.parametrize("made", [Client.local, AsyncClient.local])
@pytest.mark.parametrize("settings, error, told", [
    ({"max_worlds": 0}, ValueError, "local(max_worlds=0): max_worlds must be positive"),
    ({"max_proxies_per_world": -1}, ValueError, "local(max_proxies_per_world=-1): max_proxies_per_world must be positive"),
    ({"max_worlds": "3"}, TypeError, "local(max_worlds='3'): max_worlds must be int"),
    ({"max_proxies_per_world": True}, TypeError, "local(max_proxies_per_world=True): max_proxies_per_world must be int"),
])
def test_local_limits_are_checked_when_made(made, settings, error, told):
    assert failure(lambda: made(**settings)) == (error, told)
