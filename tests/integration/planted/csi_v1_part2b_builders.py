"""Requests and answers for the CSI v1.12 node statistics, node info, node expansion, group
snapshot and snapshot metadata cases (dicts for harness.Step; no cases here)."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import RWO, v1_background

VOLUME = "vol-1"
OTHER_VOLUME = "vol-2"
TARGET = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pv-1/mount"
STAGING = "/var/lib/kubelet/plugins/kubernetes.io/csi/example.com/abc/globalmount"
GIB = 1 << 30

GROUP_CAP = "CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT"
GROUP_ID = "group-1"
SECRETS = {"user": "admin", "password": "one"}
ROTATED = {"user": "admin", "password": "two"}
CREATED_AT = {"seconds": 1_700_000_000}


def stats_request(volume: str = VOLUME) -> dict[str, Any]:
    return {"volume_id": volume, "volume_path": TARGET}


def usage(**overrides: Any) -> dict[str, Any]:
    """A VolumeUsage in bytes, fields replaced by ``overrides``."""
    return {"available": 6 * GIB, "total": 10 * GIB, "used": 4 * GIB, "unit": "BYTES", **overrides}


HEALTHY = {"abnormal": False, "message": "volume is healthy"}


def stats_answer(
    usages: list[dict[str, Any]] | None = None, condition: dict[str, Any] | None = HEALTHY
) -> dict[str, Any]:
    out: dict[str, Any] = {"usage": usages if usages is not None else [usage()]}
    if condition is not None:
        out["volume_condition"] = condition
    return out


def node_background(*node: str, controller: tuple[str, ...] = ()) -> dict[str, Any]:
    """A node plugin's capabilities (its identity lists the controller service as well)."""
    return v1_background(controller=controller or ("CREATE_DELETE_VOLUME",), node=node)


def expand_request(
    volume: str = VOLUME, required: int = 2 * GIB, staging: str | None = STAGING
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "volume_id": volume,
        "volume_path": TARGET,
        "capacity_range": {"required_bytes": required},
        "volume_capability": RWO,
    }
    if staging is not None:
        out["staging_target_path"] = staging
    return out


def stage_request(volume: str = VOLUME) -> dict[str, Any]:
    return {"volume_id": volume, "staging_target_path": STAGING, "volume_capability": RWO}


def unstage_request(volume: str = VOLUME) -> dict[str, Any]:
    return {"volume_id": volume, "staging_target_path": STAGING}


def publish_request(volume: str = VOLUME) -> dict[str, Any]:
    return {"volume_id": volume, "target_path": TARGET, "volume_capability": RWO}


def unpublish_request(volume: str = VOLUME) -> dict[str, Any]:
    return {"volume_id": volume, "target_path": TARGET}


# -- group snapshots -----------------------------------------------------------------------


def group_background(**extra: Any) -> dict[str, Any]:
    """A controller that serves group snapshots (GROUP_CONTROLLER_SERVICE and its RPCs)."""
    return v1_background(
        plugin=("CONTROLLER_SERVICE", "GROUP_CONTROLLER_SERVICE"),
        controller=("CREATE_DELETE_VOLUME", "CREATE_DELETE_SNAPSHOT"),
        group=(GROUP_CAP,),
        **extra,
    )


def member(index: int, group: str = GROUP_ID, ready: bool = True) -> dict[str, Any]:
    return {
        "snapshot_id": f"{group}-snap-{index}",
        "source_volume_id": f"vol-{index}",
        "creation_time": CREATED_AT,
        "ready_to_use": ready,
        "group_snapshot_id": group,
        "size_bytes": GIB,
    }


def group(
    group_id: str = GROUP_ID, ready: bool = True, members: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "group_snapshot_id": group_id,
        "snapshots": members
        if members is not None
        else [member(1, group_id, ready), member(2, group_id, ready)],
        "creation_time": CREATED_AT,
        "ready_to_use": ready,
    }


def create_group_request(name: str = "groupsnapshot-1", **extra: Any) -> dict[str, Any]:
    return {"name": name, "source_volume_ids": ["vol-1", "vol-2"], **extra}


def member_ids(group_id: str = GROUP_ID) -> list[str]:
    return [f"{group_id}-snap-1", f"{group_id}-snap-2"]


def group_ref(group_id: str = GROUP_ID, **extra: Any) -> dict[str, Any]:
    """A Delete- or GetVolumeGroupSnapshotRequest naming the group and its members."""
    return {"group_snapshot_id": group_id, "snapshot_ids": member_ids(group_id), **extra}


# -- snapshot metadata -----------------------------------------------------------------------

BLOCK = 4096
CAPACITY = 1 << 20


def blocks(*offsets: int, size: int = BLOCK) -> list[dict[str, Any]]:
    return [{"byte_offset": o, "size_bytes": size} for o in offsets]


def metadata_message(
    tuples: list[dict[str, Any]], style: str = "FIXED_LENGTH", capacity: int = CAPACITY
) -> dict[str, Any]:
    return {
        "block_metadata_type": style,
        "volume_capacity_bytes": capacity,
        "block_metadata": tuples,
    }


def allocated_request(start: int = 0, max_results: int = 0) -> dict[str, Any]:
    return {"snapshot_id": "snap-1", "starting_offset": start, "max_results": max_results}


def delta_request(start: int = 0, max_results: int = 0) -> dict[str, Any]:
    return {
        "base_snapshot_id": "snap-1",
        "target_snapshot_id": "snap-2",
        "starting_offset": start,
        "max_results": max_results,
    }
