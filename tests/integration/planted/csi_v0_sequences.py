"""CSI v0.3 (csi.v0): breaches a sequence of calls shows on one socket.

Idempotency (each RPC's "MUST be idempotent" and its OK-when-done-already sentence),
the CO's recovery from error codes (each RPC's errors table and §Error Scheme), calls in
flight (the "operation pending" rows), the node call order (§RPC Interactions and
Reference Counting, §NodeStageVolume, §NodeUnstageVolume, §NodePublishVolume) and values
that must stay the same (volume attributes, capabilities, secrets). Each twin is the
nearest legitimate sequence.
"""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_v0_builders import (
    INFO,
    NODE,
    OTHER_TARGET,
    RO,
    RWO,
    RWX,
    SNAP,
    SPEC,
    STAGED,
    STAGING,
    VOL,
    background,
    create,
    node_publish,
    node_unpublish,
    publish,
    snapshot,
    snapshot_request,
    stage,
    unstage,
    volume,
    without,
)
from tests.integration.planted.harness import Case, Step

BG = background()
NODE_ONLY = background(plugin=(), controller=())
# Capabilities the proxy cannot learn (its queries answered UNIMPLEMENTED): an RPC answered
# UNIMPLEMENTED is then no breach of the plugin's, and calling it none of the CO's.
UNKNOWN: dict[str, Any] = {}
GIB = 1 << 30

CASES: list[Case] = []

# -- idempotency -----------------------------------------------------------------------------
# The same request answered OK, then repeated unchanged and answered with a code no unseen
# change explains; the twin answers the repeat OK.
_REPEATS: list[tuple[tuple[str, ...], str, dict[str, Any], Any, str, dict[str, Any]]] = [
    (
        ("ControllerPublishVolume.5",),
        "ControllerPublishVolume",
        publish(),
        {},
        "INVALID_ARGUMENT",
        BG,
    ),
    (
        ("ControllerUnpublishVolume.5", "ControllerUnpublishVolume.6"),
        "ControllerUnpublishVolume",
        {"volume_id": VOL, "node_id": NODE},
        {},
        "INVALID_ARGUMENT",
        BG,
    ),
    (
        ("CreateSnapshot.2", "CreateSnapshot.3"),
        "CreateSnapshot",
        snapshot_request(),
        snapshot(),
        "ALREADY_EXISTS",
        BG,
    ),
    (
        ("NodeStageVolume.6", "NodeStageVolume.7"),
        "NodeStageVolume",
        stage(),
        {},
        "ALREADY_EXISTS",
        STAGED,
    ),
    (
        ("NodeUnstageVolume.7", "NodeUnstageVolume.8"),
        "NodeUnstageVolume",
        unstage(),
        {},
        "FAILED_PRECONDITION",
        STAGED,
    ),
    (
        ("NodePublishVolume.3", "NodePublishVolume.4"),
        "NodePublishVolume",
        node_publish(),
        {},
        "ALREADY_EXISTS",
        NODE_ONLY,
    ),
    (
        ("NodeUnpublishVolume.6",),
        "NodeUnpublishVolume",
        node_unpublish(),
        {},
        "FAILED_PRECONDITION",
        NODE_ONLY,
    ),
]
for statements, rpc, request, answer, code, bg in _REPEATS:
    CASES.append(
        Case(
            SPEC,
            statements,
            "csi.not-idempotent",
            breach=(Step(rpc, request, answer=answer), Step(rpc, request, error=(code, "refused"))),
            twin=(Step(rpc, request, answer=answer), Step(rpc, request, answer=answer)),
            background=bg,
            party="plugin",
        )
    )

