"""CSI snapshots and group snapshots across calls (rules/csi_snapshots.py): each rule planted
by the party it judges, and the same calls made legitimately, through the real validate stage
driven in-process (tests/csi_harness.py); the HA and expiry cases that must stay quiet."""

from __future__ import annotations

from typing import Any

from plugproxy.core.memory import HANDOVER
from plugproxy.rules.csi_snapshots import SNAPSHOT_RECENT
from tests.csi_harness import RWO, Proxy

# -- identical creates answer the same id ------------------------------------------------------


def snapshot_of(sid: str, volume: str = "vol-1", **extra: Any) -> dict[str, Any]:
    return {"snapshot": {"snapshot_id": sid, "source_volume_id": volume, **extra}}


def test_an_identical_create_snapshot_must_return_the_same_snapshot_id():
    p = Proxy()
    req = {"name": "snap-1", "source_volume_id": "vol-1"}
    assert p.ids("CreateSnapshot", req, snapshot_of("s-1")) == set()
    assert p.ids("CreateSnapshot", req, snapshot_of("s-1", ready_to_use=True)) == set()
    assert p.ids("CreateSnapshot", req, snapshot_of("s-2")) == {"csi.create-not-idempotent"}
    assert p.last[0]["party"] == "plugin" and "s-1" not in p.messages()
    # another source volume is not an identical request
    other = {"name": "snap-1", "source_volume_id": "vol-2"}
    assert p.ids("CreateSnapshot", other, snapshot_of("s-3", "vol-2")) == set()


def test_a_snapshot_deleted_and_created_again_or_after_a_handover_is_new():
    p = Proxy()
    req = {"name": "snap-1", "source_volume_id": "vol-1"}
    p.ids("CreateSnapshot", req, snapshot_of("s-1"))
    p.ids("DeleteSnapshot", {"snapshot_id": "s-1"}, {})  # csi-sanity re-uses names so
    assert p.ids("CreateSnapshot", req, snapshot_of("s-2")) == set()
    p.clock.now += HANDOVER + 1  # another replica may have deleted and re-created it
    assert p.ids("CreateSnapshot", req, snapshot_of("s-3")) == set()


def test_an_identical_create_group_must_return_the_same_group_id():
    p = Proxy()
    req = {"name": "g-1", "source_volume_ids": ["vol-1", "vol-2"]}

    def group(gid: str) -> dict[str, Any]:
        return {"group_snapshot": {"group_snapshot_id": gid, "ready_to_use": True}}

    assert p.ids("CreateVolumeGroupSnapshot", req, group("g-a")) == set()
    assert p.ids("CreateVolumeGroupSnapshot", req, group("g-b")) == {"csi.create-not-idempotent"}
    p.ids("DeleteVolumeGroupSnapshot", {"group_snapshot_id": "g-b"}, {})
    assert p.ids("CreateVolumeGroupSnapshot", req, group("g-c")) == set()


def test_group_snapshot_secrets_should_stay_the_same():
    p = Proxy()
    group = {"group_snapshot_id": "g-1", "snapshots": [{"snapshot_id": "s-1"}]}
    p.call(
        "CreateVolumeGroupSnapshot",
        {"name": "g", "source_volume_ids": ["vol-1"], "secrets": {"k": "a"}},
        {"group_snapshot": group},
    )
    get = {"group_snapshot_id": "g-1", "snapshot_ids": ["s-1"]}
    assert p.ids("GetVolumeGroupSnapshot", {**get, "secrets": {"k": "a"}}) == set()
    assert p.call("GetVolumeGroupSnapshot", {**get, "secrets": {"k": "b"}}) == [
        ("csi.secrets-changed", "co", "secrets")
    ]
    assert p.ids("DeleteVolumeGroupSnapshot", {**get, "secrets": {"k": "b"}}) == {
        "csi.secrets-changed"
    }
    again = {**get, "secrets": {"k": "b"}}
    assert p.ids("GetVolumeGroupSnapshot", again, code="NOT_FOUND") == set()  # deleted


