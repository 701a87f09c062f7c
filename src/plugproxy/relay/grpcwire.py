"""gRPC over HTTP/2: messages, deadlines, metadata and statuses as the frame relay reads them."""

from __future__ import annotations

import base64
from collections.abc import Sequence

from plugproxy.api import Metadata, MetadataValue, StatusCode
from plugproxy.relay import frames
from plugproxy.relay.hpackcodec import REMEMBERED_MAX_BYTES, Header, rememberable

# Headers gRPC itself manages; the rest of a request's headers is call metadata.
TRANSPORT_HEADERS = frozenset(
    {
        b"user-agent",
        b"te",
        b"content-type",
        b"grpc-timeout",
        b"grpc-encoding",
        b"grpc-accept-encoding",
        b"grpc-message-type",
    }
)
RESPONSE_RESERVED = frozenset(
    {b"content-type", b"grpc-status", b"grpc-message", b"grpc-encoding", b"grpc-accept-encoding"}
)

# How a client reads a plugin's RST_STREAM (as grpc-go does).
RST_STATUS = {
    frames.CANCEL: StatusCode.CANCELLED,
    frames.REFUSED_STREAM: StatusCode.UNAVAILABLE,
    frames.FLOW_CONTROL_ERROR: StatusCode.RESOURCE_EXHAUSTED,
    frames.ENHANCE_YOUR_CALM: StatusCode.RESOURCE_EXHAUSTED,
    frames.INADEQUATE_SECURITY: StatusCode.PERMISSION_DENIED,
}
STATUS_BY_NUMBER = {code.value[0]: code for code in StatusCode}

TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def parse_timeout(raw: bytes) -> float | None:
    unit = TIMEOUT_UNITS.get(raw[-1:])
    if unit is None or not raw[:-1].isdigit():
        return None
    return int(raw[:-1]) * unit


def format_timeout(seconds: float) -> bytes:
    """grpc-timeout: at most 8 digits, in the finest unit that fits."""
    for unit, scale in ((b"u", 1e6), (b"m", 1e3), (b"S", 1.0), (b"M", 1 / 60), (b"H", 1 / 3600)):
        value = int(seconds * scale) or 1
        if value < 100_000_000:
            return str(value).encode() + unit
    return b"99999999H"


def metadata_value(name: bytes, value: bytes) -> MetadataValue:
    if name.endswith(b"-bin"):
        try:
            return base64.b64decode(value + b"=" * (-len(value) % 4))
        except ValueError:
            return value
    return value.decode("latin-1")


_metadata_items: dict[Header, tuple[str, MetadataValue]] = {}
_METADATA_ITEMS_LIMIT = 512
# Per-call values: never worth remembering.
_PER_CALL = frozenset({b"grpc-timeout", b"csi.requestid", b"traceparent", b"tracestate"})


def metadata_item(name: bytes, value: bytes) -> tuple[str, MetadataValue]:
    """A request header as a call's metadata item; a lookup for the fields a client sends
    on every call (user-agent, content-type, te, its own fixed metadata)."""
    item = _metadata_items.get((name, value))
    if item is None:
        item = (name.decode("latin-1"), metadata_value(name, value))
        small = len(name) + len(value) <= REMEMBERED_MAX_BYTES
        if small and name not in _PER_CALL and len(_metadata_items) < _METADATA_ITEMS_LIMIT:
            _metadata_items[(name, value)] = item
    return item


def metadata_bytes(name: str, value: MetadataValue) -> bytes:
    if isinstance(value, bytes):
        if name.endswith("-bin"):
            return base64.b64encode(value).rstrip(b"=")
        return value
    return value.encode("latin-1", errors="replace")


def to_metadata(headers: Sequence[Header], reserved: frozenset[bytes]) -> Metadata:
    return tuple(
        (name.decode("latin-1"), metadata_value(name, value))
        for name, value in headers
        if name[:1] != b":" and name not in reserved
    )


_response_metadata: dict[tuple[Header, ...], Metadata] = {}
_RESPONSE_METADATA_LIMIT = 256


def response_metadata(headers: Sequence[Header]) -> Metadata:
    """:func:`to_metadata` of a plugin's response headers or trailers, which recur call
    after call (":status 200", "grpc-status 0"): a lookup once seen."""
    key = tuple(headers)
    metadata = _response_metadata.get(key)
    if metadata is None:
        metadata = to_metadata(headers, RESPONSE_RESERVED)
        if len(_response_metadata) < _RESPONSE_METADATA_LIMIT and rememberable(headers):
            _response_metadata[key] = metadata
    return metadata


def is_grpc(content_type: bytes) -> bool:
    """application/grpc, or application/grpc+proto and its kin (gRPC over HTTP/2 spec)."""
    return content_type == b"application/grpc" or content_type.startswith(
        (b"application/grpc+", b"application/grpc;")
    )


class MessageTooLarge(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class Messages:
    """Splits one direction of a stream into gRPC messages (1-byte flag, 4-byte length).

    Always checks lengths against the limit; keeps message bytes only when ``collect``.
    Memory follows the bytes that arrived, never the length a prefix claims: a message
    arriving in pieces is kept as those pieces and joined once when whole.
    """

    __slots__ = ("chunks", "collect", "compressed", "count", "got", "head", "limit", "need")

    def __init__(self, limit: int, collect: bool) -> None:
        self.limit = limit
        self.collect = collect
        self.head = b""  # a length prefix split across DATA frames
        self.chunks: list[bytes] = []
        self.got = 0  # body bytes of the message in progress kept so far
        self.need = -1  # -1: reading a prefix; else body bytes still to come
        self.compressed = False
        self.count = 0  # whole messages seen

    @property
    def incomplete(self) -> bool:
        """A message has begun and not ended (its prefix or body is cut)."""
        return self.need >= 0 or bool(self.head)

    def feed(self, data: bytes) -> list[tuple[bool, bytes]]:
        out: list[tuple[bool, bytes]] = []
        pos, size = 0, len(data)
        while pos < size:
            need = self.need
            if need < 0:
                if self.head or size - pos < 5:
                    take = min(5 - len(self.head), size - pos)
                    self.head += data[pos : pos + take]
                    pos += take
                    if len(self.head) < 5:
                        break
                    prefix, self.head = self.head, b""
                    compressed, length = prefix[0] == 1, int.from_bytes(prefix[1:5], "big")
                else:
                    compressed = data[pos] == 1
                    length = int.from_bytes(data[pos + 1 : pos + 5], "big")
                    pos += 5
                if length > self.limit:
                    raise MessageTooLarge(length)
                if length == 0 or (pos + length <= size):
                    self.count += 1
                    if self.collect:
                        out.append((compressed, data[pos : pos + length]))
                    pos += length
                    continue
                self.compressed = compressed
                self.need = length
                self.got = 0
                continue
            take = min(need, size - pos)
            if self.collect:
                self.chunks.append(data if take == size else data[pos : pos + take])
                self.got += take
            pos += take
            self.need = need - take
            if self.need:
                continue
            self.need = -1
            self.count += 1
            if self.collect:
                out.append((self.compressed, b"".join(self.chunks)))
                self.chunks = []
                self.got = 0
        return out


def message_frame(compressed: bool, body: bytes) -> bytes:
    return (b"\x01" if compressed else b"\x00") + len(body).to_bytes(4, "big") + body
