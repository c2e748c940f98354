"""Prometheus metrics of a running server, and the HTTP endpoint that serves them beside /healthz and
/readyz (`--metrics-address HOST:PORT`).

Counters and the duration histogram are updated as calls end (`MetricsInterceptor`, grpc's own
Prometheus packages do not support grpc.aio) and as batches are applied. The per-world gauges are
read only when Prometheus scrapes (`_StateCollector`), so they cost nothing between scrapes; they
read plain counters the world and its core keep, never the core's structures, which a world thread
may be changing meanwhile.
"""
from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, PlatformCollector,
                               ProcessCollector, generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

import dbvt
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server import handlers

# From a 10k-box query or a W1 step (milliseconds) to a world-sized batch (seconds).
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OPERATIONS = (("create", "create_ids"), ("move", "move_ids"), ("destroy", "destroy_ids"))


class Metrics:
    def __init__(self, servicer):
        self.registry = CollectorRegistry()
        self.requests = Counter("dbvt_rpc_requests", "RPCs ended, by method and status code", ["method", "code"],
                                registry=self.registry)
        self.duration = Histogram("dbvt_rpc_duration_seconds", "time from the start to the end of each RPC",
                                  ["method"], buckets=DURATION_BUCKETS, registry=self.registry)
        self.query_sets = Counter("dbvt_streamed_query_sets", "query sets answered on StreamQueries, by the query "
                                  "RPC of their kind and the status of their answer", ["method", "code"],
                                  registry=self.registry)
        self.query_set_duration = Histogram("dbvt_streamed_query_set_seconds", "time from the last part of each "
                                            "query set on StreamQueries to its answer", ["method"],
                                            buckets=DURATION_BUCKETS, registry=self.registry)
        self.streamed_batches = Counter("dbvt_streamed_batches", "batches answered on StreamBatches, by the status "
                                        "of their answer", ["code"], registry=self.registry)
        self.operations = Counter("dbvt_batch_operations", "proxies created, moved and destroyed by applied batches",
                                  ["op"], registry=self.registry)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(_StateCollector(servicer))
        # False from the moment a shutdown begins: /readyz then answers 503.
        self.ready = True

    def count_batch(self, batch: pb.Batch) -> None:
        """An applied batch's operations (called on world threads; the counters are thread-safe)."""
        for op, column in OPERATIONS:
            rows = len(getattr(batch, column)) // 8
            if rows:
                self.operations.labels(op).inc(rows)

    def count_streamed_batch(self, code: grpc.StatusCode) -> None:
        """A batch answered (or refused) on a batch stream, which the interceptor counts as one call."""
        self.streamed_batches.labels(code.name).inc()

    def count_query_set(self, method: str, started: float, code: grpc.StatusCode) -> None:
        """A query set answered (or refused) on a query stream, which the interceptor counts as one call."""
        self.query_sets.labels(method, code.name).inc()
        self.query_set_duration.labels(method).observe(time.perf_counter() - started)

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        return MetricsInterceptor(self)

    def observe(self, method: str, started: float, code: grpc.StatusCode) -> None:
        self.requests.labels(method, code.name).inc()
        self.duration.labels(method).observe(time.perf_counter() - started)


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times every call, by its method's name and the status it ended with."""

    def __init__(self, metrics: Metrics):
        self._metrics = metrics

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rpartition("/")[2]

        def after(context, started: float, failure: BaseException | None) -> None:
            self._metrics.observe(method, started, _code(context, failure))

        return handlers.wrapped(handler, lambda context: time.perf_counter(), after)


