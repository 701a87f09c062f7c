"""CSI v1.12 and v0.3: call order judged from this socket's own history, and the answers to
conflicting publications (rules/csi_order.py).

- §NodePublishVolume Errors, "Staging target path not set": a retry with a staging path and
  no successful NodeStageVolume since; §NodeStageVolume: NodePublishVolume at a staging path
  whose last NodeStageVolume failed.
"""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import RWO, v1_background
from tests.integration.planted.harness import Case, Step

STAGING = "/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pv-1/globalmount"
TARGET = "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount"
VOL = "vol-1"

_CONTROLLER = ("CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME")
_NODE = ("STAGE_UNSTAGE_VOLUME",)


def _background(spec: str) -> dict[str, Any]:
    # The capability answers have the same shape in v0.3 and v1.12.
    return v1_background(controller=_CONTROLLER, node=_NODE)


def _stage(error: tuple[str, str] | None = None) -> Step:
    req = {"volume_id": VOL, "staging_target_path": STAGING, "volume_capability": RWO}
    return Step("NodeStageVolume", req, error=error)


def _node_publish(staging: bool = True, error: tuple[str, str] | None = None) -> Step:
    req: dict[str, Any] = {"volume_id": VOL, "target_path": TARGET, "volume_capability": RWO}
    if staging:
        req["staging_target_path"] = STAGING
    return Step("NodePublishVolume", req, error=error)


_NOT_SET = ("FAILED_PRECONDITION", "staging_target_path is not set")


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


CASES = [
    *_node_cases("csi.v1", "NodePublishVolume-Errors.6"),
    *_node_cases("csi.v0", "NodePublishVolume-Errors.8"),
]
