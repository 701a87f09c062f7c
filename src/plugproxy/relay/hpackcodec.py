"""HPACK and header fields for the frame relay.

Decoding uses hpack's Decoder, bounded by the header list size we advertise; encoding uses
no dynamic table; requests and responses are checked against RFC 9113 §8.2-8.3.

The relay decodes every header block it receives (each direction keeps its own dynamic
table, as HPACK requires) and re-encodes what it sends as literals that never enter a
dynamic table (RFC 7541 §6.2.2). The blocks it sends are therefore independent of one
another: the relay may hold a call, answer it itself or drop a late block without
desynchronising either peer's decoder. Names are looked up in the static table so common
headers still cost one byte. A field its sender marked "never indexed" (§6.2.3: an
authorization token, a cookie) is decoded as :class:`NeverIndexed` and sent on with the
same marking, as that section requires of an intermediary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

import hpack
from hpack.hpack import decode_integer as hpack_decode_integer
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable
from mypy_extensions import mypyc_attr

# (name, value). Of any length to the type checker, so that a compiled build keeps each
# field the tuple it is (a NeverIndexed stays one) instead of unpacking it to two values.
Header = tuple[bytes, ...]

_STATIC = HeaderTable.STATIC_TABLE
# One-byte indexed fields (0x80 | index): the last that names a static entry, and the
# first that names a dynamic one (RFC 7541 §2.3.3).
_LAST_STATIC = 0x80 + len(_STATIC)
_FIRST_DYNAMIC = _LAST_STATIC + 1
_STATIC_NAME_INDEX: dict[bytes, int] = {}
for _index, (_name, _value) in enumerate(HeaderTable.STATIC_TABLE, start=1):
    _STATIC_NAME_INDEX.setdefault(_name, _index)

_NAME_CACHE_LIMIT = 512  # header names are few; a CO inventing names must not grow memory
_name_prefix: dict[bytes, bytes] = {}


# A compiled build keeps this an ordinary class: native classes cannot subclass tuple.
@mypyc_attr(native_class=False)
class NeverIndexed(tuple[bytes, bytes]):
    """A field its sender encoded as never indexed (RFC 7541 §6.2.3), so that any hop after
    us keeps it out of compression contexts too. Unequal to the plain (name, value) pair:
    no cache keyed by fields or header lists can hand one's encoding to the other."""

    __slots__ = ()

    def __new__(cls, name: bytes, value: bytes) -> NeverIndexed:
        return tuple.__new__(cls, (name, value))

    def __eq__(self, other: object) -> bool:
        return other.__class__ is NeverIndexed and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((NeverIndexed, self[0], self[1]))


def encode_integer(value: int, prefix_bits: int, first: int) -> bytes:
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
            prefix = encode_integer(index, 4, 0x00)  # literal without indexing, indexed name
        else:
            prefix = b"\x00" + encode_integer(len(name), 7, 0x00) + name
        if len(_name_prefix) < _NAME_CACHE_LIMIT:
            _name_prefix[name] = prefix
    return prefix


def encode(headers: Iterable[Header]) -> bytes:
    """A header block of literals without indexing (never indexed for :class:`NeverIndexed`
    fields); order and duplicates are kept."""
    parts: list[bytes] = []
    append = parts.append
    prefixes = _name_prefix
    known = _encoded_fields
    for field in headers:
        encoded = known.get(field)
        if encoded is not None:
            append(encoded)
            continue
        name, value = field
        size = len(value)
        prefix = prefixes.get(name) or _name_bytes(name)
        if field.__class__ is NeverIndexed:  # §6.2.3: 0001 instead of 0000 in the first byte
            prefix = bytes((prefix[0] | 0x10,)) + prefix[1:]
        encoded = b"".join(
            (prefix, bytes((size,)) if size < 0x7F else encode_integer(size, 7, 0x00), value)
        )
        if name in _RECURRING and len(known) < _FIELDS_LIMIT:
            known[field] = encoded
        append(encoded)
    return b"".join(parts)


# Fields whose values recur from call to call (a client's :path, :authority, user-agent);
# each is encoded once. Per-call values (grpc-timeout, request ids) are never kept.
_RECURRING = frozenset(
    {b":method", b":scheme", b":path", b":authority", b"content-type", b"te", b"user-agent"}
)
_FIELDS_LIMIT = 1024
_encoded_fields: dict[Header, bytes] = {}


