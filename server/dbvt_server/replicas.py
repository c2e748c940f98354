"""The replica set a server routes worlds by (--peers and --advertise).

`--peers` is either every server's host:port, or one DNS name (`dns:///name:port`, such as a
Kubernetes headless Service) that resolves to all of them: it is resolved before the server serves
and again every RESOLVE_SECONDS, off the event loop, so that a replica added or removed changes the
owners without a restart. Servers and routed clients hash over the same strings (what
`dbvt_client.routing.resolve` makes of the name), so both find the same owner.
"""
from __future__ import annotations

import logging

from dbvt_client.routing import is_dns, owner, resolve

log = logging.getLogger("dbvt_server")

# How often a DNS replica set is looked up again.
RESOLVE_SECONDS = 30.0


class Replicas:
    def __init__(self, peers: tuple[str, ...] = (), advertise: str | None = None):
        self.advertise = advertise
        self._name = peers[0] if len(peers) == 1 and is_dns(peers[0]) else None
        self.members: list[str] = [] if self._name else list(peers)

    @property
    def resolved_by_dns(self) -> bool:
        return self._name is not None

    def owner(self, world: str) -> str | None:
        """The server that owns `world`, or None when this server owns every world (no --peers)."""
        return owner(world, self.members) if self.members else None

    def refresh(self) -> None:
        """The DNS name looked up again (blocking: run it on a thread). A failed look-up keeps the set
        it had: a DNS hiccup must not move worlds."""
        if self._name is None:
            return
        try:
            found = resolve(self._name)
        except OSError as exc:
            log.warning("cannot resolve --peers %s (%s); keeping the replica set %s", self._name, exc,
                        ",".join(self.members) or "(none yet)")
            return
        if found != self.members:
            log.info("replica set from %s: %s", self._name, ",".join(found))
            if self.advertise not in found:
                log.warning("--advertise %s is not among the addresses of %s (%s): clients will be sent to the "
                            "others for every world", self.advertise, self._name, ",".join(found))
            self.members = found
