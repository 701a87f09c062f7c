"""What the csi.v1 and csi.v0 rule tables share, written once in each version's field names
(:class:`~plugproxy.spec.csi_names.CsiNames`).

For the RPCs and messages both versions define alike: the REQUIRED fields, the values the CO
passes back, the capability gates, the recovery rows and what an identical repeat may not
answer; and the table around a version's own data (:func:`csi_table`). What one version
states alone (its error tables, its own rows and rules) stays in its module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plugproxy.rules import (
    csi_capabilities,
    csi_listings,
    csi_metadata,
    csi_order,
    csi_placement,
    csi_readonly,
    csi_recovery,
    csi_responses,
    csi_snapshots,
    csi_volumes,
)
from plugproxy.rules.csi_common import (
    CREATE_SNAPSHOT_ARGUMENTS,
    CREATE_VOLUME_ARGUMENTS,
    staging_path_missing,
)
from plugproxy.rules.engine import (
    FieldRef,
    FixFirst,
    Hooks,
    ServiceNeeds,
    SpecTable,
    StateChange,
    merged,
)
from plugproxy.spec.csi_names import CsiNames


def codes(*names: str) -> frozenset[str]:
    return frozenset(names)


# NOT_FOUND from a delete RPC breaks the MUST "reply 0 OK" for an object that does not
# exist; csi.delete-not-idempotent (csi_responses) judges it, so it is listed in the error
# tables to keep the SHOULD csi.error-code-unexpected from reporting the same answer twice.
DELETE_NOT_FOUND = "NOT_FOUND"


def required(names: CsiNames) -> dict[str, tuple[str, ...]]:
    """The REQUIRED fields of the messages both versions define alike."""
    return {
        "GetPluginInfoResponse": ("name", "vendor_version"),
        "CreateVolumeRequest": ("name", "volume_capabilities"),
        "VolumeContentSource": ("oneof:type",),
        "VolumeContentSource.SnapshotSource": (names.snapshot_id,),
        "CreateVolumeResponse": ("volume",),
        "VolumeCapability": ("oneof:access_type", "access_mode"),
        "VolumeCapability.AccessMode": ("mode",),
        "Volume": (names.volume_id,),
        "DeleteVolumeRequest": ("volume_id",),
        "ControllerPublishVolumeRequest": ("volume_id", "node_id", "volume_capability", "readonly"),
        "ControllerUnpublishVolumeRequest": ("volume_id",),
        "ValidateVolumeCapabilitiesRequest": ("volume_id", "volume_capabilities"),
        "GetCapacityResponse": ("available_capacity",),
        "CreateSnapshotRequest": ("source_volume_id", "name"),
        "CreateSnapshotResponse": ("snapshot",),
        "DeleteSnapshotRequest": ("snapshot_id",),
        "NodeStageVolumeRequest": ("volume_id", "staging_target_path", "volume_capability"),
        "NodeUnstageVolumeRequest": ("volume_id", "staging_target_path"),
        "NodePublishVolumeRequest": ("volume_id", "target_path", "volume_capability", "readonly"),
        "NodeUnpublishVolumeRequest": ("volume_id", "target_path"),
        "NodeGetInfoResponse": ("node_id",),
    }


def echoes(names: CsiNames) -> dict[FieldRef, FieldRef]:
    """Request fields where the CO passes back what the plugin made -> where the plugin
    made it, in the RPCs both versions define."""
    volume = ("Volume", names.volume_id)
    snapshot = ("Snapshot", names.snapshot_id)
    node = ("NodeGetInfoResponse", "node_id")
    context = ("Volume", names.volume_context)
    published = ("ControllerPublishVolumeResponse", names.publish_context)
    passed_back = names.request_context
    return {
        ("VolumeContentSource.SnapshotSource", names.snapshot_id): snapshot,
        ("DeleteVolumeRequest", "volume_id"): volume,
        ("ControllerPublishVolumeRequest", "volume_id"): volume,
        ("ControllerPublishVolumeRequest", "node_id"): node,
        ("ControllerPublishVolumeRequest", passed_back): context,
        ("ControllerUnpublishVolumeRequest", "volume_id"): volume,
        ("ControllerUnpublishVolumeRequest", "node_id"): node,
        ("ValidateVolumeCapabilitiesRequest", "volume_id"): volume,
        ("ValidateVolumeCapabilitiesRequest", passed_back): context,
        ("ListVolumesRequest", "starting_token"): ("ListVolumesResponse", "next_token"),
        ("CreateSnapshotRequest", "source_volume_id"): volume,
        ("DeleteSnapshotRequest", "snapshot_id"): snapshot,
        ("ListSnapshotsRequest", "starting_token"): ("ListSnapshotsResponse", "next_token"),
        ("ListSnapshotsRequest", "source_volume_id"): volume,
        ("ListSnapshotsRequest", "snapshot_id"): snapshot,
        ("NodeStageVolumeRequest", "volume_id"): volume,
        ("NodeStageVolumeRequest", names.publish_context): published,
        ("NodeStageVolumeRequest", passed_back): context,
        ("NodeUnstageVolumeRequest", "volume_id"): volume,
        ("NodePublishVolumeRequest", "volume_id"): volume,
        ("NodePublishVolumeRequest", names.publish_context): published,
        # Kubernetes also adds pod info and service account tokens here (CSIDriver
        # podInfoOnMount, tokenRequests), ~4.6 KB with three audiences.
        ("NodePublishVolumeRequest", passed_back): context,
        ("NodeUnpublishVolumeRequest", "volume_id"): volume,
    }


# RPC -> (capability kind, capabilities with which the plugin MUST implement it).
RPC_GATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "CreateVolume": ("controller", ("CREATE_DELETE_VOLUME",)),
    "DeleteVolume": ("controller", ("CREATE_DELETE_VOLUME",)),
    "ControllerPublishVolume": ("controller", ("PUBLISH_UNPUBLISH_VOLUME",)),
    "ControllerUnpublishVolume": ("controller", ("PUBLISH_UNPUBLISH_VOLUME",)),
    "ListVolumes": ("controller", ("LIST_VOLUMES",)),
    "GetCapacity": ("controller", ("GET_CAPACITY",)),
    "CreateSnapshot": ("controller", ("CREATE_DELETE_SNAPSHOT",)),
    "DeleteSnapshot": ("controller", ("CREATE_DELETE_SNAPSHOT",)),
    "ListSnapshots": ("controller", ("LIST_SNAPSHOTS",)),
    "NodeStageVolume": ("node", ("STAGE_UNSTAGE_VOLUME",)),
    "NodeUnstageVolume": ("node", ("STAGE_UNSTAGE_VOLUME",)),
}

# §RPC Interface: the Controller and Node Plugins MUST implement their services' RPCs whose
# own section sets no capability condition.
CONTROLLER_SERVICE = ServiceNeeds(
    frozenset({"ControllerGetCapabilities", "ValidateVolumeCapabilities"}),
    ("plugin", "CONTROLLER_SERVICE"),
)
NODE_RPCS = frozenset({"NodePublishVolume", "NodeUnpublishVolume", "NodeGetCapabilities"})

# §Error Scheme recovery rows both versions have: "Caller MUST fix the request/field before
# retrying" (INVALID_ARGUMENT) and "Caller MUST NOT retry".
FIX_REQUEST = FixFirst("MUST fix the request before retrying")
NO_RETRY = FixFirst("MUST NOT retry", must_change=())
CAPACITY_RANGE = FixFirst(
    "MUST fix the capacity range before retrying", must_change=("capacity_range",)
)
# §CreateVolume and §CreateSnapshot errors, ALREADY_EXISTS: the name's object is
# incompatible with one of these arguments; a retry for the name keeping them all keeps
# the incompatibility (secrets, and v1's mutable_parameters, are not among them).
VOLUME_ARGUMENTS = FixFirst(
    "MUST fix the arguments or use another name before retrying",
    must_change=CREATE_VOLUME_ARGUMENTS,
)
SNAPSHOT_ARGUMENTS = FixFirst(
    "MUST fix the arguments or use another name before retrying",
    must_change=CREATE_SNAPSHOT_ARGUMENTS,
)
# §NodePublishVolume errors, FAILED_PRECONDITION: the volume is not staged.
STAGE_FIRST = FixFirst(
    "MUST stage the volume first and retry with a valid staging_target_path",
    staging_path_missing,
)


def staged_arguments(names: CsiNames) -> FixFirst:
    """§NodeStageVolume's ALREADY_EXISTS row: the staging is incompatible with these
    arguments; a retry keeping them all (new secrets only) keeps the incompatibility."""
    return FixFirst(
        "MUST fix the arguments before retrying",
        must_change=(
            "staging_target_path",
            "volume_capability",
            names.publish_context,
            names.request_context,
        ),
    )


def node_published_arguments(names: CsiNames) -> FixFirst:
    """§NodePublishVolume's ALREADY_EXISTS row, as :func:`staged_arguments`."""
    return FixFirst(
        "MUST fix the arguments before retrying",
        must_change=(
            "target_path",
            "staging_target_path",
            "volume_capability",
            "readonly",
            names.publish_context,
            names.request_context,
        ),
    )


