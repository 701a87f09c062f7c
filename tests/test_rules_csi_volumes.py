"""CSI volumes and their publications across calls (rules/csi_volumes.py): each rule planted
by the party it judges, and the same calls made legitimately, through the real validate stage
driven in-process (tests/csi_harness.py); the HA, expiry and Kubernetes cases that must stay
quiet; and a few end-to-end checks through a real proxy."""

from __future__ import annotations

import os
from typing import Any

import grpc
import pytest

from plugproxy.core.memory import HANDOVER
from plugproxy.core.sampling import SAMPLE_MIN_BYTES
from plugproxy.fakes import SpecClient, start_fake_plugin
from plugproxy.rules import TABLES
from plugproxy.rules.csi_volumes import VolumeMemory
from tests.csi_harness import (
    MINE,
    NODE,
    OTHER,
    REG,
    RWO,
    RWO_BLOCK,
    RWOP,
    RWX,
    SECRET,
    V0_ONLY_ABSENT,
    V1_CAPS,
    Proxy,
)
from tests.integration.test_validation_lifecycle import stage_of, through_proxy
from tests.support import channel, start_proxy, start_recorder


def test_the_family_defines_its_rules_in_both_versions_and_enforces_none():
    v1 = {r.id: r for r in TABLES["csi.v1"].rules}
    v0 = {r.id: r for r in TABLES["csi.v0"].rules}
    assert v1.keys() >= MINE
    assert v0.keys() >= MINE - V0_ONLY_ABSENT
    assert not (v0.keys() & V0_ONLY_ABSENT)
    for rid in MINE:
        rule = v1[rid]
        assert rule.reject_code is None, rid  # stateful: reported, never enforced
        assert rule.section.startswith("CSI v1.12 §"), rid
    assert v0["csi.volume-context-changed"].section.startswith("CSI v0.3 §")


# -- volume_context --------------------------------------------------------------------------


def test_a_volume_context_that_changes_is_the_plugins_fault():
    p = Proxy()
    p.create(context={"pool": "gold", "token": SECRET})
    entry = {"volume": {"volume_id": "vol-1", "volume_context": {"pool": "gold", "token": "x"}}}
    assert p.call("ListVolumes", {}, {"entries": [{"volume": {"volume_id": "vol-0"}}, entry]}) == [
        ("csi.volume-context-changed", "plugin", "entries[1].volume.volume_context")
    ]
    assert "CreateVolume returned" in p.messages() and SECRET not in p.messages()
    # reported once per change: the new one is what is remembered now
    assert p.ids("ListVolumes", {}, {"entries": [entry]}) == set()
    moved = {"volume_id": "vol-1", "volume_context": {"pool": "silver"}}
    assert p.ids("ControllerGetVolume", {"volume_id": "vol-1"}, {"volume": moved}) == {
        "csi.volume-context-changed"
    }
    assert "ListVolumes returned" in p.messages()


def test_the_same_volume_context_or_none_reported_is_not_a_change():
    p = Proxy()
    p.create(context={"pool": "gold"})
    same = {"volume": {"volume_id": "vol-1", "volume_context": {"pool": "gold"}}}
    bare = {"volume": {"volume_id": "vol-1", "capacity_bytes": 5}}  # context not listed
    assert p.ids("ListVolumes", {}, {"entries": [same, bare]}) == set()
    assert p.ids("ControllerGetVolume", {"volume_id": "vol-1"}, same) == set()


def test_create_volume_is_compared_with_an_identical_create_only():
    p = Proxy()
    p.create(context={"pool": "gold"}, parameters={"type": "ssd"})
    # an identical repeat (secrets may rotate) must answer the same volume
    assert p.create(
        context={"pool": "silver"}, parameters={"type": "ssd"}, secrets={"k": "rotated"}
    ) == {"csi.volume-context-changed"}
    # the same id from other arguments: the volume was deleted and made again elsewhere
    assert p.create(context={"pool": "bronze"}, parameters={"type": "hdd"}) == set()


def test_volume_context_changed_in_csi_v0_attributes():
    p = Proxy("csi.v0", caps={})
    p.create(context={"pool": "gold"})
    entry = {"volume": {"id": "vol-1", "attributes": {"pool": "silver"}}}
    assert p.call("ListVolumes", {}, {"entries": [entry]}) == [
        ("csi.volume-context-changed", "plugin", "entries[0].volume.attributes")
    ]


def test_any_other_map_is_a_change_and_the_same_map_in_any_order_is_not():
    p = Proxy()

    def listed(context: dict[str, str]) -> set[str]:
        entry = {"volume": {"volume_id": "vol-1", "volume_context": context}}
        return p.ids("ListVolumes", {}, {"entries": [entry]})

    assert listed({"a": "1", "b": "2"}) == set()
    assert listed({"b": "2", "a": "1"}) == set()
    for other in ({"a": "2", "b": "1"}, {"a": "1", "b": "2", "c": ""}, {"a": "1"}, {"b": "1"}):
        assert listed(other) == {"csi.volume-context-changed"}, other


def long_listing(contexts: dict[int, dict[str, str]], n: int = 1000) -> dict[str, Any]:
    """A ListVolumes answer long enough to be judged on a sample (plugproxy.core.sampling)."""
    pad = {"pool": "gold", "zone": "zone-a", "note": "p" * 60}
    return {
        "entries": [
            {"volume": {"volume_id": f"vol-{i}", "volume_context": contexts.get(i, pad)}}
            for i in range(n)
        ]
    }