def test_group_snapshot_secrets_of_a_repeated_create_and_a_retried_delete():
    p = Proxy()
    group = {"group_snapshot_id": "g-1", "snapshots": [{"snapshot_id": "s-1"}]}
    create = {"name": "g", "source_volume_ids": ["vol-1"], "secrets": {"k": "a"}}
    p.call("CreateVolumeGroupSnapshot", create, {"group_snapshot": group})
    # polled until ready: the same secrets are fine, rotated ones are reported
    assert p.ids("CreateVolumeGroupSnapshot", create, {"group_snapshot": group}) == set()
    rotated = {**create, "secrets": {"k": "b"}}
    assert p.call("CreateVolumeGroupSnapshot", rotated, {"group_snapshot": group}) == [
        ("csi.secrets-changed", "co", "secrets")
    ]
    # a delete the plugin refused leaves the group and its secrets to compare a retry with
    q = Proxy()
    delete = {"group_snapshot_id": "g-2", "snapshot_ids": ["s-2"], "secrets": {"k": "a"}}
    assert p.ids("DeleteVolumeGroupSnapshot", delete, code="FAILED_PRECONDITION") == set()
    assert p.ids("DeleteVolumeGroupSnapshot", {**delete, "secrets": {"k": "b"}}) == {
        "csi.secrets-changed"
    }
    # one it answered NOT_FOUND (gone) or OK is forgotten
    assert q.ids("DeleteVolumeGroupSnapshot", delete, code="NOT_FOUND") == set()
    assert q.ids("DeleteVolumeGroupSnapshot", {**delete, "secrets": {"k": "b"}}) == set()
    assert q.ids("DeleteVolumeGroupSnapshot", delete) == set()


def test_a_recent_snapshot_not_yet_ready_must_be_retrievable():
    p = Proxy()
    snap = {"snapshot_id": "snap-1", "source_volume_id": "vol-0", "ready_to_use": False}
    p.call("CreateSnapshot", {"name": "s", "source_volume_id": "vol-0"}, {"snapshot": snap})
    get = {"snapshot_id": "snap-1"}
    assert p.call("GetSnapshot", get, code="NOT_FOUND") == [
        ("csi.snapshot-lost", "plugin", "snapshot_id")
    ]
    p.clock.now += SNAPSHOT_RECENT + 1
    assert p.ids("GetSnapshot", get, code="NOT_FOUND") == set()  # not recent any more


def test_a_snapshot_ready_deleted_or_only_listed_may_be_gone():
    p = Proxy()
    made = {"name": "s", "source_volume_id": "vol-0"}
    for sid, ready in (("snap-1", True), ("snap-2", False)):
        snap = {"snapshot_id": sid, "source_volume_id": "vol-0", "ready_to_use": ready}
        p.call("CreateSnapshot", made, {"snapshot": snap})
    assert p.ids("GetSnapshot", {"snapshot_id": "snap-1"}, code="NOT_FOUND") == set()
    p.call("DeleteSnapshot", {"snapshot_id": "snap-2"}, code="DEADLINE_EXCEEDED")
    assert p.ids("GetSnapshot", {"snapshot_id": "snap-2"}, code="NOT_FOUND") == set()
    listed = {"snapshot_id": "snap-3", "source_volume_id": "vol-0", "ready_to_use": False}
    p.call("ListSnapshots", {}, {"entries": [{"snapshot": listed}]})
    assert p.ids("GetSnapshot", {"snapshot_id": "snap-3"}, code="NOT_FOUND") == set()


def test_group_members_are_deleted_with_their_group():
    p = Proxy()
    members = [
        {"snapshot_id": f"s-{i}", "source_volume_id": f"v-{i}", "group_snapshot_id": "g-1"}
        for i in (1, 2)
    ]
    group = {"group_snapshot_id": "g-1", "snapshots": members, "ready_to_use": False}
    p.call(
        "CreateVolumeGroupSnapshot",
        {"name": "g", "source_volume_ids": ["v-1", "v-2"]},
        {"group_snapshot": group},
    )
    assert p.call("DeleteSnapshot", {"snapshot_id": "s-1"}, code="INVALID_ARGUMENT") == [
        ("csi.delete-group-member", "co", "snapshot_id")
    ]
    assert "CreateVolumeGroupSnapshot returned" in p.messages()
    # the members not yet ready must be retrievable
    assert p.ids("GetSnapshot", {"snapshot_id": "s-2"}, code="NOT_FOUND") == {"csi.snapshot-lost"}
    p.call(
        "DeleteVolumeGroupSnapshot", {"group_snapshot_id": "g-1", "snapshot_ids": ["s-1", "s-2"]}
    )
    assert p.ids("DeleteSnapshot", {"snapshot_id": "s-2"}) == set()
    assert p.ids("GetSnapshot", {"snapshot_id": "s-2"}, code="NOT_FOUND") == set()
    alone = {"snapshot_id": "s-9", "source_volume_id": "v-9"}
    p.call("CreateSnapshot", {"name": "s9", "source_volume_id": "v-9"}, {"snapshot": alone})
    assert p.ids("DeleteSnapshot", {"snapshot_id": "s-9"}) == set()


# -- group operations name their own group's snapshots ----------------------------------------


