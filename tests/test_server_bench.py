"""`dbvt-bench wire` given no directory: it makes W1 data with its exact answers, runs end to end,
prints every figure between the header and the closing load average, and its pair counts after
every step equal expected.json's."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from dbvt_server.bench.__main__ import main

# A target's line: the median and range of its figure, the target, and the verdict.
VERDICT = r"-?\d+\.\d\d \(-?\d+\.\d\d--?\d+\.\d\d\)  [<>]= [\d.]+( ms|x): (met|NOT met) \(\d of \d (runs|rounds)\)"


def test_wire_bench_makes_its_w1_data_and_runs(capsys):
    argv = ["wire", "--n", "3000", "--steps", "4", "--repeats", "1", "--window", "0.2"]
    assert main(argv) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0] == "command: dbvt-bench " + " ".join(argv)
    assert lines[1].startswith("machine: ") and lines[2].startswith("load average (1/5/15 min) at start: ")
    assert lines[-1].startswith("load average (1/5/15 min) at end: ")
    assert "N=3000, 4 steps of 300 moves" in out.out
    for figure in ("streamed step, tick by tick", "bare gRPC, same sizes and work",
                   "bare gRPC making the same dbvt calls", "the step beyond it", "streamed step, 2 ticks in flight",
                   "the broadphase itself, ms", "the rest beyond bare gRPC, ms", "around the dbvt calls, beyond it, ms",
                   "the bare step around its calls, ms",
                   "on the query stream, x a unary call", "1 box query, ms",
                   "M moves/s with pair changes",
                   "move-only ingest (query-only world)",
                   "10k box queries", "10k-query calls/s, server", "10k-query calls/s, in-process",
                   "W1 steps/s, streamed, server", "W1 steps/s, streamed, in-process",
                   "10k-query calls/s, bare gRPC", "W1 steps/s, streamed, bare gRPC"):
        assert figure in out.out
    # The bench started the server and the bare server itself, so it knows their processes and shows
    # the cores each used.
    for where in (", server ", ", bare gRPC "):
        server_lines = [line for line in lines if where in line]
        assert len(server_lines) == 2 and not any("n/a" in line for line in server_lines)
    assert "pair counts after every step match the oracle's expected.json" in out.out
    # Each of the steps (4 here) paired on every one of the new pairs of worlds.
    assert "(median of 30 pairs a run, 10 pairs of worlds; quartiles" in out.out
    # Each wire target of issue 17, as the issue states it, with its median, range and verdict.
    for target in ("streamed step, 2 ticks in flight, x in-process",
                   "tick by tick, beyond bare gRPC making the same calls, ms",
                   "the same beyond the busy-waiting floor, ms",
                   "move-only ingest, x in-process throughput", "box queries in one call, x in-process",
                   "two busy worlds, query calls: scaling, x in-process scaling",
                   "two busy worlds, W1 steps: scaling, x in-process scaling"):
        line = next(line for line in lines if target in line)
        assert re.search(VERDICT, line), line
    # Beside each two-busy-worlds target, the same against the bare server making the same calls.
    beside_bare = [line for line in lines if "the same, x bare gRPC's scaling" in line]
    assert len(beside_bare) == 2 and all(re.search(VERDICT, line) for line in beside_bare)
    assert "no directory given: making W1 data" in out.err
    assert "server run 1/1: 4 steps\n" in out.err and "\r" not in out.err, "one plain line per phase"
    # The box queries and the ingest are timed in pairs, the server's and the in-process one's back to back.
    assert "box queries and ingest, in pairs, run 1/1\n" in out.err


def test_paired_calls_time_each_sides_second_call_of_two_alternately_first():
    """No pair sets a side's warm call against the other's cold one: each side runs twice in a row and
    the second run is timed, and the side that goes first alternates."""
    from dbvt_server.bench.wire import in_pairs

    calls = []
    wire, local = in_pairs(lambda: calls.append("w"), lambda: calls.append("l"), 3)
    assert "".join(calls) == "wwll" + "llww" + "wwll"
    assert len(wire) == len(local) == 3 and all(seconds >= 0 for seconds in wire + local)


def test_calls_in_turns_start_each_round_with_the_next_side():
    """The box queries' three sides (server, bare server, in process): each round starts one side
    later, each side's second call of two timed."""
    from dbvt_server.bench.wire import in_turns

    calls = []
    seconds = in_turns([lambda name=name: calls.append(name) for name in "sbl"], 4)
    assert "".join(calls) == "ssbbll" + "bbllss" + "llssbb" + "ssbbll"
    assert [len(side) for side in seconds] == [4, 4, 4]


def test_two_worlds_count_only_the_work_inside_the_window():
    from dbvt_server.bench.parallel import completed_by

    stamps = [1.0, 2.0, 3.0, 4.0]
    # Half of the second operation and half of the fourth fall inside [1.5, 3.5].
    assert completed_by(stamps, 3.5) - completed_by(stamps, 1.5) == 2.0
    for outside in (0.5, 4.5):
        with pytest.raises(RuntimeError, match="not busy for the whole window"):
            completed_by(stamps, outside)


