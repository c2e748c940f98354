"""Throwaway certificate authorities, certificates and token files for the security tests."""
from __future__ import annotations

import pathlib

import trustme

from dbvt_server.tokens import DIGEST_PREFIX, digest, new_token

# The addresses the test servers listen on and are dialled at.
SERVER_NAMES = ("127.0.0.1", "localhost")


class Pki:
    """A CA, a server certificate it signed and a client certificate it signed, as PEM files in `folder`:
    ca.pem, server.pem, server-key.pem, client.pem, client-key.pem (each named `<name>-...` but the CA's
    when a name is given)."""

    def __init__(self, folder: pathlib.Path, name: str = ""):
        folder.mkdir(parents=True, exist_ok=True)
        prefix = f"{name}-" if name else ""
        self.authority = trustme.CA()
        self.ca = folder / f"{name or 'ca'}.pem"
        self.authority.cert_pem.write_to_path(str(self.ca))
        self.cert, self.key = self._issue(folder, f"{prefix}server", *SERVER_NAMES)
        self.client_cert, self.client_key = self._issue(folder, f"{prefix}client", "game-server@example.org")

    def _issue(self, folder: pathlib.Path, stem: str, *names: str) -> tuple[pathlib.Path, pathlib.Path]:
        issued = self.authority.issue_cert(*names)
        cert, key = folder / f"{stem}.pem", folder / f"{stem}-key.pem"
        cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
        issued.private_key_pem.write_to_path(str(key))
        return cert, key

    def server_flags(self, mutual: bool = False) -> list[str]:
        flags = ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]
        return flags + ["--tls-client-ca", str(self.ca)] if mutual else flags

    def server_settings(self, mutual: bool = False) -> dict:
        settings = {"tls_cert": str(self.cert), "tls_key": str(self.key)}
        return {**settings, "tls_client_ca": str(self.ca)} if mutual else settings


class TokenFile:
    """A token file with named tokens; `secret[name]` is the token to send."""

    def __init__(self, path: pathlib.Path, *grants: tuple[str, str, str]):
        self.path = path
        self.secret: dict[str, str] = {}
        self.write(*grants)

    def write(self, *grants: tuple[str, str, str]) -> None:
        """The file anew with these (name, role, world-glob) grants; names seen before keep their token."""
        lines = ["# made by the tests"]
        for name, role, worlds in grants:
            if name not in self.secret:
                self.secret[name], _ = new_token(name, role, worlds)
            lines.append(f"{name} {role} {worlds} {DIGEST_PREFIX}{digest(self.secret[name]).hex()}")
        self.path.write_text("\n".join(lines) + "\n")
