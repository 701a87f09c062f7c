"""Where the CO places a volume's workload, against the topologies the plugin gave (CSI
v1.12 and v0.3 §GetPluginCapabilities, VOLUME_ACCESSIBILITY_CONSTRAINTS).

The CO MUST use the accessible_topology CreateVolume returned and the node's own from
NodeGetInfo to make sure a workload lands on a node the volume is accessible from. On a
socket serving controller and node (a unified plugin) both answers pass here, and a
NodeStageVolume or NodePublishVolume of the volume on this node is where the workload
landed: if no topology of the volume agrees with the node's (on every key both hold), the
CO placed it where the volume is not accessible. A node socket of a split deployment never
sees CreateVolume, so it stays silent there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import ExpiringMap
from plugproxy.rules.engine import CO, MUST, Hooks, Rule, Violation

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState

Segments = dict[str, str]


class PlacementMemory:
    def __init__(self, st: SpecState) -> None:
        # volume id -> the accessible_topology entries CreateVolume returned (non-empty)
        self.volumes: ExpiringMap[str, tuple[Segments, ...]] = ExpiringMap(
            st.max_volumes, st.lifecycle_ttl, st.clock
        )
        self.node: Segments | None = None  # this node's topology, from NodeGetInfo


def _segments(topology: Any) -> Segments:
    return {k.lower(): v for k, v in topology.segments.items()}


def _agree(a: Segments, b: Segments) -> bool:
    """Whether two topologies agree on every key both hold (a coarser one reaches the finer)."""
    return all(b.get(k, v) == v for k, v in a.items())


def _rules(title: str) -> tuple[Rule, ...]:
    return (
        Rule(
            "csi.node-outside-volume-topology",
            MUST,
            (CO,),
            f"{title} §GetPluginCapabilities",
            "NodeStageVolume or NodePublishVolume of a volume on a node none of the volume's"
            " accessible topologies agrees with (CreateVolume's answer and this node's"
            " NodeGetInfo, both seen on this socket).",
            reject_code=None,
            note="Judged on a socket serving controller and node, where both answers pass."
            " Topologies agree when they hold the same value for every key both have, so a"
            " volume accessible from a whole region reaches a node of any of its zones.",
        ),
    )


def _created(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    if resp is None or not resp.HasField("volume"):
        return
    volume = resp.volume
    vid = str(getattr(volume, "volume_id", "") or getattr(volume, "id", ""))
    entries = tuple(_segments(t) for t in volume.accessible_topology)
    if vid and entries:
        st.part(PlacementMemory).volumes[vid] = entries


def _node_info(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if resp.HasField("accessible_topology"):
        st.part(PlacementMemory).node = _segments(resp.accessible_topology)
    return ()


def _placed(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    memory = st.part(PlacementMemory)
    node = memory.node
    if not node or not len(memory.volumes):
        return
    entries = memory.volumes.get(req.volume_id)
    if entries is None or any(_agree(entry, node) for entry in entries):
        return
    yield Violation(
        cs.rule("node-outside-volume-topology"),
        "volume_id",
        f"{call.method.name} of a volume on this node, but none of the {len(entries)}"
        " accessible topologies CreateVolume returned for it agrees with the node's"
        " (NodeGetInfo): the CO MUST place workloads where the volume is accessible",
    )


def hooks(title: str, v1: bool) -> Hooks:
    """The family for the CSI version cited as ``title`` (the same in v1.12 and v0.3)."""
    return Hooks(
        rules=_rules(title),
        request_checks={"NodeStageVolume": (_placed,), "NodePublishVolume": (_placed,)},
        response_checks={"NodeGetInfo": (_node_info,)},
        on_success={"CreateVolume": (_created,)},
    )
