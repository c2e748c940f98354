"""TLS and mutual TLS with real handshakes: who can connect, with what; the plaintext health port."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dbvt_client import TLS, AsyncClient, Client, PermissionDenied, Unauthenticated, Unavailable, Unimplemented
from dbvt_client.security import is_local
from dbvt_server.tls import TlsFileError
from security import Pki, TokenFile
from servers import ServerThread


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def stranger(tmp_path_factory):
    """Another CA, which the servers do not trust and whose server certificates clients must refuse."""
    return Pki(tmp_path_factory.mktemp("other-pki"), "other")


@pytest.fixture(scope="module")
def tls_server(pki):
    running = ServerThread(**pki.server_settings())
    yield running
    running.stop()


@pytest.fixture(scope="module")
def mutual_server(pki):
    running = ServerThread(**pki.server_settings(mutual=True))
    yield running
    running.stop()


def refused(client: Client) -> None:
    with client, pytest.raises(Unavailable):
        client.list_worlds()


def test_a_client_trusting_the_ca_connects_however_the_ca_is_given(tls_server, pki):
    for tls in (str(pki.ca), pki.ca, pki.ca.read_bytes(), TLS(ca=pki.ca)):
        with Client(tls_server.target, tls=tls, timeout=10) as client:
            assert client.list_worlds() == []


def test_a_plaintext_client_cannot_talk_to_a_tls_server(tls_server):
    refused(Client(tls_server.target, timeout=10))


def test_a_client_trusting_another_ca_refuses_the_server(tls_server, stranger):
    refused(Client(tls_server.target, tls=stranger.ca, timeout=10))


def test_the_system_roots_do_not_trust_a_private_ca(tls_server):
    refused(Client(tls_server.target, tls=True, timeout=10))


def test_mutual_tls_needs_a_client_certificate_the_ca_signed(mutual_server, pki, stranger):
    refused(Client(mutual_server.target, tls=pki.ca, timeout=10))
    refused(Client(mutual_server.target, tls=TLS(ca=pki.ca, cert=stranger.client_cert, key=stranger.client_key),
                   timeout=10))
    with Client(mutual_server.target, tls=TLS(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)) as client:
        world = client.create_world("mutual")
        assert world.apply(create=([1], [[0, 0, 0, 1, 1, 1]])).tick == 1
        client.delete_world("mutual")


def test_the_server_name_can_differ_from_the_target(tmp_path):
    named = Pki(tmp_path, "named")
    issued = named.authority.issue_cert("broadphase.internal")
    issued.cert_chain_pems[0].write_to_path(str(named.cert))
    issued.private_key_pem.write_to_path(str(named.key))
    server = ServerThread(**named.server_settings())
    try:
        refused(Client(server.target, tls=named.ca, timeout=10))
        with Client(server.target, tls=TLS(ca=named.ca, server_name="broadphase.internal")) as client:
            assert client.list_worlds() == []
    finally:
        server.stop()


def test_the_health_port_answers_in_plaintext_while_the_main_port_needs_tls_and_a_token(pki, tmp_path):
    tokens = TokenFile(tmp_path / "tokens", ("ops", "admin", "*"))
    server = ServerThread(**pki.server_settings(), tokens=str(tokens.path), health_port=0)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.running.health_port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        # Only health there: the worlds are not reachable around TLS and tokens.
        with Client(f"127.0.0.1:{server.running.health_port}", timeout=10) as around, \
                pytest.raises(Unimplemented):
            around.list_worlds()
        refused(Client(server.target, timeout=10))
        with Client(server.target, tls=pki.ca, timeout=10) as no_token, pytest.raises(Unauthenticated):
            no_token.list_worlds()
        with Client(server.target, tls=pki.ca, token=tokens.secret["ops"]) as client:
            assert client.list_worlds() == []
    finally:
        server.stop()


def test_unusable_certificate_files_stop_the_start_naming_them(pki, stranger, tmp_path):
    missing = tmp_path / "missing.pem"
    with pytest.raises(TlsFileError, match="missing.pem"):
        ServerThread(tls_cert=str(missing), tls_key=str(pki.key))
    with pytest.raises(TlsFileError, match="not a usable pair"):
        ServerThread(tls_cert=str(pki.cert), tls_key=str(stranger.key))
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("not a certificate")
    with pytest.raises(TlsFileError, match="ca.txt"):
        ServerThread(**pki.server_settings(), tls_client_ca=str(not_pem))


def test_client_tls_settings_are_checked_before_connecting(pki, tmp_path):
    with pytest.raises(ValueError, match="both cert and key"):
        TLS(ca=pki.ca, cert=pki.client_cert)
    with pytest.raises(TypeError, match="tls must be"):
        Client("127.0.0.1:1", tls=1)
    with pytest.raises(ValueError, match="cannot read the CA bundle .*nowhere.pem"):
        Client("127.0.0.1:1", tls=tmp_path / "nowhere.pem")


def test_a_token_goes_in_the_clear_only_to_this_machine():
    with pytest.raises(ValueError, match="sent in the clear without TLS"):
        Client("10.1.2.3:50051", token="secret")
    for target in ("127.0.0.1:1", "localhost:1", "[::1]:1", "dns:///localhost:1", "unix:/tmp/dbvt.sock",
                   "ipv4:127.0.0.1:1,127.0.0.2:1"):
        assert is_local(target), target
        Client(target, token="secret").close()
    for target in ("example.org:1", "10.1.2.3:1", "ipv4:127.0.0.1:1,10.0.0.1:1", "dns:///example.org:1"):
        assert not is_local(target), target


def test_the_async_client_takes_tls_and_a_token(pki, tmp_path):
    tokens = TokenFile(tmp_path / "tokens", ("ops", "admin", "*"), ("viewer", "read", "arena-*"))
    server = ServerThread(**pki.server_settings(mutual=True), tokens=str(tokens.path))
    tls = TLS(ca=pki.ca.read_bytes(), cert=pki.client_cert.read_bytes(), key=pki.client_key.read_bytes())

    async def drive():
        async with AsyncClient(server.target, tls=tls, token=tokens.secret["ops"]) as admin:
            for name in ("arena-1", "lobby"):
                await admin.create_world(name)
            async with admin.world("arena-1").stream() as stream:
                assert (await stream.apply(create=([1, 2], [[0, 0, 0, 1, 1, 1]] * 2))).begun.tolist() == [[1, 2]]
        async with AsyncClient(server.target, tls=tls, token=tokens.secret["viewer"]) as viewer:
            assert await viewer.list_worlds() == ["arena-1"]
            with pytest.raises(PermissionDenied):
                await viewer.world("arena-1").apply(destroy=[1])
        async with AsyncClient(server.target, tls=tls) as stranger:
            with pytest.raises(Unauthenticated):
                await stranger.list_worlds()

    try:
        asyncio.run(drive())
    finally:
        server.stop()
