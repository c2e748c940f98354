"""A batch stream's ends: every submitted future is resolved, whatever ends the stream; closing is
safe at any time; a closed stream says so."""
from __future__ import annotations

import asyncio
import queue
import threading
import time

import numpy as np
import pytest

from dbvt_client import AsyncClient, Client, Create, DbvtError, InvalidArgument, Unavailable
from dbvt_proto.v1 import broadphase_pb2 as pb
from servers import async_client, batch_stream_peer

GUARD = 20  # seconds: a regression fails here instead of hanging the suite
BOXES = np.array([[0, 0, 0, 1, 1, 1], [0.5, 0.5, 0.5, 2, 2, 2]], np.float32)
MANY = 50_000
# What every call of a closed client, and every stream and feed its closing cut, raises.
CLOSED = "the client is closed"


def many_boxes() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    low = rng.uniform(0, 100, (MANY, 3))
    return np.arange(MANY, dtype=np.uint64), np.concatenate([low, low + 1], 1).astype(np.float32)


def wrong_answers(requests, context):
    """A peer that speaks the protocol wrongly: its answer to the first batch has a begun column of
    7 bytes, which no batch result can have; the second is a proper answer."""
    for number, request in enumerate(requests):
        begun = b"1234567" if number == 0 else b""
        yield pb.StreamBatchesResponse(sequence=request.sequence, result=pb.BatchResult(tick=number + 1, begun=begun))


def test_an_answer_that_cannot_be_decoded_fails_its_batch_not_the_caller():
    with batch_stream_peer(wrong_answers) as target, Client(target) as client:
        client._max_message_bytes = 1 << 20     # the peer has no GetServerInfo
        with client.world("w").stream() as stream:
            first = stream.submit(destroy=[1])
            with pytest.raises(InvalidArgument, match="begun"):
                first.result(GUARD)
            assert stream.submit(destroy=[2]).result(GUARD).tick == 2


def test_closing_the_client_under_an_open_stream_resolves_its_batches(server):
    ids, boxes = many_boxes()
    client = Client(server.target)
    world = client.create_world("closed-under")
    stream = world.stream()
    pending = [stream.submit(create=(ids[i::4], boxes[i::4])) for i in range(4)]
    client.close()
    for future in pending:
        try:
            future.result(GUARD)
        except DbvtError as error:
            assert isinstance(error, Unavailable) and str(error) == CLOSED, error
    stream.close()
    with pytest.raises(Unavailable, match="the batch stream is closed"):
        stream.submit(destroy=[1])
    with Client(server.target) as again:
        again.delete_world("closed-under")


def test_async_closing_the_client_under_an_open_stream_resolves_its_batches(server):
    ids, boxes = many_boxes()

    async def drive():
        client = AsyncClient(server.target)
        world = await client.create_world("async-closed-under")
        stream = world.stream()
        await stream.__aenter__()
        assert (await stream.apply(create=(ids[:2], boxes[:2]))).tick == 1
        pending = [await stream.submit(create=(ids[2 + i::4], boxes[2 + i::4])) for i in range(4)]
        await client.close()
        for future in pending:
            try:
                await asyncio.wait_for(future, GUARD)
            except Unavailable as error:
                assert str(error) == CLOSED, error
        await asyncio.wait_for(stream.close(), GUARD)
        with pytest.raises(Unavailable):
            await stream.submit(destroy=[1])
        async with AsyncClient(server.target) as again:
            await again.delete_world("async-closed-under")

    asyncio.run(drive())


def test_async_a_closed_stream_says_it_is_closed(server):
    async def drive():
        async with AsyncClient(server.target) as client:
            world = await client.create_world("async-closed")
            unopened = world.stream()
            with pytest.raises(Unavailable, match="not open"):
                await unopened.submit(destroy=[1])
            async with world.stream() as stream:
                await stream.apply(create=([1, 2], BOXES))
            with pytest.raises(Unavailable, match="the batch stream is closed"):
                await stream.submit(destroy=[1])
            await stream.close()
            await client.delete_world("async-closed")

    asyncio.run(drive())


