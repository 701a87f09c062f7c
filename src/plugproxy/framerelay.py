"""The HTTP/2 frame relay: plugproxy's forwarder for plaintext sockets (unix://, tcp://).

Each CO connection is paired with a connection of its own to the plugin. Frames are parsed
but not terminated, so one relayed call costs a few frame copies instead of a gRPC server
call plus a gRPC client call (docs/performance.md has the measurements):

- Header blocks are decoded (HPACK keeps one table per direction) to learn the method,
  metadata, deadline and status, and re-encoded without a dynamic table
  (:mod:`plugproxy.hpackcodec`). Stream ids are mapped, so a call may wait in its stage
  chain (serialization, capability queries) or be answered by the proxy while later calls
  overtake it.
- Message bytes (DATA) are never re-encoded; unknown fields and unknown methods pass as
  they are. Status, message, details, headers and trailers pass unchanged; the deadline
  travels as the CO sent it, minus any time the call waited in the proxy.
- Flow control toward the plugin is the relay's own: it credits the CO as bytes move on
  (or are held, bounded by --max-message-bytes) and paces what it sends by the plugin's
  windows. Responses flow back under the CO's own windows, end to end.
- Response and finish hooks only observe, so they run once the plugin's bytes read in the
  same batch are written to the CO: logging and judging a 1 MB page do not delay it.
- A plugin that cannot be reached, a lost plugin connection and shutdown are answered with
  UNAVAILABLE naming the upstream; GOAWAY then makes the CO reconnect, which retries the
  plugin.

The gRPC-level forwarder (:mod:`plugproxy.proxy`) stays for TLS endpoints, where grpc owns
the handshake and the identity checks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from plugproxy import hpackcodec
from plugproxy.api import Call, LazyMessage, Metadata, MetadataValue, MethodInfo, Reject
from plugproxy.endpoints import Endpoint
from plugproxy.log import Logger
from plugproxy.pipeline import Chain, compile_chain
from plugproxy.registry import Registry
from plugproxy.upstream import Upstream

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

SETTINGS_HEADER_TABLE_SIZE, SETTINGS_INITIAL_WINDOW_SIZE = 0x1, 0x4
DEFAULT_WINDOW = 65535
MAX_FRAME = 16384  # every peer accepts frames this large (RFC 9113 §4.2)
LISTEN_BACKLOG = 1024

NO_ERROR, PROTOCOL_ERROR, CANCEL_CODE, REFUSED_STREAM = 0x0, 0x1, 0x8, 0x7
COMPRESSION_ERROR = 0x9

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
    CANCEL_CODE: grpc.StatusCode.CANCELLED,
    REFUSED_STREAM: grpc.StatusCode.UNAVAILABLE,
    0x3: grpc.StatusCode.RESOURCE_EXHAUSTED,  # FLOW_CONTROL_ERROR
    0xB: grpc.StatusCode.RESOURCE_EXHAUSTED,  # ENHANCE_YOUR_CALM
    0xC: grpc.StatusCode.PERMISSION_DENIED,  # INADEQUATE_SECURITY
}
STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}

FrameHandler = Callable[[int, int, int, bytes], None]  # (type, flags, stream, payload)
HeadersHandler = Callable[[int, int, bytes], None]  # (stream, flags of HEADERS, whole block)

TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return (
        bytes((size >> 16, (size >> 8) & 0xFF, size & 0xFF, ftype, flags))
        + stream.to_bytes(4, "big")
        + payload
    )


def header_frames(stream: int, block: bytes, end_stream: bool) -> bytes:
    """HEADERS plus CONTINUATION frames carrying ``block``."""
    first = block[:MAX_FRAME]
    rest = block[MAX_FRAME:]
    flags = (END_STREAM if end_stream else 0) | (0 if rest else END_HEADERS)
    out = [frame(HEADERS, flags, stream, first)]
    while rest:
        chunk, rest = rest[:MAX_FRAME], rest[MAX_FRAME:]
        out.append(frame(CONTINUATION, 0 if rest else END_HEADERS, stream, chunk))
    return b"".join(out)


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, increment.to_bytes(4, "big"))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, code.to_bytes(4, "big"))


def goaway(last_stream: int, code: int = NO_ERROR, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, last_stream.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


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


def metadata_bytes(name: str, value: MetadataValue) -> bytes:
    if isinstance(value, bytes):
        if name.endswith("-bin"):
            return base64.b64encode(value).rstrip(b"=")
        return value
    return value.encode("latin-1", errors="replace")


def to_metadata(headers: Sequence[hpackcodec.Header], reserved: frozenset[bytes]) -> Metadata:
    return tuple(
        (name.decode("latin-1"), metadata_value(name, value))
        for name, value in headers
        if name[:1] != b":" and name not in reserved
    )


class MessageTooLarge(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class Messages:
    """Splits one direction of a stream into gRPC messages (1-byte flag, 4-byte length).

    Always checks sizes against the limit; keeps message bytes only when ``collect``.
    """

    __slots__ = ("body", "collect", "compressed", "count", "filled", "head", "limit", "need")

    def __init__(self, limit: int, collect: bool) -> None:
        self.limit = limit
        self.collect = collect
        self.head = bytearray()
        self.body = bytearray()  # sized once per message: appending would keep reallocating
        self.filled = 0
        self.need = -1  # -1: reading a prefix; else body bytes still to come
        self.compressed = False
        self.count = 0  # whole messages seen

    def feed(self, data: bytes) -> list[tuple[bool, bytes]]:
        out: list[tuple[bool, bytes]] = []
        pos, size = 0, len(data)
        view = memoryview(data)
        while pos < size:
            if self.need < 0:
                take = min(5 - len(self.head), size - pos)
                self.head += view[pos : pos + take]
                pos += take
                if len(self.head) < 5:
                    break
                length = int.from_bytes(self.head[1:5], "big")
                if length > self.limit:
                    raise MessageTooLarge(length)
                self.compressed = self.head[0] == 1
                self.head.clear()
                if self.collect and length and pos + length <= size:
                    out.append((self.compressed, data[pos : pos + length]))  # whole in one piece
                    pos += length
                    self.count += 1
                    continue
                self.need = length
                if length:
                    if self.collect:
                        self.body = bytearray(length)
                        self.filled = 0
                    continue
            else:
                take = min(self.need, size - pos)
                if self.collect:
                    self.body[self.filled : self.filled + take] = view[pos : pos + take]
                    self.filled += take
                pos += take
                self.need -= take
                if self.need:
                    continue
            self.need = -1
            self.count += 1
            if self.collect:
                out.append((self.compressed, bytes(self.body)))
                self.body = bytearray()
                self.filled = 0
        return out


def message_frame(compressed: bool, body: bytes) -> bytes:
    return (b"\x01" if compressed else b"\x00") + len(body).to_bytes(4, "big") + body


class FrameReader:
    """Splits one direction's bytes into frames and joins HEADERS with its CONTINUATIONs."""

    __slots__ = ("block", "buffer")

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.block: tuple[int, int, bytearray] | None = None  # HEADERS awaiting CONTINUATION

    def feed(self, data: bytes, on_frame: FrameHandler, on_headers: HeadersHandler) -> str:
        """Hand each whole frame on; returns "" or why the byte stream is not HTTP/2."""
        buf = self.buffer
        buf += data
        pos, size, error = 0, len(buf), ""
        view = memoryview(buf)  # one copy per payload; released before the buffer shrinks
        while size - pos >= 9:
            end = pos + 9 + ((buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2])
            if end > size:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            payload = bytes(view[pos + 9 : end])
            pos = end
            if ftype == HEADERS:
                fragment = _header_fragment(flags, payload)
                if flags & END_HEADERS:
                    on_headers(sid, flags, fragment)
                else:
                    self.block = (sid, flags, bytearray(fragment))
            elif ftype == CONTINUATION:
                if self.block is None or self.block[0] != sid:
                    error = "CONTINUATION without HEADERS"
                    break
                self.block[2].extend(payload)
                if flags & END_HEADERS:
                    first_sid, first_flags, joined = self.block
                    self.block = None
                    on_headers(first_sid, first_flags, bytes(joined))
            else:
                on_frame(ftype, flags, sid, payload)
        view.release()
        del buf[:pos]
        return error


