"""HTTP/2 frames: constants, builders, and a reader that enforces the frame-level rules.

The reader checks what can be judged from a frame alone (RFC 9113 §4 and §6): size against
our SETTINGS_MAX_FRAME_SIZE (before buffering the payload), the stream id each type needs,
fixed lengths, padding, and header-block continuity and size. Rules that need stream or
connection state live in :mod:`plugproxy.relay.connection`.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Final

from plugproxy.relay.limits import Limits

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113 §6); Final, so a compiled build folds them into the code.
DATA: Final = 0
HEADERS: Final = 1
PRIORITY: Final = 2
RST_STREAM: Final = 3
SETTINGS: Final = 4
PUSH_PROMISE: Final = 5
PING: Final = 6
GOAWAY: Final = 7
WINDOW_UPDATE: Final = 8
CONTINUATION: Final = 9
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

FRAME_NAMES = (
    "DATA",
    "HEADERS",
    "PRIORITY",
    "RST_STREAM",
    "SETTINGS",
    "PUSH_PROMISE",
    "PING",
    "GOAWAY",
    "WINDOW_UPDATE",
    "CONTINUATION",
)


def frame_name(ftype: int) -> str:
    return FRAME_NAMES[ftype] if ftype < len(FRAME_NAMES) else f"frame type {ftype}"


# Error codes (RFC 9113 §7).
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
SETTINGS_TIMEOUT: Final = 0x4
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
CONNECT_ERROR: Final = 0xA
ENHANCE_YOUR_CALM: Final = 0xB
INADEQUATE_SECURITY: Final = 0xC
HTTP_1_1_REQUIRED: Final = 0xD

# Settings (RFC 9113 §6.5.2).
HEADER_TABLE_SIZE: Final = 0x1
ENABLE_PUSH: Final = 0x2
MAX_CONCURRENT_STREAMS: Final = 0x3
INITIAL_WINDOW_SIZE: Final = 0x4
MAX_FRAME_SIZE: Final = 0x5
MAX_HEADER_LIST_SIZE: Final = 0x6


class ConnectionFault(Exception):
    """A connection error (RFC 9113 §5.4.1): GOAWAY with ``code``, then close."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class StreamFault(Exception):
    """A stream error (RFC 9113 §5.4.2): RST_STREAM with ``code``; the connection goes on."""

    def __init__(self, stream_id: int, code: int, reason: str) -> None:
        super().__init__(reason)
        self.stream_id = stream_id
        self.code = code
        self.reason = reason


_HEAD = struct.Struct(">BHBBI")  # length (24 bits as 8 + 16), type, flags, stream


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _HEAD.pack(size >> 16, size & 0xFFFF, ftype, flags, stream) + payload


def header_frames(stream: int, block: bytes, end_stream: bool, max_frame: int = 16_384) -> bytes:
    """HEADERS plus the CONTINUATION frames ``block`` needs."""
    if len(block) <= max_frame:
        return frame(
            HEADERS, (END_STREAM | END_HEADERS) if end_stream else END_HEADERS, stream, block
        )
    first, rest = block[:max_frame], block[max_frame:]
    flags = (END_STREAM if end_stream else 0) | (0 if rest else END_HEADERS)
    out = [frame(HEADERS, flags, stream, first)]
    while rest:
        chunk, rest = rest[:max_frame], rest[max_frame:]
        out.append(frame(CONTINUATION, 0 if rest else END_HEADERS, stream, chunk))
    return b"".join(out)


def settings_frame(values: dict[int, int]) -> bytes:
    payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in values.items())
    return frame(SETTINGS, 0, 0, payload)


SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, increment.to_bytes(4, "big"))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, code.to_bytes(4, "big"))


