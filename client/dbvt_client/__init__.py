"""Python SDK for dbvt-server, the networked broadphase.

    from dbvt_client import Client
    with Client("127.0.0.1:50051") as client:
        world = client.create_world("arena", dims=3, margin=0.05)
        r = world.apply(create=(ids, boxes))        # r.tick, r.begun, r.ended
        offsets, hits = world.query_aabb(boxes)

`AsyncClient` has the same methods, awaitable; `Client.local()` runs the same API in-process on the
server's own worlds (which needs `pip install dbvt-server`; the SDK itself is pure Python). Errors raise one class per gRPC status,
all subclasses of `DbvtError`. `Client(target, token=..., tls=...)` reaches a server with tokens and TLS.
"""
from dbvt_client.aio import AsyncBatchStream, AsyncClient, AsyncWorld
from dbvt_client.batches import Create
from dbvt_client.client import BatchStream, Client, World
from dbvt_client.errors import (AlreadyExists, Cancelled, DbvtError, DeadlineExceeded, FailedPrecondition, Internal,
                                InvalidArgument, Moving, NotFound, PermissionDenied, ResourceExhausted, TickMismatch,
                                Unauthenticated, Unavailable, Unimplemented, Unknown, WrongServer)
from dbvt_client.results import (BatchResult, Crossings, Hits, NearestHits, RayHits, SensorEvents, Snapshot,
                                 WorldInfo)
from dbvt_client.security import TLS
from dbvt_client.watching import AsyncSensorWatch, SensorSet, SensorWatch

__all__ = [
    "Client", "World", "BatchStream", "AsyncClient", "AsyncWorld", "AsyncBatchStream", "Create", "TLS",
    "BatchResult", "Hits", "RayHits", "NearestHits", "Crossings", "WorldInfo", "Snapshot", "SensorEvents", "SensorWatch", "AsyncSensorWatch",
    "SensorSet",
    "DbvtError", "InvalidArgument", "NotFound", "AlreadyExists", "ResourceExhausted", "FailedPrecondition",
    "TickMismatch", "WrongServer",
    "Unavailable", "Moving", "DeadlineExceeded", "Cancelled", "Unimplemented", "Internal", "Unauthenticated",
    "PermissionDenied", "Unknown",
]
__version__ = "0.1.0"
