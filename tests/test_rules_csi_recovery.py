"""Recovery before a retry (rules/csi_recovery.py), through the validate stage driven call
by call with a clock of the test's own."""

from __future__ import annotations

import pytest

from tests import csi_harness as harness
from tests.csi_harness import NODE, RWO, Proxy

DELETED = "csi.retry-deleted-object"
SNAPSHOTS = "csi.delete-retry-with-snapshots"
PUBLISHED = "csi.expand-retry-while-published"


@pytest.fixture(autouse=True)
def _judged_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {DELETED, SNAPSHOTS, PUBLISHED})


def publish(p: Proxy, code: str = "OK") -> set[str]:
    req = {"volume_id": "vol-1", "node_id": NODE, "volume_capability": RWO}
    return p.ids("ControllerPublishVolume", req, {}, code)


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_a_retry_after_not_found_for_a_volume_deleted_here_is_found(spec: str) -> None:
    p = Proxy(spec)
    p.create("vol-1")
    p.call("DeleteVolume", {"volume_id": "vol-1"})
    assert DELETED not in publish(p, "NOT_FOUND")  # the first call: nothing to verify yet
    p.clock.now += 5
    assert DELETED in publish(p, "NOT_FOUND")
    assert "naming a volume whose delete answered OK on this socket (5s ago)" in p.messages()


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_what_the_co_could_not_know_stays_silent(spec: str) -> None:
    p = Proxy(spec)
    publish(p, "NOT_FOUND")
    assert DELETED not in publish(p, "NOT_FOUND")  # never seen deleted: maybe a typo fixed
    p.create("vol-1")
    p.call("DeleteVolume", {"volume_id": "vol-1"})
    publish(p, "NOT_FOUND")
    p.create("vol-1")  # made again (an id derived from the name): it exists
    assert DELETED not in publish(p, "OK")


def test_a_create_from_a_snapshot_deleted_here_retried_after_not_found_is_found() -> None:
    p = Proxy()
    p.call("DeleteSnapshot", {"snapshot_id": "snap-1"})
    req = {
        "name": "pvc-2",
        "volume_capabilities": [RWO],
        "volume_content_source": {"snapshot": {"snapshot_id": "snap-1"}},
    }
    assert DELETED not in p.ids("CreateVolume", req, {}, "NOT_FOUND")
    assert DELETED in p.ids("CreateVolume", req, {}, "NOT_FOUND")


def test_a_delete_retried_while_snapshots_made_here_remain_is_found() -> None:
    p = Proxy()
    p.create("vol-1")
    snap = {"snapshot_id": "snap-1", "source_volume_id": "vol-1", "ready_to_use": True}
    p.call("CreateSnapshot", {"name": "s1", "source_volume_id": "vol-1"}, {"snapshot": snap})
    assert SNAPSHOTS not in p.ids("DeleteVolume", {"volume_id": "vol-1"}, {}, "FAILED_PRECONDITION")
    assert SNAPSHOTS in p.ids("DeleteVolume", {"volume_id": "vol-1"}, {}, "FAILED_PRECONDITION")
    assert "1 snapshot(s) of the volume" in p.messages()
    p.call("DeleteSnapshot", {"snapshot_id": "snap-1"})
    assert SNAPSHOTS not in p.ids("DeleteVolume", {"volume_id": "vol-1"})


def test_an_expansion_refused_again_while_published_is_found_unless_unpublished() -> None:
    p = Proxy()
    expand = {"volume_id": "vol-1", "capacity_range": {"required_bytes": 2 << 30}}
    assert PUBLISHED not in p.ids("ControllerExpandVolume", expand, {}, "FAILED_PRECONDITION")
    p.call("ControllerUnpublishVolume", {"volume_id": "vol-1", "node_id": NODE})
    assert PUBLISHED not in p.ids("ControllerExpandVolume", expand, {}, "FAILED_PRECONDITION")
    p.clock.now += 30
    assert PUBLISHED in p.ids("ControllerExpandVolume", expand, {}, "FAILED_PRECONDITION")
    assert "the first refusal 30s ago" in p.messages()


ANSWERED = "csi.deleted-object-answered"


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_an_ok_for_a_volume_deleted_here_within_a_lease_is_found(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {ANSWERED})
    p = Proxy(spec)
    p.create("vol-1")
    p.call("DeleteVolume", {"volume_id": "vol-1"})
    assert ANSWERED in publish(p)
    assert "whose delete answered OK on this socket" in p.messages()
    p.clock.now += 16  # another replica may have made it again since
    assert ANSWERED not in publish(p)
    p.create("vol-2", name="pvc-2")
    p.call("DeleteVolume", {"volume_id": "vol-2"})
    p.create("vol-2", name="pvc-2")  # made again here: it exists
    req = {"volume_id": "vol-2", "node_id": NODE, "volume_capability": RWO}
    assert ANSWERED not in p.ids("ControllerPublishVolume", req, {})


