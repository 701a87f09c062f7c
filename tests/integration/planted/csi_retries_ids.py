"""CSI v1.12 and v0.3 §Error Scheme and the per-RPC NOT_FOUND rows: planted retries whose
waits do not grow as an exponential back off does (a burst with jitter, the poll of
NodeGetVolumeStats faster than any poll), each with its twin backing off with jitter."""

from __future__ import annotations

from typing import Any

from tests.integration.planted import csi_v0_builders as v0
from tests.integration.planted.csi_builders import v1_background
from tests.integration.planted.csi_v1_part1b_builders import (
    VOL,
    controller,
    create,
    group,
    group_background,
    publish,
    snapshot,
    take,
    volume,
)
from tests.integration.planted.harness import Case, Step

SPEC = "csi.v1"
BG = controller("CREATE_DELETE_VOLUME")
_ABORTED = ("ABORTED", "an operation is pending for this volume")
_GONE = ("NOT_FOUND", "no such volume")
VOLUME_PATH = "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/mount"
# Waits of a burst whose jitter the rule must see through, and of a back off with jitter.
BURST = (0.04, 0.052, 0.045)
BACKING_OFF = (0.03, 0.07, 0.13)


def _series(
    rpc: str, request: dict[str, Any], error: tuple[str, str], waits: tuple[float, ...]
) -> tuple[Step, ...]:
    """The same request refused once, then again after each wait."""
    first = Step(rpc, request, error=error)
    return (first, *(Step(rpc, request, error=error, wait=w) for w in waits))


def _burst(
    spec: str,
    statement: str,
    rpc: str,
    request: dict[str, Any],
    error: tuple[str, str],
    background: dict[str, Any],
    why: str,
    twin_waits: tuple[float, ...] = BACKING_OFF,
    twin_allows: tuple[str, ...] = (),
) -> Case:
    return Case(
        spec,
        (statement,),
        "csi.retry-without-backoff",
        breach=_series(rpc, request, error, BURST),
        twin=_series(rpc, request, error, twin_waits),
        background=background,
        party="co",
        why=why,
        twin_allows=twin_allows,
    )


CASES = [
    Case(
        SPEC,
        ("Error-Scheme.10",),
        "csi.retry-without-backoff",
        breach=(
            *_series("CreateVolume", create(), _ABORTED, BURST),
            Step("CreateVolume", create(), answer=volume(), wait=0.04),
        ),
        twin=(
            *_series("CreateVolume", create(), _ABORTED, BACKING_OFF),
            Step("CreateVolume", create(), answer=volume(), wait=0.25),
        ),
        background=BG,
        party="co",
        why="retried after ABORTED in a burst whose waits jitter by milliseconds without growing",
        variant="jittered-burst",
    ),
    _burst(
        SPEC,
        "ControllerGetVolume-Errors.4",
        "ControllerGetVolume",
        {"volume_id": VOL},
        _GONE,
        controller("GET_VOLUME"),
        "ControllerGetVolume retried after NOT_FOUND in a burst with jitter",
    ),
    _burst(
        SPEC,
        "ControllerModifyVolume-Errors.2",
        "ControllerModifyVolume",
        {"volume_id": VOL, "mutable_parameters": {"iops": "3000"}},
        _GONE,
        controller("MODIFY_VOLUME"),
        "ControllerModifyVolume retried after NOT_FOUND in a burst with jitter",
    ),
    _burst(
        SPEC,
        "NodeGetVolumeStats-Errors.4",
        "NodeGetVolumeStats",
        {"volume_id": VOL, "volume_path": VOLUME_PATH},
        _GONE,
        v1_background(plugin=(), controller=(), node=("GET_VOLUME_STATS",)),
        "NodeGetVolumeStats re-sent after NOT_FOUND faster than any poll, without growing",
    ),
    _burst(
        SPEC,
        "NodeExpandVolume-Errors.1",
        "NodeExpandVolume",
        {"volume_id": VOL, "volume_path": VOLUME_PATH},
        _GONE,
        v1_background(plugin=(), controller=(), node=("EXPAND_VOLUME",)),
        "NodeExpandVolume retried after NOT_FOUND in a burst with jitter",
    ),
    _burst(
        v0.SPEC,
        "NodeStageVolume-Errors.4",
        "NodeStageVolume",
        v0.stage(),
        _GONE,
        v0.STAGED,
        "NodeStageVolume retried after NOT_FOUND in a burst with jitter",
    ),
]

