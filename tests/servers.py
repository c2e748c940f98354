"""Real dbvt-servers for the tests: in a thread of this process, or as a `dbvt-server` subprocess.

Both listen on 127.0.0.1 port 0 and report the port they were given.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from concurrent import futures

import grpc

from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server.app import create_server
from dbvt_server.config import Config

LISTENING = re.compile(r"listening on (\S+):(\d+)")
# A line of the server's own log, as `dbvt-server` writes it.
OWN_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) dbvt_server: ")
# Children run outside the repository, so that `python -m` imports the installed packages, not ./dbvt.
NEUTRAL_DIR = tempfile.gettempdir()


@contextlib.contextmanager
def batch_stream_peer(answer):
    """A gRPC server on 127.0.0.1 serving StreamBatches alone, with `answer(requests, context)` (a
    generator of StreamBatchesResponse): a peer that speaks the protocol its own way. Its target."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    handler = grpc.stream_stream_rpc_method_handler(
        answer, request_deserializer=pb.StreamBatchesRequest.FromString,
        response_serializer=pb.StreamBatchesResponse.SerializeToString)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("dbvt.v1.BroadphaseService", {"StreamBatches": handler}),))
    target = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        yield target
    finally:
        server.stop(None)


def wait_until(condition, guard: float = 20.0) -> None:
    """Return once `condition()` holds; fail if it has not within `guard` seconds."""
    deadline = time.monotonic() + guard
    while not condition():
        assert time.monotonic() < deadline, f"the condition never held within {guard} s"
        time.sleep(0.01)


class ServerThread:
    """The server's event loop in a background thread, so the test's own thread can use `Client`."""

    def __init__(self, **settings):
        self.config = Config(**{"host": "127.0.0.1", "port": 0, **settings})
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self.running = self._loop.run_until_complete(create_server(self.config))
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.running.port}"

    @property
    def unix_target(self) -> str:
        """The server's Unix socket, when it listens on one."""
        return next(where for where in self.running.addresses if where.startswith("unix:"))

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.running.stop(0), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


@contextlib.contextmanager
def world_held(server: ServerThread, name: str):
    """World `name` of `server` held still, as an overlap holds its worlds: its operations wait in its
    queue until the block ends. For what must be seen while a world is busy, without timing."""
    servicer = server.running.servicer
    queue = servicer._queue(servicer.service.world(name))
    queue.hold().result(30)
    try:
        yield
    finally:
        queue.release()


def async_client(mode: str, server: "ServerThread"):
    """An AsyncClient of the SDK suites' `mode` (grpc, unix or local) on the `server` fixture."""
    from dbvt_client import AsyncClient

    if mode == "local":
        return AsyncClient.local()
    return AsyncClient(server.target if mode == "grpc" else server.unix_target)


def server_command() -> list[str]:
    found = shutil.which("dbvt-server", path=os.path.dirname(sys.executable))
    return [found] if found else [sys.executable, "-m", "dbvt_server"]


class ServerProcess:
    """`dbvt-server` as a child process; `target` is known once its start-up line has been read.

    After that line a background thread goes on reading its output into `lines`, so that a test can
    wait for a line the running server writes (`wait_for_line`).
    """

    def __init__(self, *args: str, env: dict | None = None, host: str | None = "127.0.0.1"):
        """`host` None: the server's default."""
        self.process = subprocess.Popen(
            [*server_command(), *(["--host", host] if host else []), "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})},
            cwd=NEUTRAL_DIR)
        self.lines: list[str] = []
        self.port = None
        for line in self.process.stdout:
            self.lines.append(line)
            found = LISTENING.search(line)
            if found:
                self.port = int(found.group(2))
                break
        if self.port is None:
            self.process.wait(10)
            raise RuntimeError("dbvt-server did not start:\n" + "".join(self.lines))
        self._more = threading.Condition()
        self._reader = threading.Thread(target=self._read_rest, daemon=True)
        self._reader.start()

    def _read_rest(self) -> None:
        for line in self.process.stdout:
            with self._more:
                self.lines.append(line)
                self._more.notify_all()

    def wait_for_line(self, text: str, timeout: float = 30, nth: int = 1) -> str:
        """The `nth` line containing `text`, written so far or within `timeout` seconds."""
        def found():
            return ([line for line in self.lines if text in line][nth - 1:] or [None])[0]

        with self._more:
            if not self._more.wait_for(found, timeout):
                raise AssertionError(f"no line with {text!r} in {timeout} s:\n" + "".join(self.lines))
            return found()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def terminate(self, timeout: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def output(self) -> list[str]:
        """Every line written so far that has been read (all of them once the process has ended)."""
        with self._more:
            return "".join(self.lines).splitlines()

    def wait(self, timeout: float = 30) -> int:
        self.process.wait(timeout)
        self._reader.join(timeout)
        return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(30)
