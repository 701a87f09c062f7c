"""Public types: lazy decoding at most once, call kinds from descriptors."""

from __future__ import annotations

import grpc

from plugproxy.api import MAX_CALL_EVENTS, Call, CallKind, LazyMessage, Reject, StatusCode
from plugproxy.spec.registry import Registry, load_spec

CSI = load_spec("csi.v1")


class CountingDecoder:
    """Wraps a message class and counts how often bytes are parsed."""

    parsed = 0
    DESCRIPTOR = CSI.message_class("csi.v1.CreateVolumeRequest").DESCRIPTOR

    @classmethod
    def FromString(cls, raw: bytes):
        cls.parsed += 1
        return CSI.message_class("csi.v1.CreateVolumeRequest").FromString(raw)


def test_lazy_message_decodes_once_and_only_when_asked():
    raw = CSI.message_class("csi.v1.CreateVolumeRequest")(name="pvc-1").SerializeToString()
    lazy = LazyMessage(raw, CountingDecoder)  # type: ignore[arg-type]
    assert CountingDecoder.parsed == 0
    assert lazy.message.name == "pvc-1"
    assert lazy.message is lazy.message
    assert lazy.decode_error is None
    assert CountingDecoder.parsed == 1


def test_malformed_bytes_give_a_decode_error_not_an_exception():
    lazy = LazyMessage(b"\x0a\xff\xff\xff", CSI.message_class("csi.v1.CreateVolumeRequest"))
    assert lazy.message is None
    assert lazy.decode_error is not None
    assert "cannot decode csi.v1.CreateVolumeRequest" in lazy.decode_error


def test_unknown_type_is_never_decoded():
    lazy = LazyMessage(b"anything", None)
    assert lazy.message is None and lazy.decode_error is None


def test_call_kind_properties():
    assert CallKind.UNARY_STREAM.unary_request and not CallKind.UNARY_STREAM.unary_response
    assert CallKind.STREAM_UNARY.unary_response and not CallKind.STREAM_UNARY.unary_request


def test_status_codes_are_grpcs_by_name_and_value():
    assert [(c.name, c.value) for c in StatusCode] == [(c.name, c.value) for c in grpc.StatusCode]
    assert [c.number for c in StatusCode] == list(range(17))
    for theirs in grpc.StatusCode:
        ours = StatusCode.of(theirs)
        assert ours.name == theirs.name and StatusCode.of(ours) is ours
        assert grpc.StatusCode(ours.value) is theirs
    # A stage written against grpc's codes still rejects with ours.
    assert Reject(grpc.StatusCode.ABORTED, "busy").code is StatusCode.ABORTED


def test_a_call_keeps_a_bounded_number_of_events():
    """A stream open for as long as its plugin may break a rule in every message: the call
    keeps the first events for its log line and span and counts the rest."""
    method = Registry(["drahealth.v1"]).lookup("/v1.DRAResourceHealth/NodeWatchResources")
    call = Call(method, (), [], None)
    for i in range(MAX_CALL_EVENTS + 500):
        call.add_event("violation", rule="drahealth.health-value", index=i)
    assert len(call.events) == MAX_CALL_EVENTS == 128
    assert call.events[-1].attributes["index"] == MAX_CALL_EVENTS - 1
    assert call.events_dropped == 500
