"""Fake CSI v0.3 plugin: Identity, Controller and Node on the shared CSI storage model.

v0.3 has no cloning, expansion, stats, modify or group snapshots; volumes may only come
from snapshots; snapshots report ``created_at`` in nanoseconds and a READY status.
"""

from __future__ import annotations

import plugproxy
from plugproxy.fakes.base import FakePlugin
from plugproxy.fakes.common import DynMessage, ServicerContext, add_capabilities, invalid, require
from plugproxy.fakes.csi_messages import (
    capacity_range,
    optional_capability,
    parse_capabilities,
    topology_requirement,
)
from plugproxy.fakes.csi_model import (
    MAX_VOLUMES_PER_NODE,
    NODE_ID,
    NODE_TOPOLOGY,
    CsiBackend,
    Snapshot,
    Volume,
)
from plugproxy.fakes.knobs import FakeKnobs

PLUGIN_SERVICES = ("CONTROLLER_SERVICE", "ACCESSIBILITY_CONSTRAINTS")
CONTROLLER_CAPABILITIES = (
    "CREATE_DELETE_VOLUME",
    "PUBLISH_UNPUBLISH_VOLUME",
    "LIST_VOLUMES",
    "GET_CAPACITY",
    "CREATE_DELETE_SNAPSHOT",
    "LIST_SNAPSHOTS",
)
NODE_CAPABILITIES = ("STAGE_UNSTAGE_VOLUME",)


class FakeCsiV0(FakePlugin):
    spec_name = "csi.v0"
    default_plugin_name = "csi-v0.fake.plugproxy.io"
    key_fields = ("volume_id", "snapshot_id", "name", "source_volume_id")

    def __init__(self, knobs: FakeKnobs | None = None) -> None:
        super().__init__(knobs)
        self.backend = CsiBackend(
            multi_writer_modes=False,
            id_bytes=self.knobs.id_bytes,
            token_bytes=self.knobs.token_bytes,
        )

    @staticmethod
    def fill_volume(msg: DynMessage, vol: Volume) -> None:
        msg.capacity_bytes = vol.capacity
        msg.id = vol.id
        msg.attributes.update(vol.context)
        if vol.source is not None:
            msg.content_source.snapshot.id = vol.source[1]
        for topology in vol.topology:
            msg.accessible_topology.add().segments.update(topology)

    def fill_snapshot(self, msg: DynMessage, snap: Snapshot) -> None:
        msg.size_bytes = snap.size
        msg.id = snap.id
        msg.source_volume_id = snap.source_volume_id
        msg.created_at = snap.created_ns
        msg.status.type = self.enum_value("SnapshotStatus", "type", "READY")

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
            if src.WhichOneof("type") != "snapshot":
                raise invalid("volume_content_source must name a snapshot")
            require(src.snapshot.id, "volume_content_source.snapshot.id")
            source = ("snapshot", src.snapshot.id)
        vol = self.backend.create_volume(
            request.name,
            caps,
            capacity_range(request),
            dict(request.parameters),
            {},
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
        info = self.backend.controller_publish(
            request.volume_id,
            request.node_id,
            optional_capability(request, "volume_capability"),
            request.readonly,
            dict(request.volume_attributes),
        )
        return self.new("ControllerPublishVolumeResponse", publish_info=info)

    async def ControllerUnpublishVolume(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        self.backend.controller_unpublish(request.volume_id, request.node_id)
        return self.new("ControllerUnpublishVolumeResponse")

    async def ValidateVolumeCapabilities(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        caps = parse_capabilities(request.volume_capabilities, "volume_capabilities")
        vol, reason = self.backend.validate(
            request.volume_id, caps, dict(request.volume_attributes), {}, {}
        )
        wanted = [dict(t.segments) for t in request.accessible_topology]
        if not reason and wanted and not any(t in wanted for t in vol.topology):
            reason = "the volume is not accessible from the given topologies"
        return self.new("ValidateVolumeCapabilitiesResponse", supported=not reason, message=reason)

    async def ListVolumes(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        vols, next_token = self.backend.list_volumes(request.max_entries, request.starting_token)
        resp = self.new("ListVolumesResponse", next_token=next_token)
        for vol in vols:
            self.fill_volume(resp.entries.add().volume, vol)
        return resp

    async def GetCapacity(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        caps = parse_capabilities(request.volume_capabilities, "volume_capabilities")
        topology = (
            dict(request.accessible_topology.segments)
            if request.HasField("accessible_topology")
            else None
        )
        return self.new(
            "GetCapacityResponse",
            available_capacity=self.backend.available_capacity(caps, topology),
        )

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

    # -- Node -----------------------------------------------------------------------------

    async def NodeStageVolume(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        self.backend.node_stage(
            request.volume_id,
            request.staging_target_path,
            optional_capability(request, "volume_capability"),
            dict(request.volume_attributes),
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
            dict(request.publish_info),
            dict(request.volume_attributes),
        )
        return self.new("NodePublishVolumeResponse")

    async def NodeUnpublishVolume(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        self.backend.node_unpublish(request.volume_id, request.target_path)
        return self.new("NodeUnpublishVolumeResponse")

    async def NodeGetId(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        return self.new("NodeGetIdResponse", node_id=NODE_ID)

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
