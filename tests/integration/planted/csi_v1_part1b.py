"""CSI v1.12 from the CreateVolume error rows to §CreateSnapshot's Snapshot message: planted
breaches of the controller RPCs (DeleteVolume, ControllerPublish/Unpublish, Validate,
ListVolumes, ControllerGetVolume, ControllerModifyVolume, GetCapacity, the capability
query, CreateSnapshot and its messages)."""

from __future__ import annotations

from tests.integration.planted.csi_builders import NODE, RWO, RWX, v1_background
from tests.integration.planted.csi_v1_part1b_builders import (
    CONFIRMED,
    GIB,
    GROUP,
    HEALTHY,
    PUBLISH_CAPS,
    SNAP,
    SNAPSHOT_CAPS,
    VOL,
    WHEN,
    controller,
    create,
    group,
    group_background,
    publish,
    snapshot,
    stage,
    take,
    unified,
    unpublish,
    validate,
    volume,
)
from tests.integration.planted.harness import Case, Step

SPEC = "csi.v1"
NODE_INFO = {"node_id": NODE}
DEVICE = {"devicePath": "/dev/xvdb"}
CONTEXT = {"share": "pool-a/vol-1"}
FROM_VOLUME = {"volume": {"volume_id": "vol-src"}}
FROM_SNAPSHOT = {"snapshot": {"snapshot_id": SNAP}}


def _unimplemented(statement: str, rpc: str, request: dict, answer: dict, bg: dict) -> Case:
    """``rpc`` answered UNIMPLEMENTED while the plugin must implement it; twin: served."""
    return Case(
        SPEC,
        (statement,),
        "csi.unimplemented-advertised",
        breach=(Step(rpc, request, error=("UNIMPLEMENTED", f"{rpc} is not implemented")),),
        twin=(Step(rpc, request, answer=answer),),
        background=bg,
        party="plugin",
    )


def _required(statement: str, rpc: str, breach: dict, twin: dict, bg: dict, **kw: object) -> Case:
    """A REQUIRED field left out of a request (party co) or of an answer (party plugin)."""
    side = kw.get("side", "request")
    answer = kw.get("answer", {})
    if side == "request":
        return Case(
            SPEC,
            (statement,),
            "csi.required-field",
            breach=(Step(rpc, breach, answer=answer),),
            twin=(Step(rpc, twin, answer=answer),),
            background=bg,
            party="co",
        )
    request = kw["request"]
    return Case(
        SPEC,
        (statement,),
        "csi.required-field",
        breach=(Step(rpc, request, answer=breach),),
        twin=(Step(rpc, request, answer=twin),),
        background=bg,
        party="plugin",
    )


def _created(request: dict) -> dict:
    """The CreateVolumeResponse to ``request``, echoing its content source."""
    source = request.get("volume_content_source")
    return volume(content_source=source) if source else volume()


def _refused_then_resent(
    statements: tuple[str, ...], rpc: str, request: dict, code: str, fixed: dict, bg: dict
) -> Case:
    """The plugin refuses ``request`` with ``code`` and the CO sends it again unchanged;
    twin: the CO fixes the request first."""
    return Case(
        SPEC,
        statements,
        "csi.retry-without-change",
        breach=(
            Step(rpc, request, error=(code, "refused")),
            Step(rpc, request, error=(code, "refused")),
        ),
        twin=(
            Step(rpc, request, error=(code, "refused")),
            Step(rpc, fixed, answer=_created(fixed) if rpc == "CreateVolume" else {}),
        ),
        background=bg,
        party="co",
    )


def _repeat_refused(statements: tuple[str, ...], rpc: str, request: dict, bg: dict) -> Case:
    """An identical repeat of a successful state change answered INVALID_ARGUMENT."""
    return Case(
        SPEC,
        statements,
        "csi.not-idempotent",
        breach=(
            Step(rpc, request, answer={}),
            Step(rpc, request, error=("INVALID_ARGUMENT", "bad request")),
        ),
        twin=(Step(rpc, request, answer={}), Step(rpc, request, answer={})),
        background=bg,
        party="plugin",
    )


