"""One side of the relay, on its own: the timers and state rules no peer can hurry."""

from __future__ import annotations

import asyncio
from typing import Any

from plugproxy.relay.connection import PING_ACK_DELAY, H2Connection
from plugproxy.relay.frames import (
    ACK,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    PROTOCOL_ERROR,
    SETTINGS,
    frame,
)
from plugproxy.relay.limits import Limits


class Transport(asyncio.Transport):
    """Keeps what the connection writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closing = False

    def writelines(self, data: Any) -> None:
        self.written += b"".join(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True


class Events:
    def __init__(self) -> None:
        self.failed: list[tuple[int, str]] = []

    def on_failed(self, conn: H2Connection, code: int, reason: str) -> None:
        self.failed.append((code, reason))

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def frames_in(data: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos + 9 <= len(data):
        size = int.from_bytes(data[pos : pos + 3], "big")
        out.append((data[pos + 3], data[pos + 9 : pos + 9 + size]))
        pos += 9 + size
    return out


def server(limits: Limits) -> tuple[H2Connection, Transport, Events]:
    events, transport = Events(), Transport()
    conn = H2Connection(limits, events, server=True)  # type: ignore[arg-type]
    conn.start(transport)
    return conn, transport, events


async def test_a_header_block_left_open_is_cut_when_its_time_is_up():
    conn, transport, events = server(Limits(header_block_seconds=0.2))
    conn.receive(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0, 1, b"\x82"))
    conn.after_read()
    await asyncio.sleep(0.1)
    assert events.failed == []
    await asyncio.sleep(0.3)
    assert events.failed == [(ENHANCE_YOUR_CALM, "header block open for too long")]
    goaway = [payload for ftype, payload in frames_in(transport.written) if ftype == GOAWAY]
    assert int.from_bytes(goaway[0][4:8], "big") == ENHANCE_YOUR_CALM


async def test_a_client_that_never_sends_its_preface_is_cut_off():
    conn, transport, events = server(Limits(header_block_seconds=0.2))
    conn.receive(PREFACE[:10])
    await asyncio.sleep(0.4)
    assert events.failed == [(PROTOCOL_ERROR, "no HTTP/2 preface in time")]
    # Our SETTINGS went first, before anything was read (RFC 9113 §3.4).
    assert frames_in(transport.written)[0][0] == SETTINGS


async def test_a_complete_preface_stops_the_timer():
    conn, _, events = server(Limits(header_block_seconds=0.2))
    conn.receive(PREFACE + frame(SETTINGS, 0, 0))
    await asyncio.sleep(0.4)
    assert events.failed == []
    assert conn.timer is None


async def test_a_ping_acknowledgement_goes_with_the_next_frames_or_alone_soon_after():
    """RFC 9113 §6.7: every PING is acknowledged, first among what is written. gRPC peers
    ping with each message they receive; the acknowledgement waits (briefly) for the
    frames the connection writes next instead of being a write of its own."""
    conn, transport, _ = server(Limits())
    conn.receive(PREFACE + frame(SETTINGS, 0, 0))
    conn.flush()
    transport.written = b""
    conn.receive(frame(PING, 0, 0, b"12345678"))
    conn.flush()
    assert transport.written == b""  # waiting for company
    conn.send_goaway()  # the next frames this connection writes
    conn.flush()
    kinds = [(ftype, payload) for ftype, payload in frames_in(transport.written)]
    assert kinds[0] == (PING, b"12345678") and kinds[1][0] == GOAWAY
    assert conn.ack_timer is None
    transport.written = b""
    conn.receive(frame(PING, 0, 0, b"alone..."))
    conn.flush()
    await asyncio.sleep(PING_ACK_DELAY * 20)
    assert frames_in(transport.written) == [(PING, b"alone...")]
    assert transport.written[4] == ACK
