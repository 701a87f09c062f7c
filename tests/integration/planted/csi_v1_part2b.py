"""CSI v1.12 §NodeGetVolumeStats (its response), §NodeGetCapabilities, §NodeGetInfo,
§NodeExpandVolume, the group controller service, §Snapshot Metadata Service and
§Connectivity: planted breaches and their legitimate twins."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import v1_background
from tests.integration.planted.csi_v1_part2b_builders import (
    CAPACITY,
    GIB,
    OTHER_VOLUME,
    ROTATED,
    SECRETS,
    allocated_request,
    blocks,
    create_group_request,
    delta_request,
    expand_request,
    group,
    group_background,
    group_ref,
    member,
    metadata_message,
    node_background,
    publish_request,
    stage_request,
    stats_answer,
    stats_request,
    unpublish_request,
    unstage_request,
    usage,
)
from tests.integration.planted.harness import Case, Step

SPEC = "csi.v1"
CASES: list[Case] = []


def case(
    statements: tuple[str, ...],
    rule: str,
    breach: tuple[Step, ...],
    twin: tuple[Step, ...],
    background: dict[str, Any] | None = None,
    party: str = "",
    why: str = "",
    variant: str = "",
) -> None:
    CASES.append(
        Case(
            SPEC,
            statements,
            rule,
            breach,
            twin,
            background if background is not None else v1_background(),
            party,
            why,
            variant,
        )
    )


def stats(answer: dict[str, Any]) -> Step:
    return Step("NodeGetVolumeStats", stats_request(), answer=answer)


# -- §NodeGetVolumeStats: the answer -----------------------------------------------------------

case(
    ("NodeGetVolumeStats.9",),
    "csi.response-field-missing",
    breach=(stats(stats_answer(condition=None)),),
    twin=(stats(stats_answer()),),
    background=node_background("GET_VOLUME_STATS", "VOLUME_CONDITION"),
    party="plugin",
)

for sid, name in (
    ("NodeGetVolumeStats.10", "available"),
    ("NodeGetVolumeStats.12", "total"),
    ("NodeGetVolumeStats.13", "used"),
):
    case(
        (sid,),
        "csi.negative-value",
        breach=(stats(stats_answer([usage(), usage(unit="INODES", **{name: -1})])),),
        twin=(stats(stats_answer([usage(), usage(unit="INODES", **{name: 0})])),),
        background=node_background("GET_VOLUME_STATS", "VOLUME_CONDITION"),
        party="plugin",
    )

case(
    ("NodeGetVolumeStats.11",),
    "csi.required-field",
    breach=(stats(stats_answer([usage(total=0)])),),
    twin=(stats(stats_answer([usage(), usage(unit="INODES", total=0, available=0, used=0)])),),
    background=node_background("GET_VOLUME_STATS", "VOLUME_CONDITION"),
    party="plugin",
    why="a BYTES usage without its total (0); an INODES total of 0 is a real count",
)

case(
    ("NodeGetVolumeStats.14",),
    "csi.required-field",
    breach=(stats(stats_answer([usage(unit="UNKNOWN")])),),
    twin=(stats(stats_answer([usage()])),),
    background=node_background("GET_VOLUME_STATS", "VOLUME_CONDITION"),
    party="plugin",
    why="UNKNOWN is the enum's unset value: the unit is missing",
)

case(
    ("NodeGetVolumeStats.16",),
    "csi.required-field",
    breach=(stats(stats_answer(condition={"abnormal": True})),),
    twin=(stats(stats_answer(condition={"abnormal": True, "message": "device is gone"})),),
    background=node_background("GET_VOLUME_STATS", "VOLUME_CONDITION"),
    party="plugin",
)

# -- §NodeGetCapabilities ---------------------------------------------------------------------

case(
    ("NodeGetCapabilities.1",),
    "csi.unimplemented-advertised",
    breach=(
        Step("NodeUnpublishVolume", unpublish_request()),
        Step("NodeGetCapabilities", error=("UNIMPLEMENTED", "not served here")),
    ),
    twin=(
        Step("NodeUnpublishVolume", unpublish_request()),
        Step("NodeGetCapabilities", answer={"capabilities": []}),
    ),
    background=node_background(),
    party="plugin",
    why="the node service answered a call, so it is served, and NodeGetCapabilities is part of it",
)

case(
    ("NodeGetCapabilities.2",),
    "csi.unimplemented-advertised",
    breach=(Step("NodeGetVolumeStats", stats_request(), error=("UNIMPLEMENTED", "no stats")),),
    twin=(stats(stats_answer(condition=None)),),
    background=node_background("GET_VOLUME_STATS"),
    party="plugin",
)

# -- §NodeGetInfo -----------------------------------------------------------------------------

NODE_INFO = {"node_id": "node-1", "max_volumes_per_node": 16}

case(
    ("NodeGetInfo.1",),
    "csi.unimplemented-advertised",
    breach=(
        Step("NodeGetCapabilities", answer={"capabilities": []}),
        Step("NodeGetInfo", error=("UNIMPLEMENTED", "no node info")),
    ),
    twin=(
        Step("NodeGetCapabilities", answer={"capabilities": []}),
        Step("NodeGetInfo", answer=NODE_INFO),
    ),
    background=node_background(controller=("PUBLISH_UNPUBLISH_VOLUME",)),
    party="plugin",
)

case(
    ("NodeGetInfo.5",),
    "csi.required-field",
    breach=(Step("NodeGetInfo", answer={"max_volumes_per_node": 16}),),
    twin=(Step("NodeGetInfo", answer=NODE_INFO),),
    background=node_background(),
    party="plugin",
)

case(
    ("NodeGetInfo.8",),
    "csi.size-limit",
    breach=(Step("NodeGetInfo", answer={"node_id": "n" * 257}),),
    twin=(Step("NodeGetInfo", answer={"node_id": "n" * 128}),),
    background=node_background(),
    party="plugin",
)

case(
    ("NodeGetInfo.9",),
    "csi.size-limit-recommended",
    breach=(Step("NodeGetInfo", answer={"node_id": "n" * 129}),),
    twin=(Step("NodeGetInfo", answer={"node_id": "n" * 128}),),
    background=node_background(),
    party="plugin",
)

case(
    ("NodeGetInfo.11",),
    "csi.negative-value",
    breach=(Step("NodeGetInfo", answer={"node_id": "node-1", "max_volumes_per_node": -1}),),
    twin=(Step("NodeGetInfo", answer={"node_id": "node-1", "max_volumes_per_node": 0}),),
    background=node_background(),
    party="plugin",
)

case(
    ("NodeGetInfo.12",),
    "csi.topology-without-capability",
    breach=(
        Step(
            "NodeGetInfo",
            answer={
                "node_id": "node-1",
                "accessible_topology": {"segments": {"topology.example.com/zone": "a"}},
            },
        ),
    ),
    twin=(Step("NodeGetInfo", answer={"node_id": "node-1"}),),
    background=node_background(),
    party="plugin",
)

# -- §NodeExpandVolume ------------------------------------------------------------------------

EXPANDED = {"capacity_bytes": 2 * GIB}
STAGED = node_background("STAGE_UNSTAGE_VOLUME", "EXPAND_VOLUME")
UNSTAGED = node_background("EXPAND_VOLUME")


def node_expand(request: dict[str, Any] | None = None, **step: Any) -> Step:
    if "error" not in step and "answer" not in step:
        step["answer"] = EXPANDED
    return Step("NodeExpandVolume", request if request is not None else expand_request(), **step)


case(
    ("NodeExpandVolume.1",),
    "csi.unimplemented-advertised",
    breach=(node_expand(error=("UNIMPLEMENTED", "no expansion")),),
    twin=(node_expand(),),
    background=STAGED,
    party="plugin",
)

case(
    ("NodeExpandVolume.2",),
    "csi.not-idempotent",
    breach=(node_expand(), node_expand(error=("FAILED_PRECONDITION", "already expanding"))),
    twin=(node_expand(), node_expand()),
    background=STAGED,
    party="plugin",
    why="the identical repeat of an expansion that succeeded is refused",
)

case(
    ("NodeExpandVolume.2",),
    "csi.not-idempotent",
    breach=(
        node_expand(answer={}),
        node_expand(error=("OUT_OF_RANGE", "2 GiB is beyond the pool")),
    ),
    twin=(node_expand(answer={}), node_expand(answer={})),
    background=STAGED,
    party="plugin",
    why="the identical repeat of an expansion that succeeded (its size unsaid) is refused as"
    " out of range",
    variant="out-of-range",
)
case(
    ("NodeExpandVolume.3",),
    "csi.expand-already-large-refused",
    breach=(
        node_expand(),
        node_expand(expand_request(required=GIB), error=("OUT_OF_RANGE", "cannot shrink")),
    ),
    twin=(node_expand(), node_expand(expand_request(required=GIB))),
    background=STAGED,
    party="plugin",
)

case(
    ("NodeExpandVolume.4",),
    "csi.call-order",
    breach=(
        Step("NodeStageVolume", stage_request()),
        Step("NodeUnstageVolume", unstage_request()),
        node_expand(),
    ),
    twin=(
        Step("NodeStageVolume", stage_request()),
        node_expand(),
        Step("NodeUnstageVolume", unstage_request()),
    ),
    background=STAGED,
    party="co",
)

case(
    ("NodeExpandVolume.5",),
    "csi.call-order",
    breach=(
        Step("NodePublishVolume", publish_request()),
        Step("NodeUnpublishVolume", unpublish_request()),
        node_expand(expand_request(staging=None)),
    ),
    twin=(
        Step("NodePublishVolume", publish_request()),
        node_expand(expand_request(staging=None)),
        Step("NodeUnpublishVolume", unpublish_request()),
    ),
    background=UNSTAGED,
    party="co",
)

case(
    ("NodeExpandVolume.7",),
    "csi.field-recommended-with-capability",
    breach=(node_expand(expand_request(staging=None)),),
    twin=(node_expand(),),
    background=STAGED,
    party="co",
)

for sid, name in (("NodeExpandVolume.8", "volume_id"), ("NodeExpandVolume.9", "volume_path")):
    case(
        (sid,),
        "csi.required-field",
        breach=(node_expand({k: v for k, v in expand_request().items() if k != name}),),
        twin=(node_expand(),),
        background=STAGED,
        party="co",
    )

case(
    ("NodeExpandVolume.11",),
    "csi.path-not-absolute",
    breach=(node_expand(expand_request(staging="plugins/example.com/abc/globalmount")),),
    twin=(node_expand(),),
    background=STAGED,
    party="co",
)

IN_USE = ("FAILED_PRECONDITION", "volume is in use")
case(
    ("NodeExpandVolume-Errors.2",),
    "csi.retry-without-change",
    breach=(node_expand(error=IN_USE), node_expand(error=IN_USE)),
    twin=(node_expand(error=IN_USE), node_expand(expand_request(OTHER_VOLUME))),
    background=STAGED,
    party="co",
)
case(
    ("NodeExpandVolume-Errors.2",),
    "csi.retry-unfixed",
    breach=(node_expand(error=IN_USE), node_expand(expand_request(required=3 * GIB))),
    twin=(
        node_expand(error=IN_USE),
        node_expand(expand_request(OTHER_VOLUME, 3 * GIB), answer={"capacity_bytes": 3 * GIB}),
    ),
    background=STAGED,
    party="co",
    why="no retry at all is allowed for the volume, changed or not",
)

RANGE = ("OUT_OF_RANGE", "2 GiB is beyond the pool")
case(
    ("NodeExpandVolume-Errors.3",),
    "csi.retry-without-change",
    breach=(node_expand(error=RANGE), node_expand()),
    twin=(node_expand(error=RANGE), node_expand(expand_request(required=GIB + GIB // 2))),
    background=STAGED,
    party="co",
)
case(
    ("NodeExpandVolume-Errors.3",),
    "csi.retry-unfixed",
    breach=(node_expand(error=RANGE), node_expand(expand_request(staging=None))),
    twin=(
        node_expand(error=RANGE),
        node_expand(expand_request(required=GIB + GIB // 2, staging=None)),
    ),
    background=UNSTAGED,
    party="co",
    why="the retry changes another field but keeps the capacity_range",
)

# -- the group controller service -------------------------------------------------------------

case(
    ("GroupControllerGetCapabilities.1",),
    "csi.unimplemented-advertised",
    breach=(Step("GroupControllerGetCapabilities", error=("UNIMPLEMENTED", "no groups")),),
    twin=(Step("GroupControllerGetCapabilities", answer={"capabilities": []}),),
    background=v1_background(plugin=("CONTROLLER_SERVICE", "GROUP_CONTROLLER_SERVICE")),
    party="plugin",
)

for sid, rpc, request in (
    ("CreateVolumeGroupSnapshot.1", "CreateVolumeGroupSnapshot", create_group_request()),
    ("DeleteVolumeGroupSnapshot.1", "DeleteVolumeGroupSnapshot", group_ref()),
    ("GetVolumeGroupSnapshot.1", "GetVolumeGroupSnapshot", group_ref()),
):
    case(
        (sid,),
        "csi.unimplemented-advertised",
        breach=(Step(rpc, request, error=("UNIMPLEMENTED", "not here")),),
        twin=(
            Step(rpc, request, answer={"group_snapshot": group()} if "Delete" not in rpc else {}),
        ),
        background=group_background(),
        party="plugin",
    )


def create_group(request: dict[str, Any] | None = None, **step: Any) -> Step:
    if "error" not in step and "answer" not in step:
        step["answer"] = {"group_snapshot": group()}
    return Step(
        "CreateVolumeGroupSnapshot",
        request if request is not None else create_group_request(),
        **step,
    )


case(
    ("CreateVolumeGroupSnapshot.4", "CreateVolumeGroupSnapshot.5"),
    "csi.create-not-idempotent",
    breach=(create_group(), create_group(answer={"group_snapshot": group("group-2")})),
    twin=(create_group(), create_group()),
    background=group_background(),
    party="plugin",
    why="the same name, sources and parameters answered with a second group",
)
case(
    ("CreateVolumeGroupSnapshot.4", "CreateVolumeGroupSnapshot.5"),
    "csi.not-idempotent",
    breach=(create_group(), create_group(error=("ALREADY_EXISTS", "name taken"))),
    twin=(create_group(), create_group()),
    background=group_background(),
    party="plugin",
    why="the identical repeat of a create that answered a ready group is refused",
)

for sid, name in (
    ("CreateVolumeGroupSnapshot.12", "name"),
    ("CreateVolumeGroupSnapshot.13", "source_volume_ids"),
):
    case(
        (sid,),
        "csi.required-field",
        breach=(create_group({k: v for k, v in create_group_request().items() if k != name}),),
        twin=(create_group(),),
        background=group_background(),
        party="co",
    )

case(
    ("CreateVolumeGroupSnapshot.14", "GetVolumeGroupSnapshot.6"),
    "csi.secrets-changed",
    breach=(
        create_group(create_group_request(secrets=SECRETS)),
        Step(
            "GetVolumeGroupSnapshot",
            group_ref(secrets=ROTATED),
            answer={"group_snapshot": group()},
        ),
    ),
    twin=(
        create_group(create_group_request(secrets=SECRETS)),
        Step(
            "GetVolumeGroupSnapshot",
            group_ref(secrets=SECRETS),
            answer={"group_snapshot": group()},
        ),
    ),
    background=group_background(),
    party="co",
)
case(
    ("CreateVolumeGroupSnapshot.14",),
    "csi.secrets-changed",
    breach=(
        create_group(
            create_group_request(secrets=SECRETS),
            answer={"group_snapshot": group(ready=False, members=[member(1, ready=False)])},
        ),
        create_group(create_group_request(secrets=ROTATED)),
    ),
    twin=(
        create_group(
            create_group_request(secrets=SECRETS),
            answer={"group_snapshot": group(ready=False, members=[member(1, ready=False)])},
        ),
        create_group(create_group_request(secrets=SECRETS)),
    ),
    background=group_background(),
    party="co",
    why="the create repeated until the group is ready passes other secrets",
    variant="repeated-create",
)
IN_USE_GROUP = ("FAILED_PRECONDITION", "a volume is being restored from the group")
case(
    ("DeleteVolumeGroupSnapshot.8",),
    "csi.secrets-changed",
    breach=(
        Step("DeleteVolumeGroupSnapshot", group_ref(secrets=SECRETS), error=IN_USE_GROUP),
        Step("DeleteVolumeGroupSnapshot", group_ref(secrets=ROTATED), wait=0.05),
    ),
    twin=(
        Step("DeleteVolumeGroupSnapshot", group_ref(secrets=SECRETS), error=IN_USE_GROUP),
        Step("DeleteVolumeGroupSnapshot", group_ref(secrets=SECRETS), wait=0.05),
    ),
    background=group_background(),
    party="co",
    why="a delete retried after the plugin refused it passes other secrets",
    variant="retried-delete",
)
case(
    ("DeleteVolumeGroupSnapshot.8",),
    "csi.secrets-changed",
    breach=(
        create_group(create_group_request(secrets=SECRETS)),
        Step("DeleteVolumeGroupSnapshot", group_ref(secrets=ROTATED)),
    ),
    twin=(
        create_group(create_group_request(secrets=SECRETS)),
        Step("DeleteVolumeGroupSnapshot", group_ref(secrets=SECRETS)),
    ),
    background=group_background(),
    party="co",
)

case(
    ("CreateVolumeGroupSnapshot.15",),
    "csi.required-field",
    breach=(create_group(answer={}),),
    twin=(create_group(),),
    background=group_background(),
    party="plugin",
)

for sid, name in (
    ("CreateVolumeGroupSnapshot.18", "group_snapshot_id"),
    ("CreateVolumeGroupSnapshot.19", "snapshots"),
    ("CreateVolumeGroupSnapshot.20", "creation_time"),
):
    case(
        (sid,),
        "csi.required-field",
        breach=(
            create_group(
                answer={"group_snapshot": {k: v for k, v in group().items() if k != name}}
            ),
        ),
        twin=(create_group(),),
        background=group_background(),
        party="plugin",
    )

case(
    ("CreateVolumeGroupSnapshot.21",),
    "csi.group-ready-mismatch",
    breach=(
        create_group(
            answer={"group_snapshot": {**group(), "snapshots": [member(1), member(2, ready=False)]}}
        ),
    ),
    twin=(
        create_group(
            answer={
                "group_snapshot": group(ready=False, members=[member(1), member(2, ready=False)])
            }
        ),
    ),
    background=group_background(),
    party="plugin",
)
case(
    ("CreateVolumeGroupSnapshot.22",),
    "csi.group-not-ready",
    breach=(create_group(answer={"group_snapshot": {**group(), "ready_to_use": False}}),),
    twin=(create_group(),),
    background=group_background(),
    party="plugin",
)

INCOMPATIBLE = ("ALREADY_EXISTS", "a group of that name has other volumes")
case(
    ("CreateVolumeGroupSnapshot-Errors.4",),
    "csi.retry-without-change",
    breach=(create_group(error=INCOMPATIBLE), create_group(error=INCOMPATIBLE)),
    twin=(create_group(error=INCOMPATIBLE), create_group(create_group_request("group-b"))),
    background=group_background(),
    party="co",
)

case(
    ("DeleteVolumeGroupSnapshot.2",),
    "csi.not-idempotent",
    breach=(
        Step("DeleteVolumeGroupSnapshot", group_ref()),
        Step("DeleteVolumeGroupSnapshot", group_ref(), error=("INVALID_ARGUMENT", "bad id")),
    ),
    twin=(
        Step("DeleteVolumeGroupSnapshot", group_ref()),
        Step("DeleteVolumeGroupSnapshot", group_ref()),
    ),
    background=group_background(),
    party="plugin",
    why="the identical repeat of a delete that succeeded is refused as invalid",
)
case(
    ("DeleteVolumeGroupSnapshot.3", "DeleteVolumeGroupSnapshot.2"),
    "csi.delete-not-idempotent",
    breach=(Step("DeleteVolumeGroupSnapshot", group_ref(), error=("NOT_FOUND", "no such group")),),
    twin=(Step("DeleteVolumeGroupSnapshot", group_ref()),),
    background=group_background(),
    party="plugin",
)

case(
    ("DeleteVolumeGroupSnapshot.4",),
    "csi.required-field",
    breach=(Step("DeleteVolumeGroupSnapshot", {"snapshot_ids": ["group-1-snap-1"]}),),
    twin=(Step("DeleteVolumeGroupSnapshot", group_ref()),),
    background=group_background(),
    party="co",
)

GET_OK = {"group_snapshot": group()}
case(
    ("GetVolumeGroupSnapshot.2",),
    "csi.required-field",
    breach=(Step("GetVolumeGroupSnapshot", {"snapshot_ids": ["group-1-snap-1"]}, answer=GET_OK),),
    twin=(Step("GetVolumeGroupSnapshot", group_ref(), answer=GET_OK),),
    background=group_background(),
    party="co",
)
case(
    ("GetVolumeGroupSnapshot.7",),
    "csi.required-field",
    breach=(Step("GetVolumeGroupSnapshot", group_ref(), answer={}),),
    twin=(Step("GetVolumeGroupSnapshot", group_ref(), answer=GET_OK),),
    background=group_background(),
    party="plugin",
)

# -- §Snapshot Metadata Service ---------------------------------------------------------------


def allocated(request: dict[str, Any], answer: Any, **step: Any) -> Step:
    return Step("GetMetadataAllocated", request, answer=answer, **step)


def delta(request: dict[str, Any], answer: Any, **step: Any) -> Step:
    return Step("GetMetadataDelta", request, answer=answer, **step)


BROKEN = ("UNAVAILABLE", "backend connection lost")
STREAMS = (
    ("GetMetadataAllocated", allocated, allocated_request),
    ("GetMetadataDelta", delta, delta_request),
)

for rpc, call, request in STREAMS:
    # Metadata-Format.2/.3: a range of no bytes (an unset size reads zero).
    if rpc == "GetMetadataAllocated":
        case(
            ("Metadata-Format.2", "Metadata-Format.3"),
            "csi.metadata-size-zero",
            breach=(
                call(
                    request(),
                    [
                        metadata_message(blocks(0, 4096), "VARIABLE_LENGTH"),
                        metadata_message(
                            [{"byte_offset": 8192}, {"byte_offset": 12288, "size_bytes": 10}],
                            "VARIABLE_LENGTH",
                        ),
                    ],
                ),
            ),
            twin=(
                call(
                    request(),
                    [
                        metadata_message(blocks(0, 4096), "VARIABLE_LENGTH"),
                        metadata_message(
                            [
                                {"byte_offset": 8192, "size_bytes": 1},
                                {"byte_offset": 12288, "size_bytes": 10},
                            ],
                            "VARIABLE_LENGTH",
                        ),
                    ],
                ),
            ),
            party="plugin",
            why="the second tuple of the stream has no size_bytes",
        )

    offset_ids = {
        "GetMetadataAllocated": (
            "Special-considerations-for-processing-a-snapshot-metadata-gRPC-stream.4",
            "GetMetadataAllocated.3",
            "GetMetadataAllocated.9",
        ),
        "GetMetadataDelta": ("GetMetadataDelta.4", "GetMetadataDelta.10"),
    }[rpc]
    # A first tuple that ends exactly at starting_offset holds none of the requested bytes.
    case(
        offset_ids,
        "csi.metadata-offset",
        breach=(call(request(start=8192), [metadata_message(blocks(4096, 8192, 12288))]),),
        twin=(call(request(start=8192), [metadata_message(blocks(8192, 12288))]),),
        party="plugin",
        variant="ends-at-start",
    )
    # The first range may start before starting_offset if it reaches past it.
    case(
        offset_ids,
        "csi.metadata-offset",
        breach=(
            call(
                request(start=8192),
                [metadata_message([{"byte_offset": 0, "size_bytes": 8192}], "VARIABLE_LENGTH")],
            ),
        ),
        twin=(
            call(
                request(start=8192),
                [metadata_message([{"byte_offset": 0, "size_bytes": 8193}], "VARIABLE_LENGTH")],
            ),
        ),
        party="plugin",
        variant="straddles-start",
    )

    # At starting_offset 0 too: a range at a negative byte_offset may end before it.
    case(
        offset_ids,
        "csi.metadata-offset",
        breach=(
            call(
                request(),
                [metadata_message([{"byte_offset": -8192, "size_bytes": 4096}, *blocks(0)])],
            ),
        ),
        twin=(call(request(), [metadata_message(blocks(0, 4096))]),),
        party="plugin",
        variant="negative-at-zero",
    )
    capacity_id = {"GetMetadataAllocated": "GetMetadataAllocated.7"}.get(rpc, "GetMetadataDelta.8")
    case(
        (capacity_id,),
        "csi.required-field",
        breach=(
            call(
                request(),
                [
                    metadata_message(blocks(0), capacity=0),
                    metadata_message(blocks(4096), capacity=0),
                ],
            ),
        ),
        twin=(call(request(), [metadata_message(blocks(0)), metadata_message(blocks(4096))]),),
        party="plugin",
        why="no volume_capacity_bytes (0, which no volume has)",
    )

    restart_id = {"GetMetadataAllocated": "GetMetadataAllocated.2"}.get(rpc, "GetMetadataDelta.3")
    # A complete stream ended at 16384; resuming past it skips no range received.
    case(
        (restart_id,),
        "csi.metadata-restart-offset",
        breach=(
            call(request(), [metadata_message(blocks(0, 4096)), metadata_message(blocks(12288))]),
            call(request(start=20480), [metadata_message([])]),
        ),
        twin=(
            call(request(), [metadata_message(blocks(0, 4096)), metadata_message(blocks(12288))]),
            call(request(start=16384), [metadata_message([])]),
        ),
        party="co",
        why="the resumed offset is past the end of the last range the stream sent",
        variant="past-end",
    )
    case(
        (restart_id,),
        "csi.metadata-restart-offset",
        breach=(
            call(request(), [metadata_message(blocks(0))], error=BROKEN),
            call(request(start=CAPACITY + 4096), [metadata_message([])]),
        ),
        twin=(
            call(request(), [metadata_message(blocks(0))], error=BROKEN),
            call(request(start=4096), [metadata_message(blocks(4096))]),
        ),
        party="co",
        why="an interrupted stream resumed past the volume's capacity it reported",
        variant="past-capacity",
    )

    fixed_id, types_id, max_id, order_id, across_id = {
        "GetMetadataAllocated": (
            "GetMetadataAllocated.5",
            "GetMetadataAllocated.6",
            "GetMetadataAllocated.8",
            "GetMetadataAllocated.10",
            "GetMetadataAllocated.11",
        ),
        "GetMetadataDelta": (
            "GetMetadataDelta.6",
            "GetMetadataDelta.7",
            "GetMetadataDelta.9",
            "GetMetadataDelta.11",
            "GetMetadataDelta.12",
        ),
    }[rpc]
    case(
        (fixed_id,),
        "csi.metadata-fixed-length",
        breach=(
            call(
                request(),
                [
                    metadata_message(blocks(0, 4096)),
                    metadata_message(blocks(8192) + blocks(16384, size=8192)),
                ],
            ),
        ),
        twin=(
            call(
                request(),
                [
                    metadata_message(blocks(0, 4096), "VARIABLE_LENGTH"),
                    metadata_message(blocks(8192) + blocks(16384, size=8192), "VARIABLE_LENGTH"),
                ],
            ),
        ),
        party="plugin",
        why="a FIXED_LENGTH stream whose second message holds a tuple of another size; the twin"
        " says VARIABLE_LENGTH",
    )
    case(
        (types_id,),
        "csi.required-field",
        breach=(call(request(), [metadata_message(blocks(0), "UNKNOWN")]),),
        twin=(call(request(), [metadata_message(blocks(0))]),),
        party="plugin",
        why="UNKNOWN is the enum's unset value",
    )
    case(
        (max_id,),
        "csi.metadata-max-results",
        breach=(
            call(
                request(max_results=2),
                [metadata_message(blocks(0, 4096)), metadata_message(blocks(8192, 12288, 16384))],
            ),
        ),
        twin=(
            call(
                request(max_results=3),
                [metadata_message(blocks(0, 4096)), metadata_message(blocks(8192, 12288, 16384))],
            ),
        ),
        party="plugin",
    )
    case(
        (order_id,),
        "csi.metadata-order",
        breach=(call(request(), [metadata_message(blocks(0, 8192, 4096))]),),
        twin=(call(request(), [metadata_message(blocks(0, 4096, 8192))]),),
        party="plugin",
    )
    case(
        (order_id, across_id),
        "csi.metadata-order",
        breach=(
            call(
                request(),
                [
                    metadata_message([{"byte_offset": 0, "size_bytes": 8192}], "VARIABLE_LENGTH"),
                    metadata_message(blocks(4096), "VARIABLE_LENGTH"),
                ],
            ),
        ),
        twin=(
            call(
                request(),
                [
                    metadata_message([{"byte_offset": 0, "size_bytes": 4096}], "VARIABLE_LENGTH"),
                    metadata_message(blocks(4096), "VARIABLE_LENGTH"),
                ],
            ),
        ),
        party="plugin",
        why="the range of the second message starts inside the range of the first",
    )

for sid, rpc, request in (
    ("GetMetadataAllocated.1", "GetMetadataAllocated", {"starting_offset": 0}),
    ("GetMetadataDelta.1", "GetMetadataDelta", {"target_snapshot_id": "snap-2"}),
    ("GetMetadataDelta.2", "GetMetadataDelta", {"base_snapshot_id": "snap-1"}),
):
    good = allocated_request() if rpc == "GetMetadataAllocated" else delta_request()
    case(
        (sid,),
        "csi.required-field",
        breach=(Step(rpc, request, answer=[metadata_message(blocks(0))]),),
        twin=(Step(rpc, good, answer=[metadata_message(blocks(0))]),),
        party="co",
    )

# -- §Connectivity ----------------------------------------------------------------------------

case(
    ("Connectivity.3",),
    "csi.unimplemented-advertised",
    breach=(Step("Probe", error=("UNIMPLEMENTED", "no probe")),),
    twin=(Step("Probe", answer={"ready": {"value": True}}),),
    party="plugin",
)
case(
    ("Connectivity.6",),
    "csi.unimplemented-advertised",
    breach=(Step("ControllerGetCapabilities", error=("UNIMPLEMENTED", "elsewhere")),),
    twin=(
        Step(
            "ControllerGetCapabilities",
            answer={"capabilities": [{"rpc": {"type": "CREATE_DELETE_VOLUME"}}]},
        ),
    ),
    party="plugin",
    why="the plugin advertises the controller service but this endpoint does not serve it",
)
case(
    ("Connectivity.6",),
    "csi.unimplemented-advertised",
    breach=(Step("GetMetadataDelta", delta_request(), error=("UNIMPLEMENTED", "elsewhere")),),
    twin=(Step("GetMetadataDelta", delta_request(), answer=[metadata_message(blocks(0))]),),
    background=v1_background(plugin=("CONTROLLER_SERVICE", "SNAPSHOT_METADATA_SERVICE")),
    party="plugin",
    why="the plugin advertises the snapshot metadata service but this endpoint does not serve it",
    variant="snapshot-metadata",
)

MISMATCH = ("INVALID_ARGUMENT", "snapshot_ids are not the group's members")
for sid, rpc, answer in (
    ("DeleteVolumeGroupSnapshot-Errors.5", "DeleteVolumeGroupSnapshot", {}),
    ("GetVolumeGroupSnapshot-Errors.5", "GetVolumeGroupSnapshot", {"group_snapshot": group()}),
):
    wrong = group_ref(snapshot_ids=["group-1-snap-1", "group-1-snap-9"])
    case(
        (sid,),
        "csi.retry-advised-unchanged",
        breach=(Step(rpc, wrong, error=MISMATCH), Step(rpc, wrong, error=MISMATCH)),
        twin=(Step(rpc, wrong, error=MISMATCH), Step(rpc, group_ref(), answer=answer)),
        background=group_background(),
        party="co",
        why="the same snapshot_ids re-sent after the plugin answered them a mismatch",
    )
