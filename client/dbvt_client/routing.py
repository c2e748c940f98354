"""Worlds spread over several servers: each world lives on one of them, found by rendezvous hashing.

`Client(["host-0:50051", "host-1:50051", ...])` gives every world one owner among the targets: the
target with the highest hash of (target, world name). `Client("dns:///name:50051")` does the same
over every address the name resolves to, looked up again every RESOLVE_SECONDS and after a server
cannot be reached; when the servers know their replica set (--peers), the client hashes over the set
they report instead, so that clients and servers always agree. Every per-world call goes straight to
its owner; `list_worlds()` merges every server's list. Adding or removing a target moves only the
worlds whose highest hash was on it (what rendezvous hashing is for), so few worlds change owner.
"""
from __future__ import annotations

import hashlib
import socket
import time

from dbvt_client.errors import InvalidArgument, Unavailable, client_closed
from dbvt_client.following import AsyncFollowingTransport, FollowingTransport, world_of
from dbvt_proto.v1 import broadphase_pb2 as pb

# How often a dns:/// target is looked up again.
RESOLVE_SECONDS = 30.0
# World names whose owner a ring remembers (hashing every call would cost microseconds a call).
REMEMBERED_OWNERS = 100_000


def owner(name: str, targets: list[str]) -> str:
    """The target that owns world `name`: the highest 64-bit BLAKE2b hash of target and name."""
    def score(target: str) -> tuple[int, str]:
        digest = hashlib.blake2b(f"{target}\0{name}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big"), target

    return max(targets, key=score)


def is_dns(target: str) -> bool:
    """Whether `target` is a DNS name to route over (`dns:///name:port` or `dns:name:port`); with an
    authority (`dns://8.8.8.8/name:port`) it is left to gRPC, as one server."""
    return target.startswith("dns:///") or (target.startswith("dns:") and not target.startswith("dns://"))


def resolve(target: str) -> list[str]:
    """Every address of a dns: target as `ip:port` (`[ip6]:port`), sorted: the strings servers with
    `--peers dns:///...` hash over too. Raises OSError when the name cannot be resolved."""
    host, _, port = target.removeprefix("dns:").removeprefix("///").rpartition(":")
    found = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    addresses = {f"[{info[4][0]}]:{port}" if info[0] == socket.AF_INET6 else f"{info[4][0]}:{port}"
                 for info in found}
    return sorted(addresses)


class Ring:
    """The targets a routed client hashes over: a fixed list, or the replica set behind a DNS name."""

    def __init__(self, targets: list[str] | str):
        self.name = targets if isinstance(targets, str) else None
        if self.name is None and (not targets or len(set(targets)) != len(targets)):
            raise ValueError(f"a routed client needs distinct targets, not {targets!r}")
        self.targets: list[str] = [] if self.name else list(targets)
        self._checked = -RESOLVE_SECONDS
        self._owners: dict[str, str] = {}

    def owner(self, name: str) -> str:
        found = self._owners.get(name)
        if found is None:
            if len(self._owners) >= REMEMBERED_OWNERS:
                self._owners.clear()
            found = self._owners[name] = owner(name, self.targets)
        return found

    @property
    def stale(self) -> bool:
        return self.name is not None and time.monotonic() - self._checked >= RESOLVE_SECONDS

    def addresses(self) -> list[str]:
        try:
            found = resolve(self.name)
        except OSError as exc:
            if self.targets:
                return self.targets                 # a DNS hiccup keeps the set it had
            raise Unavailable(f"cannot resolve {self.name}: {exc}") from None
        return found

    def adopt(self, addresses: list[str], peers: list[str]) -> None:
        """The set to hash over: the servers' own replica set when they report one, else the addresses."""
        if (list(peers) or addresses) != self.targets:
            self.targets = list(peers) or addresses
            self._owners.clear()
        self._checked = time.monotonic()


def merged_worlds(answers) -> pb.ListWorldsResponse:
    """Every server's worlds, by name; a world caught between two servers by a move is listed once,
    as the server that serves it sees it."""
    found: dict[str, pb.WorldInfo] = {}
    for answer in answers:
        for info in answer.worlds:
            if info.name not in found or found[info.name].moving_to:
                found[info.name] = info
    return pb.ListWorldsResponse(worlds=[found[name] for name in sorted(found)])


