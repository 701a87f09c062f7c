"""Rule table of CSI v1.12 (package csi.v1).

What CSI v0.3 and v1.12 state alike is written once, in each version's field names, in
:mod:`~plugproxy.rules.csi_tables`; this module holds the rest of CSI v1.12's table.

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

from plugproxy.rules import csi_tables
from plugproxy.rules.csi_common import TRANSPORT_CODES, CsiChecks
from plugproxy.rules.csi_tables import DELETE_NOT_FOUND, codes
from plugproxy.rules.engine import FixFirst, ServiceNeeds, StateChange
from plugproxy.spec.csi_names import CSI_V1_NAMES

TITLE = "CSI v1.12"
_checks = CsiChecks(volume_id=CSI_V1_NAMES.volume_id)

REQUIRED: dict[str, tuple[str, ...]] = {
    **csi_tables.required(CSI_V1_NAMES),
    "VolumeContentSource.VolumeSource": ("volume_id",),
    "ValidateVolumeCapabilitiesResponse.Confirmed": ("volume_capabilities",),
    "ListVolumesResponse.Entry": ("volume",),
    "ControllerGetVolumeRequest": ("volume_id",),
    "ControllerGetVolumeResponse": ("volume", "status"),
    "ControllerModifyVolumeRequest": ("volume_id", "mutable_parameters"),
    "Snapshot": ("snapshot_id", "source_volume_id", "creation_time", "ready_to_use"),
    "GetSnapshotRequest": ("snapshot_id",),
    "GetSnapshotResponse": ("snapshot",),
    "ControllerExpandVolumeRequest": ("volume_id", "capacity_range"),
    "ControllerExpandVolumeResponse": ("capacity_bytes", "node_expansion_required"),
    "NodeGetVolumeStatsRequest": ("volume_id", "volume_path"),
    "VolumeUsage": ("total", "unit"),
    "VolumeCondition": ("abnormal", "message"),
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

# Request fields where the CO passes back what the plugin made -> where the plugin made it.
ECHOES: dict[tuple[str, str], tuple[str, str]] = {
    **csi_tables.echoes(CSI_V1_NAMES),
    ("VolumeContentSource.VolumeSource", "volume_id"): _VOLUME_ID,
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

ERROR_CODES: dict[str, frozenset[str]] = {
    "Probe": codes("FAILED_PRECONDITION"),
    "CreateVolume": codes(
        "ALREADY_EXISTS", "INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED"
    ),
    "DeleteVolume": codes("FAILED_PRECONDITION", DELETE_NOT_FOUND),
    "ControllerPublishVolume": codes(
        "ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND", "RESOURCE_EXHAUSTED"
    ),
    "ControllerUnpublishVolume": codes("NOT_FOUND"),
    "ValidateVolumeCapabilities": codes("NOT_FOUND"),
    "ListVolumes": codes("ABORTED"),
    "ControllerGetVolume": codes("NOT_FOUND"),
    "ControllerModifyVolume": codes("INVALID_ARGUMENT", "NOT_FOUND"),
    "CreateSnapshot": codes("ABORTED", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED"),
    "DeleteSnapshot": codes("ABORTED", "FAILED_PRECONDITION", "INVALID_ARGUMENT", DELETE_NOT_FOUND),
    "ListSnapshots": codes("ABORTED"),
    "GetSnapshot": codes("NOT_FOUND"),
    "ControllerExpandVolume": codes(
        "FAILED_PRECONDITION", "INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE"
    ),
    "NodeStageVolume": codes("ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND"),
    "NodeUnstageVolume": codes("NOT_FOUND"),
    "NodePublishVolume": codes("ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND"),
    "NodeUnpublishVolume": codes("NOT_FOUND"),
    "NodeGetVolumeStats": codes("NOT_FOUND"),
    "NodeExpandVolume": codes(
        "FAILED_PRECONDITION", "INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE"
    ),
    "CreateVolumeGroupSnapshot": codes(
        "ALREADY_EXISTS", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"
    ),
    "DeleteVolumeGroupSnapshot": codes("FAILED_PRECONDITION", "INVALID_ARGUMENT", DELETE_NOT_FOUND),
    "GetVolumeGroupSnapshot": codes("INVALID_ARGUMENT", "NOT_FOUND"),
    "GetMetadataAllocated": codes("INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE"),
    "GetMetadataDelta": codes(
        "FAILED_PRECONDITION", "INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE"
    ),
}

RPC_GATES: dict[str, tuple[str, tuple[str, ...]]] = {
    **csi_tables.RPC_GATES,
    "GetSnapshot": ("controller", ("GET_SNAPSHOT",)),
    "ControllerExpandVolume": ("controller", ("EXPAND_VOLUME",)),
    "ControllerGetVolume": ("controller", ("GET_VOLUME",)),
    "ControllerModifyVolume": ("controller", ("MODIFY_VOLUME",)),
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
    "Controller": csi_tables.CONTROLLER_SERVICE,
    "Node": ServiceNeeds(
        csi_tables.NODE_RPCS,
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
FIX_FIRST = {"INVALID_ARGUMENT": csi_tables.FIX_REQUEST, "UNIMPLEMENTED": csi_tables.NO_RETRY}
_ARGUMENTS = FixFirst("MUST fix the arguments before retrying")
_ARGUMENTS_OR_NAME = FixFirst("MUST fix the arguments or use another name before retrying")
_OTHER_SNAPSHOT_IDS = FixFirst(
    "SHOULD use other snapshot_ids before retrying", rule="retry-advised-unchanged"
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
    "NodeGetInfo": {"UNIMPLEMENTED": csi_tables.NO_RETRY},
    "CreateVolume": {
        "ALREADY_EXISTS": csi_tables.VOLUME_ARGUMENTS,
        "OUT_OF_RANGE": csi_tables.CAPACITY_RANGE,
    },
    "ControllerPublishVolume": {"ALREADY_EXISTS": _ARGUMENTS},
    "ControllerModifyVolume": {"INVALID_ARGUMENT": None},  # "may verify ... then retry"
    "CreateSnapshot": {"ALREADY_EXISTS": csi_tables.SNAPSHOT_ARGUMENTS},
    # Part of a group: the caller "SHOULD stop calling DeleteSnapshot" for it (advisory).
    "DeleteSnapshot": {
        "INVALID_ARGUMENT": FixFirst(
            "SHOULD stop calling DeleteSnapshot and delete the group instead",
            rule="retry-advised-unchanged",
        )
    },
    "ControllerExpandVolume": {
        "INVALID_ARGUMENT": None,  # MAY
        "OUT_OF_RANGE": csi_tables.CAPACITY_RANGE,
    },
    "NodeStageVolume": {"ALREADY_EXISTS": csi_tables.staged_arguments(CSI_V1_NAMES)},
    "NodePublishVolume": {
        "ALREADY_EXISTS": csi_tables.node_published_arguments(CSI_V1_NAMES),
        "FAILED_PRECONDITION": csi_tables.STAGE_FIRST,
    },
    "NodeExpandVolume": {
        "INVALID_ARGUMENT": None,  # "MAY verify volume capabilities ... and retry"
        "FAILED_PRECONDITION": FixFirst("MUST NOT retry", must_change=()),
        "OUT_OF_RANGE": csi_tables.CAPACITY_RANGE,
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
BACKOFF_RPC: dict[str, dict[str, bool]] = {
    **csi_tables.BACKOFF_RPC,
    "CreateVolume": {"NOT_FOUND": True, "RESOURCE_EXHAUSTED": True},
    "ListVolumes": {"ABORTED": False},
    "ControllerGetVolume": csi_tables.GONE,
    "ControllerModifyVolume": csi_tables.GONE,
    "ListSnapshots": {"ABORTED": False},
    "GetSnapshot": csi_tables.GONE,
    "ControllerExpandVolume": {"NOT_FOUND": True, "FAILED_PRECONDITION": True},
    "NodeGetVolumeStats": csi_tables.GONE,
    "NodeExpandVolume": csi_tables.GONE,
    "DeleteVolumeGroupSnapshot": {"FAILED_PRECONDITION": True},
    "GetVolumeGroupSnapshot": csi_tables.GONE,
}


def _snapshot_ready(resp: Any) -> bool:
    return bool(resp.snapshot.ready_to_use)


def _group_ready(resp: Any) -> bool:
    return bool(resp.group_snapshot.ready_to_use)


STATE_CHANGES: dict[str, StateChange] = {
    # Not ALREADY_EXISTS nor OUT_OF_RANGE: an expansion since the create may leave the volume
    # outside a repeated capacity_range, and expansions name the volume id, not the name.
    **csi_tables.state_changes(csi_tables.REQUEST_CODES, _snapshot_ready),
    "ControllerExpandVolume": StateChange(csi_tables.REQUEST_CODES),
    "ControllerModifyVolume": StateChange(csi_tables.REQUEST_CODES),
    "CreateVolumeGroupSnapshot": StateChange(csi_tables.CREATED_CODES, final=_group_ready),
    "DeleteVolumeGroupSnapshot": StateChange(csi_tables.REQUEST_CODES),
    # OUT_OF_RANGE too: a volume that reached the target is no smaller on an identical repeat.
    "NodeExpandVolume": StateChange(
        csi_tables.REQUEST_CODES | {"FAILED_PRECONDITION", "OUT_OF_RANGE"}
    ),
}

# The checks of csi_common; csi_table adds the rule families of the csi_* modules.
_BASE = _checks.hooks(
    TITLE,
    True,
    {
        "ValidateVolumeCapabilities": _checks.validate_response,
        "GetMetadataAllocated": _checks.metadata_response,
        "GetMetadataDelta": _checks.metadata_response,
    },
)

TABLE = csi_tables.csi_table(
    spec="csi.v1",
    title=TITLE,
    v1=True,
    capability_kinds=("plugin", "controller", "node", "group"),
    own=(_BASE,),
    required=REQUIRED,
    required_caveat=REQUIRED_CAVEAT,
    size_overrides=SIZE_OVERRIDES,
    size_recommended=SIZE_RECOMMENDED,
    echoes=ECHOES,
    name_fields=(
        ("CreateVolumeRequest", "name"),
        ("CreateSnapshotRequest", "name"),
        ("CreateVolumeGroupSnapshotRequest", "name"),
    ),
    non_negative=NON_NEGATIVE,
    absolute_paths=ABSOLUTE_PATHS,
    error_codes=ERROR_CODES,
    general_codes=_GENERAL,
    rpc_gates=RPC_GATES,
    recommended_rpcs=CONTROLLER_RPCS,
    services=SERVICES,
    fix_first=FIX_FIRST,
    fix_first_rpc=FIX_FIRST_RPC,
    backoff=BACKOFF,
    backoff_rpc=BACKOFF_RPC,
    state_changes=STATE_CHANGES,
)