@pytest.mark.parametrize("command, target", [("secured", "<= 1.10"), ("metrics", "<= 1.03"), ("socket", "-")])
def test_paired_benches_compare_a_setting_with_its_absence(capsys, command, target):
    argv = [command, "--n", "2000", "--steps", "3", "--repeats", "2"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[-1].startswith("load average (1/5/15 min) at end: ")
    assert "W1: N=2000, 3 steps of 200 moves, 10000 box queries; 2 paired runs" in out.out
    for label in ("streamed step, tick by tick, ms", "10k box queries in one call, ms"):
        [line] = [line for line in out.out.splitlines() if line.startswith(label)]
        without, with_it, ratio, spread, *stated = line[len(label):].split()
        low, high = (float(end) for end in spread.split("-"))
        assert 0 < low <= float(ratio) <= high and float(without) > 0 and float(with_it) > 0
        assert " ".join(stated) == target
    assert " run 2/2: 3 steps\n" in out.err


def test_persist_bench_times_steps_restarts_and_snapshots(capsys):
    argv = ["persist", "--n", "2000", "--steps", "3", "--repeats", "2", "--journaled", "20", "--snapshot-n", "3000"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("load average (1/5/15 min) at end: ")
    assert "W1: N=2000, 3 steps of 200 moves; 2 runs of each side" in out
    for side in ("no data dir", "everysec", "always"):
        [line] = [line for line in out.splitlines() if line.startswith(side + " ")]
        median, mean, ratio = (float(value) for value in line[len(side):].split()[:3])
        assert median > 0 and mean > 0 and ratio > 0
    for ending in ("SIGKILL", "SIGTERM"):
        [line] = [line for line in out.splitlines() if f"after {ending}: " in line]
        assert 0 < float(line.split(": ")[1].split()[0]) < 60
    assert "2,000 proxies" in out and "3,000 proxies" in out


def test_sensors_bench_times_the_step_a_watcher_and_more_watchers(capsys):
    argv = ["sensors", "--n", "2000", "--steps", "3", "--sensors", "20", "--radius", "4", "--repeats", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("load average (1/5/15 min) at end: ")
    assert "20 sphere sensors of radius 4, all moving; 1 runs" in out
    for label, target in (("step with sensors / plain step: median ", "target <= 2.0"),
                          ("a watcher hears a tick after its answer: median ", "target <= 1.0 ms"),
                          ("server CPU per step, 8 watchers / 1: median ", "target <= 1.10")):
        [line] = [line for line in out.splitlines() if line.startswith(label)]
        figure = float(line[len(label):].split()[0])
        # A watcher may hear of a tick before the writer has its answer: a latency may be negative.
        assert (figure > 0 or "watcher hears" in label) and line.endswith(target)
    [line] = [line for line in out.splitlines() if line.startswith("the same, the sensors out of step: median ")]
    assert float(line.split("median ")[1].split()[0]) > 0
    for line in out.splitlines():
        if line.startswith(("step with sensors / plain step: ", "the same, the sensors out of step: ")):
            assert float(line.split("plain step median ")[1].split(" ms")[0]) > 0      # the anchor


def test_queries_bench_times_every_query_checks_them_and_says_about_rtree(capsys):
    argv = ["queries", "--n", "2000", "--repeat", "3", "--points", "300", "--rtree-points", "50"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "command: dbvt-bench " + " ".join(argv)
    assert out.splitlines()[-1].startswith("load average (1/5/15 min) at end: ")
    for label in ("query_nearest, k = 8 ", "cast_box, all hits, moved 20 ", "cast_sphere, r = 2, moved 20 ",
                  "overlap of two W1 worlds "):
        [line] = [line for line in out.splitlines() if line.startswith(label)]
        median, spread = (cell.strip() for cell in line.split("|")[2:4])
        low, high = (float(end) for end in spread.split("-"))
        assert 0 < low <= float(median) <= high
    assert "MISMATCH" not in out and out.count("  OK ") >= 5
    assert "rtree nearest, k = 8" in out or "rtree: not installed" in out
    assert "threads inside one world: threads=2 against threads=1, wall time, 3 paired runs" in out
    assert "OK       threads=2: box queries and segments against threads=1: identical" in out
    for label in ("10000 box queries, side 10 ", "10000 segments, all hits "):
        [line] = [line for line in out.splitlines() if line.startswith(label)]
        serial, split, gain, spread = line[len(label):].split()
        low, high = (float(end) for end in spread.split("-"))
        assert float(serial) > 0 and float(split) > 0 and 0 < low <= float(gain) <= high


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_the_bench_starts_numpy_with_one_blas_thread(tmp_path):
    # Set after numpy's import, the setting is too late: OpenBLAS has started a thread a core, which
    # spins on the other core after any call and bills the benchmark's CPU time.
    env = {key: value for key, value in os.environ.items() if key != "OPENBLAS_NUM_THREADS"}
    count = "import os, dbvt_server.bench.__main__; print(len(os.listdir('/proc/self/task')))"
    out = subprocess.run([sys.executable, "-c", count], env=env, cwd=tmp_path, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "1"
