"""The server's TLS: gRPC's own credentials, with certificates that can be swapped without a restart.

gRPC asks `ServerTls._fetch` for new certificates at each handshake; `reload()` (on SIGHUP) reads the
files, checks them with the `ssl` module, and only then hands them over, so a half-written or
mismatched file leaves the certificates in force. Connections already open keep theirs.
"""
from __future__ import annotations

import logging
import ssl
import threading

import grpc

log = logging.getLogger("dbvt_server")


class TlsFileError(ValueError):
    pass


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise TlsFileError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None


def _configuration(cert: str, key: str, client_ca: str | None):
    """The files as a gRPC certificate configuration, once `ssl` has accepted them as a pair."""
    checker = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        checker.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TlsFileError(f"the certificate {cert} and key {key} are not a usable pair: {exc}") from None
    root = None
    if client_ca:
        root = _read(client_ca, "client CA bundle")
        try:
            checker.load_verify_locations(cadata=root.decode("ascii"))
        except (UnicodeDecodeError, ssl.SSLError) as exc:
            raise TlsFileError(f"the client CA bundle {client_ca} holds no usable certificate: {exc}") from None
    pair = (_read(key, "private key"), _read(cert, "certificate"))
    return grpc.ssl_server_certificate_configuration([pair], root_certificates=root)


class ServerTls:
    def __init__(self, cert: str, key: str, client_ca: str | None):
        self._files = (cert, key, client_ca)
        self._initial = _configuration(cert, key, client_ca)
        self._fresh = None
        self._lock = threading.Lock()

    @property
    def mutual(self) -> bool:
        return self._files[2] is not None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self._initial, self._fetch,
                                                   require_client_authentication=self.mutual)

    def _fetch(self):
        """On gRPC's handshake threads: the configuration read since the last call, or None (no change)."""
        with self._lock:
            fresh, self._fresh = self._fresh, None
        return fresh

    def reload(self) -> None:
        try:
            fresh = _configuration(*self._files)
        except TlsFileError as exc:
            log.error("TLS files not reloaded, the certificates in force stay: %s", exc)
            return
        with self._lock:
            self._fresh = fresh
        log.info("TLS files reloaded: new connections get them")
