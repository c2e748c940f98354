"""The files of --data-dir when something goes wrong with them: a journal cut short by a crash, flipped
bits in a journal record or a snapshot, a full disk, two servers on one directory, a machine that
restarted under a server, and ephemeral worlds, which must leave no files at all.

The damaged-file tests run the real Store, Service and World in-process (their restore is what a
starting server runs); the others run a real `dbvt-server` and the SDK.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import shutil
import signal
import subprocess

import numpy as np
import pytest

from dbvt import reference
from dbvt_client import Client, FailedPrecondition, Unavailable
from dbvt_client import batches as sdk_batches
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server.journal import HEADER_SIZE, RECORD, read_segment
from dbvt_server.persistence import Store, world_directory_name
from dbvt_server.service import Limits, Service
from servers import NEUTRAL_DIR, ServerProcess, server_command
from worlds import W1World, assert_same_pairs

LIMITS = Limits(max_worlds=8, max_proxies_per_world=100_000, max_message_bytes=64 << 20)
# The server's default margin, which a CreateWorldRequest without one gets.
MARGIN = 0.05


# ---- batches and what they must leave ------------------------------------------------------------
def scripted_batches(seed: int = 0, n: int = 40) -> list[dict]:
    """Six batches, as keyword arguments of `world.apply`: create, three W1 steps, a destroy with a
    create, and last a move of one proxy, so that the last journal record is small."""
    scene = W1World(n, seed=seed)
    batches = [dict(create=(scene.ids, scene.boxes))]
    batches += [dict(move=scene.step()) for _ in range(3)]
    newcomers = np.arange(1, 4, dtype=np.uint64)
    batches.append(dict(create=(newcomers, scene.query_boxes(3, half=1.0)), destroy=scene.ids[:3]))
    moved, boxes = scene.step()
    batches.append(dict(move=(moved[-1:], boxes[-1:])))
    return batches


def as_message(batch: dict) -> pb.Batch:
    """The Batch message the SDK sends for `batch`."""
    [part] = sdk_batches.split(sdk_batches.encode(**batch), LIMITS.max_message_bytes)
    return sdk_batches.batch_message(part)


def expected_states(batches: list[dict]) -> list[tuple]:
    """(ids, their boxes, pairs) of a brute-force reference after each tick (index: the tick)."""
    truth = reference.Broadphase(dims=3, margin=MARGIN)
    live: set[int] = set()
    states = []
    for batch in [{}] + batches:
        if "create" in batch:
            truth.create(*batch["create"])
            live |= {int(i) for i in batch["create"][0]}
        if "move" in batch:
            truth.move(*batch["move"])
        if "destroy" in batch:
            truth.destroy(batch["destroy"])
            live -= {int(i) for i in batch["destroy"]}
        truth.update()
        ids = np.array(sorted(live), np.uint64)
        states.append((ids, truth.get(ids) if len(ids) else np.zeros((0, 6), np.float32), truth.pairs()))
    return states


def assert_world_is(world, expected: tuple, what: str) -> None:
    ids, boxes, pairs = expected
    assert len(world.broadphase) == len(ids), what
    if len(ids):
        np.testing.assert_array_equal(world.broadphase.get(ids), boxes, err_msg=what)
    assert_same_pairs(world.broadphase.pairs(), pairs, what)


# ---- data directories in-process -----------------------------------------------------------------
def open_service(path) -> Service:
    store = Store(str(path), "no")
    store.open()
    return Service(LIMITS, store)


def new_world(service: Service, name: str):
    service.create_world(pb.CreateWorldRequest(name=name, dims=3))
    return service.world(name)


def apply_all(world, batches: list[dict]) -> None:
    for batch in batches:
        world.apply(as_message(batch))


@contextlib.contextmanager
def restored(path):
    """The data directory at `path` restored as a starting server restores it; closed afterwards."""
    service = open_service(path)
    try:
        service.restore()
        yield service
    finally:
        service.store.close()


def world_dir(data, name: str):
    return data / "worlds" / world_directory_name(name)


def journal_path(data, name: str, tick: int = 0):
    return world_dir(data, name) / f"journal-{tick:020d}.log"


def snapshot_path(data, name: str, tick: int):
    return world_dir(data, name) / f"snapshot-{tick:020d}.dbvt"


def flip_bit(path, offset: int, bit: int = 0x01) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([byte ^ bit]))


def logged(caplog, level: int) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "dbvt_server" and record.levelno == level]


# ---- a journal cut short, or damaged -------------------------------------------------------------
def test_a_torn_last_record_is_cut_and_the_world_restored_before_it(tmp_path, caplog):
    batches = scripted_batches()
    states = expected_states(batches)
    last = len(batches)
    original = tmp_path / "original"
    service = open_service(original)
    world = new_world(service, "torn")
    apply_all(world, batches)
    incarnation = world.incarnation
    service.store.close()
    start = read_segment(str(journal_path(original, "torn"))).records[-1][0]
    end = os.path.getsize(journal_path(original, "torn"))
    assert end - start < 100, "the last record is one small move"

    for cut in range(start, end):
        copy = tmp_path / f"cut-{cut}"
        shutil.copytree(original, copy)
        journal = journal_path(copy, "torn")
        os.truncate(journal, cut)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dbvt_server"), restored(copy) as again:
            world = again.world("torn")
            assert (world.tick, world.incarnation) == (last - 1, incarnation), f"cut at {cut}"
            assert_world_is(world, states[last - 1], f"cut at {cut}")
            if cut == start + (end - start) // 2:
                # It goes on from there, and what it takes now comes back too.
                world.apply(as_message(batches[-1]))
        warnings = logged(caplog, logging.WARNING)
        if cut == start:
            assert warnings == [], "a journal that ends between records is whole"
        else:
            [warning] = warnings
            assert "'torn'" in warning and str(journal) in warning and f"offset {start}" in warning, warning
            assert os.path.getsize(journal) == start, "the torn record is cut off the journal"
        if cut == start + (end - start) // 2:
            with restored(copy) as again:
                world = again.world("torn")
                assert (world.tick, world.incarnation) == (last, incarnation)
                assert_world_is(world, states[last], "the last batch, applied again after the restore")
        shutil.rmtree(copy)


# Where in record 1 (the batch of tick 2) a bit is flipped: (offset in the record, bit).
FLIPS = {"length, low bit": (0, 0x01), "length, high bit": (3, 0x80), "CRC": (4, 0x10), "tick": (8, 0x01),
         "batch": (RECORD.size + 3, 0x04)}


@pytest.mark.parametrize("field", FLIPS)
def test_a_damaged_journal_record_cuts_the_history_there_under_a_new_incarnation(tmp_path, caplog, field):
    batches = scripted_batches(seed=1)
    states = expected_states(batches)
    data = tmp_path / "data"
    service = open_service(data)
    world = new_world(service, "damaged")
    apply_all(world, batches)
    incarnation = world.incarnation
    service.store.close()
    journal = journal_path(data, "damaged")
    damaged_at = read_segment(str(journal)).records[1][0]
    offset, bit = FLIPS[field]
    flip_bit(journal, damaged_at + offset, bit)

    with caplog.at_level(logging.INFO, logger="dbvt_server"), restored(data) as again:
        world = again.world("damaged")
        assert world.tick == 1, "restored up to the record before the damaged one"
        assert_world_is(world, states[1], "after the damaged record's cut")
        assert world.incarnation != incarnation, "ticks 2 to 6 were answered and are lost: a new incarnation"
        new_incarnation = world.incarnation
    [warning] = logged(caplog, logging.WARNING)
    assert "'damaged'" in warning and str(journal) in warning and f"offset {damaged_at}" in warning, warning

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dbvt_server"), restored(data) as again:
        world = again.world("damaged")
        assert (world.tick, world.incarnation) == (1, new_incarnation), "the new incarnation is on disk"
    assert logged(caplog, logging.WARNING) == []


# ---- damaged snapshots ---------------------------------------------------------------------------
def test_a_damaged_newest_snapshot_falls_back_to_the_one_before_and_loses_nothing(tmp_path, caplog):
    batches = scripted_batches(seed=2)
    states = expected_states(batches)
    data = tmp_path / "data"
    service = open_service(data)
    world = new_world(service, "fallback")
    for done, batch in enumerate(batches, 1):
        world.apply(as_message(batch))
        if done in (2, 4):
            assert world.files.snapshot(world).result()[0] == done
    incarnation = world.incarnation
    service.store.close()
    assert sorted(os.listdir(world_dir(data, "fallback"))) == [
        f"journal-{2:020d}.log", f"journal-{4:020d}.log", f"snapshot-{2:020d}.dbvt", f"snapshot-{4:020d}.dbvt"]
    newest = snapshot_path(data, "fallback", 4)
    flip_bit(newest, os.path.getsize(newest) // 2)

    with caplog.at_level(logging.INFO, logger="dbvt_server"), restored(data) as again:
        world = again.world("fallback")
        assert (world.tick, world.incarnation) == (6, incarnation)
        assert_world_is(world, states[6], "snapshot 2 and the journal")
    [error] = logged(caplog, logging.ERROR)
    assert newest.name in error, error
    quarantined = f"{world_directory_name('fallback')}-{newest.name}"
    assert os.listdir(data / "quarantine") == [quarantined]
    assert newest.name not in os.listdir(world_dir(data, "fallback"))

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dbvt_server"), restored(data) as again:
        world = again.world("fallback")
        assert (world.tick, world.incarnation) == (6, incarnation)
        assert_world_is(world, states[6], "the second restart")
    assert logged(caplog, logging.ERROR) == [] and logged(caplog, logging.WARNING) == []


def test_a_world_without_a_usable_snapshot_is_left_out_and_the_others_come_up(tmp_path, caplog):
    batches = scripted_batches(seed=3)
    states = expected_states(batches)
    data = tmp_path / "data"
    service = open_service(data)
    broken, fine = new_world(service, "broken"), new_world(service, "fine")
    apply_all(broken, batches[:2])
    broken.files.snapshot(broken).result()
    apply_all(broken, batches[2:3])
    apply_all(fine, batches)
    service.store.close()
    snapshots = [snapshot_path(data, "broken", 0), snapshot_path(data, "broken", 2)]
    for snapshot in snapshots:
        flip_bit(snapshot, os.path.getsize(snapshot) - 10)

    with caplog.at_level(logging.INFO, logger="dbvt_server"), restored(data) as again:
        assert [world.name for world in again.worlds()] == ["fine"]
        assert again.world("fine").tick == len(batches)
        assert_world_is(again.world("fine"), states[-1], "the other world")
    directory = world_directory_name("broken")
    errors = logged(caplog, logging.ERROR)
    assert any(directory in error and "left out" in error for error in errors), errors
    for snapshot in snapshots:
        assert any(snapshot.name in error for error in errors), errors
    assert os.listdir(data / "worlds") == [world_directory_name("fine")]
    [quarantined] = os.listdir(data / "quarantine")
    assert quarantined.startswith(directory + "-")
    assert {snapshot.name for snapshot in snapshots} <= set(os.listdir(data / "quarantine" / quarantined))


# ---- a full disk ---------------------------------------------------------------------------------
def limit_file_size(server: ServerProcess, size: int | None) -> None:
    """The largest file the running server may write (RLIMIT_FSIZE): a disk that is full past it.
    Python ignores SIGXFSZ, so a write past it fails with EFBIG ("File too large"). None: no limit."""
    limit = resource.RLIM_INFINITY if size is None else size
    resource.prlimit(server.process.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))


def world_state(world) -> tuple:
    info = world.info()
    everything = world.query_aabb(np.array([[-1e6] * 3 + [1e6] * 3], np.float32))
    return info.tick, info.incarnation, info.proxies, sorted(everything.hits.tolist()), world.pairs().tolist()


def test_a_full_disk_refuses_a_batch_whole_and_the_world_answers_on(tmp_path):
    scene = W1World(600, seed=4)
    per_batch = 100
    creates = [dict(create=(scene.ids[i:i + per_batch], scene.boxes[i:i + per_batch]))
               for i in range(0, 600, per_batch)]
    record = RECORD.size + as_message(creates[0]).ByteSize()
    # Room for five records and half of the sixth.
    room = HEADER_SIZE + 5 * record + record // 2
    data = tmp_path / "data"
    truth = reference.Broadphase(dims=3, margin=MARGIN)
    server = ServerProcess("--data-dir", str(data), "--fsync", "always")
    try:
        limit_file_size(server, room)
        client = Client(server.target)
        world = client.create_world("full")
        for batch in creates[:5]:
            world.apply(**batch)
            truth.create(*batch["create"])
        before = world_state(world)
        journal = journal_path(data, "full")
        assert os.path.getsize(journal) == HEADER_SIZE + 5 * record

        with pytest.raises(Unavailable, match="File too large") as refused:
            world.apply(**creates[5])
        assert "nothing of the batch was applied" in refused.value.message
        assert world_state(world) == before
        assert os.path.getsize(journal) == HEADER_SIZE + 5 * record, "the part written is taken back"

        small = world.apply(move=(scene.ids[:2], scene.boxes[:2] + 0.5))
        truth.move(scene.ids[:2], scene.boxes[:2] + 0.5)
        truth.update()
        assert small.tick == before[0] + 1
        queries = scene.query_boxes(30)
        got = world.query_aabb(queries)
        offsets, hits = truth.query_aabb(queries)
        for q in range(len(queries)):
            assert sorted(got.hits[got.offsets[q]:got.offsets[q + 1]].tolist()) == \
                sorted(hits[offsets[q]:offsets[q + 1]].tolist()), f"query {q}"
        assert_same_pairs(world.pairs(), truth.pairs())

        limit_file_size(server, None)  # room again
        assert world.apply(**creates[5]).tick == before[0] + 2
        truth.create(*creates[5]["create"])
        after = world_state(world)
        client.close()
        assert server.terminate() == 0
    finally:
        server.kill()

    server = ServerProcess("--data-dir", str(data))
    try:
        with Client(server.target) as client:
            world = client.world("full")
            assert world_state(world) == after
            assert_same_pairs(world.pairs(), truth.pairs())
        assert server.terminate() == 0
    finally:
        server.kill()


def test_a_snapshot_refused_by_a_full_disk_is_written_once_there_is_room(tmp_path):
    scene = W1World(500, seed=5)
    data = tmp_path / "data"
    server = ServerProcess("--data-dir", str(data))
    try:
        client = Client(server.target)
        world = client.create_world("full")
        world.apply(create=(scene.ids, scene.boxes))
        limit_file_size(server, 4096)
        with pytest.raises(Unavailable, match="File too large"):
            world.snapshot()
        limit_file_size(server, None)
        written = world.snapshot()
        assert written.tick == 1
        assert os.path.getsize(snapshot_path(data, "full", 1)) == written.size
        client.close()
        assert server.terminate() == 0
    finally:
        server.kill()


# ---- one server per directory --------------------------------------------------------------------
def test_a_second_server_on_the_same_data_dir_refuses_to_start(tmp_path):
    first = ServerProcess("--data-dir", str(tmp_path))
    try:
        with Client(first.target) as client:
            client.create_world("w").apply(create=(np.arange(3), np.tile(np.float32([0, 0, 0, 1, 1, 1]), (3, 1))))
        second = subprocess.run([*server_command(), "--host", "127.0.0.1", "--port", "0", "--data-dir",
                                 str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_DIR)
        assert second.returncode == 1
        assert (f"data directory {tmp_path} is in use by another dbvt-server (pid {first.process.pid})"
                in second.stderr), second.stderr
        assert "listening on" not in second.stderr
        # The first server's marker and world are untouched, and it serves on.
        assert json.loads((tmp_path / "RUNNING").read_text())["pid"] == first.process.pid
        with Client(first.target) as client:
            assert client.world("w").info().proxies == 3
        assert first.terminate() == 0
    finally:
        first.kill()


# ---- a machine restarted under a server ----------------------------------------------------------
@pytest.mark.parametrize("fsync, rebooted, history_kept", [
    ("everysec", True, False),
    ("everysec", False, True),
    ("always", True, True),
])
def test_a_restart_of_the_machine_after_a_kill_gives_a_new_incarnation_unless_fsync_always(
        tmp_path, fsync, rebooted, history_kept):
    batches = scripted_batches(seed=6)
    states = expected_states(batches)
    server = ServerProcess("--data-dir", str(tmp_path), "--fsync", fsync)
    try:
        with Client(server.target) as client:
            world = client.create_world("w")
            for batch in batches:
                world.apply(**batch)
            incarnation = world.info().incarnation
        server.process.send_signal(signal.SIGKILL)
        server.wait()
    finally:
        server.kill()
    marker = tmp_path / "RUNNING"
    running = json.loads(marker.read_text())
    assert running["fsync"] == fsync and running["boot_id"]
    if rebooted:
        marker.write_text(json.dumps({**running, "boot_id": "another-boot-than-" + running["boot_id"]}))

    server = ServerProcess("--data-dir", str(tmp_path))
    try:
        with Client(server.target) as client:
            world = client.world("w")
            info = world.info()
            assert (info.tick, info.proxies) == (len(batches), len(states[-1][0]))
            assert_same_pairs(world.pairs(), states[-1][2])
            warnings = [line for line in server.output() if "the machine restarted" in line]
            if history_kept:
                assert info.incarnation == incarnation
                assert warnings == []
            else:
                assert info.incarnation != incarnation
                [warning] = warnings
                assert " WARNING dbvt_server: world 'w': " in warning and "--fsync everysec" in warning
                assert "new incarnation" in warning
        assert server.terminate() == 0
    finally:
        server.kill()


# ---- ephemeral worlds ----------------------------------------------------------------------------
def test_ephemeral_worlds_leave_no_files_and_are_gone_after_a_restart(tmp_path):
    boxes = np.tile(np.float32([0, 0, 0, 1, 1, 1]), (4, 1))
    server = ServerProcess("--data-dir", str(tmp_path))
    try:
        with Client(server.target) as client:
            assert client.server_info()["persistent"] is True
            kept = client.create_world("kept")
            passing = client.create_world("passing", ephemeral=True)
            for world in (kept, passing):
                world.apply(create=(np.arange(4), boxes))
            assert (kept.info().ephemeral, passing.info().ephemeral) == (False, True)
            with pytest.raises(FailedPrecondition, match="ephemeral"):
                passing.snapshot()
            assert os.listdir(tmp_path / "worlds") == [world_directory_name("kept")]
            incarnation = kept.info().incarnation
        assert server.terminate() == 0
    finally:
        server.kill()
    everything = [name for _, dirs, files in os.walk(tmp_path) for name in dirs + files]
    assert not any("passing" in name for name in everything), everything

    server = ServerProcess("--data-dir", str(tmp_path))
    try:
        with Client(server.target) as client:
            assert client.list_worlds() == ["kept"]
            info = client.world("kept").info()
            assert (info.tick, info.proxies, info.incarnation, info.ephemeral) == (1, 4, incarnation, False)
        assert server.terminate() == 0
    finally:
        server.kill()


def test_a_server_without_a_data_dir_keeps_every_world_in_memory_only():
    server = ServerProcess()
    try:
        with Client(server.target) as client:
            info = client.server_info()
            assert (info["persistent"], info["fsync"]) == (False, "")
            world = client.create_world("w")
            world.apply(create=(np.arange(2), np.tile(np.float32([0, 0, 0, 1, 1, 1]), (2, 1))))
            assert world.info().ephemeral is True
            with pytest.raises(FailedPrecondition, match="no data directory"):
                world.snapshot()
        assert server.terminate() == 0
    finally:
        server.kill()
    service = Service(LIMITS)
    service.create_world(pb.CreateWorldRequest(name="w", dims=3))
    assert service.world("w").files is None
