"""Wrapping gRPC method handlers, for the server's interceptors (tokens, metrics).

A grpc.aio interceptor gets the handler a call would run and may return another: here, one whose
behavior runs `before(context)` first, in the call's own task (so context variables it sets reach
the handler), and `after(context, state, failure)` at the end, however the call ends.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Callable

import grpc

# The gRPC handler constructor for each kind of RPC: (request streaming, response streaming).
HANDLER_MAKERS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def behavior_of(handler: grpc.RpcMethodHandler) -> Callable:
    return handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream


def replaced(handler: grpc.RpcMethodHandler, behavior: Callable) -> grpc.RpcMethodHandler:
    """A handler of the same kind and (de)serializers as `handler`, running `behavior`."""
    made = HANDLER_MAKERS[handler.request_streaming, handler.response_streaming]
    return made(behavior, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


def wrapped(handler: grpc.RpcMethodHandler, before: Callable, after: Callable | None = None):
    """`handler`, its behavior run between `before(context) -> state` and
    `after(context, state, failure)` (failure: the exception that ended the call, or None)."""
    behavior = behavior_of(handler)

    @contextlib.contextmanager
    def around(context):
        state, failure = before(context), None
        try:
            yield
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if after is not None:
                after(context, state, failure)

    if handler.response_streaming:
        async def streaming(request, context):
            with around(context):
                answers = behavior(request, context)
                if inspect.isasyncgen(answers):
                    async for answer in answers:
                        yield answer
                else:
                    # A handler that writes with context.write() and returns nothing.
                    await answers

        return replaced(handler, streaming)

    async def unary(request, context):
        with around(context):
            answer = behavior(request, context)
            return await answer if inspect.isawaitable(answer) else answer

    return replaced(handler, unary)
