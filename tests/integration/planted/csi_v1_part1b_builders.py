"""Requests and answers for the CSI v1.12 controller cases of csi_v1_part1b (no cases here).

Everything is a dict for harness.Step: valid traffic unless a case changes one field.
"""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import NODE, RWO, v1_background

VOL = "vol-1"
SNAP = "snap-1"
GROUP = "group-1"
WHEN = {"seconds": 1_700_000_000}  # a creation_time
GIB = 1 << 30
STAGING = "/var/lib/kubelet/plugins/kubernetes.io/csi/example/staging/vol-1"

PUBLISH_CAPS = ("PUBLISH_UNPUBLISH_VOLUME",)
SNAPSHOT_CAPS = ("CREATE_DELETE_VOLUME", "CREATE_DELETE_SNAPSHOT")


def controller(*caps: str, plugin: tuple[str, ...] = ("CONTROLLER_SERVICE",)) -> dict[str, Any]:
    """Case.background of a controller plugin advertising ``caps``."""
    return v1_background(plugin=plugin, controller=caps)


def unified(*caps: str, node: tuple[str, ...] = ("STAGE_UNSTAGE_VOLUME",)) -> dict[str, Any]:
    """Case.background of one socket serving controller ``caps`` and a node."""
    return v1_background(controller=caps, node=node)


def create(name: str = "pvc-1", **extra: Any) -> dict[str, Any]:
    """A CreateVolumeRequest."""
    return {"name": name, "volume_capabilities": [RWO], **extra}


def volume(volume_id: str = VOL, **extra: Any) -> dict[str, Any]:
    """A CreateVolumeResponse."""
    return {"volume": {"volume_id": volume_id, "capacity_bytes": GIB, **extra}}


def publish(volume_id: str = VOL, node_id: str = NODE, **extra: Any) -> dict[str, Any]:
    """A ControllerPublishVolumeRequest."""
    return {"volume_id": volume_id, "node_id": node_id, "volume_capability": RWO, **extra}


def unpublish(volume_id: str = VOL, node_id: str = NODE, **extra: Any) -> dict[str, Any]:
    """A ControllerUnpublishVolumeRequest."""
    return {"volume_id": volume_id, "node_id": node_id, **extra}


def stage(volume_id: str = VOL, **extra: Any) -> dict[str, Any]:
    """A NodeStageVolumeRequest."""
    return {
        "volume_id": volume_id,
        "staging_target_path": STAGING,
        "volume_capability": RWO,
        **extra,
    }


def validate(volume_id: str = VOL, **extra: Any) -> dict[str, Any]:
    """A ValidateVolumeCapabilitiesRequest."""
    return {"volume_id": volume_id, "volume_capabilities": [RWO], **extra}


CONFIRMED = {"confirmed": {"volume_capabilities": [RWO]}}
HEALTHY = {"abnormal": False, "message": "volume is healthy"}


def snapshot(
    snapshot_id: str = SNAP, source: str = VOL, ready: bool = True, **extra: Any
) -> dict[str, Any]:
    """A Snapshot message."""
    return {
        "snapshot_id": snapshot_id,
        "source_volume_id": source,
        "creation_time": WHEN,
        "ready_to_use": ready,
        "size_bytes": GIB,
        **extra,
    }


def take(name: str = "snapshot-1", source: str = VOL) -> dict[str, Any]:
    """A CreateSnapshotRequest."""
    return {"source_volume_id": source, "name": name}


def group(
    group_id: str = GROUP, members: tuple[tuple[str, str], ...] = (("snap-a", "vol-a"),)
) -> dict[str, Any]:
    """A CreateVolumeGroupSnapshotResponse whose members are (snapshot id, source volume)."""
    return {
        "group_snapshot": {
            "group_snapshot_id": group_id,
            "snapshots": [snapshot(s, v, group_snapshot_id=group_id) for s, v in members],
            "creation_time": WHEN,
            "ready_to_use": True,
        }
    }


def group_background() -> dict[str, Any]:
    """A plugin serving the group controller beside a snapshotting controller."""
    return v1_background(
        plugin=("CONTROLLER_SERVICE", "GROUP_CONTROLLER_SERVICE"),
        controller=(*SNAPSHOT_CAPS, "GET_SNAPSHOT"),
        group=("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT",),
    )