def test_a_long_sampled_listing_reports_a_changed_context_at_its_real_index():
    """Entry 999 is the last of the page, always in the sample; entry 3 is in its head."""
    p = Proxy()
    p.node_info()
    created = {"pool": "gold", "token": SECRET}
    p.create("vol-3", created)
    same = long_listing({3: dict(reversed(created.items()))})  # the map in another order
    encoded = REG.lookup(p.paths["ListVolumes"]).response_class(**same).SerializeToString()
    assert len(encoded) >= SAMPLE_MIN_BYTES  # judged on a sample indeed
    assert p.call("ListVolumes", {}, same) == []
    assert p.call("ListVolumes", {}, same) == []
    # changed between two listings
    moved = long_listing({3: created, 999: {"pool": "silver"}})
    assert p.call("ListVolumes", {}, moved) == [
        ("csi.volume-context-changed", "plugin", "entries[999].volume.volume_context")
    ]
    assert "ListVolumes returned" in p.messages() and "(1 entries)" in p.messages()
    # changed against what CreateVolume returned
    leaked = long_listing({3: {"pool": "gold", "token": "other"}})
    assert p.call("ListVolumes", {}, leaked) == [
        ("csi.volume-context-changed", "plugin", "entries[3].volume.volume_context"),
        ("csi.volume-context-changed", "plugin", "entries[999].volume.volume_context"),
    ]
    assert "CreateVolume returned" in p.messages() and SECRET not in p.messages()


def test_entries_listed_again_are_compared_with_what_the_plugin_said_since():
    """A listed entry is read once and then known by its bytes (VolumeMemory.listed);
    the comparison with what the plugin said of the volume since still happens."""
    p = Proxy(caps={**V1_CAPS, "controller": {*V1_CAPS["controller"], "GET_VOLUME"}})
    p.node_info()
    page = long_listing({})
    assert p.call("ListVolumes", {}, page) == []
    assert len(p.state.part(VolumeMemory).listed) == 256  # the whole sample
    other = {"volume": {"volume_id": "vol-999", "volume_context": {"pool": "silver"}}}
    assert p.call("ControllerGetVolume", {"volume_id": "vol-999"}, other) == [
        ("csi.volume-context-changed", "plugin", "volume.volume_context")
    ]
    assert p.call("ListVolumes", {}, page) == [
        ("csi.volume-context-changed", "plugin", "entries[999].volume.volume_context")
    ]
    assert "ControllerGetVolume returned" in p.messages()


def test_listings_that_repeat_create_volumes_context_keep_it_judged_for_the_co():
    """A listing agreeing with CreateVolume keeps CreateVolume's memory (its entries), so the
    CO's copy is still compared entry by entry afterwards."""
    p = Proxy()
    p.node_info()
    p.create("vol-3", {"pool": "gold", "fs": "ext4"})
    assert p.call("ListVolumes", {}, long_listing({3: {"fs": "ext4", "pool": "gold"}})) == []
    stage = {"staging_target_path": "/s", "volume_capability": RWO}
    req = {"volume_id": "vol-3", "volume_context": {"pool": "gold"}, **stage}
    assert p.call("NodeStageVolume", req) == [
        ("csi.volume-context-mismatch", "co", "volume_context")
    ]
    assert "lacks 1 and changes 0 of the 2 entries" in p.messages()


def test_the_co_must_pass_what_create_volume_returned_and_may_add_its_own():
    p = Proxy()
    p.node_info()
    p.create(context={"pool": "gold", "fs": "ext4"})
    # external-provisioner adds its identity to the PV; kubelet pod info and tokens
    provisioner = {
        "pool": "gold",
        "fs": "ext4",
        "storage.kubernetes.io/csiProvisionerIdentity": "1",
    }
    assert p.publish(volume_context=provisioner) == set()
    assert p.stage_at(volume_context=provisioner) == set()
    kubelet = {**provisioner, "csi.storage.k8s.io/pod.name": "web-0"}
    assert p.publish_at(volume_context=kubelet) == set()
    changed = {"pool": "silver", "fs": "ext4"}
    for rpc, extra in (
        ("ControllerPublishVolume", {"node_id": NODE, "volume_capability": RWO}),
        ("ValidateVolumeCapabilities", {"volume_capabilities": [RWO]}),
        ("NodeStageVolume", {"staging_target_path": "/s", "volume_capability": RWO}),
        (
            "NodePublishVolume",
            {"staging_target_path": "/s", "target_path": "/t", "volume_capability": RWO},
        ),
    ):
        req = {"volume_id": "vol-1", "volume_context": changed, **extra}
        assert ("csi.volume-context-mismatch", "co", "volume_context") in p.call(rpc, req), rpc
        assert "lacks 0 and changes 1 of the 2 entries" in p.messages()
        assert "silver" not in p.messages() and "gold" not in p.messages()
    lacking = {"fs": "ext4", "storage.kubernetes.io/csiProvisionerIdentity": "1"}
    assert p.publish(volume_context=lacking) == {"csi.volume-context-mismatch"}
    assert "lacks 1 and changes 0 of the 2 entries" in p.messages()
    # OPTIONAL, and proto3 cannot tell an empty map from one not passed: not judged
    assert p.publish() == set()


def test_a_pre_provisioned_volumes_context_is_not_judged():
    """Only what CreateVolume returned through this proxy counts: a listed volume's context
    may be the administrator's (static PV)."""
    p = Proxy()
    entry = {"volume": {"volume_id": "vol-1", "volume_context": {"pool": "gold"}}}
    p.call("ListVolumes", {}, {"entries": [entry]})
    req = {"volume_id": "vol-1", "volume_capabilities": [RWO], "volume_context": {"a": "b"}}
    assert p.ids("ValidateVolumeCapabilities", req) == set()