CASES += [
    Case(
        SPEC,
        ("CreateVolume.2", "CreateVolume.3"),
        "csi.create-not-idempotent",
        breach=(
            Step("CreateVolume", create(), answer=volume("vol-1")),
            Step("CreateVolume", create(), answer=volume("vol-2")),
        ),
        twin=(
            Step("CreateVolume", create(), answer=volume("vol-1")),
            Step("CreateVolume", create(), answer=volume("vol-1")),
        ),
        background=BG,
        party="plugin",
        why="the repeat is answered with a new volume, not the one the name already has",
    ),
    Case(
        SPEC,
        ("DeleteVolume.3", "DeleteVolume.4"),
        "csi.delete-not-idempotent",
        breach=(
            Step("DeleteVolume", {"volume_id": VOL}),
            Step("DeleteVolume", {"volume_id": VOL}, error=("NOT_FOUND", "no such volume")),
        ),
        twin=(Step("DeleteVolume", {"volume_id": VOL}), Step("DeleteVolume", {"volume_id": VOL})),
        background=BG,
        party="plugin",
    ),
    Case(
        SPEC,
        ("DeleteSnapshot.3", "DeleteSnapshot.4"),
        "csi.delete-not-idempotent",
        breach=(
            Step("DeleteSnapshot", {"snapshot_id": SNAP}),
            Step("DeleteSnapshot", {"snapshot_id": SNAP}, error=("NOT_FOUND", "no such snapshot")),
        ),
        twin=(
            Step("DeleteSnapshot", {"snapshot_id": SNAP}),
            Step("DeleteSnapshot", {"snapshot_id": SNAP}),
        ),
        background=BG,
        party="plugin",
    ),
    Case(
        SPEC,
        ("ControllerPublishVolume.4",),
        "csi.publish-context-changed",
        breach=(
            Step(
                "ControllerPublishVolume",
                publish(),
                answer={"publish_info": {"device": "/dev/sdb"}},
            ),
            Step(
                "ControllerPublishVolume",
                publish(),
                answer={"publish_info": {"device": "/dev/sdc"}},
            ),
        ),
        twin=(
            Step(
                "ControllerPublishVolume",
                publish(),
                answer={"publish_info": {"device": "/dev/sdb"}},
            ),
            Step(
                "ControllerPublishVolume",
                publish(),
                answer={"publish_info": {"device": "/dev/sdb"}},
            ),
        ),
        background=BG,
        party="plugin",
    ),
]

# -- recovery: what the CO must change before retrying -----------------------------------------
_BAD_PARAMS = create(parameters={"type": "fast-ssd-typo"})
_FIXED_PARAMS = create(parameters={"type": "fast-ssd"})


def _retry(
    statements: tuple[str, ...],
    rpc: str,
    request: dict[str, Any],
    code: str,
    fixed: dict[str, Any] | None,
    answer: Any = None,
    bg: dict[str, Any] = BG,
    first: dict[str, Any] | None = None,
    why: str = "",
) -> Case:
    """``request`` refused with ``code`` and sent again unchanged; the twin sends ``fixed``
    instead (answered OK), or nothing more when ``fixed`` is None (MUST NOT retry).
    ``first``: the refused request of the twin, when the breach's is itself unlawful."""
    refused = Step(rpc, request, error=(code, "refused"))
    twin_refused = Step(rpc, first or request, error=(code, "refused"))
    twin: tuple[Step, ...] = (twin_refused,)
    if fixed is not None:
        twin = (twin_refused, Step(rpc, fixed, answer=answer))
    return Case(
        SPEC,
        statements,
        "csi.retry-without-change",
        breach=(refused, Step(rpc, request, answer=answer)),
        twin=twin,
        background=bg,
        party="co",
        why=why,
    )


