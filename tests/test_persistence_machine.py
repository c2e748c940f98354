"""Restart safety as a state machine: a persistent world with sensors takes random batches (some
refused, for a bad row or for its pair limit) and snapshots, and its server is killed (kill -9) and
started again on the same data directory, beside the brute-force reference (dbvt.reference) of what
it must hold. Every batch's answer is the reference's update, and after every restart the world is
the reference's exactly: tick, incarnation, proxies, pairs, sensor pairs and where every box is. So a
refused batch, whose journal record the server took back, never comes back, and the sensors' history
(who is inside depends on it) survives replay.
"""
from __future__ import annotations

import copy
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from dbvt import reference
from dbvt_client import Client, InvalidArgument, ResourceExhausted
from servers import ServerProcess
from worlds import assert_a_pair_limit_refusal, assert_same_csr, assert_same_pairs

pytestmark = pytest.mark.slow

DIMS = 2
LIMIT = 12
SENSOR_MARGIN = 0.5
lattice = st.integers(0, 5).map(float)
side = st.sampled_from([0.0, 1.0, 2.0, 3.0])
box = st.tuples(lattice, lattice, side, side).map(lambda b: [b[0], b[1], b[0] + b[2], b[1] + b[3]])
kind = st.sampled_from([0, 0, 0, 0, 1, 2])


def rows(boxes: list) -> np.ndarray:
    return np.array(boxes, np.float32).reshape(-1, 2 * DIMS)


class RestartMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="dbvt-restarts-")
        self.server = self.client = None
        self.truth = reference.Broadphase(dims=DIMS, margin=0.0, sensor_margin=SENSOR_MARGIN)
        self.live: set[int] = set()
        self._start()
        info = self.client.create_world("w", dims=DIMS, margin=0.0, max_pairs=LIMIT,
                                        sensor_margin=SENSOR_MARGIN).info()
        self.tick, self.incarnation = info.tick, info.incarnation

    def _start(self) -> None:
        self.server = ServerProcess("--data-dir", self.folder)
        self.client = Client(self.server.target)

    def teardown(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.server is not None:
            self.server.kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def world(self):
        return self.client.world("w")

    @rule(data=st.data())
    def batch(self, data):
        """Creates (some of them sensors), moves and destroys, applied whole or refused whole."""
        fresh = [i for i in data.draw(st.lists(st.integers(0, 40), max_size=6, unique=True)) if i not in self.live]
        moved = data.draw(st.lists(st.sampled_from(sorted(self.live)), max_size=6, unique=True)) if self.live else []
        gone = [i for i in self.live if i not in moved and data.draw(st.integers(0, 9)) == 0]
        create = (np.array(fresh, np.uint64), rows([data.draw(box) for _ in fresh]))
        sensor = np.array([data.draw(kind) for _ in fresh], np.uint8)
        move = (np.array(moved, np.uint64), rows([data.draw(box) for _ in moved]))
        trial = copy.deepcopy(self.truth)
        trial.create(*create, sensor=sensor)
        trial.move(*move)
        trial.destroy(np.array(gone, np.uint64))
        begun, ended = trial.update()
        try:
            result = self.world.apply(create=create, sensor=sensor, move=move, destroy=gone)
        except ResourceExhausted as refusal:
            assert_a_pair_limit_refusal(refusal, len(trial.pairs()), LIMIT)
            event("a batch refused for its pairs")
            assert self.world.info().tick == self.tick
            return
        assert len(trial.pairs()) <= LIMIT
        self.tick += 1
        assert (result.tick, result.incarnation) == (self.tick, self.incarnation)
        assert_same_pairs(result.begun, begun, "begun")
        assert_same_pairs(result.ended, ended, "ended")
        entered, left = trial.sensor_events()
        assert_same_pairs(result.entered, entered, "entered")
        assert_same_pairs(result.left, left, "left")
        self.truth = trial
        self.live = (self.live | set(fresh)) - set(gone)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), fault=st.sampled_from(["nan", "inverted", "unknown id"]))
    def bad_moves(self, data, fault):
        """A batch of moves alone is checked by the core after its journal record is written: the
        record is taken back, and the tick does not move."""
        moved = data.draw(st.lists(st.sampled_from(sorted(self.live)), min_size=1, max_size=4, unique=True))
        boxes = rows([data.draw(box) for _ in moved])
        ids = np.array(moved, np.uint64)
        if fault == "nan":
            boxes[-1, 0] = np.nan
        elif fault == "inverted":
            boxes[-1, 0] = boxes[-1, DIMS] + 1
        else:
            ids[-1] = next(i for i in range(1000, 2000) if i not in self.live)
        with pytest.raises(InvalidArgument):
            self.world.apply(move=(ids, boxes))
        assert self.world.info().tick == self.tick

    @rule()
    def snapshot(self):
        assert self.world.snapshot().tick == self.tick

    @rule()
    def kill_and_restart(self):
        """kill -9, and a new server on the same data directory: the world as the reference holds it."""
        self.client.close()
        self.server.kill()
        self._start()
        info = self.world.info()
        assert (info.tick, info.incarnation, info.proxies) == (self.tick, self.incarnation, len(self.live))
        event("a restart with sensor pairs inside" if len(self.truth.sensor_pairs()) else "a restart")
        assert_same_pairs(self.world.pairs(), self.truth.pairs())
        assert_same_pairs(self.world.sensor_pairs(), self.truth.sensor_pairs(), "sensor pairs")
        if self.live:
            # Each box as a query, and each box's corners as points: any box that moved changes a hit.
            held = self.truth.get(np.array(sorted(self.live), np.uint64))
            lows, highs = held[:, :DIMS], held[:, DIMS:]
            probes = np.concatenate([held, np.hstack([lows, lows]), np.hstack([highs, highs])])
            assert_same_csr(self.world.query_aabb(probes, include_sensors=True),
                            self.truth.query_aabb(probes, include_sensors=True))


TestRestartMachine = RestartMachine.TestCase
TestRestartMachine.settings = settings(max_examples=15, stateful_step_count=14, deadline=None)
