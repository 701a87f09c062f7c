"""CSI call order and publication answers judged from this socket's own history
(rules/csi_order.py): each rule planted by the party it judges, the same calls made
legitimately, and the Kubernetes, HA and restart cases that must stay quiet; through the real
validate stage driven in-process (the Proxy of tests/csi_harness.py)."""

from __future__ import annotations

from typing import Any

import pytest

from plugproxy.core.memory import HANDOVER
from plugproxy.rules import TABLES
from plugproxy.rules.csi_order import OrderChecks, OrderState
from tests import csi_harness as harness
from tests.csi_harness import NODE, OTHER, RWO, RWX, V1_CAPS, Proxy

MINE: dict[str, str] = {
    "csi.unpublish-not-published-refused": "MUST",
    "csi.publish-retry-unresolved": "SHOULD",
    "csi.publish-conflict-node-unnamed": "SHOULD",
}


@pytest.fixture(autouse=True)
def _family(monkeypatch: pytest.MonkeyPatch) -> None:
    # the Proxy reports the rules of its module's FAMILY: add this family's
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | set(MINE))


def test_the_family_defines_its_rules_in_both_versions_and_enforces_none():
    for spec, title in (("csi.v1", "CSI v1.12 §"), ("csi.v0", "CSI v0.3 §")):
        rules = {r.id: r for r in TABLES[spec].rules}
        for rid, level in MINE.items():
            assert rules[rid].reject_code is None, rid
            assert rules[rid].section.startswith(title), rid
            assert rules[rid].level == level, rid


def attacher_here(p: Proxy) -> None:
    """A ControllerPublishVolume of another volume: the attacher's calls pass here."""
    p.publish("vol-0")


def unpublish(p: Proxy, vid: str = "vol-1", node: str = NODE, code: str = "OK") -> set[str]:
    req = {"volume_id": vid, "node_id": node} if node else {"volume_id": vid}
    return p.ids("ControllerUnpublishVolume", req, {}, code)


def node_publish(p: Proxy, staging: str = "/s", code: str = "OK", **extra: Any) -> set[str]:
    req: dict[str, Any] = {
        "volume_id": "vol-1",
        "target_path": "/t",
        "volume_capability": RWO,
        **extra,
    }
    if staging:
        req["staging_target_path"] = staging
    return p.ids("NodePublishVolume", req, {}, code)


# -- NodePublishVolume after "staging target path not set" ---------------------------------


def test_a_retry_with_a_staging_path_needs_a_successful_stage_since_the_refusal():
    p = Proxy()
    node_publish(p, staging="", code="FAILED_PRECONDITION")
    assert node_publish(p) == {"csi.call-order"}
    assert "staging target path not set" in p.messages() and p.last[0]["party"] == "co"
    assert not p.rejected  # reported, never enforced
    node_publish(p, staging="", code="FAILED_PRECONDITION")
    assert p.stage_at("/s") == set()
    assert node_publish(p) == set()
    # staged at another path only: the retry's path was not staged
    q = Proxy()
    node_publish(q, staging="", code="FAILED_PRECONDITION")
    q.stage_at("/other")
    assert node_publish(q) == {"csi.call-order"}
    # a failed stage since the refusal is no success
    r = Proxy()
    node_publish(r, staging="", code="FAILED_PRECONDITION")
    r.stage_at("/s", code="INTERNAL")
    assert node_publish(r) == {"csi.call-order"}