CREATE_VOLUME_ERRORS = [
    # A clone asked of a plugin that does not advertise CLONE_VOLUME.
    Case(
        SPEC,
        ("CreateVolume-Errors.5",),
        "csi.capability-not-advertised",
        breach=(
            Step(
                "CreateVolume",
                create(volume_content_source=FROM_VOLUME),
                answer=volume("vol-2", content_source=FROM_VOLUME),
            ),
        ),
        twin=(Step("CreateVolume", create(), answer=volume("vol-2")),),
        background=controller("CREATE_DELETE_VOLUME"),
        party="co",
    ),
    # A source the plugin refused as invalid, sent again as it was.
    _refused_then_resent(
        ("CreateVolume-Errors.7",),
        "CreateVolume",
        create(volume_content_source=FROM_SNAPSHOT, parameters={"fs": "xfs"}),
        "INVALID_ARGUMENT",
        create(volume_content_source=FROM_SNAPSHOT, parameters={"fs": "ext4"}),
        controller(*SNAPSHOT_CAPS),
    ),
    _refused_then_resent(
        ("CreateVolume-Errors.9",),
        "CreateVolume",
        create(parameters={"type": "ssd"}),
        "ALREADY_EXISTS",
        create("pvc-2", parameters={"type": "ssd"}),
        controller("CREATE_DELETE_VOLUME"),
    ),
    _refused_then_resent(
        ("CreateVolume-Errors.11",),
        "CreateVolume",
        create(capacity_range={"required_bytes": 1 << 50}),
        "OUT_OF_RANGE",
        create(capacity_range={"required_bytes": GIB}),
        controller("CREATE_DELETE_VOLUME"),
    ),
]


def _refused_then_kept(
    statements: tuple[str, ...], request: dict, code: str, kept: dict, fixed: dict
) -> Case:
    """CreateVolume refused with ``code``, then called again for the same name keeping the
    fields the row says to fix (another field changed); twin: one of them fixed."""
    bg = controller("CREATE_DELETE_VOLUME")
    return Case(
        SPEC,
        statements,
        "csi.retry-unfixed",
        breach=(
            Step("CreateVolume", request, error=(code, "refused")),
            Step("CreateVolume", kept, error=(code, "refused")),
        ),
        twin=(
            Step("CreateVolume", request, error=(code, "refused")),
            Step("CreateVolume", fixed, answer=volume()),
        ),
        background=bg,
        party="co",
    )


CREATE_VOLUME_ERRORS += [
    # New secrets fix none of the arguments the name's volume is incompatible with.
    _refused_then_kept(
        ("CreateVolume-Errors.9",),
        create(parameters={"type": "ssd"}),
        "ALREADY_EXISTS",
        create(parameters={"type": "ssd"}, secrets={"token": "rotated"}),
        create(parameters={"type": "hdd"}, secrets={"token": "rotated"}),
    ),
    # Other parameters leave the refused capacity range as it was.
    _refused_then_kept(
        ("CreateVolume-Errors.11",),
        create(capacity_range={"required_bytes": 1 << 50}),
        "OUT_OF_RANGE",
        create(capacity_range={"required_bytes": 1 << 50}, parameters={"type": "hdd"}),
        create(capacity_range={"required_bytes": GIB}, parameters={"type": "hdd"}),
    ),
]

DELETE_VOLUME = [
    _unimplemented(
        "DeleteVolume.1", "DeleteVolume", {"volume_id": VOL}, {}, controller("CREATE_DELETE_VOLUME")
    ),
    Case(
        SPEC,
        ("DeleteVolume.2", "DeleteVolume.3"),
        "csi.delete-not-idempotent",
        breach=(Step("DeleteVolume", {"volume_id": VOL}, error=("NOT_FOUND", "no such volume")),),
        twin=(Step("DeleteVolume", {"volume_id": VOL}, answer={}),),
        background=controller("CREATE_DELETE_VOLUME"),
        party="plugin",
    ),
    # The second delete finds no volume: it MUST answer OK, and an idempotent one would.
    _repeat_refused(
        ("DeleteVolume.2", "DeleteVolume.3"),
        "DeleteVolume",
        {"volume_id": VOL},
        controller("CREATE_DELETE_VOLUME"),
    ),
    _required(
        "DeleteVolume.7",
        "DeleteVolume",
        {"secrets": {"key": "value"}},
        {"volume_id": VOL, "secrets": {"key": "value"}},
        controller("CREATE_DELETE_VOLUME"),
    ),
]

PUBLISHED = {"publish_context": DEVICE}

