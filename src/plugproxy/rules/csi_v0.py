"""Rule table of CSI v0.3 (package csi.v0).

REQUIRED fields: every field the spec's messages mark REQUIRED (25 "This field is
REQUIRED" plus the other wordings, 40 in all); bool fields are listed and skipped.
``Snapshot.created_at`` is an int64 timestamp where 0 cannot be a creation time, so it is
checked as non-zero. CSI v0.3 states no size-limit override; its path fields are judged by
the advisory ``csi.size-limit-recommended`` only, because the general limit on kubelet paths
was dropped in CSI v1 (§Size Limits overrides on every path field). As in csi.v1, values the
plugin made are judged where it returns them and, under csi.size-limit-echoed, where the CO
passes them back (ECHOES), and human-readable messages are advisory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import ExpiringMap, ago
from plugproxy.rules import (
    csi_capabilities,
    csi_listings,
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
    CO,
    MUST,
    SHOULD,
    FixFirst,
    Hooks,
    Rule,
    ServiceNeeds,
    SpecTable,
    StateChange,
    Violation,
    merged,
)
from plugproxy.rules.state import CAPABILITY_TTL

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState

TITLE = "CSI v0.3"
_checks = CsiChecks(
    volume_id="id", topology_capability="ACCESSIBILITY_CONSTRAINTS", fixed_shape=True
)

REQUIRED: dict[str, tuple[str, ...]] = {
    "GetPluginInfoResponse": ("name", "vendor_version"),
    "CreateVolumeRequest": ("name", "volume_capabilities"),
    "VolumeContentSource": ("oneof:type",),
    "VolumeContentSource.SnapshotSource": ("id",),
    "CreateVolumeResponse": ("volume",),
    "VolumeCapability": ("oneof:access_type", "access_mode"),
    "VolumeCapability.AccessMode": ("mode",),
    "Volume": ("id",),
    "DeleteVolumeRequest": ("volume_id",),
    "ControllerPublishVolumeRequest": ("volume_id", "node_id", "volume_capability", "readonly"),
    "ControllerUnpublishVolumeRequest": ("volume_id",),
    "ValidateVolumeCapabilitiesRequest": ("volume_id", "volume_capabilities"),
    "ValidateVolumeCapabilitiesResponse": ("supported",),
    "GetCapacityResponse": ("available_capacity",),
    "CreateSnapshotRequest": ("source_volume_id", "name"),
    "CreateSnapshotResponse": ("snapshot",),
    "Snapshot": ("id", "source_volume_id", "created_at"),
    "SnapshotStatus": ("type",),
    "DeleteSnapshotRequest": ("snapshot_id",),
    "NodeStageVolumeRequest": ("volume_id", "staging_target_path", "volume_capability"),
    "NodeUnstageVolumeRequest": ("volume_id", "staging_target_path"),
    "NodePublishVolumeRequest": ("volume_id", "target_path", "volume_capability", "readonly"),
    "NodeUnpublishVolumeRequest": ("volume_id", "target_path"),
    "NodeGetIdResponse": ("node_id",),
    "NodeGetInfoResponse": ("node_id",),
}

_PATHS = (
    ("NodeStageVolumeRequest", "staging_target_path"),
    ("NodeUnstageVolumeRequest", "staging_target_path"),
    ("NodePublishVolumeRequest", "staging_target_path"),
    ("NodePublishVolumeRequest", "target_path"),
    ("NodeUnpublishVolumeRequest", "target_path"),
)

_VOLUME_ID = ("Volume", "id")
_SNAPSHOT_ID = ("Snapshot", "id")
_CONTEXT = ("Volume", "attributes")
_PUBLISH_INFO = ("ControllerPublishVolumeResponse", "publish_info")
_NODE_ID = ("NodeGetInfoResponse", "node_id")

# Request fields where the CO passes back what the plugin made -> where the plugin made it.
ECHOES: dict[tuple[str, str], tuple[str, str]] = {
    ("VolumeContentSource.SnapshotSource", "id"): _SNAPSHOT_ID,
    ("DeleteVolumeRequest", "volume_id"): _VOLUME_ID,
    ("ControllerPublishVolumeRequest", "volume_id"): _VOLUME_ID,
    ("ControllerPublishVolumeRequest", "node_id"): _NODE_ID,
    ("ControllerPublishVolumeRequest", "volume_attributes"): _CONTEXT,
    ("ControllerUnpublishVolumeRequest", "volume_id"): _VOLUME_ID,
    ("ControllerUnpublishVolumeRequest", "node_id"): _NODE_ID,
    ("ValidateVolumeCapabilitiesRequest", "volume_id"): _VOLUME_ID,
    ("ValidateVolumeCapabilitiesRequest", "volume_attributes"): _CONTEXT,
    ("ListVolumesRequest", "starting_token"): ("ListVolumesResponse", "next_token"),
    ("CreateSnapshotRequest", "source_volume_id"): _VOLUME_ID,
    ("DeleteSnapshotRequest", "snapshot_id"): _SNAPSHOT_ID,
    ("ListSnapshotsRequest", "starting_token"): ("ListSnapshotsResponse", "next_token"),
    ("ListSnapshotsRequest", "source_volume_id"): _VOLUME_ID,
    ("ListSnapshotsRequest", "snapshot_id"): _SNAPSHOT_ID,
    ("NodeStageVolumeRequest", "volume_id"): _VOLUME_ID,
    ("NodeStageVolumeRequest", "publish_info"): _PUBLISH_INFO,
    ("NodeStageVolumeRequest", "volume_attributes"): _CONTEXT,
    ("NodeUnstageVolumeRequest", "volume_id"): _VOLUME_ID,
    ("NodePublishVolumeRequest", "volume_id"): _VOLUME_ID,
    ("NodePublishVolumeRequest", "publish_info"): _PUBLISH_INFO,
    ("NodePublishVolumeRequest", "volume_attributes"): _CONTEXT,
    ("NodeUnpublishVolumeRequest", "volume_id"): _VOLUME_ID,
}

# Human-readable text: advisory only, as in csi.v1.
_MESSAGES = (
    ("ValidateVolumeCapabilitiesResponse", "message"),
    ("SnapshotStatus", "details"),
)

_SECRETS = (
    ("CreateVolumeRequest", "controller_create_secrets"),
    ("DeleteVolumeRequest", "controller_delete_secrets"),
    ("ControllerPublishVolumeRequest", "controller_publish_secrets"),
    ("ControllerUnpublishVolumeRequest", "controller_unpublish_secrets"),
    ("CreateSnapshotRequest", "create_snapshot_secrets"),
    ("DeleteSnapshotRequest", "delete_snapshot_secrets"),
    ("NodeStageVolumeRequest", "node_stage_secrets"),
    ("NodePublishVolumeRequest", "node_publish_secrets"),
)

_GENERAL = frozenset({"INVALID_ARGUMENT", "UNIMPLEMENTED"}) | TRANSPORT_CODES


def _codes(*names: str) -> frozenset[str]:
    return frozenset(names)


# NOT_FOUND from a delete RPC breaks the MUST "reply 0 OK" for an object that does not
# exist; csi.delete-not-idempotent (csi_responses) judges it, so it is listed here to keep
# the SHOULD csi.error-code-unexpected from reporting the same answer twice.
_DELETE_NOT_FOUND = "NOT_FOUND"

ERROR_CODES: dict[str, frozenset[str]] = {
    "Probe": _codes("FAILED_PRECONDITION"),
    "CreateVolume": _codes("ABORTED", "ALREADY_EXISTS", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED"),
    "DeleteVolume": _codes("ABORTED", "FAILED_PRECONDITION", _DELETE_NOT_FOUND),
    "ControllerPublishVolume": _codes(
        "ABORTED", "ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND", "RESOURCE_EXHAUSTED"
    ),
    "ControllerUnpublishVolume": _codes("ABORTED", "NOT_FOUND"),
    "ValidateVolumeCapabilities": _codes("NOT_FOUND"),
    "ListVolumes": _codes("ABORTED"),
    "CreateSnapshot": _codes("ABORTED", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED"),
    "DeleteSnapshot": _codes("ABORTED", "FAILED_PRECONDITION", _DELETE_NOT_FOUND),
    "ListSnapshots": _codes("ABORTED"),
    "NodeStageVolume": _codes("ABORTED", "ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND"),
    "NodeUnstageVolume": _codes("ABORTED", "NOT_FOUND"),
    "NodePublishVolume": _codes("ABORTED", "ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND"),
    "NodeUnpublishVolume": _codes("ABORTED", "NOT_FOUND"),
}

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

# §RPC Interface: the Controller and Node Plugins MUST implement their services' RPCs; the
# RPCs whose own section sets no capability condition, and (the proto: "Prior to CSI 1.0 -
# CSI plugins MUST implement both NodeGetId and NodeGetInfo") both node id RPCs.
SERVICES: dict[str, ServiceNeeds] = {
    "Controller": ServiceNeeds(
        frozenset({"ControllerGetCapabilities", "ValidateVolumeCapabilities"}),
        ("plugin", "CONTROLLER_SERVICE"),
    ),
    "Node": ServiceNeeds(
        frozenset(
            {
                "NodePublishVolume",
                "NodeUnpublishVolume",
                "NodeGetCapabilities",
                "NodeGetId",
                "NodeGetInfo",
            }
        )
    ),
}

# §Error Scheme recovery: "Caller MUST fix the request/field before retrying". v0.3 has no
# general UNIMPLEMENTED row; the RPCs whose tables have one say "Caller MUST NOT retry".
FIX_FIRST = {"INVALID_ARGUMENT": FixFirst("MUST fix the request before retrying")}
_NO_RETRY = FixFirst("MUST NOT retry", must_change=())
# ALREADY_EXISTS rows: the existing object is incompatible with the request. A retry for the
# same object keeping every argument (all but secrets, which the rows never name) keeps the
# incompatibility; a retry changing any of them may be the fix.
_VOLUME_ARGUMENTS = FixFirst(
    "MUST fix the arguments or use another name before retrying",
    must_change=CREATE_VOLUME_ARGUMENTS,
)
_SNAPSHOT_ARGUMENTS = FixFirst(
    "MUST fix the arguments or use another name before retrying",
    must_change=CREATE_SNAPSHOT_ARGUMENTS,
)
_PUBLISHED_ARGUMENTS = FixFirst(
    "MUST fix the arguments before retrying",
    must_change=("node_id", "volume_capability", "readonly", "volume_attributes"),
)
_STAGED_ARGUMENTS = FixFirst(
    "MUST fix the arguments before retrying",
    must_change=("staging_target_path", "volume_capability", "publish_info", "volume_attributes"),
)
_NODE_PUBLISHED_ARGUMENTS = FixFirst(
    "MUST fix the arguments before retrying",
    must_change=(
        "target_path",
        "staging_target_path",
        "volume_capability",
        "readonly",
        "publish_info",
        "volume_attributes",
    ),
)

FIX_FIRST_RPC: dict[str, dict[str, FixFirst | None]] = {
    "CreateVolume": {
        "ALREADY_EXISTS": _VOLUME_ARGUMENTS,
        "OUT_OF_RANGE": FixFirst(
            "MUST fix the capacity range before retrying", must_change=("capacity_range",)
        ),
        "UNIMPLEMENTED": _NO_RETRY,
    },
    "DeleteVolume": {"UNIMPLEMENTED": _NO_RETRY},
    "ControllerPublishVolume": {
        "ALREADY_EXISTS": _PUBLISHED_ARGUMENTS,
        "UNIMPLEMENTED": _NO_RETRY,
    },
    "ControllerUnpublishVolume": {"UNIMPLEMENTED": _NO_RETRY},
    "CreateSnapshot": {"ALREADY_EXISTS": _SNAPSHOT_ARGUMENTS, "UNIMPLEMENTED": _NO_RETRY},
    "DeleteSnapshot": {"UNIMPLEMENTED": _NO_RETRY},
    "NodeStageVolume": {"ALREADY_EXISTS": _STAGED_ARGUMENTS},
    "NodePublishVolume": {
        "ALREADY_EXISTS": _NODE_PUBLISHED_ARGUMENTS,
        "FAILED_PRECONDITION": FixFirst(
            "MUST stage the volume first and retry with a valid staging_target_path",
            staging_path_missing,
        ),
    },
    "NodeGetId": {"UNIMPLEMENTED": _NO_RETRY},
    "NodeGetInfo": {"UNIMPLEMENTED": _NO_RETRY},
}

# Rows whose recovery says "retry with exponential back off". v0.3's Error Scheme has no
# ABORTED row: the RPCs whose own table has "Operation pending" carry it.
_PENDING = {"ABORTED": True}
_GONE_OR_PENDING = {"NOT_FOUND": True, "ABORTED": True}
BACKOFF_RPC: dict[str, dict[str, bool]] = {
    "CreateVolume": {"RESOURCE_EXHAUSTED": True, "ABORTED": True},
    "DeleteVolume": {"FAILED_PRECONDITION": True, "ABORTED": True},
    "ControllerPublishVolume": {
        "NOT_FOUND": True,
        "FAILED_PRECONDITION": True,
        "RESOURCE_EXHAUSTED": True,
        "ABORTED": True,
    },
    "ControllerUnpublishVolume": _GONE_OR_PENDING,
    "ValidateVolumeCapabilities": {"NOT_FOUND": True},
    "CreateSnapshot": _PENDING,
    "DeleteSnapshot": {"FAILED_PRECONDITION": True, "ABORTED": True},
    "NodeStageVolume": _GONE_OR_PENDING,
    "NodeUnstageVolume": _GONE_OR_PENDING,
    "NodePublishVolume": _GONE_OR_PENDING,
    "NodeUnpublishVolume": _GONE_OR_PENDING,
}
PENDING_RPCS = frozenset(rpc for rpc, rows in BACKOFF_RPC.items() if rows.get("ABORTED"))

# "This operation MUST be idempotent": see csi_v1.STATE_CHANGES for the codes judged.
_REQUEST = frozenset({"INVALID_ARGUMENT", "UNIMPLEMENTED"})
_NODE = _REQUEST | {"ALREADY_EXISTS", "FAILED_PRECONDITION"}


def _snapshot_ready(resp: Any) -> bool:
    status = resp.snapshot.status
    ready = status.DESCRIPTOR.fields_by_name["type"].enum_type.values_by_name["READY"].number
    return bool(status.type == ready)


STATE_CHANGES: dict[str, StateChange] = {
    # v0.3 has no volume expansion (csi.v1 leaves these two out for it): a volume created a
    # moment ago with the same name and arguments is still compatible with them.
    "CreateVolume": StateChange(_REQUEST | {"ALREADY_EXISTS", "OUT_OF_RANGE"}),
    "DeleteVolume": StateChange(_REQUEST),
    "ControllerPublishVolume": StateChange(_REQUEST),
    "ControllerUnpublishVolume": StateChange(_REQUEST),
    "CreateSnapshot": StateChange(_REQUEST | {"ALREADY_EXISTS"}, final=_snapshot_ready),
    "DeleteSnapshot": StateChange(_REQUEST),
    "NodeStageVolume": StateChange(_NODE, paths=("staging_target_path",)),
    "NodeUnstageVolume": StateChange(_NODE, paths=("staging_target_path",)),
    "NodePublishVolume": StateChange(_NODE, paths=("target_path",)),
    "NodeUnpublishVolume": StateChange(_NODE, paths=("target_path",)),
}

# The checks of csi_common; the families in their own modules follow (merged below).
_BASE = _checks.hooks(TITLE, False, {"NodeGetId": _checks.node_get_id_response})


class NodeInfoSeen:
    """When NodeGetInfo last answered OK: the plugin serves it (SpecState part)."""

    def __init__(self, st: SpecState) -> None:
        self.at: float | None = None


def _node_info_served(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    st.part(NodeInfoSeen).at = st.clock()


def _node_get_id_called(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any
) -> Iterable[Violation]:
    at = st.part(NodeInfoSeen).at
    if at is not None and st.clock() - at <= CAPABILITY_TTL:
        yield Violation(
            cs.rule("node-get-id-deprecated"),
            "",
            f"NodeGetId called although NodeGetInfo answered OK {ago(st.clock() - at)}; its"
            " callers SHOULD use NodeGetInfo",
        )


# §NodeGetId: "Users of this RPC call SHOULD use NodeGetInfo" (it is deprecated).
_NODE_GET_ID = Hooks(
    rules=(
        Rule(
            "csi.node-get-id-deprecated",
            SHOULD,
            (CO,),
            f"{TITLE} §NodeGetId",
            "The CO calls the deprecated NodeGetId while the plugin is known to serve"
            " NodeGetInfo (advisory).",
            reject_code=None,
            note=f"Judged only within {CAPABILITY_TTL:.0f} s of a NodeGetInfo answered OK:"
            " a CO may fall back to NodeGetId for a plugin that does not implement NodeGetInfo.",
        ),
    ),
    request_checks={"NodeGetId": (_node_get_id_called,)},
    on_success={"NodeGetInfo": (_node_info_served,)},
)


def _delete_by_name(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    created = st.creates.get(req.volume_id) if req.volume_id else None
    if created is None or created[1] == req.volume_id or st.peek(req.volume_id) is not None:
        return
    if st.volumes.lossy():
        return  # a volume with that id may have been dropped to make room
    yield Violation(
        cs.rule("delete-by-name"),
        "volume_id",
        "DeleteVolume names as volume_id the name of a CreateVolume that answered another"
        f" volume id {ago(st.clock() - created[2])}, and no volume with that id was seen; the"
        " plugin's volume id is what DeleteVolume takes",
    )


class SnapshotNames:
    """CreateSnapshot name -> (snapshot id, when) of its last OK answer, and the ids those
    answers gave (SpecState part)."""

    def __init__(self, st: SpecState) -> None:
        self.ids: ExpiringMap[str, tuple[str, float]] = ExpiringMap(
            st.max_volumes, st.lifecycle_ttl, st.clock
        )
        self.made: ExpiringMap[str, float] = ExpiringMap(st.max_volumes, st.lifecycle_ttl, st.clock)


def _snapshot_named(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    sid = resp.snapshot.id if resp is not None else ""
    if req.name and sid:
        names = st.part(SnapshotNames)
        names.ids[req.name] = (sid, st.clock())
        names.made[sid] = st.clock()


def _snapshot_deleted(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    st.part(SnapshotNames).made.pop(req.snapshot_id, None)


def _delete_snapshot_by_name(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any
) -> Iterable[Violation]:
    names = st.part(SnapshotNames)
    created = names.ids.get(req.snapshot_id) if req.snapshot_id else None
    if created is None or created[0] == req.snapshot_id or req.snapshot_id in names.made:
        return
    if names.made.lossy():
        return  # a snapshot with that id may have been dropped to make room
    if created[0] not in names.made:
        return  # that snapshot was deleted since
    yield Violation(
        cs.rule("delete-by-name"),
        "snapshot_id",
        "DeleteSnapshot names as snapshot_id the name of a CreateSnapshot that answered"
        f" another snapshot id {ago(st.clock() - created[1])}, and no snapshot with that id"
        " was seen; the plugin's snapshot id is what DeleteSnapshot takes",
    )


# §CreateVolume, DeleteVolume, ListVolumes (and the snapshot counterpart): the deletes take
# the plugin's id, not the CO's name, which may differ from it.
_DELETE_BY_NAME = Hooks(
    rules=(
        Rule(
            "csi.delete-by-name",
            MUST,
            (CO,),
            f"{TITLE} §CreateVolume, DeleteVolume, ListVolumes; §CreateSnapshot, DeleteSnapshot,"
            " ListSnapshots",
            "DeleteVolume (DeleteSnapshot) passes as volume_id (snapshot_id) the name of a"
            " volume (snapshot) whose CreateVolume (CreateSnapshot) answered another id on this"
            " socket.",
            reject_code=None,
            note="Judged only while the create is remembered and no delete of it answered OK,"
            " and when no volume (snapshot) with that id was seen on this socket (a plugin may"
            " give one object the id another is named by). Reported, never enforced.",
        ),
    ),
    request_checks={
        "DeleteVolume": (_delete_by_name,),
        "DeleteSnapshot": (_delete_snapshot_by_name,),
    },
    on_success={"CreateSnapshot": (_snapshot_named,), "DeleteSnapshot": (_snapshot_deleted,)},
)

TABLE = SpecTable(
    spec="csi.v0",
    family="csi",
    title=TITLE,
    package="csi.v0",
    required=REQUIRED,
    required_nonzero=frozenset({("Snapshot", "created_at")}),
    size_overrides=dict.fromkeys((*_PATHS, *_MESSAGES)),
    size_recommended=dict.fromkeys((*_PATHS, *_MESSAGES), 128),
    echoes=ECHOES,
    repeated_total_limits={("VolumeCapability.MountVolume", "mount_flags"): 4096},
    plugin_name_fields=(("GetPluginInfoResponse", "name"),),
    plugin_name_underscores=True,  # §GetPluginInfo: "dashes (-), underscores (_), dots (.)"
    secret_maps=_SECRETS,
    # The five node paths each "MUST be an absolute path" in CSI v0.3 too.
    absolute_paths=_PATHS,
    topology_message="Topology",
    topology_requirement_message="TopologyRequirement",
    topology_prefix_lower=False,  # v0.3: prefix as a key name, in reverse domain notation
    non_negative=(
        ("CapacityRange", "required_bytes"),
        ("CapacityRange", "limit_bytes"),
        ("Volume", "capacity_bytes"),
        ("ListVolumesRequest", "max_entries"),
        ("GetCapacityResponse", "available_capacity"),
        ("Snapshot", "size_bytes"),
        ("ListSnapshotsRequest", "max_entries"),
        ("NodeGetInfoResponse", "max_volumes_per_node"),
    ),
    error_codes=ERROR_CODES,
    general_codes=_GENERAL,
    required_rpcs=frozenset({"GetPluginInfo", "GetPluginCapabilities", "Probe"}),
    capability_queries={
        "plugin": "/csi.v0.Identity/GetPluginCapabilities",
        "controller": "/csi.v0.Controller/ControllerGetCapabilities",
        "node": "/csi.v0.Node/NodeGetCapabilities",
    },
    capability_responses={
        "GetPluginCapabilities": "plugin",
        "ControllerGetCapabilities": "controller",
        "NodeGetCapabilities": "node",
    },
    rpc_gates=RPC_GATES,
    services=SERVICES,
    fix_first=FIX_FIRST,
    fix_first_rpc=FIX_FIRST_RPC,
    backoff_rpc=BACKOFF_RPC,
    pending_rpcs=PENDING_RPCS,
    state_changes=STATE_CHANGES,
    accepted_not_judged=frozenset({"csi.call-order"}),  # as in csi_v1
    **merged(
        _BASE,
        _NODE_GET_ID,
        _DELETE_BY_NAME,
        csi_capabilities.hooks(TITLE, v1=False),
        csi_volumes.hooks(TITLE, v1=False),
        csi_snapshots.hooks(TITLE, v1=False),
        csi_listings.hooks(TITLE),
        csi_order.hooks(TITLE, v1=False),
        csi_responses.hooks(TITLE, v1=False),
        csi_readonly.hooks(TITLE, v1=False),
        csi_recovery.hooks(TITLE, v1=False),
        csi_placement.hooks(TITLE, v1=False),
    ),
)