@dataclass(frozen=True, slots=True)
class Route:
    info: MethodInfo
    chain: Chain | None


class Stream:
    """One call on a paired connection: its ids, stage state and flow-control state."""

    __slots__ = (
        "call",
        "co_ended",
        "credited_ahead",
        "down_id",
        "finished",
        "headers",
        "held",
        "owed",
        "pending",
        "pending_window",
        "requests",
        "response_headers_seen",
        "responses",
        "route",
        "started",
        "task",
        "up_id",
        "up_window",
    )

    def __init__(self, down_id: int, route: Route, headers: list[hpackcodec.Header]) -> None:
        self.down_id = down_id
        self.route = route
        self.headers = headers
        self.call: Call | None = None
        self.up_id = 0  # 0 until the call is sent to the plugin
        self.up_window = 0
        self.held: list[tuple[bool, bytes]] | None = None  # messages waiting for on_start
        self.pending: list[tuple[bytes, bool]] = []  # bytes waiting for the plugin's window
        self.pending_window = 0  # response credit the CO gave before the plugin saw the call
        self.credited_ahead = 0  # stream credit given to the CO before its bytes went on
        self.owed = 0  # stream credit held back while too much waits for the plugin
        self.requests: Messages | None = None
        self.responses: Messages | None = None
        self.co_ended = False
        self.response_headers_seen = False
        self.finished = False  # the CO got (or is getting) its final status
        self.started = False  # on_start was begun (it may still be running in ``task``)
        self.task: asyncio.Task[None] | None = None