def test_volume_attributes_mismatch_in_csi_v0():
    p = Proxy("csi.v0", caps={})
    p.create(context={"pool": "gold"})
    req = {
        "volume_id": "vol-1",
        "node_id": NODE,
        "volume_capability": RWO,
        "volume_attributes": {"pool": "silver"},
    }
    assert p.call("ControllerPublishVolume", req, {}) == [
        ("csi.volume-context-mismatch", "co", "volume_attributes")
    ]


# -- publish_context -------------------------------------------------------------------------


def test_node_calls_must_pass_the_publish_context_of_this_nodes_publication():
    p = Proxy()
    p.node_info()
    p.create()
    p.publish(context={"devicePath": "/dev/a"})
    assert p.stage_at(publish_context={"devicePath": "/dev/b"}) == {"csi.publish-context-mismatch"}
    assert "/dev/" not in p.messages()
    assert "(1 entries) differs from the one ControllerPublishVolume" in p.messages()
    # OPTIONAL, but the publication returned entries: empty is not passing them
    assert p.stage_at() == {"csi.publish-context-mismatch"}
    assert "publish_context is empty, not passing the one" in p.messages()
    assert p.stage_at(publish_context={"devicePath": "/dev/a"}) == set()
    assert p.publish_at(publish_context={"devicePath": "/dev/a"}) == set()
    assert p.publish_at("/t2", publish_context={"devicePath": "/dev/c"}) == {
        "csi.publish-context-mismatch"
    }


def test_publish_context_is_judged_only_for_this_node_and_what_this_proxy_saw():
    p = Proxy()
    p.create()
    p.publish(context={"devicePath": "/dev/a"})
    assert p.stage_at(publish_context={"devicePath": "/dev/b"}) == set()  # node unknown
    p.node_info()
    p.publish("vol-2", OTHER, {"devicePath": "/dev/a"})
    assert p.stage_at(vid="vol-2", publish_context={"devicePath": "/dev/b"}) == set()
    assert p.stage_at(vid="vol-3", publish_context={"devicePath": "/dev/b"}) == set()


def test_a_publication_an_ha_peer_may_have_redone_is_not_judged():
    """After a lease's time the publication may have been undone and redone through another
    replica (with another context); once the volume is staged here, it cannot have been."""
    p = Proxy()
    p.node_info()
    p.create()
    p.publish(context={"devicePath": "/dev/a"})
    p.clock.now += HANDOVER + 1
    assert p.stage_at(publish_context={"devicePath": "/dev/b"}) == set()
    p.clock.now += 600
    assert p.publish_at(publish_context={"devicePath": "/dev/c"}) == {
        "csi.publish-context-mismatch"
    }


def test_publish_info_mismatch_in_csi_v0():
    p = Proxy("csi.v0", caps={})
    p.call("NodeGetId", {}, {"node_id": NODE})
    p.create()
    p.publish(context={"devicePath": "/dev/a"})
    req = {
        "volume_id": "vol-1",
        "staging_target_path": "/s",
        "volume_capability": RWO,
        "publish_info": {"devicePath": "/dev/b"},
    }
    assert p.call("NodeStageVolume", req, {}) == [
        ("csi.publish-context-mismatch", "co", "publish_info")
    ]


def test_an_identical_publish_must_return_the_same_publish_context():
    p = Proxy()
    p.node_info()
    p.create()
    assert p.publish(context={"devicePath": "/dev/a"}, secrets={"k": "1"}) == set()
    assert p.publish(context={"devicePath": "/dev/a"}, secrets={"k": "2"}) == set()
    assert p.publish(context={"devicePath": "/dev/b"}) == {"csi.publish-context-changed"}
    assert p.last[0]["party"] == "plugin"
    # another request (readonly) is not an identical repeat
    assert p.publish(context={"devicePath": "/dev/c"}, readonly=True) == set()


def test_publish_context_changed_after_a_handover_only_with_the_volume_in_use_here():
    p = Proxy()
    p.node_info()
    p.create()
    p.publish(context={"devicePath": "/dev/a"})
    p.clock.now += HANDOVER + 1  # an HA peer may have unpublished and published again
    assert p.publish(context={"devicePath": "/dev/b"}) == set()
    p.stage_at(publish_context={"devicePath": "/dev/b"})
    p.clock.now += HANDOVER + 1  # staged on this node: no legitimate unpublish since
    assert p.publish(context={"devicePath": "/dev/c"}) == {"csi.publish-context-changed"}


def test_csi_v0_an_identical_publish_answers_the_same_publish_info():
    p = Proxy("csi.v0", caps={})
    p.create()
    p.publish(context={"devicePath": "/dev/a"})
    assert p.publish(context={"devicePath": "/dev/a"}) == set()
    assert p.publish(context={"devicePath": "/dev/b"}) == {"csi.publish-context-changed"}
    assert "publish_info" in p.messages() and "/dev" not in p.messages()
    p.clock.now += HANDOVER + 1  # an HA peer may have unpublished and published again
    assert p.publish(context={"devicePath": "/dev/c"}) == set()


def test_an_identical_create_volume_is_judged_within_the_handover_only():
    for spec in ("csi.v1", "csi.v0"):
        p = Proxy(spec, caps={})
        p.create("vol-1")
        assert p.create("vol-2") == {"csi.create-not-idempotent"}, spec
        p.clock.now += HANDOVER + 1  # a delete and re-create through another replica
        assert p.create("vol-3") == set(), spec
        p.call("DeleteVolume", {"volume_id": "vol-3"}, {})
        assert p.create("vol-4") == set(), spec


