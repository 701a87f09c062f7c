"""CSI v1.12 and v0.3 §GetPluginCapabilities (VOLUME_ACCESSIBILITY_CONSTRAINTS): the CO
places a volume's workload on a node the volume is accessible from."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import RWO, rpc_caps, v1_background
from tests.integration.planted.harness import Case, Step

ZONE = "example.com/zone"


def placed(spec: str, node_zone: str) -> tuple[Step, ...]:
    v1 = spec == "csi.v1"
    volume: dict[str, Any] = {
        "volume_id" if v1 else "id": "vol-1",
        "accessible_topology": [{"segments": {ZONE: "z1"}}],
    }
    return (
        Step(
            "NodeGetInfo",
            answer={"node_id": "node-1", "accessible_topology": {"segments": {ZONE: node_zone}}},
        ),
        Step(
            "CreateVolume",
            {
                "name": "pvc-1",
                "volume_capabilities": [RWO],
                "accessibility_requirements": {"requisite": [{"segments": {ZONE: "z1"}}]},
            },
            answer={"volume": volume},
        ),
        Step(
            "NodeStageVolume",
            {"volume_id": "vol-1", "staging_target_path": "/stage/vol-1", "volume_capability": RWO},
        ),
    )


def background(spec: str) -> dict[str, Any]:
    if spec == "csi.v1":
        return v1_background(
            plugin=("CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"),
            node=("STAGE_UNSTAGE_VOLUME",),
        )
    return {
        "GetPluginCapabilities": {
            "capabilities": [
                {"service": {"type": "CONTROLLER_SERVICE"}},
                {"service": {"type": "ACCESSIBILITY_CONSTRAINTS"}},
            ]
        },
        "ControllerGetCapabilities": rpc_caps("CREATE_DELETE_VOLUME"),
        "NodeGetCapabilities": rpc_caps("STAGE_UNSTAGE_VOLUME"),
    }


CASES = [
    Case(
        spec,
        ("GetPluginCapabilities.6",),
        "csi.node-outside-volume-topology",
        breach=placed(spec, "z2"),
        twin=placed(spec, "z1"),
        background=background(spec),
        party="co",
    )
    for spec in ("csi.v1", "csi.v0")
]