def goaway(last_stream: int, code: int = NO_ERROR, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, last_stream.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


def u32(raw: bytes) -> int:
    return int.from_bytes(raw[:4], "big")


def settings_values(payload: bytes) -> list[tuple[int, int]]:
    return [
        (int.from_bytes(payload[p : p + 2], "big"), int.from_bytes(payload[p + 2 : p + 6], "big"))
        for p in range(0, len(payload), 6)
    ]


# (stream, flags, data, flow-controlled length): the length counts padding too.
DataHandler = Callable[[int, int, bytes, int], None]
# (type, flags, stream, payload) of the frames other than DATA, HEADERS and CONTINUATION
FrameHandler = Callable[[int, int, int, bytes], None]
# (stream, flags of the HEADERS frame, whole header block)
BlockHandler = Callable[[int, int, bytes], None]
FaultHandler = Callable[[StreamFault], None]

# Not a wire flag (flags are 8 bits): marks a header block whose stream depends on itself,
# which is still decoded (the HPACK context must stay in step) and then refused.
SELF_DEPENDENT = 0x100

# Frames that must (True) or must not (False) be on stream 0; others may be on either.
_STREAM_ZERO = {
    DATA: False,
    HEADERS: False,
    PRIORITY: False,
    RST_STREAM: False,
    SETTINGS: True,
    PUSH_PROMISE: False,
    PING: True,
    GOAWAY: True,
    CONTINUATION: False,
}


class FrameReader:
    """Splits one peer's bytes into frames, checks the frame-level rules, joins header blocks.

    Raises :class:`ConnectionFault`; after one, the reader must not be fed again. A
    :class:`StreamFault` goes to ``on_fault`` and reading goes on.
    """

    __slots__ = (
        "block",
        "block_flags",
        "block_frames",
        "block_started",
        "block_stream",
        "buffer",
        "limits",
        "max_frame",
        "on_block",
        "on_data",
        "on_fault",
        "on_frame",
    )

    def __init__(
        self,
        limits: Limits,
        on_data: DataHandler,
        on_frame: FrameHandler,
        on_block: BlockHandler,
        on_fault: FaultHandler,
    ) -> None:
        self.limits = limits
        self.max_frame = limits.max_frame_size
        self.on_data, self.on_frame, self.on_block, self.on_fault = (
            on_data,
            on_frame,
            on_block,
            on_fault,
        )
        self.buffer = bytearray()  # the start of a frame whose end has not arrived
        self.block: bytearray | None = None  # a header block awaiting CONTINUATION
        self.block_stream = 0
        self.block_flags = 0
        self.block_frames = 0
        self.block_started = 0.0

    def feed(self, data: bytes) -> None:
        buf = self.buffer
        if buf:
            buf += data
            size = len(buf)
            if size < 9:
                return
            length = (buf[0] << 16) | (buf[1] << 8) | buf[2]
            if size < 9 + length and length <= self.max_frame:
                return  # kept growing in place: a frame arriving in pieces costs no copies
            data = bytes(buf)
            buf.clear()
        pos, size = 0, len(data)
        max_frame = self.max_frame
        try:
            while size - pos >= 9:
                length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
                if length > max_frame:
                    raise ConnectionFault(
                        FRAME_SIZE_ERROR, f"frame of {length} bytes exceeds {max_frame}"
                    )
                end = pos + 9 + length
                if end > size:
                    break
                ftype, flags = data[pos + 3], data[pos + 4]
                sid = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                payload = data[pos + 9 : end]
                pos = end
                try:
                    # The common frames take the short way; the rest are checked in _frame.
                    if ftype == DATA and sid and not flags & PADDED and self.block is None:
                        self.on_data(sid, flags, payload, length)
                    elif (
                        ftype == HEADERS
                        and sid
                        and flags & _HEADERS_SHAPE == END_HEADERS
                        and self.block is None
                    ):
                        self.on_block(sid, flags, payload)
                    else:
                        self._frame(ftype, flags, sid, payload)
                except StreamFault as fault:
                    self.on_fault(fault)
        finally:
            if pos < size:
                buf += data[pos:]

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        on_frame, on_block = self.on_frame, self.on_block
        if self.block is not None and (ftype != CONTINUATION or sid != self.block_stream):
            raise ConnectionFault(
                PROTOCOL_ERROR,
                f"{frame_name(ftype)} inside the header block of stream {self.block_stream}",
            )
        zero = _STREAM_ZERO.get(ftype)
        if zero is not None and zero != (sid == 0):
            where = "on stream 0" if sid == 0 else f"on stream {sid}"
            raise ConnectionFault(PROTOCOL_ERROR, f"{frame_name(ftype)} {where}")
        if ftype == DATA:
            length = len(payload)
            if flags & PADDED:
                payload = _unpad(payload)
            self.on_data(sid, flags, payload, length)
        elif ftype == HEADERS:
            fragment = _unpad(payload) if flags & PADDED else payload
            if flags & PRIORITY_FLAG:
                if len(fragment) < 5:
                    raise ConnectionFault(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
                if u32(fragment) & 0x7FFFFFFF == sid:
                    flags |= SELF_DEPENDENT
                fragment = fragment[5:]
            if flags & END_HEADERS:
                on_block(sid, flags, fragment)
            else:
                self._check_block_size(len(fragment))
                self.block = bytearray(fragment)
                self.block_stream, self.block_flags = sid, flags
                self.block_frames = 0
                self.block_started = time.monotonic()
        elif ftype == CONTINUATION:
            block = self.block
            if block is None:
                raise ConnectionFault(PROTOCOL_ERROR, "CONTINUATION without a header block")
            self._check_block_size(len(block) + len(payload))
            self.block_frames += 1
            if self.block_frames > self.limits.max_continuation_frames:
                raise ConnectionFault(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
            if time.monotonic() - self.block_started > self.limits.header_block_seconds:
                raise ConnectionFault(ENHANCE_YOUR_CALM, "header block open for too long")
            block += payload
            if flags & END_HEADERS:
                self.block = None
                on_block(sid, self.block_flags, bytes(block))
        elif ftype == PRIORITY:
            if len(payload) != 5:
                raise StreamFault(sid, FRAME_SIZE_ERROR, "PRIORITY frame not 5 bytes")
            if u32(payload) & 0x7FFFFFFF == sid:
                raise StreamFault(sid, PROTOCOL_ERROR, "stream depends on itself")
            on_frame(PRIORITY, flags, sid, payload)
        elif ftype in _FIXED:
            expected = _FIXED[ftype]
            if ftype == SETTINGS:
                if (flags & ACK and payload) or len(payload) % 6:
                    raise ConnectionFault(FRAME_SIZE_ERROR, "SETTINGS of wrong length")
            elif len(payload) != expected and not (ftype == GOAWAY and len(payload) > 8):
                raise ConnectionFault(FRAME_SIZE_ERROR, f"{frame_name(ftype)} of wrong length")
            on_frame(ftype, flags, sid, payload)
        elif ftype == PUSH_PROMISE:
            raise ConnectionFault(PROTOCOL_ERROR, "PUSH_PROMISE (push is disabled)")
        # Unknown frame types are ignored (RFC 9113 §5.5).

    def _check_block_size(self, size: int) -> None:
        if size > self.limits.max_header_block_bytes:
            raise ConnectionFault(
                ENHANCE_YOUR_CALM,
                f"header block over {self.limits.max_header_block_bytes} bytes",
            )

    @property
    def block_open(self) -> bool:
        return self.block is not None


_HEADERS_SHAPE = END_HEADERS | PADDED | PRIORITY_FLAG  # a block whole, no padding or priority
_FIXED = {RST_STREAM: 4, SETTINGS: 0, PING: 8, GOAWAY: 8, WINDOW_UPDATE: 4}


def _unpad(payload: bytes) -> bytes:
    """Strip padding (RFC 9113 §6.1): the pad length must leave room for itself."""
    if not payload:
        raise ConnectionFault(FRAME_SIZE_ERROR, "padded frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionFault(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]


__all__ = [
    "ConnectionFault",
    "FrameReader",
    "StreamFault",
    "frame",
    "goaway",
    "header_frames",
    "rst_stream",
    "window_update",
]