def test_refusals_of_another_row_and_what_a_proxy_cannot_know_stay_quiet():
    # FAILED_PRECONDITION to a request with a staging path: another row (capabilities)
    p = Proxy()
    node_publish(p, code="FAILED_PRECONDITION")
    assert node_publish(p, staging="/s2") == set()
    # without STAGE_UNSTAGE_VOLUME the refusal is "exceeds capabilities"
    q = Proxy(caps={**V1_CAPS, "node": {"GET_VOLUME_STATS"}})
    node_publish(q, staging="", code="FAILED_PRECONDITION")
    assert node_publish(q) == set()
    # a refusal this proxy did not see (it started after): nothing to judge
    assert node_publish(Proxy()) == set()
    # inline ephemeral volumes are published without staging path: never judged here
    r = Proxy()
    node_publish(r, staging="", code="FAILED_PRECONDITION")
    assert node_publish(r, staging="") == set()
    # staged here before the refusal and not unstaged: the retry's path is staged
    s = Proxy()
    s.stage_at("/s")
    node_publish(s, staging="", code="FAILED_PRECONDITION")
    assert node_publish(s) == set()


# -- NodePublishVolume after a failed NodeStageVolume ----------------------------------------


def test_publish_at_a_path_whose_last_stage_failed():
    p = Proxy()
    p.stage_at("/s", code="INTERNAL")
    assert node_publish(p) == {"csi.call-order"}
    assert "last NodeStageVolume here failed" in p.messages()
    assert not p.rejected
    p.stage_at("/s")  # kubelet stages again before publishing
    assert node_publish(p) == set()
    # staged, then a repeat fails: the last word on the path is the failure
    p.stage_at("/s", code="NOT_FOUND")
    assert node_publish(p) == {"csi.call-order"}


def test_a_stage_whose_outcome_is_unknown_or_elsewhere_is_not_judged():
    p = Proxy()
    p.stage_at("/s", code="DEADLINE_EXCEEDED")  # it may have staged: not judged
    assert node_publish(p) == set()
    q = Proxy()
    q.stage_at("/s")
    q.stage_at("/other", code="INTERNAL")  # another path failed
    assert node_publish(q) == set()
    # kubelet after a proxy restart: stages (OK), then publishes
    r = Proxy()
    r.stage_at("/s")
    assert node_publish(r) == set()
    # csi-sanity's negative cases: requests without their REQUIRED fields
    s = Proxy()
    s.stage_at("/s", code="INVALID_ARGUMENT")
    req = {"volume_id": "vol-1", "staging_target_path": "/s", "volume_capability": RWO}
    assert s.ids("NodePublishVolume", req, {}, "INVALID_ARGUMENT") == set()  # no target_path


# -- NodeStageVolume before ControllerPublishVolume (unified socket) -------------------------


def test_stage_before_controller_publish_on_a_unified_socket():
    p = Proxy()
    attacher_here(p)
    p.create()
    p.node_info()
    assert p.stage_at() == {"csi.call-order"}
    assert "not ControllerPublished to this node" in p.messages()
    assert p.last[0]["party"] == "co" and not p.rejected
    # the plugin's refusal is not reported a second time
    assert p.stage_at(code="FAILED_PRECONDITION") == {"csi.call-order"}
    assert len(p.last) == 1
    # csi-sanity and Kubernetes publish first
    p.publish()
    assert p.stage_at() == set()
    # unpublished from this node since: stage again only after a new publish
    p.call("NodeUnstageVolume", {"volume_id": "vol-1", "staging_target_path": "/s"})
    unpublish(p)
    assert p.stage_at() == {"csi.call-order"}
    assert "unpublished from this node" in p.messages()


def test_node_publish_before_controller_publish_on_a_unified_socket():
    p = Proxy(caps={**V1_CAPS, "node": {"GET_VOLUME_STATS"}})  # no staging
    attacher_here(p)
    p.create()
    p.node_info()
    assert node_publish(p, staging="") == {"csi.call-order"}
    assert "NodePublishVolume of a volume not ControllerPublished" in p.messages()
    # the plugin's refusal is not reported a second time
    assert node_publish(p, staging="", code="FAILED_PRECONDITION") == {"csi.call-order"}
    assert len(p.last) == 1
    p.publish()
    assert node_publish(p, staging="") == set()