CONTROLLER_PUBLISH = [
    _unimplemented(
        "ControllerPublishVolume.1",
        "ControllerPublishVolume",
        publish(),
        PUBLISHED,
        controller(*PUBLISH_CAPS),
    ),
    Case(
        SPEC,
        ("ControllerPublishVolume.4",),
        "csi.not-idempotent",
        breach=(
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
            Step("ControllerPublishVolume", publish(), error=("INVALID_ARGUMENT", "bad")),
        ),
        twin=(
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
        ),
        background=controller(*PUBLISH_CAPS),
        party="plugin",
    ),
    # Published to the node a moment ago with this capability and readonly; new secrets do
    # not make it incompatible. Twin: another access mode may well be.
    Case(
        SPEC,
        ("ControllerPublishVolume.5",),
        "csi.not-idempotent",
        breach=(
            Step("ControllerPublishVolume", publish(secrets={"token": "a"}), answer=PUBLISHED),
            Step(
                "ControllerPublishVolume",
                publish(secrets={"token": "b"}),
                error=("ALREADY_EXISTS", "published, incompatible"),
            ),
        ),
        twin=(
            Step("ControllerPublishVolume", publish(secrets={"token": "a"}), answer=PUBLISHED),
            Step(
                "ControllerPublishVolume",
                {**publish(secrets={"token": "b"}), "volume_capability": RWX},
                error=("ALREADY_EXISTS", "published, incompatible"),
            ),
        ),
        background=controller(*PUBLISH_CAPS),
        party="plugin",
    ),
    # The same publication answered with another device: neither idempotent nor immutable.
    Case(
        SPEC,
        ("ControllerPublishVolume.4", "ControllerPublishVolume.17"),
        "csi.publish-context-changed",
        breach=(
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
            Step(
                "ControllerPublishVolume",
                publish(),
                answer={"publish_context": {"devicePath": "/dev/xvdc"}},
            ),
        ),
        twin=(
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
        ),
        background=controller(*PUBLISH_CAPS),
        party="plugin",
    ),
    _required(
        "ControllerPublishVolume.6",
        "ControllerPublishVolume",
        publish(""),
        publish(),
        controller(*PUBLISH_CAPS),
        answer=PUBLISHED,
    ),
    _required(
        "ControllerPublishVolume.7",
        "ControllerPublishVolume",
        publish(node_id=""),
        publish(),
        controller(*PUBLISH_CAPS),
        answer=PUBLISHED,
    ),
    _required(
        "ControllerPublishVolume.11",
        "ControllerPublishVolume",
        {"volume_id": VOL, "node_id": NODE},
        publish(),
        controller(*PUBLISH_CAPS),
        answer=PUBLISHED,
    ),
    Case(
        SPEC,
        ("ControllerPublishVolume.13",),
        "csi.field-without-capability",
        breach=(Step("ControllerPublishVolume", publish(readonly=True), answer=PUBLISHED),),
        twin=(Step("ControllerPublishVolume", publish(readonly=False), answer=PUBLISHED),),
        background=controller(*PUBLISH_CAPS),
        party="co",
    ),
    # The CO passes a volume_context other than the one CreateVolume returned.
    Case(
        SPEC,
        ("ControllerPublishVolume.15",),
        "csi.volume-context-mismatch",
        breach=(
            Step("CreateVolume", create(), answer=volume(volume_context=CONTEXT)),
            Step(
                "ControllerPublishVolume",
                publish(volume_context={"share": "pool-b/vol-1"}),
                answer=PUBLISHED,
            ),
        ),
        twin=(
            Step("CreateVolume", create(), answer=volume(volume_context=CONTEXT)),
            Step("ControllerPublishVolume", publish(volume_context=CONTEXT), answer=PUBLISHED),
        ),
        background=controller("CREATE_DELETE_VOLUME", *PUBLISH_CAPS),
        party="co",
    ),
    # The node call gets another publish_context than the controller returned.
    Case(
        SPEC,
        ("ControllerPublishVolume.22",),
        "csi.publish-context-mismatch",
        breach=(
            Step("NodeGetInfo", answer=NODE_INFO),
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
            Step(
                "NodeStageVolume",
                stage(publish_context={"devicePath": "/dev/xvdz"}),
                answer={},
            ),
        ),
        twin=(
            Step("NodeGetInfo", answer=NODE_INFO),
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
            Step("NodeStageVolume", stage(publish_context=DEVICE), answer={}),
        ),
        background=unified(*PUBLISH_CAPS),
        party="co",
    ),
    # ... or none at all, though the controller returned one.
    Case(
        SPEC,
        ("ControllerPublishVolume.22",),
        "csi.publish-context-mismatch",
        breach=(
            Step("NodeGetInfo", answer=NODE_INFO),
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
            Step("NodeStageVolume", stage(), answer={}),
        ),
        twin=(
            Step("NodeGetInfo", answer=NODE_INFO),
            Step("ControllerPublishVolume", publish(), answer={}),
            Step("NodeStageVolume", stage(), answer={}),
        ),
        background=unified(*PUBLISH_CAPS),
        party="co",
        variant="not passed",
    ),
    Case(
        SPEC,
        ("ControllerPublishVolume-Errors.6",),
        "csi.retry-without-change",
        breach=(
            Step("ControllerPublishVolume", publish(), error=("ALREADY_EXISTS", "other mode")),
            Step("ControllerPublishVolume", publish(), error=("ALREADY_EXISTS", "other mode")),
        ),
        twin=(
            Step("ControllerPublishVolume", publish(), error=("ALREADY_EXISTS", "other mode")),
            Step(
                "ControllerPublishVolume",
                {**publish(), "volume_capability": RWX},
                answer=PUBLISHED,
            ),
        ),
        background=controller(*PUBLISH_CAPS),
        party="co",
    ),
]

