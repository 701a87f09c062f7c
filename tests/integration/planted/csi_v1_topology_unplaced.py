"""CSI v1.12 §CreateVolume, TopologyRequirement: when the plugin cannot place the volume as
the requisite list asks (x topologies equal to, fewer or more than the n requisite ones) it
must fail the call. The breach answers OK with a placement that breaks the requisite rule
for its x; the twin answers OK with a placement that keeps it."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import RWO, v1_background
from tests.integration.planted.harness import Case, Step

SPEC = "csi.v1"
TOPOLOGY = v1_background(plugin=("CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"))


def zone(name: str) -> dict[str, Any]:
    return {"segments": {"topology.example.com/zone": name}}


def created(
    statement: str, rule: str, requisite: list[str], placed: list[str], kept: list[str], why: str
) -> Case:
    request = {
        "name": "pvc-1",
        "volume_capabilities": [RWO],
        "accessibility_requirements": {"requisite": [zone(z) for z in requisite]},
    }

    def answer(zones: list[str]) -> dict[str, Any]:
        return {"volume": {"volume_id": "vol-1", "accessible_topology": [zone(z) for z in zones]}}

    return Case(
        SPEC,
        (statement,),
        rule,
        breach=(Step("CreateVolume", request, answer=answer(placed)),),
        twin=(Step("CreateVolume", request, answer=answer(kept)),),
        background=TOPOLOGY,
        party="plugin",
        why=why,
    )


CASES = [
    created(
        "CreateVolume.64",
        "csi.topology-count",
        ["z1", "z2"],
        ["z1", "z3"],
        ["z1", "z2"],
        "x = n = 2 yet one of the two zones is outside the requisite list: OK instead of failing",
    ),
    created(
        "CreateVolume.68",
        "csi.topology-count",
        ["z1", "z2", "z3"],
        ["z1", "z4"],
        ["z1", "z3"],
        "x = 2 < n = 3 yet a zone outside the requisite list is chosen: OK instead of failing",
    ),
    created(
        "CreateVolume.71",
        "csi.topology-outside-requisite",
        ["z1"],
        ["z2", "z3"],
        ["z1", "z3"],
        "x = 2 > n = 1 yet the requisite zone is not among them: OK instead of failing",
    ),
]