def test_group_operations_name_only_their_own_snapshots():
    p = Proxy()

    def made(gid: str, *sids: str) -> None:
        members = [
            {"snapshot_id": s, "group_snapshot_id": gid, "source_volume_id": "v"} for s in sids
        ]
        answer = {"group_snapshot": {"group_snapshot_id": gid, "snapshots": members}}
        p.ids("CreateVolumeGroupSnapshot", {"name": gid, "source_volume_ids": ["v"]}, answer)

    made("g-1", "s-1", "s-2")
    made("g-2", "s-3")
    p.ids("CreateSnapshot", {"name": "alone", "source_volume_id": "v"}, snapshot_of("s-9", "v"))
    mine = {"group_snapshot_id": "g-1", "snapshot_ids": ["s-1", "s-2"]}
    assert p.ids("GetVolumeGroupSnapshot", mine, {}) == set()
    theirs = {"group_snapshot_id": "g-1", "snapshot_ids": ["s-1", "s-3"]}
    assert p.call("GetVolumeGroupSnapshot", theirs, {}) == [
        ("csi.group-id-mismatch", "co", "snapshot_ids[1]")
    ]
    alone = {"group_snapshot_id": "g-2", "snapshot_ids": ["s-9"]}
    assert p.ids("DeleteVolumeGroupSnapshot", alone, {}) == {"csi.group-id-mismatch"}
    assert "independent" in p.messages() and "s-9" not in p.messages()
    # unknown snapshots are not judged
    unknown = {"group_snapshot_id": "g-1", "snapshot_ids": ["s-1", "s-2", "s-7"]}
    assert p.ids("DeleteVolumeGroupSnapshot", unknown, {}) == set()


# -- a snapshot outlives its volume: listed and usable as a source -----------------------------


def test_a_snapshot_seen_moments_ago_is_listed_and_usable():
    for spec, sid_field in (("csi.v1", "snapshot_id"), ("csi.v0", "id")):
        p = Proxy(spec, caps={})
        made = {"snapshot": {sid_field: "s-1", "source_volume_id": "vol-1"}}
        p.ids("CreateSnapshot", {"name": "snap-1", "source_volume_id": "vol-1"}, made)
        p.call("DeleteVolume", {"volume_id": "vol-1"}, {})  # the snapshot outlives it
        by_id = {"snapshot_id": "s-1"}
        assert p.ids("ListSnapshots", by_id, {}) == {"csi.snapshot-missing"}, spec
        assert "CreateSnapshot reported" in p.messages() and "s-1" not in p.messages()
        listed = {"entries": [{"snapshot": made["snapshot"]}]}
        assert p.ids("ListSnapshots", by_id, listed) == set()
        source = {"snapshot": {sid_field: "s-1"}}
        restore = {"name": "pvc-2", "volume_capabilities": [RWO], "volume_content_source": source}
        assert p.ids("CreateVolume", restore, code="NOT_FOUND") == {"csi.snapshot-missing"}
        # other filters, or another snapshot: not judged
        assert p.ids("ListSnapshots", {**by_id, "source_volume_id": "vol-9"}, {}) == set()
        assert p.ids("ListSnapshots", {"snapshot_id": "s-unknown"}, {}) == set()
        # past a lease another replica may have deleted it; a delete sent here ends it too
        p.clock.now += HANDOVER + 1
        assert p.ids("ListSnapshots", by_id, {}) == set()
        p.ids("ListSnapshots", by_id, listed)
        p.call("DeleteSnapshot", {"snapshot_id": "s-1"}, {})
        assert p.ids("CreateVolume", restore, code="NOT_FOUND") == set()


def test_a_deleted_group_snapshot_should_not_be_answered():
    p = Proxy()
    group = {"group_snapshot": {"group_snapshot_id": "g-1", "ready_to_use": True}}
    p.ids("CreateVolumeGroupSnapshot", {"name": "g", "source_volume_ids": ["v"]}, group)
    get = {"group_snapshot_id": "g-1"}
    assert p.ids("GetVolumeGroupSnapshot", get, group) == set()
    p.ids("DeleteVolumeGroupSnapshot", get, {})
    assert p.ids("GetVolumeGroupSnapshot", get, group) == {"csi.deleted-group-answered"}
    assert p.ids("GetVolumeGroupSnapshot", get, code="NOT_FOUND") == set()  # the answer due
    # created again under the same id (ids derived from names), or after a lease: not judged
    p.ids("CreateVolumeGroupSnapshot", {"name": "g", "source_volume_ids": ["v"]}, group)
    assert p.ids("GetVolumeGroupSnapshot", get, group) == set()
    p.ids("DeleteVolumeGroupSnapshot", get, {})
    p.clock.now += HANDOVER + 1
    assert p.ids("GetVolumeGroupSnapshot", get, group) == set()
