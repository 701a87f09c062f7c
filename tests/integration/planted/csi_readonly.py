"""CSI v1.12 and v0.3 §ValidateVolumeCapabilities: "This operation MUST be idempotent"."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import RWO, rpc_caps, v1_background
from tests.integration.planted.harness import Case, Step

RULE = "csi.validate-not-idempotent"
REQUEST = {"volume_id": "vol-1", "volume_capabilities": [RWO]}


def validate(answer: dict[str, Any]) -> Step:
    return Step("ValidateVolumeCapabilities", REQUEST, answer=answer)


V1_YES = validate({"confirmed": {"volume_capabilities": [RWO]}})
V1_NO = validate({"message": "this volume is block only"})
V0_YES = validate({"supported": True})
V0_NO = validate({"supported": False, "message": "this volume is block only"})

CASES = [
    Case(
        "csi.v1",
        ("ValidateVolumeCapabilities.3",),
        RULE,
        breach=(V1_YES, V1_NO),
        twin=(
            V1_YES,
            # a change of the volume in between may change what it supports
            Step(
                "ControllerModifyVolume",
                {"volume_id": "vol-1", "mutable_parameters": {"tier": "2"}},
            ),
            V1_NO,
        ),
        background=v1_background(controller=("CREATE_DELETE_VOLUME", "MODIFY_VOLUME")),
        party="plugin",
    ),
    Case(
        "csi.v0",
        ("ValidateVolumeCapabilities.3",),
        RULE,
        breach=(V0_NO, V0_YES),
        twin=(V0_NO, V0_NO),
        background={
            "GetPluginCapabilities": {
                "capabilities": [{"service": {"type": "CONTROLLER_SERVICE"}}]
            },
            "ControllerGetCapabilities": rpc_caps("CREATE_DELETE_VOLUME"),
        },
        party="plugin",
    ),
]


def create(spec: str, vid: str) -> Step:
    id_field = "volume_id" if spec == "csi.v1" else "id"
    return Step(
        "CreateVolume",
        {"name": f"pvc-{vid}", "volume_capabilities": [RWO]},
        answer={"volume": {id_field: vid}},
    )


def page(spec: str, ids: list[str], token: str = "", next_token: str = "") -> Step:
    id_field = "volume_id" if spec == "csi.v1" else "id"
    return Step(
        "ListVolumes",
        {"starting_token": token, "max_entries": 1 if token or next_token else 0},
        answer={"entries": [{"volume": {id_field: i}} for i in ids], "next_token": next_token},
    )


def listing_cases(spec: str, background: dict[str, Any]) -> list[Case]:
    made = (create(spec, "vol-a"), create(spec, "vol-b"))
    return [
        Case(
            spec,
            ("ListVolumes.2",),
            "csi.volume-missing",
            breach=(*made, page(spec, ["vol-a"])),
            twin=(*made, page(spec, ["vol-b", "vol-a"])),
            background=background,
            party="plugin",
        ),
        Case(
            spec,
            ("ListVolumes.2",),
            "csi.volume-missing",
            breach=(*made, page(spec, ["vol-a"], next_token="t1"), page(spec, ["vol-c"], "t1")),
            twin=(
                *made,
                page(spec, ["vol-a"], next_token="t1"),
                # made between the pages: it may fall between them
                create(spec, "vol-c"),
                page(spec, ["vol-b"], "t1"),
            ),
            background=background,
            party="plugin",
            variant="paged",
        ),
    ]


CASES += listing_cases(
    "csi.v1", v1_background(controller=("CREATE_DELETE_VOLUME", "LIST_VOLUMES"))
) + listing_cases(
    "csi.v0",
    {
        "GetPluginCapabilities": {"capabilities": [{"service": {"type": "CONTROLLER_SERVICE"}}]},
        "ControllerGetCapabilities": rpc_caps("CREATE_DELETE_VOLUME", "LIST_VOLUMES"),
    },
)


def made_then_validated(spec: str, statements: tuple[str, ...]) -> Case:
    """CreateVolume answers OK with RWO; a validation of RWO for that volume is then
    refused: the plugin contradicts itself. The twin validates another capability."""
    id_field = "volume_id" if spec == "csi.v1" else "id"
    create = Step(
        "CreateVolume",
        {"name": "pvc-1", "volume_capabilities": [RWO]},
        answer={"volume": {id_field: "vol-1"}},
    )
    no = {"message": "not supported"} if spec == "csi.v1" else {"supported": False}
    block = {"block": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
    return Case(
        spec,
        statements,
        "csi.validate-contradicts-create",
        breach=(create, Step("ValidateVolumeCapabilities", REQUEST, answer=no)),
        twin=(
            create,
            Step(
                "ValidateVolumeCapabilities",
                {"volume_id": "vol-1", "volume_capabilities": [block]},
                answer=no,
            ),
        ),
        background=V1_BACKGROUND if spec == "csi.v1" else V0_BACKGROUND,
        party="plugin",
    )


def snapshot_answer(spec: str, ready: bool) -> dict[str, Any]:
    if spec == "csi.v1":
        snap: dict[str, Any] = {
            "snapshot_id": "snap-1",
            "source_volume_id": "vol-1",
            "ready_to_use": ready,
            "creation_time": {"seconds": 1_700_000_000},
        }
    else:
        snap = {
            "id": "snap-1",
            "source_volume_id": "vol-1",
            "created_at": 1_700_000_000,
            "status": {"type": "READY" if ready else "UPLOADING"},
        }
    return {"entries": [{"snapshot": snap}]}


def regressed(spec: str, statements: tuple[str, ...]) -> Case:
    listing = {"snapshot_id": "snap-1"}
    return Case(
        spec,
        statements,
        "csi.snapshot-ready-regressed",
        breach=(
            Step("ListSnapshots", listing, answer=snapshot_answer(spec, True)),
            Step("ListSnapshots", listing, answer=snapshot_answer(spec, False)),
        ),
        twin=(
            Step("ListSnapshots", listing, answer=snapshot_answer(spec, False)),
            Step("ListSnapshots", listing, answer=snapshot_answer(spec, True)),
        ),
        background=V1_SNAPSHOTS if spec == "csi.v1" else V0_SNAPSHOTS,
        party="plugin",
    )


V1_BACKGROUND = v1_background()
V0_BACKGROUND = {
    "GetPluginCapabilities": {"capabilities": [{"service": {"type": "CONTROLLER_SERVICE"}}]},
    "ControllerGetCapabilities": rpc_caps("CREATE_DELETE_VOLUME"),
}
V1_SNAPSHOTS = v1_background(controller=("CREATE_DELETE_SNAPSHOT", "LIST_SNAPSHOTS"))
V0_SNAPSHOTS = {
    "GetPluginCapabilities": {"capabilities": [{"service": {"type": "CONTROLLER_SERVICE"}}]},
    "ControllerGetCapabilities": rpc_caps("CREATE_DELETE_SNAPSHOT", "LIST_SNAPSHOTS"),
}

CASES += [
    made_then_validated("csi.v1", ("CreateVolume.13", "CreateVolume.14", "CreateVolume.17")),
    made_then_validated(
        "csi.v0",
        (
            "CreateVolume.6",
            "CreateVolume.8",
            "ValidateVolumeCapabilities.2",
            "ValidateVolumeCapabilities.5",
        ),
    ),
    regressed(
        "csi.v1",
        (
            "CreateSnapshot-DeleteSnapshot-ListSnapshots.4",
            "CreateSnapshot-DeleteSnapshot-ListSnapshots.5",
        ),
    ),
    regressed("csi.v0", ("Snapshot-Statuses.4", "Snapshot-Statuses.5")),
]


def writer_modes(snw_confirmed: bool) -> tuple[Step, ...]:
    snw = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
    snsw = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_SINGLE_WRITER"}}

    def validate_mode(cap: dict[str, Any], confirmed: bool) -> Step:
        answer = {"confirmed": {"volume_capabilities": [cap]}} if confirmed else {"message": "no"}
        return Step(
            "ValidateVolumeCapabilities",
            {"volume_id": "vol-1", "volume_capabilities": [cap]},
            answer=answer,
        )

    return (validate_mode(snsw, True), validate_mode(snw, snw_confirmed))


CASES.append(
    Case(
        "csi.v1",
        ("ControllerGetCapabilities.7",),
        "csi.single-node-writer-refused",
        breach=writer_modes(False),
        twin=writer_modes(True),
        background=v1_background(controller=("CREATE_DELETE_VOLUME", "SINGLE_NODE_MULTI_WRITER")),
        party="plugin",
    )
)