CASES += [
    _retry(
        ("Error-Scheme.5",),
        "CreateVolume",
        without(create(), "name"),
        "INVALID_ARGUMENT",
        _FIXED_PARAMS,
        volume(),
        first=_BAD_PARAMS,
        why="a request missing its REQUIRED name, refused, sent again as it was",
    ),
    _retry(
        ("Error-Scheme.6",),
        "CreateVolume",
        _BAD_PARAMS,
        "INVALID_ARGUMENT",
        _FIXED_PARAMS,
        volume(),
    ),
    _retry(
        ("CreateVolume-Errors.4",),
        "CreateVolume",
        create(),
        "ALREADY_EXISTS",
        create("pvc-2"),
        volume(),
    ),
    _retry(
        ("CreateVolume-Errors.8",),
        "CreateVolume",
        create(capacity_range={"required_bytes": 1 << 50}),
        "OUT_OF_RANGE",
        create(capacity_range={"required_bytes": GIB}),
        volume(capacity_bytes=GIB),
    ),
    _retry(
        ("ControllerPublishVolume-Errors.6",),
        "ControllerPublishVolume",
        publish(readonly=True),
        "ALREADY_EXISTS",
        publish(),
        {},
    ),
    _retry(
        ("CreateSnapshot-Errors.4",),
        "CreateSnapshot",
        snapshot_request(),
        "ALREADY_EXISTS",
        snapshot_request("snap-pvc-2"),
        snapshot(),
    ),
    _retry(
        ("NodeStageVolume-Errors.5",),
        "NodeStageVolume",
        stage(volume_capability=RO),
        "ALREADY_EXISTS",
        stage(),
        {},
        STAGED,
    ),
    _retry(
        ("NodePublishVolume-Errors.5",),
        "NodePublishVolume",
        node_publish(volume_capability=RO),
        "ALREADY_EXISTS",
        node_publish(),
        {},
        NODE_ONLY,
    ),
    # UNIMPLEMENTED: MUST NOT retry (capabilities unknown to the proxy, see UNKNOWN).
    _retry(
        ("CreateVolume-Errors.9",),
        "CreateVolume",
        create(),
        "UNIMPLEMENTED",
        None,
        volume(),
        UNKNOWN,
    ),
    _retry(
        ("DeleteVolume-Errors.7",),
        "DeleteVolume",
        {"volume_id": VOL},
        "UNIMPLEMENTED",
        None,
        {},
        UNKNOWN,
    ),
    _retry(
        ("ControllerPublishVolume-Errors.12",),
        "ControllerPublishVolume",
        publish(),
        "UNIMPLEMENTED",
        None,
        {},
        UNKNOWN,
    ),
    _retry(
        ("ControllerUnpublishVolume-Errors.8",),
        "ControllerUnpublishVolume",
        {"volume_id": VOL, "node_id": NODE},
        "UNIMPLEMENTED",
        None,
        {},
        UNKNOWN,
    ),
    _retry(
        ("CreateSnapshot-Errors.7", "CreateSnapshot-Errors.3"),
        "CreateSnapshot",
        snapshot_request(),
        "UNIMPLEMENTED",
        None,
        snapshot(),
        UNKNOWN,
    ),
    _retry(
        ("DeleteSnapshot-Errors.7",),
        "DeleteSnapshot",
        {"snapshot_id": SNAP},
        "UNIMPLEMENTED",
        None,
        {},
        UNKNOWN,
    ),
]

# -- listings: a refused starting_token ---------------------------------------------------------
for statements, rpc in (
    (("ListVolumes-Errors.4", "ListVolumes-Errors.3"), "ListVolumes"),
    (("ListSnapshots-Errors.4", "ListSnapshots-Errors.3"), "ListSnapshots"),
):
    CASES.append(
        Case(
            SPEC,
            statements,
            "csi.list-restart-expected",
            breach=(
                Step(rpc, {"starting_token": "page-2"}, error=("ABORTED", "invalid token")),
                Step(rpc, {"starting_token": "page-2"}),
            ),
            twin=(
                Step(rpc, {"starting_token": "page-2"}, error=("ABORTED", "invalid token")),
                Step(rpc, {}),
            ),
            background=BG,
            party="co",
        )
    )

