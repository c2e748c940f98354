"""Moving every world to the server that owns it, after replicas were added or removed.

A move of world W from server S to its owner T, each step safe to repeat, so that a move cut short
(the mover killed, S or T restarted) is finished by running the rebalance again:

1. begin  S freezes W: every call on it is refused with Moving (the SDK retries), across restarts
          too. S answers with W's tick and incarnation once the calls queued before have run.
2. copy   unless T already holds W at that tick and incarnation, S exports W and T imports it (an
          import is all or nothing, and on disk before it is answered).
3. finish S deletes W, durably, and redirects later calls to T.

W is served by one server at every moment: by S until step 1, by nobody while it moves, by T after
step 2. A copy on T that does not match (another tick or incarnation) stops the move with W still
frozen on S: both are kept for an operator, never silently dropped.
"""
from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from typing import Callable

from dbvt_client import Client, WorldInfo
from dbvt_client.routing import owner


class MoveConflict(RuntimeError):
    pass


@dataclass
class Move:
    world: str
    source: str
    destination: str
    proxies: int = 0
    copied: bool = False        # False: the destination already held it (a move finished again)
    seconds: float = 0.0


@dataclass
class Report:
    moves: list[Move] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def proxies(self) -> int:
        return sum(move.proxies for move in self.moves)


def planned(peers: list[str], held: dict[str, list[WorldInfo]]) -> list[Move]:
    """The moves that put every world `held` (by each server, of `peers` or leaving) on its owner
    among `peers`; a move already begun goes on to the destination it recorded."""
    moves = []
    for server in held:
        for info in held[server]:
            destination = info.moving_to or owner(info.name, peers)
            if destination != server:
                moves.append(Move(info.name, server, destination, info.proxies))
    return moves


def move(world: str, source: Client, destination: Client, to: str) -> Move:
    """World `world` from `source` to `destination` (whose address is `to`), as the module says."""
    started = time.perf_counter()
    frozen = source.world(world).begin_move(to)
    there = {info.name: info for info in destination.list_worlds(details=True)}.get(world)
    if there is None:
        image = io.BytesIO()
        source.world(world).export(image)
        image.seek(0)
        destination.import_world(world, image, ephemeral=frozen.ephemeral)
    elif (there.tick, there.incarnation) != (frozen.tick, frozen.incarnation):
        raise MoveConflict(f"world {world!r} is frozen on its way to {to}, which already holds another world of "
                           f"that name (tick {there.tick}, incarnation {there.incarnation}; the frozen one is at tick "
                           f"{frozen.tick}, incarnation {frozen.incarnation}): keep one, delete the other, and run "
                           "the rebalance again")
    source.world(world).finish_move()
    return Move(world, "", to, frozen.proxies, there is None, time.perf_counter() - started)


def rebalance(peers: list[str], connect: Callable[[str], Client], say: Callable[[str], None] = print,
              dry_run: bool = False, leaving: list[str] = ()) -> Report:
    """Every world of every server in `peers`, and of every server `leaving` the set, moved to its
    owner among `peers`; `connect(address)` gives a client of that one server."""
    clients = {server: connect(server) for server in [*peers, *leaving]}
    started = time.perf_counter()
    try:
        held = {server: client.list_worlds(details=True) for server, client in clients.items()}
        report = Report()
        for step in planned(peers, held):
            if dry_run:
                say(f"would move {step.world!r} ({step.proxies} proxies) from {step.source} to {step.destination}")
                continue
            if step.destination not in clients:
                clients[step.destination] = connect(step.destination)
            done = move(step.world, clients[step.source], clients[step.destination], step.destination)
            done.source = step.source
            report.moves.append(done)
            say(f"moved {step.world!r} ({done.proxies} proxies) from {step.source} to {step.destination} in "
                f"{done.seconds * 1e3:.1f} ms{'' if done.copied else ' (it was already there: finished)'}")
        report.seconds = time.perf_counter() - started
        return report
    finally:
        for client in clients.values():
            client.close()
