"""gRPC messages on the wire: splitting, limits, and memory that follows the bytes that came."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugproxy.relay import grpcwire
from plugproxy.relay.grpcwire import Messages, MessageTooLarge, is_grpc, message_frame


@given(
    bodies=st.lists(st.binary(max_size=300), max_size=6),
    cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=40),
)
def test_messages_split_the_same_however_the_bytes_are_cut(bodies, cuts):
    wire = b"".join(message_frame(i % 2 == 1, body) for i, body in enumerate(bodies))
    messages = Messages(limit=1000, collect=True)
    got: list[tuple[bool, bytes]] = []
    pos = 0
    for cut in [*cuts, len(wire)]:
        got += messages.feed(wire[pos : pos + cut])
        pos += cut
    assert got == [(i % 2 == 1, body) for i, body in enumerate(bodies)]
    assert messages.count == len(bodies)


def test_a_claimed_length_costs_nothing_until_the_bytes_arrive():
    messages = Messages(limit=16 << 20, collect=True)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(50):  # fifty streams' worth of 16 MiB claims
            Messages(limit=16 << 20, collect=True).feed(b"\x00" + (16 << 20).to_bytes(4, "big"))
        messages.feed(b"\x00" + (16 << 20).to_bytes(4, "big") + b"x" * 100)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024
    assert messages.incomplete


def test_a_length_over_the_limit_is_refused_from_its_prefix():
    messages = Messages(limit=1024, collect=False)
    with pytest.raises(MessageTooLarge) as info:
        messages.feed(b"\x00\x00\x00\x04\x01")
    assert info.value.size == 1025


def test_counting_without_collecting_keeps_no_bytes():
    messages = Messages(limit=1 << 20, collect=False)
    assert messages.feed(message_frame(False, b"a" * 10) + message_frame(False, b"b" * 7)[:6]) == []
    assert messages.count == 1


@pytest.mark.parametrize(
    ("content_type", "grpc"),
    [
        (b"application/grpc", True),
        (b"application/grpc+proto", True),
        (b"application/grpc;charset=utf-8", True),
        (b"application/grpcx", False),
        (b"application/json", False),
        (b"", False),
    ],
)
def test_grpc_content_types(content_type, grpc):
    assert is_grpc(content_type) is grpc


def test_response_metadata_is_remembered_only_for_small_recurring_lists(monkeypatch):
    monkeypatch.setattr(grpcwire, "_response_metadata", {})  # not filled by other tests
    trailers = [(b"grpc-status", b"0"), (b"x-vendor", b"a")]
    assert grpcwire.response_metadata(trailers) == (("x-vendor", "a"),)
    assert grpcwire.response_metadata(trailers) is grpcwire.response_metadata(list(trailers))
    before = len(grpcwire._response_metadata)
    for n in range(50):  # large and unique: computed each time, never kept
        big = [(b"grpc-status", b"13"), (b"x-detail", b"%d" % n * 600)]
        assert grpcwire.response_metadata(big) == (("x-detail", (b"%d" % n * 600).decode()),)
    assert len(grpcwire._response_metadata) == before


def test_request_metadata_items_are_remembered_except_per_call_values(monkeypatch):
    monkeypatch.setattr(grpcwire, "_metadata_items", {})  # not filled by other tests
    assert grpcwire.metadata_item(b"user-agent", b"grpc-go/1.60.1") == (
        "user-agent",
        "grpc-go/1.60.1",
    )
    assert grpcwire.metadata_item(b"x-token-bin", b"AAEC") == ("x-token-bin", b"\x00\x01\x02")
    assert (b"user-agent", b"grpc-go/1.60.1") in grpcwire._metadata_items
    before = len(grpcwire._metadata_items)
    for n in range(100):
        assert grpcwire.metadata_item(b"grpc-timeout", b"%du" % n) == ("grpc-timeout", f"{n}u")
        assert grpcwire.metadata_item(b"csi.requestid", b"%d" % n) == ("csi.requestid", str(n))
    assert len(grpcwire._metadata_items) == before
