"""CSI capability rules (plugproxy.rules.csi_capabilities), driven through the real
validate stage in-process, and a few through a real proxy in front of the fake plugin.

Each rule: a planted violation from the party it judges is reported (and, where the rule is
enforced, rejected with its answer), and the same call made legitimately is not.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from plugproxy.api import Call, LazyMessage, Reject, Runtime, StatusCode
from plugproxy.core.log import Logger
from plugproxy.core.sampling import picked_indices
from plugproxy.fakes import FakeKnobs
from plugproxy.rules import TABLES, csi_capabilities
from plugproxy.rules.csi_capabilities import CapabilityMemory
from plugproxy.rules.engine import CO, MUST, PLUGIN, SHOULD
from plugproxy.rules.state import SpecState
from plugproxy.spec.registry import Registry, load_spec
from plugproxy.stages.validate import ValidateStage
from tests.integration.test_validation_lifecycle import mount_cap, stage_of, through_proxy

OK = grpc.StatusCode.OK
MOUNT = {"mount": {}, "access_mode": {"mode": 1}}
STAGE = "/var/lib/kubelet/plugins/kubernetes.io/csi/fake/globalmount"
TARGET = "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount"
ZONE = {"segments": {"topology.example.com/zone": "zone-a"}}
V1_ONLY = (
    "csi.field-recommended-with-capability",
    "csi.response-field-missing",
    "csi.capabilities-inconsistent",
)


@dataclass
class Outcome:
    found: list[tuple[str, str, str]]  # (rule, field, party)
    messages: list[str]
    rejected: Reject | None


class Driver:
    """A validate stage of one spec, driven call by call without a plugin: the test plays
    the plugin's answers, and sets the capabilities the proxy would have learnt."""

    def __init__(self, spec: str, mode: str = "audit") -> None:
        self.spec = spec
        registry = Registry([spec])
        runtime = Runtime(
            registry=registry, upstream=None, logger=Logger(io.StringIO()), metrics=None
        )
        self.stage = ValidateStage(runtime, mode, {})
        self.methods = {m.name: m for m in registry.methods(spec)}
        self.state: SpecState = self.stage._plans[self.methods["Probe"].path].state
        self.package = TABLES[spec].package

    def new(self, type_name: str, **fields: Any) -> Any:
        return load_spec(self.spec).message_class(f"{self.package}.{type_name}")(**fields)

    def caps(self, kind: str, *names: str) -> None:
        self.state.set_capabilities(kind, frozenset(names))

    async def call(
        self, rpc: str, request: Any = None, response: Any = None, code: grpc.StatusCode = OK
    ) -> Outcome:
        method = self.methods[rpc]
        assert method.request_class is not None and method.response_class is not None
        req = request if request is not None else method.request_class()
        call = Call(method, (), [], 5.0)
        call.request = LazyMessage(req.SerializeToString(), method.request_class)
        rejected = None
        try:
            pending = self.stage.on_start(call)
            if pending is not None:
                await pending
        except Reject as exc:
            rejected = exc
            call.rejected = True
        if rejected is None:
            if code is OK:
                resp = response if response is not None else method.response_class()
                lazy = LazyMessage(resp.SerializeToString(), method.response_class)
                call.response = lazy
                self.stage.on_response(call, lazy)
            else:
                call.details = "the plugin's own error"
            call.code = StatusCode.of(code)
            self.stage.on_finish(call)
        events = [e.attributes for e in call.events if e.name == "violation"]
        return Outcome(
            [(str(e["rule"]), str(e["field"]), str(e["party"])) for e in events],
            [str(e["message"]) for e in events],
            rejected,
        )


def ours(outcome: Outcome) -> set[tuple[str, str, str]]:
    """The findings of this family's rules (and of the topology rule it extends)."""
    mine = {r.id for r in csi_capabilities.hooks("x", True).rules}
    mine.add("csi.topology-without-capability")
    return {f for f in outcome.found if f[0] in mine}


def v1_and_v0() -> Any:
    return pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])


# -- the contract: ids, levels, parties, answers ----------------------------------------------

FAMILY_RULES = {
    # id: (level, party, reject_code)
    "csi.field-without-capability": (MUST, CO, "INVALID_ARGUMENT"),
    "csi.field-missing-with-capability": (MUST, CO, "FAILED_PRECONDITION"),
    "csi.field-recommended-with-capability": (SHOULD, CO, None),
    "csi.response-field-missing": (MUST, PLUGIN, None),
    "csi.capabilities-inconsistent": (MUST, PLUGIN, None),
    "csi.controller-service-recommended": (SHOULD, PLUGIN, None),
    "csi.capabilities-changed": (MUST, PLUGIN, None),
    "csi.capacity-range-empty": (MUST, CO, "INVALID_ARGUMENT"),
}