class FrameRelay:
    """Accepts CO connections and pairs each with a connection to the plugin."""

    def __init__(
        self,
        registry: Registry,
        upstream: Upstream,
        stages: Sequence[Any],
        logger: Logger,
        *,
        max_message_bytes: int,
        max_concurrent_calls: int,
    ) -> None:
        self.registry = registry
        self.upstream = upstream
        self.logger = logger
        self.max_message_bytes = max_message_bytes
        self.max_concurrent_calls = max_concurrent_calls
        self.routes: dict[bytes, Route] = {
            info.path.encode(): Route(info, compile_chain(stages, info, logger))
            for info in registry.methods()
        }
        self.authority = b"localhost" if upstream.endpoint.is_unix else None
        self.pairings: set[Pairing] = set()
        self.active = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None

    def route(self, path: bytes) -> Route:
        route = self.routes.get(path)
        if route is None:
            # Unknown paths are not cached: random paths from a CO must not grow memory.
            route = Route(self.registry.lookup(path.decode("utf-8", "replace")), None)
        return route

    async def listen(self, endpoint: Endpoint, socket_mode: int = 0o660) -> int:
        """Bind and accept; a UNIX socket is created with ``socket_mode``, never wider."""
        loop = asyncio.get_running_loop()
        if endpoint.is_unix:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o777 & ~socket_mode)
            try:
                sock.bind(endpoint.path)
            except OSError:
                sock.close()
                raise
            finally:
                os.umask(old)
            sock.listen(LISTEN_BACKLOG)
            self._server = await loop.create_unix_server(lambda: Pairing(self), sock=sock)
            return 0
        self._server = await loop.create_server(
            lambda: Pairing(self), endpoint.host, endpoint.port, reuse_address=True
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def connect_upstream(self, pairing: Pairing) -> asyncio.Transport:
        loop = asyncio.get_running_loop()
        endpoint = self.upstream.endpoint
        if endpoint.is_unix:
            transport, _ = await loop.create_unix_connection(
                lambda: PluginSide(pairing), endpoint.path
            )
        else:
            transport, _ = await loop.create_connection(
                lambda: PluginSide(pairing), endpoint.host, endpoint.port
            )
        return transport

    def unavailable(self, why: str) -> str:
        return self.upstream.unavailable_details(why)

    def call_started(self) -> None:
        self.active += 1
        self._idle.clear()

    def call_ended(self) -> None:
        self.active -= 1
        if self.active <= 0:
            self._idle.set()

    async def stop(self, grace: float) -> None:
        """Stop accepting, let calls in flight finish for ``grace`` seconds, then end them."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        for pairing in list(self.pairings):
            pairing.drain()
        if self.active > 0 and grace > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        for pairing in list(self.pairings):
            pairing.abort("plugproxy is shutting down")
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)


class PluginSide(asyncio.Protocol):
    """The plugin's end of a pairing; hands everything to the pairing."""

    def __init__(self, pairing: Pairing) -> None:
        self.pairing = pairing

    def data_received(self, data: bytes) -> None:
        self.pairing.plugin_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.pairing.plugin_lost()


class Pairing(asyncio.Protocol):
    """One CO connection and its own connection to the plugin."""

    def __init__(self, relay: FrameRelay) -> None:
        self.relay = relay
        self.down: asyncio.Transport | None = None
        self.up: asyncio.Transport | None = None
        self.local = False  # True: the plugin could not be reached; the relay answers
        self.local_reason = ""
        self.peer = ""
        self.co_frames = FrameReader()
        self.plugin_frames = FrameReader()
        self.preface_seen = False
        self.request_decoder = hpackcodec.new_decoder()
        self.response_decoder = hpackcodec.new_decoder()
        self.streams: dict[int, Stream] = {}
        self.up_streams: dict[int, Stream] = {}
        self.last_down_id = 0
        self.next_up_id = 1
        self.up_window = DEFAULT_WINDOW  # the plugin's connection window for our DATA
        self.up_initial_window = DEFAULT_WINDOW
        self.blocked: list[Stream] = []
        self.co_credit = 0
        self.to_co: list[bytes] = []
        # Response and finish hooks of the plugin bytes being read: they only observe, so
        # they run after those bytes are written to the CO (plugin_data), not before.
        self.observers: list[tuple[Chain, Call, LazyMessage | None]] = []
        self.reading_plugin = False
        self.to_plugin: list[bytes] = []
        self.connecting: asyncio.Task[None] | None = None
        self.goaway_sent = False
        self.closing = False
        self.closed = False

    # -- connection life ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.down = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = f"ipv4:{peer[0]}:{peer[1]}"
        else:
            self.peer = f"unix:{peer or transport.get_extra_info('sockname') or ''}"
        self.relay.pairings.add(self)
        if self.relay.draining:
            transport.close()
            return
        transport.pause_reading()  # until the plugin's side is known
        # Kept: the loop holds tasks only weakly.
        self.connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        try:
            up = await self.relay.connect_upstream(self)
        except OSError as exc:
            why = exc.strerror or str(exc) or type(exc).__name__
            self.local = True
            self.local_reason = self.relay.unavailable(why)
            self.to_co.append(frame(SETTINGS, 0, 0))  # our server preface
        else:
            if self.closed:
                up.close()
                return
            self.up = up
        if self.down is not None and not self.closed:
            self.down.resume_reading()
            self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        """The CO went away: its calls are cancelled, the plugin connection closed."""
        self.closed = True
        self.relay.pairings.discard(self)
        for stream in list(self.streams.values()):
            self._cancelled(stream, "the CO closed the connection")
        if self.up is not None:
            self.up.close()

    def plugin_lost(self) -> None:
        """The plugin's connection closed: calls in flight get UNAVAILABLE, the CO reconnects."""
        if self.closed:
            return
        why = self.relay.unavailable("the plugin closed the connection")
        for stream in list(self.streams.values()):
            if stream.up_id:
                self._answer(stream, grpc.StatusCode.UNAVAILABLE, why)
        self.up = None
        self.local = True
        self.local_reason = why
        self.drain()
        self.flush()

    def drain(self) -> None:
        """GOAWAY to the CO: calls it started go on; it opens a new connection for new ones."""
        if not self.goaway_sent and self.down is not None:
            self.goaway_sent = True
            self.to_co.append(goaway(self.last_down_id))
        self._close_if_idle()
        self.flush()

    def abort(self, why: str) -> None:
        for stream in list(self.streams.values()):
            self._answer(stream, grpc.StatusCode.UNAVAILABLE, why)
        self.flush()
        self._close()

    def _close_if_idle(self) -> None:
        if self.goaway_sent and not self.streams and not self.closing:
            self.closing = True  # a moment for the GOAWAY and last frames to leave
            asyncio.get_running_loop().call_later(0.05, self._close)

    def _close(self) -> None:
        self.flush()
        if self.down is not None:
            self.down.close()
        if self.up is not None:
            self.up.close()

    def flush(self) -> None:
        if self.co_credit:
            self.to_co.append(window_update(0, self.co_credit))
            self.co_credit = 0
        if self.to_co:
            if self.down is not None and not self.down.is_closing():
                self.down.writelines(self.to_co)
            self.to_co = []
        if self.to_plugin:
            if self.up is None and not self.local and not self.closed:
                return  # still connecting: sent once the plugin's side is there
            if self.up is not None and not self.up.is_closing():
                self.up.writelines(self.to_plugin)
            self.to_plugin = []

    # -- frames from the CO -------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if not self.preface_seen:
            buf = self.co_frames.buffer
            buf += data
            data = b""
            if len(buf) < len(PREFACE):
                return
            if buf[: len(PREFACE)] != PREFACE:
                self.relay.logger.warning("not an HTTP/2 client; closing", peer=self.peer)
                self._close()
                return
            del buf[: len(PREFACE)]
            self.preface_seen = True
            if not self.local:
                self.to_plugin.append(PREFACE)
        error = self.co_frames.feed(data, self._co_frame, self._co_headers)
        if error:
            self._protocol_error(error)
        self.flush()

    def _co_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == DATA:
            self._co_data(sid, flags, payload)
        elif ftype == WINDOW_UPDATE:
            self._co_window_update(sid, payload)
        elif ftype == RST_STREAM:
            stream = self.streams.get(sid)
            if stream is not None:
                if stream.up_id and not stream.finished:
                    self.to_plugin.append(rst_stream(stream.up_id, _u32(payload)))
                self._cancelled(stream, "cancelled by the caller")
        elif ftype == SETTINGS:
            if not flags & ACK:
                table = _setting(payload, SETTINGS_HEADER_TABLE_SIZE)
                if table is not None:  # bounds the plugin's encoder, whose blocks we decode
                    self.response_decoder.max_allowed_table_size = table
            if self.local:
                if not flags & ACK:
                    self.to_co.append(frame(SETTINGS, ACK, 0))
            else:
                self.to_plugin.append(frame(SETTINGS, flags, 0, payload))
        elif ftype == PING:
            if self.local:
                if not flags & ACK:
                    self.to_co.append(frame(PING, ACK, 0, payload))
            else:
                self.to_plugin.append(frame(PING, flags, 0, payload))
        elif ftype == GOAWAY:
            if not self.local:
                self.to_plugin.append(frame(GOAWAY, flags, 0, payload))
        elif ftype == PUSH_PROMISE:
            self._protocol_error("PUSH_PROMISE from a client")
        # PRIORITY and unknown frame types are dropped (RFC 9113 §5.5: ignore unknown).

    def _co_window_update(self, sid: int, payload: bytes) -> None:
        # Responses flow end to end: the CO's credit is the plugin's to spend.
        increment = _u32(payload) & 0x7FFFFFFF
        if sid == 0:
            if not self.local:
                self.to_plugin.append(window_update(0, increment))
            return
        stream = self.streams.get(sid)
        if stream is None or stream.finished:
            return
        if stream.up_id:
            self.to_plugin.append(window_update(stream.up_id, increment))
        else:
            stream.pending_window += increment

    def _co_headers(self, sid: int, flags: int, block: bytes) -> None:
        try:
            headers = hpackcodec.decode(self.request_decoder, block)
        except hpackcodec.DecodeError:
            self._protocol_error("undecodable header block", COMPRESSION_ERROR)
            return
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the CO: gRPC clients send none; pass them on
            if flags & END_STREAM:
                stream.co_ended = True
            if stream.up_id:
                self.to_plugin.append(
                    header_frames(
                        stream.up_id, hpackcodec.encode(headers), bool(flags & END_STREAM)
                    )
                )
            return
        if sid % 2 == 0 or sid <= self.last_down_id:
            return  # a stream already closed
        self.last_down_id = sid
        if self.goaway_sent:
            self.to_co.append(rst_stream(sid, REFUSED_STREAM))  # the CO retries it elsewhere
            return
        self._new_stream(sid, headers, bool(flags & END_STREAM))

    def _new_stream(self, sid: int, headers: list[hpackcodec.Header], ended: bool) -> None:
        relay = self.relay
        path = b""
        timeout: float | None = None
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b"grpc-timeout":
                timeout = parse_timeout(value)
        route = relay.route(path)
        stream = Stream(sid, route, headers)
        self.streams[sid] = stream
        relay.call_started()
        stream.co_ended = ended
        limit = relay.max_message_bytes
        chain = route.chain
        # Unary answers are kept for on_finish hooks (metrics learns the driver name from one).
        stream.responses = Messages(
            limit,
            chain is not None and (bool(chain.response) or route.info.kind.unary_response),
        )
        if chain is not None:
            metadata: list[tuple[str, MetadataValue]] = []
            upstream_metadata: list[tuple[str, MetadataValue]] = []
            for name, value in headers:
                if name[:1] == b":":
                    continue
                item = (name.decode("latin-1"), metadata_value(name, value))
                metadata.append(item)
                if name not in TRANSPORT_HEADERS:
                    upstream_metadata.append(item)
            stream.call = Call(route.info, tuple(metadata), upstream_metadata, timeout, self.peer)
        if relay.active > relay.max_concurrent_calls:
            self._answer(
                stream,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"plugproxy: more than {relay.max_concurrent_calls} calls in flight "
                "(--max-concurrent-calls)",
            )
            return
        if chain is None:
            stream.requests = Messages(limit, False)
            self._send(stream)
            return
        kind = route.info.kind
        stream.requests = Messages(limit, kind.unary_request or bool(chain.request))
        stream.held = []
        if not kind.unary_request:
            self._start(stream)
        elif ended:  # no request message at all: the stages and the plugin see an empty one
            stream.held.append((False, b""))
            self._start(stream)

    def _co_data(self, sid: int, flags: int, payload: bytes) -> None:
        # The CO's connection window is credited as bytes arrive: what waits in the relay
        # is bounded per stream (below) and by --max-message-bytes.
        self.co_credit += len(payload)
        stream = self.streams.get(sid)
        if stream is None or stream.finished:
            return
        data = _data_payload(flags, payload)
        if flags & END_STREAM:
            stream.co_ended = True
        ended = stream.co_ended
        requests = stream.requests
        assert requests is not None
        try:
            messages = requests.feed(data)
        except MessageTooLarge as exc:
            self._answer(
                stream,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"plugproxy: request message of {exc.size} bytes exceeds --max-message-bytes "
                f"({self.relay.max_message_bytes})",
            )
            return
        if stream.held is not None:
            # Waiting for on_start: keep whole messages, and give the stream's window back at
            # once (up to one message's limit) so a request larger than the plugin's window
            # cannot stall its own start.
            self._credit_ahead(stream, len(payload))
            stream.held.extend(messages)
            if not stream.started and (stream.held or ended):
                if not stream.held:
                    stream.held.append((False, b""))
                self._start(stream)
            return
        if not requests.collect:
            if stream.call is not None:
                stream.call.request_count = requests.count
            self._queue(stream, data, ended)
            return
        # Request hooks judge whole messages before they are sent on, so the bytes of a message
        # still arriving are credited at once: one larger than the window must complete.
        self._credit_ahead(stream, len(payload))
        for index, (compressed, body) in enumerate(messages):
            if not self._judge_request(stream, compressed, body):
                return
            self._queue(
                stream, message_frame(compressed, body), ended and index == len(messages) - 1
            )
        if ended and not messages:
            self._queue(stream, b"", True)

    def _credit_ahead(self, stream: Stream, size: int) -> None:
        """Credit the CO for bytes the relay keeps, unless too much already waits on the plugin."""
        if not size or stream.co_ended:
            return
        if sum(len(data) for data, _ in stream.pending) > self.up_initial_window:
            stream.owed += size  # paid when the plugin has taken its share (_pay_owed)
            return
        self.to_co.append(window_update(stream.down_id, size))
        stream.credited_ahead += size

    def _pay_owed(self, stream: Stream) -> None:
        if (
            stream.owed
            and not stream.co_ended
            and sum(len(data) for data, _ in stream.pending) <= self.up_initial_window
        ):
            self.to_co.append(window_update(stream.down_id, stream.owed))
            stream.credited_ahead += stream.owed
            stream.owed = 0

    def _judge_request(self, stream: Stream, compressed: bool, body: bytes) -> bool:
        call, chain = stream.call, stream.route.chain
        if call is None or chain is None:
            return True
        call.request_count += 1
        if not chain.request:
            return True
        cls = None if compressed else call.method.request_class
        try:
            chain.run_request(call, LazyMessage(body, cls))
        except Reject as rej:
            call.rejected = True
            self._answer(stream, rej.code, rej.message)
            return False
        return True

    # -- stage chain --------------------------------------------------------------------

    def _start(self, stream: Stream) -> None:
        call, chain = stream.call, stream.route.chain
        assert call is not None and chain is not None
        stream.started = True
        if call.method.kind.unary_request and stream.held:
            compressed, body = stream.held[0]
            cls = None if compressed else call.method.request_class
            call.request = LazyMessage(body, cls)
            call.request_count = 1
        try:
            pending = chain.begin(call)
        except Reject as rej:
            call.rejected = True
            self._answer(stream, rej.code, rej.message)
            return
        if pending is None:
            self._started(stream)
        else:
            stream.task = asyncio.get_running_loop().create_task(self._start_async(stream, pending))

    async def _start_async(self, stream: Stream, pending: Awaitable[None]) -> None:
        call = stream.call
        assert call is not None
        try:
            await pending
        except Reject as rej:
            if not stream.finished:
                call.rejected = True
                self._answer(stream, rej.code, rej.message)
                self.flush()
            return
        stream.task = None
        if not stream.finished:
            self._started(stream)
            self.flush()

    def _started(self, stream: Stream) -> None:
        """on_start passed: send the call, then the messages that waited for it."""
        held = stream.held or []
        stream.held = None
        call = stream.call
        assert call is not None
        unary = call.method.kind.unary_request
        if not self._send(stream):
            return
        for index, (compressed, body) in enumerate(held):
            if (not unary or index > 0) and not self._judge_request(stream, compressed, body):
                return
            last = stream.co_ended and index == len(held) - 1
            self._queue(stream, message_frame(compressed, body), last)
        if stream.co_ended and not held:
            self._queue(stream, b"", True)

    # -- toward the plugin --------------------------------------------------------------

    def _send(self, stream: Stream) -> bool:
        """Open the call on the plugin's connection. False when it was answered instead."""
        if self.local or self.up is None:
            self._answer(stream, grpc.StatusCode.UNAVAILABLE, self.local_reason)
            self.drain()  # the CO reconnects, which tries the plugin again
            return False
        call = stream.call
        if call is not None and call.timeout is not None:
            remaining = call.remaining_timeout()
            if remaining is not None and remaining <= 0:
                self._answer(
                    stream,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "plugproxy: deadline expired before the call reached the plugin",
                )
                return False
        up_id = self.next_up_id
        self.next_up_id += 2
        stream.up_id = up_id
        stream.up_window = self.up_initial_window
        self.up_streams[up_id] = stream
        headers = self._upstream_headers(stream)
        only_headers = stream.co_ended and stream.held is None and stream.route.chain is None
        self.to_plugin.append(header_frames(up_id, hpackcodec.encode(headers), only_headers))
        if stream.pending_window:
            self.to_plugin.append(window_update(up_id, stream.pending_window))
            stream.pending_window = 0
        return True

    def _upstream_headers(self, stream: Stream) -> list[hpackcodec.Header]:
        authority = self.relay.authority
        call = stream.call
        out: list[hpackcodec.Header] = []
        for name, value in stream.headers:
            sent = value
            if name == b":authority" and authority is not None:
                sent = authority
            elif call is not None:
                if name == b"grpc-timeout":
                    remaining = call.remaining_timeout()
                    if remaining is not None:
                        sent = format_timeout(remaining)
                elif name[:1] != b":" and name not in TRANSPORT_HEADERS:
                    continue  # call metadata: sent below as the stages left it
            out.append((name, sent))
        if call is not None:
            for key, val in call.upstream_metadata:
                out.append((key.encode("latin-1"), metadata_bytes(key, val)))
        return out

    def _queue(self, stream: Stream, data: bytes, end: bool) -> None:
        if stream.pending:
            stream.pending.append((data, end))
            return
        rest = self._write(stream, data, end)
        if rest is not None:
            stream.pending.append((rest, end))
            self.blocked.append(stream)

    def _write(self, stream: Stream, data: bytes, end: bool) -> bytes | None:
        """Send what the plugin's windows allow; returns the part that must wait, if any."""
        while data:
            room = min(self.up_window, stream.up_window, MAX_FRAME)
            if room <= 0:
                return data
            chunk, data = data[:room], data[room:]
            last = end and not data
            self.to_plugin.append(frame(DATA, END_STREAM if last else 0, stream.up_id, chunk))
            self.up_window -= len(chunk)
            stream.up_window -= len(chunk)
            give = len(chunk)
            if stream.credited_ahead:
                ahead = min(give, stream.credited_ahead)
                stream.credited_ahead -= ahead
                give -= ahead
            if give and not stream.co_ended:  # the CO may send more on this stream
                self.to_co.append(window_update(stream.down_id, give))
            if last:
                return None
        if end:
            self.to_plugin.append(frame(DATA, END_STREAM, stream.up_id))
        return None

    def _pump(self) -> None:
        """The plugin opened its windows: send what waited, oldest stream first."""
        blocked, self.blocked = self.blocked, []
        for stream in blocked:
            if stream.finished:
                stream.pending.clear()
                continue
            while stream.pending:
                data, end = stream.pending[0]
                rest = self._write(stream, data, end)
                if rest is not None:
                    stream.pending[0] = (rest, end)
                    self.blocked.append(stream)
                    break
                stream.pending.pop(0)
            self._pay_owed(stream)

    # -- frames from the plugin ---------------------------------------------------------

    def plugin_data(self, data: bytes) -> None:
        self.reading_plugin = True
        try:
            error = self.plugin_frames.feed(data, self._plugin_frame, self._plugin_headers)
            if error:
                self._plugin_failed(f"{error} from the plugin")
            self.flush()
        finally:
            self.reading_plugin = False
            self._run_observers()

    def _run_observers(self) -> None:
        """Response hooks, then finish hooks, in the order the plugin's frames came."""
        observers, self.observers = self.observers, []
        if not observers:
            return
        logger = self.relay.logger
        logger.hold()
        try:
            for chain, call, message in observers:
                if message is not None:
                    chain.run_response(call, message)
                else:
                    chain.run_finish(call)
        finally:
            logger.release()

    def _plugin_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == DATA:
            self._plugin_data(sid, flags, payload)
        elif ftype == WINDOW_UPDATE:
            increment = _u32(payload) & 0x7FFFFFFF
            if sid == 0:
                self.up_window += increment
            else:
                stream = self.up_streams.get(sid)
                if stream is None:
                    return
                stream.up_window += increment
            if self.blocked:
                self._pump()
        elif ftype == RST_STREAM:
            stream = self.up_streams.get(sid)
            if stream is not None and not stream.finished:
                code = _u32(payload)
                self.to_co.append(rst_stream(stream.down_id, code))
                status = RST_STATUS.get(code, grpc.StatusCode.INTERNAL)
                self._ended(stream, status, f"the plugin reset the stream (HTTP/2 code {code})")
        elif ftype == SETTINGS:
            if not flags & ACK:
                table = _setting(payload, SETTINGS_HEADER_TABLE_SIZE)
                if table is not None:
                    self.request_decoder.max_allowed_table_size = table
                window = _setting(payload, SETTINGS_INITIAL_WINDOW_SIZE)
                if window is not None:
                    delta = window - self.up_initial_window
                    self.up_initial_window = window
                    for stream in self.up_streams.values():
                        stream.up_window += delta
                    if delta > 0 and self.blocked:
                        self._pump()
            self.to_co.append(frame(SETTINGS, flags, 0, payload))
        elif ftype == PING:
            self.to_co.append(frame(PING, flags, 0, payload))
        elif ftype == GOAWAY:
            self._plugin_goaway(payload)
        elif ftype == PUSH_PROMISE:
            self._plugin_failed("the plugin sent PUSH_PROMISE")

    def _plugin_data(self, sid: int, flags: int, payload: bytes) -> None:
        stream = self.up_streams.get(sid)
        if stream is None or stream.finished:
            if payload:  # dropped: keep the plugin's connection window moving
                self.to_plugin.append(window_update(0, len(payload)))
            return
        responses = stream.responses
        assert responses is not None
        try:
            messages = responses.feed(_data_payload(flags, payload))
        except MessageTooLarge as exc:
            if payload:
                self.to_plugin.append(window_update(0, len(payload)))
            self._answer(
                stream,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"plugproxy: plugin response message of {exc.size} bytes exceeds "
                f"--max-message-bytes ({self.relay.max_message_bytes})",
            )
            return
        self.to_co.append(frame(DATA, flags, stream.down_id, payload))
        call = stream.call
        if call is not None and not responses.collect:
            call.response_count = responses.count
        elif messages and call is not None:
            chain = stream.route.chain
            assert chain is not None
            cls = call.method.response_class
            for compressed, body in messages:
                call.response_count += 1
                lazy = LazyMessage(body, None if compressed else cls)
                if call.method.kind.unary_response:
                    call.response = lazy
                self.observers.append((chain, call, lazy))
        if flags & END_STREAM:  # gRPC always ends with trailers; a bare END_STREAM is an error
            self._ended(
                stream, grpc.StatusCode.INTERNAL, "the plugin ended the stream without status"
            )

    def _plugin_headers(self, sid: int, flags: int, block: bytes) -> None:
        try:
            headers = hpackcodec.decode(self.response_decoder, block)
        except hpackcodec.DecodeError:
            self._plugin_failed("undecodable header block from the plugin")
            return
        stream = self.up_streams.get(sid)
        if stream is None or stream.finished:
            return  # late: the CO already has its status (our blocks need no table sync)
        ended = bool(flags & END_STREAM)
        self.to_co.append(header_frames(stream.down_id, hpackcodec.encode(headers), ended))
        call = stream.call
        first = not stream.response_headers_seen
        stream.response_headers_seen = True
        if not ended:
            if call is not None:
                call.initial_metadata = to_metadata(headers, RESPONSE_RESERVED)
            return
        code = grpc.StatusCode.UNKNOWN
        message = ""
        for name, value in headers:
            if name == b"grpc-status":
                code = STATUS_BY_NUMBER.get(int(value) if value.isdigit() else -1, code)
            elif name == b"grpc-message":
                message = hpackcodec.percent_decode(value)
        if call is not None:
            call.trailing_metadata = to_metadata(headers, RESPONSE_RESERVED)
            if first:
                call.initial_metadata = ()
            if call.method.kind.unary_response and call.response_count == 0:
                call.response = None
        if not stream.co_ended:
            # The call is over; tell the CO to stop sending, as a gRPC server does.
            self.to_co.append(rst_stream(stream.down_id, NO_ERROR))
        self._ended(stream, code, message)

    def _plugin_goaway(self, payload: bytes) -> None:
        last_up = _u32(payload[:4]) & 0x7FFFFFFF
        code = _u32(payload[4:8])
        why = self.relay.unavailable(f"the plugin is going away (HTTP/2 code {code})")
        for stream in list(self.streams.values()):
            if stream.up_id > last_up:  # never processed by the plugin
                self._answer(stream, grpc.StatusCode.UNAVAILABLE, why)
        self.local = True
        self.local_reason = why
        self.drain()

    def _plugin_failed(self, what: str) -> None:
        self.relay.logger.warning("plugin connection failed", reason=what)
        why = self.relay.unavailable(what)
        for stream in list(self.streams.values()):
            self._answer(stream, grpc.StatusCode.UNAVAILABLE, why)
        if self.up is not None:
            self.up.close()

    def _protocol_error(self, what: str, code: int = PROTOCOL_ERROR) -> None:
        self.relay.logger.warning("HTTP/2 error from the CO; closing", reason=what, peer=self.peer)
        for stream in list(self.streams.values()):
            self._cancelled(stream, what)
        self.to_co.append(goaway(self.last_down_id, code, what.encode()))
        self._close()

    # -- ending calls -------------------------------------------------------------------

    def _answer(self, stream: Stream, code: grpc.StatusCode, message: str) -> None:
        """The relay gives the CO this status itself (rejects, limits, plugin unavailable)."""
        if stream.finished:
            return
        headers: list[hpackcodec.Header] = []
        if not stream.response_headers_seen:
            headers += [(b":status", b"200"), (b"content-type", b"application/grpc")]
        headers.append((b"grpc-status", str(code.value[0]).encode()))
        if message:
            headers.append((b"grpc-message", hpackcodec.percent_encode(message)))
        self.to_co.append(header_frames(stream.down_id, hpackcodec.encode(headers), True))
        if not stream.co_ended:
            self.to_co.append(rst_stream(stream.down_id, NO_ERROR))
        if stream.up_id:
            self.to_plugin.append(rst_stream(stream.up_id, CANCEL_CODE))
        if stream.task is not None and asyncio.current_task() is not stream.task:
            stream.task.cancel()
        self._ended(stream, code, message)

    def _cancelled(self, stream: Stream, why: str) -> None:
        if stream.task is not None:
            stream.task.cancel()
        self._ended(stream, grpc.StatusCode.CANCELLED, why)

    def _ended(self, stream: Stream, code: grpc.StatusCode, message: str) -> None:
        if stream.finished:
            return
        stream.finished = True
        stream.pending.clear()
        self.streams.pop(stream.down_id, None)
        if stream.up_id:
            self.up_streams.pop(stream.up_id, None)
        self.relay.call_ended()
        call = stream.call
        chain = stream.route.chain
        if call is not None and chain is not None:
            call.code, call.details = code, message
            if self.reading_plugin:  # after the response hooks queued before it
                self.observers.append((chain, call, None))
            else:
                chain.run_finish(call)
        if self.goaway_sent:
            self._close_if_idle()


def _u32(raw: bytes) -> int:
    return int.from_bytes(raw[:4], "big")


def _setting(payload: bytes, ident: int) -> int | None:
    value = None
    for pos in range(0, len(payload) - 5, 6):
        if int.from_bytes(payload[pos : pos + 2], "big") == ident:
            value = int.from_bytes(payload[pos + 2 : pos + 6], "big")
    return value


def _header_fragment(flags: int, payload: bytes) -> bytes:
    start, end = 0, len(payload)
    if flags & PADDED:
        start, end = 1, end - payload[0]
    if flags & PRIORITY_FLAG:
        start += 5
    return payload[start:end]


def _data_payload(flags: int, payload: bytes) -> bytes:
    if flags & PADDED:
        return payload[1 : len(payload) - payload[0]]
    return payload


__all__ = ["FrameRelay", "Pairing"]
