"""Rule table of CSI v0.3 (package csi.v0).

What CSI v0.3 and v1.12 state alike is written once, in each version's field names, in
:mod:`~plugproxy.rules.csi_tables`; this module holds the rest of CSI v0.3's table.

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
from plugproxy.rules import csi_tables
from plugproxy.rules.csi_common import TRANSPORT_CODES, CsiChecks
from plugproxy.rules.csi_tables import DELETE_NOT_FOUND, codes
from plugproxy.rules.engine import (
    CO,
    MUST,
    SHOULD,
    FixFirst,
    Hooks,
    Rule,
    ServiceNeeds,
    Violation,
)
from plugproxy.rules.state import CAPABILITY_TTL
from plugproxy.spec.csi_names import CSI_V0_NAMES

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState

TITLE = "CSI v0.3"
_checks = CsiChecks(
    volume_id=CSI_V0_NAMES.volume_id,
    topology_capability="ACCESSIBILITY_CONSTRAINTS",
    fixed_shape=True,
)

REQUIRED: dict[str, tuple[str, ...]] = {
    **csi_tables.required(CSI_V0_NAMES),
    "ValidateVolumeCapabilitiesResponse": ("supported",),
    "Snapshot": ("id", "source_volume_id", "created_at"),
    "SnapshotStatus": ("type",),
    "NodeGetIdResponse": ("node_id",),
}

# Request fields where the CO passes back what the plugin made -> where the plugin made it.
ECHOES = csi_tables.echoes(CSI_V0_NAMES)

_PATHS = (
    ("NodeStageVolumeRequest", "staging_target_path"),
    ("NodeUnstageVolumeRequest", "staging_target_path"),
    ("NodePublishVolumeRequest", "staging_target_path"),
    ("NodePublishVolumeRequest", "target_path"),
    ("NodeUnpublishVolumeRequest", "target_path"),
)

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

ERROR_CODES: dict[str, frozenset[str]] = {
    "Probe": codes("FAILED_PRECONDITION"),
    "CreateVolume": codes("ABORTED", "ALREADY_EXISTS", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED"),
    "DeleteVolume": codes("ABORTED", "FAILED_PRECONDITION", DELETE_NOT_FOUND),
    "ControllerPublishVolume": codes(
        "ABORTED", "ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND", "RESOURCE_EXHAUSTED"
    ),
    "ControllerUnpublishVolume": codes("ABORTED", "NOT_FOUND"),
    "ValidateVolumeCapabilities": codes("NOT_FOUND"),
    "ListVolumes": codes("ABORTED"),
    "CreateSnapshot": codes("ABORTED", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED"),
    "DeleteSnapshot": codes("ABORTED", "FAILED_PRECONDITION", DELETE_NOT_FOUND),
    "ListSnapshots": codes("ABORTED"),
    "NodeStageVolume": codes("ABORTED", "ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND"),
    "NodeUnstageVolume": codes("ABORTED", "NOT_FOUND"),
    "NodePublishVolume": codes("ABORTED", "ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND"),
    "NodeUnpublishVolume": codes("ABORTED", "NOT_FOUND"),
}

# §RPC Interface, and (the proto: "Prior to CSI 1.0 - CSI plugins MUST implement both
# NodeGetId and NodeGetInfo") both node id RPCs.
SERVICES: dict[str, ServiceNeeds] = {
    "Controller": csi_tables.CONTROLLER_SERVICE,
    "Node": ServiceNeeds(csi_tables.NODE_RPCS | {"NodeGetId", "NodeGetInfo"}),
}

# §Error Scheme recovery: v0.3 has no general UNIMPLEMENTED row; the RPCs whose tables have
# one say "Caller MUST NOT retry".
FIX_FIRST = {"INVALID_ARGUMENT": csi_tables.FIX_REQUEST}
# ALREADY_EXISTS of ControllerPublishVolume: a retry keeping every argument the row compares
# (all but secrets, which the rows never name) keeps the incompatibility.
_PUBLISHED_ARGUMENTS = FixFirst(
    "MUST fix the arguments before retrying",
    must_change=("node_id", "volume_capability", "readonly", "volume_attributes"),
)

FIX_FIRST_RPC: dict[str, dict[str, FixFirst | None]] = {
    "CreateVolume": {
        "ALREADY_EXISTS": csi_tables.VOLUME_ARGUMENTS,
        "OUT_OF_RANGE": csi_tables.CAPACITY_RANGE,
        "UNIMPLEMENTED": csi_tables.NO_RETRY,
    },
    "DeleteVolume": {"UNIMPLEMENTED": csi_tables.NO_RETRY},
    "ControllerPublishVolume": {
        "ALREADY_EXISTS": _PUBLISHED_ARGUMENTS,
        "UNIMPLEMENTED": csi_tables.NO_RETRY,
    },
    "ControllerUnpublishVolume": {"UNIMPLEMENTED": csi_tables.NO_RETRY},
    "CreateSnapshot": {
        "ALREADY_EXISTS": csi_tables.SNAPSHOT_ARGUMENTS,
        "UNIMPLEMENTED": csi_tables.NO_RETRY,
    },
    "DeleteSnapshot": {"UNIMPLEMENTED": csi_tables.NO_RETRY},
    "NodeStageVolume": {"ALREADY_EXISTS": csi_tables.staged_arguments(CSI_V0_NAMES)},
    "NodePublishVolume": {
        "ALREADY_EXISTS": csi_tables.node_published_arguments(CSI_V0_NAMES),
        "FAILED_PRECONDITION": csi_tables.STAGE_FIRST,
    },
    "NodeGetId": {"UNIMPLEMENTED": csi_tables.NO_RETRY},
    "NodeGetInfo": {"UNIMPLEMENTED": csi_tables.NO_RETRY},
}

# v0.3's Error Scheme has no ABORTED row: the RPCs whose own table has "Operation pending"
# carry it, and its recovery is to retry with exponential back off.
PENDING_RPCS = frozenset(
    {
        "CreateVolume",
        "DeleteVolume",
        "ControllerPublishVolume",
        "ControllerUnpublishVolume",
        "CreateSnapshot",
        "DeleteSnapshot",
        "NodeStageVolume",
        "NodeUnstageVolume",
        "NodePublishVolume",
        "NodeUnpublishVolume",
    }
)
# Rows whose recovery says "retry with exponential back off".
BACKOFF_RPC: dict[str, dict[str, bool]] = {
    rpc: {**rows, "ABORTED": True} if rpc in PENDING_RPCS else rows
    for rpc, rows in {
        "CreateVolume": {"RESOURCE_EXHAUSTED": True},
        **csi_tables.BACKOFF_RPC,
        "CreateSnapshot": {},
    }.items()
}


def _snapshot_ready(resp: Any) -> bool:
    status = resp.snapshot.status
    ready = status.DESCRIPTOR.fields_by_name["type"].enum_type.values_by_name["READY"].number
    return bool(status.type == ready)


# v0.3 has no volume expansion (csi.v1 leaves these two out for it): a volume created a
# moment ago with the same name and arguments is still compatible with them.
STATE_CHANGES = csi_tables.state_changes(
    csi_tables.REQUEST_CODES | {"ALREADY_EXISTS", "OUT_OF_RANGE"}, _snapshot_ready
)

# The checks of csi_common; csi_table adds the rule families of the csi_* modules.
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

TABLE = csi_tables.csi_table(
    spec="csi.v0",
    title=TITLE,
    v1=False,
    capability_kinds=("plugin", "controller", "node"),
    own=(_BASE, _NODE_GET_ID, _DELETE_BY_NAME),
    required=REQUIRED,
    required_nonzero=frozenset({("Snapshot", "created_at")}),
    size_overrides=dict.fromkeys((*_PATHS, *_MESSAGES)),
    size_recommended=dict.fromkeys((*_PATHS, *_MESSAGES), 128),
    echoes=ECHOES,
    plugin_name_underscores=True,  # §GetPluginInfo: "dashes (-), underscores (_), dots (.)"
    secret_maps=_SECRETS,
    # The five node paths each "MUST be an absolute path" in CSI v0.3 too.
    absolute_paths=_PATHS,
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
    rpc_gates=csi_tables.RPC_GATES,
    services=SERVICES,
    fix_first=FIX_FIRST,
    fix_first_rpc=FIX_FIRST_RPC,
    backoff_rpc=BACKOFF_RPC,
    pending_rpcs=PENDING_RPCS,
    state_changes=STATE_CHANGES,
)