# The header lists the caches of this module and grpcwire keep are small: what recurs is
# (":status 200", "grpc-status 0"); large unique lists from a peer must not fill memory.
REMEMBERED_MAX_BYTES = 512


def rememberable(headers: Iterable[Header]) -> bool:
    return sum(len(name) + len(value) for name, value in headers) <= REMEMBERED_MAX_BYTES


_encoded: dict[tuple[Header, ...], bytes] = {}
_ENCODED_LIMIT = 256


def encode_repeated(headers: list[Header]) -> bytes:
    """:func:`encode` for header lists that recur (a plugin's response headers and trailers):
    a lookup once seen."""
    key = tuple(headers)
    block = _encoded.get(key)
    if block is None:
        block = encode(headers)
        if len(_encoded) < _ENCODED_LIMIT and rememberable(headers):
            _encoded[key] = block
    return block


def new_decoder(max_header_list_size: int = 65_536) -> hpack.Decoder:
    decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
    return decoder


def decode(decoder: hpack.Decoder, block: bytes) -> list[Header]:
    """Decode one header block as (name, value) bytes pairs; updates the decoder's table.

    Raises :class:`TooLarge` as soon as the decoded list passes the decoder's
    ``max_header_list_size`` (so a small block that references a large table entry many
    times costs little), :class:`DecodeError` for anything else HPACK forbids.

    The walk is our own, over hpack's table, integer and Huffman primitives: hpack's
    ``Decoder.decode`` copies the rest of the block for every literal field and wraps
    every field in an object, which made header decoding the relay's largest cost.
    A block made only of one-byte indexed fields (RFC 7541 §6.1) changes no table and is
    looked up directly: after a connection's first call, a gRPC server's headers
    (":status 200", "content-type") and trailers ("grpc-status 0") are such blocks.
    """
    table = decoder.header_table
    # Too few fields to be too large: each is one byte, and no entry exceeds the table.
    few = len(block) * _MAX_ENTRY <= decoder.max_header_list_size
    if few and block and min(block) > 0x80 and 0xFF not in block:
        dynamic = table.dynamic_entries
        try:
            # list[Any]: the table's own tuples go into the list as they are (a compiled
            # build would otherwise unpack each field and pack it into a new tuple).
            fields: list[Any] = [
                _STATIC[byte - 0x81] if byte <= _LAST_STATIC else dynamic[byte - _FIRST_DYNAMIC]
                for byte in block
            ]
        except IndexError:
            pass  # past the dynamic table: the walk below raises InvalidTableIndex
        else:
            return fields
    entry = table.get_by_index
    budget = decoder.max_header_list_size
    out: list[Header] = []
    end = len(block)
    at = 0
    while at < end:
        first = block[at]
        if first & 0x80:  # indexed field (§6.1)
            index, at = _integer(block, at, 7)
            name, value = entry(index)  # index 0 or past the table: InvalidTableIndex
        elif first & 0x40 or not first & 0x20:  # literal field (§6.2.1-6.2.3)
            indexing = bool(first & 0x40)
            index, at = _integer(block, at, 6 if indexing else 4)
            name, at = _string(block, at) if not index else (entry(index)[0], at)
            value, at = _string(block, at)
            if indexing:
                table.add(name, value)
        else:  # dynamic table size update (§6.3), only before the first field
            if out:
                raise hpack.HPACKDecodingError("Table size update not at the start of the block")
            size, at = _integer(block, at, 5)
            if size > decoder.max_allowed_table_size:
                raise hpack.InvalidTableSizeError("Encoder exceeded max allowable table size")
            decoder.header_table_size = size
            continue
        budget -= len(name) + len(value) + 32
        if budget < 0:
            raise TooLarge(f"header list over {decoder.max_header_list_size} bytes")
        # 0001 starts a never-indexed literal (§6.2.3): the marking goes on with the field.
        # Two appends, not one conditional: its type would be a plain pair, and a compiled
        # build would make the NeverIndexed into one.
        if first & 0xF0 == 0x10:
            out.append(NeverIndexed(name, value))
        else:
            out.append((name, value))
    if decoder.header_table_size > decoder.max_allowed_table_size:
        raise hpack.InvalidTableSizeError("Encoder did not shrink table size to within the max")
    return out


