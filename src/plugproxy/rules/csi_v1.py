"""Rule table of CSI v1.12 (package csi.v1).

REQUIRED fields: every field the spec's messages mark "This field is REQUIRED" (72) or
"This is a REQUIRED field" / "... is REQUIRED." (11), 83 in all; the two group snapshot
``snapshot_ids`` carry a caveat (a plugin may do without them): their absence is reported at
MUST and never rejected (``csi.required-field-caveat``). The engine checks those
proto3 can see (strings, bytes, maps, repeated, messages, enums, oneofs); the REQUIRED bool
and number fields are listed for completeness and skipped. Two oneofs are REQUIRED by the
text around them: VolumeCapability's access type and VolumeContentSource's type.

Size limits (§Size Limits: they apply to the messages each party generates): the per-field
overrides the spec states (SIZE_OVERRIDES); values the plugin made are judged where it
returns them (csi.size-limit) and, blamed on the plugin and never rejected, where the CO
passes them back (ECHOES, csi.size-limit-echoed); human-readable messages are advisory only
(SIZE_RECOMMENDED).
"""

from __future__ import annotations

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
    TRANSPORT_CODES,
    CsiChecks,
    staging_path_missing,
)
from plugproxy.rules.engine import (
    FixFirst,
    ServiceNeeds,
    SpecTable,
    StateChange,
    merged,
)

TITLE = "CSI v1.12"
_checks = CsiChecks(volume_id="volume_id")

REQUIRED: dict[str, tuple[str, ...]] = {
    "GetPluginInfoResponse": ("name", "vendor_version"),
    "CreateVolumeRequest": ("name", "volume_capabilities"),
    "VolumeContentSource": ("oneof:type",),
    "VolumeContentSource.SnapshotSource": ("snapshot_id",),
    "VolumeContentSource.VolumeSource": ("volume_id",),
    "CreateVolumeResponse": ("volume",),
    "VolumeCapability": ("oneof:access_type", "access_mode"),
    "VolumeCapability.AccessMode": ("mode",),
    "Volume": ("volume_id",),
    "DeleteVolumeRequest": ("volume_id",),
    "ControllerPublishVolumeRequest": ("volume_id", "node_id", "volume_capability", "readonly"),
    "ControllerUnpublishVolumeRequest": ("volume_id",),
    "ValidateVolumeCapabilitiesRequest": ("volume_id", "volume_capabilities"),
    "ValidateVolumeCapabilitiesResponse.Confirmed": ("volume_capabilities",),
    "ListVolumesResponse.Entry": ("volume",),
    "ControllerGetVolumeRequest": ("volume_id",),
    "ControllerGetVolumeResponse": ("volume", "status"),
    "ControllerModifyVolumeRequest": ("volume_id", "mutable_parameters"),
    "GetCapacityResponse": ("available_capacity",),
    "CreateSnapshotRequest": ("source_volume_id", "name"),
    "CreateSnapshotResponse": ("snapshot",),
    "Snapshot": ("snapshot_id", "source_volume_id", "creation_time", "ready_to_use"),
    "DeleteSnapshotRequest": ("snapshot_id",),
    "GetSnapshotRequest": ("snapshot_id",),
    "GetSnapshotResponse": ("snapshot",),
    "ControllerExpandVolumeRequest": ("volume_id", "capacity_range"),
    "ControllerExpandVolumeResponse": ("capacity_bytes", "node_expansion_required"),
    "NodeStageVolumeRequest": ("volume_id", "staging_target_path", "volume_capability"),
    "NodeUnstageVolumeRequest": ("volume_id", "staging_target_path"),
    "NodePublishVolumeRequest": ("volume_id", "target_path", "volume_capability", "readonly"),
    "NodeUnpublishVolumeRequest": ("volume_id", "target_path"),
    "NodeGetVolumeStatsRequest": ("volume_id", "volume_path"),
    "VolumeUsage": ("total", "unit"),
    "VolumeCondition": ("abnormal", "message"),
    "NodeGetInfoResponse": ("node_id",),
    "NodeExpandVolumeRequest": ("volume_id", "volume_path"),
    "CreateVolumeGroupSnapshotRequest": ("name", "source_volume_ids"),
    "CreateVolumeGroupSnapshotResponse": ("group_snapshot",),
    "VolumeGroupSnapshot": ("group_snapshot_id", "snapshots", "creation_time", "ready_to_use"),
    "DeleteVolumeGroupSnapshotRequest": ("group_snapshot_id",),
    "GetVolumeGroupSnapshotRequest": ("group_snapshot_id",),
    "GetVolumeGroupSnapshotResponse": ("group_snapshot",),
    "BlockMetadata": ("byte_offset", "size_bytes"),
    "GetMetadataAllocatedRequest": ("snapshot_id", "starting_offset"),
    "GetMetadataAllocatedResponse": ("block_metadata_type", "volume_capacity_bytes"),
    "GetMetadataDeltaRequest": ("base_snapshot_id", "target_snapshot_id", "starting_offset"),
    "GetMetadataDeltaResponse": ("block_metadata_type", "volume_capacity_bytes"),
}