# -- operation pending: retried while another call for the object is in flight ---------------
# The proxy serializes calls per object by default, so the plugin sees one at a time; what
# the CO sends is judged as it arrives. A call held by the plugin (A) has two more for the
# same object queued behind it: B, which the plugin answers ABORTED when its turn comes, and
# C, held in turn. D, the retry of B, comes while C is still pending. The twin has no C:
# its retry comes when nothing else for the object is in flight.
_PENDING: list[tuple[tuple[str, ...], str, dict[str, Any], Any, dict[str, Any]]] = [
    (("CreateVolume-Errors.7",), "CreateVolume", create(), volume(), BG),
    (("DeleteVolume-Errors.6",), "DeleteVolume", {"volume_id": VOL}, {}, BG),
    (("ControllerPublishVolume-Errors.11",), "ControllerPublishVolume", publish(), {}, BG),
    (
        ("ControllerUnpublishVolume-Errors.7",),
        "ControllerUnpublishVolume",
        {"volume_id": VOL, "node_id": NODE},
        {},
        BG,
    ),
    (("CreateSnapshot-Errors.6",), "CreateSnapshot", snapshot_request(), snapshot(), BG),
    (("DeleteSnapshot-Errors.6",), "DeleteSnapshot", {"snapshot_id": SNAP}, {}, BG),
    (("NodeStageVolume-Errors.7",), "NodeStageVolume", stage(), {}, STAGED),
    (("NodeUnstageVolume-Errors.6",), "NodeUnstageVolume", unstage(), {}, STAGED),
    (("NodePublishVolume-Errors.7",), "NodePublishVolume", node_publish(), {}, NODE_ONLY),
    (("NodeUnpublishVolume-Errors.6",), "NodeUnpublishVolume", node_unpublish(), {}, NODE_ONLY),
]
_ABORTED = ("ABORTED", "operation pending")
for statements, rpc, request, answer, bg in _PENDING:
    CASES.append(
        Case(
            SPEC,
            statements,
            "csi.retry-while-pending",
            breach=(
                Step(rpc, request, answer=answer, hold=0.6, pending=True),
                Step(rpc, request, error=_ABORTED, pending=True),
                Step(rpc, request, answer=answer, hold=0.6, pending=True),
                Step(rpc, request, answer=answer, wait=0.7),
            ),
            twin=(
                Step(rpc, request, answer=answer, hold=0.2, pending=True),
                Step(rpc, request, error=_ABORTED, pending=True),
                Step(rpc, request, answer=answer, wait=0.7),
            ),
            background=bg,
            party="co",
        )
    )

