"""What the container check does to a running server: a short session with the SDK, then the
same world seen through grpcurl and server reflection (no .proto files given to grpcurl).

The scene is four boxes small enough that every expected answer is written out by hand below;
closed intervals, so boxes that only touch do overlap.
"""

import base64
import json
import subprocess

import numpy as np

from dbvt_client import Client, NotFound, Unauthenticated, Unavailable

WORLD = "arena"
MAX_WORLDS = 3  # given to the container as DBVT_MAX_WORLDS: the image takes the server's settings
# id: tight box (min xyz, max xyz)
FIRST_BOXES = {
    1: (0, 0, 0, 1, 1, 1),
    2: (0.5, 0.5, 0.5, 2, 2, 2),
    3: (5, 5, 5, 6, 6, 6),
    4: (1, 1, 1, 1.5, 1.5, 1.5),   # touches 1 at a corner
}
MOVES = {
    3: (2, 2, 2, 3, 3, 3),          # now touches 2 at a corner
    4: (10, 10, 10, 11, 11, 11),    # leaves 1 and 2
}
PAIRS_AFTER = [(1, 2), (2, 3)]


class CallFailed(AssertionError):
    pass


def expect(what: str, got, wanted):
    if got != wanted:
        raise CallFailed(f"{what}: got {got}, expected {wanted}")


def rows(pairs) -> list:
    return [tuple(int(v) for v in row) for row in np.asarray(pairs).reshape(-1, 2)]


