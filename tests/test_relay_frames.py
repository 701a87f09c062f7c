"""The frame reader: the rules one frame shows (RFC 9113 §4, §6), before any state."""

from __future__ import annotations

import pytest

from plugproxy.relay import frames
from plugproxy.relay.frames import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    FRAME_SIZE_ERROR,
    HEADERS,
    PADDED,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    ConnectionFault,
    FrameReader,
    StreamFault,
    frame,
)
from plugproxy.relay.limits import Limits


class Collector:
    """A reader whose handlers record what they are handed."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.frames: list[tuple[int, int, int, bytes, int]] = []
        self.blocks: list[tuple[int, int, bytes]] = []
        self.faults: list[StreamFault] = []
        self.reader = FrameReader(
            limits or Limits(),
            lambda sid, flags, data, length: self.frames.append((DATA, flags, sid, data, length)),
            lambda ftype, flags, sid, payload: self.frames.append((ftype, flags, sid, payload, 0)),
            lambda *b: self.blocks.append(b),
            self.faults.append,
        )

    def feed(self, data: bytes) -> None:
        self.reader.feed(data)


def test_an_oversized_frame_is_refused_from_its_header_before_the_payload_arrives():
    seen = Collector()
    with pytest.raises(ConnectionFault) as info:
        seen.feed(((16 << 20) - 1).to_bytes(3, "big") + bytes((DATA, 0)) + (1).to_bytes(4, "big"))
    assert info.value.code == FRAME_SIZE_ERROR


def test_header_blocks_are_joined_and_capped_in_bytes():
    seen = Collector(Limits(max_header_block_bytes=40_000))
    seen.feed(frame(HEADERS, 0, 1, b"a" * 10) + frame(CONTINUATION, END_HEADERS, 1, b"b"))
    assert seen.blocks == [(1, 0, b"a" * 10 + b"b")]
    seen.feed(frame(HEADERS, 0, 3, b"x" * 16_000) + frame(CONTINUATION, 0, 3, b"y" * 16_000))
    with pytest.raises(ConnectionFault) as info:
        seen.feed(frame(CONTINUATION, 0, 3, b"z" * 16_000))
    assert info.value.code == frames.ENHANCE_YOUR_CALM


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(HEADERS, 0, 1, b"x") + frame(DATA, 0, 1, b"y"), PROTOCOL_ERROR),
        (frame(HEADERS, 0, 1, b"x") + frame(CONTINUATION, END_HEADERS, 3, b"y"), PROTOCOL_ERROR),
        (frame(HEADERS, 0, 1, b"x") + frame(0xFA, 0, 1, b"y"), PROTOCOL_ERROR),
        (frame(CONTINUATION, END_HEADERS, 1, b"y"), PROTOCOL_ERROR),
        (frame(DATA, 0, 0, b"y"), PROTOCOL_ERROR),
        (frame(frames.PING, 0, 1, b"12345678"), PROTOCOL_ERROR),
        (frame(frames.PING, 0, 0, b"1234567"), FRAME_SIZE_ERROR),
        (frame(frames.SETTINGS, frames.ACK, 0, b"\x00" * 6), FRAME_SIZE_ERROR),
        (frame(frames.SETTINGS, 0, 0, b"\x00" * 5), FRAME_SIZE_ERROR),
        (frame(frames.RST_STREAM, 0, 1, b"\x00" * 3), FRAME_SIZE_ERROR),
        (frame(frames.WINDOW_UPDATE, 0, 1, b"\x00" * 5), FRAME_SIZE_ERROR),
        (frame(frames.GOAWAY, 0, 0, b"\x00" * 7), FRAME_SIZE_ERROR),
        (frame(DATA, PADDED, 1, b"\x05abc"), PROTOCOL_ERROR),
        (frame(frames.PUSH_PROMISE, 0, 1, b"\x00\x00\x00\x02"), PROTOCOL_ERROR),
    ],
    ids=[
        "DATA-inside-a-header-block",
        "CONTINUATION-of-another-stream",
        "unknown-type-inside-a-header-block",
        "CONTINUATION-without-HEADERS",
        "DATA-on-stream-0",
        "PING-on-a-stream",
        "PING-not-8-bytes",
        "SETTINGS-ACK-with-payload",
        "SETTINGS-not-multiple-of-6",
        "RST_STREAM-not-4-bytes",
        "WINDOW_UPDATE-not-4-bytes",
        "GOAWAY-under-8-bytes",
        "padding-longer-than-frame",
        "PUSH_PROMISE",
    ],
)
def test_connection_errors(data, code):
    with pytest.raises(ConnectionFault) as info:
        Collector().feed(data)
    assert info.value.code == code


def test_stream_errors_leave_the_reader_going():
    seen = Collector()
    seen.feed(
        frame(PRIORITY, 0, 1, b"\x00\x00\x00\x03\x10")  # 5 bytes: fine
        + frame(PRIORITY, 0, 3, b"\x00\x00\x00\x05")  # 4 bytes
        + frame(PRIORITY, 0, 5, b"\x00\x00\x00\x05\x10")  # depends on itself
        + frame(DATA, 0, 1, b"after"),
    )
    assert [(f.stream_id, f.code) for f in seen.faults] == [
        (3, FRAME_SIZE_ERROR),
        (5, PROTOCOL_ERROR),
    ]
    assert [f[0] for f in seen.frames] == [PRIORITY, DATA]


def test_padding_and_priority_are_stripped_but_flow_control_counts_padding():
    seen = Collector()
    seen.feed(
        frame(DATA, PADDED, 1, b"\x03data\x00\x00\x00")
        + frame(HEADERS, PRIORITY_FLAG | END_HEADERS, 1, b"\x00\x00\x00\x03\x10block")
        + frame(HEADERS, PRIORITY_FLAG | END_HEADERS, 5, b"\x00\x00\x00\x05\x10block"),
    )
    assert seen.frames == [(DATA, PADDED, 1, b"data", 8)]
    assert seen.blocks[0] == (1, PRIORITY_FLAG | END_HEADERS, b"block")
    # A self-dependent HEADERS is still handed on (HPACK must decode it), marked.
    assert seen.blocks[1][1] & frames.SELF_DEPENDENT


def test_frames_split_anywhere_are_read_whole():
    wire = frame(DATA, 0, 1, b"x" * 100) + frame(0xFA, 0, 0, b"ignored") + frame(DATA, 0, 3, b"y")
    seen = Collector()
    for i in range(0, len(wire), 7):
        seen.feed(wire[i : i + 7])
    assert [(f[2], f[3]) for f in seen.frames] == [(1, b"x" * 100), (3, b"y")]
