"""Fake CSI v1.12 plugin: Identity, Controller, GroupController, SnapshotMetadata and Node.

It advertises every capability it implements (see the tuples below) and nothing else.
State lives in :class:`~plugproxy.fakes.csi_model.CsiBackend`; the RPCs v0.3 has too are
:class:`~plugproxy.fakes.csi_plugin.FakeCsi` in v1's names, the others are here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from plugproxy.fakes.common import (
    DynMessage,
    ServicerContext,
    add_capabilities,
    enum_number,
    require,
)
from plugproxy.fakes.csi_messages import capacity_range, optional_capability
from plugproxy.fakes.csi_model import DEFAULT_METADATA_BATCH, Group, KiB
from plugproxy.fakes.csi_plugin import HEALTHY, V0_CONTROLLER_CAPABILITIES, FakeCsi
from plugproxy.spec.csi_names import CSI_V1_NAMES

PLUGIN_SERVICES = (
    "CONTROLLER_SERVICE",
    "VOLUME_ACCESSIBILITY_CONSTRAINTS",
    "GROUP_CONTROLLER_SERVICE",
    "SNAPSHOT_METADATA_SERVICE",
)
CONTROLLER_CAPABILITIES = (
    *V0_CONTROLLER_CAPABILITIES,
    "CLONE_VOLUME",
    "PUBLISH_READONLY",
    "EXPAND_VOLUME",
    "LIST_VOLUMES_PUBLISHED_NODES",
    "VOLUME_CONDITION",
    "GET_VOLUME",
    "SINGLE_NODE_MULTI_WRITER",
    "MODIFY_VOLUME",
    "GET_SNAPSHOT",
)
NODE_CAPABILITIES = (
    "STAGE_UNSTAGE_VOLUME",
    "GET_VOLUME_STATS",
    "EXPAND_VOLUME",
    "VOLUME_CONDITION",
    "SINGLE_NODE_MULTI_WRITER",
    "VOLUME_MOUNT_GROUP",
)
GROUP_CAPABILITIES = ("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT",)


class FakeCsiV1(FakeCsi):
    spec_name = "csi.v1"
    default_plugin_name = "csi.fake.plugproxy.io"
    key_fields = (
        "volume_id",
        "snapshot_id",
        "group_snapshot_id",
        "base_snapshot_id",
        "name",
        "source_volume_id",
    )
    names = CSI_V1_NAMES
    content_sources = ("snapshot", "volume")
    source_id_missing = "volume_content_source.{kind} id"
    multi_writer_modes = True
    plugin_services = PLUGIN_SERVICES
    volume_expansion = ("ONLINE",)
    controller_capabilities = CONTROLLER_CAPABILITIES
    node_capabilities = NODE_CAPABILITIES

    # -- message builders -----------------------------------------------------------------

    def fill_group(self, msg: DynMessage, group: Group) -> None:
        msg.group_snapshot_id = group.id
        for sid in group.snapshot_ids:
            self.fill_snapshot(msg.snapshots.add(), self.backend.snapshots[sid])
        msg.creation_time.FromNanoseconds(group.created_ns)
        msg.ready_to_use = True

    # -- Controller -----------------------------------------------------------------------

    async def GetSnapshot(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        require(request.snapshot_id, "snapshot_id")
        resp = self.new("GetSnapshotResponse")
        self.fill_snapshot(resp.snapshot, self.backend.snapshot(request.snapshot_id))
        return resp

    async def ControllerExpandVolume(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        vol, node_expansion = self.backend.expand(
            request.volume_id,
            capacity_range(request),
            optional_capability(request, "volume_capability"),
        )
        return self.new(
            "ControllerExpandVolumeResponse",
            capacity_bytes=vol.capacity,
            node_expansion_required=node_expansion,
        )

    async def ControllerGetVolume(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        require(request.volume_id, "volume_id")
        vol = self.backend.volume(request.volume_id)
        resp = self.new("ControllerGetVolumeResponse")
        self.fill_volume(resp.volume, vol)
        self.fill_status(resp.status, vol)
        return resp

    async def ControllerModifyVolume(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        self.backend.modify(request.volume_id, dict(request.mutable_parameters))
        return self.new("ControllerModifyVolumeResponse")

    # -- GroupController ------------------------------------------------------------------

    async def GroupControllerGetCapabilities(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        resp = self.new("GroupControllerGetCapabilitiesResponse")
        add_capabilities(resp, "rpc", GROUP_CAPABILITIES)
        return resp

    async def CreateVolumeGroupSnapshot(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        group = self.backend.create_group(
            request.name, list(request.source_volume_ids), dict(request.parameters)
        )
        resp = self.new("CreateVolumeGroupSnapshotResponse")
        self.fill_group(resp.group_snapshot, group)
        return resp

    async def DeleteVolumeGroupSnapshot(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        self.backend.delete_group(request.group_snapshot_id, list(request.snapshot_ids))
        return self.new("DeleteVolumeGroupSnapshotResponse")

    async def GetVolumeGroupSnapshot(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        group = self.backend.get_group(request.group_snapshot_id, list(request.snapshot_ids))
        resp = self.new("GetVolumeGroupSnapshotResponse")
        self.fill_group(resp.group_snapshot, group)
        return resp

    # -- SnapshotMetadata (server streaming) -----------------------------------------------

    async def _metadata(
        self,
        response_name: str,
        style: str,
        capacity: int,
        tuples: Sequence[tuple[int, int]],
        max_results: int,
    ) -> AsyncIterator[DynMessage]:
        batch = max_results or DEFAULT_METADATA_BATCH
        for start in range(0, max(len(tuples), 1), batch):
            resp = self.new(response_name, volume_capacity_bytes=capacity)
            resp.block_metadata_type = enum_number(resp, "block_metadata_type", style)
            for offset, size in tuples[start : start + batch]:
                resp.block_metadata.add(byte_offset=offset, size_bytes=size)
            yield resp
            await asyncio.sleep(0)  # let other calls run between messages

    async def GetMetadataAllocated(
        self, request: DynMessage, context: ServicerContext
    ) -> AsyncIterator[DynMessage]:
        require(request.snapshot_id, "snapshot_id")
        snap = self.backend.snapshot(request.snapshot_id)
        start = request.starting_offset
        self.backend.check_stream_args(snap, start, request.max_results)
        tuples = [t for t in self.backend.allocated_blocks(snap) if sum(t) > start]
        async for resp in self._metadata(
            "GetMetadataAllocatedResponse", "FIXED_LENGTH", snap.size, tuples, request.max_results
        ):
            yield resp

    async def GetMetadataDelta(
        self, request: DynMessage, context: ServicerContext
    ) -> AsyncIterator[DynMessage]:
        base, target = self.backend.delta_pair(request.base_snapshot_id, request.target_snapshot_id)
        start = request.starting_offset
        self.backend.check_stream_args(target, start, request.max_results)
        tuples = [t for t in self.backend.changed_extents(base, target) if sum(t) > start]
        async for resp in self._metadata(
            "GetMetadataDeltaResponse", "VARIABLE_LENGTH", target.size, tuples, request.max_results
        ):
            yield resp

    # -- Node -----------------------------------------------------------------------------

    async def NodeGetVolumeStats(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        vol = self.backend.path_of(request.volume_id, request.volume_path)
        resp = self.new("NodeGetVolumeStatsResponse")
        used = vol.capacity // 8
        resp.usage.add(
            total=vol.capacity,
            used=used,
            available=vol.capacity - used,
            unit=self.enum_value("VolumeUsage", "unit", "BYTES"),
        )
        if vol.mount:
            inodes = max(vol.capacity // (16 * KiB), 1)
            resp.usage.add(
                total=inodes,
                used=inodes // 100,
                available=inodes - inodes // 100,
                unit=self.enum_value("VolumeUsage", "unit", "INODES"),
            )
        resp.volume_condition.abnormal = False
        resp.volume_condition.message = HEALTHY
        return resp

    async def NodeExpandVolume(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        capacity = self.backend.node_expand(
            request.volume_id,
            request.volume_path,
            capacity_range(request),
            optional_capability(request, "volume_capability"),
        )
        return self.new("NodeExpandVolumeResponse", capacity_bytes=capacity)
