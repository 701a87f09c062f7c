"""Header blocks the relay writes: decodable by any HPACK decoder, never touching its table."""

from __future__ import annotations

import random

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


def _pairs(headers: object) -> list[tuple[bytes, bytes]]:
    return [(bytes(n), bytes(v)) for n, v in headers]  # type: ignore[attr-defined]


def _decode_both(ours: hpack.Decoder, theirs: hpack.Decoder, block: bytes) -> tuple[object, object]:
    results: list[object] = []
    for decode in (lambda: hpackcodec.decode(ours, block), lambda: theirs.decode(block, raw=True)):
        try:
            results.append(_pairs(decode()))
        except hpack.HPACKError as exc:
            results.append(type(exc))
    return results[0], results[1]


def test_blocks_of_every_representation_decode_as_hpack_decodes_them():
    """RFC 7541 §6: indexed fields, literals with, without and never indexed, indexed and
    literal names, Huffman or not, long integers, table size updates and evictions, over
    one connection's life; the dynamic table must end up the same too."""
    rng = random.Random(7541)
    encoder = hpack.Encoder()
    ours, theirs = hpack.Decoder(), hpack.Decoder()
    never_indexed = 0
    names = [b":path", b"grpc-timeout", b"content-type", b"x-custom", b"authorization", b"te"]
    for round_ in range(400):
        if round_ % 50 == 49:
            encoder.header_table_size = rng.choice((0, 256, 4096))
        headers = []
        for _ in range(rng.randint(0, 8)):
            name = rng.choice(
                [*names, b"x-" + bytes(rng.choices(b"abcdef", k=rng.randint(1, 200)))]
            )
            value = bytes(rng.choices(b"0123456789abcxyz/._-", k=rng.choice((0, 3, 20, 300))))
            if rng.random() < 0.2:
                headers.append(hpack.NeverIndexedHeaderTuple(name, value))
            else:
                headers.append((name, value))
        block = encoder.encode(headers, huffman=rng.random() < 0.5)
        mine, reference = hpackcodec.decode(ours, block), theirs.decode(block, raw=True)
        assert _pairs(mine) == _pairs(reference) == [(bytes(n), bytes(v)) for n, v in headers]
        # The never-indexed marking (§6.2.3) is kept field by field, as hpack keeps it (its
        # encoder sends a field already in a table as indexed, marked or not).
        marked = [isinstance(h, hpack.NeverIndexedHeaderTuple) for h in reference]
        assert [isinstance(h, hpackcodec.NeverIndexed) for h in mine] == marked
        never_indexed += sum(marked)
        assert list(ours.header_table.dynamic_entries) == list(theirs.header_table.dynamic_entries)
    assert never_indexed > 100


def test_never_indexed_fields_are_encoded_never_indexed_and_cached_apart():
    """RFC 7541 §6.2.3: the 0001 pattern, a literal or indexed name; the plain field with the
    same name and value keeps its own encoding, in both caches."""
    never = hpackcodec.NeverIndexed(b"user-agent", b"ua/1")  # a name whose fields are cached
    plain = (b"user-agent", b"ua/1")
    assert (
        never == hpackcodec.NeverIndexed(*plain)
        and never != plain
        and plain != never
        and hash(never) != hash(plain)
    )
    assert hpackcodec.encode([never]) == b"\x1f\x2b\x04ua/1"  # static index 58 = 15 + 43
    assert hpackcodec.encode([plain]) == b"\x0f\x2b\x04ua/1"
    custom = hpackcodec.NeverIndexed(b"x-token", b"t")
    assert hpackcodec.encode([custom]) == b"\x10\x07x-token\x01t"
    for first, second in (([plain], [never]), ([never], [plain])):
        hpackcodec._encoded.clear()
        hpackcodec._encoded_fields.clear()
        for fields in (first, second, first, second):
            decoded = hpackcodec.decode(hpack.Decoder(), hpackcodec.encode_repeated(fields))
            assert decoded == fields
            assert [type(f) for f in decoded] == [type(f) for f in fields]


def test_damaged_blocks_fail_as_hpack_fails_them():
    """Truncated and corrupted blocks: the same error, or the same headers and table."""
    rng = random.Random(9113)
    encoder = hpack.Encoder()
    samples = [
        encoder.encode(
            [(b":path", b"/csi.v1.Node/NodePublishVolume"), (b"grpc-timeout", str(n).encode())],
            huffman=n % 2 == 0,
        )
        for n in range(30)
    ]
    samples += [b"\x80", b"\xff\xff\xff\xff\xff\xff\xff\x7f", b"\x3f\xe1\x1f", b"\x82\x20"]
    for block in samples:
        for _ in range(40):
            damaged = bytearray(block)
            if damaged and rng.random() < 0.5:
                del damaged[rng.randrange(len(damaged)) :]
            elif damaged:
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            ours, theirs = hpack.Decoder(), hpack.Decoder()
            ours.max_header_list_size = theirs.max_header_list_size = 200
            mine, reference = _decode_both(ours, theirs, bytes(damaged))
            assert mine == reference, bytes(damaged)
            assert list(ours.header_table.dynamic_entries) == list(
                theirs.header_table.dynamic_entries
            )


def test_recurring_fields_are_encoded_once_and_per_call_values_never_kept(monkeypatch):
    monkeypatch.setattr(hpackcodec, "_encoded_fields", {})  # not filled by other tests
    decoder = hpack.Decoder()
    for n in range(300):
        headers = [
            (b":path", b"/csi.v1.Node/NodeGetCapabilities"),
            (b"user-agent", b"grpc-go/1.60.1"),
            (b"grpc-timeout", f"{n}u".encode()),
            (b"csi.requestid", str(n).encode()),
        ]
        assert hpackcodec.decode(decoder, hpackcodec.encode(headers)) == headers
    assert set(hpackcodec._encoded_fields) == {  # once each; the per-call values never
        (b":path", b"/csi.v1.Node/NodeGetCapabilities"),
        (b"user-agent", b"grpc-go/1.60.1"),
    }
