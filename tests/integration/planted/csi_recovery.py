"""Recovery before a retry, as far as the socket shows it (CSI v1.12 and v0.3 error rows):
verify a volume exists after NOT_FOUND, free a volume of its snapshots after DeleteVolume's
FAILED_PRECONDITION, unpublish before retrying an offline expansion."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import NODE, RWO, rpc_caps, v1_background
from tests.integration.planted.harness import Case, Step

V1 = "csi.v1"
DELETED = "csi.retry-deleted-object"
V1_CONTROLLER = v1_background(
    controller=(
        "CREATE_DELETE_VOLUME",
        "PUBLISH_UNPUBLISH_VOLUME",
        "CREATE_DELETE_SNAPSHOT",
        "EXPAND_VOLUME",
    )
)
V0_CONTROLLER = {
    "GetPluginCapabilities": {"capabilities": [{"service": {"type": "CONTROLLER_SERVICE"}}]},
    "ControllerGetCapabilities": rpc_caps("CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME"),
}
PUBLISH = {"volume_id": "vol-1", "node_id": NODE, "volume_capability": RWO}
REQUESTS: dict[str, dict[str, Any]] = {
    "ControllerPublishVolume": PUBLISH,
    "ControllerUnpublishVolume": {"volume_id": "vol-1", "node_id": NODE},
    "ValidateVolumeCapabilities": {"volume_id": "vol-1", "volume_capabilities": [RWO]},
    "CreateVolume": {
        "name": "pvc-2",
        "volume_capabilities": [RWO],
        "volume_content_source": {"snapshot": {"snapshot_id": "snap-1"}},
    },
}


def after_delete(spec: str, statement: str, rpc: str, background: dict[str, Any]) -> Case:
    """The volume (or source snapshot) deleted here, the call refused NOT_FOUND, then
    retried: the CO did not verify it exists. The twin gives up after the NOT_FOUND."""
    deleting = (
        Step("DeleteSnapshot", {"snapshot_id": "snap-1"})
        if rpc == "CreateVolume"
        else Step("DeleteVolume", {"volume_id": "vol-1"})
    )
    refused = Step(rpc, REQUESTS[rpc], error=("NOT_FOUND", "no such volume"))
    return Case(
        spec,
        (statement,),
        DELETED,
        breach=(
            deleting,
            refused,
            Step(rpc, REQUESTS[rpc], error=("NOT_FOUND", "no such volume"), wait=0.1),
        ),
        twin=(deleting, refused),
        background=background,
        party="co",
    )


SNAPSHOT = {
    "snapshot": {
        "snapshot_id": "snap-1",
        "source_volume_id": "vol-1",
        "ready_to_use": True,
        "creation_time": {"seconds": 1_700_000_000},
    }
}
IN_USE = ("FAILED_PRECONDITION", "vol-1 has snapshots")
EXPAND = {"volume_id": "vol-1", "capacity_range": {"required_bytes": 2 << 30}}
PUBLISHED = ("FAILED_PRECONDITION", "vol-1 is published and cannot grow offline")

CASES = [
    after_delete(V1, "CreateVolume-Errors.8", "CreateVolume", V1_CONTROLLER),
    after_delete(V1, "ControllerPublishVolume-Errors.4", "ControllerPublishVolume", V1_CONTROLLER),
    after_delete(
        V1, "ControllerUnpublishVolume-Errors.4", "ControllerUnpublishVolume", V1_CONTROLLER
    ),
    after_delete(
        V1, "ValidateVolumeCapabilities-Errors.4", "ValidateVolumeCapabilities", V1_CONTROLLER
    ),
    after_delete(
        "csi.v0", "ControllerPublishVolume-Errors.4", "ControllerPublishVolume", V0_CONTROLLER
    ),
    after_delete(
        "csi.v0", "ControllerUnpublishVolume-Errors.4", "ControllerUnpublishVolume", V0_CONTROLLER
    ),
    after_delete(
        "csi.v0", "ValidateVolumeCapabilities-Errors.4", "ValidateVolumeCapabilities", V0_CONTROLLER
    ),
    Case(
        V1,
        ("DeleteVolume-Errors.3", "DeleteVolume-Errors.4"),
        "csi.delete-retry-with-snapshots",
        breach=(
            Step(
                "CreateSnapshot", {"name": "snap-a", "source_volume_id": "vol-1"}, answer=SNAPSHOT
            ),
            Step("DeleteVolume", {"volume_id": "vol-1"}, error=IN_USE),
            Step("DeleteVolume", {"volume_id": "vol-1"}, error=IN_USE, wait=0.2),
        ),
        twin=(
            Step(
                "CreateSnapshot", {"name": "snap-a", "source_volume_id": "vol-1"}, answer=SNAPSHOT
            ),
            Step("DeleteVolume", {"volume_id": "vol-1"}, error=IN_USE),
            Step("DeleteSnapshot", {"snapshot_id": "snap-1"}),
            Step("DeleteVolume", {"volume_id": "vol-1"}, wait=0.2),
        ),
        background=V1_CONTROLLER,
        party="co",
    ),
    Case(
        V1,
        ("ControllerExpandVolume-Errors.2",),
        "csi.expand-retry-while-published",
        breach=(
            Step("ControllerExpandVolume", EXPAND, error=PUBLISHED),
            Step("ControllerExpandVolume", EXPAND, error=PUBLISHED, wait=0.2),
        ),
        twin=(
            Step("ControllerExpandVolume", EXPAND, error=PUBLISHED),
            Step("ControllerUnpublishVolume", {"volume_id": "vol-1", "node_id": NODE}),
            Step("ControllerExpandVolume", EXPAND, answer={"capacity_bytes": 2 << 30}, wait=0.2),
        ),
        background=V1_CONTROLLER,
        party="co",
    ),
]


def answered_after_delete(
    spec: str, statements: tuple[str, ...], rpc: str, background: dict[str, Any]
) -> Case:
    """The volume's delete answered OK here, then a call naming it answered OK where the
    table prescribes NOT_FOUND; the twin answers NOT_FOUND."""
    deleting = Step("DeleteVolume", {"volume_id": "vol-1"})
    return Case(
        spec,
        statements,
        "csi.deleted-object-answered",
        breach=(deleting, Step(rpc, REQUESTS[rpc])),
        twin=(deleting, Step(rpc, REQUESTS[rpc], error=("NOT_FOUND", "no volume vol-1"))),
        background=background,
        party="plugin",
    )


CASES += [
    answered_after_delete(
        V1,
        ("ControllerPublishVolume-Errors.2", "Error-Scheme.4"),
        "ControllerPublishVolume",
        V1_CONTROLLER,
    ),
    answered_after_delete(
        "csi.v0",
        ("ControllerUnpublishVolume-Errors.2", "Error-Scheme.3"),
        "ControllerUnpublishVolume",
        V0_CONTROLLER,
    ),
]


def snapshot_made(source: str, sid: str) -> Step:
    return Step(
        "CreateSnapshot",
        {"name": "snap-a", "source_volume_id": source},
        answer={
            "snapshot": {
                "snapshot_id": sid,
                "source_volume_id": source,
                "ready_to_use": True,
                "creation_time": {"seconds": 1_700_000_000},
            }
        },
    )


def volume_made(vid: str, gib: int) -> Step:
    return Step(
        "CreateVolume",
        {
            "name": "pvc-a",
            "volume_capabilities": [RWO],
            "capacity_range": {"required_bytes": gib << 30},
        },
        answer={"volume": {"volume_id": vid, "capacity_bytes": gib << 30}},
    )


CASES += [
    Case(
        V1,
        ("CreateSnapshot-Errors.2", "Error-Scheme.4"),
        "csi.name-reused",
        breach=(snapshot_made("vol-1", "snap-1"), snapshot_made("vol-2", "snap-2")),
        twin=(
            snapshot_made("vol-1", "snap-1"),
            Step("DeleteSnapshot", {"snapshot_id": "snap-1"}),
            snapshot_made("vol-2", "snap-2"),
        ),
        background=V1_CONTROLLER,
        party="plugin",
    ),
    Case(
        V1,
        ("CreateVolume.9",),
        "csi.volume-name-reused",
        breach=(volume_made("vol-1", 1), volume_made("vol-2", 2)),
        twin=(volume_made("vol-1", 1), volume_made("vol-1", 2)),  # the first, judged compatible
        background=V1_CONTROLLER,
        party="plugin",
    ),
]


METADATA = v1_background(
    plugin=("CONTROLLER_SERVICE", "SNAPSHOT_METADATA_SERVICE"),
    controller=("CREATE_DELETE_SNAPSHOT",),
)


def metadata_after_delete(statement: str, rpc: str, request: dict[str, Any]) -> Case:
    deleting = Step("DeleteSnapshot", {"snapshot_id": "snap-1"})
    refused = Step(rpc, request, error=("NOT_FOUND", "no snapshot snap-1"))
    return Case(
        V1,
        (statement,),
        DELETED,
        breach=(
            deleting,
            refused,
            Step(rpc, request, error=("NOT_FOUND", "no snapshot"), wait=0.1),
        ),
        twin=(deleting, refused),
        background=METADATA,
        party="co",
    )


GROUP_MEMBER = ("INVALID_ARGUMENT", "snap-1 is part of a group snapshot")

CASES += [
    metadata_after_delete(
        "GetMetadataAllocated-Errors.lc3", "GetMetadataAllocated", {"snapshot_id": "snap-1"}
    ),
    metadata_after_delete(
        "GetMetadataDelta-Errors.lc3",
        "GetMetadataDelta",
        {"base_snapshot_id": "snap-1", "target_snapshot_id": "snap-2"},
    ),
    Case(
        V1,
        ("DeleteSnapshot-Errors.3", "DeleteSnapshot-Errors.4"),
        "csi.retry-advised-unchanged",
        breach=(
            Step("DeleteSnapshot", {"snapshot_id": "snap-1"}, error=GROUP_MEMBER),
            Step("DeleteSnapshot", {"snapshot_id": "snap-1"}, error=GROUP_MEMBER, wait=0.1),
        ),
        twin=(
            Step("DeleteSnapshot", {"snapshot_id": "snap-1"}, error=GROUP_MEMBER),
            Step(
                "DeleteVolumeGroupSnapshot",
                {"group_snapshot_id": "group-1", "snapshot_ids": ["snap-1", "snap-2"]},
                wait=0.1,
            ),
        ),
        background=v1_background(
            controller=("CREATE_DELETE_SNAPSHOT",),
            group=("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT",),
        ),
        party="co",
        variant="group-member",
    ),
]
