"""CSI v1.12 and v0.3 §CreateVolume, TopologyRequirement: where the volume is accessible
against the requisite topologies (at least one, and the x-versus-n count rules)."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import RWO, v1_background
from tests.integration.planted.harness import Case, Step

OUTSIDE = "csi.topology-outside-requisite"
COUNT = "csi.topology-count"


def zone(z: str, region: str = "R1") -> dict[str, Any]:
    return {"segments": {"example.com/region": region, "example.com/zone": z}}


def background(spec: str) -> dict[str, Any]:
    if spec == "csi.v1":
        return v1_background(plugin=("CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"))
    return {
        "GetPluginCapabilities": {
            "capabilities": [
                {"service": {"type": "CONTROLLER_SERVICE"}},
                {"service": {"type": "ACCESSIBILITY_CONSTRAINTS"}},
            ]
        },
        "ControllerGetCapabilities": {"capabilities": [{"rpc": {"type": "CREATE_DELETE_VOLUME"}}]},
    }


def create(spec: str, requisite: list[str], accessible: list[dict[str, Any]]) -> Step:
    volume: dict[str, Any] = {"accessible_topology": accessible}
    volume["volume_id" if spec == "csi.v1" else "id"] = "vol-1"
    return Step(
        "CreateVolume",
        {
            "name": "pvc-1",
            "volume_capabilities": [RWO],
            "accessibility_requirements": {"requisite": [zone(z) for z in requisite]},
        },
        answer={"volume": volume},
    )


def case(
    spec: str,
    statements: tuple[str, ...],
    rule: str,
    requisite: list[str],
    bad: list[dict[str, Any]],
    good: list[dict[str, Any]],
    why: str,
) -> Case:
    return Case(
        spec,
        statements,
        rule,
        breach=(create(spec, requisite, bad),),
        twin=(create(spec, requisite, good),),
        background=background(spec),
        party="plugin",
        why=why,
    )


def cases(spec: str, ids: dict[str, tuple[str, ...]]) -> list[Case]:
    return [
        case(
            spec,
            ids["single"],
            OUTSIDE,
            ["Z2"],
            [zone("Z3")],
            [zone("Z2")],
            "x == n == 1: the one requisite zone is not the volume's",
        ),
        case(
            spec,
            ids["equal"],
            COUNT,
            ["Z2", "Z3"],
            [zone("Z2"), zone("Z4")],
            [zone("Z2"), zone("Z3")],
            "x == n == 2: one entry is outside requisite, so Z3 is not reached",
        ),
        case(
            spec,
            ids["fewer"],
            COUNT,
            ["Z2", "Z3", "Z4"],
            [zone("Z2"), zone("Z9")],
            [zone("Z2"), zone("Z4")],
            "x < n: one of the two chosen zones is not from requisite",
        ),
        case(
            spec,
            ids["fewer-unique"],
            COUNT,
            ["Z2", "Z3", "Z4"],
            [zone("Z2"), zone("Z2")],
            [zone("Z2"), zone("Z3")],
            "x < n: the two chosen topologies are not unique",
        ),
        case(
            spec,
            ids["more"],
            COUNT,
            ["Z2", "Z3"],
            [zone("Z2"), zone("Z4"), zone("Z5")],
            [zone("Z2"), zone("Z3"), zone("Z5")],
            "x > n: requisite Z3 is not among the volume's topologies",
        ),
        case(
            spec,
            ids["more-single"],
            OUTSIDE,
            ["Z2"],
            [zone("Z3"), zone("Z4")],
            [zone("Z2"), zone("Z4")],
            "x > n == 1: the requisite zone is missing, the second is free",
        ),
    ]


CASES = cases(
    "csi.v1",
    {
        "single": ("CreateVolume.19", "CreateVolume.59", "CreateVolume.63", "CreateVolume.65"),
        "equal": ("CreateVolume.63", "CreateVolume.66"),
        "fewer": ("CreateVolume.19", "CreateVolume.59", "CreateVolume.67", "CreateVolume.69"),
        "fewer-unique": ("CreateVolume.67", "CreateVolume.69"),
        "more": ("CreateVolume.70",),
        "more-single": ("CreateVolume.70", "CreateVolume.72"),
    },
) + cases(
    "csi.v0",
    {
        "single": ("CreateVolume.10", "CreateVolume.38", "CreateVolume.42", "CreateVolume.44"),
        "equal": ("CreateVolume.42", "CreateVolume.45"),
        "fewer": ("CreateVolume.10", "CreateVolume.38", "CreateVolume.46", "CreateVolume.48"),
        "fewer-unique": ("CreateVolume.46", "CreateVolume.48"),
        "more": ("CreateVolume.49",),
        "more-single": ("CreateVolume.49",),
    },
)


def node_info(key: str) -> Step:
    return Step(
        "NodeGetInfo",
        answer={"node_id": "node-1", "accessible_topology": {"segments": {key: "z1"}}},
    )


CASES.append(
    Case(
        "csi.v0",
        ("CreateVolume.60",),
        "csi.topology-key-format",
        breach=(node_info("company/zone"),),
        twin=(node_info("com.company/zone"),),
        background=background("csi.v0"),
        party="plugin",
        why="a key prefix that is one label is no reverse domain name",
    )
)