def per_query(offsets, hits) -> list:
    """CSR results as one sorted list of ids per query (the order within a query is not the point here)."""
    return [sorted(int(v) for v in hits[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1)]


def columns(boxes: dict):
    return np.array(list(boxes), dtype=np.uint64), np.array(list(boxes.values()), dtype=np.float32)


def drive(address: str):
    with Client(address, timeout=30) as client:
        expect("max_worlds set by DBVT_MAX_WORLDS", client.server_info()["max_worlds"], MAX_WORLDS)
        world = client.create_world(WORLD, dims=3, margin=0.05)

        first = world.apply(create=columns(FIRST_BOXES))
        expect("tick after the first batch", first.tick, 1)
        expect("pairs begun by the first batch", rows(first.begun), [(1, 2), (1, 4), (2, 4)])
        expect("pairs ended by the first batch", rows(first.ended), [])

        second = world.apply(move=columns(MOVES))
        expect("tick after the second batch", second.tick, 2)
        expect("pairs begun by the second batch", rows(second.begun), [(2, 3)])
        expect("pairs ended by the second batch", rows(second.ended), [(1, 4), (2, 4)])
        expect("pairs", rows(world.pairs()), PAIRS_AFTER)

        boxes = np.array([[0.9, 0.9, 0.9, 1, 1, 1], [7, 7, 7, 8, 8, 8], [2, 2, 2, 2, 2, 2]], dtype=np.float32)
        expect("query_aabb", per_query(*world.query_aabb(boxes)), [[1, 2], [], [2, 3]])

        centers = np.array([[3.5, 3.5, 3.5], [10.5, 10.5, 10.5]], dtype=np.float32)
        radii = np.array([0.9, 0.1], dtype=np.float32)
        expect("query_sphere", per_query(*world.query_sphere(centers, radii)), [[3], [4]])

        segments = np.array([[-1, 0.25, 0.25, 10, 0.25, 0.25], [0, 0, 0, 12, 12, 12]], dtype=np.float32)
        offsets, hits, fractions = world.raycast(segments)
        expect("raycast hits, nearest first", [int(v) for v in hits], [1, 1, 2, 3, 4])
        expect("raycast offsets", [int(v) for v in offsets], [0, 1, 5])
        expected_fractions = [1 / 11, 0, 0.5 / 12, 2 / 12, 10 / 12]
        if not np.allclose(fractions, expected_fractions, rtol=0, atol=1e-6):
            raise CallFailed(f"raycast fractions: got {list(fractions)}, expected {expected_fractions}")
        offsets, hits, _ = world.raycast(segments, first_hit=True)
        expect("raycast first hits", per_query(offsets, hits), [[1], [1]])

        planes = np.array([_cube_planes(-0.5, 0.25), _cube_planes(9, 12)], dtype=np.float32)
        expect("query_frustum", per_query(*world.query_frustum(planes)), [[1], [4]])

        stats = world.stats()
        expect("stats proxies and tick", (stats["proxies"], stats["tick"]), (4, 2))
        try:
            client.world("no-such-world").pairs()
        except NotFound:
            pass
        else:
            raise CallFailed("pairs() of an unknown world did not raise NotFound")
    print("    SDK: settings from the environment, create world, 2 batches with pair changes, "
          "aabb/sphere/raycast/frustum queries, pairs, stats, NotFound: all as expected")


def drive_secured(address: str, ca_pem: bytes, token: str):
    """Against a server with TLS and tokens: who is refused, and the token's session."""
    for what, refused, error in (("a plaintext client", Client(address, timeout=10), Unavailable),
                                 ("a client without a token", Client(address, tls=ca_pem, timeout=10),
                                  Unauthenticated)):
        with refused:
            try:
                refused.list_worlds()
            except error:
                continue
            raise CallFailed(f"{what} was let in")
    with Client(address, tls=ca_pem, token=token, timeout=30) as client:
        world = client.create_world(WORLD)
        first = world.apply(create=columns(FIRST_BOXES))
        expect("pairs begun over TLS", rows(first.begun), [(1, 2), (1, 4), (2, 4)])
        expect("pairs over TLS", rows(world.apply(move=columns(MOVES)).begun), [(2, 3)])
        expect("query over TLS", per_query(*world.query_aabb(np.array([[2, 2, 2, 2, 2, 2]], np.float32))), [[2, 3]])
        client.delete_world(WORLD)
    print("    plaintext client: Unavailable; no token: Unauthenticated; TLS and token: create, 2 batches, "
          "query, delete: all as expected")


def _cube_planes(low: float, high: float) -> list:
    """Six inward-facing planes (n, d), n.x + d >= 0 inside, bounding the cube [low, high]^3."""
    planes = []
    for axis in range(3):
        normal = [0.0, 0.0, 0.0]
        normal[axis] = 1.0
        planes.append(normal + [-low])
        normal = [0.0, 0.0, 0.0]
        normal[axis] = -1.0
        planes.append(normal + [high])
    return planes


def drive_grpcurl(address: str, grpcurl: str):
    services = _grpcurl(grpcurl, address, "list").split()
    for service in ("dbvt.v1.BroadphaseService", "grpc.health.v1.Health"):
        if service not in services:
            raise CallFailed(f"grpcurl list: {service} not offered by reflection (got {services})")
    description = _grpcurl(grpcurl, address, "describe", "dbvt.v1.BroadphaseService")
    if "rpc ApplyBatch" not in description:
        raise CallFailed(f"grpcurl describe: no ApplyBatch in\n{description}")

    health = json.loads(_grpcurl(grpcurl, address, "grpc.health.v1.Health/Check", data={}))
    expect("grpcurl health status", health.get("status"), "SERVING")

    listed = json.loads(_grpcurl(grpcurl, address, "dbvt.v1.BroadphaseService/ListWorlds", data={}))
    arena = [w for w in listed.get("worlds", []) if w.get("name") == WORLD]
    # proto3 JSON writes 64-bit integers as strings
    expect("grpcurl ListWorlds arena (proxies, tick)",
           [(w.get("proxies"), w.get("tick")) for w in arena], [("4", "2")])

    answer = json.loads(_grpcurl(grpcurl, address, "dbvt.v1.BroadphaseService/GetPairs", data={"world": WORLD}))
    pairs = np.frombuffer(base64.b64decode(answer.get("pairs", "")), dtype="<u8")
    expect("grpcurl GetPairs", rows(pairs), PAIRS_AFTER)

    missing = subprocess.run([grpcurl, "-plaintext", "-d", json.dumps({"world": "no-such-world"}), address,
                              "dbvt.v1.BroadphaseService/GetPairs"], capture_output=True, text=True, timeout=60)
    if missing.returncode == 0 or "NotFound" not in missing.stdout + missing.stderr:
        raise CallFailed(f"grpcurl GetPairs of an unknown world: expected NotFound, got "
                         f"{missing.returncode}: {missing.stdout}{missing.stderr}")
    print("    grpcurl via reflection: list, describe, Health/Check SERVING, ListWorlds, GetPairs, NotFound: "
          "all as expected")


def _grpcurl(grpcurl: str, address: str, *verb: str, data=None) -> str:
    command = [grpcurl, "-plaintext", *(["-d", json.dumps(data)] if data is not None else []), address, *verb]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise CallFailed(f"{' '.join(command[1:])} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout
