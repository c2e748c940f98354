"""dbvt-bench on a small W1 directory written here: it runs end to end, prints every figure, and its pair
counts after every step equal the brute-force expected.json beside the data."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dbvt.reference import Broadphase as Reference
from dbvt_server.bench import wire as bench


def write_w1(directory, work: bench.Workload) -> None:
    """The W1 directory format: raw little-endian arrays plus meta.json (and the oracle's expected.json)."""
    steps, moves = work.move_ids.shape
    work.boxes.astype("<f4").tofile(directory / "boxes.f32")
    work.move_ids.astype("<u4").tofile(directory / "moves_ids.u32")
    work.move_boxes.astype("<f4").tofile(directory / "moves_box.f32")
    work.queries.astype("<f4").tofile(directory / "q_aabb.f32")
    (directory / "meta.json").write_text(json.dumps({"n": len(work.boxes), "steps": steps, "moves_per_step": moves}))
    reference = Reference()
    reference.create(work.ids, work.boxes)
    counts = []
    for step in range(steps):
        reference.move(work.move_ids[step], work.move_boxes[step])
        counts.append(len(reference.pairs()))
    (directory / "expected.json").write_text(json.dumps({"pairs_per_step": counts}))


def test_bench_on_a_w1_directory(tmp_path, capsys):
    write_w1(tmp_path, bench.Workload.generate(3000, steps=4, seed=5))
    assert bench.main([str(tmp_path), "--steps", "4", "--repeats", "1", "--window", "0.2"]) == 0
    out = capsys.readouterr()
    assert "N=3000, 4 steps of 300 moves" in out.out
    for figure in ("streamed step, tick by tick", "bare gRPC, same sizes and work", "streamed step, 2 ticks in flight",
                   "M moves/s with pair changes",
                   "move-only ingest (query-only world)",
                   "10k box queries", "10k-query calls/s, server", "10k-query calls/s, in-process",
                   "W1 steps/s, streamed, server", "W1 steps/s, streamed, in-process"):
        assert figure in out.out
    # The bench started the server itself, so it knows its process and shows the cores it used.
    server_lines = [line for line in out.out.splitlines() if ", server " in line]
    assert len(server_lines) == 2 and not any("n/a" in line for line in server_lines)
    assert "pair counts after every step match the oracle's expected.json" in out.out
    assert "4/4" in out.err, "the progress bar"


def test_generated_world_follows_w1():
    work = bench.Workload.generate(1000, steps=2)
    sides = work.boxes[:, 3:] - work.boxes[:, :3]
    assert work.move_ids.shape == (2, 100) and work.move_boxes.shape == (2, 100, 6)
    assert sides.min() >= 1.0 and sides.max() <= 4.0
    assert np.all(np.diff(work.move_ids, axis=1) > 0)


def test_two_worlds_count_only_the_work_inside_the_window():
    from dbvt_server.bench.parallel import completed_by

    stamps = [1.0, 2.0, 3.0, 4.0]
    # Half of the second operation and half of the fourth fall inside [1.5, 3.5].
    assert completed_by(stamps, 3.5) - completed_by(stamps, 1.5) == 2.0
    for outside in (0.5, 4.5):
        with pytest.raises(RuntimeError, match="not busy for the whole window"):
            completed_by(stamps, outside)
