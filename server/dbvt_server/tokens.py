"""The token file: who may call, with which role, on which worlds.

One line per token, `<name> <role> <world-glob> sha256:<hex digest of the token>`; `#` starts a
comment. The file holds digests only, so a leaked copy grants nothing; a caller's token is hashed
and compared with every digest in constant time, so response times say nothing about a digest.
"""
from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

# Each role has the rights of the ones before it.
ROLES = ("read", "write", "admin")
DIGEST_PREFIX = "sha256:"
NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


class TokenFileError(ValueError):
    pass


@dataclass(frozen=True)
class Token:
    name: str
    role: str
    # fnmatch pattern of the world names the token may touch ("*" for all).
    worlds: str
    digest: bytes

    def has(self, right: str) -> bool:
        """Whether the token's role includes `right` (one of ROLES)."""
        return ROLES.index(self.role) >= ROLES.index(right)

    def covers(self, world: str) -> bool:
        return fnmatch.fnmatchcase(world, self.worlds)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def parse(text: str, source: str) -> list[Token]:
    """The tokens of a token file's text; TokenFileError names the line that is wrong and why."""
    tokens: list[Token] = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{source} line {number}"
        if len(fields) != 4:
            raise TokenFileError(f"{where}: expected '<name> <role> <world-glob> sha256:<hex>', "
                                 f"got {len(fields)} fields")
        name, role, worlds, hashed = fields
        if not NAME.fullmatch(name):
            raise TokenFileError(f"{where}: the name {name!r} must be 1 to 64 of A-Z a-z 0-9 _ . @ -")
        if role not in ROLES:
            raise TokenFileError(f"{where}: the role {role!r} must be one of {', '.join(ROLES)}")
        if not (hashed.startswith(DIGEST_PREFIX) and HEX_DIGEST.fullmatch(hashed[len(DIGEST_PREFIX):])):
            raise TokenFileError(f"{where}: the token must be given as sha256:<64 lower-case hex digits> "
                                 "(the file never holds a token itself; see dbvt-server new-token)")
        if any(token.name == name for token in tokens):
            raise TokenFileError(f"{where}: the name {name!r} is used twice")
        tokens.append(Token(name, role, worlds, bytes.fromhex(hashed[len(DIGEST_PREFIX):])))
    return tokens


def load(path: str) -> list[Token]:
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"cannot read the token file {path}: {exc}") from None
    return parse(text, path)


def find(tokens: list[Token], presented: str) -> Token | None:
    """The token whose digest matches `presented`: every digest is compared, in constant time."""
    wanted = digest(presented)
    found = None
    for token in tokens:
        if hmac.compare_digest(token.digest, wanted):
            found = token
    return found


def new_token(name: str, role: str, worlds: str) -> tuple[str, str]:
    """A fresh random token, and its line for the token file."""
    secret = secrets.token_urlsafe(32)
    line = f"{name} {role} {worlds} {DIGEST_PREFIX}{digest(secret).hex()}"
    parse(line, "the new line")
    return secret, line
