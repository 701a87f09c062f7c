"""HTTP/2 conformance of the frame relay, on both of its connections.

Toward the CO the relay is an HTTP/2 server; toward the plugin it is an HTTP/2 client
(src/plugproxy/relay/connection.py). Each test sends real bytes over UNIX sockets and
checks the exact reaction the RFCs ask for: GOAWAY with a given code for a connection
error (RFC 9113 §5.4.1), RST_STREAM with a given code for a stream error (§5.4.2).

- CO side: a raw client (frames built with ``plugproxy.relay.frames.frame``) or an ``h2``
  client talks to an in-process proxy in front of the recorder plugin of tests/support.py.
- Plugin side: a small raw HTTP/2 server here (:class:`FakePlugin`) misbehaves behind the
  proxy; a grpc.aio caller (or an ``h2`` client, to see the exact RST_STREAM) calls
  through the proxy.

Case ids name the section of RFC 9113 (``9113-…``) or RFC 7541 (``7541-…``) they check.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import grpc
import h2.config
import h2.connection
import h2.events
import hpack
import pytest

from plugproxy.relay import hpackcodec
from plugproxy.relay.frames import (
    ACK,
    CANCEL,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ACK,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    frame,
    frame_name,
    goaway,
    rst_stream,
    settings_frame,
    settings_values,
    window_update,
)
from plugproxy.relay.limits import DEFAULT_WINDOW, MAX_WINDOW
from tests.support import ECHO, channel, start_proxy, start_recorder, wait_until

TIMEOUT = 5.0  # every read waits at most this long
UNARY = ECHO + "Unary"
HANG = ECHO + "Hang"
Header = tuple[bytes, bytes]

# -- frames on the wire ------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    type: int
    flags: int
    stream: int
    payload: bytes
    at: float = field(default=0.0, compare=False)  # time.monotonic() when it was read

    @property
    def code(self) -> int:
        """The error code of a RST_STREAM or GOAWAY."""
        if self.type == GOAWAY:
            return int.from_bytes(self.payload[4:8], "big")
        assert self.type == RST_STREAM, self
        return int.from_bytes(self.payload[:4], "big")

    @property
    def last_stream(self) -> int:
        assert self.type == GOAWAY, self
        return int.from_bytes(self.payload[:4], "big") & 0x7FFFFFFF

    @property
    def settings(self) -> dict[int, int]:
        assert self.type == SETTINGS, self
        return dict(settings_values(self.payload))

    def __repr__(self) -> str:
        head = f"{frame_name(self.type)} flags={self.flags:#x} stream={self.stream}"
        return f"<{head} {self.payload[:40]!r}>"


def is_error(f: Frame) -> bool:
    return f.type in (GOAWAY, RST_STREAM)


class Peer(asyncio.Protocol):
    """One end of a raw HTTP/2 connection: writes bytes, reads and keeps frames.

    A plain protocol rather than asyncio streams: bytes that arrived before the peer
    closed (its GOAWAY, say) are always read, even after a write to it failed."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        self.arrived = asyncio.Event()
        self.log: list[Frame] = []  # every frame read, in order
        self.opened = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.opened = time.monotonic()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.arrived.set()

    def eof_received(self) -> None:
        self.eof = True
        self.arrived.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.arrived.set()

    def send(self, *chunks: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(chunks))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def _fill(self, size: int, timeout: float | None) -> bool:
        """Waits for ``size`` bytes; False if the connection ends first."""
        while len(self.buffer) < size:
            if self.eof:
                return False
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), timeout)
        return True

    async def chunk(self, timeout: float | None = TIMEOUT) -> bytes:
        """Whatever has arrived (waiting for something), or b"" at the end."""
        await self._fill(1, timeout)
        out = bytes(self.buffer)
        self.buffer.clear()
        return out

    async def read_exactly(self, size: int, timeout: float | None = TIMEOUT) -> bytes:
        await self._fill(size, timeout)
        out = bytes(self.buffer[:size])
        del self.buffer[:size]
        return out

    async def frame(self, timeout: float | None = TIMEOUT) -> Frame | None:
        """The next frame, or None once the peer has closed the connection."""
        if not await self._fill(9, timeout):
            return None
        length = int.from_bytes(self.buffer[:3], "big")
        if not await self._fill(9 + length, timeout):
            return None
        buf = self.buffer
        got = Frame(
            buf[3],
            buf[4],
            int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF,
            bytes(buf[9 : 9 + length]),
            time.monotonic(),
        )
        del buf[: 9 + length]
        self.log.append(got)
        return got

    async def until(self, match: Callable[[Frame], bool]) -> Frame:
        while True:
            got = await self.frame()
            if got is None:
                raise AssertionError(f"connection closed; frames read: {self.log}")
            if match(got):
                return got

    async def reaction(self) -> Frame:
        """The first GOAWAY or RST_STREAM the peer sends."""
        return await self.until(is_error)

    async def closed(self) -> list[Frame]:
        """Frames up to the peer closing the connection (fails if it stays open)."""
        rest = []
        while (got := await self.frame()) is not None:
            rest.append(got)
        return rest

    async def alive(self) -> None:
        """The connection still works: a PING is answered, with no GOAWAY before it."""
        self.send(frame(PING, 0, 0, b"liveness"))
        got = await self.until(lambda f: f.type == GOAWAY or (f.type == PING and f.flags & ACK))
        assert got.type == PING and got.payload == b"liveness", got


@contextlib.asynccontextmanager
async def connect(path: str) -> AsyncIterator[Peer]:
    _, peer = await asyncio.get_running_loop().create_unix_connection(Peer, path)
    try:
        yield peer
    finally:
        peer.close()


# -- requests and responses --------------------------------------------------------------


def grpc_headers(path: str = UNARY) -> list[Header]:
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode()),
        (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]


# Not gRPC: the proxy answers it itself and it stays open until the client ends it.
PLAIN_POST: list[Header] = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/"),
    (b":authority", b"localhost"),
]
GET: list[Header] = [
    (b":method", b"GET"),
    (b":scheme", b"http"),
    (b":path", b"/"),
    (b":authority", b"localhost"),
]
OK_HEADERS: list[Header] = [(b":status", b"200"), (b"content-type", b"application/grpc")]
OK_TRAILERS: list[Header] = [(b"grpc-status", b"0")]


def message(payload: bytes) -> bytes:
    """One gRPC message: uncompressed flag, 4-byte length, payload."""
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def headers(sid: int, fields: list[Header], *, end_stream: bool = False) -> bytes:
    """A complete HEADERS frame; literals without indexing keep any decoder in step."""
    flags = END_HEADERS | (END_STREAM if end_stream else 0)
    return frame(HEADERS, flags, sid, hpackcodec.encode(fields))