def test_an_ok_for_a_snapshot_deleted_here_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {ANSWERED})
    p = Proxy()
    p.call("DeleteSnapshot", {"snapshot_id": "snap-1"})
    snap = {"snapshot_id": "snap-1", "source_volume_id": "v", "ready_to_use": True}
    assert ANSWERED in p.ids("GetSnapshot", {"snapshot_id": "snap-1"}, {"snapshot": snap})
    assert ANSWERED not in p.ids("GetSnapshot", {"snapshot_id": "snap-1"}, {}, "NOT_FOUND")


REUSED, VOLUME_REUSED = "csi.name-reused", "csi.volume-name-reused"


def test_a_snapshot_name_reused_for_another_source_within_a_lease_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {REUSED})
    p = Proxy()

    def snap(source: str, sid: str) -> set[str]:
        made = {"snapshot_id": sid, "source_volume_id": source, "ready_to_use": True}
        return p.ids(
            "CreateSnapshot", {"name": "s1", "source_volume_id": source}, {"snapshot": made}
        )

    assert REUSED not in snap("vol-1", "snap-1")
    assert REUSED not in snap("vol-1", "snap-1")  # the same snapshot again: idempotent
    assert REUSED in snap("vol-2", "snap-2")
    p.call("DeleteSnapshot", {"snapshot_id": "snap-2"})
    assert REUSED not in snap("vol-3", "snap-3")  # the name's snapshot was deleted
    p.clock.now += 16
    assert REUSED not in snap("vol-4", "snap-4")  # a lease later: another replica's doing


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_a_second_volume_for_a_name_is_advised_against_in_v1_only(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {VOLUME_REUSED})
    p = Proxy(spec)
    p.create("vol-1", name="pvc-1")
    other = {"capacity_range": {"required_bytes": 5 << 30}}
    found = p.create("vol-2", name="pvc-1", **other)
    assert (VOLUME_REUSED in found) is (spec == "csi.v1")
    assert VOLUME_REUSED not in p.create("vol-2", name="pvc-1", **other)  # the same again


# CSI v1.12 §CreateSnapshot, §CreateVolumeGroupSnapshot, §CreateVolume: idempotency beyond a
# byte-identical repeat, and an id that identifies one object.
NOT_IDEMPOTENT = "csi.create-not-idempotent"
ID_REUSED, VOLUME_ID_REUSED = "csi.id-reused", "csi.volume-id-reused"


def _group(p: Proxy, name: str, sources: list[str], gid: str, **extra: object) -> set[str]:
    members = [
        {"snapshot_id": f"{gid}-{v}", "source_volume_id": v, "ready_to_use": True} for v in sources
    ]
    made = {"group_snapshot_id": gid, "snapshots": members, "ready_to_use": True}
    req = {"name": name, "source_volume_ids": sources, **extra}
    return p.ids("CreateVolumeGroupSnapshot", req, {"group_snapshot": made})


def test_a_group_repeat_with_other_secrets_or_order_answered_another_id_is_found() -> None:
    p = Proxy()
    assert NOT_IDEMPOTENT not in _group(p, "g1", ["v1", "v2"], "group-1")
    assert NOT_IDEMPOTENT not in _group(p, "g1", ["v2", "v1"], "group-1")  # the same group
    assert NOT_IDEMPOTENT in _group(p, "g1", ["v2", "v1"], "group-2")
    assert NOT_IDEMPOTENT in _group(p, "g1", ["v1", "v2"], "group-3", secrets={"k": "rotated"})
    p = Proxy()
    _group(p, "g1", ["v1", "v2"], "group-1")
    p.call("DeleteVolumeGroupSnapshot", {"group_snapshot_id": "group-1"})
    assert NOT_IDEMPOTENT not in _group(p, "g1", ["v2", "v1"], "group-2")  # first deleted
    p.clock.now += 16
    assert NOT_IDEMPOTENT not in _group(p, "g1", ["v1", "v2"], "group-3", secrets={"k": "v"})


