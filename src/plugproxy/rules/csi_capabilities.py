"""CSI rules tied to capabilities: request fields a capability allows or requires, response
fields a capability makes mandatory, capability sets that contradict the spec, and
capability answers that change while the plugin's version stays.

Capabilities come from SpecState (the answers the proxy relayed or asked for itself, kept
five minutes); a check whose capabilities are unknown judges nothing. CSI v0.3 names a few
fields differently (``publish_info``, ``Volume.id``, ``ACCESSIBILITY_CONSTRAINTS``) and has
no expansion, volume condition, MODIFY_VOLUME or PUBLISH_READONLY: its table gets the rules
and checks that exist there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import ago, remember
from plugproxy.rules.csi_common import capability_names
from plugproxy.rules.engine import (
    CO,
    MUST,
    PLUGIN,
    SHOULD,
    CompiledSpec,
    Hooks,
    Rule,
    Violation,
    listed_entries,
)

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.state import SpecState

# Kubernetes marks the volume_context of a CSI ephemeral inline volume with this key (when
# the CSIDriver asks for pod info); kubelet publishes such volumes without staging them.
EPHEMERAL_KEY = "csi.storage.k8s.io/ephemeral"

# Distinct GetPluginCapabilities answers kept between two GetPluginInfo answers.
_PENDING_MAX = 8

# Controller RPCs whose success shows that this socket serves the controller for real.
_CONTROLLER_RPCS_V0 = (
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
)
_CONTROLLER_RPCS_V1 = (
    *_CONTROLLER_RPCS_V0,
    "GetSnapshot",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "ControllerModifyVolume",
)


def _rules(title: str, v1: bool) -> tuple[Rule, ...]:
    rules = [
        Rule(
            "csi.field-without-capability",
            MUST,
            (CO,),
            f"{title} §{{rpc}}",
            "A request field the spec says SHALL NOT be set (or MUST be false) without a"
            " capability is set while the plugin does not advertise it: CreateVolume"
            " mutable_parameters without MODIFY_VOLUME, ControllerPublishVolume readonly"
            " without PUBLISH_READONLY, NodeStageVolume/NodePublishVolume publish_context (v0"
            " publish_info) without the controller's PUBLISH_UNPUBLISH_VOLUME, v0"
            " ValidateVolumeCapabilities accessible_topology without ACCESSIBILITY_CONSTRAINTS.",
            note="Enforced as INVALID_ARGUMENT (§Error Scheme, invalid or unsupported field),"
            " except publish_context: it is judged only on a socket that also serves the"
            " controller (a controller RPC answered OK there within the hour), and reported,"
            " never enforced, because a node-only instance may answer the controller"
            " capability query without being the controller the CO published through."
            " MODIFY_VOLUME, which the text calls a plugin capability, is a controller"
            " capability in the proto and is looked up there.",
        ),
        Rule(
            "csi.field-missing-with-capability",
            MUST,
            (CO,),
            f"{title} §NodePublishVolume",
            "NodePublishVolume without staging_target_path while the node advertises"
            " STAGE_UNSTAGE_VOLUME.",
            reject_code="FAILED_PRECONDITION",
            note="Enforced with FAILED_PRECONDITION, the §NodePublishVolume errors row"
            " 'Staging target path not set'. Judged only for a volume the proxy saw as a"
            " persistent one on this socket (created, controller-published, staged or"
            " unstaged) and without the Kubernetes ephemeral marker in volume_context:"
            " kubelet publishes CSI ephemeral inline volumes without staging them.",
        ),
        Rule(
            "csi.capacity-range-empty",
            MUST,
            (CO,),
            f"{title} §CreateVolume",
            "A CapacityRange is set with neither required_bytes nor limit_bytes (both 0,"
            " which the spec equates with unset); at least one MUST be specified.",
        ),
        Rule(
            "csi.controller-service-recommended",
            SHOULD,
            (PLUGIN,),
            f"{title} §GetPluginCapabilities",
            "GetPluginCapabilities does not list CONTROLLER_SERVICE, which plugins SHOULD"
            " provide (reported once per answer).",
            reject_code=None,
        ),
        Rule(
            "csi.capabilities-changed",
            MUST,
            (PLUGIN,),
            f"{title} §GetPluginCapabilities",
            "GetPluginCapabilities answers another set of capabilities than before while"
            " GetPluginInfo's vendor_version stayed the same.",
            reject_code=None,
            note="Only the plugin capabilities: the statement (all instances of one"
            " vendor_version SHALL return the same set) is about GetPluginCapabilities."
            " An answer counts for a version only between two GetPluginInfo answers of that"
            " version within the hour, so a plugin restarted with another version meanwhile"
            " is never blamed; the violation is reported on the GetPluginInfo answer that"
            " confirms the version.",
        ),
    ]
    if v1:
        rules += [
            Rule(
                "csi.field-recommended-with-capability",
                SHOULD,
                (CO,),
                f"{title} §{{rpc}}",
                "NodeExpandVolume without staging_target_path while the node advertises"
                " STAGE_UNSTAGE_VOLUME (the CO SHOULD supply it).",
                reject_code=None,
                note="NodeGetVolumeStats carries the same SHOULD but is not judged: kubelet"
                " never sets its staging_target_path, and it polls every mounted volume, so"
                " the advisory would only repeat what no operator can change.",
            ),
            Rule(
                "csi.response-field-missing",
                MUST,
                (PLUGIN,),
                f"{title} §{{rpc}}",
                "A response field the spec says MUST be set when a capability is advertised"
                " is not: ListVolumes entry status (LIST_VOLUMES_PUBLISHED_NODES) and"
                " status.volume_condition (controller VOLUME_CONDITION), ControllerGetVolume"
                " status.volume_condition (controller VOLUME_CONDITION) and published_node_ids"
                " (LIST_VOLUMES_PUBLISHED_NODES), NodeGetVolumeStats"
                " volume_condition (node VOLUME_CONDITION).",
                reject_code=None,
                note="An empty published_node_ids is how a volume published nowhere is"
                " reported, so it is judged only in ControllerGetVolume, for a volume this"
                " socket saw ControllerPublished before the call, within a leader-election"
                " lease (15 s: no other replica can have unpublished it) and with no unpublish"
                " of it sent since.",
            ),
            Rule(
                "csi.capabilities-inconsistent",
                MUST,
                (PLUGIN,),
                f"{title} §GetPluginCapabilities, §ControllerGetCapabilities",
                "Capability sets contradict the spec: LIST_VOLUMES_PUBLISHED_NODES without"
                " PUBLISH_UNPUBLISH_VOLUME; VolumeExpansion ONLINE without EXPAND_VOLUME in"
                " the controller or the node capabilities; OFFLINE without the controller's"
                " EXPAND_VOLUME.",
                reject_code=None,
                note="Judged on each capability answer the CO receives, with the other kinds"
                " as last seen. An empty controller or node set is not taken as that"
                " service's capabilities (an instance not serving it may answer so), except"
                " that a plugin without CONTROLLER_SERVICE has no controller capability.",
            ),
            Rule(
                "csi.group-without-get-snapshot",
                SHOULD,
                (PLUGIN,),
                f"{title} §GetSnapshot",
                "The plugin advertises CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT but not the"
                " controller's GET_SNAPSHOT: it SHOULD implement GetSnapshot, which the CO calls"
                " only when advertised, to retrieve a group's snapshots one by one.",
                reject_code=None,
                note="Judged on each ControllerGetCapabilities or GroupControllerGetCapabilities"
                " answer, with the other kind as last seen; an empty controller set is not"
                " judged (an instance not serving the controller may answer so).",
            ),
        ]
    return tuple(rules)


def _group_get_snapshot(cs: CompiledSpec, st: SpecState, rpc: str) -> Iterable[Violation]:
    group = st.known_capabilities("group")
    controller = st.known_capabilities("controller")
    if (
        group is not None
        and "CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT" in group
        and controller
        and "GET_SNAPSHOT" not in controller
    ):
        yield Violation(
            cs.rule("group-without-get-snapshot"),
            "capabilities",
            f"{rpc} answered: CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT is advertised but the"
            " controller capabilities lack GET_SNAPSHOT",
        )


def _facts(entry: Any, v1: bool) -> tuple[bool, bool]:
    return bool(entry.volume.accessible_topology), v1 and entry.HasField("status")


# Listed entries whose facts are remembered (a few pages' samples).
LISTED_MAX = 4096


class CapabilityMemory:
    """What this family remembers on one socket: GetPluginCapabilities answers attributed to
    a vendor_version, and when the socket last served a controller RPC. A few fields only,
    forgotten after ``st.lifecycle_ttl``."""

    def __init__(self, st: SpecState) -> None:
        self.clock = st.clock
        self.ttl = st.lifecycle_ttl
        self.version: str | None = None  # the vendor_version GetPluginInfo last answered
        self.version_at = 0.0
        # the set answered between two GetPluginInfo answers of ``version``, and when
        self.confirmed: tuple[frozenset[str], float] | None = None
        # sets answered since the last GetPluginInfo -> when first answered
        self.pending: dict[frozenset[str], float] = {}
        self.controller_at: float | None = None
        # Hash of a listed entry's wire bytes -> (it has accessible_topology, it has status):
        # a page listed again is not read entry by entry for them. The bytes decide.
        self.listed: OrderedDict[int, tuple[bool, bool]] = OrderedDict()

    def listed_facts(self, call: Call, resp: Any, v1: bool) -> list[tuple[bool, bool]]:
        """(has accessible_topology, has status) of each ListVolumes entry in ``resp``; CSI
        v0's entries have no status (False)."""
        entries = resp.entries
        raws = listed_entries(call, resp, "entries")
        if raws is None:
            return [_facts(e, v1) for e in entries]
        known = self.listed
        facts = []
        for i, raw in enumerate(raws):
            key = hash(raw)
            fact = known.get(key)
            if fact is None:
                fact = _facts(entries[i], v1)
                remember(known, key, fact, LISTED_MAX)
            facts.append(fact)
        return facts

    def serves_controller(self) -> bool:
        at = self.controller_at
        return at is not None and self.clock() - at <= self.ttl

    def capabilities_answered(self, names: frozenset[str]) -> None:
        if self.version is None or self.clock() - self.version_at > self.ttl:
            return  # no version to attribute the answer to
        if names not in self.pending and len(self.pending) < _PENDING_MAX:
            self.pending[names] = self.clock()

    def version_answered(
        self, version: str
    ) -> list[tuple[frozenset[str], frozenset[str], float, float]]:
        """Record a GetPluginInfo answer; the changes within one version it confirms, as
        (earlier set, later set, the later one's age, the earlier one's age)."""
        now = self.clock()
        pending, self.pending = self.pending, {}
        if not version or version != self.version or now - self.version_at > self.ttl:
            # another version, or too long unseen: what came before counts for nothing
            self.version = version or None
            self.version_at = now
            self.confirmed = None
            return []
        self.version_at = now
        changes = []
        for names, seen in sorted(pending.items(), key=lambda item: item[1]):
            if self.confirmed is not None and self.confirmed[0] != names:
                changes.append((self.confirmed[0], names, now - seen, now - self.confirmed[1]))
            self.confirmed = (names, seen)
        return changes


