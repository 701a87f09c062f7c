"""The fake CSI plugin as v0.3 and v1.12 share it: Identity, Controller and Node on the
shared storage model (:class:`~plugproxy.fakes.csi_model.CsiBackend`).

What differs between the versions is data, set by each version's subclass: the names of
the fields v1 renamed (:class:`~plugproxy.spec.csi_names.CsiNames`), the content sources,
the access modes and what the fake advertises. Fields only one version's messages declare
(v1's volume status, capacity bounds, mutable parameters and confirmed capabilities; v0.3's
supported flag and topologies to validate) are read and filled where the message declares
them. The RPCs only one version has are in that version's module.
"""

from __future__ import annotations

from typing import ClassVar

import plugproxy
from plugproxy.fakes.base import FakePlugin
from plugproxy.fakes.common import (
    DynMessage,
    ServicerContext,
    add_capabilities,
    enum_number,
    has_descriptor_field,
    invalid,
    require,
)
from plugproxy.fakes.csi_messages import (
    capacity_range,
    declared_map,
    optional_capability,
    parse_capabilities,
    topology_requirement,
)
from plugproxy.fakes.csi_model import (
    MAX_VOLUME_SIZE,
    MAX_VOLUMES_PER_NODE,
    NODE_ID,
    NODE_TOPOLOGY,
    CsiBackend,
    Snapshot,
    Volume,
)
from plugproxy.fakes.knobs import FakeKnobs
from plugproxy.spec.csi_names import CsiNames

HEALTHY = "the fake volume is healthy"
# Every controller capability CSI v0.3 defines: both fakes advertise them.
V0_CONTROLLER_CAPABILITIES = (
    "CREATE_DELETE_VOLUME",
    "PUBLISH_UNPUBLISH_VOLUME",
    "LIST_VOLUMES",
    "GET_CAPACITY",
    "CREATE_DELETE_SNAPSHOT",
    "LIST_SNAPSHOTS",
)


def _set_time(msg: DynMessage, field: str, ns: int) -> None:
    """A creation time: int64 nanoseconds (v0.3) or a Timestamp (v1)."""
    held = getattr(msg, field)
    if isinstance(held, int):
        setattr(msg, field, ns)
    else:
        held.FromNanoseconds(ns)


def _set_ready(msg: DynMessage, field: str) -> None:
    """A snapshot ready to use: a SnapshotStatus of type READY (v0.3) or a bool (v1)."""
    held = getattr(msg, field)
    if isinstance(held, bool):
        setattr(msg, field, True)
    else:
        held.type = enum_number(held, "type", "READY")


