"""SIGHUP re-reads certificates and tokens in a running dbvt-server, while open streams stay up."""
from __future__ import annotations

import signal

import numpy as np
import pytest

from dbvt_client import Client, Unauthenticated, Unavailable
from security import Pki, TokenFile
from servers import ServerProcess

BOX = np.array([[0, 0, 0, 1, 1, 1]], dtype=np.float32)


@pytest.fixture
def files(tmp_path):
    pki = Pki(tmp_path / "first", "first")
    tokens = TokenFile(tmp_path / "tokens", ("ops", "admin", "*"), ("game", "write", "arena-*"))
    return pki, tokens


def reload(server: ServerProcess, line: str) -> None:
    """SIGHUP, and wait for the server to say it has read the files (the `line`-th time)."""
    done = sum(line in written for written in server.output())
    server.process.send_signal(signal.SIGHUP)
    server.wait_for_line(line, nth=done + 1)


def test_sighup_removes_a_token_and_rotates_the_certificate_while_a_stream_stays_up(files, tmp_path):
    pki, tokens = files
    server = ServerProcess(*pki.server_flags(), "--tokens", str(tokens.path))
    try:
        with Client(server.target, tls=pki.ca, token=tokens.secret["ops"]) as admin:
            admin.create_world("arena-1")
        game = Client(server.target, tls=pki.ca, token=tokens.secret["game"])
        stream = game.world("arena-1").stream()
        assert stream.apply(create=([1], BOX)).tick == 1

        # The game's token is withdrawn and the certificate replaced by one of a new CA.
        tokens.write(("ops", "admin", "*"))
        second = Pki(tmp_path / "second", "second")
        pki.cert.write_bytes(second.cert.read_bytes())
        pki.key.write_bytes(second.key.read_bytes())
        reload(server, "token file reloaded")
        server.wait_for_line("TLS files reloaded")

        # The open stream goes on, on its connection and with the token it was opened with.
        assert stream.apply(create=([2], BOX)).tick == 2
        stream.close()
        with pytest.raises(Unauthenticated):
            game.world("arena-1").pairs()
        game.close()
        # New connections get the new certificate: only the new CA's clients accept it.
        with Client(server.target, tls=pki.ca, token=tokens.secret["ops"], timeout=10) as old_ca:
            with pytest.raises(Unavailable):
                old_ca.list_worlds()
        with Client(server.target, tls=second.ca, token=tokens.secret["ops"]) as admin:
            assert admin.world("arena-1").pairs().tolist() == [[1, 2]]
        assert server.terminate() == 0
    finally:
        server.kill()


def test_bad_files_on_sighup_keep_the_ones_in_force_and_say_why(files):
    pki, tokens = files
    server = ServerProcess(*pki.server_flags(), "--tokens", str(tokens.path))
    try:
        tokens.path.write_text("ops admin * sha256:not-hex\n")
        pki.key.write_text("-----BEGIN PRIVATE KEY-----\nhalf written")
        reload(server, "token file not reloaded")
        tls_line = server.wait_for_line("TLS files not reloaded")
        token_line = server.wait_for_line("token file not reloaded")
        assert "ERROR" in token_line and "line 1" in token_line and "sha256:<64 lower-case hex digits>" in token_line
        assert "ERROR" in tls_line and "not a usable pair" in tls_line
        with Client(server.target, tls=pki.ca, token=tokens.secret["ops"]) as admin:
            assert admin.list_worlds() == []
        assert server.terminate() == 0
    finally:
        server.kill()
