"""The RPCs of moving a world to another server: BeginMove and FinishMove (what `dbvt-admin rebalance`
calls around an ExportWorld here and an ImportWorld there).

A mixin of `dbvt_server.servicer.BroadphaseServicer`, whose world queues and error handling it uses.
"""
from __future__ import annotations

import logging

from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server import access
from dbvt_server.access import by_whom
from dbvt_server.decoding import decoded
from dbvt_server.logs import shown
from dbvt_server.worlds import World

log = logging.getLogger("dbvt_server")


def _frozen(world: World, request) -> pb.BeginMoveResponse:
    # On the world's thread, after every operation queued before the move began.
    return pb.BeginMoveResponse(world=world.info())


class MoveRpcs:
    async def BeginMove(self, request, context):
        """The world frozen at once (later calls are refused with Moving), then answered once the
        operations queued before have run: the answer's tick is the one the destination must hold."""
        try:
            decoded(request)
            access.require("admin", request.world)
            world = self.service.begin_move(request)
            log.info("moving world %s to %s%s", shown(world.name), world.moving_to, by_whom())
            return await self._start(world, _frozen, request)
        except Exception as exc:
            await self._abort(context, "BeginMove", request, exc)

    async def FinishMove(self, request, context):
        try:
            decoded(request)
            access.require("admin", request.world)
            destination = self.service.held(request.world).moving_to
            response = self.service.finish_move(request)
            log.info("%s world %s%s", "cancelled the move of" if request.cancel else f"moved to {destination}:",
                     shown(request.world), by_whom())
            return response
        except Exception as exc:
            await self._abort(context, "FinishMove", request, exc)
