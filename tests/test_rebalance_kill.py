"""kill -9 during moves: a fourth server joins three that keep their worlds in data directories, and
servers are killed while worlds move; after each restart, running the rebalance again finishes every
move, and every world is on exactly its owner, answering as before the move."""
from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from dbvt_client import Client, DbvtError
from dbvt_client.routing import owner
from dbvt_server.rebalance import rebalance
from servers import ServerProcess
from test_rebalance import answers, fill, held
from test_sdk_routing import free_ports

pytestmark = pytest.mark.slow


class Replica:
    def __init__(self, target: str, peers: list[str], data_dir):
        self.target, self.peers, self.data_dir = target, peers, data_dir
        self.process = self.start()

    def start(self) -> ServerProcess:
        return ServerProcess("--port", self.target.rpartition(":")[2], "--peers", ",".join(self.peers),
                             "--advertise", self.target, "--data-dir", str(self.data_dir), "--fsync", "always")

    def kill_and_restart(self) -> None:
        self.process.kill()
        self.process = self.start()


def quiet(line: str) -> None:
    pass


def test_servers_killed_during_moves_lose_no_world_and_serve_none_twice(tmp_path):
    targets = [f"127.0.0.1:{port}" for port in free_ports(4)]
    old, new = targets[:3], targets[3]
    replicas = {target: Replica(target, targets if target == new else old, tmp_path / f"data-{i}")
                for i, target in enumerate(targets)}
    try:
        names = [f"match-{i}" for i in range(60)]
        with Client(old) as routed:
            scenes = {name: fill(routed.create_world(name), seed) for seed, name in enumerate(names)}
            before = {name: answers(routed.world(name), scenes[name]) for name in names}
        moving = [name for name in names if owner(name, targets) == new]
        assert len(moving) >= 5

        # 1. A world frozen for its move, then its server killed: it comes back frozen, served by no one.
        frozen = moving[0]
        source = replicas[owner(frozen, old)]
        with Client(source.target) as client:
            client.world(frozen).begin_move(new)
        source.kill_and_restart()
        assert held(source.target)[frozen].moving_to == new and frozen not in held(new)

        # 2. The destination killed (kill -9) a few milliseconds after the mover's second move, so that
        #    it dies in the middle of a later one.
        failure: list = []
        killer = threading.Timer(random.Random(7).uniform(0.0, 0.01), replicas[new].process.process.kill)

        def said(line: str) -> None:
            if len(said.lines) == 1:
                killer.start()
            said.lines.append(line)

        said.lines = []
        try:
            rebalance(targets, Client, say=said)
        except DbvtError as exc:
            failure.append(exc)
        killer.join()
        assert failure and len(said.lines) < len(moving), "the kill came after the rebalance"
        replicas[new].kill_and_restart()

        # 3. Run again until done: every world on exactly its owner, as it was.
        rebalance(targets, Client, say=quiet)
        where = {target: held(target) for target in targets}
        for name in names:
            holders = [target for target in targets if name in where[target]]
            assert holders == [owner(name, targets)], (name, holders)
            assert where[holders[0]][name].moving_to == ""
        with Client(targets) as routed:
            for name in names:
                assert answers(routed.world(name), scenes[name]) == before[name], name
                routed.world(name).apply(move=([int(scenes[name].ids[0])], np.zeros((1, 6), np.float32)))
        # The moved worlds are kept on the destination's disk too.
        replicas[new].kill_and_restart()
        assert sorted(held(new)) == sorted(moving)
    finally:
        for replica in replicas.values():
            replica.process.kill()