# REQUIRED, but the text around them says a plugin may not rely on them: reported as MUST
# breaches by the CO and never rejected, since such a plugin serves the call.
REQUIRED_CAVEAT: dict[str, tuple[str, ...]] = {
    "DeleteVolumeGroupSnapshotRequest": ("snapshot_ids",),
    "GetVolumeGroupSnapshotRequest": ("snapshot_ids",),
}

# Fields whose description overrides the general size limit (None: no limit stated).
SIZE_OVERRIDES: dict[tuple[str, str], int | None] = {
    ("NodeStageVolumeRequest", "staging_target_path"): None,
    ("NodeUnstageVolumeRequest", "staging_target_path"): None,
    ("NodePublishVolumeRequest", "staging_target_path"): None,
    ("NodePublishVolumeRequest", "target_path"): None,
    ("NodeUnpublishVolumeRequest", "target_path"): None,
    ("NodeGetVolumeStatsRequest", "volume_path"): None,
    ("NodeGetVolumeStatsRequest", "staging_target_path"): None,
    ("NodeExpandVolumeRequest", "volume_path"): None,
    ("NodeExpandVolumeRequest", "staging_target_path"): None,
    # NodeGetInfo's node_id may take 256 bytes, and so may the plugin's lists of node ids.
    ("NodeGetInfoResponse", "node_id"): 256,
    ("ListVolumesResponse.VolumeStatus", "published_node_ids"): 256,
    ("ControllerGetVolumeResponse.VolumeStatus", "published_node_ids"): 256,
    # Human-readable text: advisory only (SIZE_RECOMMENDED), real plugins write more.
    ("VolumeCondition", "message"): None,
    ("ValidateVolumeCapabilitiesResponse", "message"): None,
}

SIZE_RECOMMENDED: dict[tuple[str, str], int] = {
    ("NodeGetInfoResponse", "node_id"): 128,  # "128 byte, is RECOMMENDED" (§NodeGetInfo)
    ("VolumeCondition", "message"): 128,
    ("ValidateVolumeCapabilitiesResponse", "message"): 128,
}

_VOLUME_ID = ("Volume", "volume_id")
_SNAPSHOT_ID = ("Snapshot", "snapshot_id")
_GROUP_ID = ("VolumeGroupSnapshot", "group_snapshot_id")
_NODE_ID = ("NodeGetInfoResponse", "node_id")
_CONTEXT = ("Volume", "volume_context")
_PUBLISH_CONTEXT = ("ControllerPublishVolumeResponse", "publish_context")