@v1_and_v0()
def test_the_family_rules_in_both_tables(spec):
    rules = {r.id: r for r in TABLES[spec].rules}
    for rid, (level, party, code) in FAMILY_RULES.items():
        if spec == "csi.v0" and rid in V1_ONLY:
            assert rid not in rules  # v0.3 has no such field or capability
            continue
        rule = rules[rid]
        assert (rule.level, rule.parties, rule.reject_code) == (level, (party,), code), rid
        assert rule.section.startswith(TABLES[spec].title + " §"), rid


@v1_and_v0()
def test_capability_needs_are_merged_into_the_tables(spec):
    needs = TABLES[spec].capability_needs
    assert "plugin" in needs["NodeGetInfo"]
    assert {"plugin", "controller"} <= set(needs["ListVolumes"])
    assert {"node", "controller"} <= set(needs["NodePublishVolume"])
    assert {"node", "controller"} <= set(needs["NodeStageVolume"])
    if spec == "csi.v1":
        assert {"plugin", "controller"} <= set(needs["ControllerGetVolume"])
    else:
        assert needs["ValidateVolumeCapabilities"] == ("plugin",)


# -- csi.field-without-capability -------------------------------------------------------------


async def test_mutable_parameters_need_modify_volume():
    d = Driver("csi.v1")
    d.caps("plugin", "CONTROLLER_SERVICE")
    d.caps("controller", "CREATE_DELETE_VOLUME")
    req = d.new(
        "CreateVolumeRequest", name="p", volume_capabilities=[MOUNT], mutable_parameters={"a": "1"}
    )
    got = await d.call("CreateVolume", req)
    assert ours(got) == {("csi.field-without-capability", "mutable_parameters", "co")}
    assert "MODIFY_VOLUME" in got.messages[0] and "'1'" not in got.messages[0]
    assert ours(await d.call("CreateVolume", d.new("CreateVolumeRequest", name="p"))) == set()
    d.caps("controller", "CREATE_DELETE_VOLUME", "MODIFY_VOLUME")
    assert ours(await d.call("CreateVolume", req)) == set()
    # enforced, with the answer for an unsupported field
    e = Driver("csi.v1", "enforce")
    e.caps("controller", "CREATE_DELETE_VOLUME")
    rejected = (await e.call("CreateVolume", req)).rejected
    assert rejected is not None and rejected.code is StatusCode.INVALID_ARGUMENT
    assert rejected.message.startswith("plugproxy: csi.field-without-capability: ")


async def test_readonly_publish_needs_publish_readonly():
    d = Driver("csi.v1", "enforce")
    d.caps("controller", "PUBLISH_UNPUBLISH_VOLUME")
    fields = {"volume_id": "v", "node_id": "n", "volume_capability": MOUNT}
    got = await d.call(
        "ControllerPublishVolume", d.new("ControllerPublishVolumeRequest", readonly=True, **fields)
    )
    assert ours(got) == {("csi.field-without-capability", "readonly", "co")}
    assert got.rejected is not None and got.rejected.code is StatusCode.INVALID_ARGUMENT
    writable = d.new("ControllerPublishVolumeRequest", readonly=False, **fields)
    assert ours(await d.call("ControllerPublishVolume", writable)) == set()
    d.caps("controller", "PUBLISH_UNPUBLISH_VOLUME", "PUBLISH_READONLY")
    readonly = d.new("ControllerPublishVolumeRequest", readonly=True, **fields)
    got = await d.call("ControllerPublishVolume", readonly)
    assert ours(got) == set() and got.rejected is None


def node_request(d: Driver, rpc: str, publish: dict[str, str], **extra: Any) -> Any:
    context = "publish_context" if d.spec == "csi.v1" else "publish_info"
    fields: dict[str, Any] = {
        "volume_id": "vol-1",
        "staging_target_path": STAGE,
        "volume_capability": MOUNT,
        context: publish,
        **extra,
    }
    if rpc == "NodePublishVolume":
        fields["target_path"] = TARGET
    return d.new(f"{rpc}Request", **fields)