# -- a single-node volume published to a second node -----------------------------------------


def test_publishing_a_single_node_volume_to_a_second_node_must_be_refused():
    p = Proxy()
    p.create()
    p.publish(node=NODE)
    assert p.publish(node=OTHER) == {"csi.publish-conflict-accepted"}
    assert "FAILED_PRECONDITION" in p.messages() and p.last[0]["party"] == "plugin"
    assert p.publish(node=OTHER, code="FAILED_PRECONDITION") == set()  # the table's answer


def test_a_second_node_is_fine_when_unpublished_multi_node_or_unknown():
    p = Proxy()
    p.create()
    p.publish(node=NODE)
    p.call("ControllerUnpublishVolume", {"volume_id": "vol-1", "node_id": NODE})
    assert p.publish(node=OTHER) == set()
    p.create("vol-2", caps=[RWX], name="pvc-2")
    p.publish("vol-2", NODE, cap=RWX)
    assert p.publish("vol-2", OTHER, cap=RWX) == set()
    p.create("vol-3", caps=[RWO, RWX], name="pvc-3")  # the volume allows MULTI_NODE
    p.publish("vol-3", NODE)
    assert p.publish("vol-3", OTHER) == set()
    p.publish("vol-4", NODE)  # never seen created: its capabilities are unknown
    assert p.publish("vol-4", OTHER) == set()
    p.create("vol-5", name="pvc-5")
    p.publish("vol-5", NODE)
    p.call("ControllerUnpublishVolume", {"volume_id": "vol-5"}, code="NOT_FOUND")  # gone
    assert p.publish("vol-5", OTHER) == set()


def test_publish_conflict_after_a_handover_only_with_the_volume_in_use_on_this_node():
    p = Proxy()
    p.node_info()
    p.create()
    p.create("vol-2", name="pvc-2")
    p.publish(node=NODE)
    p.publish("vol-2", NODE)
    p.clock.now += HANDOVER + 1
    # an HA peer may have unpublished vol-1 from node-1; vol-2 is staged on node-1 here
    p.stage_at(vid="vol-2")
    assert p.publish(node=OTHER) == set()
    assert p.publish("vol-2", OTHER) == {"csi.publish-conflict-accepted"}


# -- node paths --------------------------------------------------------------------------------


def test_only_one_staging_path_per_volume():
    p = Proxy()
    p.create()
    assert p.stage_at("/s1") == set()
    assert p.stage_at("/s1/") == set()  # the same path, idempotent
    assert p.call("NodeStageVolume", {"volume_id": "vol-1", "staging_target_path": "/s2"}) == [
        ("csi.staging-path-conflict", "co", "staging_target_path")
    ]
    p.call("NodeUnstageVolume", {"volume_id": "vol-1", "staging_target_path": "/s1"})
    assert p.stage_at("/s2") == set()
    p.call(
        "NodeUnstageVolume", {"volume_id": "vol-1", "staging_target_path": "/s2"}, code="NOT_FOUND"
    )
    assert p.stage_at("/s3") == set()


def test_one_volume_per_target_path():
    p = Proxy()
    assert p.publish_at("/t", "vol-a") == set()
    req = {"volume_id": "vol-b", "target_path": "/t"}
    assert p.call("NodePublishVolume", req, code="FAILED_PRECONDITION") == [
        ("csi.target-path-conflict", "co", "target_path")
    ]
    p.call("NodeUnpublishVolume", {"volume_id": "vol-a", "target_path": "/t"})
    p.stage_at("/s", "vol-b")  # refused without a staging path: staged before the retry
    assert p.publish_at("/t", "vol-b") == set()
    p.call("NodeUnpublishVolume", {"volume_id": "vol-b", "target_path": "/t"}, code="NOT_FOUND")
    assert p.publish_at("/t", "vol-c") == set()
    p.call("DeleteVolume", {"volume_id": "vol-c"})  # deleted: what it held is forgotten
    assert p.publish_at("/t", "vol-d") == set()


def test_a_second_publish_with_another_capability():
    p = Proxy()
    p.publish_at("/t", cap=RWO)
    assert p.call(
        "NodePublishVolume",
        {"volume_id": "vol-1", "target_path": "/t", "volume_capability": RWO_BLOCK},
        code="FAILED_PRECONDITION",
    ) == [("csi.republish-different-capability", "co", "volume_capability")]
    assert p.publish_at("/t", cap=RWO_BLOCK, code="ALREADY_EXISTS") == {
        "csi.republish-different-capability"
    }
    # answered OK: the plugin is reported too
    assert p.publish_at("/t", cap=RWO_BLOCK) == {
        "csi.republish-different-capability",
        "csi.republish-answer",
    }
    assert ("csi.republish-answer", "plugin", "") in p.call(
        "NodePublishVolume", {"volume_id": "vol-1", "target_path": "/t", "volume_capability": RWO}
    )


def test_kubernetes_republishes_with_fresh_tokens_and_one_publish_per_pod():
    p = Proxy()
    tokens = {"csi.storage.k8s.io/serviceAccount.tokens": "jwt-1"}
    p.publish_at("/t", volume_context=tokens)
    fresh = {"csi.storage.k8s.io/serviceAccount.tokens": "jwt-2"}
    assert p.publish_at("/t", volume_context=fresh) == set()  # requiresRepublish: OK
    assert p.publish_at("/t2") == set()  # a second pod of a ReadWriteOnce volume
    assert p.publish_at("/t", "vol-2", cap=RWOP) == {"csi.target-path-conflict"}


