"""Workload placement against the volume's topology (rules/csi_placement.py), through the
validate stage driven call by call."""

from __future__ import annotations

import pytest

from tests import csi_harness as harness
from tests.csi_harness import RWO, Proxy

RULE = "csi.node-outside-volume-topology"
REGION, ZONE = "example.com/region", "example.com/zone"


@pytest.fixture(autouse=True)
def _judged_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {RULE})


def stage(p: Proxy, vid: str = "vol-1") -> set[str]:
    req = {"volume_id": vid, "staging_target_path": f"/stage/{vid}", "volume_capability": RWO}
    return p.ids("NodeStageVolume", req)


def volume(p: Proxy, vid: str, *topologies: dict[str, str]) -> None:
    p.create(vid, name=vid, volume={"accessible_topology": [{"segments": t} for t in topologies]})


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_a_volume_staged_on_a_node_it_is_not_accessible_from_is_found(spec: str) -> None:
    p = Proxy(spec)
    volume(p, "vol-1", {REGION: "r1", ZONE: "z1"})  # before the node is known: still judged
    p.call(
        "NodeGetInfo",
        {},
        {"node_id": "node-1", "accessible_topology": {"segments": {REGION: "r1", ZONE: "z2"}}},
    )
    assert RULE in stage(p)
    assert "none of the 1 accessible topologies" in p.messages()
    volume(p, "vol-2", {REGION: "r1", ZONE: "z1"}, {REGION: "r1", ZONE: "z2"})
    assert RULE not in stage(p, "vol-2")  # one of them reaches the node
    volume(p, "vol-3", {REGION: "r1"})
    assert RULE not in stage(p, "vol-3")  # a regional volume reaches every zone of it
    assert RULE not in stage(p, "vol-9")  # made elsewhere: a split deployment's node socket


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_without_the_node_topology_nothing_is_judged(spec: str) -> None:
    p = Proxy(spec)
    volume(p, "vol-1", {ZONE: "z1"})
    assert RULE not in stage(p)
