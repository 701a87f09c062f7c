"""CSI paged listings (rules/csi_listings.py): a listing restarted after its token was
refused, through the real validate stage driven in-process (tests/csi_harness.py)."""

from __future__ import annotations

import pytest

from tests.csi_harness import Proxy

# -- listings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("rpc", ["ListVolumes", "ListSnapshots"])
def test_a_listing_should_restart_after_its_token_was_refused(rpc):
    p = Proxy()
    assert p.ids(rpc, {"starting_token": "t1"}, code="ABORTED") == set()
    assert p.call(rpc, {"starting_token": "t1", "max_entries": 5}) == [
        ("csi.list-restart-expected", "co", "starting_token")
    ]
    assert "t1" not in p.messages()
    assert p.ids(rpc, {"starting_token": "t2"}) == set()  # another caller's page
    assert p.ids(rpc, {}, {"next_token": "t1"}) == set()  # the plugin hands it out again
    assert p.ids(rpc, {"starting_token": "t1"}) == set()


def test_aborted_without_a_token_is_not_an_invalid_token():
    p = Proxy()
    p.call("ListVolumes", {}, code="ABORTED")
    assert p.ids("ListVolumes", {"starting_token": "t"}) == set()
    p.call("ListSnapshots", {"starting_token": "t"}, code="ABORTED")
    assert p.ids("ListVolumes", {"starting_token": "t"}) == set()  # per RPC