# Rows of the RPCs both versions define whose recovery says "retry with exponential back off"
# (True), as both versions word them; v0.3 adds its ABORTED rows.
GONE = {"NOT_FOUND": True}  # "MUST verify ... before retrying with exponential back off"
BACKOFF_RPC: dict[str, dict[str, bool]] = {
    "DeleteVolume": {"FAILED_PRECONDITION": True},
    "ControllerPublishVolume": {
        "NOT_FOUND": True,
        "FAILED_PRECONDITION": True,
        "RESOURCE_EXHAUSTED": True,
    },
    "ControllerUnpublishVolume": GONE,
    "ValidateVolumeCapabilities": GONE,
    "DeleteSnapshot": {"FAILED_PRECONDITION": True},
    "NodeStageVolume": GONE,
    "NodeUnstageVolume": GONE,
    "NodePublishVolume": GONE,
    "NodeUnpublishVolume": GONE,
}

# "This operation MUST be idempotent." The answers judged on an identical repeat are those
# no unseen change explains: a request valid and implemented a moment ago is still so.
REQUEST_CODES = frozenset({"INVALID_ARGUMENT", "UNIMPLEMENTED"})
# A snapshot of a given name and source cannot turn incompatible with its own arguments.
CREATED_CODES = REQUEST_CODES | {"ALREADY_EXISTS"}
# A node's staged and published volumes change only through its one caller, kubelet, on
# this socket: after an identical success, "already exists" or a failed precondition is
# the plugin forgetting what it did.
NODE_CODES = REQUEST_CODES | {"ALREADY_EXISTS", "FAILED_PRECONDITION"}


