"""The RPCs of world images: SnapshotWorld, ExportWorld and ImportWorld, and the periodic snapshots.

A mixin of `dbvt_server.servicer.BroadphaseServicer`, whose world queues and error handling it uses.
"""
from __future__ import annotations

import asyncio
import logging

from dbvt_client.errors import InvalidArgument, ResourceExhausted, quoted
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server import access
from dbvt_server.access import by_whom
from dbvt_server.decoding import decoded
from dbvt_server.logs import shown
from dbvt_server.worlds import World

log = logging.getLogger("dbvt_server")


class ImageRpcs:
    def _snapshot(self, world: World, request: pb.SnapshotWorldRequest):
        """On the world's thread: its image taken; its incarnation and the future of the file being written."""
        return world.incarnation, self.service.snapshot_files(world).snapshot(world)

    async def SnapshotWorld(self, request, context):
        incarnation, written = await self._world_rpc("SnapshotWorld", request, context)
        try:
            tick, size = await asyncio.wrap_future(written)
        except Exception as exc:
            await self._abort(context, "SnapshotWorld", request, exc)
        return pb.SnapshotWorldResponse(tick=tick, incarnation=incarnation, snapshot_bytes=size)

    def snapshot_changed_worlds(self) -> None:
        """Every persistent world changed since its last snapshot gets one (--snapshot-seconds); a busy
        world waits for the next round."""
        for world in self.service.worlds():
            if world.files is not None and not world.files.current(world):
                try:
                    started = self._start(world, _snapshot_if_kept, None)
                except ResourceExhausted:
                    continue
                started.add_done_callback(_log_snapshot_failure)

    async def ExportWorld(self, request, context):
        """The world's image at one tick, in parts."""
        async for part in self._answer_in_parts("ExportWorld", request, context):
            yield part

    async def ImportWorld(self, request_iterator, context):
        """A world from the image its parts carry: held within the staging budget, decoded and checked
        on a worker thread, and registered only when whole and valid."""
        hold, name, reserved = self.service.staged.hold(), None, False
        try:
            pieces, ephemeral = [], False
            async for request in request_iterator:
                decoded(request)
                if name is None:
                    name, ephemeral = request.name, request.ephemeral
                    access.require("admin", name)
                    self.service.import_reserve(name)
                    reserved = True
                hold.take(len(request.data), f"part {len(pieces)} of world image {quoted(name)}")
                pieces.append(request.data)
            if name is None:
                raise InvalidArgument("the import sent no parts")
            world = await asyncio.get_running_loop().run_in_executor(
                self._executor, self.service.import_build, name, ephemeral, b"".join(pieces))
            self.service.import_finish(name, world)
            reserved = False
            log.info("imported world %s at tick %d (incarnation %d, %d proxies)%s", shown(name), world.tick,
                     world.incarnation, len(world.broadphase), by_whom())
            return pb.ImportWorldResponse(world=world.info())
        except Exception as exc:
            await self._abort(context, "ImportWorld", pb.ImportWorldRequest(name=name or ""), exc)
        finally:
            if reserved:
                self.service.import_finish(name, None)
            hold.release()


def _snapshot_if_kept(world: World, request) -> None:
    # The world may have been deleted while this waited for its turn.
    if world.files is not None:
        world.files.snapshot(world)


def _log_snapshot_failure(done: asyncio.Future) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("a periodic snapshot failed: %s", done.exception())
