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
    publish,
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