# -- the node call order (§RPC Interactions and Reference Counting) ---------------------------
_STAGE = Step("NodeStageVolume", stage())
_PUBLISH = Step("NodePublishVolume", node_publish(staging_target_path=STAGING))
CASES += [
    Case(
        SPEC,
        (
            "NodeStageVolume.5",
            "RPC-Interactions-and-Reference-Counting.1",
            "RPC-Interactions-and-Reference-Counting.2",
        ),
        "csi.call-order",
        breach=(_STAGE, Step("NodeUnstageVolume", unstage()), _PUBLISH),
        twin=(_STAGE, Step("NodeUnstageVolume", unstage()), _STAGE, _PUBLISH),
        background=STAGED,
        party="co",
        why="the volume is published after its staging was undone: no stage answered OK before it",
    ),
    Case(
        SPEC,
        (
            "NodeUnstageVolume.5",
            "RPC-Interactions-and-Reference-Counting.3",
            "RPC-Interactions-and-Reference-Counting.4",
        ),
        "csi.call-order",
        breach=(_STAGE, _PUBLISH, Step("NodeUnstageVolume", unstage())),
        twin=(
            _STAGE,
            _PUBLISH,
            Step("NodeUnpublishVolume", node_unpublish()),
            Step("NodeUnstageVolume", unstage()),
        ),
        background=STAGED,
        party="co",
        why="unstaged while still published at its target path",
    ),
    Case(
        SPEC,
        ("NodePublishVolume.9",),
        "csi.field-missing-with-capability",
        breach=(_STAGE, Step("NodePublishVolume", node_publish())),
        twin=(_STAGE, _PUBLISH),
        background=STAGED,
        party="co",
    ),
    Case(
        SPEC,
        ("NodePublishVolume-Errors.8",),
        "csi.retry-without-change",
        breach=(
            Step("NodePublishVolume", node_publish(), error=("FAILED_PRECONDITION", "not staged")),
            Step("NodePublishVolume", node_publish()),
        ),
        twin=(_STAGE, _PUBLISH),
        background=STAGED,
        party="co",
        why="refused for want of a staging path, sent again without one",
    ),
    Case(
        SPEC,
        ("NodeStageVolume.11",),
        "csi.staging-path-conflict",
        breach=(_STAGE, Step("NodeStageVolume", stage(path=STAGING + "-2"))),
        twin=(_STAGE, _STAGE),
        background=STAGED,
        party="co",
    ),
    Case(
        SPEC,
        ("NodePublishVolume.11",),
        "csi.target-path-conflict",
        breach=(
            Step("NodePublishVolume", node_publish()),
            Step("NodePublishVolume", node_publish("vol-2")),
        ),
        twin=(
            Step("NodePublishVolume", node_publish()),
            Step("NodePublishVolume", node_publish("vol-2", OTHER_TARGET)),
        ),
        background=NODE_ONLY,
        party="co",
    ),
    Case(
        SPEC,
        ("NodePublishVolume.5",),
        "csi.republish-answer",
        breach=(
            Step("NodePublishVolume", node_publish()),
            Step("NodePublishVolume", node_publish(volume_capability=RO)),
        ),
        twin=(
            Step("NodePublishVolume", node_publish()),
            Step(
                "NodePublishVolume",
                node_publish(volume_capability=RO),
                error=("ALREADY_EXISTS", "published there with another capability"),
            ),
        ),
        background=NODE_ONLY,
        party="plugin",
    ),
]

# -- values that stay the same ---------------------------------------------------------------
_ATTRS = {"pool": "gold"}
_CREATED = Step("CreateVolume", create(), answer=volume(attributes=_ATTRS))
_FROM_SNAP = create("pvc-2", volume_content_source={"snapshot": {"id": SNAP}})


def _restored(size: int) -> dict[str, Any]:
    return volume("vol-2", capacity_bytes=size, content_source={"snapshot": {"id": SNAP}})


def _validate_with(attributes: dict[str, str]) -> dict[str, Any]:
    return {"volume_id": VOL, "volume_capabilities": [RO], "volume_attributes": attributes}


def _unpublish_with(token: str) -> dict[str, Any]:
    return {"volume_id": VOL, "node_id": NODE, "controller_unpublish_secrets": {"token": token}}


