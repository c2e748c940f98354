"""Who is calling, and what they may do: tokens checked on every call, rights checked per world.

With a token file, `TokenInterceptor` authenticates every call but the health service's (a probe has
no token) before any handler runs, and hands the caller to the handler in `CALLER`. The servicer then
asks `Access.require` for the right its method needs on the world it names. Without a token file
there is no interceptor, `CALLER` stays None, and every call may do everything.
"""
from __future__ import annotations

import contextvars
import logging
import threading

import grpc

from dbvt_client.errors import PermissionDenied, Unauthenticated, quoted
from dbvt_server import handlers, tokens
from dbvt_server.tokens import Token

log = logging.getLogger("dbvt_server")

# The token of the call being handled; None when the server has no token file.
CALLER: contextvars.ContextVar[Token | None] = contextvars.ContextVar("dbvt_caller", default=None)
# Answered without a token, so that probes and load balancers can reach it.
OPEN_SERVICES = ("/grpc.health.v1.Health/",)
BEARER = "bearer "


class Access:
    """The token file's tokens, swapped whole on `reload()` (a call in flight keeps the token it was
    let in with)."""

    def __init__(self, path: str):
        self.path = path
        self._tokens = tokens.load(path)
        self._lock = threading.Lock()

    def reload(self) -> None:
        """Re-read the file; when it is wrong, keep the tokens in force and log why."""
        try:
            fresh = tokens.load(self.path)
        except tokens.TokenFileError as exc:
            log.error("token file not reloaded, the tokens in force stay: %s", exc)
            return
        with self._lock:
            self._tokens = fresh
        log.info("token file reloaded: %d tokens", len(fresh))

    def authenticate(self, metadata) -> Token:
        """The caller's token from the call's `authorization: Bearer <token>` metadata."""
        presented = None
        for key, value in metadata or ():
            if key == "authorization":
                presented = value
        if presented is None:
            raise Unauthenticated("this server needs a token: send metadata 'authorization: Bearer <token>' "
                                  "(the SDK's Client(..., token=...))")
        if not presented.lower().startswith(BEARER):
            raise Unauthenticated("the authorization metadata must be 'Bearer <token>'")
        with self._lock:
            known = self._tokens
        token = tokens.find(known, presented[len(BEARER):].strip())
        if token is None:
            raise Unauthenticated("the token is not known to this server")
        return token


def require(right: str, world: str | None = None) -> None:
    """PermissionDenied unless the calling token has `right` (read, write or admin) on `world` (None:
    the server as a whole, such as its info)."""
    caller = CALLER.get()
    if caller is None:
        return
    if caller.has(right) and (world is None or caller.covers(world)):
        return
    on = "" if world is None else f" on world {quoted(world)}"
    why = (f"its role is {caller.role}" if not caller.has(right)
           else f"it is limited to worlds {caller.worlds!r}")
    raise PermissionDenied(f"token {caller.name!r} may not {right}{on}: {why}")


def visible(world: str) -> bool:
    """Whether the calling token may see `world` in ListWorlds."""
    caller = CALLER.get()
    return caller is None or caller.covers(world)


def caller_name() -> str | None:
    caller = CALLER.get()
    return None if caller is None else caller.name


def by_whom() -> str:
    """" by token 'name'" for a log line, when the call carried a token."""
    name = caller_name()
    return "" if name is None else f" by token {name!r}"


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call reach its handler only with a known token, and sets `CALLER` for the handler."""

    def __init__(self, access: Access, on_refused):
        self._access = access
        # Called with (method, error) for every refused call, for the server's log.
        self._on_refused = on_refused

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_SERVICES):
            return handler
        try:
            caller = self._access.authenticate(details.invocation_metadata)
        except Unauthenticated as error:
            self._on_refused(details.method, error)
            return handlers.replaced(handler, _refusing(handler, error))
        return handlers.wrapped(handler, lambda context: CALLER.set(caller))


def _refusing(handler, error: Unauthenticated):
    if handler.response_streaming:
        async def refuse_stream(request, context):
            await context.abort(error.code, error.message)
            yield  # makes this an async generator, as gRPC expects of a streaming handler

        return refuse_stream

    async def refuse(request, context):
        await context.abort(error.code, error.message)

    return refuse