def state_changes(
    create_volume: frozenset[str], snapshot_ready: Callable[[Any], bool]
) -> dict[str, StateChange]:
    """The idempotent RPCs both versions define; ``create_volume``: what a repeated
    CreateVolume may not answer, ``snapshot_ready``: whether a CreateSnapshot answer is final."""
    return {
        "CreateVolume": StateChange(create_volume),
        "DeleteVolume": StateChange(REQUEST_CODES),
        "ControllerPublishVolume": StateChange(REQUEST_CODES),
        "ControllerUnpublishVolume": StateChange(REQUEST_CODES),
        "CreateSnapshot": StateChange(CREATED_CODES, final=snapshot_ready),
        "DeleteSnapshot": StateChange(REQUEST_CODES),
        "NodeStageVolume": StateChange(NODE_CODES, paths=("staging_target_path",)),
        "NodeUnstageVolume": StateChange(NODE_CODES, paths=("staging_target_path",)),
        "NodePublishVolume": StateChange(NODE_CODES, paths=("target_path",)),
        "NodeUnpublishVolume": StateChange(NODE_CODES, paths=("target_path",)),
    }


# capability kind -> (service, RPC answering it)
CAPABILITY_RPCS = {
    "plugin": ("Identity", "GetPluginCapabilities"),
    "controller": ("Controller", "ControllerGetCapabilities"),
    "node": ("Node", "NodeGetCapabilities"),
    "group": ("GroupController", "GroupControllerGetCapabilities"),
}


def csi_table(
    spec: str,
    title: str,
    v1: bool,
    capability_kinds: tuple[str, ...],
    own: tuple[Hooks, ...],
    **fields: Any,
) -> SpecTable:
    """The table of CSI version ``spec``: ``fields`` (its own data), ``own`` (its base checks
    and its own rule families) and the rule families of the csi_* modules, in that order."""
    return SpecTable(
        spec=spec,
        family="csi",
        title=title,
        package=spec,
        repeated_total_limits={("VolumeCapability.MountVolume", "mount_flags"): 4096},
        plugin_name_fields=(("GetPluginInfoResponse", "name"),),
        topology_message="Topology",
        topology_requirement_message="TopologyRequirement",
        required_rpcs=frozenset({"GetPluginInfo", "GetPluginCapabilities", "Probe"}),
        capability_queries={
            kind: f"/{spec}.{CAPABILITY_RPCS[kind][0]}/{CAPABILITY_RPCS[kind][1]}"
            for kind in capability_kinds
        },
        capability_responses={CAPABILITY_RPCS[kind][1]: kind for kind in capability_kinds},
        # csi.call-order's enforced case (NodePublishVolume of a volume unstaged on this
        # node) has no error row binding the plugin: its row is for a missing
        # staging_target_path.
        accepted_not_judged=frozenset({"csi.call-order"}),
        **fields,
        **merged(
            *own,
            csi_capabilities.hooks(title, v1=v1),
            csi_volumes.hooks(title, v1=v1),
            csi_snapshots.hooks(title, v1=v1),
            csi_listings.hooks(title),
            *([csi_metadata.hooks(title)] if v1 else []),  # v0.3 has no metadata streams
            csi_order.hooks(title, v1=v1),
            csi_responses.hooks(title, v1=v1),
            csi_readonly.hooks(title, v1=v1),
            csi_recovery.hooks(title, v1=v1),
            csi_placement.hooks(title, v1=v1),
        ),
    )