@v1_and_v0()
@pytest.mark.parametrize("rpc", ["NodeStageVolume", "NodePublishVolume"])
async def test_publish_context_without_controller_publish_on_a_unified_socket(spec, rpc):
    """SHALL be left unset without the controller's PUBLISH_UNPUBLISH_VOLUME: judged where
    the socket serves the controller too, and reported, never enforced."""
    d = Driver(spec, "enforce")
    d.caps("plugin", "CONTROLLER_SERVICE")
    d.caps("node", "STAGE_UNSTAGE_VOLUME")
    d.caps("controller", "CREATE_DELETE_VOLUME")
    field = "publish_context" if spec == "csi.v1" else "publish_info"
    with_context = node_request(d, rpc, {"devicePath": "/dev/xvdf"})
    # a node-only socket: the controller answer it got is not the controller's
    assert ours(await d.call(rpc, with_context)) == set()
    await d.call("DeleteVolume", d.new("DeleteVolumeRequest", volume_id="other"))  # served
    got = await d.call(rpc, with_context)
    assert ours(got) == {("csi.field-without-capability", field, "co")}
    assert got.rejected is None  # reported, not enforced
    assert "/dev/xvdf" not in got.messages[0] and "1 entries" in got.messages[0]
    assert ours(await d.call(rpc, node_request(d, rpc, {}))) == set()
    d.caps("controller", "CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME")
    assert ours(await d.call(rpc, with_context)) == set()


@v1_and_v0()
async def test_publish_context_on_a_node_only_socket_is_never_judged(spec):
    """A node-only socket: the proxy's controller capability query fails (the plugin does
    not serve that service there), and an instance that does answer it without serving
    controller calls does not count either."""
    d = Driver(spec)  # no upstream: every capability query of the proxy's own fails
    d.caps("node", "STAGE_UNSTAGE_VOLUME")
    req = node_request(d, "NodeStageVolume", {"devicePath": "/dev/xvdf"})
    assert ours(await d.call("NodeStageVolume", req)) == set()
    assert d.state.known_capabilities("controller") is None
    d.caps("controller")  # a node instance answering the controller query with nothing
    assert ours(await d.call("NodeStageVolume", req)) == set()


async def test_v0_validate_topology_needs_accessibility_constraints():
    d = Driver("csi.v0", "enforce")
    d.caps("plugin", "CONTROLLER_SERVICE")
    req = d.new(
        "ValidateVolumeCapabilitiesRequest",
        volume_id="v",
        volume_capabilities=[MOUNT],
        accessible_topology=[ZONE],
    )
    got = await d.call("ValidateVolumeCapabilities", req)
    assert ours(got) == {("csi.field-without-capability", "accessible_topology", "co")}
    assert got.rejected is not None and got.rejected.code is StatusCode.INVALID_ARGUMENT
    d.caps("plugin", "CONTROLLER_SERVICE", "ACCESSIBILITY_CONSTRAINTS")
    got = await d.call("ValidateVolumeCapabilities", req)
    assert ours(got) == set() and got.rejected is None


# -- csi.field-missing-with-capability --------------------------------------------------------


@v1_and_v0()
async def test_publish_without_staging_path_of_a_staged_volume(spec):
    d = Driver(spec, "enforce")
    d.caps("node", "STAGE_UNSTAGE_VOLUME")
    d.caps("controller", "PUBLISH_UNPUBLISH_VOLUME")
    await d.call("NodeStageVolume", node_request(d, "NodeStageVolume", {}))
    bare = node_request(d, "NodePublishVolume", {}, staging_target_path="")
    got = await d.call("NodePublishVolume", bare)
    assert ("csi.field-missing-with-capability", "staging_target_path", "co") in ours(got)
    assert got.rejected is not None
    assert got.rejected.code is StatusCode.FAILED_PRECONDITION
    assert "staged on this node" in got.messages[0]
    good = await d.call("NodePublishVolume", node_request(d, "NodePublishVolume", {}))
    assert ours(good) == set() and good.rejected is None
    d.caps("node")  # without STAGE_UNSTAGE_VOLUME the path is not needed
    assert (await d.call("NodePublishVolume", bare)).rejected is None


@v1_and_v0()
async def test_ephemeral_inline_volumes_are_published_without_staging(spec):
    """kubelet publishes CSI ephemeral inline volumes without staging_target_path even when
    the node stages persistent ones: a volume the proxy never saw as persistent, or one
    marked ephemeral, is not judged."""
    d = Driver(spec, "enforce")
    d.caps("node", "STAGE_UNSTAGE_VOLUME")
    d.caps("controller", "PUBLISH_UNPUBLISH_VOLUME")
    inline = node_request(d, "NodePublishVolume", {}, staging_target_path="", volume_id="csi-1")
    for _ in range(2):  # the repeat finds the first publication in the proxy's memory
        got = await d.call("NodePublishVolume", inline)
        assert ours(got) == set() and got.rejected is None
    # a persistent volume the proxy saw created, marked ephemeral by the CO: not judged
    create = d.new("CreateVolumeRequest", name="p", volume_capabilities=[MOUNT])
    id_field = "volume_id" if spec == "csi.v1" else "id"
    await d.call("CreateVolume", create, d.new("CreateVolumeResponse", volume={id_field: "vol-1"}))
    marked = {"csi.storage.k8s.io/ephemeral": "true"}
    context = "volume_context" if spec == "csi.v1" else "volume_attributes"
    req = node_request(d, "NodePublishVolume", {}, staging_target_path="", **{context: marked})
    assert ours(await d.call("NodePublishVolume", req)) == set()
    unmarked = node_request(d, "NodePublishVolume", {}, staging_target_path="")
    got = await d.call("NodePublishVolume", unmarked)
    assert ("csi.field-missing-with-capability", "staging_target_path", "co") in ours(got)
    assert any("created or unstaged" in m for m in got.messages)