def test_stage_order_stays_quiet_where_another_replica_may_have_published():
    # the attacher's calls begin passing here only after the volume's creation
    p = Proxy()
    p.create()
    p.clock.now += 1
    attacher_here(p)
    p.node_info()
    assert p.stage_at() == set()
    # a gap of a lease in the attacher's calls since the creation
    q = Proxy()
    attacher_here(q)
    q.create()
    q.node_info()
    q.clock.now += HANDOVER + 1
    assert q.stage_at() == set()
    # no ControllerPublishVolume through this socket at all (a node socket, attachRequired off)
    r = Proxy()
    r.create()
    r.node_info()
    assert r.stage_at() == set()
    # published to another node only, or not created here, or no PUBLISH_UNPUBLISH_VOLUME
    s = Proxy()
    attacher_here(s)
    s.create()
    s.node_info()
    s.publish(node=OTHER)
    assert s.stage_at() == {"csi.call-order"}  # this node's publication is missing
    assert s.stage_at(vid="vol-9") == set()
    t = Proxy(caps={**V1_CAPS, "controller": {"CREATE_DELETE_VOLUME"}})
    attacher_here(t)
    t.create()
    t.node_info()
    assert t.stage_at() == set()
    # csi-sanity stages a volume it did not publish only in requests missing a REQUIRED field
    u = Proxy()
    attacher_here(u)
    u.create()
    u.node_info()
    req = {"volume_id": "vol-1", "staging_target_path": "/s"}
    assert u.ids("NodeStageVolume", req, {}, "INVALID_ARGUMENT") == set()


# -- ControllerUnpublishVolume of a volume not published to the node -------------------------


def test_unpublish_of_a_volume_never_published_must_answer_ok():
    p = Proxy()
    attacher_here(p)
    p.create()
    assert unpublish(p, code="INTERNAL") == {"csi.unpublish-not-published-refused"}
    assert p.last[0]["party"] == "plugin" and "MUST answer OK" in p.messages()
    assert unpublish(p, code="FAILED_PRECONDITION") == {"csi.unpublish-not-published-refused"}
    assert unpublish(p) == set()
    # published, unpublished, then refused: not published since the unpublish
    p.publish()
    assert unpublish(p, code="INTERNAL") == set()  # published: a failure may be real
    assert unpublish(p) == set()
    assert unpublish(p, code="UNKNOWN") == {"csi.unpublish-not-published-refused"}
    assert "unpublished from it" in p.messages()


def test_unpublish_answers_that_say_nothing_of_the_attachment_are_not_judged():
    p = Proxy()
    attacher_here(p)
    p.create()
    for code in ("INVALID_ARGUMENT", "ABORTED", "UNAVAILABLE", "PERMISSION_DENIED"):
        assert unpublish(p, code=code) == set(), code
    assert unpublish(p, node="", code="INTERNAL") == set()  # every node: not judged


def test_not_found_is_judged_only_when_the_node_and_the_volume_surely_exist():
    # the node is unknown here: "node does not exist" is a tabled answer
    p = Proxy()
    attacher_here(p)
    p.create()
    assert unpublish(p, node="node-9", code="NOT_FOUND") == set()
    # this socket's own node (NodeGetInfo), and the volume created with the provisioner's
    # calls passing here since: the volume and the node exist
    p.node_info()
    assert unpublish(p, code="NOT_FOUND") == {"csi.unpublish-not-published-refused"}
    # a node with a publish answered OK moments ago exists too
    q = Proxy()
    q.publish("vol-0", node=OTHER)
    q.create()
    assert unpublish(q, node=OTHER, code="NOT_FOUND") == {"csi.unpublish-not-published-refused"}
    # a lease without provisioner calls: another replica may have deleted the volume
    q.clock.now += HANDOVER + 1
    attacher_here(q)
    q.node_info()
    assert unpublish(q, code="NOT_FOUND") == set()


