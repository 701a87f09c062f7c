"""ValidateVolumeCapabilities answered alike (rules/csi_readonly.py), through the validate
stage driven call by call with a clock of the test's own."""

from __future__ import annotations

from typing import Any

import pytest

from plugproxy.rules.csi_readonly import REPEAT_WINDOW
from tests import csi_harness as harness
from tests.csi_harness import RWO, Proxy

RULE = "csi.validate-not-idempotent"


@pytest.fixture(autouse=True)
def _judged_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {RULE})


def validate(p: Proxy, confirmed: bool, code: str = "OK", vid: str = "vol-1") -> set[str]:
    req = {"volume_id": vid, "volume_capabilities": [RWO]}
    if p.spec == "csi.v1":
        resp: dict[str, Any] = {"confirmed": {"volume_capabilities": [RWO]}} if confirmed else {}
    else:
        resp = {"supported": confirmed}
    return p.ids("ValidateVolumeCapabilities", req, resp, code)


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_identical_validations_answered_differently_are_found(spec: str) -> None:
    p = Proxy(spec)
    assert RULE not in validate(p, True)
    assert RULE not in validate(p, True)
    p.clock.now += 30
    assert RULE in validate(p, False)
    assert "confirmed 30s ago and does not confirm now" in p.messages()
    assert RULE in validate(p, True)  # and back again


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_what_may_change_the_volume_errors_and_time_start_over(spec: str) -> None:
    p = Proxy(spec)
    validate(p, True)
    p.call("DeleteVolume", {"volume_id": "vol-1"})  # an OK that may change it
    assert RULE not in validate(p, False)
    assert RULE not in validate(p, True, code="UNAVAILABLE")  # errors are not compared
    p.clock.now += REPEAT_WINDOW + 1
    assert RULE not in validate(p, True)  # too long ago: another replica may have been at it
    assert RULE not in validate(p, True, vid="vol-2")  # another volume
    if spec == "csi.v1":
        p.call("ControllerModifyVolume", {"volume_id": "vol-1", "mutable_parameters": {"a": "b"}})
        assert RULE not in validate(p, False)
        # an answer without a volume, to a request naming none (conformance suites send it)
        assert p.ids("ControllerModifyVolume", {"mutable_parameters": {"a": "b"}}) <= {
            "csi.required-field"
        }


MISSING = "csi.volume-missing"


def listing(p: Proxy, ids: list[str], token: str = "", next_token: str = "") -> set[str]:
    id_field = "volume_id" if p.spec == "csi.v1" else "id"
    resp = {"entries": [{"volume": {id_field: i}} for i in ids], "next_token": next_token}
    return p.ids("ListVolumes", {"starting_token": token}, resp)


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_a_listing_lacking_a_volume_just_made_is_found_and_only_then(spec: str) -> None:
    monkey = pytest.MonkeyPatch()
    monkey.setattr(harness, "FAMILY", harness.FAMILY | {MISSING})
    try:
        p = Proxy(spec)
        p.create("vol-1")
        p.create("vol-2", name="pvc-2")
        assert MISSING in listing(p, ["vol-1"])
        assert "before the listing began" in p.messages()
        assert MISSING not in listing(p, ["vol-2", "vol-1", "vol-9"])
        # a walk of pages: judged at its last page, on all its pages together
        assert MISSING not in listing(p, ["vol-1"], next_token="t1")
        assert MISSING in listing(p, ["vol-3"], token="t1")
        assert MISSING not in listing(p, ["vol-2"], token="t-unknown")  # a walk not seen begun
        p.call("DeleteVolume", {"volume_id": "vol-2"})  # sent: it may be gone
        assert MISSING not in listing(p, ["vol-1"])
        p.clock.now += 16  # another replica may have deleted it since
        assert MISSING not in listing(p, [])
    finally:
        monkey.undo()


CONTRADICTS = "csi.validate-contradicts-create"
REGRESSED = "csi.snapshot-ready-regressed"


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_a_validation_contradicting_the_create_is_found_and_only_then(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {CONTRADICTS})
    p = Proxy(spec)
    p.create("vol-1")
    assert CONTRADICTS in validate(p, False)
    assert CONTRADICTS not in validate(p, True)
    block = {"block": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
    other = p.ids(
        "ValidateVolumeCapabilities", {"volume_id": "vol-1", "volume_capabilities": [block]}
    )
    assert CONTRADICTS not in other  # a capability the create did not ask for
    p.clock.now += REPEAT_WINDOW + 1
    assert CONTRADICTS not in validate(p, False)  # too long ago
    p.create("vol-2", name="pvc-2")
    p.call("DeleteVolume", {"volume_id": "vol-2"})
    assert CONTRADICTS not in validate(p, False, vid="vol-2")  # changed since


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_a_ready_snapshot_answered_as_processing_again_is_found(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {REGRESSED})
    p = Proxy(spec)

    def listed(ready: bool) -> set[str]:
        if spec == "csi.v1":
            snap: dict[str, Any] = {"snapshot_id": "s1", "ready_to_use": ready}
        else:
            snap = {"id": "s1", "status": {"type": "READY" if ready else "UPLOADING"}}
        return p.ids("ListSnapshots", {}, {"entries": [{"snapshot": snap}]})

    assert REGRESSED not in listed(False)  # processing: fine
    assert REGRESSED not in listed(True)
    assert REGRESSED in listed(False)
    p.call("DeleteSnapshot", {"snapshot_id": "s1"})  # gone: a new one may take the id
    assert REGRESSED not in listed(False)


WRITER = "csi.single-node-writer-refused"


def test_single_node_writer_refused_where_a_newer_mode_is_confirmed_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harness, "FAMILY", harness.FAMILY | {WRITER})
    caps = {
        **harness.V1_CAPS,
        "controller": {"CREATE_DELETE_VOLUME", "SINGLE_NODE_MULTI_WRITER"},
    }
    p = Proxy(caps=caps)

    def check(mode: str, confirmed: bool, vid: str = "vol-1") -> set[str]:
        cap = {"mount": {}, "access_mode": {"mode": mode}}
        req = {"volume_id": vid, "volume_capabilities": [cap]}
        resp = {"confirmed": {"volume_capabilities": [cap]}} if confirmed else {}
        return p.ids("ValidateVolumeCapabilities", req, resp)

    assert WRITER not in check("SINGLE_NODE_WRITER", False)
    assert WRITER in check("SINGLE_NODE_MULTI_WRITER", True)  # either order is found
    assert WRITER not in check("SINGLE_NODE_SINGLE_WRITER", True, "vol-2")
    assert WRITER not in check("SINGLE_NODE_WRITER", True, "vol-2")
    # a plugin not listing SINGLE_NODE_MULTI_WRITER owes nothing here
    plain = Proxy()
    cap = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
    plain.ids("ValidateVolumeCapabilities", {"volume_id": "v", "volume_capabilities": [cap]}, {})
    assert WRITER not in plain.ids(
        "ValidateVolumeCapabilities",
        {
            "volume_id": "v",
            "volume_capabilities": [{**cap, "access_mode": {"mode": "SINGLE_NODE_SINGLE_WRITER"}}],
        },
        {"confirmed": {"volume_capabilities": [cap]}},
    )
