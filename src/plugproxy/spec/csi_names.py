"""What CSI v0.3 and v1.12 call the fields both versions have (CSI v1.0 renamed them).

The fake plugins and the rule tables write what the two versions share once, in the names
of :class:`CsiNames`; each version is one instance of it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CsiNames:
    volume_id: str  # Volume's id, and a volume content source's
    snapshot_id: str  # Snapshot's id, and a snapshot content source's
    volume_context: str  # Volume's context
    request_context: str  # the volume context as requests pass it back
    publish_context: str  # ControllerPublishVolume's answer, passed on to the node RPCs
    snapshot_created: str  # Snapshot's creation time
    snapshot_ready: str  # whether a Snapshot can be used


# CsiNames field -> (its v0.3 name, its v1.12 name)
_RENAMED = {
    "volume_id": ("id", "volume_id"),
    "snapshot_id": ("id", "snapshot_id"),
    "volume_context": ("attributes", "volume_context"),
    "request_context": ("volume_attributes", "volume_context"),
    "publish_context": ("publish_info", "publish_context"),
    "snapshot_created": ("created_at", "creation_time"),  # int64 ns, then a Timestamp
    "snapshot_ready": ("status", "ready_to_use"),  # a SnapshotStatus READY, then a bool
}

CSI_V0_NAMES = CsiNames(**{field: names[0] for field, names in _RENAMED.items()})
CSI_V1_NAMES = CsiNames(**{field: names[1] for field, names in _RENAMED.items()})