CONTROLLER_UNPUBLISH = [
    _unimplemented(
        "ControllerUnpublishVolume.1",
        "ControllerUnpublishVolume",
        unpublish(),
        {},
        controller(*PUBLISH_CAPS),
    ),
    # Unpublished from the node while still staged there.
    Case(
        SPEC,
        ("ControllerUnpublishVolume.2",),
        "csi.call-order",
        breach=(
            Step("NodeGetInfo", answer=NODE_INFO),
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
            Step("NodeStageVolume", stage(publish_context=DEVICE), answer={}),
            Step("ControllerUnpublishVolume", unpublish(), answer={}),
        ),
        twin=(
            Step("NodeGetInfo", answer=NODE_INFO),
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
            Step("NodeStageVolume", stage(publish_context=DEVICE), answer={}),
            Step(
                "NodeUnstageVolume",
                {"volume_id": VOL, "staging_target_path": stage()["staging_target_path"]},
                answer={},
            ),
            Step("ControllerUnpublishVolume", unpublish(), answer={}),
        ),
        background=unified(*PUBLISH_CAPS),
        party="co",
    ),
    # The second unpublish finds the volume detached: it MUST answer OK.
    _repeat_refused(
        ("ControllerUnpublishVolume.5", "ControllerUnpublishVolume.6"),
        "ControllerUnpublishVolume",
        unpublish(),
        controller(*PUBLISH_CAPS),
    ),
    _required(
        "ControllerUnpublishVolume.8",
        "ControllerUnpublishVolume",
        {"node_id": NODE},
        unpublish(),
        controller(*PUBLISH_CAPS),
    ),
    Case(
        SPEC,
        ("ControllerUnpublishVolume.12",),
        "csi.secrets-changed",
        breach=(
            Step("ControllerPublishVolume", publish(secrets={"token": "a"}), answer=PUBLISHED),
            Step("ControllerUnpublishVolume", unpublish(secrets={"token": "b"}), answer={}),
        ),
        twin=(
            Step("ControllerPublishVolume", publish(secrets={"token": "a"}), answer=PUBLISHED),
            Step("ControllerUnpublishVolume", unpublish(secrets={"token": "a"}), answer={}),
        ),
        background=controller(*PUBLISH_CAPS),
        party="co",
    ),
]

VALIDATE = [
    _unimplemented(
        "ValidateVolumeCapabilities.1",
        "ValidateVolumeCapabilities",
        validate(),
        CONFIRMED,
        controller("CREATE_DELETE_VOLUME"),
    ),
    _required(
        "ValidateVolumeCapabilities.5",
        "ValidateVolumeCapabilities",
        {"volume_capabilities": [RWO]},
        validate(),
        controller("CREATE_DELETE_VOLUME"),
        answer=CONFIRMED,
    ),
    Case(
        SPEC,
        ("ValidateVolumeCapabilities.6",),
        "csi.volume-context-mismatch",
        breach=(
            Step("CreateVolume", create(), answer=volume(volume_context=CONTEXT)),
            Step(
                "ValidateVolumeCapabilities",
                validate(volume_context={"share": "pool-b/vol-1"}),
                answer=CONFIRMED,
            ),
        ),
        twin=(
            Step("CreateVolume", create(), answer=volume(volume_context=CONTEXT)),
            Step(
                "ValidateVolumeCapabilities",
                validate(volume_context=CONTEXT),
                answer={"confirmed": {"volume_capabilities": [RWO], "volume_context": CONTEXT}},
            ),
        ),
        background=controller("CREATE_DELETE_VOLUME"),
        party="co",
    ),
    _required(
        "ValidateVolumeCapabilities.8",
        "ValidateVolumeCapabilities",
        {"volume_id": VOL},
        validate(),
        controller("CREATE_DELETE_VOLUME"),
        answer=CONFIRMED,
    ),
    _required(
        "ValidateVolumeCapabilities.9",
        "ValidateVolumeCapabilities",
        {"confirmed": {"parameters": {"type": "ssd"}}},
        {"confirmed": {"volume_capabilities": [RWO], "parameters": {"type": "ssd"}}},
        controller("CREATE_DELETE_VOLUME"),
        side="response",
        request=validate(parameters={"type": "ssd"}),
    ),
]