def test_unpublish_stays_quiet_where_another_replica_may_have_acted():
    p = Proxy()
    p.create()
    p.clock.now += 1
    attacher_here(p)  # the attacher's calls begin after the creation
    assert unpublish(p, code="INTERNAL") == set()
    q = Proxy()
    attacher_here(q)
    q.create()
    q.clock.now += HANDOVER + 1  # a gap of a lease: another replica may have published
    assert unpublish(q, code="INTERNAL") == set()
    r = Proxy()
    attacher_here(r)
    r.create()
    r.call("DeleteVolume", {"volume_id": "vol-1"})  # deleted: forgotten
    assert unpublish(r, code="INTERNAL") == set()
    assert unpublish(r, vid="vol-9", code="INTERNAL") == set()  # never seen


# -- ControllerPublishVolume retried without the cause removed -------------------------------


def test_a_retry_after_published_elsewhere_needs_an_unpublish_elsewhere():
    p = Proxy()
    p.publish(node=OTHER, code="FAILED_PRECONDITION")
    assert p.publish(node=OTHER, code="FAILED_PRECONDITION") == {"csi.publish-retry-unresolved"}
    assert p.last[0]["party"] == "co" and not p.rejected
    unpublish(p, node=OTHER)  # the same node: not what blocks it
    assert p.publish(node=OTHER) == {"csi.publish-retry-unresolved"}
    p.publish(node=OTHER, code="FAILED_PRECONDITION")
    unpublish(p, node=NODE)
    assert p.publish(node=OTHER) == set()
    p.publish(node=OTHER, code="FAILED_PRECONDITION")
    unpublish(p, node="")  # from every node
    assert p.publish(node=OTHER) == set()
    p.publish(node=OTHER, code="FAILED_PRECONDITION")
    unpublish(p, node=NODE, code="NOT_FOUND")  # tabled: nothing stays published there
    assert p.publish(node=OTHER) == set()
    # the CO looked: ControllerGetVolume shows it published to no other node
    p.publish(node=OTHER, code="FAILED_PRECONDITION")
    get = {"volume": {"volume_id": "vol-1"}, "status": {"published_node_ids": [NODE]}}
    p.call("ControllerGetVolume", {"volume_id": "vol-1"}, get)
    assert p.publish(node=OTHER, code="FAILED_PRECONDITION") == {"csi.publish-retry-unresolved"}
    get["status"] = {"published_node_ids": [OTHER]}
    p.call("ControllerGetVolume", {"volume_id": "vol-1"}, get)
    assert p.publish(node=OTHER) == set()


def test_a_retry_after_the_node_was_full_needs_a_slot_freed():
    p = Proxy()
    p.publish(node=OTHER, code="RESOURCE_EXHAUSTED")
    assert p.publish(node=OTHER, code="RESOURCE_EXHAUSTED") == {"csi.publish-retry-unresolved"}
    assert "RESOURCE_EXHAUSTED" in p.messages()
    unpublish(p, "vol-0", node=NODE)  # another node's slot
    assert p.publish(node=OTHER) == {"csi.publish-retry-unresolved"}
    p.publish(node=OTHER, code="RESOURCE_EXHAUSTED")
    unpublish(p, "vol-0", node=OTHER)
    assert p.publish(node=OTHER) == set()
    p.publish(node=OTHER, code="RESOURCE_EXHAUSTED")
    p.publish("vol-7", node=OTHER)  # another volume attached fine: a slot was free
    assert p.publish(node=OTHER) == set()
    assert p.publish("vol-8", node=OTHER) == set()  # not a retry


def test_retries_after_a_gap_of_a_lease_are_not_judged():
    # the external-attacher backs off up to minutes; an unpublish may pass through another
    # replica once the lease of this one lapsed
    p = Proxy()
    p.publish(node=OTHER, code="FAILED_PRECONDITION")
    p.clock.now += HANDOVER + 1
    assert p.publish(node=OTHER, code="FAILED_PRECONDITION") == set()
    p.publish(node=OTHER, code="RESOURCE_EXHAUSTED")
    p.clock.now += 10
    attacher_here(p)
    p.clock.now += 10  # calls 10 s apart: no gap of a lease, still this replica's
    assert p.publish(node=OTHER) == {"csi.publish-retry-unresolved"}


