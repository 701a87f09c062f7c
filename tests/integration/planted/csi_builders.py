"""Messages and capability answers the CSI tables share (dicts for harness.Step)."""

from __future__ import annotations

from typing import Any

RWO: dict[str, Any] = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
RWX: dict[str, Any] = {"mount": {}, "access_mode": {"mode": "MULTI_NODE_MULTI_WRITER"}}
NODE = "node-1"
OTHER_NODE = "node-2"


def plugin_caps(*services: str) -> dict[str, Any]:
    """A GetPluginCapabilitiesResponse advertising ``services`` (CONTROLLER_SERVICE, ...)."""
    return {"capabilities": [{"service": {"type": s}} for s in services]}


def rpc_caps(*rpcs: str) -> dict[str, Any]:
    """A Controller-, Node- or GroupControllerGetCapabilitiesResponse advertising ``rpcs``."""
    return {"capabilities": [{"rpc": {"type": r}} for r in rpcs]}


def v1_background(
    plugin: tuple[str, ...] = ("CONTROLLER_SERVICE",),
    controller: tuple[str, ...] = ("CREATE_DELETE_VOLUME",),
    node: tuple[str, ...] = (),
    group: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Answers to the proxy's own capability queries for csi.v1 (Case.background)."""
    out: dict[str, Any] = {
        "GetPluginCapabilities": plugin_caps(*plugin),
        "ControllerGetCapabilities": rpc_caps(*controller),
        "NodeGetCapabilities": rpc_caps(*node),
    }
    if group is not None:
        out["GroupControllerGetCapabilities"] = rpc_caps(*group)
    return out