def test_scalar_radius_serves_every_center(server):
    async def drive():
        async with AsyncClient(server.target) as client:
            world = await client.create_world("async-radius")
            await world.apply(create=([1, 2], BOXES))
            hits = await world.query_sphere(np.zeros((2, 3)), 0.1)
            assert hits.offsets.tolist() == [0, 1, 2] and hits.hits.tolist() == [1, 1]
            await client.delete_world("async-radius")

    asyncio.run(drive())
    with Client(server.target) as client:
        world = client.create_world("radius")
        world.apply(create=([1, 2], BOXES))
        assert world.query_sphere(np.zeros((3, 3)), 0.1).offsets.tolist() == [0, 1, 2, 3]
        client.delete_world("radius")



@pytest.mark.parametrize("mode", ["grpc", "local"])
def test_every_call_of_a_closed_client_says_it_is_closed(server, mode):
    """Not gRPC's ValueError about its channel, which would read as a bad argument; and Client.local()
    as a remote client."""
    client = Client(server.target) if mode == "grpc" else Client.local()
    world = client.create_world(f"closed-sync-{mode}")
    client.close()
    calls = [client.list_worlds, world.info, lambda: world.apply(create=([1], BOXES[:1])),
             lambda: world.query_aabb(BOXES), lambda: world.stream().apply(move=([1], BOXES[:1])),
             lambda: next(iter(world.watch()))]
    for call in calls:
        with pytest.raises(Unavailable, match=CLOSED):
            call()
    with Client(server.target) as other:
        if world.name in other.list_worlds():
            other.delete_world(world.name)


@pytest.mark.parametrize("mode", ["grpc", "local"])
def test_every_call_of_a_closed_async_client_says_it_is_closed(server, mode):
    async def drive():
        client = async_client(mode, server)
        world = await client.create_world(f"closed-async-{mode}")
        await client.close()
        calls = [client.list_worlds, world.info, lambda: world.apply(create=([1], BOXES[:1])),
                 lambda: world.query_aabb(BOXES), world.stream().__aenter__, world.watch]
        for call in calls:
            with pytest.raises(Unavailable, match=CLOSED):
                await call()
        async with AsyncClient(server.target) as other:
            if world.name in await other.list_worlds():
                await other.delete_world(world.name)

    asyncio.run(drive())


@pytest.mark.parametrize("mode", ["grpc", "local"])
def test_closing_a_client_ends_its_sensor_feeds_saying_so(server, mode):
    """A feed read on another thread (or task) when its client closes: it raises what every call of
    a closed client does, at once, where it had raised Cancelled, CancelledError into a task nobody
    cancelled, or (in process) gone on for ever."""
    sensor = Create([1], BOXES[:1], sensor="box")
    client = Client(server.target) if mode == "grpc" else Client.local()
    world = client.create_world(f"fed-sync-{mode}")
    world.apply(create=sensor)
    feed = world.watch()
    next(feed)                                           # the resync: the feed is open
    ended: queue.SimpleQueue = queue.SimpleQueue()

    def read():
        try:
            for _ in feed:
                pass
            ended.put("the feed ended without an error")
        except Exception as error:
            ended.put(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(0.05)
    client.close()
    reader.join(GUARD)
    assert not reader.is_alive(), "the feed went on after its client closed"
    error = ended.get_nowait()
    assert isinstance(error, Unavailable) and str(error) == CLOSED, error

    async def drive():
        client = async_client(mode, server)
        world = await client.create_world(f"fed-async-{mode}")
        await world.apply(create=sensor)
        feed = await world.watch()
        await feed.__anext__()

        async def read():
            async for _ in feed:
                pass

        reading = asyncio.ensure_future(read())
        await asyncio.sleep(0.05)
        await client.close()
        with pytest.raises(Unavailable, match=CLOSED):
            await asyncio.wait_for(reading, GUARD)

    asyncio.run(drive())
    with Client(server.target) as other:
        for name in set(other.list_worlds()) & {f"fed-sync-{mode}", f"fed-async-{mode}"}:
            other.delete_world(name)