LISTED = {"volume": {"volume_id": VOL, "capacity_bytes": GIB}}
LISTED_2 = {"volume": {"volume_id": "vol-2", "capacity_bytes": GIB}}
CONDITION_STATUS = {"status": {"volume_condition": HEALTHY}}
NODES_STATUS = {"status": {"published_node_ids": [NODE]}}

LIST_VOLUMES = [
    _unimplemented(
        "ListVolumes.1", "ListVolumes", {}, {"entries": [LISTED]}, controller("LIST_VOLUMES")
    ),
    Case(
        SPEC,
        ("ListVolumes.4",),
        "csi.list-max-entries",
        breach=(Step("ListVolumes", {"max_entries": 1}, answer={"entries": [LISTED, LISTED_2]}),),
        twin=(
            Step(
                "ListVolumes",
                {"max_entries": 1},
                answer={"entries": [LISTED], "next_token": "2"},
            ),
        ),
        background=controller("LIST_VOLUMES"),
        party="plugin",
    ),
    Case(
        SPEC,
        ("ListVolumes.6",),
        "csi.negative-value",
        breach=(Step("ListVolumes", {"max_entries": -1}, answer={"entries": [LISTED]}),),
        twin=(Step("ListVolumes", {"max_entries": 1}, answer={"entries": [LISTED]}),),
        background=controller("LIST_VOLUMES"),
        party="co",
    ),
    Case(
        SPEC,
        ("ListVolumes.9",),
        "csi.response-field-missing",
        breach=(Step("ListVolumes", {}, answer={"entries": [{**LISTED, "status": {}}]}),),
        twin=(Step("ListVolumes", {}, answer={"entries": [{**LISTED, **CONDITION_STATUS}]}),),
        background=controller("LIST_VOLUMES", "VOLUME_CONDITION"),
        party="plugin",
    ),
    _required(
        "ListVolumes.10",
        "ListVolumes",
        {"entries": [LISTED, NODES_STATUS]},
        {"entries": [LISTED, {**LISTED_2, **NODES_STATUS}]},
        controller("LIST_VOLUMES"),
        side="response",
        request={},
    ),
    Case(
        SPEC,
        ("ListVolumes.11",),
        "csi.response-field-missing",
        breach=(Step("ListVolumes", {}, answer={"entries": [LISTED]}),),
        twin=(Step("ListVolumes", {}, answer={"entries": [{**LISTED, **NODES_STATUS}]}),),
        background=controller("LIST_VOLUMES", "LIST_VOLUMES_PUBLISHED_NODES", *PUBLISH_CAPS),
        party="plugin",
    ),
    # A page token the plugin refused as invalid, passed again instead of restarting.
    Case(
        SPEC,
        ("ListVolumes-Errors.4",),
        "csi.list-restart-expected",
        breach=(
            Step("ListVolumes", {"starting_token": "t-7"}, error=("ABORTED", "stale token")),
            Step("ListVolumes", {"starting_token": "t-7"}, wait=0.05, answer={"entries": []}),
        ),
        twin=(
            Step("ListVolumes", {"starting_token": "t-7"}, error=("ABORTED", "stale token")),
            Step("ListVolumes", {}, wait=0.05, answer={"entries": [LISTED]}),
        ),
        background=controller("LIST_VOLUMES"),
        party="co",
    ),
]

GOT = {"volume": {"volume_id": VOL, "capacity_bytes": GIB}, "status": {}}
GOT_WELL = {**GOT, "status": {"volume_condition": HEALTHY}}