def test_snapshot_and_volume_repeats_with_other_secrets_or_map_order_are_judged() -> None:
    p = Proxy()
    src = {"name": "s1", "source_volume_id": "vol-1", "parameters": {"a": "1", "b": "2"}}

    def snap(sid: str, **extra: object) -> set[str]:
        made = {"snapshot_id": sid, "source_volume_id": "vol-1", "ready_to_use": True}
        return p.ids("CreateSnapshot", {**src, **extra}, {"snapshot": made})

    assert NOT_IDEMPOTENT not in snap("snap-1")
    assert NOT_IDEMPOTENT in snap("snap-2", secrets={"k": "v"})
    assert NOT_IDEMPOTENT in snap("snap-3", parameters={"b": "2", "a": "1"})
    assert NOT_IDEMPOTENT not in p.create("vol-1", name="pvc-1")
    assert NOT_IDEMPOTENT in p.create("vol-9", name="pvc-1", secrets={"k": "v"})


def test_one_id_for_two_names_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {ID_REUSED, VOLUME_ID_REUSED})
    p = Proxy()

    def snap(name: str, source: str, sid: str) -> set[str]:
        made = {"snapshot_id": sid, "source_volume_id": source, "ready_to_use": True}
        req = {"name": name, "source_volume_id": source}
        return p.ids("CreateSnapshot", req, {"snapshot": made})

    assert ID_REUSED not in snap("s1", "vol-1", "snap-1")
    assert ID_REUSED not in snap("s2", "vol-1", "snap-1")  # one source: a dedup, not judged
    assert ID_REUSED in snap("s3", "vol-2", "snap-1")
    p.call("DeleteSnapshot", {"snapshot_id": "snap-1"})
    assert ID_REUSED not in snap("s4", "vol-3", "snap-1")  # deleted first: made anew
    p.clock.now += 16
    assert ID_REUSED not in snap("s5", "vol-4", "snap-1")  # a lease later
    assert ID_REUSED in _group(p, "g1", ["v1", "v2"], "group-1") | _group(
        p, "g2", ["v3"], "group-1"
    )
    assert VOLUME_ID_REUSED not in p.create("vol-1", name="pvc-1")
    assert VOLUME_ID_REUSED in p.create("vol-1", name="pvc-2")
    assert VOLUME_ID_REUSED not in p.create("vol-1", name="pvc-2")  # the same name again


def test_one_id_for_two_names_is_not_judged_in_v0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {ID_REUSED, VOLUME_ID_REUSED})
    p = Proxy("csi.v0")
    p.create("vol-1", name="pvc-1")
    assert not {ID_REUSED, VOLUME_ID_REUSED} & p.create("vol-1", name="pvc-2")


LISTED = "csi.deleted-snapshot-listed"


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_a_snapshot_listed_after_its_delete_answered_is_found(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CSI v1.12 / v0.3 §ListSnapshots: a listing holds the snapshots the storage system has
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {LISTED})
    p = Proxy(spec)
    sid = "snapshot_id" if spec == "csi.v1" else "id"
    extra = {"ready_to_use": True} if spec == "csi.v1" else {"status": {"type": "READY"}}
    snap = {sid: "snap-1", "source_volume_id": "vol-1", **extra}
    listing = {"entries": [{"snapshot": snap}]}
    assert LISTED not in p.ids("ListSnapshots", {}, listing)  # nothing deleted yet
    p.call("DeleteSnapshot", {"snapshot_id": "snap-1"})
    assert LISTED in p.ids("ListSnapshots", {}, listing)
    assert LISTED not in p.ids("ListSnapshots", {}, {"entries": []})
    p.clock.now += 16
    assert LISTED not in p.ids("ListSnapshots", {}, listing)  # a lease later: not judged
    p.call("DeleteSnapshot", {"snapshot_id": "snap-1"})
    p.call("CreateSnapshot", {"name": "s1", "source_volume_id": "vol-1"}, {"snapshot": snap})
    assert LISTED not in p.ids("ListSnapshots", {}, listing)  # made again since


def test_a_metadata_delta_retried_after_not_found_naming_a_deleted_base_is_found() -> None:
    p = Proxy()
    p.call("DeleteSnapshot", {"snapshot_id": "snap-1"})
    req = {"base_snapshot_id": "snap-1", "target_snapshot_id": "snap-2"}
    assert DELETED not in p.ids("GetMetadataDelta", req, [], "NOT_FOUND")
    assert DELETED in p.ids("GetMetadataDelta", req, [], "NOT_FOUND")
    other = {"base_snapshot_id": "snap-3", "target_snapshot_id": "snap-2"}
    p.ids("GetMetadataDelta", other, [], "NOT_FOUND")
    assert DELETED not in p.ids("GetMetadataDelta", other, [], "NOT_FOUND")  # not seen deleted
