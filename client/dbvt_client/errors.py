"""The one error table: a gRPC status code per exception class, both ways.

The client raises the class of the status the server answered with, carrying the server's message;
the server (and `Client.local()`) turn Python exceptions into those classes with `from_exception`,
so the same bad input raises the same class whether the world is remote or in-process.
"""
from __future__ import annotations

import grpc


class DbvtError(Exception):
    """Base of every error the SDK raises; `message` is the server's text, `code` its gRPC status."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What the server sends as trailing metadata with this error, beside its message."""
        return ()


class InvalidArgument(DbvtError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(DbvtError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(DbvtError):
    code = grpc.StatusCode.ALREADY_EXISTS


class ResourceExhausted(DbvtError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(DbvtError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class TickMismatch(FailedPrecondition):
    """`apply(..., expected_tick=t)` found the world at another tick, and applied nothing. `tick` and
    `incarnation` are the world's: a client that lost the answer to a batch sent with expected_tick t
    and sees tick t + 1 in the same incarnation knows that its batch went in."""

    def __init__(self, message: str, tick: int, incarnation: int):
        super().__init__(message)
        self.tick = tick
        self.incarnation = incarnation

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (TICK_KEY, str(self.tick)), (INCARNATION_KEY, str(self.incarnation))

    @classmethod
    def from_metadata(cls, message: str, metadata) -> "TickMismatch | None":
        found = dict(metadata or ())
        if TICK_KEY not in found or INCARNATION_KEY not in found:
            return None
        return cls(message, int(found[TICK_KEY]), int(found[INCARNATION_KEY]))


class WrongServer(FailedPrecondition):
    """The server does not hold the world and is not its owner among its peers; `owner` is the
    `host:port` of the one that is (trailing metadata dbvt-owner). The SDK follows it once."""

    def __init__(self, message: str, owner: str):
        super().__init__(message)
        self.owner = owner

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((OWNER_KEY, self.owner),)


OWNER_KEY = "dbvt-owner"


# Trailing metadata of a TickMismatch: the world's tick and incarnation.
TICK_KEY = "dbvt-tick"
INCARNATION_KEY = "dbvt-incarnation"


class Unavailable(DbvtError):
    code = grpc.StatusCode.UNAVAILABLE


def client_closed() -> Unavailable:
    """What every call of a closed client raises, and every stream and feed its closing cut."""
    return Unavailable("the client is closed")


class Moving(Unavailable):
    """The world is being moved to another server (`destination`, trailing metadata dbvt-moving), and
    nothing was done: the SDK retries the call with backoff until the move ends."""

    def __init__(self, message: str, destination: str):
        super().__init__(message)
        self.destination = destination

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((MOVING_KEY, self.destination),)


MOVING_KEY = "dbvt-moving"


class DeadlineExceeded(DbvtError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(DbvtError):
    code = grpc.StatusCode.CANCELLED


class Unimplemented(DbvtError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(DbvtError):
    code = grpc.StatusCode.INTERNAL


class Unauthenticated(DbvtError):
    """The server needs a token and got none, or one it does not know."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(DbvtError):
    """The token is known but lacks the right (read, write, admin) or the world."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unknown(DbvtError):
    code = grpc.StatusCode.UNKNOWN


ERROR_CLASSES: dict[grpc.StatusCode, type[DbvtError]] = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, AlreadyExists, ResourceExhausted, FailedPrecondition,
                Unavailable, DeadlineExceeded, Cancelled, Unimplemented, Internal, Unauthenticated,
                PermissionDenied, Unknown)
}
_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def from_status(code: grpc.StatusCode, message: str) -> DbvtError:
    return ERROR_CLASSES.get(code, Unknown)(message or code.name)


def from_status_number(number: int, message: str) -> DbvtError:
    """The error for a google.rpc.Code number, as carried in a StreamBatchesResponse."""
    return from_status(_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN), message)


def from_refusal(number: int, message: str, world_server: str) -> DbvtError:
    """The error a stream's batch or query set was refused with: its google.rpc.Code number and message,
    and for a world that moves or lives elsewhere its server, which a unary call's trailing metadata
    carries (dbvt-moving, dbvt-owner)."""
    error = from_status_number(number, message)
    if world_server and isinstance(error, Unavailable):
        return Moving(message, world_server)
    if world_server and isinstance(error, FailedPrecondition):
        return WrongServer(message, world_server)
    return error


def from_rpc_error(error: grpc.RpcError) -> DbvtError:
    if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
        mismatch = TickMismatch.from_metadata(error.details() or "", error.trailing_metadata())
        if mismatch is not None:
            return mismatch
        owner = dict(error.trailing_metadata() or ()).get(OWNER_KEY)
        if owner:
            return WrongServer(error.details() or "", owner)
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        destination = dict(error.trailing_metadata() or ()).get(MOVING_KEY)
        if destination:
            return Moving(error.details() or "", destination)
    return from_status(error.code(), error.details() or "")


def from_stream_status(code: grpc.StatusCode, details: str) -> DbvtError:
    """The error that ended a batch stream. A stream fails as a whole only when it is cut off (a rejected
    batch is answered within it), and gRPC's own words for that ("Cancelling all calls", "Socket
    closed") do not say what was cut off."""
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(f"the server closed the batch stream ({details or code.name})")
    return from_status(code, details)


# Longer names are cut in messages: a message is sent as gRPC metadata, whose size is limited (past
# 8 KiB gRPC may drop it and answer RESOURCE_EXHAUSTED instead), and a name is only echoed to be recognized.
NAME_SHOWN_WHOLE = 64
NAME_CUT_TO = 40


def quoted(name: str) -> str:
    """A world name as messages show it: quoted, and cut when long ('abc…' (10000 characters))."""
    if len(name) <= NAME_SHOWN_WHOLE:
        return repr(name)
    return f"{name[:NAME_CUT_TO] + '…'!r} ({len(name)} characters)"


def from_exception(exc: BaseException) -> DbvtError:
    """Python exceptions of the core and of argument conversion, as the SDK's classes."""
    if isinstance(exc, DbvtError):
        return exc
    if isinstance(exc, KeyError):
        # The core's KeyError names the unknown id and its row; str() of a KeyError adds quotes.
        return InvalidArgument(str(exc.args[0]) if exc.args else "unknown id")
    if isinstance(exc, (ValueError, TypeError, OverflowError)):
        return InvalidArgument(str(exc))
    if isinstance(exc, MemoryError):
        return ResourceExhausted("out of memory")
    return Internal(f"{type(exc).__name__}: {exc}")