CONTROLLER_GET_VOLUME = [
    _unimplemented(
        "ControllerGetVolume.1",
        "ControllerGetVolume",
        {"volume_id": VOL},
        GOT,
        controller("GET_VOLUME"),
    ),
    Case(
        SPEC,
        ("ControllerGetVolume.2", "ControllerGetVolume.6"),
        "csi.response-field-missing",
        breach=(Step("ControllerGetVolume", {"volume_id": VOL}, answer=GOT),),
        twin=(Step("ControllerGetVolume", {"volume_id": VOL}, answer=GOT_WELL),),
        background=controller("GET_VOLUME", "VOLUME_CONDITION"),
        party="plugin",
    ),
    # Published here a moment ago, yet the status names no node.
    Case(
        SPEC,
        ("ControllerGetVolume.4",),
        "csi.response-field-missing",
        breach=(
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
            Step("ControllerGetVolume", {"volume_id": VOL}, answer=GOT),
        ),
        twin=(
            Step("ControllerPublishVolume", publish(), answer=PUBLISHED),
            Step(
                "ControllerGetVolume",
                {"volume_id": VOL},
                answer={**GOT, "status": {"published_node_ids": [NODE]}},
            ),
        ),
        background=controller(*PUBLISH_CAPS, "GET_VOLUME", "LIST_VOLUMES_PUBLISHED_NODES"),
        party="plugin",
    ),
    _required(
        "ControllerGetVolume.3",
        "ControllerGetVolume",
        {},
        {"volume_id": VOL},
        controller("GET_VOLUME"),
        answer=GOT,
    ),
    _required(
        "ControllerGetVolume.7",
        "ControllerGetVolume",
        {"status": {"published_node_ids": [NODE]}},
        {**GOT, "status": {"published_node_ids": [NODE]}},
        controller("GET_VOLUME"),
        side="response",
        request={"volume_id": VOL},
    ),
    _required(
        "ControllerGetVolume.8",
        "ControllerGetVolume",
        {"volume": GOT["volume"]},
        GOT,
        controller("GET_VOLUME"),
        side="response",
        request={"volume_id": VOL},
    ),
]

MODIFY = {"volume_id": VOL, "mutable_parameters": {"iops": "3000"}}

CONTROLLER_MODIFY_VOLUME = [
    _unimplemented(
        "ControllerModifyVolume.1",
        "ControllerModifyVolume",
        MODIFY,
        {},
        controller("MODIFY_VOLUME"),
    ),
    _repeat_refused(
        ("ControllerModifyVolume.2",),
        "ControllerModifyVolume",
        MODIFY,
        controller("MODIFY_VOLUME"),
    ),
    _required(
        "ControllerModifyVolume.3",
        "ControllerModifyVolume",
        {"mutable_parameters": {"iops": "3000"}},
        MODIFY,
        controller("MODIFY_VOLUME"),
    ),
    _required(
        "ControllerModifyVolume.4",
        "ControllerModifyVolume",
        {"volume_id": VOL},
        MODIFY,
        controller("MODIFY_VOLUME"),
    ),
]

CAPACITY = {"volume_capabilities": [RWO]}
ZONE = {"segments": {"topology.example.com/zone": "a"}}


def _negative_capacity(statement: str, field: str, bad: object, good: object) -> Case:
    return Case(
        SPEC,
        (statement,),
        "csi.negative-value",
        breach=(Step("GetCapacity", CAPACITY, answer={"available_capacity": GIB, field: bad}),),
        twin=(Step("GetCapacity", CAPACITY, answer={"available_capacity": GIB, field: good}),),
        background=controller("GET_CAPACITY"),
        party="plugin",
    )


GET_CAPACITY = [
    _unimplemented(
        "GetCapacity.1",
        "GetCapacity",
        CAPACITY,
        {"available_capacity": GIB},
        controller("GET_CAPACITY"),
    ),
    Case(
        SPEC,
        ("GetCapacity.5",),
        "csi.capacity-topology-without-capability",
        breach=(
            Step(
                "GetCapacity",
                {**CAPACITY, "accessible_topology": ZONE},
                answer={"available_capacity": GIB},
            ),
        ),
        twin=(Step("GetCapacity", CAPACITY, answer={"available_capacity": GIB}),),
        background=controller("GET_CAPACITY"),
        party="co",
    ),
    Case(
        SPEC,
        ("GetCapacity.8",),
        "csi.negative-value",
        breach=(Step("GetCapacity", CAPACITY, answer={"available_capacity": -GIB}),),
        twin=(Step("GetCapacity", CAPACITY, answer={"available_capacity": 0}),),
        background=controller("GET_CAPACITY"),
        party="plugin",
    ),
    _negative_capacity("GetCapacity.10", "maximum_volume_size", {"value": -1}, {"value": GIB}),
    _negative_capacity("GetCapacity.13", "minimum_volume_size", {"value": -1}, {"value": 0}),
]