_PUBLISHED = Step("ControllerPublishVolume", publish(controller_publish_secrets={"token": "a1"}))
_IN_USE = ("FAILED_PRECONDITION", "in use")
_TOPOLOGY_CAPS = background(plugin=("CONTROLLER_SERVICE", "ACCESSIBILITY_CONSTRAINTS"))[
    "GetPluginCapabilities"
]
CASES += [
    Case(
        SPEC,
        ("CreateVolume.33", "CreateVolume.35"),
        "csi.volume-context-changed",
        breach=(
            _CREATED,
            Step("CreateVolume", create(), answer=volume(attributes={"pool": "silver"})),
        ),
        twin=(_CREATED, _CREATED),
        background=BG,
        party="plugin",
    ),
    Case(
        SPEC,
        ("ControllerPublishVolume.11",),
        "csi.volume-context-mismatch",
        breach=(
            _CREATED,
            Step("ControllerPublishVolume", publish(volume_attributes={"pool": "silver"})),
        ),
        twin=(_CREATED, Step("ControllerPublishVolume", publish(volume_attributes=_ATTRS))),
        background=BG,
        party="co",
    ),
    Case(
        SPEC,
        ("ValidateVolumeCapabilities.7",),
        "csi.volume-context-mismatch",
        breach=(
            _CREATED,
            Step(
                "ValidateVolumeCapabilities",
                _validate_with({"pool": "silver"}),
                answer={"supported": True},
            ),
        ),
        twin=(
            _CREATED,
            Step("ValidateVolumeCapabilities", _validate_with(_ATTRS), answer={"supported": True}),
        ),
        background=BG,
        party="co",
    ),
    Case(
        SPEC,
        ("ControllerUnpublishVolume.11",),
        "csi.secrets-changed",
        breach=(_PUBLISHED, Step("ControllerUnpublishVolume", _unpublish_with("b2"))),
        twin=(_PUBLISHED, Step("ControllerUnpublishVolume", _unpublish_with("a1"))),
        background=BG,
        party="co",
    ),
    Case(
        SPEC,
        ("DeleteVolume-Errors.4",),
        "csi.delete-while-published",
        breach=(
            Step("ControllerPublishVolume", publish()),
            Step("DeleteVolume", {"volume_id": VOL}, error=_IN_USE),
            Step("DeleteVolume", {"volume_id": VOL}, error=_IN_USE, wait=0.1),
        ),
        twin=(
            Step("ControllerPublishVolume", publish()),
            Step("ControllerUnpublishVolume", {"volume_id": VOL, "node_id": NODE}),
            Step("DeleteVolume", {"volume_id": VOL}),
        ),
        background=BG,
        party="co",
        why="the delete is retried while the volume stays published to the node",
    ),
    Case(
        SPEC,
        ("CreateSnapshot.10",),
        "csi.volume-smaller-than-snapshot",
        breach=(
            Step("CreateSnapshot", snapshot_request(), answer=snapshot(size_bytes=2 * GIB)),
            Step("CreateVolume", _FROM_SNAP, answer=_restored(GIB)),
        ),
        twin=(
            Step("CreateSnapshot", snapshot_request(), answer=snapshot(size_bytes=2 * GIB)),
            Step("CreateVolume", _FROM_SNAP, answer=_restored(2 * GIB)),
        ),
        background=BG,
        party="plugin",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.2",),
        "csi.capabilities-changed",
        breach=(
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=BG["GetPluginCapabilities"]),
            Step("GetPluginCapabilities", answer=_TOPOLOGY_CAPS),
            Step("GetPluginInfo", answer=INFO),
        ),
        twin=(
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=BG["GetPluginCapabilities"]),
            Step("GetPluginCapabilities", answer=BG["GetPluginCapabilities"]),
            Step("GetPluginInfo", answer=INFO),
        ),
        background=BG,
        party="plugin",
        why="one plugin version (GetPluginInfo before and after) answers two sets of capabilities",
    ),
    Case(
        SPEC,
        ("NodeGetId.1",),
        "csi.node-get-id-deprecated",
        breach=(
            Step("NodeGetInfo", answer={"node_id": NODE}),
            Step("NodeGetId", answer={"node_id": NODE}),
        ),
        twin=(
            Step("NodeGetId", answer={"node_id": NODE}),
            Step("NodeGetInfo", answer={"node_id": NODE}),
        ),
        background=NODE_ONLY,
        party="co",
        why="NodeGetId is called although NodeGetInfo has just answered",
    ),
]