def _integer(block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """The integer at ``at`` with an N-bit prefix (§5.1), and where what follows starts.
    One that overflows its prefix goes to hpack's decoder, on a view (no copy)."""
    limit = (1 << prefix_bits) - 1
    value = block[at] & limit
    if value < limit:
        return value, at + 1
    value, used = hpack_decode_integer(memoryview(block)[at:], prefix_bits)
    return value, at + used


def _string(block: bytes, at: int) -> tuple[bytes, int]:
    """The string literal at ``at`` (§5.2) and where the next field starts."""
    if at >= len(block):
        raise hpack.HPACKDecodingError("Truncated header block")
    huffman = block[at] & 0x80
    length, at = _integer(block, at, 7)
    stop = at + length
    if stop > len(block):
        raise hpack.HPACKDecodingError("Truncated header block")
    text = block[at:stop]
    return (decode_huffman(text) if huffman else text), stop


# No table entry is larger than the table (4,096 bytes: we never raise HEADER_TABLE_SIZE).
_MAX_ENTRY = 4_096
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
_NAMES_CHECKED_LIMIT = 512  # a CO inventing names must not grow memory
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


class RequestHead(NamedTuple):
    """What the relay reads from a request's headers, found while checking them."""

    method: bytes
    path: bytes
    content_type: bytes
    grpc_timeout: bytes  # b"" when none
    content_length: int  # -1 when none


_BAD_VALUE = re.compile(rb"[\r\n\x00]")


def _value_problem(headers: Iterable[Header]) -> str:
    """A value holding CR, LF or NUL (§8.2.1); one search over the block's values."""
    if not _BAD_VALUE.search(b"\x01".join([value for _, value in headers])):
        return ""
    name = next(name for name, value in headers if _BAD_VALUE.search(value))
    return f"field {name[:64]!r} has a CR, LF or NUL in its value"


def check_request(headers: list[Header]) -> tuple[str, RequestHead | None]:
    """Why a request's header block is malformed (§8.3.1), or "" and what it says."""
    good = _good_names
    pseudo: set[bytes] = set()
    regular = False
    method = path = content_type = grpc_timeout = b""
    length = -1
    problem = _value_problem(headers)
    if problem:
        return problem, None
    for name, value in headers:
        if name not in good:
            if name[:1] == b":":
                if regular:
                    return f"pseudo-header {name[:64].decode('latin-1')} after a field", None
                if name not in REQUEST_PSEUDO:
                    return f"pseudo-header {name[:64].decode('latin-1')} not allowed", None
                if name in pseudo:
                    return f"pseudo-header {name.decode()} repeated", None
                pseudo.add(name)
                if name == b":method":
                    method = value
                elif name == b":path":
                    if not value:
                        return "empty :path", None
                    path = value
                continue
            problem = _name_problem(name)
            if problem:
                return problem, None
        regular = True
        if name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            grpc_timeout = value
        elif name == b"te":
            if value != b"trailers":
                return "te other than trailers", None
        elif name == b"content-length":
            if not value.isdigit() or (length >= 0 and int(value) != length):
                return "invalid content-length", None
            length = int(value)
    if method == b"CONNECT":
        if b":scheme" in pseudo or b":path" in pseudo or b":authority" not in pseudo:
            return "CONNECT needs :authority and no :scheme or :path", None
    else:
        for required in (b":method", b":scheme", b":path"):
            if required not in pseudo:
                return f"{required.decode()} missing", None
        if not method:
            return "empty :method", None
    return "", RequestHead(method, path, content_type, grpc_timeout, length)


_CHECKED_LIMIT = 512
# Header lists found well formed, as response headers (False) or trailers (True). A plugin
# sends the same few again and again ("grpc-status: 0"), so most checks are one lookup.
_well_formed: dict[tuple[bool, tuple[Header, ...]], None] = {}


def response_problem(headers: list[Header], trailers: bool) -> str:
    """Why response headers or any trailers are malformed (§8.1, §8.3.2), or "" if not."""
    key = (trailers, tuple(headers))
    if key in _well_formed:
        return ""
    problem = _response_problem(headers, trailers)
    if not problem and len(_well_formed) < _CHECKED_LIMIT and rememberable(headers):
        _well_formed[key] = None
    return problem


def _response_problem(headers: list[Header], trailers: bool) -> str:
    good = _good_names
    status = False
    regular = False
    problem = _value_problem(headers)
    if problem:
        return problem
    for name, value in headers:
        if name in good:
            regular = True
        elif name[:1] == b":":
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