def test_a_single_node_single_writer_volume_at_a_second_target_must_be_refused():
    p = Proxy()
    p.publish_at("/t1", cap=RWOP)
    assert p.call(
        "NodePublishVolume",
        {"volume_id": "vol-1", "target_path": "/t2", "volume_capability": RWOP},
    ) == [("csi.republish-answer", "plugin", "")]
    assert p.publish_at("/t3", cap=RWOP, code="FAILED_PRECONDITION") == set()


def test_csi_v0_second_publish_table():
    p = Proxy("csi.v0", caps={})
    p.publish_at("/t", cap=RWO)
    # v0.3 has no "SHOULD NOT call a second time" sentence: only the plugin's answer
    assert p.publish_at("/t", cap=RWO_BLOCK) == {"csi.republish-answer"}


# -- call order ------------------------------------------------------------------------------


def test_node_stage_before_controller_publish_judged_on_the_plugins_refusal():
    p = Proxy()
    p.node_info()
    p.create()
    assert p.stage_at(code="FAILED_PRECONDITION") == {"csi.call-order"}
    assert "not ControllerPublished to this node" in p.messages()
    assert p.last[0]["party"] == "co"
    # an HA peer published it: the plugin stages it fine
    assert p.stage_at() == set()


def test_node_stage_refused_for_other_reasons_is_not_call_order():
    p = Proxy()
    p.node_info()
    p.create()
    p.create("vol-2", name="pvc-2")
    # ControllerPublishVolume calls start passing here a lease after the creations: an HA
    # peer may have published vol-1, so only the plugin's answer judges its order
    p.clock.now += HANDOVER + 1
    p.publish("vol-2")
    assert p.stage_at(vid="vol-2", code="FAILED_PRECONDITION") == set()  # published here
    assert p.stage_at(code="INTERNAL") == set()
    # the CO passes a publish_context: some ControllerPublishVolume answered it
    assert p.stage_at(code="NOT_FOUND", publish_context={"devicePath": "/dev/a"}) == set()
    assert p.stage_at(vid="vol-3", code="NOT_FOUND") == set()  # not created here
    q = Proxy(caps={**V1_CAPS, "controller": {"CREATE_DELETE_VOLUME"}})
    q.node_info()
    q.create()
    assert q.stage_at(code="FAILED_PRECONDITION") == set()  # no PUBLISH_UNPUBLISH_VOLUME


def test_node_publish_before_controller_publish_without_staging():
    p = Proxy(caps={**V1_CAPS, "node": {"GET_VOLUME_STATS"}})
    p.node_info()
    p.create()
    assert p.publish_at(code="FAILED_PRECONDITION") == {"csi.call-order"}
    q = Proxy()  # STAGE_UNSTAGE_VOLUME: judged at NodeStageVolume
    q.node_info()
    q.create()
    q.call(
        "NodePublishVolume",
        {"volume_id": "vol-1", "target_path": "/t", "volume_capability": RWO},
        code="NOT_FOUND",
    )
    # only csi_common's "before NodeStageVolume", not this family's
    assert len(q.last) == 1 and "ControllerPublished" not in q.messages()


def test_node_expand_of_a_volume_neither_staged_nor_published():
    p = Proxy(mode="enforce")
    p.create()
    expand = {"volume_id": "vol-1", "volume_path": "/t"}
    assert p.call("NodeExpandVolume", expand) == [("csi.call-order", "co", "volume_id")]
    assert not p.rejected  # reported, never enforced
    assert "CreateVolume returned it" in p.messages()
    p.stage_at()
    assert p.ids("NodeExpandVolume", expand) == set()
    p.call("NodeUnstageVolume", {"volume_id": "vol-1", "staging_target_path": "/s"})
    assert p.ids("NodeExpandVolume", expand) == {"csi.call-order"}
    assert "NodeUnstageVolume" in p.messages()
    assert p.ids("NodeExpandVolume", {"volume_id": "vol-2", "volume_path": "/t"}) == set()


def test_controller_expand_of_a_published_volume_with_offline_expansion_only():
    p = Proxy(caps={**V1_CAPS, "plugin": {"CONTROLLER_SERVICE", "OFFLINE"}})
    p.create()
    expand = {"volume_id": "vol-1", "capacity_range": {"required_bytes": 1 << 31}}
    assert p.ids("ControllerExpandVolume", expand, code="FAILED_PRECONDITION") == set()
    p.publish()
    # within a lease of the publication no other replica can have unpublished it
    assert p.call("ControllerExpandVolume", expand) == [("csi.call-order", "co", "volume_id")]
    assert "only OFFLINE" in p.messages()
    p.clock.now += HANDOVER + 1
    assert p.ids("ControllerExpandVolume", expand) == set()  # maybe unpublished elsewhere
    assert p.call("ControllerExpandVolume", expand, code="FAILED_PRECONDITION") == [
        ("csi.call-order", "co", "volume_id")
    ]  # the plugin's "in use" confirms it
    assert "only OFFLINE" in p.messages()