# v0.3 has no volume expansion: a name created a moment ago with the same arguments is still
# compatible with them, so ALREADY_EXISTS to the identical repeat breaks idempotency.
CASES.append(
    Case(
        SPEC,
        ("CreateVolume.2", "CreateVolume.3"),
        "csi.not-idempotent",
        breach=(
            Step("CreateVolume", create(), answer=volume()),
            Step("CreateVolume", create(), error=("ALREADY_EXISTS", "exists")),
        ),
        twin=(
            Step("CreateVolume", create(), answer=volume()),
            Step("CreateVolume", create(), answer=volume()),
        ),
        background=BG,
        party="plugin",
    )
)

# ... nor can its size or topology change: the repeat answers the same volume as it was.
_ZONE = {"segments": {"example.com/zone": "zone-a"}}
CASES.append(
    Case(
        SPEC,
        ("CreateVolume.2", "CreateVolume.3"),
        "csi.create-not-idempotent",
        breach=(
            Step("CreateVolume", create(), answer=volume(capacity_bytes=2 * GIB)),
            Step("CreateVolume", create(), answer=volume(capacity_bytes=GIB)),
        ),
        twin=(
            Step("CreateVolume", create(), answer=volume(capacity_bytes=2 * GIB)),
            Step("CreateVolume", create(), answer=volume(capacity_bytes=2 * GIB)),
        ),
        background=BG,
        party="plugin",
        why="the repeat answers the same volume with another size",
        variant="capacity",
    )
)
_TOPOLOGY_BG = background(plugin=("CONTROLLER_SERVICE", "ACCESSIBILITY_CONSTRAINTS"))
_OTHER_ZONE = {"segments": {"example.com/zone": "zone-b"}}
CASES.append(
    Case(
        SPEC,
        ("CreateVolume.2",),
        "csi.create-not-idempotent",
        breach=(
            Step("CreateVolume", create(), answer=volume(accessible_topology=[_ZONE])),
            Step("CreateVolume", create(), answer=volume(accessible_topology=[_OTHER_ZONE])),
        ),
        twin=(
            Step("CreateVolume", create(), answer=volume(accessible_topology=[_ZONE])),
            Step("CreateVolume", create(), answer=volume(accessible_topology=[_ZONE])),
        ),
        background=_TOPOLOGY_BG,
        party="plugin",
        why="the repeat answers the same volume as accessible elsewhere",
        variant="topology",
    )
)

# -- recovery: a retry for the same object that changes only what the row does not name ----------
# After ALREADY_EXISTS (the object exists, incompatible with these arguments) the retry keeps
# every argument and changes only its secrets; after OUT_OF_RANGE it keeps the capacity range;
# after UNIMPLEMENTED it calls again at all. The twin changes what the row names.
_AE = ("ALREADY_EXISTS", "exists, incompatible")
_UNFIXED: list[
    tuple[tuple[str, ...], str, dict[str, Any], dict[str, Any], Any, str, dict[str, Any]]
] = [
    (
        ("CreateVolume-Errors.4",),
        "CreateVolume",
        {"controller_create_secrets": {"token": "t2"}},
        {"volume_capabilities": [RWX]},
        volume(),
        "ALREADY_EXISTS",
        BG,
    ),
    (
        ("CreateVolume-Errors.8",),
        "CreateVolume",
        {"parameters": {"type": "fast"}},
        {"capacity_range": {"required_bytes": GIB}},
        volume(capacity_bytes=GIB),
        "OUT_OF_RANGE",
        BG,
    ),
    (
        ("CreateSnapshot-Errors.4", "CreateSnapshot-Errors.3"),
        "CreateSnapshot",
        {"create_snapshot_secrets": {"token": "t2"}},
        {"name": "snap-pvc-2"},
        snapshot(),
        "ALREADY_EXISTS",
        BG,
    ),
    (
        ("ControllerPublishVolume-Errors.6",),
        "ControllerPublishVolume",
        {"controller_publish_secrets": {"token": "t2"}},
        {"readonly": False},
        {},
        "ALREADY_EXISTS",
        BG,
    ),
    (
        ("NodeStageVolume-Errors.5",),
        "NodeStageVolume",
        {"node_stage_secrets": {"token": "t2"}},
        {"volume_capability": RWO},
        {},
        "ALREADY_EXISTS",
        STAGED,
    ),
    (
        ("NodePublishVolume-Errors.5",),
        "NodePublishVolume",
        {"node_publish_secrets": {"token": "t2"}},
        {"volume_capability": RWO},
        {},
        "ALREADY_EXISTS",
        NODE_ONLY,
    ),
]
_FIRST = {
    "CreateVolume": create(capacity_range={"required_bytes": 1 << 50}),
    "CreateSnapshot": snapshot_request(),
    "ControllerPublishVolume": publish(readonly=True),
    "NodeStageVolume": stage(volume_capability=RO),
    "NodePublishVolume": node_publish(volume_capability=RO),
}
for statements, rpc, unfixed, fixed, answer, code, bg in _UNFIXED:
    first = _FIRST[rpc]
    if rpc == "CreateVolume" and code == "ALREADY_EXISTS":
        first = create()
    CASES.append(
        Case(
            SPEC,
            statements,
            "csi.retry-unfixed",
            breach=(
                Step(rpc, first, error=(code, "refused")),
                Step(rpc, {**first, **unfixed}, answer=answer),
            ),
            twin=(
                Step(rpc, first, error=(code, "refused")),
                Step(rpc, {**first, **fixed}, answer=answer),
            ),
            background=bg,
            party="co",
            variant="unfixed",
        )
    )
