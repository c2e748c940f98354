"""One server's transport that follows where its worlds are: redirects to their owner, and moves.

A server of a replica set answers a call for a world it neither holds nor owns with WrongServer
naming the owner: the call is made again there once, and the owner remembered, so later calls,
streams and feeds on that world go straight to it (as Redis Cluster clients follow MOVED). A world
being moved answers Moving: the call changed nothing, and is made again with backoff until the move
ends (after it, the old server redirects to the new one).
"""
from __future__ import annotations

import asyncio
import time

from dbvt_client.errors import InvalidArgument, Moving, WrongServer, client_closed

# Retrying a call on a moving world: the first wait, the longest, and when to give up and raise Moving.
MOVE_RETRY_FIRST = 0.02
MOVE_RETRY_LONGEST = 1.0
MOVE_RETRY_SECONDS = 60.0


def world_of(request) -> str:
    """The world a request is about."""
    for field in ("world", "name", "world_a"):
        if hasattr(request, field):
            return getattr(request, field)
    raise InvalidArgument(f"{type(request).__name__} names no world to route by")


def _world_or_none(request) -> str | None:
    try:
        return world_of(request)
    except InvalidArgument:
        return None


class _Redirects:
    """Where a server has said a world lives."""

    def __init__(self, target: str, make_transport):
        self._here = make_transport(target)
        self._make = make_transport
        self._elsewhere: dict = {}
        self._owners: dict[str, str] = {}
        self._closed = False

    def _at(self, world: str | None):
        found = self._owners.get(world) if world is not None else None
        return self._here if found is None else self._elsewhere[found]

    def _learn(self, world: str, moved: WrongServer):
        if moved.owner not in self._elsewhere:
            if self._closed:
                # A redirect heard by a call in flight as the client closed: no new channel now.
                raise client_closed()
            self._elsewhere[moved.owner] = self._make(moved.owner)
        self._owners[world] = moved.owner
        return self._elsewhere[moved.owner]

    def _transports(self) -> list:
        return [self._here, *self._elsewhere.values()]

    def remember(self, world: str, redirect: WrongServer) -> None:
        """A redirect heard on a batch stream, followed by the world's later calls and streams."""
        self._learn(world, redirect)


class _Backoff:
    """The waits between tries of a call on a moving world: doubling, capped, within a time limit."""

    def __init__(self):
        self.wait, self.until = MOVE_RETRY_FIRST, time.monotonic() + MOVE_RETRY_SECONDS

    def next(self, moving: Moving) -> float:
        wait = self.wait
        if time.monotonic() + wait > self.until:
            raise moving
        self.wait = min(2 * wait, MOVE_RETRY_LONGEST)
        return wait


class FollowingTransport(_Redirects):
    def _call(self, method: str, world: str | None, *args):
        followed, backoff = False, None
        while True:
            try:
                return getattr(self._at(world), method)(*args)
            except WrongServer as redirect:
                if world is None or followed:
                    raise
                followed = True
                self._learn(world, redirect)
            except Moving as moving:
                backoff = backoff or _Backoff()
                time.sleep(backoff.next(moving))

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
        self._closed = True
        for transport in self._transports():
            transport.close()


class AsyncFollowingTransport(_Redirects):
    """`FollowingTransport` for `AsyncClient`."""

    async def _call(self, method: str, world: str | None, *args):
        followed, backoff = False, None
        while True:
            try:
                return await getattr(self._at(world), method)(*args)
            except WrongServer as redirect:
                if world is None or followed:
                    raise
                followed = True
                self._learn(world, redirect)
            except Moving as moving:
                backoff = backoff or _Backoff()
                await asyncio.sleep(backoff.next(moving))

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
        self._closed = True
        for transport in self._transports():
            await transport.close()