# -- csi.field-recommended-with-capability ----------------------------------------------------


async def test_node_expand_should_carry_the_staging_path():
    d = Driver("csi.v1", "enforce")
    d.caps("node", "STAGE_UNSTAGE_VOLUME", "EXPAND_VOLUME", "GET_VOLUME_STATS")
    bare = d.new("NodeExpandVolumeRequest", volume_id="v", volume_path=TARGET)
    got = await d.call("NodeExpandVolume", bare)
    assert ours(got) == {("csi.field-recommended-with-capability", "staging_target_path", "co")}
    assert got.rejected is None  # a SHOULD: reported only
    staged = d.new(
        "NodeExpandVolumeRequest", volume_id="v", volume_path=TARGET, staging_target_path=STAGE
    )
    assert ours(await d.call("NodeExpandVolume", staged)) == set()
    d.caps("node", "EXPAND_VOLUME")
    assert ours(await d.call("NodeExpandVolume", bare)) == set()


async def test_kubelets_stats_calls_without_staging_path_are_not_judged():
    """kubelet builds NodeGetVolumeStatsRequest with volume_id and volume_path only."""
    d = Driver("csi.v1")
    d.caps("node", "STAGE_UNSTAGE_VOLUME", "GET_VOLUME_STATS")
    req = d.new("NodeGetVolumeStatsRequest", volume_id="v", volume_path=TARGET)
    assert ours(await d.call("NodeGetVolumeStats", req)) == set()


# -- csi.capacity-range-empty -----------------------------------------------------------------


CAPACITY_CASES = [
    ("csi.v1", "CreateVolume", {"name": "p", "volume_capabilities": [MOUNT]}),
    ("csi.v0", "CreateVolume", {"name": "p", "volume_capabilities": [MOUNT]}),
    ("csi.v1", "ControllerExpandVolume", {"volume_id": "v"}),
    ("csi.v1", "NodeExpandVolume", {"volume_id": "v", "volume_path": TARGET}),
]


@pytest.mark.parametrize(("spec", "rpc", "fields"), CAPACITY_CASES)
async def test_capacity_range_needs_a_bound(spec, rpc, fields):
    d = Driver(spec, "enforce")
    d.caps("controller", "CREATE_DELETE_VOLUME", "EXPAND_VOLUME")
    d.caps("node", "EXPAND_VOLUME")
    got = await d.call(rpc, d.new(f"{rpc}Request", capacity_range={}, **fields))
    assert ours(got) == {("csi.capacity-range-empty", "capacity_range", "co")}
    assert got.rejected is not None and got.rejected.code is StatusCode.INVALID_ARGUMENT
    for bound in ({"required_bytes": 1 << 30}, {"limit_bytes": 1 << 30}):
        req = d.new(f"{rpc}Request", capacity_range=bound, **fields)
        assert ours(await d.call(rpc, req)) == set()


@v1_and_v0()
def test_every_request_with_a_capacity_range_is_checked(spec):
    loaded = load_spec(spec)
    hooks = csi_capabilities.hooks("x", spec == "csi.v1")
    registry = Registry([spec])
    holders = {
        m.name
        for m in registry.methods(spec)
        if m.request_class is not None
        and any(
            f.message_type is not None and f.message_type.name == "CapacityRange"
            for f in loaded.descriptor(m.request_class.DESCRIPTOR.full_name).fields
        )
    }
    assert holders == {rpc for s, rpc, _ in CAPACITY_CASES if s == spec}
    assert holders <= set(hooks.request_checks)


# -- csi.response-field-missing ---------------------------------------------------------------


def entry(i: int, status: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"volume": {"volume_id": f"vol-{i:04d}-" + "x" * 100}}
    if status is not None:
        out["status"] = status
    return out


HEALTHY = {"volume_condition": {"abnormal": False, "message": "ok"}}


