"""Exit 0 only when a dbvt-server answers the standard gRPC health check with SERVING.

The container image's HEALTHCHECK runs `python -m dbvt_server.healthcheck`; with no
--address it dials the port the server in the same container was told to bind: DBVT_HEALTH_PORT
when it is set (the plaintext port that serves only health, which works whatever TLS and tokens
the main port needs), else DBVT_PORT, on DBVT_HOST. So overriding those variables keeps the check
pointing right.
"""

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Addresses that mean "every interface": a server bound there is reached on loopback.
_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


def default_address(environ=os.environ) -> str:
    host = environ.get("DBVT_HOST", "")
    port = environ.get("DBVT_HEALTH_PORT") or environ.get("DBVT_PORT", "50051")
    if host in _WILDCARD_HOSTS:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def check(address: str, service: str = "", timeout: float = 3.0) -> str:
    """Return the health status name reported for `service` ('' is the whole server)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dbvt_server.healthcheck",
        description="Exit 0 only if the dbvt-server at ADDRESS reports SERVING.",
    )
    parser.add_argument("--address", default=None,
                        help="HOST:PORT to check, in plaintext (default: DBVT_HOST, and DBVT_HEALTH_PORT if set, else "
                             "DBVT_PORT; wildcard hosts -> 127.0.0.1)")
    parser.add_argument("--service", default="", help="service name to check (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer (default: 3)")
    args = parser.parse_args(argv)

    address = args.address or default_address()
    try:
        status = check(address, args.service, args.timeout)
    except grpc.RpcError as error:
        print(f"{address}: health check failed: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    print(f"{address}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
