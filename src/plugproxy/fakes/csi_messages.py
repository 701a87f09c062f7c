"""Conversions between CSI messages (v1 and v0 share these shapes) and the model types."""

from __future__ import annotations

from collections.abc import Iterable

from plugproxy.fakes.common import DynMessage, enum_name, has_descriptor_field, invalid
from plugproxy.fakes.csi_model import MODES, Capability, TopologyRequirement


def parse_capability(msg: DynMessage, where: str, modes: Iterable[str] = MODES) -> Capability:
    """A VolumeCapability; INVALID_ARGUMENT when it is malformed or names an unknown mode."""
    kind = msg.WhichOneof("access_type")
    if kind is None:
        raise invalid(f"{where}: access_type (block or mount) is required")
    mode = enum_name(msg.access_mode, "mode")
    if mode == "UNKNOWN":
        raise invalid(f"{where}: access_mode.mode is required")
    if mode not in set(modes):
        raise invalid(f"{where}: access mode {mode} is not supported")
    if kind == "block":
        return Capability("block", mode)
    mount = msg.mount
    group = mount.volume_mount_group if has_descriptor_field(mount, "volume_mount_group") else ""
    return Capability("mount", mode, mount.fs_type, tuple(mount.mount_flags), group)


def parse_capabilities(msgs: Iterable[DynMessage], where: str) -> list[Capability]:
    return [parse_capability(m, f"{where}[{i}]") for i, m in enumerate(msgs)]


def optional_capability(msg: DynMessage, field: str) -> Capability | None:
    return parse_capability(getattr(msg, field), field) if msg.HasField(field) else None


def capacity_range(msg: DynMessage, field: str = "capacity_range") -> tuple[int, int] | None:
    if not msg.HasField(field):
        return None
    cr = getattr(msg, field)
    return int(cr.required_bytes), int(cr.limit_bytes)


def declared_map(msg: DynMessage, field: str) -> dict[str, str]:
    """A map field's entries; empty where this version's message has no such field."""
    return dict(getattr(msg, field)) if has_descriptor_field(msg, field) else {}


def topology_requirement(msg: DynMessage) -> TopologyRequirement | None:
    if not msg.HasField("accessibility_requirements"):
        return None
    req = msg.accessibility_requirements
    return TopologyRequirement(
        tuple(dict(t.segments) for t in req.requisite),
        tuple(dict(t.segments) for t in req.preferred),
    )
