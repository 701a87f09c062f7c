"""Sampling large messages: skeletons read long lists as bytes, the kept entries decode exactly."""

from __future__ import annotations

import pytest

from plugproxy.api import LazyMessage
from plugproxy.core import sampling
from plugproxy.core.sampling import SAMPLE_MIN_BYTES, SAMPLE_SIZE, picked_indices
from plugproxy.spec.registry import Registry, load_spec

CSI = load_spec("csi.v1")
Registry(["csi.v1"])  # prepares the skeletons, as a running proxy does at startup
LIST_RESPONSE = CSI.message_class("csi.v1.ListVolumesResponse")
METADATA = CSI.message_class("csi.v1.GetMetadataAllocatedResponse")


def big_list(n: int, pad: int = 0) -> bytes:
    resp = LIST_RESPONSE(next_token="page-2")
    for i in range(n):
        entry = resp.entries.add()
        entry.volume.volume_id = f"vol-{i:05d}"
        entry.volume.capacity_bytes = i
        entry.volume.volume_context["pad"] = "x" * pad
        entry.status.published_node_ids.append(f"node-{i % 7}")
    return resp.SerializeToString()


def test_picked_indices_keep_a_head_then_spread_to_the_last():
    picked = picked_indices(10_000)
    assert len(picked) == SAMPLE_SIZE
    assert picked[: SAMPLE_SIZE // 2] == list(range(SAMPLE_SIZE // 2))
    assert picked[-1] == 9_999
    assert picked == sorted(set(picked))  # strictly increasing: no entry twice
    assert picked_indices(SAMPLE_SIZE + 1) == sorted(set(picked_indices(SAMPLE_SIZE + 1)))
    assert len(picked_indices(SAMPLE_SIZE + 1)) == SAMPLE_SIZE
    assert picked_indices(10) == list(range(10))
    assert picked_indices(100, size=1) == [99]


def test_a_large_message_is_sampled_and_kept_entries_decode_exactly():
    raw = big_list(10_000)
    assert len(raw) > SAMPLE_MIN_BYTES
    lazy = LazyMessage(raw, LIST_RESPONSE)
    sample = lazy.sample
    assert sample is not None
    assert sample.totals == {"entries": 10_000}
    full = LIST_RESPONSE.FromString(raw)
    kept = lazy.sampled
    assert kept is sample.message and len(kept.entries) == SAMPLE_SIZE
    for position, real in enumerate(sample.indices["entries"]):
        assert kept.entries[position] == full.entries[real]
    assert kept.next_token == "page-2"  # fields outside the lists survive the skeleton
    assert lazy.count("entries") == 10_000
    assert lazy.message == full  # asking for the whole message still gives all of it


def test_a_sample_keeps_each_entrys_wire_bytes_and_makes_subsets_of_them():
    raw = big_list(10_000)
    sample = LazyMessage(raw, LIST_RESPONSE).sample
    assert sample is not None
    full = LIST_RESPONSE.FromString(raw)
    wire = sample.raw["entries"]
    assert len(wire) == SAMPLE_SIZE
    for position, real in enumerate(sample.indices["entries"]):
        assert wire[position] == full.entries[real].SerializeToString()
    subset = sample.subset({"entries": [3, 200, 255]})
    assert list(subset.entries) == [sample.message.entries[p] for p in (3, 200, 255)]
    assert subset.next_token == "page-2"
    assert len(sample.subset({"entries": []}).entries) == 0
    assert sample.subset({}) == sample.message  # lists not named are kept whole
    assert len(sample.subset({"entries": [0]}).entries) == 1  # the skeleton is reusable


def test_small_messages_and_short_lists_are_used_whole():
    small = LazyMessage(big_list(10), LIST_RESPONSE)
    assert small.sample is None and small.sampled is small.message
    assert small.count("entries") == 10
    # Large in bytes but no list over the limit: nothing to cut.
    wide = LazyMessage(big_list(100, pad=2000), LIST_RESPONSE)
    assert len(wide.raw) > SAMPLE_MIN_BYTES
    assert wide.sample is None and len(wide.sampled.entries) == 100


def test_a_message_already_decoded_is_not_sampled_again():
    lazy = LazyMessage(big_list(5_000), LIST_RESPONSE)
    assert len(lazy.message.entries) == 5_000
    assert lazy.sample is None  # the whole message exists; sampling would decode twice
    assert lazy.sampled is lazy.message


def test_maps_are_never_cut_and_streamed_block_lists_are():
    resp = METADATA(volume_capacity_bytes=1 << 40)
    for i in range(20_000):
        block = resp.block_metadata.add()
        block.byte_offset, block.size_bytes = i * 4096, 4096
    lazy = LazyMessage(resp.SerializeToString(), METADATA)
    assert lazy.sample is not None and lazy.sample.totals == {"block_metadata": 20_000}
    assert lazy.sampled.volume_capacity_bytes == 1 << 40
    assert lazy.sampled.block_metadata[-1].byte_offset == 19_999 * 4096
    # ListVolumes entries hold a map (volume_context); the skeleton only reads top-level lists.
    skeleton = sampling.skeleton_of(LIST_RESPONSE)
    assert skeleton is not None and [name for name, _ in skeleton.fields] == ["entries"]


def test_malformed_bytes_fall_back_to_a_whole_decode_that_reports_them():
    lazy = LazyMessage(big_list(10_000)[:-3], LIST_RESPONSE)
    assert lazy.sampled is None
    assert lazy.decode_error and "ListVolumesResponse" in lazy.decode_error


@pytest.mark.parametrize(("index", "kept"), [(9_999, True), (5_001, False)])
def test_a_bad_entry_is_found_only_if_kept(index, kept):
    # Invalid UTF-8 in one volume id: same length, so the outer framing stays intact.
    raw = big_list(10_000).replace(f"vol-{index:05d}".encode(), b"\xffol-xxxxx")
    assert (index in picked_indices(10_000)) is kept
    lazy = LazyMessage(raw, LIST_RESPONSE)
    if kept:  # the sample does not decode: the whole message is decoded and fails
        assert lazy.sampled is None and lazy.decode_error
    else:  # documented: entries the sample skipped are never read
        assert lazy.sampled is not None and lazy.count("entries") == 10_000


def test_unknown_message_types_have_no_sample():
    lazy = LazyMessage(b"\x0a\x00" * 50_000, None)
    assert lazy.sample is None and lazy.sampled is None
