"""CSI v1.12 from CreateSnapshot's error rows to §NodeGetVolumeStats' request: planted
breaches of the snapshot RPCs, ControllerExpandVolume, the node stage/publish calls and
their order (§RPC Interactions and Reference Counting), with their legitimate twins."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import NODE, RWO, RWX, v1_background
from tests.integration.planted.csi_v1_part1b_builders import (
    GIB,
    PUBLISH_CAPS,
    SNAP,
    SNAPSHOT_CAPS,
    VOL,
    controller,
    create,
    group,
    group_background,
    publish,
    snapshot,
    take,
    unpublish,
    volume,
)
from tests.integration.planted.csi_v1_part2b_builders import (
    STAGING,
    TARGET,
    publish_request,
    stage_request,
    stats_answer,
    stats_request,
    unpublish_request,
    unstage_request,
)
from tests.integration.planted.harness import Case, Step

SPEC = "csi.v1"
CASES: list[Case] = []

RWO_SINGLE = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_SINGLE_WRITER"}}
RWO_MULTI = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_MULTI_WRITER"}}
READ_ONLY = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_READER_ONLY"}}
OTHER_TARGET = "/var/lib/kubelet/pods/p2/volumes/kubernetes.io~csi/pv-1/mount"
DEVICE = {"devicePath": "/dev/xvdb"}
CONTEXT = {"share": "pool-a/vol-1"}
NODE_INFO = {"node_id": NODE}
SNAPSHOTS = controller(*SNAPSHOT_CAPS)
STAGED = v1_background(node=("STAGE_UNSTAGE_VOLUME",))
UNSTAGED = v1_background()
UNIFIED = v1_background(
    controller=("CREATE_DELETE_VOLUME", *PUBLISH_CAPS), node=("STAGE_UNSTAGE_VOLUME",)
)
UNIFIED_UNSTAGED = v1_background(controller=("CREATE_DELETE_VOLUME", *PUBLISH_CAPS))
# A controller RPC answered OK: the socket serves the controller it advertises.
_SERVED = Step("CreateVolume", create("pvc-9"), answer=volume("vol-9"))
EXPANDS = v1_background(
    plugin=("CONTROLLER_SERVICE",), controller=("CREATE_DELETE_VOLUME", "EXPAND_VOLUME")
)


def case(
    statements: tuple[str, ...],
    rule: str,
    breach: tuple[Step, ...],
    twin: tuple[Step, ...],
    background: dict[str, Any],
    party: str,
    why: str = "",
    variant: str = "",
    twin_allows: tuple[str, ...] = (),
) -> None:
    CASES.append(
        Case(SPEC, statements, rule, breach, twin, background, party, why, variant, twin_allows)
    )


def unimplemented(statement: str, rpc: str, request: dict[str, Any], answer: Any, bg: dict) -> None:
    """``rpc`` answered UNIMPLEMENTED although the plugin advertises it; twin: served."""
    case(
        (statement,),
        "csi.unimplemented-advertised",
        (Step(rpc, request, error=("UNIMPLEMENTED", f"{rpc} is not implemented")),),
        (Step(rpc, request, answer=answer),),
        bg,
        "plugin",
    )


def required(
    statement: str, rpc: str, breach: dict[str, Any], twin: dict[str, Any], bg: dict, answer: Any
) -> None:
    """A REQUIRED request field left out (party co); twin: the full request."""
    case(
        (statement,),
        "csi.required-field",
        (Step(rpc, breach, answer=answer),),
        (Step(rpc, twin, answer=answer),),
        bg,
        "co",
    )


def relative(
    statement: str, rpc: str, field: str, request: dict[str, Any], bg: dict, answer: Any
) -> None:
    """A path that MUST be absolute passed relative; twin: the absolute path."""
    bad = {**request, field: request[field].lstrip("/")}
    case(
        (statement,),
        "csi.path-not-absolute",
        (Step(rpc, bad, answer=answer),),
        (Step(rpc, request, answer=answer),),
        bg,
        "co",
    )


def repeat_refused(
    statements: tuple[str, ...],
    rpc: str,
    request: dict[str, Any],
    answer: Any,
    bg: dict,
    code: str = "INVALID_ARGUMENT",
    first: tuple[Step, ...] = (),
) -> None:
    """An identical repeat of a call answered OK is refused with ``code``; twin: OK again."""
    case(
        statements,
        "csi.not-idempotent",
        (*first, Step(rpc, request, answer=answer), Step(rpc, request, error=(code, "refused"))),
        (*first, Step(rpc, request, answer=answer), Step(rpc, request, answer=answer)),
        bg,
        "plugin",
        variant=code.lower(),
    )


def resent(
    statements: tuple[str, ...],
    rpc: str,
    request: dict[str, Any],
    code: str,
    fixed: dict[str, Any],
    answer: Any,
    bg: dict,
) -> None:
    """Refused with ``code`` and sent again unchanged; twin: the request fixed first."""
    case(
        statements,
        "csi.retry-without-change",
        (Step(rpc, request, error=(code, "refused")), Step(rpc, request, error=(code, "refused"))),
        (Step(rpc, request, error=(code, "refused")), Step(rpc, fixed, answer=answer)),
        bg,
        "co",
    )


_ABORTED = ("ABORTED", "operation pending")


def while_pending(statements: tuple[str, ...], rpc: str, request: dict, answer: Any, bg: dict):
    """A call held by the plugin has two more for the same object queued behind it: one
    answered ABORTED, one held in turn; the retry of the aborted one comes while the
    latter is pending. Twin: the retry comes when nothing for the object is in flight."""
    case(
        statements,
        "csi.retry-while-pending",
        (
            Step(rpc, request, answer=answer, hold=0.6, pending=True),
            Step(rpc, request, error=_ABORTED, pending=True),
            Step(rpc, request, answer=answer, hold=0.6, pending=True),
            Step(rpc, request, answer=answer, wait=0.7),
        ),
        (
            Step(rpc, request, answer=answer, hold=0.2, pending=True),
            Step(rpc, request, error=_ABORTED, pending=True),
            Step(rpc, request, answer=answer, wait=0.7),
        ),
        bg,
        "co",
    )


# -- CreateSnapshot's error rows -----------------------------------------------------------
resent(
    ("CreateSnapshot-Errors.3", "CreateSnapshot-Errors.4"),
    "CreateSnapshot",
    take(),
    "ALREADY_EXISTS",
    take("snapshot-2"),
    {"snapshot": snapshot()},
    SNAPSHOTS,
)
while_pending(
    ("CreateSnapshot-Errors.3", "CreateSnapshot-Errors.6"),
    "CreateSnapshot",
    take(),
    {"snapshot": snapshot()},
    SNAPSHOTS,
)

# -- DeleteSnapshot ------------------------------------------------------------------------
unimplemented("DeleteSnapshot.1", "DeleteSnapshot", {"snapshot_id": SNAP}, {}, SNAPSHOTS)
case(
    ("DeleteSnapshot.2", "DeleteSnapshot.3"),
    "csi.delete-not-idempotent",
    (Step("DeleteSnapshot", {"snapshot_id": SNAP}, error=("NOT_FOUND", "no such snapshot")),),
    (Step("DeleteSnapshot", {"snapshot_id": SNAP}, answer={}),),
    SNAPSHOTS,
    "plugin",
)
repeat_refused(
    ("DeleteSnapshot.2", "DeleteSnapshot.3"),
    "DeleteSnapshot",
    {"snapshot_id": SNAP},
    {},
    SNAPSHOTS,
)
_GROUP_REQUEST = {"name": "groupsnapshot-1", "source_volume_ids": ["vol-a"]}
case(
    ("DeleteSnapshot.4",),
    "csi.delete-group-member",
    (
        Step("CreateVolumeGroupSnapshot", _GROUP_REQUEST, answer=group()),
        Step("DeleteSnapshot", {"snapshot_id": "snap-a"}, answer={}),
    ),
    (
        Step("CreateVolumeGroupSnapshot", _GROUP_REQUEST, answer=group()),
        Step(
            "DeleteVolumeGroupSnapshot",
            {"group_snapshot_id": "group-1", "snapshot_ids": ["snap-a"]},
            answer={},
        ),
    ),
    group_background(),
    "co",
    why="a snapshot returned as a member of a group is deleted on its own",
)
required(
    "DeleteSnapshot.6",
    "DeleteSnapshot",
    {"secrets": {"key": "value"}},
    {"snapshot_id": SNAP, "secrets": {"key": "value"}},
    SNAPSHOTS,
    {},
)
while_pending(("DeleteSnapshot-Errors.7",), "DeleteSnapshot", {"snapshot_id": SNAP}, {}, SNAPSHOTS)

# -- ListSnapshots -------------------------------------------------------------------------
_LISTS = controller(*SNAPSHOT_CAPS, "LIST_SNAPSHOTS")
_ENTRY = {"snapshot": snapshot()}
_ENTRY_2 = {"snapshot": snapshot("snap-2")}
unimplemented("ListSnapshots.1", "ListSnapshots", {}, {"entries": [_ENTRY]}, _LISTS)
case(
    ("ListSnapshots.5",),
    "csi.list-max-entries",
    (Step("ListSnapshots", {"max_entries": 1}, answer={"entries": [_ENTRY, _ENTRY_2]}),),
    (Step("ListSnapshots", {"max_entries": 1}, answer={"entries": [_ENTRY], "next_token": "2"}),),
    _LISTS,
    "plugin",
)
case(
    ("ListSnapshots.7",),
    "csi.negative-value",
    (Step("ListSnapshots", {"max_entries": -1}, answer={"entries": [_ENTRY]}),),
    (Step("ListSnapshots", {"max_entries": 1}, answer={"entries": [_ENTRY]}),),
    _LISTS,
    "co",
)
case(
    ("ListSnapshots-Errors.4",),
    "csi.list-restart-expected",
    (
        Step("ListSnapshots", {"starting_token": "t-7"}, error=("ABORTED", "stale token")),
        Step("ListSnapshots", {"starting_token": "t-7"}, wait=0.05, answer={"entries": []}),
    ),
    (
        Step("ListSnapshots", {"starting_token": "t-7"}, error=("ABORTED", "stale token")),
        Step("ListSnapshots", {}, wait=0.05, answer={"entries": [_ENTRY]}),
    ),
    _LISTS,
    "co",
)

# -- GetSnapshot ---------------------------------------------------------------------------
_GETS = controller(*SNAPSHOT_CAPS, "GET_SNAPSHOT")
unimplemented(
    "GetSnapshot.1", "GetSnapshot", {"snapshot_id": SNAP}, {"snapshot": snapshot()}, _GETS
)
_GROUP_CAPS = {"capabilities": [{"rpc": {"type": "CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT"}}]}
case(
    ("GetSnapshot.2",),
    "csi.group-without-get-snapshot",
    (
        Step("GroupControllerGetCapabilities", {}, answer=_GROUP_CAPS),
        Step(
            "ControllerGetCapabilities",
            {},
            answer={"capabilities": [{"rpc": {"type": c}} for c in SNAPSHOT_CAPS]},
        ),
    ),
    (
        Step("GroupControllerGetCapabilities", {}, answer=_GROUP_CAPS),
        Step(
            "ControllerGetCapabilities",
            {},
            answer={
                "capabilities": [{"rpc": {"type": c}} for c in (*SNAPSHOT_CAPS, "GET_SNAPSHOT")]
            },
        ),
    ),
    group_background(),
    "plugin",
)
required("GetSnapshot.3", "GetSnapshot", {}, {"snapshot_id": SNAP}, _GETS, {"snapshot": snapshot()})
case(
    ("GetSnapshot.4",),
    "csi.required-field",
    (Step("GetSnapshot", {"snapshot_id": SNAP}, answer={}),),
    (Step("GetSnapshot", {"snapshot_id": SNAP}, answer={"snapshot": snapshot()}),),
    _GETS,
    "plugin",
)

# -- ControllerExpandVolume ----------------------------------------------------------------
_EXPAND = {"volume_id": VOL, "capacity_range": {"required_bytes": 2 * GIB}}
_EXPANDED = {"capacity_bytes": 2 * GIB, "node_expansion_required": True}
unimplemented("ControllerExpandVolume.1", "ControllerExpandVolume", _EXPAND, _EXPANDED, EXPANDS)
repeat_refused(("ControllerExpandVolume.2",), "ControllerExpandVolume", _EXPAND, _EXPANDED, EXPANDS)
case(
    ("ControllerExpandVolume.3",),
    "csi.expand-already-large-refused",
    (
        Step("ControllerExpandVolume", _EXPAND, answer=_EXPANDED),
        Step(
            "ControllerExpandVolume",
            {"volume_id": VOL, "capacity_range": {"required_bytes": GIB}},
            error=("OUT_OF_RANGE", "cannot shrink"),
        ),
    ),
    (
        Step("ControllerExpandVolume", _EXPAND, answer=_EXPANDED),
        Step(
            "ControllerExpandVolume",
            {"volume_id": VOL, "capacity_range": {"required_bytes": GIB}},
            answer=_EXPANDED,
        ),
    ),
    EXPANDS,
    "plugin",
    why="a volume already expanded beyond the size asked is refused instead of answered OK",
)
_OFFLINE = v1_background(
    controller=("CREATE_DELETE_VOLUME", "EXPAND_VOLUME", *PUBLISH_CAPS),
)
_OFFLINE["GetPluginCapabilities"] = {
    "capabilities": [
        {"service": {"type": "CONTROLLER_SERVICE"}},
        {"volume_expansion": {"type": "OFFLINE"}},
    ]
}
case(
    ("ControllerExpandVolume.5",),
    "csi.call-order",
    (
        Step("ControllerPublishVolume", publish(), answer={}),
        Step("ControllerExpandVolume", _EXPAND, answer=_EXPANDED),
    ),
    (
        Step("ControllerPublishVolume", publish(), answer={}),
        Step("ControllerUnpublishVolume", unpublish(), answer={}),
        Step("ControllerExpandVolume", _EXPAND, answer=_EXPANDED),
    ),
    _OFFLINE,
    "co",
    why="an offline-only plugin is asked to expand a volume still published to a node",
)
required(
    "ControllerExpandVolume.6",
    "ControllerExpandVolume",
    {"capacity_range": {"required_bytes": 2 * GIB}},
    _EXPAND,
    EXPANDS,
    _EXPANDED,
)
required(
    "ControllerExpandVolume.7",
    "ControllerExpandVolume",
    {"volume_id": VOL},
    _EXPAND,
    EXPANDS,
    _EXPANDED,
)
resent(
    ("ControllerExpandVolume-Errors.3",),
    "ControllerExpandVolume",
    {"volume_id": VOL, "capacity_range": {"required_bytes": 1 << 50}},
    "OUT_OF_RANGE",
    _EXPAND,
    _EXPANDED,
    EXPANDS,
)

# -- NodeStageVolume -----------------------------------------------------------------------
unimplemented("NodeStageVolume.1", "NodeStageVolume", stage_request(), {}, STAGED)
repeat_refused(("NodeStageVolume.6",), "NodeStageVolume", stage_request(), {}, STAGED)
repeat_refused(
    ("NodeStageVolume.6", "NodeStageVolume.7"),
    "NodeStageVolume",
    stage_request(),
    {},
    STAGED,
    code="ALREADY_EXISTS",
)
required(
    "NodeStageVolume.8",
    "NodeStageVolume",
    {**stage_request(), "volume_id": ""},
    stage_request(),
    STAGED,
    {},
)
# Another publish_context than ControllerPublishVolume returned for the node.
case(
    ("NodeStageVolume.9",),
    "csi.publish-context-mismatch",
    (
        Step("NodeGetInfo", answer=NODE_INFO),
        Step("ControllerPublishVolume", publish(), answer={"publish_context": DEVICE}),
        Step(
            "NodeStageVolume",
            {**stage_request(), "publish_context": {"devicePath": "/dev/xvdz"}},
            answer={},
        ),
    ),
    (
        Step("NodeGetInfo", answer=NODE_INFO),
        Step("ControllerPublishVolume", publish(), answer={"publish_context": DEVICE}),
        Step("NodeStageVolume", {**stage_request(), "publish_context": DEVICE}, answer={}),
    ),
    UNIFIED,
    "co",
)
# A publish_context passed though the plugin has no ControllerPublishVolume.
case(
    ("NodeStageVolume.9",),
    "csi.field-without-capability",
    (_SERVED, Step("NodeStageVolume", {**stage_request(), "publish_context": DEVICE}, answer={})),
    (_SERVED, Step("NodeStageVolume", stage_request(), answer={})),
    STAGED,
    "co",
)
relative(
    "NodeStageVolume.10", "NodeStageVolume", "staging_target_path", stage_request(), STAGED, {}
)
case(
    ("NodeStageVolume.11", "RPC-Interactions-and-Reference-Counting.2"),
    "csi.staging-path-conflict",
    (
        Step("NodeStageVolume", stage_request(), answer={}),
        Step(
            "NodeStageVolume",
            {**stage_request(), "staging_target_path": STAGING + "-2"},
            answer={},
        ),
    ),
    (
        Step("NodeStageVolume", stage_request(), answer={}),
        Step("NodeStageVolume", stage_request(), answer={}),
    ),
    STAGED,
    "co",
    why="the volume staged at a second staging path on the node while staged at the first",
)
required(
    "NodeStageVolume.14",
    "NodeStageVolume",
    {"volume_id": VOL, "volume_capability": RWO},
    stage_request(),
    STAGED,
    {},
)
required(
    "NodeStageVolume.18",
    "NodeStageVolume",
    unstage_request(),
    stage_request(),
    STAGED,
    {},
)
case(
    ("NodeStageVolume.19",),
    "csi.volume-context-mismatch",
    (
        Step("CreateVolume", create(), answer=volume(volume_context=CONTEXT)),
        Step(
            "NodeStageVolume",
            {**stage_request(), "volume_context": {"share": "pool-b/vol-1"}},
            answer={},
        ),
    ),
    (
        Step("CreateVolume", create(), answer=volume(volume_context=CONTEXT)),
        Step("NodeStageVolume", {**stage_request(), "volume_context": CONTEXT}, answer={}),
    ),
    STAGED,
    "co",
)
resent(
    ("NodeStageVolume-Errors.5",),
    "NodeStageVolume",
    stage_request(),
    "ALREADY_EXISTS",
    {**stage_request(), "volume_capability": RWX},
    {},
    STAGED,
)

# -- NodeUnstageVolume ---------------------------------------------------------------------
unimplemented("NodeUnstageVolume.1", "NodeUnstageVolume", unstage_request(), {}, STAGED)
# Unpublished from the node by the controller while still staged there.
case(
    ("NodeUnstageVolume.4",),
    "csi.call-order",
    (
        Step("NodeGetInfo", answer=NODE_INFO),
        Step("ControllerPublishVolume", publish(), answer={"publish_context": DEVICE}),
        Step("NodeStageVolume", {**stage_request(), "publish_context": DEVICE}, answer={}),
        Step("ControllerUnpublishVolume", unpublish(), answer={}),
    ),
    (
        Step("NodeGetInfo", answer=NODE_INFO),
        Step("ControllerPublishVolume", publish(), answer={"publish_context": DEVICE}),
        Step("NodeStageVolume", {**stage_request(), "publish_context": DEVICE}, answer={}),
        Step("NodeUnstageVolume", unstage_request(), answer={}),
        Step("ControllerUnpublishVolume", unpublish(), answer={}),
    ),
    UNIFIED,
    "co",
    why="ControllerUnpublishVolume to the node while the volume is staged there",
)
_STAGE = Step("NodeStageVolume", stage_request(), answer={})
_PUBLISH = Step(
    "NodePublishVolume", {**publish_request(), "staging_target_path": STAGING}, answer={}
)
_UNSTAGE = Step("NodeUnstageVolume", unstage_request(), answer={})
case(
    ("NodeUnstageVolume.5", "RPC-Interactions-and-Reference-Counting.3"),
    "csi.call-order",
    (_STAGE, _PUBLISH, _UNSTAGE),
    (_STAGE, _PUBLISH, Step("NodeUnpublishVolume", unpublish_request(), answer={}), _UNSTAGE),
    STAGED,
    "co",
    why="unstaged while still published at its target path",
)
repeat_refused(
    ("NodeUnstageVolume.7", "NodeUnstageVolume.8"),
    "NodeUnstageVolume",
    unstage_request(),
    {},
    STAGED,
    first=(_STAGE,),
)
required(
    "NodeUnstageVolume.9",
    "NodeUnstageVolume",
    {"staging_target_path": STAGING},
    unstage_request(),
    STAGED,
    {},
)
relative(
    "NodeUnstageVolume.10",
    "NodeUnstageVolume",
    "staging_target_path",
    unstage_request(),
    STAGED,
    {},
)
required(
    "NodeUnstageVolume.11", "NodeUnstageVolume", {"volume_id": VOL}, unstage_request(), STAGED, {}
)

# -- §RPC Interactions and Reference Counting ----------------------------------------------
case(
    ("RPC-Interactions-and-Reference-Counting.1", "RPC-Interactions-and-Reference-Counting.2"),
    "csi.call-order",
    (_STAGE, _UNSTAGE, _PUBLISH),
    (_STAGE, _UNSTAGE, _STAGE, _PUBLISH),
    STAGED,
    "co",
    why="published after its staging was undone, with no stage answered OK since",
)

# -- NodePublishVolume ---------------------------------------------------------------------
_NP = publish_request()
repeat_refused(("NodePublishVolume.3",), "NodePublishVolume", _NP, {}, UNSTAGED)
repeat_refused(
    ("NodePublishVolume.3", "NodePublishVolume.4"),
    "NodePublishVolume",
    _NP,
    {},
    UNSTAGED,
    code="ALREADY_EXISTS",
)
_RO_AT_SAME = {**_NP, "volume_capability": READ_ONLY}
case(
    ("NodePublishVolume.5",),
    "csi.republish-different-capability",
    (
        Step("NodePublishVolume", _NP, answer={}),
        Step("NodePublishVolume", _RO_AT_SAME, error=("FAILED_PRECONDITION", "published")),
    ),
    (
        Step("NodePublishVolume", _NP, answer={}),
        Step("NodeUnpublishVolume", unpublish_request(), answer={}),
        Step("NodePublishVolume", _RO_AT_SAME, answer={}),
    ),
    UNSTAGED,
    "co",
    why="the same target path published again with another access mode, not unpublished since",
)
case(
    ("NodePublishVolume.6", "NodePublishVolume.7"),
    "csi.republish-answer",
    (
        Step("NodePublishVolume", _NP, answer={}),
        Step("NodePublishVolume", _RO_AT_SAME, answer={}),
    ),
    (
        Step("NodePublishVolume", _NP, answer={}),
        Step(
            "NodePublishVolume",
            _RO_AT_SAME,
            error=("FAILED_PRECONDITION", "published there with another capability"),
        ),
    ),
    UNSTAGED,
    "plugin",
    why="a second publish at the same target path with another capability answered OK",
    twin_allows=("csi.republish-different-capability",),  # the CO's part of the setting
)
_SINGLE = {**_NP, "volume_capability": RWO_SINGLE}
case(
    ("NodePublishVolume.7", "NodePublishVolume.8"),
    "csi.republish-answer",
    (
        Step("NodePublishVolume", _SINGLE, answer={}),
        Step("NodePublishVolume", {**_SINGLE, "target_path": OTHER_TARGET}, answer={}),
    ),
    (
        Step("NodePublishVolume", _SINGLE, answer={}),
        Step(
            "NodePublishVolume",
            {**_SINGLE, "target_path": OTHER_TARGET},
            error=("FAILED_PRECONDITION", "single writer already published"),
        ),
    ),
    UNSTAGED,
    "plugin",
    why="a SINGLE_NODE_SINGLE_WRITER volume published at a second target path answered OK",
    variant="single-writer",
)
required("NodePublishVolume.10", "NodePublishVolume", {**_NP, "volume_id": ""}, _NP, UNSTAGED, {})
case(
    ("NodePublishVolume.11",),
    "csi.publish-context-mismatch",
    (
        Step("NodeGetInfo", answer=NODE_INFO),
        Step("ControllerPublishVolume", publish(), answer={"publish_context": DEVICE}),
        Step(
            "NodePublishVolume", {**_NP, "publish_context": {"devicePath": "/dev/xvdz"}}, answer={}
        ),
    ),
    (
        Step("NodeGetInfo", answer=NODE_INFO),
        Step("ControllerPublishVolume", publish(), answer={"publish_context": DEVICE}),
        Step("NodePublishVolume", {**_NP, "publish_context": DEVICE}, answer={}),
    ),
    UNIFIED_UNSTAGED,
    "co",
)
case(
    ("NodePublishVolume.11",),
    "csi.field-without-capability",
    (_SERVED, Step("NodePublishVolume", {**_NP, "publish_context": DEVICE}, answer={})),
    (_SERVED, Step("NodePublishVolume", _NP, answer={})),
    UNSTAGED,
    "co",
)
case(
    ("NodePublishVolume.12",),
    "csi.path-not-absolute",
    (_STAGE, Step("NodePublishVolume", {**_NP, "staging_target_path": STAGING[1:]}, answer={})),
    (_STAGE, _PUBLISH),
    STAGED,
    "co",
)
case(
    ("NodePublishVolume.13",),
    "csi.field-missing-with-capability",
    (_STAGE, Step("NodePublishVolume", _NP, answer={})),
    (_STAGE, _PUBLISH),
    STAGED,
    "co",
)
relative("NodePublishVolume.15", "NodePublishVolume", "target_path", _NP, UNSTAGED, {})
case(
    ("NodePublishVolume.16",),
    "csi.target-path-conflict",
    (
        Step("NodePublishVolume", _NP, answer={}),
        Step("NodePublishVolume", publish_request("vol-2"), answer={}),
    ),
    (
        Step("NodePublishVolume", _NP, answer={}),
        Step(
            "NodePublishVolume",
            {**publish_request("vol-2"), "target_path": OTHER_TARGET},
            answer={},
        ),
    ),
    UNSTAGED,
    "co",
)
required(
    "NodePublishVolume.20",
    "NodePublishVolume",
    {"volume_id": VOL, "volume_capability": RWO},
    _NP,
    UNSTAGED,
    {},
)
required("NodePublishVolume.24", "NodePublishVolume", unpublish_request(), _NP, UNSTAGED, {})
case(
    ("NodePublishVolume.27",),
    "csi.volume-context-mismatch",
    (
        Step("CreateVolume", create(), answer=volume(volume_context=CONTEXT)),
        Step("NodePublishVolume", {**_NP, "volume_context": {"share": "pool-b/vol-1"}}, answer={}),
    ),
    (
        Step("CreateVolume", create(), answer=volume(volume_context=CONTEXT)),
        Step("NodePublishVolume", {**_NP, "volume_context": CONTEXT}, answer={}),
    ),
    UNSTAGED,
    "co",
)
resent(
    ("NodePublishVolume-Errors.5",),
    "NodePublishVolume",
    _NP,
    "ALREADY_EXISTS",
    {**_NP, "volume_capability": RWO_MULTI},
    {},
    UNSTAGED,
)

# -- NodeUnpublishVolume -------------------------------------------------------------------
# A node plugin serving NodePublishVolume MUST serve its undoing, advertised or not.
case(
    ("NodeUnpublishVolume.1",),
    "csi.unimplemented-advertised",
    (
        Step("NodePublishVolume", _NP, answer={}),
        Step("NodeUnpublishVolume", unpublish_request(), error=("UNIMPLEMENTED", "not here")),
    ),
    (
        Step("NodePublishVolume", _NP, answer={}),
        Step("NodeUnpublishVolume", unpublish_request(), answer={}),
    ),
    UNSTAGED,
    "plugin",
)
case(
    ("NodeUnpublishVolume.4",),
    "csi.call-order",
    (
        Step("NodeGetInfo", answer=NODE_INFO),
        Step("ControllerPublishVolume", publish(), answer={"publish_context": DEVICE}),
        Step("NodePublishVolume", {**_NP, "publish_context": DEVICE}, answer={}),
        Step("ControllerUnpublishVolume", unpublish(), answer={}),
    ),
    (
        Step("NodeGetInfo", answer=NODE_INFO),
        Step("ControllerPublishVolume", publish(), answer={"publish_context": DEVICE}),
        Step("NodePublishVolume", {**_NP, "publish_context": DEVICE}, answer={}),
        Step("NodeUnpublishVolume", unpublish_request(), answer={}),
        Step("ControllerUnpublishVolume", unpublish(), answer={}),
    ),
    UNIFIED_UNSTAGED,
    "co",
    why="ControllerUnpublishVolume to the node while the volume is published there",
)
repeat_refused(
    ("NodeUnpublishVolume.6",),
    "NodeUnpublishVolume",
    unpublish_request(),
    {},
    UNSTAGED,
    first=(Step("NodePublishVolume", _NP, answer={}),),
)
required(
    "NodeUnpublishVolume.7",
    "NodeUnpublishVolume",
    {"target_path": TARGET},
    unpublish_request(),
    UNSTAGED,
    {},
)
relative(
    "NodeUnpublishVolume.8", "NodeUnpublishVolume", "target_path", unpublish_request(), UNSTAGED, {}
)
required(
    "NodeUnpublishVolume.10",
    "NodeUnpublishVolume",
    {"volume_id": VOL},
    unpublish_request(),
    UNSTAGED,
    {},
)

# -- NodeGetVolumeStats' request -----------------------------------------------------------
_STATS = v1_background(node=("GET_VOLUME_STATS",))
unimplemented("NodeGetVolumeStats.1", "NodeGetVolumeStats", stats_request(), stats_answer(), _STATS)
required(
    "NodeGetVolumeStats.3",
    "NodeGetVolumeStats",
    {"volume_path": TARGET},
    stats_request(),
    _STATS,
    stats_answer(),
)
relative(
    "NodeGetVolumeStats.4",
    "NodeGetVolumeStats",
    "volume_path",
    stats_request(),
    _STATS,
    stats_answer(),
)
required(
    "NodeGetVolumeStats.5",
    "NodeGetVolumeStats",
    {"volume_id": VOL},
    stats_request(),
    _STATS,
    stats_answer(),
)
relative(
    "NodeGetVolumeStats.7",
    "NodeGetVolumeStats",
    "staging_target_path",
    {**stats_request(), "staging_target_path": STAGING},
    _STATS,
    stats_answer(),
)


# -- ALREADY_EXISTS: a retry that keeps every argument, new secrets only -------------------
def unfixed(
    statements: tuple[str, ...],
    rpc: str,
    request: dict[str, Any],
    fixed: dict[str, Any],
    answer: Any,
    bg: dict,
) -> None:
    """Refused ALREADY_EXISTS, then sent for the same object with only its secrets changed;
    twin: one of the arguments the incompatibility may lie in changed too."""
    refused = ("ALREADY_EXISTS", "exists, incompatible")
    case(
        statements,
        "csi.retry-unfixed",
        (
            Step(rpc, request, error=refused),
            Step(rpc, {**request, "secrets": {"token": "rotated"}}, error=refused),
        ),
        (
            Step(rpc, request, error=refused),
            Step(rpc, {**fixed, "secrets": {"token": "rotated"}}, answer=answer),
        ),
        bg,
        "co",
    )


unfixed(
    ("CreateSnapshot-Errors.4",),
    "CreateSnapshot",
    take(),
    {**take(), "parameters": {"class": "crash-consistent"}},
    {"snapshot": snapshot()},
    SNAPSHOTS,
)
unfixed(
    ("NodeStageVolume-Errors.5",),
    "NodeStageVolume",
    stage_request(),
    {**stage_request(), "volume_capability": RWX},
    {},
    STAGED,
)
unfixed(
    ("NodePublishVolume-Errors.5",),
    "NodePublishVolume",
    _NP,
    {**_NP, "readonly": True},
    {},
    UNSTAGED,
)

# The table's FAILED_PRECONDITION for another target path of a single-writer volume
# answered with the ALREADY_EXISTS row, which is for the same target path.
case(
    ("NodePublishVolume.7", "NodePublishVolume.8"),
    "csi.republish-answer",
    (
        Step("NodePublishVolume", _SINGLE, answer={}),
        Step(
            "NodePublishVolume",
            {**_SINGLE, "target_path": OTHER_TARGET},
            error=("ALREADY_EXISTS", "published elsewhere"),
        ),
    ),
    (
        Step("NodePublishVolume", _SINGLE, answer={}),
        Step(
            "NodePublishVolume",
            {**_SINGLE, "target_path": OTHER_TARGET},
            error=("FAILED_PRECONDITION", "single writer already published"),
        ),
    ),
    UNSTAGED,
    "plugin",
    variant="single-writer-code",
)