def _code(context, failure: BaseException | None) -> grpc.StatusCode:
    if isinstance(failure, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.UNKNOWN if failure is not None else grpc.StatusCode.OK


class _StateCollector:
    """The gauges of the server's state, read at each scrape."""

    def __init__(self, servicer):
        self._servicer = servicer

    def collect(self):
        worlds = self._servicer.service.worlds()
        depths = self._servicer.queue_depths()
        yield _gauge("dbvt_worlds", "worlds held", [((), len(worlds))])
        yield _gauge("dbvt_worlds_moving", "worlds frozen for a move to another server (dbvt-admin rebalance)",
                     [((), sum(1 for world in worlds if world.moving_to))])
        replicas = self._servicer.service.replicas
        yield _gauge("dbvt_replicas", "servers in the replica set this server routes by (0 without --peers)",
                     [((), len(replicas.members))])
        for name, help_text, value in (
                ("dbvt_world_proxies", "proxies in the world", lambda world: len(world.broadphase)),
                ("dbvt_world_pairs", "overlapping pairs in the world (0 where track_pairs is off)",
                 lambda world: world.broadphase.pair_count),
                ("dbvt_world_tick", "batches applied to the world", lambda world: world.tick),
                ("dbvt_world_queue_depth", "operations waiting for their turn on the world",
                 lambda world: depths.get(world.name, 0)),
                ("dbvt_world_sensor_pairs", "[sensor, proxy] pairs inside the world's sensors",
                 lambda world: world.broadphase.sensor_pair_count),
                ("dbvt_world_watchers", "sensor feeds open on the world", lambda world: world.feed.watchers)):
            yield _gauge(name, help_text, [((world.name,), value(world)) for world in worlds], ["world"])
        kept = [world for world in worlds if world.files is not None]
        yield _gauge("dbvt_world_journal_bytes", "bytes of the world's journal since its last snapshot (persistent worlds)",
                     [((world.name,), world.files.journal.records_bytes) for world in kept], ["world"])
        yield _gauge("dbvt_world_snapshot_tick", "the tick of the world's last snapshot (persistent worlds)",
                     [((world.name,), world.files.snapshot_tick) for world in kept], ["world"])
        store = self._servicer.service.store
        for name, help_text, attribute in (
                ("dbvt_snapshots_written", "snapshots written to the data directory", "snapshots_written"),
                ("dbvt_snapshot_failures", "snapshots that could not be written (the journal is kept)",
                 "snapshot_failures"),
                ("dbvt_journal_write_failures", "batches refused because their journal record could not be written",
                 "journal_failures")):
            counter = CounterMetricFamily(name, help_text)
            counter.add_metric([], getattr(store, attribute) if store is not None else 0)
            yield counter
        threads = dbvt.thread_stats()
        yield _gauge("dbvt_threads_working", "threads working against --cores: world threads running operations, "
                     "and pooled threads running a part of a call", [((), threads["working"])])
        parts = CounterMetricFamily("dbvt_thread_parts", "parts of calls cut over --threads-per-world threads, by "
                                    "who ran them: a pooled thread, or the world's own thread (--cores had no room)",
                                    labels=["on"])
        parts.add_metric(["pooled_threads"], threads["parts_on_workers"])
        parts.add_metric(["world_threads"], threads["parts_on_callers"])
        yield parts
        yield _gauge("dbvt_stream_connections", "batch streams open", [((), self._servicer.open_streams)])
        yield _gauge("dbvt_staged_bytes", "bytes held for batches and query sets whose last part has not come",
                     [((), self._servicer.service.staged.value)])


def _gauge(name: str, help_text: str, samples, labels=()) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=list(labels))
    for label_values, value in samples:
        family.add_metric(list(label_values), value)
    return family


class MetricsEndpoint:
    """/metrics, /healthz (alive) and /readyz (ready to serve) over HTTP, on a thread of its own."""

    def __init__(self, metrics: Metrics, host: str, port: int):
        self._server = ThreadingHTTPServer((host, port), _handler_for(metrics))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="dbvt-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _handler_for(metrics: Metrics):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self._answer(True)

        def do_HEAD(self):
            self._answer(False)

        def _answer(self, with_body: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                status, kind, body = 200, CONTENT_TYPE_LATEST, generate_latest(metrics.registry)
            elif path == "/healthz":
                status, kind, body = 200, "text/plain", b"alive\n"
            elif path == "/readyz":
                status = 200 if metrics.ready else 503
                kind, body = "text/plain", b"ready\n" if metrics.ready else b"shutting down\n"
            else:
                status, kind, body = 404, "text/plain", b"not found: /metrics, /healthz and /readyz are served\n"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def log_message(self, format, *args):
            """Scrapes are not logged: one every few seconds would drown the server's own lines."""

    return Handler
