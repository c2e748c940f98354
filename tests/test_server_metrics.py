"""/metrics, /healthz and /readyz of a real server, scraped and parsed as Prometheus does; readiness
turning at SIGTERM while calls are still answered through the drain; an overrun of the grace logged."""
from __future__ import annotations

import asyncio
import logging
import re
import signal
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dbvt_client import Client, Create, NotFound, ResourceExhausted
from dbvt_client.routing import owner
from servers import ServerProcess, ServerThread

BOXES = np.array([[0, 0, 0, 1, 1, 1], [0.5, 0.5, 0.5, 2, 2, 2], [5, 5, 5, 6, 6, 6]], np.float32)


def fetch(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(port: int) -> dict:
    """Every sample as {(name, (label, value), ...): value}."""
    status, text = fetch(port, "/metrics")
    assert status == 200
    return {(sample.name, *sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.fixture
def server():
    running = ServerThread(metrics_address="127.0.0.1:0")
    yield running
    running.stop()


def test_counters_equal_the_calls_made_and_gauges_the_worlds_state(server):
    port = server.running.metrics_endpoint.port
    with Client(server.target) as client:
        world = client.create_world("metered", max_proxies=10)
        for i in range(5):
            world.apply(create=([10 * i + 1, 10 * i + 2], BOXES[:2] + 10 * i))
        world.apply(move=([1], BOXES[2:]), destroy=[2])
        for _ in range(3):
            world.query_aabb(BOXES)
        with pytest.raises(NotFound):
            client.world("nowhere").pairs()
        with pytest.raises(NotFound):
            client.world("nowhere").raycast(BOXES)
        with world.stream() as stream:
            stream.apply(destroy=[11])
            with pytest.raises(ResourceExhausted, match="limit of 10"):
                stream.apply(create=([100, 101, 102], BOXES))
            open_streams = scrape(port)[("dbvt_stream_connections",)]
        samples = scrape(port)
    assert open_streams == 1 and samples[("dbvt_stream_connections",)] == 0
    requests = {key[1:]: value for key, value in samples.items() if key[0] == "dbvt_rpc_requests_total"}
    assert requests[(("code", "OK"), ("method", "ApplyBatch"))] == 6
    assert requests[(("code", "NOT_FOUND"), ("method", "GetPairs"))] == 1
    assert requests[(("code", "OK"), ("method", "StreamBatches"))] == 1
    # A batch refused inside a stream is answered there while the stream goes on: it counts by itself.
    streamed = {key[1][1]: value for key, value in samples.items() if key[0] == "dbvt_streamed_batches_total"}
    assert streamed == {"OK": 1, "RESOURCE_EXHAUSTED": 1}
    assert samples[("dbvt_rpc_duration_seconds_count", ("method", "ApplyBatch"))] == 6
    # The SDK asks its queries on one query stream, which counts as a call once it ends; its sets count one by one.
    sets = {key[1:]: value for key, value in samples.items() if key[0] == "dbvt_streamed_query_sets_total"}
    assert sets == {(("code", "OK"), ("method", "QueryAabb")): 3, (("code", "NOT_FOUND"), ("method", "Raycast")): 1}
    assert samples[("dbvt_streamed_query_set_seconds_count", ("method", "QueryAabb"))] == 3
    assert (("code", "OK"), ("method", "StreamQueries")) not in requests
    closed = {key[1:]: value for key, value in scrape(port).items() if key[0] == "dbvt_rpc_requests_total"}
    assert closed[(("code", "OK"), ("method", "StreamQueries"))] == 1, "a closed client ends its query stream with OK"
    operations = {key[1][1]: value for key, value in samples.items() if key[0] == "dbvt_batch_operations_total"}
    assert operations == {"create": 10, "move": 1, "destroy": 2}
    world_label = ("world", "metered")
    assert samples[("dbvt_worlds",)] == 1
    assert samples[("dbvt_world_proxies", world_label)] == 8
    assert samples[("dbvt_world_tick", world_label)] == 7
    assert samples[("dbvt_world_queue_depth", world_label)] == 0
    assert samples[("dbvt_staged_bytes",)] == 0
    with Client(server.target) as client:
        assert samples[("dbvt_world_pairs", world_label)] == len(client.world("metered").pairs()) == 3
    assert samples[("process_cpu_seconds_total",)] > 0


def test_health_and_readiness_endpoints(server):
    port = server.running.metrics_endpoint.port
    assert fetch(port, "/healthz") == (200, "alive\n")
    assert fetch(port, "/readyz") == (200, "ready\n")
    status, text = fetch(port, "/nothing-here")
    assert status == 404 and "/metrics" in text


def test_readiness_turns_at_sigterm_while_calls_are_answered_through_the_drain():
    server = ServerProcess("--metrics-address", "127.0.0.1:0", "--drain-seconds", "30", "--grace-seconds", "1")
    port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", "".join(server.output())).group(1))
    try:
        with Client(server.target) as client:
            client.create_world("draining")
            assert fetch(port, "/readyz")[0] == 200
            server.process.send_signal(signal.SIGTERM)
            server.wait_for_line("draining: serving 30.0 s more")
            assert fetch(port, "/readyz") == (503, "shutting down\n")
            assert fetch(port, "/healthz")[0] == 200
            # Still answering: a load balancer has time to move traffic away.
            assert client.list_worlds() == ["draining"]
            assert client.world("draining").apply(create=([1], BOXES[:1])).tick == 1
        server.process.send_signal(signal.SIGTERM)
    finally:
        server.kill()


def test_an_operation_running_past_the_grace_completes_and_is_logged(caplog):
    server = ServerThread()
    release = threading.Event()
    holding = server.running.executor.submit(release.wait, 60)
    with caplog.at_level(logging.INFO, logger="dbvt_server"):
        stopping = asyncio.run_coroutine_threadsafe(server.running.stop(0.0), server._loop)
        time.sleep(0.3)  # the overrun itself: the operation goes on after the (zero) grace has ended
        release.set()
        stopping.result(30)
    assert holding.result(30) is True
    server.stop()   # stopping again finds nothing left to stop, and ends the server's thread
    [line] = [record.getMessage() for record in caplog.records if "past the grace period" in record.getMessage()]
    assert re.fullmatch(r"an operation that had started ran \d+\.\d s past the grace period: "
                        r"a started batch always completes", line)


def test_a_data_directory_reports_its_journals_and_snapshots(tmp_path):
    server = ServerThread(metrics_address="127.0.0.1:0", data_dir=str(tmp_path))
    try:
        port = server.running.metrics_endpoint.port
        with Client(server.target) as client:
            world = client.create_world("kept")
            client.create_world("thrown-away", ephemeral=True)
            world.apply(create=(np.arange(3, dtype=np.uint64), BOXES))
            journaled = scrape(port)[("dbvt_world_journal_bytes", ("world", "kept"))]
            snapshot = world.snapshot()
            samples = scrape(port)
    finally:
        server.stop()
    assert journaled > 0 and samples[("dbvt_world_journal_bytes", ("world", "kept"))] == 0
    assert samples[("dbvt_world_snapshot_tick", ("world", "kept"))] == snapshot.tick == 1
    assert ("dbvt_world_journal_bytes", ("world", "thrown-away")) not in samples
    # The creation's snapshot is written before the world is announced; this one on the writer thread.
    assert samples[("dbvt_snapshots_written_total",)] == 2
    assert samples[("dbvt_snapshot_failures_total",)] == samples[("dbvt_journal_write_failures_total",)] == 0


def test_sensor_pairs_and_watchers_are_gauged(server):
    port = server.running.metrics_endpoint.port
    with Client(server.target) as client:
        world = client.create_world("gauged-sensors")
        world.apply(create=Create([1], [[0, 0, 0, 4, 4, 4]], sensor="box"))
        world.apply(create=([2, 3], [[1, 1, 1, 2, 2, 2], [9, 9, 9, 10, 10, 10]]))
        with world.watch() as feed:
            next(feed)
            samples = scrape(port)
        client.delete_world("gauged-sensors")
    label = ("world", "gauged-sensors")
    assert samples[("dbvt_world_sensor_pairs", label)] == 1
    assert samples[("dbvt_world_watchers", label)] == 1


def test_the_replica_set_and_moving_worlds_are_gauged():
    targets = ["127.0.0.1:1", "127.0.0.1:2"]
    running = ServerThread(metrics_address="127.0.0.1:0", peers=tuple(targets), advertise=targets[0])
    try:
        port = running.running.metrics_endpoint.port
        name = next(f"mine-{i}" for i in range(100) if owner(f"mine-{i}", targets) == targets[0])
        with Client(running.target) as client:
            world = client.create_world(name)
            assert scrape(port)[("dbvt_worlds_moving",)] == 0
            world.begin_move(targets[1])
            samples = scrape(port)
            world.finish_move(cancel=True)
        assert samples[("dbvt_worlds_moving",)] == 1 and samples[("dbvt_replicas",)] == 2
        assert scrape(port)[("dbvt_worlds_moving",)] == 0
    finally:
        running.stop()


def test_the_threads_working_and_where_parts_ran_are_reported():
    """--cores 1: the world's own thread is the budget, so the parts of a query call cut over
    --threads-per-world 2 all run on it."""
    server = ServerThread(metrics_address="127.0.0.1:0", threads_per_world=2, cores=1)
    try:
        port = server.running.metrics_endpoint.port
        before = scrape(port)
        boxes = np.random.default_rng(3).uniform(0, 50, (2000, 3)).astype(np.float32)
        with Client(server.target) as client:
            world = client.create_world("parted")
            world.apply(create=(np.arange(2000, dtype=np.uint64), np.concatenate([boxes, boxes + 1], axis=1)))
            world.query_aabb(np.concatenate([boxes, boxes + 2], axis=1))
        after = scrape(port)
        ran = {on: after[("dbvt_thread_parts_total", ("on", on))] - before[("dbvt_thread_parts_total", ("on", on))]
               for on in ("pooled_threads", "world_threads")}
        assert ran == {"pooled_threads": 0, "world_threads": 2}
        assert after[("dbvt_threads_working",)] == 0
    finally:
        server.stop()