# Request fields where the CO passes back what the plugin made -> where the plugin made it.
ECHOES: dict[tuple[str, str], tuple[str, str]] = {
    ("VolumeContentSource.SnapshotSource", "snapshot_id"): _SNAPSHOT_ID,
    ("VolumeContentSource.VolumeSource", "volume_id"): _VOLUME_ID,
    ("DeleteVolumeRequest", "volume_id"): _VOLUME_ID,
    ("ControllerPublishVolumeRequest", "volume_id"): _VOLUME_ID,
    ("ControllerPublishVolumeRequest", "node_id"): _NODE_ID,
    ("ControllerPublishVolumeRequest", "volume_context"): _CONTEXT,
    ("ControllerUnpublishVolumeRequest", "volume_id"): _VOLUME_ID,
    ("ControllerUnpublishVolumeRequest", "node_id"): _NODE_ID,
    ("ValidateVolumeCapabilitiesRequest", "volume_id"): _VOLUME_ID,
    ("ValidateVolumeCapabilitiesRequest", "volume_context"): _CONTEXT,
    ("ListVolumesRequest", "starting_token"): ("ListVolumesResponse", "next_token"),
    ("CreateSnapshotRequest", "source_volume_id"): _VOLUME_ID,
    ("DeleteSnapshotRequest", "snapshot_id"): _SNAPSHOT_ID,
    ("ListSnapshotsRequest", "starting_token"): ("ListSnapshotsResponse", "next_token"),
    ("ListSnapshotsRequest", "source_volume_id"): _VOLUME_ID,
    ("ListSnapshotsRequest", "snapshot_id"): _SNAPSHOT_ID,
    ("GetSnapshotRequest", "snapshot_id"): _SNAPSHOT_ID,
    ("ControllerExpandVolumeRequest", "volume_id"): _VOLUME_ID,
    ("ControllerGetVolumeRequest", "volume_id"): _VOLUME_ID,
    ("ControllerModifyVolumeRequest", "volume_id"): _VOLUME_ID,
    ("CreateVolumeGroupSnapshotRequest", "source_volume_ids"): _VOLUME_ID,
    ("DeleteVolumeGroupSnapshotRequest", "group_snapshot_id"): _GROUP_ID,
    ("DeleteVolumeGroupSnapshotRequest", "snapshot_ids"): _SNAPSHOT_ID,
    ("GetVolumeGroupSnapshotRequest", "group_snapshot_id"): _GROUP_ID,
    ("GetVolumeGroupSnapshotRequest", "snapshot_ids"): _SNAPSHOT_ID,
    ("GetMetadataAllocatedRequest", "snapshot_id"): _SNAPSHOT_ID,
    ("GetMetadataDeltaRequest", "base_snapshot_id"): _SNAPSHOT_ID,
    ("GetMetadataDeltaRequest", "target_snapshot_id"): _SNAPSHOT_ID,
    ("NodeStageVolumeRequest", "volume_id"): _VOLUME_ID,
    ("NodeStageVolumeRequest", "publish_context"): _PUBLISH_CONTEXT,
    ("NodeStageVolumeRequest", "volume_context"): _CONTEXT,
    ("NodeUnstageVolumeRequest", "volume_id"): _VOLUME_ID,
    ("NodePublishVolumeRequest", "volume_id"): _VOLUME_ID,
    ("NodePublishVolumeRequest", "publish_context"): _PUBLISH_CONTEXT,
    # Kubernetes also adds pod info and service account tokens here (CSIDriver
    # podInfoOnMount, tokenRequests), ~4.6 KB with three audiences.
    ("NodePublishVolumeRequest", "volume_context"): _CONTEXT,
    ("NodeUnpublishVolumeRequest", "volume_id"): _VOLUME_ID,
    ("NodeGetVolumeStatsRequest", "volume_id"): _VOLUME_ID,
    ("NodeExpandVolumeRequest", "volume_id"): _VOLUME_ID,
}

NON_NEGATIVE = (
    ("CapacityRange", "required_bytes"),
    ("CapacityRange", "limit_bytes"),
    ("Volume", "capacity_bytes"),
    ("ListVolumesRequest", "max_entries"),
    ("ListSnapshotsRequest", "max_entries"),
    ("GetCapacityResponse", "available_capacity"),
    ("GetCapacityResponse", "maximum_volume_size"),
    ("GetCapacityResponse", "minimum_volume_size"),
    ("Snapshot", "size_bytes"),
    ("VolumeUsage", "available"),
    ("VolumeUsage", "total"),
    ("VolumeUsage", "used"),
    ("NodeGetInfoResponse", "max_volumes_per_node"),
)