# -- FAILED_PRECONDITION naming the node ------------------------------------------------------


def test_published_elsewhere_names_the_node_this_socket_saw():
    p = Proxy()
    p.publish(node=NODE)
    # the Proxy's plugin answers "the plugin says no": no node named
    assert p.publish(node=OTHER, code="FAILED_PRECONDITION") == {
        "csi.publish-conflict-node-unnamed"
    }
    assert p.last[0]["party"] == "plugin" and NODE not in p.messages()
    # a multi-node access mode: the refusal is not that row (the retry is judged apart)
    unnamed = "csi.publish-conflict-node-unnamed"
    assert unnamed not in p.publish(node=OTHER, cap=RWX, code="FAILED_PRECONDITION")
    # unpublished from it since: the conflict is not with a node this socket knows
    unpublish(p, node=NODE)
    assert p.publish(node="node-3", code="FAILED_PRECONDITION") == set()
    # a publication a lease old, with the attacher's calls interrupted: maybe redone elsewhere
    q = Proxy()
    q.publish(node=NODE)
    q.clock.now += HANDOVER + 1
    assert q.publish(node=OTHER, code="FAILED_PRECONDITION") == set()


def test_a_message_naming_the_node_is_enough():
    p = Proxy()
    p.publish(node=NODE)
    checks = OrderChecks("volume_id")
    cs = p.stage._plans[p.paths["ControllerPublishVolume"]].spec

    class _Call:
        details = f"volume vol-1 is attached to {NODE}"

    info = harness.REG.lookup(p.paths["ControllerPublishVolume"])
    assert info.request_class is not None
    req = info.request_class(volume_id="vol-1", node_id=OTHER, volume_capability=RWO)
    found = list(checks.conflict_message(cs, p.state, _Call(), req, "FAILED_PRECONDITION"))  # type: ignore[arg-type]
    assert found == []
    _Call.details = "volume vol-1 is attached elsewhere"
    found = list(checks.conflict_message(cs, p.state, _Call(), req, "FAILED_PRECONDITION"))  # type: ignore[arg-type]
    assert [v.rule.id for v in found] == ["csi.publish-conflict-node-unnamed"]


# -- CSI v0.3 -------------------------------------------------------------------------------


def test_csi_v0_node_order():
    q = Proxy("csi.v0")
    q.stage_at("/s", code="INTERNAL")
    assert node_publish(q) == {"csi.call-order"}


def test_csi_v0_stage_before_controller_publish():
    p = Proxy("csi.v0")
    attacher_here(p)
    p.create()
    p.node_info()
    assert p.stage_at() == {"csi.call-order"}


def test_csi_v0_unpublish_of_a_volume_never_published():
    p = Proxy("csi.v0")
    attacher_here(p)
    p.create()
    assert unpublish(p, code="INTERNAL") == {"csi.unpublish-not-published-refused"}


def test_csi_v0_retry_after_the_node_was_full():
    q = Proxy("csi.v0")
    q.publish(node=OTHER, code="RESOURCE_EXHAUSTED")
    assert q.publish(node=OTHER, code="RESOURCE_EXHAUSTED") == {"csi.publish-retry-unresolved"}


def test_memory_is_bounded_and_expires():
    p = Proxy(max_volumes=4)
    for i in range(10):
        p.stage_at(f"/s{i}", vid=f"vol-{i}", code="INTERNAL")
    mem = p.state.part(OrderState)
    assert len(mem.stages) == 4
    p.clock.now += p.state.lifecycle_ttl + 1
    assert len(mem.stages) == 0
    assert node_publish(p, staging="/s9") == set()  # forgotten: unknown, never a fault
