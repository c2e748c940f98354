"""Worlds spread over several servers: each world lives on one of them, found by rendezvous hashing.

`Client(["host-0:50051", "host-1:50051", ...])` gives every world one owner among the targets: the
target with the highest hash of (target, world name). Every per-world call goes straight to its
owner; `list_worlds()` merges every server's list. Adding or removing a target moves only the worlds
whose highest hash was on it (what `rendezvous` hashing is for), so few worlds change owner.
"""
from __future__ import annotations

import hashlib

from dbvt_client.errors import InvalidArgument, WrongServer
from dbvt_proto.v1 import broadphase_pb2 as pb

def owner(name: str, targets: list[str]) -> str:
    """The target that owns world `name`: the highest 64-bit BLAKE2b hash of target and name."""
    def score(target: str) -> tuple[int, str]:
        digest = hashlib.blake2b(f"{target}\0{name}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big"), target

    return max(targets, key=score)


def world_of(request) -> str:
    """The world a request is about."""
    for field in ("world", "name", "world_a"):
        if hasattr(request, field):
            return getattr(request, field)
    raise InvalidArgument(f"{type(request).__name__} names no world to route by")


class _Redirects:
    """Where a server has said a world lives: each redirect (WrongServer) is followed once and
    remembered, so later calls on that world, and its streams and feeds, go straight there."""

    def __init__(self, target: str, make_transport):
        self._here = make_transport(target)
        self._make = make_transport
        self._elsewhere: dict = {}
        self._owners: dict[str, str] = {}

    def _at(self, world: str | None):
        found = self._owners.get(world) if world is not None else None
        return self._here if found is None else self._elsewhere[found]

    def _learn(self, world: str, moved: WrongServer):
        if moved.owner not in self._elsewhere:
            self._elsewhere[moved.owner] = self._make(moved.owner)
        self._owners[world] = moved.owner
        return self._elsewhere[moved.owner]

    def _transports(self) -> list:
        return [self._here, *self._elsewhere.values()]


def _world_or_none(request) -> str | None:
    try:
        return world_of(request)
    except InvalidArgument:
        return None


class FollowingTransport(_Redirects):
    """A server's transport that follows its redirects: a call on a world that a server neither holds
    nor owns is made again on the owner it names, so a client that knows only some of the servers,
    or an old list of them, still lands right."""

    def _call(self, method: str, world: str | None, *args):
        try:
            return getattr(self._at(world), method)(*args)
        except WrongServer as moved:
            if world is None:
                raise
            return getattr(self._learn(world, moved), method)(*args)

    def unary(self, method: str, request):
        return self._call("unary", _world_or_none(request), method, request)

    def query(self, method: str, requests: list):
        return self._call("query", _world_or_none(requests[0]), method, requests)

    def upload(self, method: str, requests: list):
        return self._call("upload", _world_or_none(requests[0]), method, requests)

    def stream(self, requests, world: str):
        return self._at(world).stream(requests, world)

    def watch(self, request):
        return self._at(world_of(request)).watch(request)

    def close(self) -> None:
        for transport in self._transports():
            transport.close()


class RoutedTransport:
    """A transport per target, each call on the one that owns its world."""

    def __init__(self, targets: list[str], make_transport):
        if not targets or len(set(targets)) != len(targets):
            raise ValueError(f"a routed client needs distinct targets, not {targets!r}")
        self.targets = list(targets)
        self._transports = {target: FollowingTransport(target, make_transport) for target in self.targets}

    def _for(self, name: str):
        return self._transports[owner(name, self.targets)]

    def unary(self, method: str, request):
        if method == "ListWorlds":
            worlds = [info for transport in self._transports.values()
                      for info in transport.unary(method, request).worlds]
            return pb.ListWorldsResponse(worlds=sorted(worlds, key=lambda info: info.name))
        if method == "GetServerInfo":
            return self._transports[self.targets[0]].unary(method, request)
        _check_overlap(method, request, self.targets)
        return self._for(world_of(request)).unary(method, request)

    def query(self, method: str, requests: list):
        if method == "Overlap":
            return self.unary(method, requests[0])
        return self._for(world_of(requests[0])).query(method, requests)

    def upload(self, method: str, requests: list):
        return self._for(world_of(requests[0])).upload(method, requests)

    def stream(self, requests, world: str):
        return self._for(world).stream(requests, world)

    def watch(self, request):
        return self._for(world_of(request)).watch(request)

    def close(self) -> None:
        for transport in self._transports.values():
            transport.close()


class AsyncFollowingTransport(_Redirects):
    """`FollowingTransport` for `AsyncClient`."""

    async def _call(self, method: str, world: str | None, *args):
        try:
            return await getattr(self._at(world), method)(*args)
        except WrongServer as moved:
            if world is None:
                raise
            return await getattr(self._learn(world, moved), method)(*args)

    async def unary(self, method: str, request):
        return await self._call("unary", _world_or_none(request), method, request)

    async def query(self, method: str, requests: list):
        return await self._call("query", _world_or_none(requests[0]), method, requests)

    async def upload(self, method: str, requests: list):
        return await self._call("upload", _world_or_none(requests[0]), method, requests)

    def open_stream(self, world: str):
        return self._at(world).open_stream(world)

    async def watch(self, request):
        return await self._at(world_of(request)).watch(request)

    async def close(self) -> None:
        for transport in self._transports():
            await transport.close()


class AsyncRoutedTransport:
    """`RoutedTransport` for `AsyncClient`."""

    def __init__(self, targets: list[str], make_transport):
        if not targets or len(set(targets)) != len(targets):
            raise ValueError(f"a routed client needs distinct targets, not {targets!r}")
        self.targets = list(targets)
        self._transports = {target: AsyncFollowingTransport(target, make_transport) for target in self.targets}

    def _for(self, name: str):
        return self._transports[owner(name, self.targets)]

    async def unary(self, method: str, request):
        if method == "ListWorlds":
            worlds = [info for transport in self._transports.values()
                      for info in (await transport.unary(method, request)).worlds]
            return pb.ListWorldsResponse(worlds=sorted(worlds, key=lambda info: info.name))
        if method == "GetServerInfo":
            return await self._transports[self.targets[0]].unary(method, request)
        _check_overlap(method, request, self.targets)
        return await self._for(world_of(request)).unary(method, request)

    async def query(self, method: str, requests: list):
        if method == "Overlap":
            return await self.unary(method, requests[0])
        return await self._for(world_of(requests[0])).query(method, requests)

    async def upload(self, method: str, requests: list):
        return await self._for(world_of(requests[0])).upload(method, requests)

    def open_stream(self, world: str):
        return self._for(world).open_stream(world)

    async def watch(self, request):
        return await self._for(world_of(request)).watch(request)

    async def close(self) -> None:
        for transport in self._transports.values():
            await transport.close()


def _check_overlap(method: str, request, targets: list[str]) -> None:
    if method == "Overlap" and owner(request.world_a, targets) != owner(request.world_b, targets):
        raise InvalidArgument(f"worlds {request.world_a!r} and {request.world_b!r} live on different servers: "
                              "an overlap needs both on one")
