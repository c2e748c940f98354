"""Safe defaults and clear refusals: loopback unless told, a warning when exposed, reflection behind
tokens or off, settings and token files that cannot work refused at start."""
from __future__ import annotations

import ipaddress
import subprocess

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dbvt_server import tokens
from security import Pki, TokenFile
from servers import NEUTRAL_DIR, ServerProcess, ServerThread, server_command

LISTEN = "0A"


def listening_addresses(port: int) -> list[ipaddress.IPv4Address]:
    """The local address of every listening TCP socket on `port`; IPv4-mapped IPv6 ones as IPv4."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                address, _, hex_port = local.rpartition(":")
                if state == LISTEN and int(hex_port, 16) == port:
                    found.append(_address(address))
    return found


def _address(hex_address: str):
    """/proc/net writes an address as 32-bit words, each in the machine's (little-endian) order."""
    words = [bytes.fromhex(hex_address[i:i + 8])[::-1] for i in range(0, len(hex_address), 8)]
    address = ipaddress.ip_address(b"".join(words))
    return getattr(address, "ipv4_mapped", None) or address


def test_by_default_the_server_listens_on_ipv4_loopback_only():
    server = ServerProcess(host=None)
    try:
        assert "listening on 127.0.0.1:" in server.output()[-1]
        # gRPC may listen on ::ffff:127.0.0.1, which is 127.0.0.1 too; never on :: or 0.0.0.0.
        assert listening_addresses(server.port) == [ipaddress.ip_address("127.0.0.1")]
        assert not any("WARNING" in line for line in server.output())
        assert server.terminate() == 0
    finally:
        server.kill()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize("secured, missing", [((), "TLS and tokens"), (("tls",), "tokens"), (("tokens",), "TLS")])
def test_listening_beyond_this_machine_without_tls_and_tokens_warns(pki, tmp_path, secured, missing):
    flags = [*(pki.server_flags() if "tls" in secured else []),
             *(["--tokens", str(TokenFile(tmp_path / "t", ("ops", "admin", "*")).path)] if "tokens" in secured else [])]
    server = ServerProcess(*flags, host="0.0.0.0")
    try:
        warning = server.wait_for_line("WARNING")
        assert f"listening on 0.0.0.0, beyond this machine, without {missing}:" in warning
        assert server.terminate() == 0
    finally:
        server.kill()


def test_no_warning_with_tls_and_tokens(pki, tmp_path):
    token_file = TokenFile(tmp_path / "t", ("ops", "admin", "*"))
    server = ServerProcess(*pki.server_flags(), "--tokens", str(token_file.path), host="0.0.0.0")
    try:
        assert "(TLS, tokens," in server.output()[-1]
        assert server.terminate() == 0
        assert not any("WARNING" in line for line in server.output())
    finally:
        server.kill()


def list_services(target: str, metadata=None) -> list[str]:
    with grpc.insecure_channel(target) as channel:
        answers = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=metadata, timeout=10)
        return [service.name for answer in answers for service in answer.list_services_response.service]


def test_reflection_needs_a_token_and_can_be_turned_off(tmp_path):
    token_file = TokenFile(tmp_path / "t", ("viewer", "read", "*"))
    server = ServerThread(tokens=str(token_file.path))
    try:
        with pytest.raises(grpc.RpcError) as refused:
            list_services(server.target)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        bearer = (("authorization", f"Bearer {token_file.secret['viewer']}"),)
        assert "dbvt.v1.BroadphaseService" in list_services(server.target, bearer)
    finally:
        server.stop()
    server = ServerThread(reflection="off")
    try:
        with pytest.raises(grpc.RpcError) as missing:
            list_services(server.target)
        assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop()


def run_server(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*server_command(), "--port", "0", *args], capture_output=True, text=True, timeout=60,
                          cwd=NEUTRAL_DIR)


@pytest.mark.parametrize("args, message", [
    (["--tls-cert", "c.pem"], "--tls-cert needs --tls-key as well"),
    (["--tls-key", "k.pem"], "--tls-key needs --tls-cert as well"),
    (["--tls-client-ca", "ca.pem"], "--tls-client-ca needs --tls-cert as well"),
    (["--reflection", "yes"], "--reflection yes: reflection must be on or off"),
    (["--health-port", "70000"], "--health-port 70000: health_port must be between 0 and 65535"),
])
def test_settings_that_cannot_work_are_refused(args, message):
    refused = run_server(*args)
    assert refused.returncode == 2
    assert message in refused.stderr


def test_a_token_file_that_cannot_be_used_stops_the_start_naming_the_line(tmp_path):
    token_file = tmp_path / "tokens"
    token_file.write_text("# tokens\n\nops admin *\n")
    refused = run_server("--tokens", str(token_file))
    assert refused.returncode == 1
    assert f"{token_file} line 3: expected '<name> <role> <world-glob> sha256:<hex>', got 3 fields" in refused.stderr
    refused = run_server("--tokens", str(tmp_path / "missing"))
    assert refused.returncode == 1
    assert "cannot read the token file" in refused.stderr and "missing" in refused.stderr


@pytest.mark.parametrize("line, message", [
    ("ops owner * sha256:" + "0" * 64, "the role 'owner' must be one of read, write, admin"),
    ("ops admin * my-plain-token", "the file never holds a token itself"),
    ("ops admin * sha256:" + "0" * 63, "sha256:<64 lower-case hex digits>"),
    ("o/ps admin * sha256:" + "0" * 64, "the name 'o/ps' must be"),
])
def test_each_wrong_token_line_is_named(line, message):
    with pytest.raises(tokens.TokenFileError, match="tokens line 2: .*" + message.replace("*", "\\*")):
        tokens.parse("# comment\n" + line, "tokens")


def test_a_name_used_twice_is_refused():
    line = "ops admin * sha256:" + "0" * 64
    with pytest.raises(tokens.TokenFileError, match="line 2: the name 'ops' is used twice"):
        tokens.parse(f"{line}\n{line}  # again", "tokens")


def test_new_token_prints_a_token_once_and_the_line_that_grants_it():
    made = subprocess.run([*server_command(), "new-token", "arena-game", "write", "arena-*"], capture_output=True,
                          text=True, timeout=60, cwd=NEUTRAL_DIR)
    assert made.returncode == 0, made.stderr
    token_line, file_line = made.stdout.splitlines()
    secret = token_line.rsplit(" ", 1)[1]
    [granted] = tokens.parse(file_line.split(": ", 1)[1], "printed")
    assert (granted.name, granted.role, granted.worlds) == ("arena-game", "write", "arena-*")
    assert secret not in file_line
    assert tokens.find([granted], secret) == granted
    assert tokens.find([granted], secret + "x") is None
    refused = subprocess.run([*server_command(), "new-token", "x", "owner", "*"], capture_output=True, text=True,
                             timeout=60, cwd=NEUTRAL_DIR)
    assert refused.returncode == 2 and "invalid choice: 'owner'" in refused.stderr


def test_roles_include_the_ones_below_and_globs_match_whole_names():
    admin = tokens.Token("ops", "admin", "arena-*", b"")
    assert admin.has("read") and admin.has("write") and admin.has("admin")
    assert not tokens.Token("game", "write", "*", b"").has("admin")
    assert admin.covers("arena-7") and not admin.covers("lobby") and not admin.covers("xarena-7")
