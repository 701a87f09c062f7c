"""CSI v1.12 and v0.3: call order judged from this socket's own history, and the answers to
conflicting publications (rules/csi_order.py).

- §NodePublishVolume Errors, "Staging target path not set": a retry with a staging path and
  no successful NodeStageVolume since; §NodeStageVolume: NodePublishVolume at a staging path
  whose last NodeStageVolume failed.
- §NodeStageVolume, §NodePublishVolume: staging or publishing on a unified socket before
  ControllerPublishVolume to this node.
- §ControllerUnpublishVolume: a volume not published to the node answered with an error.
- §ControllerPublishVolume Errors: retries after FAILED_PRECONDITION and RESOURCE_EXHAUSTED
  with no unpublish since.
- §ControllerPublishVolume Errors: a FAILED_PRECONDITION message that does not name the node.

The controller-side cases start with a ControllerPublishVolume of another volume: the rules
judge only while the attacher's calls pass through this socket since the memory they use was
made (no HA replica can have led in between).
"""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import NODE, OTHER_NODE, RWO, v1_background
from tests.integration.planted.harness import Case, Step

STAGING = "/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pv-1/globalmount"
TARGET = "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount"
VOL = "vol-1"
EARLIER = "vol-0"  # another volume, published first: the attacher's calls pass here

_CONTROLLER = ("CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME")
_NODE = ("STAGE_UNSTAGE_VOLUME",)


def _background(spec: str) -> dict[str, Any]:
    # The capability answers have the same shape in v0.3 and v1.12.
    return v1_background(controller=_CONTROLLER, node=_NODE)


def _volume(spec: str, vid: str = VOL) -> dict[str, Any]:
    return {"volume": {("volume_id" if spec == "csi.v1" else "id"): vid}}


def _create(spec: str, name: str = "pvc-1", vid: str = VOL) -> Step:
    return Step("CreateVolume", {"name": name, "volume_capabilities": [RWO]}, _volume(spec, vid))


def _publish(
    vid: str = VOL, node: str = NODE, error: tuple[str, str] | None = None, wait: float = 0.0
) -> Step:
    req = {"volume_id": vid, "node_id": node, "volume_capability": RWO}
    return Step("ControllerPublishVolume", req, answer={}, error=error, wait=wait)


def _unpublish(vid: str = VOL, node: str = NODE, error: tuple[str, str] | None = None) -> Step:
    return Step("ControllerUnpublishVolume", {"volume_id": vid, "node_id": node}, error=error)


def _stage(error: tuple[str, str] | None = None) -> Step:
    req = {"volume_id": VOL, "staging_target_path": STAGING, "volume_capability": RWO}
    return Step("NodeStageVolume", req, error=error)


def _node_publish(staging: bool = True, error: tuple[str, str] | None = None) -> Step:
    req: dict[str, Any] = {"volume_id": VOL, "target_path": TARGET, "volume_capability": RWO}
    if staging:
        req["staging_target_path"] = STAGING
    return Step("NodePublishVolume", req, error=error)


_NODE_INFO = Step("NodeGetInfo", answer={"node_id": NODE})
_NOT_SET = ("FAILED_PRECONDITION", "staging_target_path is not set")
_ELSEWHERE = ("FAILED_PRECONDITION", f"volume is published to node {NODE}")
_FULL = ("RESOURCE_EXHAUSTED", f"node {OTHER_NODE} has no free attachment slot")


def _node_cases(spec: str, path_row: str) -> list[Case]:
    """Retried with a staging path or at a staging path whose last stage failed."""
    bg = _background(spec)
    return [
        Case(
            spec,
            (path_row,),
            "csi.call-order",
            breach=(_node_publish(staging=False, error=_NOT_SET), _node_publish()),
            twin=(_node_publish(staging=False, error=_NOT_SET), _stage(), _node_publish()),
            background=bg,
            party="co",
            why="retried with a staging path after the plugin said it was not set, never staged",
        ),
        Case(
            spec,
            ("NodeStageVolume.5",),
            "csi.call-order",
            breach=(_stage(error=("INTERNAL", "mount failed")), _node_publish()),
            twin=(_stage(error=("INTERNAL", "mount failed")), _stage(), _node_publish()),
            background=bg,
            party="co",
            why="published at a staging path whose last NodeStageVolume failed",
        ),
    ]


