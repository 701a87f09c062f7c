"""HPACK and header fields for the frame relay.

Decoding uses hpack's Decoder, bounded by the header list size we advertise; encoding uses
no dynamic table; requests and responses are checked against RFC 9113 §8.2-8.3.

The relay decodes every header block it receives (each direction keeps its own dynamic
table, as HPACK requires) and re-encodes what it sends as literals that never enter a
dynamic table (RFC 7541 §6.2.2). The blocks it sends are therefore independent of one
another: the relay may hold a call, answer it itself or drop a late block without
desynchronising either peer's decoder. Names are looked up in the static table so common
headers still cost one byte.
"""

from __future__ import annotations

import re
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


def new_decoder(max_header_list_size: int = 65_536) -> hpack.Decoder:
    decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
    return decoder


def decode(decoder: hpack.Decoder, block: bytes) -> list[Header]:
    """Decode one header block as (name, value) bytes pairs; updates the decoder's table.

    Raises :class:`TooLarge` as soon as the decoded list passes the decoder's
    ``max_header_list_size`` (so a small block that references a large table entry many
    times costs little), :class:`DecodeError` for anything else HPACK forbids.

    A block made only of one-byte indexed fields (RFC 7541 §6.1) changes no table and is
    looked up directly: after a connection's first call, a gRPC server's headers
    (":status 200", "content-type") and trailers ("grpc-status 0") are such blocks.
    """
    if block and min(block) > 0x80 and 0xFF not in block:
        entry = decoder.header_table.get_by_index
        out = []
        budget = decoder.max_header_list_size
        for byte in block:
            name, value = entry(byte & 0x7F)
            budget -= len(name) + len(value) + 32
            if budget < 0:
                raise TooLarge(f"header list over {decoder.max_header_list_size} bytes")
            out.append((name, value))
        return out
    # HeaderTuple is a tuple subclass of exactly these two bytes values.
    return cast("list[Header]", decoder.decode(block, raw=True))


DecodeError = hpack.HPACKError
TooLarge = hpack.OversizedHeaderListError

# -- RFC 9113 §8.2-8.3: what makes a request or response malformed -------------------------

# Names of hop-by-hop HTTP/1 fields, which HTTP/2 forbids (§8.2.2).
CONNECTION_SPECIFIC = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)
REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
# A name may hold visible ASCII but no uppercase letter and no colon (§8.2.1).
_BAD_NAME = re.compile(rb"[^\x21-\x39\x3b-\x40\x5b-\x7e]")
_NAMES_CHECKED_LIMIT = 512
_good_names: set[bytes] = set()


def _name_problem(name: bytes) -> str:
    if name in _good_names:
        return ""
    if not name or _BAD_NAME.search(name):
        return f"invalid field name {name[:64]!r}"
    if name in CONNECTION_SPECIFIC:
        return f"connection-specific field {name.decode()!r}"
    if len(_good_names) < _NAMES_CHECKED_LIMIT:
        _good_names.add(name)
    return ""


def _value_problem(name: bytes, value: bytes) -> str:
    if b"\n" in value or b"\r" in value or b"\x00" in value:
        return f"field {name[:64]!r} has a CR, LF or NUL in its value"
    return ""


def check_request(headers: Iterable[Header]) -> tuple[str, int]:
    """Why a request's header block is malformed (§8.3.1), or "" when it is not; and the
    content-length it declares (-1 when none)."""
    pseudo: set[bytes] = set()
    regular = False
    method = b""
    length = -1
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                return f"pseudo-header {name.decode('latin-1')} after a regular field", length
            if name not in REQUEST_PSEUDO:
                return f"pseudo-header {name[:64].decode('latin-1')} not allowed here", length
            if name in pseudo:
                return f"pseudo-header {name.decode()} repeated", length
            pseudo.add(name)
            if name == b":method":
                method = value
            elif name == b":path" and not value:
                return "empty :path", length
        else:
            regular = True
            problem = _name_problem(name)
            if problem:
                return problem, length
            if name == b"te" and value != b"trailers":
                return "te other than trailers", length
            if name == b"content-length":
                if not value.isdigit() or (length >= 0 and int(value) != length):
                    return "invalid content-length", length
                length = int(value)
        problem = _value_problem(name, value)
        if problem:
            return problem, length
    if method == b"CONNECT":
        if b":scheme" in pseudo or b":path" in pseudo or b":authority" not in pseudo:
            return "CONNECT needs :authority and no :scheme or :path", length
        return "", length
    for required in (b":method", b":scheme", b":path"):
        if required not in pseudo:
            return f"{required.decode()} missing", length
    return "", length


def response_problem(headers: Iterable[Header], trailers: bool) -> str:
    """Why response headers or any trailers are malformed (§8.1, §8.3.2), or "" if not."""
    status = False
    regular = False
    for name, value in headers:
        if name[:1] == b":":
            if trailers or regular or name != b":status" or status:
                return f"pseudo-header {name[:64].decode('latin-1')} out of place"
            if len(value) != 3 or not value.isdigit():
                return "invalid :status"
            status = True
        else:
            regular = True
            problem = _name_problem(name)
            if problem:
                return problem
        problem = _value_problem(name, value)
        if problem:
            return problem
    if not trailers and not status:
        return ":status missing"
    return ""


def percent_encode(message: str) -> bytes:
    """grpc-message encoding: UTF-8, then %XX for anything outside printable ASCII and '%'."""
    return quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~", encoding="utf-8").encode(
        "ascii"
    )


def percent_decode(raw: bytes) -> str:
    return unquote(raw.decode("ascii", errors="replace"), errors="replace")