def data(sid: int, payload: bytes, *, end_stream: bool = False) -> bytes:
    return frame(DATA, END_STREAM if end_stream else 0, sid, payload)


def ping(payload: bytes = b"12345678") -> bytes:
    return frame(PING, 0, 0, payload)


S = settings_frame({})  # the client's SETTINGS, right after the preface
OPEN1 = headers(1, PLAIN_POST)  # stream 1 open (half-closed on neither side)


# -- an h2 client for whole requests -----------------------------------------------------


@dataclass
class Response:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    trailers: dict[bytes, bytes] = field(default_factory=dict)
    reset: int | None = None  # RST_STREAM error code
    done: bool = False


class H2Client:
    """An h2 client connection; ``strict=False`` lets it send headers h2 would refuse."""

    def __init__(self, peer: Peer, *, strict: bool = True) -> None:
        self.peer = peer
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_outbound_headers=strict,
            normalize_outbound_headers=strict,
        )
        self.conn = h2.connection.H2Connection(config)
        self.conn.initiate_connection()
        self.responses: dict[int, Response] = {}
        self.terminated: h2.events.ConnectionTerminated | None = None
        self.flush()

    def flush(self) -> None:
        out = self.conn.data_to_send()
        if out:
            self.peer.send(out)

    def request(self, fields: list[Header], body: bytes = b"", *, end_stream: bool = True) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.responses[sid] = Response()
        self.conn.send_headers(sid, fields, end_stream=end_stream and not body)
        if body:
            self.conn.send_data(sid, body, end_stream=end_stream)
        self.flush()
        return sid

    async def response(self, sid: int) -> Response:
        got = self.responses[sid]
        while not got.done:
            chunk = await self.peer.chunk()
            assert chunk, f"the proxy closed the connection ({self.terminated})"
            for event in self.conn.receive_data(chunk):
                self._event(event)
            self.flush()
        return got

    def _event(self, event: h2.events.Event) -> None:
        sid = getattr(event, "stream_id", 0)
        got = self.responses.get(sid, Response())
        if isinstance(event, h2.events.ResponseReceived):
            got.headers = dict(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            got.body += event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
        elif isinstance(event, h2.events.TrailersReceived):
            got.trailers = dict(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            got.done = True
        elif isinstance(event, h2.events.StreamReset):
            got.reset = event.error_code
            got.done = True
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.terminated = event
            for pending in self.responses.values():
                pending.done = True

    async def unary(self, payload: bytes, path: str = UNARY) -> Response:
        return await self.response(self.request(grpc_headers(path), message(payload)))


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture
async def proxied(tmp_path) -> AsyncIterator[tuple[str, object]]:
    """A frame-relay proxy in front of the recorder plugin: (listen path, plugin)."""
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    proxy = await start_proxy(listen, upstream, "--relay", "frames")
    yield listen, plugin
    await proxy.stop(0)
    await server.stop(0)


async def expect_connection_error(peer: Peer, code: int) -> Frame:
    """GOAWAY with ``code`` (RFC 9113 §5.4.1), then the proxy closes the connection."""
    got = await peer.reaction()
    assert got.type == GOAWAY, f"expected GOAWAY, got {got}; frames: {peer.log}"
    assert got.code == code, f"GOAWAY code {got.code}, expected {code}: {got.payload[8:]!r}"
    await peer.closed()
    return got


async def expect_stream_error(peer: Peer, sid: int, code: int) -> None:
    """RST_STREAM on ``sid`` with ``code`` (RFC 9113 §5.4.2); the connection goes on."""
    got = await peer.reaction()
    assert got.type == RST_STREAM, f"expected RST_STREAM, got {got}; frames: {peer.log}"
    assert (got.stream, got.code) == (sid, code), got
    await peer.alive()


# == CO side: the proxy as HTTP/2 server ===================================================


async def test_baseline_unary_call_by_hand(proxied):
    listen, plugin = proxied
    async with connect(listen) as peer:
        client = H2Client(peer)
        got = await client.unary(b"hello")
    assert got.reset is None
    assert got.headers[b":status"] == b"200"
    assert got.headers[b"content-type"].startswith(b"application/grpc")
    assert got.body == message(b"echo:hello")
    assert got.trailers[b"grpc-status"] == b"0"
    assert [s.requests for s in plugin.seen] == [[b"hello"]]


async def test_server_preface_is_settings_sent_before_the_client_says_anything(proxied):
    """RFC 9113 §3.4: the server preface is a SETTINGS frame, and may be sent at once."""
    listen, _ = proxied
    async with connect(listen) as peer:
        first = await peer.frame()  # nothing written yet
    assert first is not None and first.type == SETTINGS and not first.flags & ACK
    assert first.stream == 0
    values = first.settings
    assert values[MAX_CONCURRENT_STREAMS] == 1000
    assert values[INITIAL_WINDOW_SIZE] == 1 << 20
    assert values[MAX_HEADER_LIST_SIZE] == 65_536


async def test_settings_are_acknowledged_and_unknown_settings_ignored(proxied):
    """RFC 9113 §6.5.2: unsupported settings MUST be ignored; §6.5.3: SETTINGS is ACKed."""
    listen, _ = proxied
    async with connect(listen) as peer:
        unknown = settings_frame({0x99: 7, HEADER_TABLE_SIZE: 0, 0xFE03: 1})
        peer.send(PREFACE, unknown)
        ack = await peer.until(lambda f: (f.type == SETTINGS and f.flags & ACK) or is_error(f))
        assert ack.type == SETTINGS and ack.payload == b""
        await peer.alive()


async def test_an_invalid_client_preface_closes_the_connection(proxied):
    """RFC 9113 §3.4: an invalid preface is a connection error PROTOCOL_ERROR."""
    listen, plugin = proxied
    async with connect(listen) as peer:
        peer.send(b"PRI * HTTP/1.1\r\n\r\nSM\r\n\r\n", S)
        got = await peer.reaction()
        assert (got.type, got.code) == (GOAWAY, PROTOCOL_ERROR)
        await peer.closed()
    assert plugin.seen == []


async def test_headers_as_the_clients_first_frame_is_a_protocol_error(proxied):
    """RFC 9113 §3.4: the preface MUST be followed by SETTINGS; an invalid preface is a
    connection error PROTOCOL_ERROR, so the request in it is not processed (the relay
    as committed in 1691512 answered it with 415). The PING after it makes the reaction
    come at once even where HEADERS slip past the check."""
    listen, _ = proxied
    async with connect(listen) as peer:
        peer.send(PREFACE, headers(1, GET, end_stream=True))
        await asyncio.sleep(0.1)
        peer.send(ping())
        got = await peer.reaction()
        assert (got.type, got.code) == (GOAWAY, PROTOCOL_ERROR), got
        answered = [f for f in peer.log if f.type == HEADERS]
        assert answered == [], "the proxy answered a request sent before SETTINGS"
        assert got.last_stream == 0


# Each case: the bytes sent after the preface, and the code of the GOAWAY expected.
CONNECTION_ERRORS = [
    # §3.4: the preface is followed by SETTINGS.
    pytest.param(ping(), PROTOCOL_ERROR, id="9113-3.4-first-frame-PING"),
    pytest.param(SETTINGS_ACK, PROTOCOL_ERROR, id="9113-3.4-first-frame-SETTINGS-ACK"),
    pytest.param(window_update(0, 1), PROTOCOL_ERROR, id="9113-3.4-first-frame-WINDOW_UPDATE"),
    # §4.2: frames larger than SETTINGS_MAX_FRAME_SIZE (we leave it at 16384).
    pytest.param(S + OPEN1 + data(1, b"x" * 16_385), FRAME_SIZE_ERROR, id="9113-4.2-DATA-16385"),
    pytest.param(
        S + frame(HEADERS, END_HEADERS, 1, b"\x82" * 16_385),
        FRAME_SIZE_ERROR,
        id="9113-4.2-HEADERS-16385",
    ),
    # §5.1.1: client streams are odd and increasing.
    pytest.param(S + headers(2, GET, end_stream=True), PROTOCOL_ERROR, id="9113-5.1.1-even-id"),
    pytest.param(
        S + headers(5, GET, end_stream=True) + headers(3, GET, end_stream=True),
        PROTOCOL_ERROR,
        id="9113-5.1.1-decreasing-id",
    ),
    # §5.1: idle streams accept only HEADERS and PRIORITY.
    pytest.param(S + data(1, b"x"), PROTOCOL_ERROR, id="9113-5.1-DATA-on-idle"),
    pytest.param(S + rst_stream(1, CANCEL), PROTOCOL_ERROR, id="9113-5.1-RST_STREAM-on-idle"),
    pytest.param(S + window_update(1, 1), PROTOCOL_ERROR, id="9113-5.1-WINDOW_UPDATE-on-idle"),
    pytest.param(
        S + OPEN1 + window_update(3, 1), PROTOCOL_ERROR, id="9113-5.1-WINDOW_UPDATE-on-idle-3"
    ),
    # §4.3, §6.2, §6.10: a header block is HEADERS then CONTINUATION only, same stream.
    pytest.param(
        S + frame(HEADERS, 0, 1, b"\x83") + frame(PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10"),
        PROTOCOL_ERROR,
        id="9113-6.10-PRIORITY-inside-header-block",
    ),
    pytest.param(
        S + frame(HEADERS, 0, 1, b"\x83") + frame(PRIORITY, 0, 3, b"\x00\x00\x00\x00\x10"),
        PROTOCOL_ERROR,
        id="9113-6.10-other-stream-PRIORITY-inside-header-block",
    ),
    pytest.param(
        S + frame(HEADERS, 0, 1, b"\x83") + data(1, b"x"),
        PROTOCOL_ERROR,
        id="9113-6.10-DATA-inside-header-block",
    ),
    pytest.param(
        S + frame(HEADERS, 0, 1, b"\x83") + headers(3, GET),
        PROTOCOL_ERROR,
        id="9113-6.10-other-streams-HEADERS-inside-header-block",
    ),
    pytest.param(
        S + frame(HEADERS, 0, 1, b"\x83") + frame(0xFA, 0, 0, b"unknown"),
        PROTOCOL_ERROR,
        id="9113-6.10-unknown-frame-type-inside-header-block",
    ),
    pytest.param(
        S + frame(HEADERS, 0, 1, b"\x83") + ping(),
        PROTOCOL_ERROR,
        id="9113-6.10-PING-inside-header-block",
    ),
    pytest.param(
        S + frame(HEADERS, 0, 1, b"\x83") + frame(CONTINUATION, END_HEADERS, 3, b"\x86"),
        PROTOCOL_ERROR,
        id="9113-6.10-CONTINUATION-on-another-stream",
    ),
    pytest.param(
        S + frame(CONTINUATION, END_HEADERS, 1, b"\x82"),
        PROTOCOL_ERROR,
        id="9113-6.10-CONTINUATION-without-HEADERS",
    ),
    pytest.param(
        S + OPEN1 + frame(CONTINUATION, END_HEADERS, 1, b"\x82"),
        PROTOCOL_ERROR,
        id="9113-6.10-CONTINUATION-after-END_HEADERS",
    ),
    # §6.1: padding that does not fit.
    pytest.param(
        S + OPEN1 + frame(DATA, PADDED, 1, b"\x05abc"),
        PROTOCOL_ERROR,
        id="9113-6.1-padding-longer-than-DATA",
    ),
    # Fixed-length frames (§6.4, §6.5, §6.7, §6.8, §6.9).
    pytest.param(S + frame(PING, 0, 0, b"1234567"), FRAME_SIZE_ERROR, id="9113-6.7-PING-7"),
    pytest.param(S + frame(PING, 0, 0, b"123456789"), FRAME_SIZE_ERROR, id="9113-6.7-PING-9"),
    pytest.param(
        S + OPEN1 + frame(RST_STREAM, 0, 1, b"\x00\x00\x08"),
        FRAME_SIZE_ERROR,
        id="9113-6.4-RST_STREAM-3",
    ),
    pytest.param(
        S + OPEN1 + frame(RST_STREAM, 0, 1, b"\x00\x00\x00\x08\x00"),
        FRAME_SIZE_ERROR,
        id="9113-6.4-RST_STREAM-5",
    ),
    pytest.param(
        S + frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"),
        FRAME_SIZE_ERROR,
        id="9113-6.9-WINDOW_UPDATE-3",
    ),
    pytest.param(
        S + OPEN1 + frame(WINDOW_UPDATE, 0, 1, b"\x00\x00\x00\x01\x00"),
        FRAME_SIZE_ERROR,
        id="9113-6.9-WINDOW_UPDATE-5-on-stream",
    ),
    pytest.param(
        frame(SETTINGS, 0, 0, b"\x00\x04\x00\x01\x00"),
        FRAME_SIZE_ERROR,
        id="9113-6.5-SETTINGS-length-not-multiple-of-6",
    ),
    pytest.param(
        S + frame(SETTINGS, ACK, 0, b"\x00\x04\x00\x01\x00\x00"),
        FRAME_SIZE_ERROR,
        id="9113-6.5-SETTINGS-ACK-with-payload",
    ),
    pytest.param(
        S + frame(GOAWAY, 0, 0, b"\x00\x00\x00\x00\x00\x00\x00"),
        FRAME_SIZE_ERROR,
        id="9113-6.8-GOAWAY-7",
    ),
    # Stream 0 (§6.1-§6.4, §6.10 must not be on it; §6.5, §6.7, §6.8 must be).
    pytest.param(S + data(0, b"x"), PROTOCOL_ERROR, id="9113-6.1-DATA-on-stream-0"),
    pytest.param(S + headers(0, GET), PROTOCOL_ERROR, id="9113-6.2-HEADERS-on-stream-0"),
    pytest.param(
        S + frame(PRIORITY, 0, 0, b"\x00\x00\x00\x01\x10"),
        PROTOCOL_ERROR,
        id="9113-6.3-PRIORITY-on-stream-0",
    ),
    pytest.param(S + rst_stream(0, CANCEL), PROTOCOL_ERROR, id="9113-6.4-RST_STREAM-on-stream-0"),
    pytest.param(
        S + frame(CONTINUATION, END_HEADERS, 0, b"\x82"),
        PROTOCOL_ERROR,
        id="9113-6.10-CONTINUATION-on-stream-0",
    ),
    pytest.param(S + frame(SETTINGS, 0, 1, b""), PROTOCOL_ERROR, id="9113-6.5-SETTINGS-on-1"),
    pytest.param(S + frame(PING, 0, 1, b"12345678"), PROTOCOL_ERROR, id="9113-6.7-PING-on-1"),
    pytest.param(S + frame(GOAWAY, 0, 1, bytes(8)), PROTOCOL_ERROR, id="9113-6.8-GOAWAY-on-1"),
    # Flow control (§6.9, §6.9.1, §6.9.2).
    pytest.param(S + window_update(0, 0), PROTOCOL_ERROR, id="9113-6.9-WINDOW_UPDATE-0-conn"),
    pytest.param(
        S + window_update(0, MAX_WINDOW),
        FLOW_CONTROL_ERROR,
        id="9113-6.9.1-connection-window-over-2^31-1",
    ),
    pytest.param(
        settings_frame({INITIAL_WINDOW_SIZE: 2**31}),
        FLOW_CONTROL_ERROR,
        id="9113-6.5.2-INITIAL_WINDOW_SIZE-2^31",
    ),
    pytest.param(
        S
        + OPEN1
        + window_update(1, MAX_WINDOW - DEFAULT_WINDOW)
        + settings_frame({INITIAL_WINDOW_SIZE: DEFAULT_WINDOW + 1}),
        FLOW_CONTROL_ERROR,
        id="9113-6.9.2-INITIAL_WINDOW_SIZE-overflows-an-open-stream",
    ),
    # SETTINGS values (§6.5.2).
    pytest.param(settings_frame({ENABLE_PUSH: 2}), PROTOCOL_ERROR, id="9113-6.5.2-ENABLE_PUSH-2"),
    pytest.param(
        settings_frame({MAX_FRAME_SIZE: 16_383}),
        PROTOCOL_ERROR,
        id="9113-6.5.2-MAX_FRAME_SIZE-16383",
    ),
    pytest.param(
        settings_frame({MAX_FRAME_SIZE: 2**24}),
        PROTOCOL_ERROR,
        id="9113-6.5.2-MAX_FRAME_SIZE-2^24",
    ),
    # §8.4: a client cannot push.
    pytest.param(
        S + OPEN1 + frame(PUSH_PROMISE, END_HEADERS, 1, b"\x00\x00\x00\x02\x82\x86\x84"),
        PROTOCOL_ERROR,
        id="9113-8.4-PUSH_PROMISE-from-client",
    ),
    # HPACK (RFC 7541) errors are connection errors COMPRESSION_ERROR (RFC 9113 §4.3).
    pytest.param(
        S + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\xbe"),
        COMPRESSION_ERROR,
        id="7541-2.3.3-index-62-with-empty-dynamic-table",
    ),
    pytest.param(
        S + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x00\x01x\x01y\xc5"),
        COMPRESSION_ERROR,
        id="7541-2.3.3-index-69-after-a-literal",
    ),
    pytest.param(
        S + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x80"),
        COMPRESSION_ERROR,
        id="7541-6.1-index-0",
    ),
    pytest.param(
        S + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x83\x86\x84\x20"),
        COMPRESSION_ERROR,
        id="7541-4.2-table-size-update-not-at-start",
    ),
    pytest.param(
        S + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x3f\xe2\x1f"),
        COMPRESSION_ERROR,
        id="7541-6.3-table-size-update-over-4096",
    ),
    pytest.param(
        S + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x83\xff"),
        COMPRESSION_ERROR,
        id="7541-5.1-truncated-integer",
    ),
    pytest.param(
        S + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x00\x01x\x81\xff"),
        COMPRESSION_ERROR,
        id="7541-5.2-huffman-padding-over-7-bits",
    ),
]


@pytest.mark.parametrize(("sent", "code"), CONNECTION_ERRORS)
async def test_connection_errors_from_the_co(proxied, sent, code):
    listen, plugin = proxied
    async with connect(listen) as peer:
        peer.send(PREFACE, sent)
        await expect_connection_error(peer, code)
    assert plugin.seen == []


# Each case: bytes sent after preface and SETTINGS, then the stream and code of the
# RST_STREAM expected; a PING is answered afterwards (the connection goes on).
STREAM_ERRORS = [
    pytest.param(
        OPEN1 + frame(PRIORITY, 0, 1, b"\x00\x00\x00\x03"),
        1,
        FRAME_SIZE_ERROR,
        id="9113-6.3-PRIORITY-4",
    ),
    pytest.param(
        OPEN1 + frame(PRIORITY, 0, 1, b"\x00\x00\x00\x03\x10\x00"),
        1,
        FRAME_SIZE_ERROR,
        id="9113-6.3-PRIORITY-6",
    ),
    pytest.param(
        OPEN1 + frame(PRIORITY, 0, 1, b"\x00\x00\x00\x01\x10"),
        1,
        PROTOCOL_ERROR,
        id="9113-5.3.1-PRIORITY-self-dependent",
    ),
    pytest.param(
        frame(
            HEADERS,
            END_HEADERS | PRIORITY_FLAG,
            1,
            b"\x00\x00\x00\x01\x10" + hpackcodec.encode(PLAIN_POST),
        ),
        1,
        PROTOCOL_ERROR,
        id="9113-5.3.1-HEADERS-self-dependent",
    ),
    pytest.param(OPEN1 + window_update(1, 0), 1, PROTOCOL_ERROR, id="9113-6.9-WINDOW_UPDATE-0"),
    pytest.param(
        OPEN1 + window_update(1, MAX_WINDOW),
        1,
        FLOW_CONTROL_ERROR,
        id="9113-6.9.1-stream-window-over-2^31-1",
    ),
    # §5.1: a half-closed (remote) stream takes no more DATA. HANG keeps the call open.
    pytest.param(
        headers(1, grpc_headers(HANG), end_stream=True) + data(1, message(b"late")),
        1,
        STREAM_CLOSED,
        id="9113-5.1-DATA-after-END_STREAM",
    ),
    pytest.param(
        headers(1, grpc_headers(HANG), end_stream=True) + headers(1, [(b"x-late", b"1")]),
        1,
        STREAM_CLOSED,
        id="9113-5.1-HEADERS-after-END_STREAM",
    ),
]


@pytest.mark.parametrize(("sent", "sid", "code"), STREAM_ERRORS)
async def test_stream_errors_from_the_co(proxied, sent, sid, code):
    listen, plugin = proxied
    async with connect(listen) as peer:
        peer.send(PREFACE, S, sent)
        await expect_stream_error(peer, sid, code)
    assert plugin.seen == []


async def test_priority_on_an_idle_stream_is_allowed(proxied):
    """RFC 9113 §5.1: PRIORITY may be sent on a stream in any state, idle included."""
    listen, _ = proxied
    async with connect(listen) as peer:
        peer.send(PREFACE, S, frame(PRIORITY, 0, 7, b"\x00\x00\x00\x00\x10"))
        await peer.alive()
        assert not any(is_error(f) for f in peer.log)


# RFC 9113 §8.2-8.3: malformed requests are stream errors PROTOCOL_ERROR (§8.1.1).
def _replace(name: bytes, value: bytes | None) -> list[Header]:
    """The gRPC request with ``name`` set to ``value`` (None: removed)."""
    return [(n, value if n == name else v) for n, v in grpc_headers() if n != name or value]


MALFORMED = [
    pytest.param([*grpc_headers(), (b"X-Upper", b"1")], id="9113-8.2.1-uppercase-name"),
    pytest.param([*grpc_headers(), (b"x\x01bad", b"1")], id="9113-8.2.1-control-char-in-name"),
    pytest.param([*grpc_headers(), (b"x-bad", b"a\r\nb")], id="9113-8.2.1-CRLF-in-value"),
    pytest.param([*grpc_headers(), (b"x-bad", b"a\x00b")], id="9113-8.2.1-NUL-in-value"),
    pytest.param([*grpc_headers(), (b"connection", b"keep-alive")], id="9113-8.2.2-connection"),
    pytest.param(
        [*grpc_headers(), (b"transfer-encoding", b"chunked")], id="9113-8.2.2-transfer-encoding"
    ),
    pytest.param([*grpc_headers(), (b"upgrade", b"h2c")], id="9113-8.2.2-upgrade"),
    pytest.param(_replace(b"te", b"gzip"), id="9113-8.2.2-te-gzip"),
    pytest.param([(b":foo", b"bar"), *grpc_headers()], id="9113-8.3-unknown-pseudo-header"),
    pytest.param([(b":status", b"200"), *grpc_headers()], id="9113-8.3-status-in-request"),
    pytest.param(
        [*_replace(b":authority", None), (b":authority", b"localhost")],
        id="9113-8.3-pseudo-after-regular",
    ),
    pytest.param([(b":path", UNARY.encode()), *grpc_headers()], id="9113-8.3.1-duplicate-path"),
    pytest.param(_replace(b":method", None), id="9113-8.3.1-missing-method"),
    pytest.param(
        [(n, b"" if n == b":method" else v) for n, v in grpc_headers()],
        id="9113-8.3.1-empty-method",
    ),
    pytest.param(_replace(b":scheme", None), id="9113-8.3.1-missing-scheme"),
    pytest.param(_replace(b":path", None), id="9113-8.3.1-missing-path"),
    pytest.param(
        [(n, b"" if n == b":path" else v) for n, v in grpc_headers()], id="9113-8.3.1-empty-path"
    ),
    pytest.param(
        [*grpc_headers(), (b"content-length", b"99")], id="9113-8.1.1-content-length-too-big"
    ),
    pytest.param(
        [*grpc_headers(), (b"content-length", b"3")], id="9113-8.1.1-content-length-too-small"
    ),
    pytest.param(
        [*grpc_headers(), (b"content-length", b"abc")], id="9113-8.1.1-content-length-not-a-number"
    ),
    pytest.param(
        [*grpc_headers(), (b"content-length", b"1")],
        id="9113-8.1.1-content-length-but-END_STREAM-on-HEADERS",
    ),
]


@pytest.mark.parametrize("fields", MALFORMED)
async def test_malformed_requests_are_reset_and_never_reach_the_plugin(proxied, fields):
    listen, plugin = proxied
    body = b"" if (b"content-length", b"1") in fields else message(b"malformed")
    async with connect(listen) as peer:
        client = H2Client(peer, strict=False)
        bad = await client.response(client.request(fields, body))
        assert bad.reset == PROTOCOL_ERROR, bad
        assert bad.headers == {}  # reset, not answered
        # The connection goes on: a valid call on it works.
        good = await client.unary(b"after")
        assert client.terminated is None
    assert good.body == message(b"echo:after")
    assert good.trailers[b"grpc-status"] == b"0"
    assert [s.requests for s in plugin.seen] == [[b"after"]]


async def test_a_request_that_is_not_grpc_gets_415_from_the_proxy(proxied):
    listen, plugin = proxied
    async with connect(listen) as peer:
        client = H2Client(peer)
        got = await client.response(client.request(GET))
        post = await client.response(
            client.request([*PLAIN_POST, (b"content-type", b"text/plain")], b"hello")
        )
    for response in (got, post):
        assert response.reset is None
        assert response.headers[b":status"] == b"415"
        assert b"gRPC" in response.body
    assert plugin.seen == []


def _send_data(peer: Peer, sid: int, size: int) -> None:
    """``size`` bytes of DATA on ``sid`` as one gRPC message, in frames of 16384."""
    payload = message(b"m" * (size - 5))
    for start in range(0, size, 16_384):
        peer.send(data(sid, payload[start : start + 16_384]))


async def test_data_beyond_the_stream_window_is_a_stream_error(tmp_path):
    """RFC 9113 §6.9.1: a receiver MAY treat overrunning a stream window as a stream error
    FLOW_CONTROL_ERROR. No plugin listens: the request waits for one and is never credited.
    """
    listen = str(tmp_path / "proxy.sock")
    proxy = await start_proxy(listen, str(tmp_path / "absent.sock"), "--relay", "frames")
    try:
        async with connect(listen) as peer:
            peer.send(PREFACE, S, headers(1, grpc_headers()))
            window = (await peer.frame()).settings[INITIAL_WINDOW_SIZE]
            _send_data(peer, 1, window)
            peer.send(data(1, b"x"))
            await expect_stream_error(peer, 1, FLOW_CONTROL_ERROR)
    finally:
        await proxy.stop(0)


async def test_data_beyond_the_connection_window_is_a_connection_error(tmp_path):
    """RFC 9113 §6.9.1: DATA past the connection window we granted: GOAWAY
    FLOW_CONTROL_ERROR. Streams are filled to their own window, then one byte more."""
    listen = str(tmp_path / "proxy.sock")
    proxy = await start_proxy(listen, str(tmp_path / "absent.sock"), "--relay", "frames")
    try:
        async with connect(listen) as peer:
            peer.send(PREFACE, S)
            settings = await peer.frame()
            growth = await peer.frame()
            assert settings is not None and growth is not None
            assert (growth.type, growth.stream) == (WINDOW_UPDATE, 0)
            stream_window = settings.settings[INITIAL_WINDOW_SIZE]
            granted = DEFAULT_WINDOW + int.from_bytes(growth.payload, "big")
            sid = 1
            while granted:
                size = min(granted, stream_window)
                peer.send(headers(sid, grpc_headers()))
                _send_data(peer, sid, size)
                granted -= size
                sid += 2
            peer.send(headers(sid, grpc_headers()), data(sid, b"x"))
            got = await peer.reaction()
            assert (got.type, got.code) == (GOAWAY, FLOW_CONTROL_ERROR), got
            assert not [f for f in peer.log if f.type == WINDOW_UPDATE and f is not growth]
    finally:
        await proxy.stop(0)


# == plugin side: the proxy as HTTP/2 client ===============================================


class PluginConn(Peer):
    """A connection accepted by the fake plugin."""

    def __init__(self, plugin: FakePlugin) -> None:
        super().__init__()
        self.plugin = plugin
        self.preface = b""
        self.decoder = hpack.Decoder()
        self.paths: list[bytes] = []  # of the requests read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.plugin.accepted(self)

    @property
    def from_relay(self) -> bool:
        """The proxy's Upstream also dials the plugin (a grpc channel that watches it); the
        relay's connections are the ones that carry the test's calls."""
        return any(path.startswith(ECHO.encode()) for path in self.paths)

    async def request(self) -> tuple[int, dict[bytes, bytes], bytes] | None:
        """The next whole request (HEADERS, DATA to END_STREAM), or None at the end."""
        sid, fields, body = 0, {}, b""
        while True:
            got = await self.frame(timeout=None)
            if got is None:
                return None
            if got.type == HEADERS and not sid:
                assert got.flags & END_HEADERS, "the relay sends whole header blocks"
                sid = got.stream
                fields = dict(self.decoder.decode(got.payload, raw=True))
                self.paths.append(fields.get(b":path", b""))
            elif got.type == DATA and got.stream == sid:
                body += got.payload
            else:
                continue
            if got.flags & END_STREAM:
                return sid, fields, body


Script = Callable[["FakePlugin", PluginConn], Awaitable[None]]


class FakePlugin:
    """A raw HTTP/2 server on a UNIX socket that runs ``script`` on each connection, then
    records what it is sent until the connection closes."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.conns: list[PluginConn] = []
        self.requests = 0
        self.errors: list[BaseException] = []
        self.notes: dict[str, float] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.AbstractServer | None = None

    async def start(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_unix_server(lambda: PluginConn(self), path)

    def accepted(self, conn: PluginConn) -> None:
        self.conns.append(conn)
        task = asyncio.get_running_loop().create_task(self._run(conn))
        self.tasks.add(task)

    async def _run(self, conn: PluginConn) -> None:
        try:
            conn.preface = await conn.read_exactly(len(PREFACE), None)
            await self.script(self, conn)
            while await conn.frame(timeout=None) is not None:
                pass
        except Exception as exc:  # reported by the test through self.errors
            self.errors.append(exc)
        finally:
            conn.close()

    def relay_conns(self) -> list[PluginConn]:
        return [conn for conn in self.conns if conn.from_relay]

    async def sent_to_plugin(self, match: Callable[[Frame], bool]) -> Frame:
        """The first frame any relay connection received that matches (waits for it)."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            for conn in self.relay_conns():
                for got in conn.log:
                    if match(got):
                        return got
            if time.monotonic() > deadline:
                logs = [conn.log for conn in self.conns]
                raise AssertionError(f"not sent to the plugin; frames: {logs}")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for conn in self.conns:  # the scripts read the end of their connection and end
            conn.close()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=TIMEOUT)
        assert self.errors == []


def ok_response(sid: int, body: bytes) -> bytes:
    return (
        headers(sid, OK_HEADERS)
        + data(sid, message(b"echo:" + body[5:]))
        + headers(sid, OK_TRAILERS, end_stream=True)
    )


async def answer_all(plugin: FakePlugin, conn: PluginConn) -> None:
    """An echo answer to each request, to the end of the connection."""
    while (got := await conn.request()) is not None:
        plugin.requests += 1
        sid, _, body = got
        conn.send(ok_response(sid, body))


async def serve(plugin: FakePlugin, conn: PluginConn) -> None:
    """A well-behaved plugin: SETTINGS, then an echo answer to each request."""
    conn.send(S)
    await answer_all(plugin, conn)


def answering(reply: Callable[[FakePlugin, int, bytes], bytes], *, first: bytes = S) -> Script:
    """A plugin that sends ``first``, then ``reply(plugin, stream, body)`` to each request."""

    async def script(plugin: FakePlugin, conn: PluginConn) -> None:
        conn.send(first)
        while (got := await conn.request()) is not None:
            plugin.requests += 1
            sid, _, body = got
            conn.send(reply(plugin, sid, body))

    return script


@pytest.fixture
async def behind(tmp_path) -> AsyncIterator[Callable[[Script], Awaitable[tuple[FakePlugin, str]]]]:
    """Starts a FakePlugin with a script and the proxy in front: returns (plugin, listen)."""
    started: list[tuple[object, FakePlugin]] = []
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")

    async def start(script: Script) -> tuple[FakePlugin, str]:
        plugin = FakePlugin(script)
        await plugin.start(upstream)
        # No readiness probe: its GetPluginInfo calls would reach the plugin too.
        proxy = await start_proxy(listen, upstream, "--relay", "frames", "--readiness-probe", "off")
        started.append((proxy, plugin))
        return plugin, listen

    yield start
    for proxy, plugin in started:
        await proxy.stop(0)  # type: ignore[attr-defined]
        await plugin.stop()


async def call_through(listen: str, payload: bytes = b"hi") -> bytes:
    async with channel(listen) as ch:
        return await ch.unary_unary(UNARY)(payload, timeout=TIMEOUT)


async def failed_call(listen: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call_through(listen)
    return err.value


async def test_plugin_baseline_and_the_proxys_client_preface(behind):
    """RFC 9113 §3.4: the client preface is the magic string then SETTINGS; the proxy
    disables push (§6.5.2, §8.4) and sends it without waiting for the server."""
    plugin, listen = await behind(serve)
    assert await call_through(listen, b"abc") == b"echo:abc"
    (conn,) = plugin.relay_conns()
    assert conn.preface == PREFACE
    first = conn.log[0]
    assert first.type == SETTINGS and not first.flags & ACK
    assert first.settings == {
        ENABLE_PUSH: 0,
        INITIAL_WINDOW_SIZE: 1 << 20,
        MAX_HEADER_LIST_SIZE: 65_536,
    }
    # The relay acknowledges the plugin's SETTINGS.
    assert any(f.type == SETTINGS and f.flags & ACK for f in conn.log)


def _push_promise(plugin: FakePlugin, sid: int, body: bytes) -> bytes:
    promised = (2).to_bytes(4, "big") + hpackcodec.encode(GET)
    return frame(PUSH_PROMISE, END_HEADERS, sid, promised)


def _data_first(plugin: FakePlugin, sid: int, body: bytes) -> bytes:
    return data(sid, message(b"too early"))


def _uppercase(plugin: FakePlugin, sid: int, body: bytes) -> bytes:
    return headers(sid, [*OK_HEADERS, (b"X-Upper", b"1")])


def _oversized(plugin: FakePlugin, sid: int, body: bytes) -> bytes:
    return headers(sid, OK_HEADERS) + data(sid, b"\x00" * 16_385)


def _on_stream(other: int) -> Callable[[FakePlugin, int, bytes], bytes]:
    def reply(plugin: FakePlugin, sid: int, body: bytes) -> bytes:
        return headers(other, OK_HEADERS)

    return reply


def _status_in_trailers(plugin: FakePlugin, sid: int, body: bytes) -> bytes:
    trailers = [(b":status", b"200"), (b"grpc-status", b"0")]
    return headers(sid, OK_HEADERS) + headers(sid, trailers, end_stream=True)


# Each case: the plugin's reply to the request, what the proxy sends the plugin (GOAWAY or
# RST_STREAM, and the code), the caller's status, and a word its details must contain.
PLUGIN_ERRORS = [
    pytest.param(
        _push_promise,
        GOAWAY,
        PROTOCOL_ERROR,
        grpc.StatusCode.UNAVAILABLE,
        "PUSH_PROMISE",
        id="9113-8.4-PUSH_PROMISE-with-push-disabled",
    ),
    pytest.param(
        _data_first,
        RST_STREAM,
        PROTOCOL_ERROR,
        grpc.StatusCode.INTERNAL,
        "DATA before",
        id="9113-8.1-DATA-before-response-HEADERS",
    ),
    pytest.param(
        _uppercase,
        RST_STREAM,
        PROTOCOL_ERROR,
        grpc.StatusCode.INTERNAL,
        "X-Upper",
        id="9113-8.2.1-uppercase-response-header",
    ),
    pytest.param(
        _status_in_trailers,
        RST_STREAM,
        PROTOCOL_ERROR,
        grpc.StatusCode.INTERNAL,
        ":status",
        id="9113-8.1-pseudo-header-in-trailers",
    ),
    pytest.param(
        _oversized,
        GOAWAY,
        FRAME_SIZE_ERROR,
        grpc.StatusCode.UNAVAILABLE,
        "16385",
        id="9113-4.2-DATA-16385-from-plugin",
    ),
    pytest.param(
        _on_stream(2),
        GOAWAY,
        PROTOCOL_ERROR,
        grpc.StatusCode.UNAVAILABLE,
        "stream 2",
        id="9113-5.1.1-HEADERS-on-even-stream-2",
    ),
    pytest.param(
        _on_stream(99),
        GOAWAY,
        PROTOCOL_ERROR,
        grpc.StatusCode.UNAVAILABLE,
        "stream 99",
        id="9113-5.1-HEADERS-on-unopened-stream-99",
    ),
]


@pytest.mark.parametrize(("reply", "ftype", "code", "status", "word"), PLUGIN_ERRORS)
async def test_plugin_errors(behind, reply, ftype, code, status, word):
    plugin, listen = await behind(answering(reply))
    err = await failed_call(listen)
    assert err.code() == status, err
    assert word in (err.details() or ""), err.details()
    got = await plugin.sent_to_plugin(is_error)
    assert (got.type, got.code) == (ftype, code), got
    if ftype == RST_STREAM:
        assert got.stream == 1
    else:
        assert got.last_stream == 0  # the proxy accepts no streams from the plugin


@pytest.mark.parametrize(
    ("code", "status"),
    [
        pytest.param(CANCEL, grpc.StatusCode.CANCELLED, id="9113-8.7-CANCEL"),
        pytest.param(REFUSED_STREAM, grpc.StatusCode.UNAVAILABLE, id="9113-8.7-REFUSED_STREAM"),
    ],
)
async def test_plugin_resets_the_stream(behind, code, status):
    plugin, listen = await behind(answering(lambda plugin, sid, body: rst_stream(sid, code)))
    err = await failed_call(listen)
    assert err.code() == status, err
    # §5.4.2: no RST_STREAM in answer to a RST_STREAM (nor a GOAWAY: the connection is fine).
    await asyncio.sleep(0.1)
    assert plugin.relay_conns()
    assert not [f for conn in plugin.relay_conns() for f in conn.log if is_error(f)]


async def test_plugin_reset_reaches_the_co_with_its_code(behind):
    _, listen = await behind(answering(lambda plugin, sid, body: rst_stream(sid, CANCEL)))
    async with connect(listen) as peer:
        got = await H2Client(peer).unary(b"x")
    assert got.reset == CANCEL


def _goaway_first(plugin: FakePlugin, sid: int, body: bytes) -> bytes:
    if plugin.requests == 1:
        return goaway(0, NO_ERROR)  # stream 1 was not processed (RFC 9113 §6.8)
    return ok_response(sid, body)


async def test_plugin_goaway_before_answering_refuses_the_call_to_the_co(behind):
    """RFC 9113 §6.8, §8.7: a stream above GOAWAY's last stream id was not processed; the
    proxy tells the CO with RST_STREAM REFUSED_STREAM, which clients may retry."""
    plugin, listen = await behind(answering(_goaway_first))
    async with connect(listen) as peer:
        client = H2Client(peer)
        got = await client.unary(b"x")
        assert got.reset == REFUSED_STREAM, got
        # Retried on the same CO connection, the call goes to a new plugin connection.
        again = await client.unary(b"y")
        # The connection that went away is closed once nothing runs on it (not kept open
        # for as long as the CO stays).
        first = plugin.relay_conns()[0]
        await wait_until(lambda: first.eof, TIMEOUT)
    assert again.body == message(b"echo:y")
    assert len(plugin.relay_conns()) == 2


async def test_plugin_goaway_before_answering_as_a_grpc_caller_sees_it(behind):
    """What a grpc caller makes of the REFUSED_STREAM: grpc-core 1.85 does not retry it
    (UNAVAILABLE naming error code 7); a client that retries it transparently reaches the
    plugin's second connection and succeeds. Either way the plugin answered no call twice
    and the caller never hangs or sees another code."""
    plugin, listen = await behind(answering(_goaway_first))
    try:
        answer = await call_through(listen, b"z")
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err
        assert "RST_STREAM" in (err.details() or "") and "7" in (err.details() or "")
        assert plugin.requests == 1
    else:
        assert answer == b"echo:z"
        assert plugin.requests == 2


def _first(first: bytes) -> Script:
    async def script(plugin: FakePlugin, conn: PluginConn) -> None:
        conn.send(first)
        await serve(plugin, conn)

    return script


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(ping(), id="9113-3.4-PING"),
        pytest.param(window_update(0, 1), id="9113-3.4-WINDOW_UPDATE"),
        pytest.param(SETTINGS_ACK, id="9113-3.4-SETTINGS-ACK"),
    ],
)
async def test_plugins_first_frame_must_be_settings(behind, first):
    plugin, listen = await behind(_first(first))
    err = await failed_call(listen)
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    assert "SETTINGS" in (err.details() or "")
    got = await plugin.sent_to_plugin(is_error)
    assert (got.type, got.code) == (GOAWAY, PROTOCOL_ERROR), got


async def _headers_first(plugin: FakePlugin, conn: PluginConn) -> None:
    """Answers without ever sending SETTINGS: its first frame is a Trailers-Only response
    (NOT_FOUND), then a PING so that the proxy reacts at once whatever it does."""
    while (got := await conn.request()) is not None:
        plugin.requests += 1
        trailers_only = [*OK_HEADERS, (b"grpc-status", b"5"), (b"grpc-message", b"plugin")]
        conn.send(headers(got[0], trailers_only, end_stream=True), ping())


async def test_plugins_first_frame_headers_is_a_protocol_error(behind):
    """RFC 9113 §3.4: the server preface is SETTINGS; anything else is PROTOCOL_ERROR, so
    a response in place of the preface is not relayed (the relay as committed in 1691512
    relayed it: the caller got NOT_FOUND)."""
    plugin, listen = await behind(_headers_first)
    err = await failed_call(listen)
    got = await plugin.sent_to_plugin(is_error)  # the PING at least is refused
    assert (got.type, got.code) == (GOAWAY, PROTOCOL_ERROR), got
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err


async def _late_settings(plugin: FakePlugin, conn: PluginConn) -> None:
    """Reads the first request before saying anything, then waits to 1 s to send SETTINGS."""
    got = await conn.request()
    if got is None:  # the proxy's readiness channel, which sends no call
        return
    plugin.notes["request read after"] = time.monotonic() - conn.opened
    await asyncio.sleep(1.0 - (time.monotonic() - conn.opened))
    conn.send(S)
    plugin.requests += 1
    conn.send(ok_response(got[0], got[2]))
    await answer_all(plugin, conn)


async def test_a_plugin_slow_with_its_settings_delays_neither_preface_nor_call(behind):
    """RFC 9113 §3.4: an endpoint need not wait for the peer's preface before sending its
    own; the CO gets the proxy's SETTINGS at once, and the call is sent before the
    plugin's SETTINGS arrive and served after them."""
    plugin, listen = await behind(_late_settings)
    async with connect(listen) as peer:
        first = await peer.frame()
        assert first is not None and first.type == SETTINGS
        assert first.at - peer.opened < 0.5
        started = time.monotonic()
        got = await H2Client(peer).unary(b"late")
        took = time.monotonic() - started
    assert got.body == message(b"echo:late")
    assert got.trailers[b"grpc-status"] == b"0"
    assert took >= 0.5  # the plugin's delay was real
    assert len(plugin.relay_conns()) == 1
    # The whole request reached the plugin before it sent anything.
    assert plugin.notes["request read after"] < 0.5


# == both sides: what the relay must carry through ==========================================

# GetPluginInfoResponse{name: "example.com", vendor_version: "1"}: a call the stages judge.
PLUGIN_INFO = b"\n\x0bexample.com\x12\x011"


@pytest.mark.parametrize(
    "path", [UNARY, "/csi.v1.Identity/GetPluginInfo"], ids=["passthrough", "through-stages"]
)
async def test_7541_6_2_3_never_indexed_fields_stay_never_indexed(behind, path):
    """RFC 7541 §6.2.3: a field sent as never indexed (a token, say) must be sent on with
    the same representation by an intermediary: in the request to the plugin, including
    fields the relay rewrites (:authority, grpc-timeout) and call metadata the stages
    handle, and in the answer to the CO."""
    received: list[list[Header]] = []  # the request blocks the plugin decoded

    async def plugin_script(plugin: FakePlugin, conn: PluginConn) -> None:
        conn.send(S)
        while (got := await conn.frame(timeout=None)) is not None:
            if got.type == HEADERS:
                fields = conn.decoder.decode(got.payload, raw=True)
                if (b":path", path.encode()) in fields:
                    received.append(fields)
            if got.flags & END_STREAM and got.type in (HEADERS, DATA):
                trailers = [*OK_TRAILERS, hpackcodec.NeverIndexed(b"x-session", b"s3ssion")]
                conn.send(
                    headers(got.stream, OK_HEADERS)
                    + data(got.stream, message(PLUGIN_INFO))
                    + headers(got.stream, trailers, end_stream=True)
                )

    never = hpackcodec.NeverIndexed
    request = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode()),
        never(b":authority", b"node-1.example"),  # rewritten to the plugin's: localhost
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        never(b"grpc-timeout", b"5S"),  # rewritten to the time left
        never(b"authorization", b"Bearer t0ken"),
        (b"x-request-id", b"r-1"),
        never(b"x-secret-bin", b"AAEC"),
    ]
    _, listen = await behind(plugin_script)
    answer: list[Header] = []
    async with connect(listen) as peer:
        decoder = hpack.Decoder()
        peer.send(PREFACE, S, headers(1, request), data(1, message(b""), end_stream=True))
        while not answer:
            got = await peer.until(lambda f: f.type in (HEADERS, GOAWAY, RST_STREAM))
            assert got.type == HEADERS, got
            fields = decoder.decode(got.payload, raw=True)
            if got.flags & END_STREAM:
                answer = fields

    (sent,) = received
    marked = {bytes(f[0]) for f in sent if isinstance(f, hpack.NeverIndexedHeaderTuple)}
    assert marked == {b":authority", b"grpc-timeout", b"authorization", b"x-secret-bin"}
    assert dict(sent)[b":authority"] == b"localhost"
    assert dict(sent)[b"authorization"] == b"Bearer t0ken"
    assert dict(sent)[b"x-request-id"] == b"r-1"
    assert [f for f in answer if isinstance(f, hpack.NeverIndexedHeaderTuple)] == [
        (b"x-session", b"s3ssion")
    ]
    assert dict(answer)[b"grpc-status"] == b"0"