async def test_list_volumes_entries_carry_what_the_capabilities_promise():
    d = Driver("csi.v1")
    d.caps("plugin", "CONTROLLER_SERVICE")
    d.caps("controller", "LIST_VOLUMES", "PUBLISH_UNPUBLISH_VOLUME", "LIST_VOLUMES_PUBLISHED_NODES")
    page = d.new(
        "ListVolumesResponse",
        entries=[entry(0, {}), entry(1, None), entry(2, None), entry(3, {})],
    )
    got = await d.call("ListVolumes", response=page)
    assert ours(got) == {("csi.response-field-missing", "entries[1].status", "plugin")}
    assert "LIST_VOLUMES_PUBLISHED_NODES" in got.messages[0]
    assert "1 more of the 4 entries" in got.messages[0]
    d.caps("controller", "LIST_VOLUMES", "VOLUME_CONDITION")
    got = await d.call("ListVolumes", response=page)
    assert ours(got) == {
        ("csi.response-field-missing", "entries[1].status", "plugin"),
        ("csi.response-field-missing", "entries[0].status.volume_condition", "plugin"),
    }
    complete = d.new("ListVolumesResponse", entries=[entry(i, HEALTHY) for i in range(3)])
    assert ours(await d.call("ListVolumes", response=complete)) == set()
    d.caps("controller", "LIST_VOLUMES")  # neither capability: nothing is promised
    assert ours(await d.call("ListVolumes", response=page)) == set()


async def test_a_sampled_page_names_the_real_entry():
    d = Driver("csi.v1")
    d.caps("plugin", "CONTROLLER_SERVICE")
    d.caps("controller", "LIST_VOLUMES", "PUBLISH_UNPUBLISH_VOLUME", "LIST_VOLUMES_PUBLISHED_NODES")
    n = 1000
    page = d.new(
        "ListVolumesResponse", entries=[entry(i, {} if i < 600 else None) for i in range(n)]
    )
    assert page.ByteSize() > 64 * 1024  # decoded from a sample of its entries
    kept = picked_indices(n)
    first = next(i for i in kept if i >= 600)
    for _ in range(2):  # the second time each entry is known by its bytes (listed_facts)
        got = await d.call("ListVolumes", response=page)
        assert ours(got) == {("csi.response-field-missing", f"entries[{first}].status", "plugin")}
        assert got.messages[0].startswith(f"entries[{first}].status is missing")
    assert len(d.state.part(CapabilityMemory).listed) == len(kept)
    page.entries[first].status.SetInParent()  # its bytes change: read again
    second = next(i for i in kept if i > first)
    got = await d.call("ListVolumes", response=page)
    assert ours(got) == {("csi.response-field-missing", f"entries[{second}].status", "plugin")}


async def test_controller_get_volume_condition():
    d = Driver("csi.v1")
    d.caps("plugin", "CONTROLLER_SERVICE")
    d.caps("controller", "GET_VOLUME", "VOLUME_CONDITION")
    req = d.new("ControllerGetVolumeRequest", volume_id="v")
    bare = d.new("ControllerGetVolumeResponse", volume={"volume_id": "v"}, status={})
    got = await d.call("ControllerGetVolume", req, bare)
    assert ours(got) == {("csi.response-field-missing", "status.volume_condition", "plugin")}
    healthy = d.new("ControllerGetVolumeResponse", volume={"volume_id": "v"}, status=HEALTHY)
    assert ours(await d.call("ControllerGetVolume", req, healthy)) == set()
    # no status at all is csi.required-field's to report, once
    no_status = d.new("ControllerGetVolumeResponse", volume={"volume_id": "v"})
    got = await d.call("ControllerGetVolume", req, no_status)
    assert ours(got) == set() and ("csi.required-field", "status", "plugin") in got.found
    d.caps("controller", "GET_VOLUME")
    assert ours(await d.call("ControllerGetVolume", req, bare)) == set()


async def test_node_volume_stats_condition():
    d = Driver("csi.v1")
    d.caps("node", "GET_VOLUME_STATS", "VOLUME_CONDITION")
    req = d.new("NodeGetVolumeStatsRequest", volume_id="v", volume_path=TARGET)
    got = await d.call("NodeGetVolumeStats", req, d.new("NodeGetVolumeStatsResponse"))
    assert ours(got) == {("csi.response-field-missing", "volume_condition", "plugin")}
    healthy = d.new("NodeGetVolumeStatsResponse", volume_condition=HEALTHY["volume_condition"])
    assert ours(await d.call("NodeGetVolumeStats", req, healthy)) == set()
    d.caps("node", "GET_VOLUME_STATS")
    got = await d.call("NodeGetVolumeStats", req, d.new("NodeGetVolumeStatsResponse"))
    assert ours(got) == set()


