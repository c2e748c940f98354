"""`dbvt-bench` as users run it: `workload` and `core` end to end on tiny data, through `main([...])`
and once through `python -m dbvt_server.bench`; every command opens with the command line, the
machine and the load average, closes with the load average, and redraws no progress bar in a log."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import dbvt
from dbvt_server.bench import console, core, workload
from dbvt_server.bench.__main__ import main

HEADER = ("command: dbvt-bench ", "machine: ", "load average (1/5/15 min) at start: ")


def assert_framed(out: str, argv: list[str]) -> None:
    lines = out.splitlines()
    assert [line[:len(start)] for line, start in zip(lines, HEADER)] == list(HEADER), lines[:3]
    assert lines[0] == "command: dbvt-bench " + " ".join(argv)
    assert " cores; " in lines[1] and "Python" in lines[1]
    assert lines[-1].startswith("load average (1/5/15 min) at end: ")


def run_main(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    assert "\r" not in out.out + out.err, "progress is redrawn only on a terminal"
    assert "Traceback" not in out.out + out.err
    assert_framed(out.out, argv)
    return code, out.out, out.err


@pytest.fixture(scope="module")
def w2_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("w2")
    workload.generate("W2", 600, 4, directory, dims=3)
    return directory


def test_workload_w1_writes_data_and_answers(tmp_path, capsys):
    argv = ["workload", "w1", "300", "2", str(tmp_path / "w1"), "--seed", "9"]
    code, out, _ = run_main(capsys, argv)
    assert code == 0 and "W1 3-D: N=300, 2 steps of 30 moves" in out
    meta = json.loads((tmp_path / "w1" / "meta.json").read_text())
    assert meta["seed"] == 9 and meta["workload"] == "W1"
    assert len(json.loads((tmp_path / "w1" / "expected.json").read_text())["pairs_per_step"]) == 2


def test_workload_w2_in_3d(tmp_path, capsys):
    code, out, _ = run_main(capsys, ["workload", "w2", "400", "3", str(tmp_path), "--dims", "3"])
    assert code == 0 and "W2 3-D: N=400, 3 steps of 400 moves" in out and "per proxy" in out


def test_core_makes_w1_when_given_no_directory(capsys, monkeypatch):
    monkeypatch.setattr(core, "fcl_installed", lambda: False)
    code, out, err = run_main(capsys, ["core", "--n", "400", "--steps", "3", "--repeat", "3"])
    assert code == 0
    assert "W1 made for this run: W1 3-D: N=400, 3 steps of 40 moves" in out
    assert "no directory given: making W1 data" in err
    assert [line for line in out.splitlines() if "python-fcl" in line] == [
        "python-fcl: not installed, so no anchor beside dbvt (pip install 'dbvt-server[bench]')"]
    for label in ("insert bulk", "box query", "segment, all hits", "frustum (6 planes)", "Broadphase step"):
        assert label in out
    assert out.count("  OK       ") == 9 and "MISMATCH" not in out


def test_core_on_w2_times_the_step_and_checks_its_pairs(w2_dir, capsys, tmp_path):
    report = tmp_path / "core.json"
    code, out, _ = run_main(capsys, ["core", str(w2_dir), "--repeat", "3", "--json", str(report)])
    assert code == 0
    assert "W2 3-D: N=600, 4 steps of 600 moves" in out and "python-fcl: not run" in out
    assert "OK       Broadphase pairs after each of 4 steps" in out and "box query" not in out
    written = json.loads(report.read_text())
    assert written["command"] == f"dbvt-bench core {w2_dir} --repeat 3 --json {report}"
    assert written["workload"]["workload"] == "W2" and written["load_end"]
    assert written["figures"]["dbvt"]["step"]["median"] > 0


def test_core_fails_on_a_wrong_answer(w2_dir, tmp_path, capsys):
    for path in w2_dir.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    expected = json.loads((w2_dir / "expected.json").read_text())
    expected["pairs_per_step"][2] += 1
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    code, out, _ = run_main(capsys, ["core", str(tmp_path), "--repeat", "3"])
    assert code == 1 and "MISMATCH Broadphase pairs after each of 4 steps: first difference at step 2" in out


def test_a_broken_directory_is_one_line_not_a_traceback(tmp_path, w2_dir, capsys):
    assert main(["core", str(tmp_path)]) == 2
    assert main(["wire", str(w2_dir)]) == 2
    err = capsys.readouterr().err
    assert f"dbvt-bench: {tmp_path}: no readable meta.json" in err
    assert "a W2 directory; the wire benchmark runs on W1" in err and "Traceback" not in err


def test_progress_redraws_only_on_a_terminal(monkeypatch, capsys):
    console.Progress("quiet", 3).advance()
    assert capsys.readouterr().err == "quiet: 3 steps\n"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    bar = console.Progress("live", 2)
    bar.advance()
    bar.advance()
    err = capsys.readouterr().err
    assert err.count("\r") == 2 and err.endswith("2/2\n")


def test_the_console_entry_runs_as_a_module(tmp_path):
    """`python -m dbvt_server.bench`, as the dbvt-bench script does, in a child run outside the source tree."""
    shown = subprocess.run([sys.executable, "-m", "dbvt_server.bench", "workload", "w2", "200", "2", str(tmp_path)],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path, env=os.environ.copy())
    assert shown.returncode == 0, shown.stderr
    assert_framed(shown.stdout, ["workload", "w2", "200", "2", str(tmp_path)])
    assert "\r" not in shown.stdout + shown.stderr
    assert workload.load(tmp_path).kind == "W2"


@pytest.mark.parametrize("argv, complaint", [
    (["workload", "w1", "5", "1", "out"], "argument n: 5 is less than 10"),
    (["core", "--steps", "0"], "argument --steps: 0 is less than 1"),
    (["core", "--repeat", "2"], "argument --repeat: 2 is less than 3"),
])
def test_arguments_that_cannot_make_a_figure_are_refused(argv, complaint, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and complaint in capsys.readouterr().err


def test_insert_compares_two_sizes_and_checks_the_trees(capsys):
    code, out, _ = run_main(capsys, ["insert", "--n", "300", "--large", "900", "--repeat", "2"])
    assert code == 0
    for line in ("N=      300: one at a time  median", "N=      900: bulk build     median",
                 "one at a time at 900 / at 300: ", "bulk build of 900, wall time: 1 thread ",
                 "trees checked, one at a time finds the bulk build's pairs, and the threads build the same tree: OK"):
        assert line in out


def test_routing_times_a_routed_call_and_a_rebalance(capsys):
    code, out, _ = run_main(capsys, ["routing", "--calls", "10", "--worlds", "3", "--proxies", "50", "--repeats", "1"])
    assert code == 0
    for line in ("routed call beyond a direct one (info() and a one-box query, 30 pairs): median ",
                 "rebalance of 3 worlds of 50 proxies onto a fourth server: median ",
                 "export and import alone (the floor): median "):
        assert line in out


def test_steps_compares_threads_with_one_and_checks_the_answers(capsys):
    code, out, _ = run_main(capsys, ["steps", "--large", "3000", "--dense", "2000", "--steps", "2", "--repeat", "1"])
    assert code == 0
    for name in ("W1 at 3000", "W2 2-D at 2000", "W2 3-D at 2000"):
        assert f"{name}: step on 2 threads / on 1: median" in out
    assert "the same on both: OK" in out


def test_budget_steps_busy_worlds_three_ways_and_checks_the_answers(capsys):
    code, out, _ = run_main(capsys, ["budget", "--dense", "2000", "--steps", "2", "--repeat", "2", "--worlds", "2",
                                     "--threads", "2", "--cores", "2"])
    assert code == 0
    for worlds in ("2 busy worlds", "1 busy world"):
        assert f"{worlds}, steps/s: without a budget " in out
    assert out.count("with the budget / without a budget: median ") == 2
    assert out.count("with the budget / on one thread each: median ") == 2
    assert "the same in every round: OK" in out
    assert dbvt.thread_stats()["budget"] == 0


def test_calls_counts_a_ticks_python_by_thread_beside_the_bare_server(capsys):
    code, out, _ = run_main(capsys, ["calls", "--n", "400", "--steps", "6"])
    assert code == 0 and "over 3 W1 ticks streamed tick by tick (after 3)" in out
    rows = {line[:32].strip(): line[32:].split() for line in out.splitlines()
            if line.startswith(("the caller", "the client's", "the server's", "the world's", "all "))}
    assert list(rows) == ["the caller", "the client's other threads", "the server's event loop", "the world's thread",
                          "all"]
    # Each role of each side makes calls every tick, and the service more than the bare server.
    assert all(float(served) > 0 and float(bare) > 0 for served, bare, _ in rows.values())
    assert float(rows["all"][0]) > float(rows["all"][1])
    assert "pair counts after every step match the oracle's expected.json" in out


def test_calls_needs_ticks_beyond_its_warm_up(capsys):
    assert main(["calls", "--n", "400", "--steps", "3"]) == 2
    assert "--steps must be more than the 3 ticks stepped before counting" in capsys.readouterr().err
