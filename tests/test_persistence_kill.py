"""Kill -9 at random points while several worlds take streamed W1 batches, and restart on the same data
directory: every world must come back exactly as a brute-force reference that applied the answered
batches, and each batch sent but not answered must be wholly in or wholly out, as `expected_tick` tells.
"""
from __future__ import annotations

import signal
import threading
from concurrent.futures import wait

import numpy as np
import pytest

from dbvt import reference
from dbvt_client import Client, TickMismatch, Unavailable
from servers import ServerProcess
from worlds import W1World

pytestmark = pytest.mark.slow

WORLDS = 3
PROXIES = 800
KILLS = 12
IN_FLIGHT = 4


class Game:
    """One world as its game server sees it: a W1 scene, the batches it sent with the tick each
    expected, and the brute-force reference of what the server must hold."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.scene = W1World(PROXIES, dims=3, seed=seed)
        self.reference = reference.Broadphase(dims=3, margin=0.05)
        self.incarnation = None
        self.extras = 0
        self.live_extras: list[int] = []

    def first_batch(self) -> dict:
        return {"create": (self.scene.ids, self.scene.boxes.astype(np.float32))}

    def next_batch(self, number: int) -> dict:
        """Moves of a tenth of the scene; now and then a few proxies created or destroyed."""
        ids, boxes = self.scene.step()
        batch = {"move": (ids, boxes.astype(np.float32))}
        if number % 5 == 0:
            created = np.arange(self.extras, self.extras + 3, dtype=np.uint64) + np.uint64(1 << 40)
            self.extras += 3
            batch["create"] = (created, self.scene.query_boxes(3, half=1.0).astype(np.float32))
            self.live_extras += created.tolist()
        elif number % 7 == 0 and self.live_extras:
            batch["destroy"] = np.array(self.live_extras[:2], np.uint64)
            del self.live_extras[:2]
        return batch

    def apply_to_reference(self, batch: dict) -> None:
        if "create" in batch:
            self.reference.create(*batch["create"])
        if "move" in batch:
            self.reference.move(*batch["move"])
        if "destroy" in batch:
            self.reference.destroy(batch["destroy"])


def _send_until_killed(client: Client, games: list[Game], sent: dict, server: ServerProcess, rng) -> dict:
    """Streamed batches on every world, round robin, with a kill -9 at a random moment; the futures."""
    futures = {game.name: [] for game in games}
    streams = {game.name: client.world(game.name).stream() for game in games}
    killer = threading.Timer(rng.uniform(0.05, 0.6), server.process.send_signal, (signal.SIGKILL,))
    killer.start()
    try:
        while server.process.poll() is None:
            for game in games:
                pending = [f for f in futures[game.name] if f is not None and not f.done()]
                if len(pending) >= IN_FLIGHT:
                    wait(pending, timeout=0.2, return_when="FIRST_COMPLETED")
                    continue
                tick = len(sent[game.name])
                batch = game.next_batch(tick)
                sent[game.name].append(batch)
                try:
                    futures[game.name].append(streams[game.name].submit(**batch, expected_tick=tick))
                except Unavailable:
                    futures[game.name].append(None)
    finally:
        killer.join()
        server.kill()
        for stream in streams.values():
            stream.close()
    return futures


def _settle(client: Client, game: Game, sent: list, futures: list, restored_tick: int) -> None:
    """Fold this round's batches into the reference: the answered ones, and each unanswered one once
    expected_tick has told whether it went in (those that did not are applied now)."""
    first = len(sent) - len(futures)
    for tick, (batch, future) in enumerate(zip(sent[first:], futures), start=first):
        answered = future is not None and future.done() and future.exception() is None
        if answered:
            assert future.result().tick == tick + 1
            assert tick + 1 <= restored_tick, f"{game.name}: answered batch of tick {tick + 1} was lost"
        else:
            try:
                client.world(game.name).apply(**batch, expected_tick=tick)
            except TickMismatch as mismatch:
                assert mismatch.tick > tick and mismatch.incarnation == game.incarnation
                assert tick < restored_tick
        game.apply_to_reference(batch)


def _assert_same(client: Client, game: Game, tick: int) -> None:
    world = client.world(game.name)
    info = world.info()
    assert (info.tick, info.incarnation, info.proxies) == (tick, game.incarnation, len(game.reference))
    np.testing.assert_array_equal(world.pairs(), game.reference.pairs())
    queries = game.scene.query_boxes(64, half=4.0).astype(np.float32)
    offsets, hits = world.query_aabb(queries)
    expected_offsets, expected_hits = game.reference.query_aabb(queries)
    np.testing.assert_array_equal(offsets, expected_offsets)
    for i in range(len(queries)):
        assert sorted(hits[offsets[i]:offsets[i + 1]]) == sorted(expected_hits[offsets[i]:offsets[i + 1]])


def test_kill_9_during_streamed_batches_loses_no_answered_batch(tmp_path):
    rng = np.random.default_rng(2026)
    games = [Game(f"match-{i}", seed=i) for i in range(WORLDS)]
    sent = {game.name: [] for game in games}
    server = ServerProcess("--data-dir", str(tmp_path), "--snapshot-seconds", "0.3", "--fsync", "everysec")
    with Client(server.target) as client:
        for game in games:
            world = client.create_world(game.name, dims=3)
            batch = game.first_batch()
            sent[game.name].append(batch)
            game.incarnation = world.apply(**batch, expected_tick=0).incarnation
            game.apply_to_reference(batch)
    for _ in range(KILLS):
        with Client(server.target) as client:
            futures = _send_until_killed(client, games, sent, server, rng)
        server = ServerProcess("--data-dir", str(tmp_path), "--snapshot-seconds", "0.3")
        with Client(server.target) as client:
            assert sorted(client.list_worlds()) == sorted(game.name for game in games)
            for game in games:
                restored_tick = client.world(game.name).info().tick
                _settle(client, game, sent[game.name], futures[game.name], restored_tick)
                _assert_same(client, game, len(sent[game.name]))
    server.terminate()