# -- csi.topology-without-capability, extended ------------------------------------------------


@v1_and_v0()
async def test_listed_volumes_with_topology_need_the_capability(spec):
    d = Driver(spec)
    id_field = "volume_id" if spec == "csi.v1" else "id"
    capability = (
        "VOLUME_ACCESSIBILITY_CONSTRAINTS" if spec == "csi.v1" else "ACCESSIBILITY_CONSTRAINTS"
    )
    d.caps("plugin", "CONTROLLER_SERVICE")
    d.caps("controller", "LIST_VOLUMES")
    page = d.new(
        "ListVolumesResponse",
        entries=[
            {"volume": {id_field: "a"}},
            {"volume": {id_field: "b", "accessible_topology": [ZONE]}},
        ],
    )
    got = await d.call("ListVolumes", response=page)
    where = "entries[1].volume.accessible_topology"
    assert ours(got) == {("csi.topology-without-capability", where, "plugin")}
    assert capability in got.messages[0]
    d.caps("plugin", "CONTROLLER_SERVICE", capability)
    assert ours(await d.call("ListVolumes", response=page)) == set()


async def test_controller_get_volume_topology_needs_the_capability():
    d = Driver("csi.v1")
    d.caps("plugin", "CONTROLLER_SERVICE")
    d.caps("controller", "GET_VOLUME")
    req = d.new("ControllerGetVolumeRequest", volume_id="v")
    resp = d.new(
        "ControllerGetVolumeResponse",
        volume={"volume_id": "v", "accessible_topology": [ZONE]},
        status={},
    )
    got = await d.call("ControllerGetVolume", req, resp)
    assert ours(got) == {
        ("csi.topology-without-capability", "volume.accessible_topology", "plugin")
    }
    d.caps("plugin", "CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS")
    assert ours(await d.call("ControllerGetVolume", req, resp)) == set()


async def test_node_get_info_learns_the_plugin_capabilities_first(tmp_path):
    """NodeGetInfo's accessible_topology needs the plugin capabilities: the proxy asks for
    them before the first NodeGetInfo, and judges its answer."""
    knobs = FakeKnobs(hide_capabilities={"VOLUME_ACCESSIBILITY_CONSTRAINTS"})
    async with through_proxy("csi.v1", tmp_path, knobs=knobs) as (c, proxy):
        await c.call("NodeGetInfo")
        found = {
            (e["rule"], e["method"].rsplit("/", 1)[-1]) for e in stage_of(proxy).report.snapshot()
        }
    assert found == {("csi.topology-without-capability", "NodeGetInfo")}
    async with through_proxy("csi.v1", tmp_path) as (c, proxy):
        await c.call("NodeGetInfo")
        assert stage_of(proxy).report.snapshot() == []


# -- csi.capabilities-inconsistent ------------------------------------------------------------


def caps_response(d: Driver, rpc: str, *names: str, expansion: tuple[str, ...] = ()) -> Any:
    resp = d.new(f"{rpc}Response")
    kind = {
        "GetPluginCapabilities": "service",
        "ControllerGetCapabilities": "rpc",
        "NodeGetCapabilities": "rpc",
    }[rpc]
    for name in names:
        inner = getattr(resp.capabilities.add(), kind)
        inner.type = inner.DESCRIPTOR.fields_by_name["type"].enum_type.values_by_name[name].number
    for name in expansion:
        inner = resp.capabilities.add().volume_expansion
        inner.type = inner.DESCRIPTOR.fields_by_name["type"].enum_type.values_by_name[name].number
    return resp


async def test_list_volumes_published_nodes_needs_publish_unpublish():
    d = Driver("csi.v1")
    bad = caps_response(
        d, "ControllerGetCapabilities", "LIST_VOLUMES", "LIST_VOLUMES_PUBLISHED_NODES"
    )
    got = await d.call("ControllerGetCapabilities", response=bad)
    assert ours(got) == {("csi.capabilities-inconsistent", "capabilities", "plugin")}
    good = caps_response(
        d,
        "ControllerGetCapabilities",
        "LIST_VOLUMES",
        "LIST_VOLUMES_PUBLISHED_NODES",
        "PUBLISH_UNPUBLISH_VOLUME",
    )
    assert ours(await d.call("ControllerGetCapabilities", response=good)) == set()