CONTROLLER_GET_CAPABILITIES = [
    _unimplemented(
        "ControllerGetCapabilities.1",
        "ControllerGetCapabilities",
        {},
        {"capabilities": [{"rpc": {"type": "CREATE_DELETE_VOLUME"}}]},
        {"GetPluginCapabilities": v1_background()["GetPluginCapabilities"]},
    ),
    Case(
        SPEC,
        ("ControllerGetCapabilities.4",),
        "csi.capabilities-inconsistent",
        breach=(
            Step(
                "ControllerGetCapabilities",
                answer={"capabilities": [{"rpc": {"type": "LIST_VOLUMES_PUBLISHED_NODES"}}]},
            ),
        ),
        twin=(
            Step(
                "ControllerGetCapabilities",
                answer={
                    "capabilities": [
                        {"rpc": {"type": "LIST_VOLUMES_PUBLISHED_NODES"}},
                        {"rpc": {"type": "PUBLISH_UNPUBLISH_VOLUME"}},
                    ]
                },
            ),
        ),
        background={"GetPluginCapabilities": v1_background()["GetPluginCapabilities"]},
        party="plugin",
    ),
]

CUT = {"snapshot": snapshot()}

CREATE_SNAPSHOT = [
    _unimplemented("CreateSnapshot.1", "CreateSnapshot", take(), CUT, controller(*SNAPSHOT_CAPS)),
    # A cut and ready snapshot asked for again by name: refused instead of answered.
    Case(
        SPEC,
        ("CreateSnapshot.2", "CreateSnapshot.3"),
        "csi.not-idempotent",
        breach=(
            Step("CreateSnapshot", take(), answer=CUT),
            Step("CreateSnapshot", take(), error=("ALREADY_EXISTS", "snapshot-1 exists")),
        ),
        twin=(
            Step("CreateSnapshot", take(), answer=CUT),
            Step("CreateSnapshot", take(), answer=CUT),
        ),
        background=controller(*SNAPSHOT_CAPS),
        party="plugin",
    ),
    # ... or answered with another snapshot.
    Case(
        SPEC,
        ("CreateSnapshot.2", "CreateSnapshot.3"),
        "csi.create-not-idempotent",
        breach=(
            Step("CreateSnapshot", take(), answer=CUT),
            Step("CreateSnapshot", take(), answer={"snapshot": snapshot("snap-2")}),
        ),
        twin=(
            Step("CreateSnapshot", take(), answer=CUT),
            Step("CreateSnapshot", take(), answer=CUT),
        ),
        background=controller(*SNAPSHOT_CAPS),
        party="plugin",
    ),
    # ... or with a snapshot of another volume.
    Case(
        SPEC,
        ("CreateSnapshot.3",),
        "csi.snapshot-source-mismatch",
        breach=(
            Step("CreateSnapshot", take(), answer=CUT),
            Step("CreateSnapshot", take(), answer={"snapshot": snapshot(source="vol-9")}),
        ),
        twin=(
            Step("CreateSnapshot", take(), answer=CUT),
            Step("CreateSnapshot", take(), answer=CUT),
        ),
        background=controller(*SNAPSHOT_CAPS),
        party="plugin",
    ),
]

