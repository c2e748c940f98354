"""The thread budget: calls on different threads share the cores. A call cut into parts takes a worker
only while fewer threads than the budget work (the threads inside `dbvt.working()`, and the workers
running a part); the parts it gets none for run on its own thread, with the same answer. The server
sets the budget to --cores and counts each world's thread while it works.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import dbvt
from dbvt_client import Client
from dbvt_server.bench.workload import make_w2
from servers import ServerThread

QUERIES = 2000          # enough rows for a call on two threads to be cut in two


@pytest.fixture(autouse=True)
def no_budget_after():
    yield
    dbvt.set_thread_budget(0)


def _world(threads: int, seed: int = 5) -> tuple[dbvt.Broadphase, object]:
    work = make_w2(3000, 3, dims=2, seed=seed)
    structure = dbvt.Broadphase(dims=2, threads=threads)
    structure.create(work.ids, work.boxes)
    structure.update()
    return structure, work


def _parts_during(call) -> tuple[object, int, int]:
    """What `call()` returned, and the parts run on workers and on their callers meanwhile."""
    before = dbvt.thread_stats()
    answer = call()
    after = dbvt.thread_stats()
    return (answer, after["parts_on_workers"] - before["parts_on_workers"],
            after["parts_on_callers"] - before["parts_on_callers"])


def _queries(work) -> np.ndarray:
    return np.repeat(work.boxes[:QUERIES // 2], 2, axis=0)


@pytest.mark.parametrize("bad", [-1, 1025, 1.5, True, "2", None])
def test_the_budget_is_an_int_from_0_to_1024(bad):
    with pytest.raises(ValueError, match=r"the thread budget must be an int from 0 \(none\) to 1024"):
        dbvt.set_thread_budget(bad)


def test_without_a_budget_a_call_takes_its_workers():
    structure, work = _world(threads=2)
    dbvt.set_thread_budget(0)
    with dbvt.working():
        _, on_workers, on_callers = _parts_during(lambda: structure.query_aabb(_queries(work)))
    assert (on_workers, on_callers) == (1, 1)


def test_a_spent_budget_runs_every_part_on_the_caller_with_the_same_answer():
    single, work = _world(threads=1)
    expected = single.query_aabb(_queries(work))
    structure, _ = _world(threads=2)
    dbvt.set_thread_budget(1)
    with dbvt.working():
        answer, on_workers, on_callers = _parts_during(lambda: structure.query_aabb(_queries(work)))
    assert (on_workers, on_callers) == (0, 2)
    for got, wanted in zip(answer, expected, strict=True):
        np.testing.assert_array_equal(got, wanted)


def test_a_budget_with_room_gives_workers():
    structure, work = _world(threads=2)
    dbvt.set_thread_budget(4)           # room beside this thread, even if another thread works now
    with dbvt.working():
        _, on_workers, _ = _parts_during(lambda: structure.query_aabb(_queries(work)))
    assert on_workers == 1
    assert dbvt.thread_stats()["working"] == 0


def test_threads_working_at_once_share_the_budget_and_answer_as_one_thread():
    """Four threads stepping and querying worlds on three threads each, within a budget of two: the
    answers are one thread's, and no thread is left counted afterwards."""
    seeds = range(4)

    def steps_and_queries(threads: int, seed: int) -> list:
        structure, work = _world(threads, seed)
        answers = []
        for step in range(work.steps):
            structure.move(work.move_ids[step], work.move_boxes[step])
            answers.extend(structure.update())
        answers.extend(structure.query_aabb(_queries(work)))
        return answers

    expected = [steps_and_queries(1, seed) for seed in seeds]
    dbvt.set_thread_budget(2)
    got: dict[int, list] = {}

    def run(seed: int) -> None:
        with dbvt.working():
            got[seed] = steps_and_queries(3, seed)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in seeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for seed in seeds:
        for a, b in zip(got[seed], expected[seed], strict=True):
            np.testing.assert_array_equal(a, b)
    assert dbvt.thread_stats()["working"] == 0


@pytest.mark.parametrize("cores, on_workers", [(1, 0), (4, 1)])
def test_a_server_s_worlds_take_workers_within_its_cores(cores, on_workers):
    """--cores 1: the world's own thread is all the budget, so a call on --threads-per-world 2 runs
    whole on it; --cores 4: it takes a worker. The answer is the same."""
    structure, work = _world(threads=1)
    expected = structure.query_aabb(_queries(work))
    server = ServerThread(threads_per_world=2, cores=cores)
    try:
        with Client(server.target) as client:
            world = client.create_world("budget", dims=2)
            world.apply(create=(work.ids, work.boxes))
            answer, workers, callers = _parts_during(lambda: world.query_aabb(_queries(work)))
        assert dbvt.thread_stats()["budget"] == cores
        assert (workers, callers) == (on_workers, 2 - on_workers)
        for got, wanted in zip(answer, expected, strict=True):
            np.testing.assert_array_equal(got, wanted)
    finally:
        server.stop()


def _child_parts(out) -> None:
    structure, work = _world(threads=2)
    with dbvt.working():
        _, on_workers, _ = _parts_during(lambda: structure.query_aabb(_queries(work)))
    out.send((dbvt.thread_stats()["working"], on_workers))
    out.close()


# From Python 3.12 a fork in a process with other threads warns; the thread working is the point here.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_does_not_inherit_the_threads_working():
    """The parent's threads working when it forks are not in the child: counted there, they would
    leave a child with a budget of 2 no worker for ever."""
    import multiprocessing

    dbvt.set_thread_budget(2)
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with dbvt.working():
            entered.set()
            release.wait(60)

    holding = threading.Thread(target=hold)
    holding.start()
    assert entered.wait(10)
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    try:
        with dbvt.working():            # the parent's count is 2 at the fork: its budget is spent
            child = context.Process(target=_child_parts, args=(sender,))
            child.start()
        sender.close()
        assert receiver.poll(120), "the forked child gave no answer"
        assert receiver.recv() == (0, 1)
        child.join(30)
    finally:
        release.set()
        holding.join()
