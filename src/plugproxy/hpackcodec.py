"""HPACK for the frame relay: decoding with hpack's Decoder, encoding without a dynamic table.

The relay decodes every header block it receives (each direction keeps its own dynamic
table, as HPACK requires) and re-encodes what it sends as literals that never enter a
dynamic table (RFC 7541 §6.2.2). The blocks it sends are therefore independent of one
another: the relay may hold a call, answer it itself or drop a late block without
desynchronising either peer's decoder. Names are looked up in the static table so common
headers still cost one byte.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast
from urllib.parse import quote, unquote

import hpack
from hpack.table import HeaderTable

Header = tuple[bytes, bytes]

_STATIC_NAME_INDEX: dict[bytes, int] = {}
for _index, (_name, _value) in enumerate(HeaderTable.STATIC_TABLE, start=1):
    _STATIC_NAME_INDEX.setdefault(_name, _index)

_NAME_CACHE_LIMIT = 512  # header names are few; a CO inventing names must not grow memory
_name_prefix: dict[bytes, bytes] = {}


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 §5.1 integer with an N-bit prefix, OR-ed into ``first``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _name_bytes(name: bytes) -> bytes:
    prefix = _name_prefix.get(name)
    if prefix is None:
        index = _STATIC_NAME_INDEX.get(name)
        if index is not None:
            prefix = _integer(index, 4, 0x00)  # literal without indexing, indexed name
        else:
            prefix = b"\x00" + _integer(len(name), 7, 0x00) + name
        if len(_name_prefix) < _NAME_CACHE_LIMIT:
            _name_prefix[name] = prefix
    return prefix


def encode(headers: Iterable[Header]) -> bytes:
    """A header block of literals without indexing; order and duplicates are kept."""
    parts: list[bytes] = []
    append = parts.append
    for name, value in headers:
        append(_name_bytes(name))
        size = len(value)
        append(bytes((size,)) if size < 0x7F else _integer(size, 7, 0x00))
        append(value)
    return b"".join(parts)


def new_decoder() -> hpack.Decoder:
    return hpack.Decoder()


def decode(decoder: hpack.Decoder, block: bytes) -> list[Header]:
    """Decode one header block as (name, value) bytes pairs; updates the decoder's table.

    A block made only of one-byte indexed fields (RFC 7541 §6.1) changes no table and is
    looked up directly: after a connection's first call, a gRPC server's headers
    (":status 200", "content-type") and trailers ("grpc-status 0") are such blocks.
    """
    if block and min(block) > 0x80 and 0xFF not in block:
        entry = decoder.header_table.get_by_index
        return [entry(byte & 0x7F) for byte in block]
    # HeaderTuple is a tuple subclass of exactly these two bytes values.
    return cast("list[Header]", decoder.decode(block, raw=True))


DecodeError = hpack.HPACKError


def percent_encode(message: str) -> bytes:
    """grpc-message encoding: UTF-8, then %XX for anything outside printable ASCII and '%'."""
    return quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~", encoding="utf-8").encode(
        "ascii"
    )


def percent_decode(raw: bytes) -> str:
    return unquote(raw.decode("ascii", errors="replace"), errors="replace")