def test_controller_expand_of_a_volume_in_use_on_this_node_with_offline_expansion_only():
    p = Proxy(caps={**V1_CAPS, "plugin": {"CONTROLLER_SERVICE", "OFFLINE"}})
    p.create()
    expand = {"volume_id": "vol-1", "capacity_range": {"required_bytes": 1 << 31}}
    p.stage_at()
    p.clock.now += HANDOVER + 1  # node-side memory: no other replica unstages here
    # reported on arrival, whatever the answer, and once
    assert p.call("ControllerExpandVolume", expand) == [("csi.call-order", "co", "volume_id")]
    assert p.call("ControllerExpandVolume", expand, code="FAILED_PRECONDITION") == [
        ("csi.call-order", "co", "volume_id")
    ]
    assert "staged or published on this node" in p.messages()
    p.call("NodeUnstageVolume", {"volume_id": "vol-1", "staging_target_path": "/s"})
    assert p.ids("ControllerExpandVolume", expand) == set()


def test_expansion_refused_as_out_of_range_below_a_confirmed_size():
    p = Proxy()
    p.create(volume={"capacity_bytes": 2 << 30})
    small = {"volume_id": "vol-1", "capacity_range": {"required_bytes": 1 << 30}}
    flagged = {"csi.expand-already-large-refused"}
    assert p.ids("ControllerExpandVolume", small, code="OUT_OF_RANGE") == flagged
    assert "CreateVolume answered 2147483648 bytes" in p.messages()
    big = {"volume_id": "vol-1", "capacity_range": {"required_bytes": 4 << 30}}
    assert p.ids("ControllerExpandVolume", big, code="OUT_OF_RANGE") == set()  # a real limit
    assert p.ids("ControllerExpandVolume", small, code="NOT_FOUND") == set()  # gone meanwhile
    p.ids("ControllerExpandVolume", big, {"capacity_bytes": 4 << 30})
    assert p.ids("ControllerExpandVolume", big, code="OUT_OF_RANGE") == flagged
    # the node side: only what NodeExpandVolume confirmed (a file system grows after its device)
    node = {
        "volume_id": "vol-1",
        "volume_path": "/t",
        "capacity_range": {"required_bytes": 4 << 30},
    }
    p.stage_at()
    assert p.ids("NodeExpandVolume", node, code="OUT_OF_RANGE") == set()
    p.ids("NodeExpandVolume", node, {"capacity_bytes": 4 << 30})
    assert p.ids("NodeExpandVolume", node, code="OUT_OF_RANGE") == flagged
    p.call("DeleteVolume", {"volume_id": "vol-1"}, {})
    assert p.ids("ControllerExpandVolume", small, code="OUT_OF_RANGE") == set()


def test_online_expansion_must_not_refuse_a_published_volume():
    p = Proxy(caps={**V1_CAPS, "plugin": {"CONTROLLER_SERVICE", "ONLINE"}})
    p.create()
    expand = {"volume_id": "vol-1", "capacity_range": {"required_bytes": 1 << 31}}
    p.publish()
    assert p.call("ControllerExpandVolume", expand, code="FAILED_PRECONDITION") == [
        ("csi.expand-published-refused", "plugin", "")
    ]
    assert p.ids("ControllerExpandVolume", expand, code="OUT_OF_RANGE") == set()
    p.call("ControllerUnpublishVolume", {"volume_id": "vol-1", "node_id": NODE})
    assert p.ids("ControllerExpandVolume", expand, code="FAILED_PRECONDITION") == set()
    q = Proxy(caps={**V1_CAPS, "plugin": {"ONLINE"}, "controller": {"PUBLISH_UNPUBLISH_VOLUME"}})
    q.create()
    q.publish()
    assert q.ids("ControllerExpandVolume", expand, code="FAILED_PRECONDITION") == set()


# -- secrets -----------------------------------------------------------------------------------


def test_unpublish_secrets_should_be_the_publish_secrets():
    p = Proxy()
    p.publish(secrets={"key": SECRET})
    req = {"volume_id": "vol-1", "node_id": NODE, "secrets": {"key": "other"}}
    assert p.call("ControllerUnpublishVolume", req, code="INTERNAL") == [
        ("csi.secrets-changed", "co", "secrets")
    ]
    assert SECRET not in p.messages() and "other" not in p.messages()
    assert p.ids("ControllerUnpublishVolume", {"volume_id": "vol-1", "node_id": NODE}) == {
        "csi.secrets-changed"
    }
    p.publish(node=OTHER, secrets={"key": "other"})
    same = {"volume_id": "vol-1", "secrets": {"key": "other"}}  # all nodes: one matches
    assert p.ids("ControllerUnpublishVolume", same) == set()
    assert p.ids("ControllerUnpublishVolume", req) == set()  # nothing published any more


def test_unpublish_secrets_in_csi_v0():
    p = Proxy("csi.v0", caps={})
    p.publish(controller_publish_secrets={"key": "a"})
    req = {"volume_id": "vol-1", "node_id": NODE, "controller_unpublish_secrets": {"key": "b"}}
    assert p.call("ControllerUnpublishVolume", req) == [
        ("csi.secrets-changed", "co", "controller_unpublish_secrets")
    ]


# -- snapshots ---------------------------------------------------------------------------------


def test_a_volume_from_a_snapshot_is_not_smaller_than_the_snapshot():
    p = Proxy()
    snap = {"snapshot_id": "snap-1", "source_volume_id": "vol-0", "size_bytes": 10 << 30}
    p.call("CreateSnapshot", {"name": "s", "source_volume_id": "vol-0"}, {"snapshot": snap})
    source = {"snapshot": {"snapshot_id": "snap-1"}}
    assert p.create("vol-9", volume_content_source=source, volume={"capacity_bytes": 5 << 30}) == {
        "csi.volume-smaller-than-snapshot"
    }
    assert p.last[0]["party"] == "plugin" and "10737418240" in p.messages()
    for ok in (10 << 30, 0):  # as large, or unknown
        assert (
            p.create(
                "vol-9", name=f"n{ok}", volume_content_source=source, volume={"capacity_bytes": ok}
            )
            == set()
        )
    other = {"snapshot": {"snapshot_id": "snap-2"}}
    assert p.create("vol-8", volume_content_source=other, volume={"capacity_bytes": 1}) == set()


