"""CSI snapshot metadata streams (rules/csi_metadata.py): a stream restarted past anything
it could continue, and streams that say nothing of it, through the real validate stage
driven in-process (tests/csi_harness.py)."""

from __future__ import annotations

from typing import Any

from tests.csi_harness import Proxy

# -- snapshot metadata streams -----------------------------------------------------------------


def blocks(*offsets: int, size: int = 4096) -> list[dict[str, int]]:
    return [{"byte_offset": o, "size_bytes": size} for o in offsets]


def metadata(ranges: list[dict[str, int]], capacity: int = 1 << 20) -> dict[str, Any]:
    return {
        "block_metadata_type": "FIXED_LENGTH",
        "volume_capacity_bytes": capacity,
        "block_metadata": ranges,
    }


def test_a_metadata_offset_past_a_complete_stream_or_the_volume():
    p = Proxy()
    stream = [metadata(blocks(0, 4096)), metadata(blocks(16384))]
    assert p.ids("GetMetadataAllocated", {"snapshot_id": "snap-1"}, stream) == set()
    req = {"snapshot_id": "snap-1"}
    for ok in (0, 4096, 8192, 20480):  # 0, a range end, within, the last end
        assert (
            p.ids("GetMetadataAllocated", {**req, "starting_offset": ok}, code="UNAVAILABLE")
            == set()
        )
    assert p.call("GetMetadataAllocated", {**req, "starting_offset": 20481}) == [
        ("csi.metadata-restart-offset", "co", "starting_offset")
    ]
    assert "past the end 20480 of the complete" in p.messages()
    assert p.ids("GetMetadataAllocated", {**req, "starting_offset": (1 << 20) + 1}) == {
        "csi.metadata-restart-offset"
    }
    assert "volume_capacity_bytes" in p.messages()


def test_an_interrupted_stream_says_nothing_about_what_comes_after():
    p = Proxy()
    req = {"base_snapshot_id": "a", "target_snapshot_id": "b"}
    p.call("GetMetadataDelta", req, code="UNAVAILABLE")
    assert p.ids("GetMetadataDelta", {**req, "starting_offset": 8192}) == set()
    p.call("GetMetadataDelta", {**req, "starting_offset": 8192}, [metadata(blocks(8192))])
    assert p.ids("GetMetadataDelta", {**req, "starting_offset": 12288}) == set()
    assert p.ids("GetMetadataDelta", {**req, "starting_offset": 12289}) == {
        "csi.metadata-restart-offset"
    }
    # the same target with another base is another stream
    other = {"base_snapshot_id": "z", "target_snapshot_id": "b", "starting_offset": 12289}
    assert p.ids("GetMetadataDelta", other) == set()


def test_a_disordered_stream_is_not_taken_as_complete():
    p = Proxy()
    p.call("GetMetadataAllocated", {"snapshot_id": "s"}, [metadata(blocks(8192, 0))])
    assert "csi.metadata-restart-offset" not in p.ids(
        "GetMetadataAllocated", {"snapshot_id": "s", "starting_offset": 40960}
    )
