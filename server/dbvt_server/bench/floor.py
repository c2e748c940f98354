"""dbvt-bench's wire floor: what a tick-by-tick round trip costs in gRPC itself, with no dbvt code.

A bare grpc.aio server in a child process answers each message of a bidirectional stream once a thread
of its pool has busy-waited as long as the message asks, as dbvt-server answers a batch once a world
thread has applied it. A synchronous client sends messages of a streamed step's size and waits for
each answer, as `BatchStream.apply()` does. The round trip minus the wait is the floor: the thread
hand-offs, HTTP/2 and the kernel, which any server built this way pays.

    python -m dbvt_server.bench.floor --serve     # the child: prints its port, serves until killed
"""
from __future__ import annotations

import asyncio
import queue
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

METHOD = "/dbvt_bench.Floor/Echo"
# A request: seconds to work (float64) and bytes to answer (uint32), then padding to its size.
HEADER = struct.Struct("<dI")
ROUNDS = 40
WARM_UP = 5


def _work(seconds: float, answer_bytes: int) -> bytes:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass
    return bytes(answer_bytes)


async def _serve() -> None:
    pool = ThreadPoolExecutor(max_workers=1)

    async def echo(requests, context):
        loop = asyncio.get_running_loop()
        async for request in requests:
            seconds, answer_bytes = HEADER.unpack_from(request)
            yield await loop.run_in_executor(pool, _work, seconds, answer_bytes)

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1)])
    handler = grpc.stream_stream_rpc_method_handler(echo)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("dbvt_bench.Floor", {"Echo": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def floor(work_seconds: float, request_bytes: int, answer_bytes: int, rounds: int = ROUNDS) -> float:
    """Median seconds a round trip takes beyond `work_seconds` of work on the server's thread."""
    process = subprocess.Popen([sys.executable, "-m", "dbvt_server.bench.floor", "--serve"],
                               stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    try:
        port = int(process.stdout.readline())
        request = HEADER.pack(work_seconds, answer_bytes).ljust(request_bytes, b"\0")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            requests: queue.SimpleQueue = queue.SimpleQueue()
            answers = channel.stream_stream(METHOD)(iter(requests.get, None))
            seconds = []
            for _ in range(WARM_UP + rounds):
                started = time.perf_counter()
                requests.put(request)
                next(answers)
                seconds.append(time.perf_counter() - started)
            requests.put(None)
            list(answers)
        return statistics.median(seconds[WARM_UP:]) - work_seconds
    finally:
        process.kill()
        process.wait()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    asyncio.run(_serve())
