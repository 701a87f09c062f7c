"""CSI v0.3 (csi.v0) messages and capability answers for the planted table (dicts for
harness.Step). v0.3 names differ from v1: ``Volume.id``, ``attributes``,
``publish_info``, ``Snapshot.id`` with a ``status`` and an int64 ``created_at``."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import plugin_caps, rpc_caps

SPEC = "csi.v0"
RWO: dict[str, Any] = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
RWX: dict[str, Any] = {"mount": {}, "access_mode": {"mode": "MULTI_NODE_MULTI_WRITER"}}
RO: dict[str, Any] = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_READER_ONLY"}}
NODE = "node-1"
VOL = "vol-1"
SNAP = "snap-1"
STAGING = "/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pv-1/globalmount"
TARGET = "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount"
OTHER_TARGET = "/var/lib/kubelet/pods/uid-2/volumes/kubernetes.io~csi/pv-1/mount"
CREATED_AT = 1_700_000_000  # Snapshot.created_at: v0.3 has it as int64 (UNIX seconds)

ALL_CONTROLLER = (
    "CREATE_DELETE_VOLUME",
    "PUBLISH_UNPUBLISH_VOLUME",
    "LIST_VOLUMES",
    "GET_CAPACITY",
    "CREATE_DELETE_SNAPSHOT",
    "LIST_SNAPSHOTS",
)
INFO = {"name": "example.com.plugin", "vendor_version": "0.3.0"}


def background(
    plugin: tuple[str, ...] = ("CONTROLLER_SERVICE",),
    controller: tuple[str, ...] = ALL_CONTROLLER,
    node: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Answers to the proxy's own capability queries for csi.v0 (Case.background)."""
    return {
        "GetPluginCapabilities": plugin_caps(*plugin),
        "ControllerGetCapabilities": rpc_caps(*controller),
        "NodeGetCapabilities": rpc_caps(*node),
    }


STAGED = background(node=("STAGE_UNSTAGE_VOLUME",))
TOPOLOGY = background(plugin=("CONTROLLER_SERVICE", "ACCESSIBILITY_CONSTRAINTS"))


def create(name: str = "pvc-1", **extra: Any) -> dict[str, Any]:
    return {"name": name, "volume_capabilities": [RWO], **extra}


def volume(vid: str = VOL, **extra: Any) -> dict[str, Any]:
    """A CreateVolumeResponse."""
    return {"volume": {"id": vid, **extra}}


def publish(vid: str = VOL, node: str = NODE, **extra: Any) -> dict[str, Any]:
    return {"volume_id": vid, "node_id": node, "volume_capability": RWO, **extra}


def validate(vid: str = VOL, **extra: Any) -> dict[str, Any]:
    return {"volume_id": vid, "volume_capabilities": [RWO], **extra}


def snapshot_request(name: str = "snap-pvc-1", source: str = VOL, **extra: Any) -> dict[str, Any]:
    return {"name": name, "source_volume_id": source, **extra}


def snapshot(sid: str = SNAP, source: str = VOL, **extra: Any) -> dict[str, Any]:
    """A CreateSnapshotResponse of a cut, ready snapshot."""
    snap = {
        "id": sid,
        "source_volume_id": source,
        "created_at": CREATED_AT,
        "status": {"type": "READY"},
        **extra,
    }
    return {"snapshot": snap}


def stage(vid: str = VOL, path: str = STAGING, **extra: Any) -> dict[str, Any]:
    return {"volume_id": vid, "staging_target_path": path, "volume_capability": RWO, **extra}


def unstage(vid: str = VOL, path: str = STAGING) -> dict[str, Any]:
    return {"volume_id": vid, "staging_target_path": path}


def node_publish(vid: str = VOL, target: str = TARGET, **extra: Any) -> dict[str, Any]:
    return {"volume_id": vid, "target_path": target, "volume_capability": RWO, **extra}


def node_unpublish(vid: str = VOL, target: str = TARGET) -> dict[str, Any]:
    return {"volume_id": vid, "target_path": target}


def without(message: dict[str, Any], *names: str) -> dict[str, Any]:
    """``message`` less the fields ``names``."""
    return {k: v for k, v in message.items() if k not in names}
