"""Header blocks the relay writes: decodable by any HPACK decoder, never touching its table."""

from __future__ import annotations

import hpack

from plugproxy.relay import hpackcodec


def test_blocks_decode_to_the_same_headers_in_order_and_leave_no_table_state():
    headers = [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"x-dup", b"one"),
        (b"x-dup", b"two"),
        (b"x-long-value", b"v" * 300),  # a length that needs continuation bytes
        (b"x-" + b"n" * 200, b""),  # a long new name, an empty value
        (b"grpc-status-details-bin", b"AAEC"),
    ]
    decoder = hpack.Decoder()
    for _ in range(3):  # the same block twice more: nothing was remembered between them
        block = hpackcodec.encode(headers)
        assert hpackcodec.decode(decoder, block) == headers
        assert len(decoder.header_table.dynamic_entries) == 0


def test_static_table_names_cost_one_byte():
    block = hpackcodec.encode([(b"content-type", b"x")])
    assert block == b"\x0f\x10\x01x"  # index 31 as 4-bit prefix 15 + 16, then the value


def test_grpc_message_percent_encoding_round_trips():
    message = "volume 'pvc-1' 100% full: naïve ✓\r\nnext"
    encoded = hpackcodec.percent_encode(message)
    assert all(0x20 <= b <= 0x7E for b in encoded)
    assert b"100%25" in encoded and b"'pvc-1'" in encoded
    assert hpackcodec.percent_decode(encoded) == message


def test_blocks_of_indexed_fields_decode_as_hpack_decodes_them():
    encoder, ours, theirs = hpack.Encoder(), hpack.Decoder(), hpack.Decoder()
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"x-a", b"1")]
    first = encoder.encode(headers)  # literals that enter the dynamic table
    assert hpackcodec.decode(ours, first) == headers == list(theirs.decode(first, raw=True))
    again = encoder.encode(headers)  # now one indexed byte per field, two of them dynamic
    assert min(again) > 0x80 and len(again) == len(headers)
    assert hpackcodec.decode(ours, again) == headers == list(theirs.decode(again, raw=True))