# The RESOURCE_EXHAUSTED rows asking for exponential back off (CSI v1.12 and v0.3
# §CreateVolume and §ControllerPublishVolume errors). A backed-off publish retry with no
# slot seen freed is still csi.publish-retry-unresolved's to report, as advice.
_FULL = ("RESOURCE_EXHAUSTED", "no capacity left in the requested topology")
_NODE_FULL = ("RESOURCE_EXHAUSTED", "the node has its maximum of volumes attached")
_UNRESOLVED = ("csi.publish-retry-unresolved",)
CASES += [
    _burst(
        SPEC,
        "CreateVolume-Errors.10",
        "CreateVolume",
        create(),
        _FULL,
        BG,
        "CreateVolume retried after RESOURCE_EXHAUSTED in a burst with jitter",
    ),
    _burst(
        SPEC,
        "ControllerPublishVolume-Errors.9",
        "ControllerPublishVolume",
        publish(),
        _NODE_FULL,
        controller("PUBLISH_UNPUBLISH_VOLUME"),
        "ControllerPublishVolume retried after RESOURCE_EXHAUSTED in a burst with jitter",
        twin_allows=_UNRESOLVED,
    ),
    _burst(
        v0.SPEC,
        "CreateVolume-Errors.5",
        "CreateVolume",
        v0.create(),
        _FULL,
        v0.background(),
        "CreateVolume retried after RESOURCE_EXHAUSTED in a burst with jitter",
    ),
    _burst(
        v0.SPEC,
        "ControllerPublishVolume-Errors.9",
        "ControllerPublishVolume",
        v0.publish(),
        _NODE_FULL,
        v0.background(),
        "ControllerPublishVolume retried after RESOURCE_EXHAUSTED in a burst with jitter",
        twin_allows=_UNRESOLVED,
    ),
]


# -- idempotency beyond byte-identical repeats, and ids naming one object -------------------
# (CSI v1.12 §CreateVolume, §CreateSnapshot, §CreateVolumeGroupSnapshot and their id fields)
SNAPSHOTS = controller("CREATE_DELETE_SNAPSHOT")
GROUPS = group_background()
PAIR = (("snap-a", "vol-a"), ("snap-b", "vol-b"))
OTHER_PAIR = (("snap-a2", "vol-a"), ("snap-b2", "vol-b"))
ROTATED = {"token": "rotated"}


def _group_request(name: str, sources: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "source_volume_ids": sources, **extra}


def _snap(name: str, source: str, **extra: Any) -> dict[str, Any]:
    return {**take(name, source), **extra}


def _twice(
    statement: str,
    rule: str,
    rpc: str,
    first: tuple[dict[str, Any], dict[str, Any]],
    second: dict[str, Any],
    breach_answer: dict[str, Any],
    background: dict[str, Any],
    why: str,
    variant: str = "",
) -> Case:
    """A create answered, then ``second`` answered as the first (twin) or otherwise."""
    return Case(
        SPEC,
        (statement,),
        rule,
        breach=(Step(rpc, first[0], answer=first[1]), Step(rpc, second, answer=breach_answer)),
        twin=(Step(rpc, first[0], answer=first[1]), Step(rpc, second, answer=first[1])),
        background=background,
        party="plugin",
        why=why,
        variant=variant,
    )