async def test_online_expansion_needs_an_expand_capability():
    d = Driver("csi.v1")
    plugin = caps_response(d, "GetPluginCapabilities", "CONTROLLER_SERVICE", expansion=("ONLINE",))
    # nothing known of the controller and node yet: not judged
    assert ours(await d.call("GetPluginCapabilities", response=plugin)) == set()
    controller = caps_response(d, "ControllerGetCapabilities", "CREATE_DELETE_VOLUME")
    assert ours(await d.call("ControllerGetCapabilities", response=controller)) == set()
    node = caps_response(d, "NodeGetCapabilities", "STAGE_UNSTAGE_VOLUME")
    got = await d.call("NodeGetCapabilities", response=node)
    assert ours(got) == {("csi.capabilities-inconsistent", "capabilities", "plugin")}
    assert "ONLINE" in got.messages[0]
    # judged again on the next plugin answer, with the sets last seen
    got = await d.call("GetPluginCapabilities", response=plugin)
    assert ("csi.capabilities-inconsistent", "capabilities", "plugin") in ours(got)
    node_expands = caps_response(d, "NodeGetCapabilities", "STAGE_UNSTAGE_VOLUME", "EXPAND_VOLUME")
    assert ours(await d.call("NodeGetCapabilities", response=node_expands)) == set()


async def test_an_empty_set_is_not_taken_for_a_service_without_expansion():
    """An instance that does not serve a service may answer its capability query with an
    empty list: that is not the plugin's controller or node capabilities."""
    d = Driver("csi.v1")
    d.caps("controller")
    d.caps("node")
    plugin = caps_response(
        d, "GetPluginCapabilities", "CONTROLLER_SERVICE", expansion=("ONLINE", "OFFLINE")
    )
    assert ours(await d.call("GetPluginCapabilities", response=plugin)) == set()


async def test_offline_expansion_needs_the_controllers_expand_volume():
    d = Driver("csi.v1")
    d.caps("controller", "CREATE_DELETE_VOLUME")
    plugin = caps_response(d, "GetPluginCapabilities", "CONTROLLER_SERVICE", expansion=("OFFLINE",))
    got = await d.call("GetPluginCapabilities", response=plugin)
    assert ours(got) == {("csi.capabilities-inconsistent", "capabilities", "plugin")}
    assert "OFFLINE" in got.messages[0] and "EXPAND_VOLUME" in got.messages[0]
    d.caps("controller", "CREATE_DELETE_VOLUME", "EXPAND_VOLUME")
    assert ours(await d.call("GetPluginCapabilities", response=plugin)) == set()
    # without a controller service at all, nothing else needs to be known
    e = Driver("csi.v1")
    no_controller = caps_response(
        e, "GetPluginCapabilities", "VOLUME_ACCESSIBILITY_CONSTRAINTS", expansion=("OFFLINE",)
    )
    got = await e.call("GetPluginCapabilities", response=no_controller)
    assert ours(got) == {
        ("csi.capabilities-inconsistent", "capabilities", "plugin"),
        ("csi.controller-service-recommended", "capabilities", "plugin"),
    }


# -- csi.controller-service-recommended -------------------------------------------------------


@v1_and_v0()
async def test_plugins_should_provide_the_controller_service(spec):
    d = Driver(spec)
    accessibility = (
        "VOLUME_ACCESSIBILITY_CONSTRAINTS" if spec == "csi.v1" else "ACCESSIBILITY_CONSTRAINTS"
    )
    got = await d.call(
        "GetPluginCapabilities", response=caps_response(d, "GetPluginCapabilities", accessibility)
    )
    assert ours(got) == {("csi.controller-service-recommended", "capabilities", "plugin")}
    full = caps_response(d, "GetPluginCapabilities", "CONTROLLER_SERVICE", accessibility)
    assert ours(await d.call("GetPluginCapabilities", response=full)) == set()


# -- csi.capabilities-changed -----------------------------------------------------------------


def info(d: Driver, version: str) -> Any:
    return d.new("GetPluginInfoResponse", name="csi.example.com", vendor_version=version)


@v1_and_v0()
async def test_capabilities_changed_within_one_version(spec):
    d = Driver(spec)
    a = caps_response(d, "GetPluginCapabilities", "CONTROLLER_SERVICE")
    b = caps_response(
        d,
        "GetPluginCapabilities",
        "CONTROLLER_SERVICE",
        "VOLUME_ACCESSIBILITY_CONSTRAINTS" if spec == "csi.v1" else "ACCESSIBILITY_CONSTRAINTS",
    )
    assert ours(await d.call("GetPluginInfo", response=info(d, "1.2.3"))) == set()
    await d.call("GetPluginCapabilities", response=a)
    assert ours(await d.call("GetPluginInfo", response=info(d, "1.2.3"))) == set()
    await d.call("GetPluginCapabilities", response=a)  # the same set again: fine
    assert ours(await d.call("GetPluginInfo", response=info(d, "1.2.3"))) == set()
    await d.call("GetPluginCapabilities", response=b)
    got = await d.call("GetPluginInfo", response=info(d, "1.2.3"))
    assert ours(got) == {("csi.capabilities-changed", "vendor_version", "plugin")}
    assert "adds " in got.messages[0] and "1.2.3" not in got.messages[0]
    # reported once: b is now the version's set
    await d.call("GetPluginCapabilities", response=b)
    assert ours(await d.call("GetPluginInfo", response=info(d, "1.2.3"))) == set()