def _stage_cases(spec: str) -> list[Case]:
    """Staged or published before ControllerPublishVolume on a unified socket."""
    bg = _background(spec)
    return [
        Case(
            spec,
            ("NodeStageVolume.4",),
            "csi.call-order",
            breach=(_publish(EARLIER), _create(spec), _NODE_INFO, _stage()),
            twin=(_publish(EARLIER), _create(spec), _publish(), _NODE_INFO, _stage()),
            background=bg,
            party="co",
            why="unified socket: staged on this node before ControllerPublishVolume to it",
        ),
        Case(
            spec,
            ("NodePublishVolume.2",),
            "csi.call-order",
            breach=(_publish(EARLIER), _create(spec), _NODE_INFO, _node_publish(staging=False)),
            twin=(
                _publish(EARLIER),
                _create(spec),
                _publish(),
                _NODE_INFO,
                _node_publish(staging=False),
            ),
            background=v1_background(controller=_CONTROLLER),  # no STAGE_UNSTAGE_VOLUME
            party="co",
            why="unified socket: published on this node before ControllerPublishVolume to it",
        ),
    ]


def _unpublish_cases(spec: str) -> list[Case]:
    """ControllerUnpublishVolume of a volume not published to the node."""
    bg = _background(spec)
    return [
        Case(
            spec,
            ("ControllerUnpublishVolume.6",),
            "csi.unpublish-not-published-refused",
            breach=(
                _publish(EARLIER),
                _create(spec),
                _unpublish(error=("INTERNAL", "detach failed")),
            ),
            twin=(_publish(EARLIER), _create(spec), _unpublish()),
            background=bg,
            party="plugin",
            why="the volume, created here, was never published to the node",
        ),
    ]


def _retry_cases(spec: str) -> list[Case]:
    """ControllerPublishVolume retried with the cause of its refusal not removed."""
    bg = _background(spec)
    return [
        Case(
            spec,
            ("ControllerPublishVolume-Errors.8",),
            "csi.publish-retry-unresolved",
            breach=(
                _publish(node=OTHER_NODE, error=_ELSEWHERE),
                _publish(node=OTHER_NODE, error=_ELSEWHERE, wait=0.2),
            ),
            twin=(
                _publish(node=OTHER_NODE, error=_ELSEWHERE),
                _unpublish(node=NODE),
                _publish(node=OTHER_NODE, wait=0.2),
            ),
            background=bg,
            party="co",
        ),
        Case(
            spec,
            ("ControllerPublishVolume-Errors.9",),
            "csi.publish-retry-unresolved",
            breach=(
                _publish(node=OTHER_NODE, error=_FULL),
                _publish(node=OTHER_NODE, error=_FULL, wait=0.2),
            ),
            twin=(
                _publish(node=OTHER_NODE, error=_FULL),
                _unpublish(EARLIER, node=OTHER_NODE),
                _publish(node=OTHER_NODE, wait=0.2),
            ),
            background=bg,
            party="co",
        ),
    ]


def _message_cases(spec: str) -> list[Case]:
    """FAILED_PRECONDITION not naming the node this socket saw."""
    bg = _background(spec)
    return [
        Case(
            spec,
            ("ControllerPublishVolume-Errors.7",),
            "csi.publish-conflict-node-unnamed",
            breach=(
                _publish(),
                _publish(node=OTHER_NODE, error=("FAILED_PRECONDITION", "volume is in use")),
            ),
            twin=(_publish(), _publish(node=OTHER_NODE, error=_ELSEWHERE)),
            background=bg,
            party="plugin",
        ),
    ]


CASES = [
    *_node_cases("csi.v1", "NodePublishVolume-Errors.6"),
    *_node_cases("csi.v0", "NodePublishVolume-Errors.8"),
    *_stage_cases("csi.v1"),
    *_stage_cases("csi.v0"),
    *_unpublish_cases("csi.v1"),
    *_unpublish_cases("csi.v0"),
    *_retry_cases("csi.v1"),
    *_retry_cases("csi.v0"),
    *_message_cases("csi.v1"),
    *_message_cases("csi.v0"),
]