class FakeCsi(FakePlugin):
    """The RPCs both CSI versions define; a subclass says which version."""

    names: ClassVar[CsiNames]
    content_sources: ClassVar[tuple[str, ...]]  # "snapshot", "volume"
    source_id_missing: ClassVar[str]  # what the error calls a source's missing id ({kind})
    multi_writer_modes: ClassVar[bool]  # v1's SINGLE_NODE_MULTI_WRITER: one node, many targets
    plugin_services: ClassVar[tuple[str, ...]]
    volume_expansion: ClassVar[tuple[str, ...]]
    controller_capabilities: ClassVar[tuple[str, ...]]
    node_capabilities: ClassVar[tuple[str, ...]]

    def __init__(self, knobs: FakeKnobs | None = None) -> None:
        super().__init__(knobs)
        self.backend = CsiBackend(
            multi_writer_modes=self.multi_writer_modes,
            id_bytes=self.knobs.id_bytes,
            token_bytes=self.knobs.token_bytes,
        )

    # -- message builders -----------------------------------------------------------------

    def fill_volume(self, msg: DynMessage, vol: Volume) -> None:
        names = self.names
        msg.capacity_bytes = vol.capacity
        setattr(msg, names.volume_id, vol.id)
        getattr(msg, names.volume_context).update(vol.context)
        if vol.source is not None:
            kind, source_id = vol.source
            setattr(getattr(msg.content_source, kind), self.source_id_field(kind), source_id)
        for topology in vol.topology:
            msg.accessible_topology.add().segments.update(topology)

    def fill_snapshot(self, msg: DynMessage, snap: Snapshot) -> None:
        names = self.names
        msg.size_bytes = snap.size
        setattr(msg, names.snapshot_id, snap.id)
        msg.source_volume_id = snap.source_volume_id
        _set_time(msg, names.snapshot_created, snap.created_ns)
        _set_ready(msg, names.snapshot_ready)
        if snap.group_id:  # only v1 has group snapshots
            msg.group_snapshot_id = snap.group_id

    @staticmethod
    def fill_status(status: DynMessage, vol: Volume) -> None:
        status.published_node_ids.extend(sorted(vol.published))
        status.volume_condition.abnormal = False
        status.volume_condition.message = HEALTHY

    def source_id_field(self, kind: str) -> str:
        """The id field of a content source: named like the id of what it names."""
        return self.names.snapshot_id if kind == "snapshot" else self.names.volume_id

    def content_source(self, request: DynMessage) -> tuple[str, str] | None:
        """CreateVolume's content source as (kind, id), if it names one."""
        if not request.HasField("volume_content_source"):
            return None
        src = request.volume_content_source
        kind = src.WhichOneof("type")
        if kind not in self.content_sources:
            sources = " or ".join(f"a {k}" for k in self.content_sources)
            raise invalid(f"volume_content_source must name {sources}")
        source_id = getattr(getattr(src, kind), self.source_id_field(kind))
        require(source_id, self.source_id_missing.format(kind=kind))
        return kind, source_id

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
        add_capabilities(resp, "service", self.plugin_services)
        add_capabilities(resp, "volume_expansion", self.volume_expansion)
        return resp

    async def Probe(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        resp = self.new("ProbeResponse")
        resp.ready.value = True
        return resp

    # -- Controller -----------------------------------------------------------------------

    async def CreateVolume(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        caps = parse_capabilities(request.volume_capabilities, "volume_capabilities")
        source = self.content_source(request)
        vol = self.backend.create_volume(
            request.name,
            caps,
            capacity_range(request),
            dict(request.parameters),
            declared_map(request, "mutable_parameters"),
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
            dict(getattr(request, self.names.request_context)),
        )
        return self.new(
            "ControllerPublishVolumeResponse", **{self.names.publish_context: publish_context}
        )

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
            request.volume_id,
            caps,
            dict(getattr(request, self.names.request_context)),
            declared_map(request, "parameters"),
            declared_map(request, "mutable_parameters"),
        )
        if has_descriptor_field(request, "accessible_topology"):  # v0.3 asks about topologies
            wanted = [dict(t.segments) for t in request.accessible_topology]
            if not reason and wanted and not any(t in wanted for t in vol.topology):
                reason = "the volume is not accessible from the given topologies"
        resp = self.new("ValidateVolumeCapabilitiesResponse")
        if has_descriptor_field(resp, "supported"):  # v0.3 answers yes or no, and why not
            resp.supported = not reason
            resp.message = reason
            return resp
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
            if has_descriptor_field(entry, "status"):  # v1 lists each volume's status
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
        if has_descriptor_field(resp, "maximum_volume_size"):  # v1 tells the sizes it makes
            resp.maximum_volume_size.value = MAX_VOLUME_SIZE
            resp.minimum_volume_size.value = 1
        return resp

    async def ControllerGetCapabilities(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        resp = self.new("ControllerGetCapabilitiesResponse")
        add_capabilities(resp, "rpc", self.controller_capabilities)
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
            dict(getattr(request, self.names.request_context)),
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
            dict(getattr(request, self.names.publish_context)),
            dict(getattr(request, self.names.request_context)),
        )
        return self.new("NodePublishVolumeResponse")

    async def NodeUnpublishVolume(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        self.backend.node_unpublish(request.volume_id, request.target_path)
        return self.new("NodeUnpublishVolumeResponse")

    async def NodeGetCapabilities(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        resp = self.new("NodeGetCapabilitiesResponse")
        add_capabilities(resp, "rpc", self.node_capabilities)
        return resp

    async def NodeGetInfo(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        resp = self.new(
            "NodeGetInfoResponse", node_id=NODE_ID, max_volumes_per_node=MAX_VOLUMES_PER_NODE
        )
        resp.accessible_topology.segments.update(NODE_TOPOLOGY)
        return resp
