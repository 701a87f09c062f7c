"""One side of the relay: an HTTP/2 connection we terminate, as server (toward the CO) or as
client (toward the plugin).

Each connection has its own preface and SETTINGS, its own HPACK decoder, its own windows
and stream states; nothing connection-level crosses to the other side. This module owns
the rules that need that state (RFC 9113 §3.4, §5.1, §5.1.1, §5.1.2, §5.4, §6, §8.1-8.3);
:mod:`plugproxy.relay.frames` owns the rules a frame alone shows. A rule broken becomes
a connection error (GOAWAY, then the owner closes) or a stream error (RST_STREAM).

What happens on a connection reaches the owner (the pairing) through :class:`Events`:
``on_headers`` / ``on_data`` / ``on_reset`` per stream, ``on_sent`` when DATA we queued
has gone out (so the owner can credit the other side), ``on_goaway`` and ``on_failed``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from plugproxy.relay import hpackcodec
from plugproxy.relay.frames import (
    ACK,
    COMPRESSION_ERROR,
    DATA,
    ENABLE_PUSH,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    NO_ERROR,
    PING,
    PREFACE,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    SELF_DEPENDENT,
    SETTINGS,
    SETTINGS_ACK,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    ConnectionFault,
    FrameReader,
    StreamFault,
    frame,
    goaway,
    header_frames,
    rst_stream,
    settings_frame,
    settings_values,
    u32,
    window_update,
)
from plugproxy.relay.hpackcodec import Header
from plugproxy.relay.limits import (
    DEFAULT_WINDOW,
    MAX_MAX_FRAME,
    MAX_WINDOW,
    MIN_MAX_FRAME,
    Limits,
)

_DATA_ITEM, _FRAMES_ITEM = 0, 1
GOAWAY_GRACE = 1.0  # seconds a peer has to read our GOAWAY after a connection error (as Go)
# The longest a PING acknowledgement waits for other frames to go with it: far below any
# keepalive timeout, and below what a bandwidth estimate's round trip is read against.
PING_ACK_DELAY = 0.001


class StreamEnd:
    """A stream as one connection sees it: windows, half-closed states, queued output."""

    __slots__ = (
        "content_length",
        "head",
        "headers_received",
        "id",
        "local_closed",
        "owner",
        "pending",
        "recv_unacked",
        "recv_window",
        "remote_closed",
        "reset_after",
        "send_window",
    )

    def __init__(self, sid: int, send_window: int, recv_window: int) -> None:
        self.id = sid
        self.send_window = send_window  # what the peer lets us send
        self.recv_window = recv_window  # what we let the peer send
        self.recv_unacked = 0  # consumed, not yet credited back
        self.remote_closed = False  # the peer sent END_STREAM
        self.local_closed = False  # we sent END_STREAM (it left, not just queued)
        self.headers_received = False
        self.content_length = -1  # server side: what the request declared, if it did
        self.head: hpackcodec.RequestHead | None = None  # server side: the request's head
        self.pending: list[tuple[int, bytes, bool]] = []  # output held back by flow control
        self.reset_after = False  # send RST_STREAM(NO_ERROR) once our END_STREAM is out
        self.owner: Any = None  # the pairing's call state


class Events(Protocol):
    def on_headers(
        self, conn: H2Connection, end: StreamEnd, headers: list[Header], end_stream: bool
    ) -> None: ...

    def on_data(
        self, conn: H2Connection, end: StreamEnd, data: bytes, end_stream: bool
    ) -> None: ...

    def on_reset(
        self, conn: H2Connection, end: StreamEnd, code: int, reason: str, by_peer: bool
    ) -> None: ...

    def on_sent(self, conn: H2Connection, end: StreamEnd, size: int) -> None: ...

    def on_goaway(self, conn: H2Connection, last_stream: int, code: int) -> None: ...

    def on_failed(self, conn: H2Connection, code: int, reason: str) -> None: ...


class TokenBucket:
    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, burst: int, rate: float) -> None:
        self.burst, self.rate = burst, rate
        self.tokens = float(burst)
        self.last = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class H2Connection:
    """HTTP/2 state of one connection; frames out are collected in ``out`` for ``flush``."""

    def __init__(self, limits: Limits, events: Events, *, server: bool) -> None:
        self.limits = limits
        self.events = events
        self.server = server
        self.reader = FrameReader(limits, self._data, self._frame, self._block, self._stream_fault)
        self.decoder = hpackcodec.new_decoder(limits.max_header_list_size)
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.writable = True  # the transport's buffer is under its high-water mark
        self.queued_control = 0  # replies queued while not writable
        self.preface_pending = server  # a server first reads the client's preface
        self.settings_seen = False  # the peer's first frame must be SETTINGS (§3.4)
        self.failed = False
        self.streams: dict[int, StreamEnd] = {}
        self.blocked: dict[StreamEnd, None] = {}  # streams with output waiting for window
        self.reset_ids: dict[int, None] = {}  # streams we reset: their late frames are dropped
        self.last_peer_stream = 0  # server: highest stream id the client opened
        self.next_stream_id = 1  # client: the id our next stream takes
        self.goaway_sent = False
        self.goaway_received = False
        # The peer's settings, as they bound what we send.
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = MIN_MAX_FRAME
        self.peer_max_streams = 2**31  # unlimited until it says otherwise
        self.send_window = DEFAULT_WINDOW
        # What we let the peer send, connection-wide.
        self.recv_window = DEFAULT_WINDOW
        self.recv_unacked = 0
        self.stream_threshold = max(1, limits.stream_window // 4)
        self.connection_threshold = max(1, limits.connection_window // 4)
        self.resets = TokenBucket(limits.reset_burst, limits.reset_rate)
        self.timer: asyncio.TimerHandle | None = None
        # PING acknowledgements wait (at most PING_ACK_DELAY) for the next write on this
        # connection: gRPC peers ping with every message they receive (bandwidth
        # estimation), and an acknowledgement of its own is a write and a wakeup per call.
        self.ping_acks: list[bytes] = []
        self.ack_timer: asyncio.TimerHandle | None = None
        self.owner: Any = None  # whoever holds this connection (a PluginSide, for one)
        self._on_data = events.on_data
        self._on_sent = events.on_sent

    # -- life ---------------------------------------------------------------------------

    def start(self, transport: asyncio.Transport) -> None:
        """Send our preface at once: SETTINGS first (§3.4), then the connection window."""
        self.transport = transport
        limits = self.limits
        values = {
            MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
            INITIAL_WINDOW_SIZE: limits.stream_window,
            MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
        }
        if not self.server:
            values[ENABLE_PUSH] = 0
            del values[MAX_CONCURRENT_STREAMS]  # the plugin opens no streams toward us
        head = [] if self.server else [PREFACE]
        self.out[:0] = [*head, settings_frame(values)]
        growth = limits.connection_window - DEFAULT_WINDOW
        if growth > 0:
            self.out.append(window_update(0, growth))
            self.recv_window += growth
        # A peer that never completes its preface or a header block is cut off in time.
        self._arm_timer(limits.header_block_seconds)
        self.flush()

    def flush(self) -> None:
        if self.ping_acks:
            if self.out:
                self._take_acks()
            elif self.ack_timer is None:
                self.ack_timer = asyncio.get_running_loop().call_later(
                    PING_ACK_DELAY, self._acks_due
                )
        if self.out:
            transport = self.transport
            if transport is not None and not transport.is_closing():
                transport.writelines(self.out)
            self.out = []

    def set_writable(self, writable: bool) -> None:
        self.writable = writable
        if writable:
            self.queued_control = 0
            self._pump_all()
            self.flush()

    def close(self) -> None:
        """Write what is queued and close. After a connection error the peer gets a moment
        to read our GOAWAY, then the connection is cut whether it read it or not (a peer
        that never reads must not keep a descriptor and our unread replies)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.ping_acks:
            self._take_acks()
        self.flush()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()
            if self.failed:
                grace = 0.0 if not self.writable else GOAWAY_GRACE
                asyncio.get_running_loop().call_later(grace, transport.abort)
        # What the streams held goes now, not when the garbage collector finds the cycles.
        for end in self.streams.values():
            end.pending.clear()
            end.owner = None
        self.streams.clear()
        self.blocked.clear()
        self.reader.buffer.clear()
        self.reader.block = None

    # -- receiving ----------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        if self.failed:
            return
        try:
            if self.preface_pending:
                data = self._read_preface(data)
                if not data:
                    return
            self.reader.feed(data)
        except ConnectionFault as fault:
            self.fail(fault.code, fault.reason)

    def _read_preface(self, data: bytes) -> bytes:
        buf = self.reader.buffer
        buf += data
        if len(buf) < len(PREFACE):
            if not PREFACE.startswith(bytes(buf)):
                raise ConnectionFault(PROTOCOL_ERROR, "not an HTTP/2 client preface")
            return b""
        if buf[: len(PREFACE)] != PREFACE:
            raise ConnectionFault(PROTOCOL_ERROR, "not an HTTP/2 client preface")
        rest = bytes(buf[len(PREFACE) :])
        buf.clear()
        self.preface_pending = False
        return rest or b""

    def fail(self, code: int, reason: str) -> None:
        """A connection error: GOAWAY with ``code``; the owner ends the streams and closes."""
        if self.failed:
            return
        self.failed = True
        self.blocked.clear()
        last = self.last_peer_stream if self.server else 0
        self.out.append(goaway(last, code, reason.encode("utf-8", "replace")[:256]))
        self.events.on_failed(self, code, reason)

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if not self.settings_seen:
            if ftype != SETTINGS or flags & ACK:
                raise ConnectionFault(PROTOCOL_ERROR, "the first frame must be SETTINGS")
            self.settings_seen = True
            if not self.reader.block_open:
                self._disarm_timer()
        if ftype == WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif ftype == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
        elif ftype == PING:
            if not flags & ACK:
                self._count_control()
                self.ping_acks.append(frame(PING, ACK, 0, payload))
        elif ftype == RST_STREAM:
            self._rst_stream(sid, u32(payload))
        elif ftype == GOAWAY:
            self.goaway_received = True
            self.events.on_goaway(self, u32(payload) & 0x7FFFFFFF, u32(payload[4:8]))
        # PRIORITY: checked by the reader, then ignored (RFC 9113 §5.3.2 deprecates it).

    def _idle(self, sid: int) -> bool:
        """Not opened yet (RFC 9113 §5.1). Even ids are never opened here: no push."""
        if sid % 2 == 0:
            return True
        if self.server:
            return sid > self.last_peer_stream
        return sid >= self.next_stream_id

    def _data(self, sid: int, flags: int, data: bytes, length: int) -> None:
        if not self.settings_seen:
            raise ConnectionFault(PROTOCOL_ERROR, "the first frame must be SETTINGS")
        self.recv_window -= length
        if self.recv_window < 0:
            raise ConnectionFault(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        end = self.streams.get(sid)
        if end is None:
            if self._idle(sid):
                raise ConnectionFault(PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            self.credit(None, length)
            if sid in self.reset_ids:
                return
            raise StreamFault(sid, STREAM_CLOSED, "DATA on a closed stream")
        end.recv_window -= length
        if end.recv_window < 0:
            self.credit(None, length)
            raise StreamFault(sid, FLOW_CONTROL_ERROR, "DATA beyond the stream window")
        if end.remote_closed:
            self.credit(None, length)
            raise StreamFault(sid, STREAM_CLOSED, "DATA after END_STREAM")
        if not end.headers_received:
            raise StreamFault(sid, PROTOCOL_ERROR, "DATA before the response headers")
        if length != len(data):
            self.credit(end, length - len(data))  # padding is consumed on arrival
        ended = bool(flags & END_STREAM)
        if end.content_length >= 0:
            end.content_length -= len(data)
            if end.content_length < 0 or (ended and end.content_length):
                raise StreamFault(sid, PROTOCOL_ERROR, "DATA length differs from content-length")
        if ended:
            end.remote_closed = True
        self._on_data(self, end, data, ended)
        if ended and end.local_closed:
            self._forget(end)

    def _block(self, sid: int, flags: int, block: bytes) -> None:
        if not self.settings_seen:
            raise ConnectionFault(PROTOCOL_ERROR, "the first frame must be SETTINGS")
        try:
            headers = hpackcodec.decode(self.decoder, block)
        except hpackcodec.TooLarge:
            raise ConnectionFault(
                ENHANCE_YOUR_CALM, f"header list over {self.limits.max_header_list_size} bytes"
            ) from None
        except hpackcodec.DecodeError as exc:
            raise ConnectionFault(COMPRESSION_ERROR, f"HPACK: {exc}") from None
        if self.timer is not None:
            self._disarm_timer()
        if flags & SELF_DEPENDENT:
            raise StreamFault(sid, PROTOCOL_ERROR, "stream depends on itself")
        ended = bool(flags & END_STREAM)
        end = self.streams.get(sid)
        if end is None:
            if self.server and sid % 2 and sid > self.last_peer_stream:
                self._new_stream(sid, headers, ended)
                return
            if self._idle(sid):
                raise ConnectionFault(PROTOCOL_ERROR, f"HEADERS on stream {sid}, never opened")
            if sid in self.reset_ids:
                return
            if self.server:  # a new request must take a higher id (§5.1.1), as Go's server says
                raise ConnectionFault(PROTOCOL_ERROR, f"HEADERS on closed stream {sid}")
            raise StreamFault(sid, STREAM_CLOSED, "HEADERS on a closed stream")
        if end.remote_closed:
            raise StreamFault(sid, STREAM_CLOSED, "HEADERS after END_STREAM")
        if end.headers_received:
            if not ended:
                raise StreamFault(sid, PROTOCOL_ERROR, "second HEADERS without END_STREAM")
            problem = hpackcodec.response_problem(headers, trailers=True)
        else:
            problem = hpackcodec.response_problem(headers, trailers=False)
            if not problem and headers[0][1][:1] == b"1":
                if ended:
                    raise StreamFault(sid, PROTOCOL_ERROR, "informational response ends stream")
                return  # 1xx: informational, nothing to relay for gRPC
        if problem:
            raise StreamFault(sid, PROTOCOL_ERROR, f"malformed: {problem}")
        end.headers_received = True
        if ended:
            end.remote_closed = True
        self.events.on_headers(self, end, headers, ended)
        if ended and end.local_closed:
            self._forget(end)

    def _new_stream(self, sid: int, headers: list[Header], ended: bool) -> None:
        self.last_peer_stream = sid
        if self.goaway_sent:
            self._refuse(sid, REFUSED_STREAM)  # after our GOAWAY: the client retries elsewhere
            return
        if len(self.streams) >= self.limits.max_concurrent_streams:
            raise StreamFault(sid, REFUSED_STREAM, "over SETTINGSMAX_CONCURRENT_STREAMS")
        problem, head = hpackcodec.check_request(headers)
        if head is not None and ended and head.content_length > 0:
            problem = "content-length without DATA"
        if problem or head is None:
            raise StreamFault(sid, PROTOCOL_ERROR, f"malformed request: {problem}")
        end = StreamEnd(sid, self.peer_initial_window, self.limits.stream_window)
        end.content_length = head.content_length
        end.head = head
        end.headers_received = True
        end.remote_closed = ended
        self.streams[sid] = end
        self.events.on_headers(self, end, headers, ended)

    def _rst_stream(self, sid: int, code: int) -> None:
        end = self.streams.pop(sid, None)
        if end is None:
            if self._idle(sid):
                raise ConnectionFault(PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}")
            return
        self._drop(end)
        premature = self.server and not end.local_closed
        self.events.on_reset(self, end, code, "", True)
        if premature and not self.resets.take():
            raise ConnectionFault(ENHANCE_YOUR_CALM, "too many streams reset")

    def _window_update(self, sid: int, payload: bytes) -> None:
        increment = u32(payload) & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise ConnectionFault(PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionFault(FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            self._pump_all()
            return
        end = self.streams.get(sid)
        if end is None:
            if self._idle(sid):
                raise ConnectionFault(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}")
            return  # may trail a stream that just closed (§6.9)
        if increment == 0:
            raise StreamFault(sid, PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        end.send_window += increment
        if end.send_window > MAX_WINDOW:
            raise StreamFault(sid, FLOW_CONTROL_ERROR, "stream window over 2^31-1")
        if end.pending:
            self._pump(end)

    def _settings(self, payload: bytes) -> None:
        grew = False
        for ident, value in settings_values(payload):
            if ident == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionFault(FLOW_CONTROL_ERROR, "SETTINGSINITIAL_WINDOW_SIZE")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for end in self.streams.values():
                    end.send_window += delta
                    if end.send_window > MAX_WINDOW:
                        raise ConnectionFault(FLOW_CONTROL_ERROR, "a stream window over 2^31-1")
                grew = grew or delta > 0
            elif ident == MAX_FRAME_SIZE:
                if not MIN_MAX_FRAME <= value <= MAX_MAX_FRAME:
                    raise ConnectionFault(PROTOCOL_ERROR, "SETTINGSMAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif ident == ENABLE_PUSH:
                if value > 1:
                    raise ConnectionFault(PROTOCOL_ERROR, "SETTINGSENABLE_PUSH")
            elif ident == MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            # HEADER_TABLE_SIZE bounds an encoder's table, and ours keeps none;
            # MAX_HEADER_LIST_SIZE is advisory (the peer answers what it will not take);
            # unknown settings are ignored (§6.5.2).
        self._control(SETTINGS_ACK)
        if grew:
            self._pump_all()

    def _stream_fault(self, fault: StreamFault) -> None:
        end = self.streams.pop(fault.stream_id, None)
        self._refuse(fault.stream_id, fault.code)
        if end is not None:
            self._drop(end)
            self.events.on_reset(self, end, fault.code, fault.reason, False)

    def _refuse(self, sid: int, code: int) -> None:
        self._control(rst_stream(sid, code))
        self._remember_reset(sid)

    def _remember_reset(self, sid: int) -> None:
        ids = self.reset_ids
        ids[sid] = None
        if len(ids) > self.limits.closed_streams_remembered:
            del ids[next(iter(ids))]

    def _control(self, data: bytes) -> None:
        """Queue a reply the peer's frames asked for; a peer that reads none is cut off."""
        self.out.append(data)
        self._count_control()

    def _count_control(self) -> None:
        if not self.writable:
            self.queued_control += 1
            if self.queued_control > self.limits.max_queued_control_frames:
                raise ConnectionFault(ENHANCE_YOUR_CALM, "too many replies not read")

    def _take_acks(self) -> None:
        """Waiting PING acknowledgements go first in what is written next (RFC 9113 §6.7:
        PING responses SHOULD be given higher priority than any other frame)."""
        self.out[:0] = self.ping_acks
        self.ping_acks = []
        if self.ack_timer is not None:
            self.ack_timer.cancel()
            self.ack_timer = None

    def _acks_due(self) -> None:
        self.ack_timer = None
        if self.ping_acks:
            self._take_acks()
            self.flush()

    # -- timers -------------------------------------------------------------------------

    def _arm_timer(self, seconds: float) -> None:
        if self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(seconds, self._timed_out)

    def _disarm_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        self.timer = None
        if not self.settings_seen:
            self.fail(PROTOCOL_ERROR, "no HTTP/2 preface in time")
        elif self.reader.block_open:
            self.fail(ENHANCE_YOUR_CALM, "header block open for too long")
        self.flush()

    def after_read(self) -> None:
        """A header block left open by this read must complete within its time limit."""
        if self.reader.block_open and not self.failed:
            self._arm_timer(self.limits.header_block_seconds)

    # -- sending ------------------------------------------------------------------------

    def can_open(self) -> bool:
        return (
            not self.failed
            and not self.goaway_received
            and len(self.streams) < self.peer_max_streams
            and self.next_stream_id < 2**31
        )

    def open_stream(self, owner: Any) -> StreamEnd:
        """Client side: a new stream (check ``can_open`` first)."""
        sid = self.next_stream_id
        self.next_stream_id += 2
        end = StreamEnd(sid, self.peer_initial_window, self.limits.stream_window)
        end.owner = owner
        self.streams[sid] = end
        return end

    def send_headers(
        self, end: StreamEnd, headers: list[Header], end_stream: bool, reset_after: bool = False
    ) -> None:
        """HEADERS (and CONTINUATION), after any DATA still queued on the stream."""
        self.send_block(end, hpackcodec.encode(headers), end_stream, reset_after)

    def send_block(
        self, end: StreamEnd, encoded: bytes, end_stream: bool, reset_after: bool = False
    ) -> None:
        """An encoded header block, as :meth:`send_headers` sends it."""
        block = header_frames(end.id, encoded, end_stream)
        if end.pending:
            end.pending.append((_FRAMES_ITEM, block, end_stream))
            end.reset_after = reset_after
            return
        self.out.append(block)
        if end_stream:
            self._ended_local(end, reset_after)

    def send_data(self, end: StreamEnd, data: bytes, end_stream: bool) -> None:
        """DATA as the peer's windows allow; the rest waits on the stream, in order."""
        size = len(data)
        if (
            not end.pending
            and self.writable
            and size <= self.send_window
            and size <= end.send_window
            and size <= self.peer_max_frame
        ):
            self.out.append(frame(DATA, END_STREAM if end_stream else 0, end.id, data))
            self.send_window -= size
            end.send_window -= size
            if size:
                self._on_sent(self, end, size)
            if end_stream:
                self._ended_local(end, False)
            return
        end.pending.append((_DATA_ITEM, data, end_stream))
        self._pump(end)

    def reset(self, end: StreamEnd, code: int) -> None:
        """RST_STREAM now; anything queued on the stream is dropped."""
        if self.streams.pop(end.id, None) is None:
            return
        self._drop(end)
        self.out.append(rst_stream(end.id, code))
        self._remember_reset(end.id)

    def drop_pending(self, end: StreamEnd) -> None:
        self._drop(end)

    def unprocessed(self, end: StreamEnd) -> None:
        """Client side: the peer's GOAWAY says it never processed ``end``; it is closed
        without a frame (RFC 9113 §6.8)."""
        if self.streams.pop(end.id, None) is not None:
            self._drop(end)

    def _drop(self, end: StreamEnd) -> None:
        """Output queued on ``end`` will not be sent; it counts as gone, for the owner's
        credit to the side it came from."""
        self.blocked.pop(end, None)
        if end.pending:
            size = sum(len(data) for kind, data, _ in end.pending if kind == _DATA_ITEM)
            end.pending.clear()
            if size:
                self._on_sent(self, end, size)

    def credit(self, end: StreamEnd | None, size: int) -> None:
        """``size`` bytes received on ``end`` have moved on: let the peer send as many more.

        ``end`` None credits the connection only."""
        unacked = self.recv_unacked + size
        if unacked >= self.connection_threshold:
            self.out.append(window_update(0, unacked))
            self.recv_window += unacked
            unacked = 0
        self.recv_unacked = unacked
        if end is not None and not end.remote_closed:
            self.credit_stream(end, size)

    def credit_stream(self, end: StreamEnd, size: int) -> None:
        if end.remote_closed or end.id not in self.streams:
            return
        end.recv_unacked += size
        if end.recv_unacked >= self.stream_threshold:
            self.out.append(window_update(end.id, end.recv_unacked))
            end.recv_window += end.recv_unacked
            end.recv_unacked = 0

    def send_goaway(self, code: int = NO_ERROR) -> None:
        """Graceful: streams opened so far go on; later ones are refused (server side)."""
        if not self.goaway_sent and not self.failed:
            self.goaway_sent = True
            self.out.append(goaway(self.last_peer_stream if self.server else 0, code))

    def _pump(self, end: StreamEnd) -> None:
        pending = end.pending
        sent = 0
        max_frame = self.peer_max_frame
        ended: bool | None = None  # END_STREAM went out (with a reset after it when True)
        while pending:
            kind, data, fin = pending[0]
            if kind == _FRAMES_ITEM:
                pending.pop(0)
                self.out.append(data)
                if fin:
                    ended = end.reset_after
                continue
            room = min(self.send_window, end.send_window, max_frame) if self.writable else 0
            size = len(data)
            if size and room <= 0:
                break
            chunk = data[:room] if size > room else data
            last = fin and len(chunk) == size
            self.out.append(frame(DATA, END_STREAM if last else 0, end.id, chunk))
            self.send_window -= len(chunk)
            end.send_window -= len(chunk)
            sent += len(chunk)
            if len(chunk) == size:
                pending.pop(0)
                if fin:
                    ended = False
            else:
                pending[0] = (kind, data[len(chunk) :], fin)
        if pending:
            self.blocked[end] = None
        else:
            self.blocked.pop(end, None)
        if sent:
            self._on_sent(self, end, sent)
        if ended is not None:  # after on_sent: closing may let go of the end's owner
            self._ended_local(end, ended)

    def _pump_all(self) -> None:
        for end in list(self.blocked):
            if self.send_window <= 0 or not self.writable:
                return
            self._pump(end)

    def _ended_local(self, end: StreamEnd, reset_after: bool) -> None:
        end.local_closed = True
        if reset_after and end.id in self.streams:
            # The peer has not finished sending: tell it to stop (as gRPC servers do).
            del self.streams[end.id]
            self.out.append(rst_stream(end.id, NO_ERROR))
            self._remember_reset(end.id)
            end.owner = None
        elif end.remote_closed:
            self._forget(end)

    def _forget(self, end: StreamEnd) -> None:
        """Closed both ways, nothing left to send: no event will name ``end`` again."""
        if not end.pending and self.streams.pop(end.id, None) is not None:
            # The owner refers back to its ends; letting go of it here frees a finished
            # call at once, by reference counting, instead of in the next garbage collection.
            end.owner = None


__all__ = ["Events", "H2Connection", "StreamEnd", "TokenBucket"]