# "It MUST be an absolute path in the root filesystem of the process serving this request"
# (NodeExpandVolumeRequest.volume_path says no such thing and is not listed).
ABSOLUTE_PATHS = (
    ("NodeStageVolumeRequest", "staging_target_path"),
    ("NodeUnstageVolumeRequest", "staging_target_path"),
    ("NodePublishVolumeRequest", "staging_target_path"),
    ("NodePublishVolumeRequest", "target_path"),
    ("NodeUnpublishVolumeRequest", "target_path"),
    ("NodeGetVolumeStatsRequest", "volume_path"),
    ("NodeGetVolumeStatsRequest", "staging_target_path"),
    ("NodeExpandVolumeRequest", "staging_target_path"),
)

_GENERAL = (
    frozenset(
        {"INVALID_ARGUMENT", "ABORTED", "UNIMPLEMENTED", "UNAUTHENTICATED", "PERMISSION_DENIED"}
    )
    | TRANSPORT_CODES
)


def _codes(*names: str) -> frozenset[str]:
    return frozenset(names)


# NOT_FOUND from a delete RPC breaks the MUST "reply 0 OK" for an object that does not
# exist; csi.delete-not-idempotent (csi_responses) judges it, so it is listed here to keep
# the SHOULD csi.error-code-unexpected from reporting the same answer twice.
_DELETE_NOT_FOUND = "NOT_FOUND"

