"""Fake CSI v1.12 plugin: Identity, Controller, GroupController, SnapshotMetadata and Node.

It advertises every capability it implements (see the tuples below) and nothing else.
State lives in :class:`~plugproxy.fakes.csi_model.CsiBackend`; this class only translates.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import plugproxy
from plugproxy.fakes.base import FakePlugin
from plugproxy.fakes.common import (
    DynMessage,
    ServicerContext,
    add_capabilities,
    enum_number,
    invalid,
    require,
)
from plugproxy.fakes.csi_messages import (
    capacity_range,
    optional_capability,
    parse_capabilities,
    topology_requirement,
)
from plugproxy.fakes.csi_model import (
    DEFAULT_METADATA_BATCH,
    MAX_VOLUME_SIZE,
    MAX_VOLUMES_PER_NODE,
    NODE_ID,
    NODE_TOPOLOGY,
    CsiBackend,
    Group,
    KiB,
    Snapshot,
    Volume,
)
from plugproxy.fakes.knobs import FakeKnobs

PLUGIN_SERVICES = (
    "CONTROLLER_SERVICE",
    "VOLUME_ACCESSIBILITY_CONSTRAINTS",
    "GROUP_CONTROLLER_SERVICE",
    "SNAPSHOT_METADATA_SERVICE",
)
CONTROLLER_CAPABILITIES = (
    "CREATE_DELETE_VOLUME",
    "PUBLISH_UNPUBLISH_VOLUME",
    "LIST_VOLUMES",
    "GET_CAPACITY",
    "CREATE_DELETE_SNAPSHOT",
    "LIST_SNAPSHOTS",
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
HEALTHY = "the fake volume is healthy"


class FakeCsiV1(FakePlugin):
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

    def __init__(self, knobs: FakeKnobs | None = None) -> None:
        super().__init__(knobs)
        self.backend = CsiBackend(
            multi_writer_modes=True,
            id_bytes=self.knobs.id_bytes,
            token_bytes=self.knobs.token_bytes,
        )

    # -- message builders -----------------------------------------------------------------

    @staticmethod
    def fill_volume(msg: DynMessage, vol: Volume) -> None:
        msg.capacity_bytes = vol.capacity
        msg.volume_id = vol.id
        msg.volume_context.update(vol.context)
        if vol.source is not None:
            kind, source_id = vol.source
            if kind == "snapshot":
                msg.content_source.snapshot.snapshot_id = source_id
            else:
                msg.content_source.volume.volume_id = source_id
        for topology in vol.topology:
            msg.accessible_topology.add().segments.update(topology)

    @staticmethod
    def fill_snapshot(msg: DynMessage, snap: Snapshot) -> None:
        msg.size_bytes = snap.size
        msg.snapshot_id = snap.id
        msg.source_volume_id = snap.source_volume_id
        msg.creation_time.FromNanoseconds(snap.created_ns)
        msg.ready_to_use = True
        msg.group_snapshot_id = snap.group_id

    def fill_group(self, msg: DynMessage, group: Group) -> None:
        msg.group_snapshot_id = group.id
        for sid in group.snapshot_ids:
            self.fill_snapshot(msg.snapshots.add(), self.backend.snapshots[sid])
        msg.creation_time.FromNanoseconds(group.created_ns)
        msg.ready_to_use = True

    @staticmethod
    def fill_status(status: DynMessage, vol: Volume) -> None:
        status.published_node_ids.extend(sorted(vol.published))
        status.volume_condition.abnormal = False
        status.volume_condition.message = HEALTHY

    # -- Identity -------------------------------------------------------------------------

    async def GetPluginInfo(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        return self.new(
            "GetPluginInfoResponse",
            name=self.plugin_name,
            vendor_version=plugproxy.__version__,
            manifest={"implementation": "plugproxy fake plugin"},
        )

    async def GetPluginCapabilities(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        resp = self.new("GetPluginCapabilitiesResponse")
        add_capabilities(resp, "service", PLUGIN_SERVICES)
        add_capabilities(resp, "volume_expansion", ("ONLINE",))
        return resp

    async def Probe(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        resp = self.new("ProbeResponse")
        resp.ready.value = True
        return resp

    # -- Controller -----------------------------------------------------------------------

    async def CreateVolume(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        caps = parse_capabilities(request.volume_capabilities, "volume_capabilities")
        source = None
        if request.HasField("volume_content_source"):
            src = request.volume_content_source
            kind = src.WhichOneof("type")
            if kind is None:
                raise invalid("volume_content_source must name a snapshot or a volume")
            source_id = src.snapshot.snapshot_id if kind == "snapshot" else src.volume.volume_id
            require(source_id, f"volume_content_source.{kind} id")
            source = (kind, source_id)
        vol = self.backend.create_volume(
            request.name,
            caps,
            capacity_range(request),
            dict(request.parameters),
            dict(request.mutable_parameters),
            source,
            topology_requirement(request),
        )
        resp = self.new("CreateVolumeResponse")
        self.fill_volume(resp.volume, vol)
        return resp

    async def DeleteVolume(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        self.backend.delete_volume(request.volume_id)
        return self.new("DeleteVolumeResponse")

    async def ControllerPublishVolume(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        publish_context = self.backend.controller_publish(
            request.volume_id,
            request.node_id,
            optional_capability(request, "volume_capability"),
            request.readonly,
            dict(request.volume_context),
        )
        return self.new("ControllerPublishVolumeResponse", publish_context=publish_context)

    async def ControllerUnpublishVolume(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        self.backend.controller_unpublish(request.volume_id, request.node_id)
        return self.new("ControllerUnpublishVolumeResponse")

    async def ValidateVolumeCapabilities(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        caps = parse_capabilities(request.volume_capabilities, "volume_capabilities")
        _, reason = self.backend.validate(
            request.volume_id,
            caps,
            dict(request.volume_context),
            dict(request.parameters),
            dict(request.mutable_parameters),
        )
        resp = self.new("ValidateVolumeCapabilitiesResponse")
        if reason:
            resp.message = reason
            return resp
        confirmed = resp.confirmed
        confirmed.volume_capabilities.extend(request.volume_capabilities)
        if self.knobs.older_csi:  # MountVolume.volume_mount_group came with CSI v1.5
            for cap in confirmed.volume_capabilities:
                if cap.HasField("mount"):
                    cap.mount.ClearField("volume_mount_group")
        confirmed.volume_context.update(request.volume_context)
        confirmed.parameters.update(request.parameters)
        confirmed.mutable_parameters.update(request.mutable_parameters)
        return resp

    async def ListVolumes(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        vols, next_token = self.backend.list_volumes(request.max_entries, request.starting_token)
        resp = self.new("ListVolumesResponse", next_token=next_token)
        for vol in vols:
            entry = resp.entries.add()
            self.fill_volume(entry.volume, vol)
            self.fill_status(entry.status, vol)
        return resp

    async def GetCapacity(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        caps = parse_capabilities(request.volume_capabilities, "volume_capabilities")
        topology = (
            dict(request.accessible_topology.segments)
            if request.HasField("accessible_topology")
            else None
        )
        resp = self.new(
            "GetCapacityResponse",
            available_capacity=self.backend.available_capacity(caps, topology),
        )
        resp.maximum_volume_size.value = MAX_VOLUME_SIZE
        resp.minimum_volume_size.value = 1
        return resp

    async def ControllerGetCapabilities(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        resp = self.new("ControllerGetCapabilitiesResponse")
        add_capabilities(resp, "rpc", CONTROLLER_CAPABILITIES)
        return resp

    async def CreateSnapshot(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        snap = self.backend.create_snapshot(
            request.name, request.source_volume_id, dict(request.parameters)
        )
        resp = self.new("CreateSnapshotResponse")
        self.fill_snapshot(resp.snapshot, snap)
        return resp

    async def DeleteSnapshot(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        self.backend.delete_snapshot(request.snapshot_id)
        return self.new("DeleteSnapshotResponse")

    async def ListSnapshots(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        snaps, next_token = self.backend.list_snapshots(
            request.max_entries,
            request.starting_token,
            request.snapshot_id,
            request.source_volume_id,
        )
        resp = self.new("ListSnapshotsResponse", next_token=next_token)
        for snap in snaps:
            self.fill_snapshot(resp.entries.add().snapshot, snap)
        return resp

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

    async def NodeStageVolume(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        self.backend.node_stage(
            request.volume_id,
            request.staging_target_path,
            optional_capability(request, "volume_capability"),
            dict(request.volume_context),
        )
        return self.new("NodeStageVolumeResponse")

    async def NodeUnstageVolume(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        self.backend.node_unstage(request.volume_id, request.staging_target_path)
        return self.new("NodeUnstageVolumeResponse")

    async def NodePublishVolume(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        self.backend.node_publish(
            request.volume_id,
            request.target_path,
            request.staging_target_path,
            optional_capability(request, "volume_capability"),
            request.readonly,
            dict(request.publish_context),
            dict(request.volume_context),
        )
        return self.new("NodePublishVolumeResponse")

    async def NodeUnpublishVolume(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        self.backend.node_unpublish(request.volume_id, request.target_path)
        return self.new("NodeUnpublishVolumeResponse")

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

    async def NodeGetCapabilities(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        resp = self.new("NodeGetCapabilitiesResponse")
        add_capabilities(resp, "rpc", NODE_CAPABILITIES)
        return resp

    async def NodeGetInfo(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        resp = self.new(
            "NodeGetInfoResponse", node_id=NODE_ID, max_volumes_per_node=MAX_VOLUMES_PER_NODE
        )
        resp.accessible_topology.segments.update(NODE_TOPOLOGY)
        return resp