@dataclass(frozen=True)
class _Checks:
    v1: bool
    publish_context: str  # publish_context (v1), publish_info (v0)
    topology_capability: str  # VOLUME_ACCESSIBILITY_CONSTRAINTS (v1), ACCESSIBILITY_...

    # -- requests (party co) ------------------------------------------------------------

    def create_volume_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        yield from _capacity_range(cs, req)
        if not self.v1 or not req.mutable_parameters:
            return
        controller = st.known_capabilities("controller")
        if controller is not None and "MODIFY_VOLUME" not in controller:
            yield Violation(
                cs.rule("field-without-capability"),
                "mutable_parameters",
                f"mutable_parameters is set ({len(req.mutable_parameters)} entries) but the"
                " controller does not advertise MODIFY_VOLUME",
            )

    def controller_publish_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        if not req.readonly:
            return
        controller = st.known_capabilities("controller")
        if controller is not None and "PUBLISH_READONLY" not in controller:
            yield Violation(
                cs.rule("field-without-capability"),
                "readonly",
                "readonly is true but the controller does not advertise PUBLISH_READONLY;"
                " the CO MUST set it to false",
            )

    def node_stage_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        yield from self._publish_context(cs, st, req)

    def node_publish_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        yield from self._publish_context(cs, st, req)
        if req.staging_target_path:
            return
        node = st.known_capabilities("node")
        if node is None or "STAGE_UNSTAGE_VOLUME" not in node:
            return
        context = req.volume_context if self.v1 else req.volume_attributes
        if context.get(EPHEMERAL_KEY) == "true":
            return
        vs = st.peek(req.volume_id)
        # Only a volume known to be a persistent one: kubelet publishes CSI ephemeral inline
        # volumes without staging_target_path, whatever the node advertises.
        if vs is None:
            return
        if vs.staged:
            seen = "staged on this node"
        elif st.controller_nodes(req.volume_id):
            seen = "controller-published"
        elif vs.known_unstaged:
            seen = "created or unstaged"
        else:
            return
        yield Violation(
            cs.rule("field-missing-with-capability"),
            "staging_target_path",
            "staging_target_path is not set but the node advertises STAGE_UNSTAGE_VOLUME"
            f" (the proxy saw the volume {seen} through this socket)",
        )

    def _publish_context(self, cs: CompiledSpec, st: SpecState, req: Any) -> Iterable[Violation]:
        context = getattr(req, self.publish_context)
        if not context:
            return
        controller = st.known_capabilities("controller")
        if controller is None or "PUBLISH_UNPUBLISH_VOLUME" in controller:
            return
        # A node-only instance may answer the controller query without being the controller
        # the CO published through: judged only where the controller is served for real.
        if not st.part(CapabilityMemory).serves_controller():
            return
        yield Violation(
            cs.rule("field-without-capability"),
            self.publish_context,
            f"{self.publish_context} is set ({len(context)} entries) but the controller"
            " served on this socket does not advertise PUBLISH_UNPUBLISH_VOLUME; it SHALL be"
            " left unset",
            enforceable=False,
        )

    def validate_request_v0(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        if not req.accessible_topology:
            return
        plugin = st.known_capabilities("plugin")
        if plugin is not None and self.topology_capability not in plugin:
            yield Violation(
                cs.rule("field-without-capability"),
                "accessible_topology",
                f"accessible_topology is set ({len(req.accessible_topology)} entries) but the"
                f" plugin does not advertise {self.topology_capability}",
            )

    def expand_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        yield from _capacity_range(cs, req)

    def node_expand_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        yield from _capacity_range(cs, req)
        if req.staging_target_path:
            return
        node = st.known_capabilities("node")
        if node is not None and "STAGE_UNSTAGE_VOLUME" in node:
            yield Violation(
                cs.rule("field-recommended-with-capability"),
                "staging_target_path",
                "staging_target_path is not set but the node advertises STAGE_UNSTAGE_VOLUME;"
                " the CO SHOULD supply it",
            )

    # -- capability answers (party plugin) ----------------------------------------------

    def plugin_info_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        for old, new, new_age, old_age in st.part(CapabilityMemory).version_answered(
            resp.vendor_version
        ):
            yield _changed(cs, old, new, new_age, old_age)

    def plugin_capabilities_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        names = capability_names(resp)
        st.part(CapabilityMemory).capabilities_answered(names)
        if "CONTROLLER_SERVICE" not in names:
            yield Violation(
                cs.rule("controller-service-recommended"),
                "capabilities",
                "GetPluginCapabilities does not list CONTROLLER_SERVICE, which plugins SHOULD"
                " provide",
            )
        if self.v1:
            yield from _expansion(cs, st)

    def controller_capabilities_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        names = capability_names(resp)
        if "LIST_VOLUMES_PUBLISHED_NODES" in names and "PUBLISH_UNPUBLISH_VOLUME" not in names:
            yield Violation(
                cs.rule("capabilities-inconsistent"),
                "capabilities",
                "ControllerGetCapabilities lists LIST_VOLUMES_PUBLISHED_NODES without"
                " PUBLISH_UNPUBLISH_VOLUME, which it requires",
            )
        yield from _expansion(cs, st)
        yield from _group_get_snapshot(cs, st, "ControllerGetCapabilities")

    def group_capabilities_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        return _group_get_snapshot(cs, st, "GroupControllerGetCapabilities")

    def node_capabilities_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        yield from _expansion(cs, st)

    # -- responses (party plugin) -------------------------------------------------------

    def list_volumes_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        entries = resp.entries
        if not entries:
            return
        facts: list[tuple[bool, bool]] | None = None
        plugin = st.known_capabilities("plugin")
        if plugin is not None and self.topology_capability not in plugin:
            facts = st.part(CapabilityMemory).listed_facts(call, resp, self.v1)
            found = [i for i, (topology, _) in enumerate(facts) if topology]
            if found:
                where = f"entries[{found[0]}].volume.accessible_topology"
                first = entries[found[0]].volume.accessible_topology
                yield Violation(
                    cs.rule("topology-without-capability"),
                    where,
                    f"{where} has {len(first)} entries but the plugin does not advertise"
                    f" {self.topology_capability}{_more(len(found), len(entries))}",
                )
        if not self.v1:
            return
        controller = st.known_capabilities("controller")
        if controller is None:
            return
        needs_status = "LIST_VOLUMES_PUBLISHED_NODES" in controller
        needs_condition = "VOLUME_CONDITION" in controller
        if not (needs_status or needs_condition):
            return
        if facts is None:
            facts = st.part(CapabilityMemory).listed_facts(call, resp, self.v1)
        no_status = [i for i, (_, status) in enumerate(facts) if not status]
        if no_status:
            why = " and ".join(
                name
                for name, needed in (
                    ("LIST_VOLUMES_PUBLISHED_NODES", needs_status),
                    ("VOLUME_CONDITION", needs_condition),
                )
                if needed
            )
            where = f"entries[{no_status[0]}].status"
            yield Violation(
                cs.rule("response-field-missing"),
                where,
                f"{where} is missing but the controller advertises {why}"
                f"{_more(len(no_status), len(entries))}",
            )
        if needs_condition:
            no_condition = [
                i
                for i, e in enumerate(entries)
                if e.HasField("status") and not e.status.HasField("volume_condition")
            ]
            if no_condition:
                where = f"entries[{no_condition[0]}].status.volume_condition"
                yield Violation(
                    cs.rule("response-field-missing"),
                    where,
                    f"{where} is missing but the controller advertises VOLUME_CONDITION"
                    f"{_more(len(no_condition), len(entries))}",
                )

    def controller_get_volume_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        topology = resp.volume.accessible_topology
        if topology:
            plugin = st.known_capabilities("plugin")
            if plugin is not None and self.topology_capability not in plugin:
                yield Violation(
                    cs.rule("topology-without-capability"),
                    "volume.accessible_topology",
                    f"volume.accessible_topology has {len(topology)} entries but the plugin"
                    f" does not advertise {self.topology_capability}",
                )
        # A missing status is csi.required-field's; its condition is judged when present.
        if not resp.HasField("status") or resp.status.HasField("volume_condition"):
            return
        controller = st.known_capabilities("controller")
        if controller is not None and "VOLUME_CONDITION" in controller:
            yield Violation(
                cs.rule("response-field-missing"),
                "status.volume_condition",
                "status.volume_condition is missing but the controller advertises VOLUME_CONDITION",
            )

    def node_volume_stats_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if resp.HasField("volume_condition"):
            return
        node = st.known_capabilities("node")
        if node is not None and "VOLUME_CONDITION" in node:
            yield Violation(
                cs.rule("response-field-missing"),
                "volume_condition",
                "volume_condition is missing but the node advertises VOLUME_CONDITION",
            )

    # -- bookkeeping after success ------------------------------------------------------

    def controller_served(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        memory = st.part(CapabilityMemory)
        memory.controller_at = memory.clock()


def _capacity_range(cs: CompiledSpec, req: Any) -> Iterable[Violation]:
    if not req.HasField("capacity_range"):
        return
    cr = req.capacity_range
    if cr.required_bytes == 0 and cr.limit_bytes == 0:
        yield Violation(
            cs.rule("capacity-range-empty"),
            "capacity_range",
            "capacity_range is set with neither required_bytes nor limit_bytes (both 0);"
            " at least one MUST be specified",
        )


def _more(count: int, judged: int) -> str:
    """What a list violation adds about the other entries breaking the same rule."""
    if count <= 1:
        return ""
    return f" ({count - 1} more of the {judged} entries judged too)"


def _changed(
    cs: CompiledSpec, old: frozenset[str], new: frozenset[str], new_age: float, old_age: float
) -> Violation:
    added = sorted(new - old)
    removed = sorted(old - new)
    parts = []
    if added:
        parts.append(f"adds {', '.join(added)}")
    if removed:
        parts.append(f"drops {', '.join(removed)}")
    diff = " and ".join(parts) or "differs"
    return Violation(
        cs.rule("capabilities-changed"),
        "vendor_version",
        f"GetPluginCapabilities answered {ago(new_age)} {diff} compared with its answer"
        f" {ago(old_age)}, while GetPluginInfo's vendor_version stayed the same",
        party=PLUGIN,
    )


def _expansion(cs: CompiledSpec, st: SpecState) -> Iterable[Violation]:
    """VolumeExpansion ONLINE/OFFLINE against the EXPAND_VOLUME capabilities known."""
    plugin = st.known_capabilities("plugin")
    if plugin is None or not ({"ONLINE", "OFFLINE"} & plugin):
        return
    controller = st.known_capabilities("controller")
    node = st.known_capabilities("node")
    # True/False: the controller does/does not expand; None: not known from this socket.
    controller_expands: bool | None = None
    if "CONTROLLER_SERVICE" not in plugin:
        controller_expands = False
    elif controller:  # an empty set may come from an instance not serving the controller
        controller_expands = "EXPAND_VOLUME" in controller
    node_expands = "EXPAND_VOLUME" in node if node else None
    if "ONLINE" in plugin and controller_expands is False and node_expands is False:
        yield Violation(
            cs.rule("capabilities-inconsistent"),
            "capabilities",
            "GetPluginCapabilities lists VolumeExpansion ONLINE but neither the controller nor"
            " the node capabilities list EXPAND_VOLUME",
        )
    if "OFFLINE" in plugin and controller_expands is False:
        what = (
            "the plugin does not advertise CONTROLLER_SERVICE"
            if "CONTROLLER_SERVICE" not in plugin
            else "the controller capabilities do not list EXPAND_VOLUME"
        )
        yield Violation(
            cs.rule("capabilities-inconsistent"),
            "capabilities",
            f"GetPluginCapabilities lists VolumeExpansion OFFLINE, which requires the"
            f" controller's EXPAND_VOLUME, but {what}",
        )


def hooks(title: str, v1: bool) -> Hooks:
    """The family's rules and checks for the CSI version cited as ``title``."""
    c = _Checks(
        v1=v1,
        publish_context="publish_context" if v1 else "publish_info",
        topology_capability="VOLUME_ACCESSIBILITY_CONSTRAINTS"
        if v1
        else "ACCESSIBILITY_CONSTRAINTS",
    )
    request_checks: dict[str, tuple[Any, ...]] = {
        "CreateVolume": (c.create_volume_request,),
        "NodeStageVolume": (c.node_stage_request,),
        "NodePublishVolume": (c.node_publish_request,),
    }
    response_checks: dict[str, tuple[Any, ...]] = {
        "GetPluginInfo": (c.plugin_info_response,),
        "GetPluginCapabilities": (c.plugin_capabilities_response,),
        "ListVolumes": (c.list_volumes_response,),
    }
    # Capability kinds to know before the request is judged (the response checks of the same
    # call read them too); an RPC's gate kind is learnt anyway.
    needs: dict[str, tuple[str, ...]] = {
        "NodeGetInfo": ("plugin",),  # its accessible_topology needs the plugin capabilities
        "ListVolumes": ("plugin", "controller"),
        "NodeStageVolume": ("node", "controller"),
        "NodePublishVolume": ("node", "controller"),
    }
    controller_rpcs = _CONTROLLER_RPCS_V1 if v1 else _CONTROLLER_RPCS_V0
    if v1:
        request_checks |= {
            "ControllerPublishVolume": (c.controller_publish_request,),
            "ControllerExpandVolume": (c.expand_request,),
            "NodeExpandVolume": (c.node_expand_request,),
        }
        response_checks |= {
            "ControllerGetCapabilities": (c.controller_capabilities_response,),
            "NodeGetCapabilities": (c.node_capabilities_response,),
            "ControllerGetVolume": (c.controller_get_volume_response,),
            "NodeGetVolumeStats": (c.node_volume_stats_response,),
            "GroupControllerGetCapabilities": (c.group_capabilities_response,),
        }
        needs |= {
            "ControllerPublishVolume": ("controller",),
            "ControllerGetVolume": ("plugin", "controller"),
            "NodeGetVolumeStats": ("node",),
            "NodeExpandVolume": ("node",),
        }
    else:
        request_checks["ValidateVolumeCapabilities"] = (c.validate_request_v0,)
        needs["ValidateVolumeCapabilities"] = ("plugin",)
    return Hooks(
        rules=_rules(title, v1),
        request_checks=request_checks,
        response_checks=response_checks,
        on_success={rpc: (c.controller_served,) for rpc in controller_rpcs},
        capability_needs=needs,
    )