def test_a_volume_smaller_than_its_snapshot_in_csi_v0():
    p = Proxy("csi.v0", caps={})
    snap = {"id": "snap-1", "source_volume_id": "vol-0", "size_bytes": 100, "created_at": 1}
    p.call("ListSnapshots", {}, {"entries": [{"snapshot": snap}]})
    source = {"snapshot": {"id": "snap-1"}}
    assert p.create("vol-9", volume_content_source=source, volume={"capacity_bytes": 50}) == {
        "csi.volume-smaller-than-snapshot"
    }


# -- memory: bounded, expiring ---------------------------------------------------------------


def test_the_familys_memory_is_bounded_and_expires():
    p = Proxy(max_volumes=2, lifecycle_ttl=60.0)
    for i in range(5):
        p.create(f"vol-{i}", {"pool": "gold"}, name=f"pvc-{i}")
        p.publish_at(f"/t{i}", f"vol-{i}")
    mem = p.state.part(VolumeMemory)
    assert len(mem.contexts) == 2 and len(mem.volumes) == 2 and len(mem.targets) == 2
    p.clock.now += 61
    assert "vol-4" not in mem.contexts and "vol-4" not in mem.volumes
    assert p.ids("NodePublishVolume", {"volume_id": "vol-x", "target_path": "/t4"}) == set()
    req = {"volume_id": "vol-4", "volume_capabilities": [RWO], "volume_context": {"a": "b"}}
    assert p.ids("ValidateVolumeCapabilities", req) == set()


def test_listing_a_volume_keeps_its_context_known_and_silence_forgets_it():
    p = Proxy(lifecycle_ttl=60.0)
    listed = {"entries": [{"volume": {"volume_id": "vol-1", "volume_context": {"a": "1"}}}]}
    changed = {"entries": [{"volume": {"volume_id": "vol-1", "volume_context": {"a": "2"}}}]}
    for _ in range(3):
        assert p.ids("ListVolumes", {}, listed) == set()
        p.clock.now += 40  # each listing starts the hour (here a minute) again
    assert p.ids("ListVolumes", {}, changed) == {"csi.volume-context-changed"}
    assert "ListVolumes returned for this volume id 2m ago" in p.messages()  # the first one
    p.clock.now += 61
    assert p.ids("ListVolumes", {}, listed) == set()  # forgotten: a first sighting again


def test_kubelet_polling_stats_keeps_a_mounted_volume_known():
    p = Proxy(lifecycle_ttl=60.0)
    p.stage_at("/s1")
    for _ in range(3):
        p.clock.now += 40
        p.call("NodeGetVolumeStats", {"volume_id": "vol-1", "volume_path": "/t"})
    assert p.ids("NodeStageVolume", {"volume_id": "vol-1", "staging_target_path": "/s2"}) == {
        "csi.staging-path-conflict"
    }


# -- a whole legitimate lifecycle stays quiet --------------------------------------------------


def test_a_legitimate_unified_lifecycle_draws_nothing():
    p = Proxy(caps={**V1_CAPS, "plugin": {"CONTROLLER_SERVICE", "ONLINE"}})
    p.node_info()
    ctx = {"pool": "gold"}
    found: set[str] = set()
    found |= p.create(context=ctx, parameters={"a": "b"})
    found |= p.create(context=ctx, parameters={"a": "b"})
    found |= p.publish(context={"dev": "/dev/a"}, volume_context=ctx, secrets={"k": "v"})
    found |= p.stage_at(publish_context={"dev": "/dev/a"}, volume_context=ctx)
    found |= p.stage_at(publish_context={"dev": "/dev/a"}, volume_context=ctx)
    found |= p.publish_at(publish_context={"dev": "/dev/a"}, volume_context=ctx)
    found |= p.publish_at(publish_context={"dev": "/dev/a"}, volume_context=ctx)
    found |= p.ids(
        "ControllerExpandVolume",
        {"volume_id": "vol-1", "capacity_range": {"required_bytes": 1 << 31}},
        {"capacity_bytes": 1 << 31, "node_expansion_required": True},
    )
    found |= p.ids("NodeExpandVolume", {"volume_id": "vol-1", "volume_path": "/t"})
    found |= p.ids("NodeUnpublishVolume", {"volume_id": "vol-1", "target_path": "/t"})
    found |= p.ids("NodeUnstageVolume", {"volume_id": "vol-1", "staging_target_path": "/s"})
    found |= p.ids(
        "ControllerUnpublishVolume", {"volume_id": "vol-1", "node_id": NODE, "secrets": {"k": "v"}}
    )
    found |= p.ids("DeleteVolume", {"volume_id": "vol-1"})
    assert found == set()


# -- end to end: a real proxy, real gRPC ---------------------------------------------------