_CHANGED = (
    (("CreateVolume-Errors.9",), "CreateVolume", create(), create(parameters={"a": "b"}), volume()),
    (
        ("CreateSnapshot-Errors.7",),
        "CreateSnapshot",
        snapshot_request(),
        snapshot_request(parameters={"a": "b"}),
        snapshot(),
    ),
    (
        ("ControllerPublishVolume-Errors.12",),
        "ControllerPublishVolume",
        publish(),
        publish(readonly=True),
        {},
    ),
)
for statements, rpc, request, changed, answer in _CHANGED:
    CASES.append(
        Case(
            SPEC,
            statements,
            "csi.retry-unfixed",
            breach=(
                Step(rpc, request, error=("UNIMPLEMENTED", "not implemented")),
                Step(rpc, changed, answer=answer),
            ),
            twin=(Step(rpc, request, error=("UNIMPLEMENTED", "not implemented")),),
            background=UNKNOWN,
            party="co",
            variant="unfixed",
            why="called again for the same object, changed, after UNIMPLEMENTED",
        )
    )

# §CreateVolume, DeleteVolume, ListVolumes and its snapshot counterpart: the deletes take the
# plugin's id; the CO passes the name it created the object with instead.
CASES += [
    Case(
        SPEC,
        ("CreateVolume-DeleteVolume-ListVolumes.1",),
        "csi.delete-by-name",
        breach=(
            Step("CreateVolume", create("pvc-1"), answer=volume(VOL)),
            Step("DeleteVolume", {"volume_id": "pvc-1"}),
        ),
        twin=(
            Step("CreateVolume", create("pvc-1"), answer=volume(VOL)),
            Step("DeleteVolume", {"volume_id": VOL}),
        ),
        background=BG,
        party="co",
        variant="name",
    ),
    Case(
        SPEC,
        ("CreateSnapshot-DeleteSnapshot-ListSnapshots.1",),
        "csi.delete-by-name",
        breach=(
            Step("CreateSnapshot", snapshot_request("snap-pvc-1"), answer=snapshot(SNAP)),
            Step("DeleteSnapshot", {"snapshot_id": "snap-pvc-1"}),
        ),
        twin=(
            Step("CreateSnapshot", snapshot_request("snap-pvc-1"), answer=snapshot(SNAP)),
            Step("DeleteSnapshot", {"snapshot_id": SNAP}),
        ),
        background=BG,
        party="co",
        variant="name",
    ),
]