async def test_a_new_version_in_between_is_never_blamed():
    d = Driver("csi.v1")
    a = caps_response(d, "GetPluginCapabilities", "CONTROLLER_SERVICE")
    b = caps_response(d, "GetPluginCapabilities", "CONTROLLER_SERVICE", "GROUP_CONTROLLER_SERVICE")
    await d.call("GetPluginInfo", response=info(d, "1.0"))
    await d.call("GetPluginCapabilities", response=a)
    await d.call("GetPluginInfo", response=info(d, "1.0"))
    # the plugin is upgraded: its answer may come from either version until confirmed
    await d.call("GetPluginCapabilities", response=b)
    assert ours(await d.call("GetPluginInfo", response=info(d, "1.1"))) == set()
    await d.call("GetPluginCapabilities", response=b)
    assert ours(await d.call("GetPluginInfo", response=info(d, "1.1"))) == set()
    # an answer before any GetPluginInfo is attributed to no version
    e = Driver("csi.v1")
    await e.call("GetPluginCapabilities", response=a)
    await e.call("GetPluginInfo", response=info(e, "1.0"))
    await e.call("GetPluginCapabilities", response=b)
    assert ours(await e.call("GetPluginInfo", response=info(e, "1.0"))) == set()


def test_capability_memory_is_bounded_and_ages():
    now = [1000.0]
    st = SpecState(lifecycle_ttl=60.0, clock=lambda: now[0])
    memory = st.part(CapabilityMemory)
    assert st.part(CapabilityMemory) is memory  # one per spec state
    a, b = frozenset({"CONTROLLER_SERVICE"}), frozenset()
    memory.capabilities_answered(a)
    assert memory.pending == {}  # no version seen yet: nothing to attribute it to
    memory.version_answered("1")
    memory.capabilities_answered(a)
    assert memory.version_answered("1") == []
    memory.capabilities_answered(b)
    now[0] += 61  # the version was last confirmed too long ago
    memory.capabilities_answered(a)
    assert memory.pending == {b: 1000.0}
    assert memory.version_answered("1") == []
    assert memory.confirmed is None and memory.pending == {}
    memory.capabilities_answered(a)
    assert memory.version_answered("1") == []
    for i in range(20):  # a flood of distinct answers keeps a handful
        memory.capabilities_answered(frozenset({f"X{i}"}))
    assert len(memory.pending) == csi_capabilities._PENDING_MAX
    assert len(memory.version_answered("1")) == csi_capabilities._PENDING_MAX
    memory.controller_at = now[0]
    assert memory.serves_controller()
    now[0] += 61
    assert not memory.serves_controller()


# -- through a real proxy, in front of the fake plugin ----------------------------------------


async def test_fake_plugin_hiding_capabilities_through_an_enforcing_proxy(tmp_path):
    knobs = FakeKnobs(hide_capabilities={"PUBLISH_READONLY", "MODIFY_VOLUME"})
    async with through_proxy("csi.v1", tmp_path, "--validation", "enforce", knobs=knobs) as (
        c,
        proxy,
    ):
        info_ = await c.call("NodeGetInfo")
        cap = mount_cap(c)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.call(
                "CreateVolume",
                name="p",
                volume_capabilities=[cap],
                mutable_parameters={"iops": "500"},
            )
        assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert exc.value.details().startswith("plugproxy: csi.field-without-capability")
        vol = (await c.call("CreateVolume", name="p", volume_capabilities=[cap])).volume
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.call(
                "ControllerPublishVolume",
                volume_id=vol.volume_id,
                node_id=info_.node_id,
                volume_capability=cap,
                readonly=True,
            )
        assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        await c.call(
            "ControllerPublishVolume",
            volume_id=vol.volume_id,
            node_id=info_.node_id,
            volume_capability=cap,
        )
        found = {
            (e["rule"], e["party"], e["method"].rsplit("/", 1)[-1]): e["count"]
            for e in stage_of(proxy).report.snapshot()
        }
    assert found == {
        ("csi.field-without-capability", "co", "CreateVolume"): 1,
        ("csi.field-without-capability", "co", "ControllerPublishVolume"): 1,
    }