CASES += [
    _twice(
        "CreateVolumeGroupSnapshot.4",
        "csi.create-not-idempotent",
        "CreateVolumeGroupSnapshot",
        (_group_request("group-pvc", ["vol-a", "vol-b"]), group("group-1", PAIR)),
        _group_request("group-pvc", ["vol-b", "vol-a"]),
        group("group-2", OTHER_PAIR),
        GROUPS,
        "the same group repeated with its sources in another order answered a second group",
        variant="sources-reordered",
    ),
    Case(
        SPEC,
        ("CreateVolumeGroupSnapshot.4",),
        "csi.create-not-idempotent",
        breach=(
            Step(
                "CreateVolumeGroupSnapshot",
                _group_request("group-pvc", ["vol-a", "vol-b"]),
                answer=group("group-1", PAIR),
            ),
            Step(
                "CreateVolumeGroupSnapshot",
                _group_request("group-pvc", ["vol-b", "vol-a"], secrets=ROTATED),
                answer=group("group-2", OTHER_PAIR),
            ),
        ),
        twin=(
            Step(
                "CreateVolumeGroupSnapshot",
                _group_request("group-pvc", ["vol-a", "vol-b"]),
                answer=group("group-1", PAIR),
            ),
            Step(
                "DeleteVolumeGroupSnapshot",
                {"group_snapshot_id": "group-1", "snapshot_ids": ["snap-a", "snap-b"]},
                answer={},
            ),
            Step(
                "CreateVolumeGroupSnapshot",
                _group_request("group-pvc", ["vol-b", "vol-a"], secrets=ROTATED),
                answer=group("group-2", OTHER_PAIR),
            ),
        ),
        background=GROUPS,
        party="plugin",
        why="the same group repeated with rotated secrets answered a second group, the first not deleted",
        variant="secrets-rotated",
    ),
    _twice(
        "CreateSnapshot.2",
        "csi.create-not-idempotent",
        "CreateSnapshot",
        (
            _snap("snapshot-1", VOL, parameters={"a": "1", "b": "2"}),
            {"snapshot": snapshot("snap-1")},
        ),
        _snap("snapshot-1", VOL, parameters={"b": "2", "a": "1"}, secrets=ROTATED),
        {"snapshot": snapshot("snap-2")},
        SNAPSHOTS,
        "the same snapshot repeated with other secrets and its parameters reordered answered another snapshot",
        variant="secrets-and-map-order",
    ),
    _twice(
        "CreateVolume.2",
        "csi.create-not-idempotent",
        "CreateVolume",
        (create(), volume()),
        create(secrets={"password": "rotated"}),
        volume("vol-2"),
        BG,
        "the same volume repeated with rotated secrets answered a second volume",
        variant="secrets-rotated",
    ),
    Case(
        SPEC,
        ("The-ready-to-use-Parameter.12",),
        "csi.id-reused",
        breach=(
            Step(
                "CreateSnapshot",
                take("snapshot-1", VOL),
                answer={"snapshot": snapshot("snap-1", VOL)},
            ),
            Step(
                "CreateSnapshot",
                take("snapshot-2", "vol-2"),
                answer={"snapshot": snapshot("snap-1", "vol-2")},
            ),
        ),
        twin=(
            Step(
                "CreateSnapshot",
                take("snapshot-1", VOL),
                answer={"snapshot": snapshot("snap-1", VOL)},
            ),
            Step(
                "CreateSnapshot",
                take("snapshot-2", "vol-2"),
                answer={"snapshot": snapshot("snap-2", "vol-2")},
            ),
        ),
        background=SNAPSHOTS,
        party="plugin",
        why="two snapshots of other names and sources answered one snapshot_id",
    ),
    Case(
        SPEC,
        ("CreateVolumeGroupSnapshot.16",),
        "csi.id-reused",
        breach=(
            Step(
                "CreateVolumeGroupSnapshot",
                _group_request("group-1", ["vol-a", "vol-b"]),
                answer=group("group-1", PAIR),
            ),
            Step(
                "CreateVolumeGroupSnapshot",
                _group_request("group-2", ["vol-c"]),
                answer=group("group-1", (("snap-c", "vol-c"),)),
            ),
        ),
        twin=(
            Step(
                "CreateVolumeGroupSnapshot",
                _group_request("group-1", ["vol-a", "vol-b"]),
                answer=group("group-1", PAIR),
            ),
            Step(
                "CreateVolumeGroupSnapshot",
                _group_request("group-2", ["vol-c"]),
                answer=group("group-2", (("snap-c", "vol-c"),)),
            ),
        ),
        background=GROUPS,
        party="plugin",
        why="two group snapshots of other names and sources answered one group_snapshot_id",
    ),
    Case(
        SPEC,
        ("CreateVolume.48",),
        "csi.volume-id-reused",
        breach=(
            Step("CreateVolume", create("pvc-1"), answer=volume("vol-1")),
            Step("CreateVolume", create("pvc-2"), answer=volume("vol-1")),
        ),
        twin=(
            Step("CreateVolume", create("pvc-1"), answer=volume("vol-1")),
            Step("CreateVolume", create("pvc-2"), answer=volume("vol-2")),
        ),
        background=BG,
        party="plugin",
        why="two volumes of other names answered one volume_id, no delete between",
    ),
]


# -- a snapshot listed after its delete answered OK (§ListSnapshots) -------------------------
def _listed_after_delete(spec: str, entry: dict[str, Any], background: dict[str, Any]) -> Case:
    delete = Step("DeleteSnapshot", {"snapshot_id": "snap-1"}, answer={})
    return Case(
        spec,
        ("ListSnapshots.2",),
        "csi.deleted-snapshot-listed",
        breach=(delete, Step("ListSnapshots", {}, answer={"entries": [entry]})),
        twin=(delete, Step("ListSnapshots", {}, answer={"entries": []})),
        background=background,
        party="plugin",
        why="a snapshot whose DeleteSnapshot answered OK just before is still listed",
    )


CASES += [
    _listed_after_delete(
        SPEC,
        {"snapshot": snapshot("snap-1")},
        controller("CREATE_DELETE_SNAPSHOT", "LIST_SNAPSHOTS"),
    ),
    _listed_after_delete(v0.SPEC, v0.snapshot("snap-1"), v0.background()),
]


# CSI v0.3: the same repeats, its secrets fields named per RPC.
def _v0_twice(statement: str, rpc: str, first: Any, second: Any, answer: Any, why: str) -> Case:
    return Case(
        v0.SPEC,
        (statement,),
        "csi.create-not-idempotent",
        breach=(Step(rpc, first[0], answer=first[1]), Step(rpc, second, answer=answer)),
        twin=(Step(rpc, first[0], answer=first[1]), Step(rpc, second, answer=first[1])),
        background=v0.background(),
        party="plugin",
        why=why,
        variant="secrets-rotated",
    )


CASES += [
    _v0_twice(
        "CreateVolume.2",
        "CreateVolume",
        (v0.create(), v0.volume()),
        v0.create(controller_create_secrets={"password": "rotated"}),
        v0.volume("vol-2"),
        "the same volume repeated with rotated secrets answered a second volume",
    ),
    _v0_twice(
        "CreateSnapshot.2",
        "CreateSnapshot",
        (v0.snapshot_request(parameters={"a": "1", "b": "2"}), v0.snapshot("snap-1")),
        v0.snapshot_request(parameters={"b": "2", "a": "1"}, create_snapshot_secrets=ROTATED),
        v0.snapshot("snap-2"),
        "the same snapshot repeated with other secrets and its parameters reordered answered"
        " another snapshot",
    ),
]