async def test_node_side_rules_through_a_real_proxy_and_the_fake_plugin(tmp_path):
    """The bundled fake refuses what the CO gets wrong; the proxy names the rule and lets
    every call through in enforce mode (none of these is enforced)."""
    async with through_proxy("csi.v1", tmp_path, "--validation", "enforce") as (c, proxy):
        info = await c.call("NodeGetInfo")
        await c.call("ControllerGetCapabilities")
        await c.call("NodeGetCapabilities")
        cap = c.new("VolumeCapability", mount={}, access_mode={"mode": "SINGLE_NODE_WRITER"})
        vol = (await c.call("CreateVolume", name="p", volume_capabilities=[cap])).volume
        vid = vol.volume_id

        async def refused(rpc: str, **fields: Any) -> grpc.StatusCode:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await c.call(rpc, volume_id=vid, **fields)
            assert not exc.value.details().startswith("plugproxy:"), exc.value.details()
            return exc.value.code()

        context = dict(vol.volume_context)
        stage = {"staging_target_path": "/s", "volume_capability": cap, "volume_context": context}
        assert await refused("NodeStageVolume", **stage) is grpc.StatusCode.FAILED_PRECONDITION
        pub = await c.call(
            "ControllerPublishVolume",
            volume_id=vid,
            node_id=info.node_id,
            volume_capability=cap,
            volume_context=context,
        )
        await c.call(
            "NodeStageVolume",
            volume_id=vid,
            publish_context=dict(pub.publish_context),
            **stage,
        )
        other = {**stage, "staging_target_path": "/s2", "publish_context": {"devicePath": "/x"}}
        assert await refused("NodeStageVolume", **other) is grpc.StatusCode.FAILED_PRECONDITION
        found = {
            (e["rule"], e["party"], e["method"].rsplit("/", 1)[-1])
            for e in stage_of(proxy).report.snapshot()
        }
        assert found == {
            ("csi.call-order", "co", "NodeStageVolume"),
            ("csi.staging-path-conflict", "co", "NodeStageVolume"),
            ("csi.publish-context-mismatch", "co", "NodeStageVolume"),
        }


async def test_an_empty_ok_answer_is_judged_through_the_relay(tmp_path):
    """NodePublishVolumeResponse is empty: the plugin's OK still reaches the response
    checks (csi.republish-answer), through a real proxy and a plugin answering OK to all."""
    upstream = str(tmp_path / "plugin.sock")
    server, plugin = await start_recorder(upstream)
    publish = "/csi.v1.Node/NodePublishVolume"
    plugin.raw[publish] = lambda req: b""
    listen = str(tmp_path / "proxy.sock")
    proxy = await start_proxy(listen, upstream)
    try:
        cls = REG.lookup(publish).request_class
        assert cls is not None
        async with channel(listen) as ch:
            for cap in (RWO, RWO_BLOCK):
                req = cls(volume_id="v", target_path="/t", volume_capability=cap)
                await ch.unary_unary(publish)(req.SerializeToString(), timeout=5)
        found = {(e["rule"], e["party"]) for e in stage_of(proxy).report.snapshot()}
        assert found == {
            ("csi.republish-different-capability", "co"),
            ("csi.republish-answer", "plugin"),
        }
    finally:
        await proxy.stop(0)
        await server.stop(0)


async def test_csi_v0_node_side_through_a_real_proxy(tmp_path):
    plugin_sock = os.path.join(tmp_path, "plugin.sock")
    proxy_sock = os.path.join(tmp_path, "proxy.sock")
    handle = await start_fake_plugin("csi.v0", f"unix://{plugin_sock}")
    proxy = await start_proxy(proxy_sock, plugin_sock)
    client = SpecClient(f"unix://{proxy_sock}", "csi.v0")
    try:
        info = await client.call("NodeGetInfo")
        cap = client.new("VolumeCapability", mount={}, access_mode={"mode": "SINGLE_NODE_WRITER"})
        vol = (await client.call("CreateVolume", name="p", volume_capabilities=[cap])).volume
        pub = await client.call(
            "ControllerPublishVolume",
            volume_id=vol.id,
            node_id=info.node_id,
            volume_capability=cap,
            volume_attributes=dict(vol.attributes),
        )
        await client.call(
            "NodeStageVolume",
            volume_id=vol.id,
            staging_target_path="/s",
            volume_capability=cap,
            publish_info=dict(pub.publish_info),
            volume_attributes=dict(vol.attributes),
        )
        assert stage_of(proxy).report.snapshot() == []
    finally:
        await client.close()
        await proxy.stop(0)
        await handle.stop(0)


# -- one topology key prefix across the plugin's answers ----------------------------------------


def test_topology_keys_share_one_prefix_across_rpcs():
    for spec in ("csi.v1", "csi.v0"):
        p = Proxy(spec, caps={})
        zone = {"segments": {"example.com/zone": "z1", "rack": "r1"}}  # no prefix: not compared
        assert p.call("NodeGetInfo", {}, {"node_id": "n", "accessible_topology": zone}) == []
        assert p.create(volume={"accessible_topology": [zone]}) == set()
        # Kubernetes' own well-known keys beside the plugin's are not another prefix (EBS)
        k8s = {"segments": {"topology.kubernetes.io/zone": "z1", "kubernetes.io/hostname": "h"}}
        assert p.create("vol-3", name="pvc-3", volume={"accessible_topology": [k8s]}) == set()
        other = {"segments": {"other.org/zone": "z1"}}
        assert p.create("vol-2", name="pvc-2", volume={"accessible_topology": [other]}) == {
            "csi.topology-prefix-inconsistent"
        }, spec
        assert "CreateVolume returned" in p.messages() and "example" not in p.messages()
        # within one answer, too
        both = {"segments": {"example.com/zone": "z1", "other.org/rack": "r"}}
        assert p.call("NodeGetInfo", {}, {"node_id": "n", "accessible_topology": both}) != []