SNAPSHOT_MESSAGE = [
    _required(
        "The-ready-to-use-Parameter.6",
        "CreateSnapshot",
        {"name": "snapshot-1"},
        take(),
        controller(*SNAPSHOT_CAPS),
        answer=CUT,
    ),
    _required(
        "The-ready-to-use-Parameter.7",
        "CreateSnapshot",
        {"source_volume_id": VOL},
        take(),
        controller(*SNAPSHOT_CAPS),
        answer=CUT,
    ),
    _required(
        "The-ready-to-use-Parameter.8",
        "CreateSnapshot",
        {},
        CUT,
        controller(*SNAPSHOT_CAPS),
        side="response",
        request=take(),
    ),
    # A volume restored from a snapshot of 10 GiB answered with 1 GiB.
    Case(
        SPEC,
        ("The-ready-to-use-Parameter.9",),
        "csi.volume-smaller-than-snapshot",
        breach=(
            Step("CreateSnapshot", take(), answer={"snapshot": snapshot(size_bytes=10 * GIB)}),
            Step(
                "CreateVolume",
                create(volume_content_source=FROM_SNAPSHOT),
                answer=volume("vol-2", capacity_bytes=GIB, content_source=FROM_SNAPSHOT),
            ),
        ),
        twin=(
            Step("CreateSnapshot", take(), answer={"snapshot": snapshot(size_bytes=10 * GIB)}),
            Step(
                "CreateVolume",
                create(volume_content_source=FROM_SNAPSHOT),
                answer=volume("vol-2", capacity_bytes=10 * GIB, content_source=FROM_SNAPSHOT),
            ),
        ),
        background=controller(*SNAPSHOT_CAPS),
        party="plugin",
    ),
    Case(
        SPEC,
        ("The-ready-to-use-Parameter.10",),
        "csi.negative-value",
        breach=(Step("CreateSnapshot", take(), answer={"snapshot": snapshot(size_bytes=-1)}),),
        twin=(Step("CreateSnapshot", take(), answer={"snapshot": snapshot(size_bytes=0)}),),
        background=controller(*SNAPSHOT_CAPS),
        party="plugin",
    ),
    _required(
        "The-ready-to-use-Parameter.11",
        "CreateSnapshot",
        {"snapshot": snapshot("")},
        CUT,
        controller(*SNAPSHOT_CAPS),
        side="response",
        request=take(),
    ),
    _required(
        "The-ready-to-use-Parameter.14",
        "CreateSnapshot",
        {"snapshot": {k: v for k, v in snapshot().items() if k != "source_volume_id"}},
        CUT,
        controller(*SNAPSHOT_CAPS),
        side="response",
        request=take(),
    ),
    _required(
        "The-ready-to-use-Parameter.15",
        "CreateSnapshot",
        {"snapshot": {k: v for k, v in snapshot().items() if k != "creation_time"}},
        CUT,
        controller(*SNAPSHOT_CAPS),
        side="response",
        request=take(),
    ),
    # A group's member named in a group operation on another group.
    Case(
        SPEC,
        ("The-ready-to-use-Parameter.18",),
        "csi.group-id-mismatch",
        breach=(
            Step(
                "CreateVolumeGroupSnapshot",
                {"name": "group-a", "source_volume_ids": ["vol-a"]},
                answer=group(GROUP, (("snap-a", "vol-a"),)),
            ),
            Step(
                "CreateVolumeGroupSnapshot",
                {"name": "group-b", "source_volume_ids": ["vol-b"]},
                answer=group("group-2", (("snap-b", "vol-b"),)),
            ),
            Step(
                "GetVolumeGroupSnapshot",
                {"group_snapshot_id": "group-2", "snapshot_ids": ["snap-a"]},
                answer=group("group-2", (("snap-b", "vol-b"),)),
            ),
        ),
        twin=(
            Step(
                "CreateVolumeGroupSnapshot",
                {"name": "group-a", "source_volume_ids": ["vol-a"]},
                answer=group(GROUP, (("snap-a", "vol-a"),)),
            ),
            Step(
                "CreateVolumeGroupSnapshot",
                {"name": "group-b", "source_volume_ids": ["vol-b"]},
                answer=group("group-2", (("snap-b", "vol-b"),)),
            ),
            Step(
                "GetVolumeGroupSnapshot",
                {"group_snapshot_id": "group-2", "snapshot_ids": ["snap-b"]},
                answer=group("group-2", (("snap-b", "vol-b"),)),
            ),
        ),
        background=group_background(),
        party="co",
    ),
    # A member whose group id is not its group's.
    Case(
        SPEC,
        ("The-ready-to-use-Parameter.20",),
        "csi.group-snapshot-id-mismatch",
        breach=(
            Step(
                "CreateVolumeGroupSnapshot",
                {"name": "group-a", "source_volume_ids": ["vol-a"]},
                answer={
                    "group_snapshot": {
                        "group_snapshot_id": GROUP,
                        "snapshots": [snapshot("snap-a", "vol-a", group_snapshot_id="group-9")],
                        "creation_time": WHEN,
                        "ready_to_use": True,
                    }
                },
            ),
        ),
        twin=(
            Step(
                "CreateVolumeGroupSnapshot",
                {"name": "group-a", "source_volume_ids": ["vol-a"]},
                answer=group(GROUP, (("snap-a", "vol-a"),)),
            ),
        ),
        background=group_background(),
        party="plugin",
    ),
]

CASES = [
    *CREATE_VOLUME_ERRORS,
    *DELETE_VOLUME,
    *CONTROLLER_PUBLISH,
    *CONTROLLER_UNPUBLISH,
    *VALIDATE,
    *LIST_VOLUMES,
    *CONTROLLER_GET_VOLUME,
    *CONTROLLER_MODIFY_VOLUME,
    *GET_CAPACITY,
    *CONTROLLER_GET_CAPABILITIES,
    *CREATE_SNAPSHOT,
    *SNAPSHOT_MESSAGE,
]
