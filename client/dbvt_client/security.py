"""How a client proves itself: TLS for the channel, a token for each call.

`Client(target, tls=..., token=...)`: `tls=True` trusts the system's roots, a path to (or the bytes of)
a PEM bundle trusts that CA, `TLS(ca=..., cert=..., key=...)` adds a client certificate for mutual TLS.
A token rides on every call as `authorization: Bearer <token>` metadata; over plaintext it is sent
only to this machine (a loopback address or a Unix socket), where no one can read it off the wire.
"""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Union

import grpc

Pem = Union[str, os.PathLike, bytes]
LOCAL_SCHEMES = ("unix:", "unix-abstract:")


@dataclass(frozen=True)
class TLS:
    """TLS settings of a client. Each of `ca`, `cert`, `key` is a PEM file's path or its bytes.

    ca: the CA bundle to trust (None: the system's roots). cert, key: the client's certificate chain
    and private key, for a server that asks for one (mutual TLS); both or neither.
    server_name: the name to check the server's certificate against, when it is not the target's host
    (such as a container reached by its IP address).
    """

    ca: Pem | None = None
    cert: Pem | None = None
    key: Pem | None = None
    server_name: str | None = None

    def __post_init__(self):
        if (self.cert is None) != (self.key is None):
            raise ValueError("TLS: give both cert and key (a client certificate and its private key), or neither")


def tls_settings(tls) -> TLS | None:
    """`tls` as given to Client: None/False, True, a CA bundle, or TLS(...)."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return TLS()
    if isinstance(tls, (str, bytes, os.PathLike)):
        return TLS(ca=tls)
    if isinstance(tls, TLS):
        return tls
    raise TypeError(f"tls must be True, a CA bundle (path or PEM bytes) or dbvt_client.TLS(...), not {tls!r}")


def _pem(value: Pem | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    try:
        with open(value, "rb") as file:
            return file.read()
    except OSError as exc:
        raise ValueError(f"TLS: cannot read the {what} {os.fspath(value)}: {exc.strerror or exc}") from None


def channel_credentials(tls: TLS) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=_pem(tls.ca, "CA bundle"),
                                        private_key=_pem(tls.key, "private key"),
                                        certificate_chain=_pem(tls.cert, "certificate"))


def is_local(target: str) -> bool:
    """Whether every address of `target` is on this machine: a Unix socket or loopback addresses."""
    if target.startswith(LOCAL_SCHEMES):
        return True
    scheme, _, rest = target.partition(":")
    if scheme in ("ipv4", "ipv6"):
        addresses = rest.split(",")
    elif scheme == "dns":
        addresses = [rest[2:].partition("/")[2] if rest.startswith("//") else rest]
    else:
        addresses = [target]
    return all(_is_loopback(address.rpartition(":")[0].strip("[]")) for address in addresses)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def call_metadata(token: str | None, target: str, tls: TLS | None) -> tuple | None:
    """The metadata that carries `token` on each call, or None without one."""
    if token is None:
        return None
    if not isinstance(token, str) or not token or token != token.strip() or "\n" in token:
        raise ValueError("token must be the non-empty string printed by dbvt-server new-token")
    if tls is None and not is_local(target):
        raise ValueError(f"a token is sent in the clear without TLS: give tls=... to reach {target!r}, "
                         "or use a loopback address or a Unix socket")
    return (("authorization", f"Bearer {token}"),)


def open_channel(grpc_module, target: str, tls: TLS | None, options: list):
    """A channel of `grpc_module` (grpc or grpc.aio) to `target`, with TLS when asked for."""
    if tls is None:
        return grpc_module.insecure_channel(target, options=options)
    if tls.server_name is not None:
        options = [*options, ("grpc.ssl_target_name_override", tls.server_name)]
    return grpc_module.secure_channel(target, channel_credentials(tls), options=options)