class RoutedTransport:
    """A transport per target, each call on the one that owns its world."""

    def __init__(self, targets: list[str] | str, make_transport):
        self.ring = Ring(targets)
        self._make = make_transport
        self._transports: dict[str, FollowingTransport] = {}
        self._closed = False

    def _transport(self, target: str) -> FollowingTransport:
        if target not in self._transports:
            if self._closed:
                # A server first reached after close() would get a channel nobody closes.
                raise client_closed()
            self._transports[target] = FollowingTransport(target, self._make)
        return self._transports[target]

    def _refresh(self) -> None:
        addresses = self.ring.addresses()
        peers: list[str] = []
        for address in addresses:
            try:
                peers = list(self._transport(address).unary("GetServerInfo", pb.GetServerInfoRequest()).peers)
                break
            except Unavailable:
                continue
        self.ring.adopt(addresses, peers)

    def _targets(self) -> list[str]:
        if self.ring.stale:
            self._refresh()
        return self.ring.targets

    def _on_owner(self, name: str, method: str, *args):
        """`method(*args)` on the owner of world `name`; when that server cannot be reached and the ring
        comes from DNS, the name is looked up again and the call made once more if the owner changed."""
        self._targets()
        target = self.ring.owner(name)
        try:
            return getattr(self._transport(target), method)(*args)
        except Unavailable as failure:
            if self.ring.name is None or type(failure) is not Unavailable:
                raise
            self._refresh()
            if self.ring.owner(name) == target:
                raise
            return getattr(self._transport(self.ring.owner(name)), method)(*args)

    def unary(self, method: str, request):
        if method == "ListWorlds":
            return merged_worlds(self._transport(target).unary(method, request) for target in self._targets())
        if method == "GetServerInfo":
            return self._transport(self._targets()[0]).unary(method, request)
        _check_overlap(method, request, self._targets())
        return self._on_owner(world_of(request), "unary", method, request)

    def query(self, method: str, requests: list):
        if method == "Overlap":
            return self.unary(method, requests[0])
        return self._on_owner(world_of(requests[0]), "query", method, requests)

    def upload(self, method: str, requests: list):
        return self._on_owner(world_of(requests[0]), "upload", method, requests)

    def remember(self, world: str, redirect) -> None:
        self._transport(self.ring.owner(world)).remember(world, redirect)

    def stream(self, requests, world: str):
        self._targets()
        return self._transport(self.ring.owner(world)).stream(requests, world)

    def watch(self, request):
        self._targets()
        return self._transport(self.ring.owner(world_of(request))).watch(request)

    def close(self) -> None:
        self._closed = True
        for transport in self._transports.values():
            transport.close()


class AsyncRoutedTransport:
    """`RoutedTransport` for `AsyncClient`."""

    def __init__(self, targets: list[str] | str, make_transport):
        self.ring = Ring(targets)
        self._make = make_transport
        self._transports: dict[str, AsyncFollowingTransport] = {}
        self._closed = False

    def _transport(self, target: str) -> AsyncFollowingTransport:
        if target not in self._transports:
            if self._closed:
                # A server first reached after close() would get a channel nobody closes.
                raise client_closed()
            self._transports[target] = AsyncFollowingTransport(target, self._make)
        return self._transports[target]

    async def _refresh(self) -> None:
        addresses = self.ring.addresses()
        peers: list[str] = []
        for address in addresses:
            try:
                peers = list((await self._transport(address).unary("GetServerInfo", pb.GetServerInfoRequest())).peers)
                break
            except Unavailable:
                continue
        self.ring.adopt(addresses, peers)

    async def _targets(self) -> list[str]:
        if self.ring.stale:
            await self._refresh()
        return self.ring.targets

    async def _on_owner(self, name: str, method: str, *args):
        await self._targets()
        target = self.ring.owner(name)
        try:
            return await getattr(self._transport(target), method)(*args)
        except Unavailable as failure:
            if self.ring.name is None or type(failure) is not Unavailable:
                raise
            await self._refresh()
            if self.ring.owner(name) == target:
                raise
            return await getattr(self._transport(self.ring.owner(name)), method)(*args)

    async def unary(self, method: str, request):
        targets = await self._targets()
        if method == "ListWorlds":
            return merged_worlds([await self._transport(target).unary(method, request) for target in targets])
        if method == "GetServerInfo":
            return await self._transport(targets[0]).unary(method, request)
        _check_overlap(method, request, targets)
        return await self._on_owner(world_of(request), "unary", method, request)

    async def query(self, method: str, requests: list):
        if method == "Overlap":
            return await self.unary(method, requests[0])
        return await self._on_owner(world_of(requests[0]), "query", method, requests)

    async def upload(self, method: str, requests: list):
        return await self._on_owner(world_of(requests[0]), "upload", method, requests)

    def remember(self, world: str, redirect) -> None:
        self._transport(self.ring.owner(world)).remember(world, redirect)

    def open_stream(self, world: str):
        # Opening a stream is synchronous: it uses the ring as it is, which AsyncBatchStream has
        # looked up (by asking the server's limits) just before.
        return self._transport(self.ring.owner(world)).open_stream(world)

    async def watch(self, request):
        await self._targets()
        return await self._transport(self.ring.owner(world_of(request))).watch(request)

    async def close(self) -> None:
        self._closed = True
        for transport in self._transports.values():
            await transport.close()


def transport_for(target, connect, check, asynchronous: bool):
    """What a client of `target` calls through: routed over a list of servers or a DNS name, else one
    server's transport that follows redirects and moves. `check(target)` refuses a DNS name as it
    would one server (a target without a port, a token in the clear)."""
    if isinstance(target, (list, tuple)):
        return (AsyncRoutedTransport if asynchronous else RoutedTransport)(list(target), connect)
    if isinstance(target, str) and is_dns(target):
        check(target)
        return (AsyncRoutedTransport if asynchronous else RoutedTransport)(target, connect)
    return (AsyncFollowingTransport if asynchronous else FollowingTransport)(target, connect)


def _check_overlap(method: str, request, targets: list[str]) -> None:
    if method == "Overlap" and owner(request.world_a, targets) != owner(request.world_b, targets):
        raise InvalidArgument(f"worlds {request.world_a!r} and {request.world_b!r} live on different servers: "
                              "an overlap needs both on one")
