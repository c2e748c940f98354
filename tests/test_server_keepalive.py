"""Streams of clients that vanish without a word (a host gone, a cable pulled: no FIN, no RST) are
reaped by the server's keepalive pings instead of being held for ever."""
from __future__ import annotations

import socket
import threading

import numpy as np

from dbvt_client import Client
from servers import ServerThread, wait_until



class SilentLink:
    """A TCP relay from a local port to `target` that, once `cut()`, drops every byte both ways while
    keeping both connections open, as a dead network path does."""

    def __init__(self, target: tuple[str, int]):
        self._target = target
        self._cut = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inner, _ = self._listener.accept()
            except OSError:
                return
            outer = socket.create_connection(self._target)
            self._sockets += [inner, outer]
            for source, sink in ((inner, outer), (outer, inner)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    return
                if not self._cut.is_set():
                    sink.sendall(data)
            except OSError:
                return

    def cut(self) -> None:
        self._cut.set()

    def close(self) -> None:
        for each in self._sockets:
            each.close()



def test_a_stream_whose_client_went_silent_is_reaped():
    server = ServerThread(keepalive_seconds=1)
    link = SilentLink(("127.0.0.1", server.running.port))
    try:
        client = Client(link.address)
        stream = client.create_world("silent").stream()
        assert stream.apply(create=([1], np.zeros((1, 6), np.float32))).tick == 1
        assert server.running.servicer.open_streams == 1
        link.cut()
        wait_until(lambda: server.running.servicer.open_streams == 0)
        client.close()
        stream.close()
    finally:
        link.close()
        server.stop()