ERROR_CODES: dict[str, frozenset[str]] = {
    "Probe": _codes("FAILED_PRECONDITION"),
    "CreateVolume": _codes(
        "ALREADY_EXISTS", "INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED"
    ),
    "DeleteVolume": _codes("FAILED_PRECONDITION", _DELETE_NOT_FOUND),
    "ControllerPublishVolume": _codes(
        "ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND", "RESOURCE_EXHAUSTED"
    ),
    "ControllerUnpublishVolume": _codes("NOT_FOUND"),
    "ValidateVolumeCapabilities": _codes("NOT_FOUND"),
    "ListVolumes": _codes("ABORTED"),
    "ControllerGetVolume": _codes("NOT_FOUND"),
    "ControllerModifyVolume": _codes("INVALID_ARGUMENT", "NOT_FOUND"),
    "CreateSnapshot": _codes("ABORTED", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED"),
    "DeleteSnapshot": _codes(
        "ABORTED", "FAILED_PRECONDITION", "INVALID_ARGUMENT", _DELETE_NOT_FOUND
    ),
    "ListSnapshots": _codes("ABORTED"),
    "GetSnapshot": _codes("NOT_FOUND"),
    "ControllerExpandVolume": _codes(
        "FAILED_PRECONDITION", "INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE"
    ),
    "NodeStageVolume": _codes("ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND"),
    "NodeUnstageVolume": _codes("NOT_FOUND"),
    "NodePublishVolume": _codes("ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND"),
    "NodeUnpublishVolume": _codes("NOT_FOUND"),
    "NodeGetVolumeStats": _codes("NOT_FOUND"),
    "NodeExpandVolume": _codes(
        "FAILED_PRECONDITION", "INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE"
    ),
    "CreateVolumeGroupSnapshot": _codes(
        "ALREADY_EXISTS", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"
    ),
    "DeleteVolumeGroupSnapshot": _codes(
        "FAILED_PRECONDITION", "INVALID_ARGUMENT", _DELETE_NOT_FOUND
    ),
    "GetVolumeGroupSnapshot": _codes("INVALID_ARGUMENT", "NOT_FOUND"),
    "GetMetadataAllocated": _codes("INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE"),
    "GetMetadataDelta": _codes(
        "FAILED_PRECONDITION", "INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE"
    ),
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
    "GetSnapshot": ("controller", ("GET_SNAPSHOT",)),
    "ControllerExpandVolume": ("controller", ("EXPAND_VOLUME",)),
    "ControllerGetVolume": ("controller", ("GET_VOLUME",)),
    "ControllerModifyVolume": ("controller", ("MODIFY_VOLUME",)),
    "NodeStageVolume": ("node", ("STAGE_UNSTAGE_VOLUME",)),
    "NodeUnstageVolume": ("node", ("STAGE_UNSTAGE_VOLUME",)),
    # §NodeGetVolumeStats: with GET_VOLUME_STATS or VOLUME_CONDITION.
    "NodeGetVolumeStats": ("node", ("GET_VOLUME_STATS", "VOLUME_CONDITION")),
    "NodeExpandVolume": ("node", ("EXPAND_VOLUME",)),
    "CreateVolumeGroupSnapshot": ("group", ("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT",)),
    "DeleteVolumeGroupSnapshot": ("group", ("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT",)),
    "GetVolumeGroupSnapshot": ("group", ("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT",)),
}

# §RPC Interface: "The Controller Plugin MUST implement this sets of RPCs" / "The Node
# Plugin MUST implement..."; the RPCs whose own section sets no capability condition.
# §Volume Lifecycle: a controller plugin SHOULD implement every RPC of the Controller service
# (tests/test_rules.py checks the list against the descriptors).
CONTROLLER_RPCS = frozenset(
    {
        "CreateVolume",
        "DeleteVolume",
        "ControllerPublishVolume",
        "ControllerUnpublishVolume",
        "ValidateVolumeCapabilities",
        "ListVolumes",
        "GetCapacity",
        "ControllerGetCapabilities",
        "CreateSnapshot",
        "DeleteSnapshot",
        "ListSnapshots",
        "GetSnapshot",
        "ControllerExpandVolume",
        "ControllerGetVolume",
        "ControllerModifyVolume",
    }
)

SERVICES: dict[str, ServiceNeeds] = {
    "Controller": ServiceNeeds(
        frozenset({"ControllerGetCapabilities", "ValidateVolumeCapabilities"}),
        ("plugin", "CONTROLLER_SERVICE"),
    ),
    "Node": ServiceNeeds(
        frozenset({"NodePublishVolume", "NodeUnpublishVolume", "NodeGetCapabilities"}),
        # §NodeGetInfo: "MUST implement this RPC call if the plugin has
        # PUBLISH_UNPUBLISH_VOLUME controller capability".
        when={"NodeGetInfo": ("controller", ("PUBLISH_UNPUBLISH_VOLUME",))},
    ),
    "GroupController": ServiceNeeds(
        frozenset({"GroupControllerGetCapabilities"}), ("plugin", "GROUP_CONTROLLER_SERVICE")
    ),
    # "The plugin must implement this RPC if it provides the SnapshotMetadata service."
    "SnapshotMetadata": ServiceNeeds(
        frozenset({"GetMetadataAllocated", "GetMetadataDelta"}),
        ("plugin", "SNAPSHOT_METADATA_SERVICE"),
    ),
}

# §Error Scheme recovery: "Caller MUST fix the request/field before retrying" (both rows of
# INVALID_ARGUMENT), "Caller MUST NOT retry" (UNIMPLEMENTED). PERMISSION_DENIED and
# UNAUTHENTICATED are fixed outside the request; ABORTED is retried as is.
FIX_FIRST = {
    "INVALID_ARGUMENT": FixFirst("MUST fix the request before retrying"),
    "UNIMPLEMENTED": FixFirst("MUST NOT retry", must_change=()),
}
_ARGUMENTS = FixFirst("MUST fix the arguments before retrying")
_ARGUMENTS_OR_NAME = FixFirst("MUST fix the arguments or use another name before retrying")
_RANGE = FixFirst("MUST fix the capacity range before retrying", must_change=("capacity_range",))
_OTHER_SNAPSHOT_IDS = FixFirst(
    "SHOULD use other snapshot_ids before retrying", rule="retry-advised-unchanged"
)
# §CreateVolume errors, ALREADY_EXISTS: the name's volume is incompatible with one of these
# arguments; a retry for the name keeping them all keeps the incompatibility (secrets and
# mutable_parameters are not among them).
_VOLUME_ARGUMENTS = FixFirst(
    "MUST fix the arguments or use another name before retrying",
    must_change=CREATE_VOLUME_ARGUMENTS,
)
# The ALREADY_EXISTS rows of §CreateSnapshot, §NodeStageVolume and §NodePublishVolume: the
# existing snapshot, staging or publication is incompatible with these arguments; a retry
# for the same object keeping them all (new secrets only) keeps the incompatibility.
_SNAPSHOT_ARGUMENTS = FixFirst(
    "MUST fix the arguments or use another name before retrying",
    must_change=CREATE_SNAPSHOT_ARGUMENTS,
)
_STAGED_ARGUMENTS = FixFirst(
    "MUST fix the arguments before retrying",
    must_change=("staging_target_path", "volume_capability", "publish_context", "volume_context"),
)
_NODE_PUBLISHED_ARGUMENTS = FixFirst(
    "MUST fix the arguments before retrying",
    must_change=(
        "target_path",
        "staging_target_path",
        "volume_capability",
        "readonly",
        "publish_context",
        "volume_context",
    ),
)

_METADATA_ROWS: dict[str, FixFirst | None] = {
    "INVALID_ARGUMENT": FixFirst(
        "SHOULD correct the argument before resubmitting", rule="retry-advised-unchanged"
    ),
    "OUT_OF_RANGE": FixFirst(
        "SHOULD send a valid starting_offset next", rule="retry-advised-unchanged"
    ),
}

# The per-RPC error rows: a fix-first recovery adds the code; None marks a row whose
# recovery for a general code only advises (SHOULD, MAY, lower case) or asks for a change
# outside the request, so an unchanged retry is not judged for that RPC and code; a row
# advising a change in the request with SHOULD names csi.retry-advised-unchanged instead.
FIX_FIRST_RPC: dict[str, dict[str, FixFirst | None]] = {
    # Read-only, but asked once per registration, not polled: a repeat on the connection
    # that got UNIMPLEMENTED is the same caller retrying (§Error Scheme: MUST NOT retry).
    "NodeGetInfo": {"UNIMPLEMENTED": FIX_FIRST["UNIMPLEMENTED"]},
    "CreateVolume": {"ALREADY_EXISTS": _VOLUME_ARGUMENTS, "OUT_OF_RANGE": _RANGE},
    "ControllerPublishVolume": {"ALREADY_EXISTS": _ARGUMENTS},
    "ControllerModifyVolume": {"INVALID_ARGUMENT": None},  # "may verify ... then retry"
    "CreateSnapshot": {"ALREADY_EXISTS": _SNAPSHOT_ARGUMENTS},
    # Part of a group: the caller "SHOULD stop calling DeleteSnapshot" for it (advisory).
    "DeleteSnapshot": {
        "INVALID_ARGUMENT": FixFirst(
            "SHOULD stop calling DeleteSnapshot and delete the group instead",
            rule="retry-advised-unchanged",
        )
    },
    "ControllerExpandVolume": {"INVALID_ARGUMENT": None, "OUT_OF_RANGE": _RANGE},  # MAY
    "NodeStageVolume": {"ALREADY_EXISTS": _STAGED_ARGUMENTS},
    "NodePublishVolume": {
        "ALREADY_EXISTS": _NODE_PUBLISHED_ARGUMENTS,
        "FAILED_PRECONDITION": FixFirst(
            "MUST stage the volume first and retry with a valid staging_target_path",
            staging_path_missing,
        ),
    },
    "NodeExpandVolume": {
        "INVALID_ARGUMENT": None,  # "MAY verify volume capabilities ... and retry"
        "FAILED_PRECONDITION": FixFirst("MUST NOT retry", must_change=()),
        "OUT_OF_RANGE": _RANGE,
    },
    "CreateVolumeGroupSnapshot": {"ALREADY_EXISTS": _ARGUMENTS_OR_NAME},
    # "caller SHOULD use different snapshot_ids": an identical re-send judged at SHOULD.
    "DeleteVolumeGroupSnapshot": {"INVALID_ARGUMENT": _OTHER_SNAPSHOT_IDS},
    "GetVolumeGroupSnapshot": {"INVALID_ARGUMENT": _OTHER_SNAPSHOT_IDS},
    # The SnapshotMetadata rows advise (lower-case "should") correcting the argument, or
    # sending a valid starting_offset, before the next call: an identical re-send after
    # either is judged at SHOULD.
    "GetMetadataAllocated": _METADATA_ROWS,
    "GetMetadataDelta": _METADATA_ROWS,
}

# Rows whose recovery says "retry with exponential back off": §Error Scheme's ABORTED for
# every RPC, and per RPC its own rows (True) or a general code its row says otherwise for
# (False: an invalid starting_token asks for a restart of the listing).
BACKOFF = frozenset({"ABORTED"})
_GONE = {"NOT_FOUND": True}  # "MUST verify ... before retrying with exponential back off"
BACKOFF_RPC: dict[str, dict[str, bool]] = {
    "CreateVolume": {"NOT_FOUND": True, "RESOURCE_EXHAUSTED": True},
    "DeleteVolume": {"FAILED_PRECONDITION": True},
    "ControllerPublishVolume": {
        "NOT_FOUND": True,
        "FAILED_PRECONDITION": True,
        "RESOURCE_EXHAUSTED": True,
    },
    "ControllerUnpublishVolume": _GONE,
    "ValidateVolumeCapabilities": _GONE,
    "ListVolumes": {"ABORTED": False},
    "ControllerGetVolume": _GONE,
    "ControllerModifyVolume": _GONE,
    "DeleteSnapshot": {"FAILED_PRECONDITION": True},
    "ListSnapshots": {"ABORTED": False},
    "GetSnapshot": _GONE,
    "ControllerExpandVolume": {"NOT_FOUND": True, "FAILED_PRECONDITION": True},
    "NodeStageVolume": _GONE,
    "NodeUnstageVolume": _GONE,
    "NodePublishVolume": _GONE,
    "NodeUnpublishVolume": _GONE,
    "NodeGetVolumeStats": _GONE,
    "NodeExpandVolume": _GONE,
    "DeleteVolumeGroupSnapshot": {"FAILED_PRECONDITION": True},
    "GetVolumeGroupSnapshot": _GONE,
}

# "This operation MUST be idempotent." The answers judged on an identical repeat are those
# no unseen change explains: a request valid and implemented a moment ago is still so.
_REQUEST = frozenset({"INVALID_ARGUMENT", "UNIMPLEMENTED"})
# A snapshot of a given name and source cannot turn incompatible with its own arguments.
_CREATED = _REQUEST | {"ALREADY_EXISTS"}
# A node's staged and published volumes change only through its one caller, kubelet, on
# this socket: after an identical success, "already exists" or a failed precondition is
# the plugin forgetting what it did.
_NODE = _REQUEST | {"ALREADY_EXISTS", "FAILED_PRECONDITION"}


def _snapshot_ready(resp: Any) -> bool:
    return bool(resp.snapshot.ready_to_use)


def _group_ready(resp: Any) -> bool:
    return bool(resp.group_snapshot.ready_to_use)


STATE_CHANGES: dict[str, StateChange] = {
    # Not ALREADY_EXISTS nor OUT_OF_RANGE: an expansion since the create may leave the volume
    # outside a repeated capacity_range, and expansions name the volume id, not the name.
    "CreateVolume": StateChange(_REQUEST),
    "DeleteVolume": StateChange(_REQUEST),
    "ControllerPublishVolume": StateChange(_REQUEST),
    "ControllerUnpublishVolume": StateChange(_REQUEST),
    "ControllerExpandVolume": StateChange(_REQUEST),
    "ControllerModifyVolume": StateChange(_REQUEST),
    "CreateSnapshot": StateChange(_CREATED, final=_snapshot_ready),
    "DeleteSnapshot": StateChange(_REQUEST),
    "CreateVolumeGroupSnapshot": StateChange(_CREATED, final=_group_ready),
    "DeleteVolumeGroupSnapshot": StateChange(_REQUEST),
    "NodeStageVolume": StateChange(_NODE, paths=("staging_target_path",)),
    "NodeUnstageVolume": StateChange(_NODE, paths=("staging_target_path",)),
    "NodePublishVolume": StateChange(_NODE, paths=("target_path",)),
    "NodeUnpublishVolume": StateChange(_NODE, paths=("target_path",)),
    # OUT_OF_RANGE too: a volume that reached the target is no smaller on an identical repeat.
    "NodeExpandVolume": StateChange(_REQUEST | {"FAILED_PRECONDITION", "OUT_OF_RANGE"}),
}

# csi.call-order's enforced case (NodePublishVolume of a volume unstaged on this node) has
# no error row binding the plugin: its row is for a missing staging_target_path.
ACCEPTED_NOT_JUDGED = frozenset({"csi.call-order"})

# The checks of csi_common; the families in their own modules follow (merged below).
_BASE = _checks.hooks(
    TITLE,
    True,
    {
        "ValidateVolumeCapabilities": _checks.validate_response,
        "GetMetadataAllocated": _checks.metadata_response,
        "GetMetadataDelta": _checks.metadata_response,
    },
)

TABLE = SpecTable(
    spec="csi.v1",
    family="csi",
    title=TITLE,
    package="csi.v1",
    required=REQUIRED,
    required_caveat=REQUIRED_CAVEAT,
    size_overrides=SIZE_OVERRIDES,
    size_recommended=SIZE_RECOMMENDED,
    echoes=ECHOES,
    repeated_total_limits={("VolumeCapability.MountVolume", "mount_flags"): 4096},
    plugin_name_fields=(("GetPluginInfoResponse", "name"),),
    name_fields=(
        ("CreateVolumeRequest", "name"),
        ("CreateSnapshotRequest", "name"),
        ("CreateVolumeGroupSnapshotRequest", "name"),
    ),
    non_negative=NON_NEGATIVE,
    absolute_paths=ABSOLUTE_PATHS,
    topology_message="Topology",
    topology_requirement_message="TopologyRequirement",
    error_codes=ERROR_CODES,
    general_codes=_GENERAL,
    required_rpcs=frozenset({"GetPluginInfo", "GetPluginCapabilities", "Probe"}),
    capability_queries={
        "plugin": "/csi.v1.Identity/GetPluginCapabilities",
        "controller": "/csi.v1.Controller/ControllerGetCapabilities",
        "node": "/csi.v1.Node/NodeGetCapabilities",
        "group": "/csi.v1.GroupController/GroupControllerGetCapabilities",
    },
    capability_responses={
        "GetPluginCapabilities": "plugin",
        "ControllerGetCapabilities": "controller",
        "NodeGetCapabilities": "node",
        "GroupControllerGetCapabilities": "group",
    },
    rpc_gates=RPC_GATES,
    recommended_rpcs=CONTROLLER_RPCS,
    services=SERVICES,
    fix_first=FIX_FIRST,
    fix_first_rpc=FIX_FIRST_RPC,
    backoff=BACKOFF,
    backoff_rpc=BACKOFF_RPC,
    state_changes=STATE_CHANGES,
    accepted_not_judged=ACCEPTED_NOT_JUDGED,
    **merged(
        _BASE,
        csi_capabilities.hooks(TITLE, v1=True),
        csi_volumes.hooks(TITLE, v1=True),
        csi_snapshots.hooks(TITLE, v1=True),
        csi_listings.hooks(TITLE),
        csi_metadata.hooks(TITLE),
        csi_order.hooks(TITLE, v1=True),
        csi_responses.hooks(TITLE, v1=True),
        csi_readonly.hooks(TITLE, v1=True),
        csi_recovery.hooks(TITLE, v1=True),
        csi_placement.hooks(TITLE, v1=True),
    ),
)
