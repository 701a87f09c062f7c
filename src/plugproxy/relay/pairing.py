"""Stream mapping and flow control: one CO connection joined to connections to the plugin.

A :class:`Pairing` is the CO's connection (an HTTP/2 server side) and owns the client-side
connections it opens to the plugin (:class:`PluginSide`): one at a time, plus any the
plugin is draining with GOAWAY. Each call is a :class:`Stream` that maps the CO's stream
id to the plugin's. Only calls cross; connection state (settings, HPACK, windows, pings)
never does.

Flow control is end to end and bounded by what we granted. Request bytes are credited
back to the CO only when they have gone to the plugin (or, for a message the stages must
see whole, as it is gathered: bounded per stream by the plugin's pace and per connection
by ``Limits.collect_budget``). Response bytes are credited back to the plugin only when
they have gone to the CO. A peer that stops reading its socket stops the credit too.

A call that finds no plugin waits for one within its own deadline, bounded by
``--plugin-wait``; the pairing keeps dialling while calls wait. One still waiting just
before its deadline is answered UNAVAILABLE naming the upstream and why it cannot be
reached (see :data:`plugproxy.relay.upstream.ANSWER_MARGIN_SECONDS`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from plugproxy.api import Call, LazyMessage, MetadataValue, MethodInfo, Reject, StatusCode
from plugproxy.core.log import Logger
from plugproxy.pipeline import Chain, compile_chain
from plugproxy.relay import frames, grpcwire, hpackcodec
from plugproxy.relay.connection import H2Connection, StreamEnd
from plugproxy.relay.grpcwire import Messages, MessageTooLarge, message_frame
from plugproxy.relay.hpackcodec import Header, NeverIndexed
from plugproxy.relay.limits import DEFAULT_LIMITS, Limits
from plugproxy.relay.upstream import Upstream, answer_margin, deadline_ran_out
from plugproxy.spec.registry import Registry

NOT_GRPC = object()  # owner of a CO stream that is not a gRPC call (answered by the proxy)
STREAM_IDS_END = 2**31 - 1  # stream ids are 31 bits (RFC 9113 §5.1.1)
_SERIALS = itertools.count(1)  # CO connections, numbered as they come


class Stream:
    """One call: its ends on both connections, its stage state and its flow accounting."""

    __slots__ = (
        "call",
        "co",
        "co_ended",
        "credited_ahead",
        "deadline",
        "early",
        "finished",
        "headers",
        "held",
        "owed",
        "plugin",
        "queued",
        "requests",
        "response_headers_seen",
        "responses",
        "route",
        "started",
        "task",
        "timeout",
        "up",
        "wait_since",
        "wait_until",
    )

    def __init__(self, co: StreamEnd, route: Route, headers: list[Header]) -> None:
        self.co = co
        self.route = route
        self.headers = headers
        self.call: Call | None = None
        self.up: StreamEnd | None = None  # None until the call is opened on the plugin
        self.plugin: PluginSide | None = None
        self.deadline: float | None = None  # monotonic, from grpc-timeout
        self.timeout: float | None = None  # grpc-timeout, seconds
        self.wait_since: float | None = None  # when it began to wait for a plugin stream
        self.wait_until = 0.0
        self.early: list[tuple[bytes, bool]] = []  # request bytes before the plugin stream
        self.held: list[tuple[bool, bytes]] | None = None  # messages waiting for on_start
        self.queued = 0  # gathered request bytes not yet gone to the plugin
        self.credited_ahead = 0  # of those, credited to the CO already
        self.owed = 0  # credit held back from the CO
        self.requests: Messages | None = None
        self.responses: Messages | None = None
        self.co_ended = False
        self.response_headers_seen = False
        self.finished = False  # the CO got (or is getting) its final status
        self.started = False  # on_start was begun (it may still be running in ``task``)
        self.task: asyncio.Task[None] | None = None


class PluginSide(asyncio.Protocol):
    """A client connection to the plugin; its events go to the pairing that opened it."""

    def __init__(self, pairing: Pairing) -> None:
        self.pairing = pairing
        self.h2 = H2Connection(pairing.relay.limits, pairing, server=False)
        self.h2.owner = self
        self.draining = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.h2.start(transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.pairing.plugin_data(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.pairing.plugin_lost(self)

    def pause_writing(self) -> None:
        self.h2.set_writable(False)

    def resume_writing(self) -> None:
        self.h2.set_writable(True)
        self.pairing.flush()


class Pairing(asyncio.Protocol):
    """One CO connection and the calls it carries to the plugin."""

    def __init__(self, relay: RelayState) -> None:
        self.relay = relay
        self.serial = next(_SERIALS)  # names this connection to the stages (Call.connection)
        self.co = H2Connection(relay.limits, self, server=True)
        self.peer = ""
        self.streams: dict[int, Stream] = {}  # by the CO's stream id, until finished
        self.plugin: PluginSide | None = None  # where new calls go
        self.old_plugins: set[PluginSide] = set()  # draining after the plugin's GOAWAY
        self.connecting: asyncio.Task[None] | None = None
        self.plugin_reason = ""  # why the plugin could not be reached last time
        self.waiting: deque[Stream] = deque()  # calls waiting for a plugin stream
        self.opening: list[Stream] = []  # calls to open once the current read is done
        self.in_read = False
        # Gathered request bytes not yet gone to the plugin (see _gathered).
        self.holding: dict[Stream, None] = {}  # streams holding some, oldest first
        self.held_total = 0
        self.connection_owed = 0
        self.owing: dict[Stream, None] = {}
        # Response and finish hooks of the plugin bytes being read: they only observe, so
        # they run after those bytes are written to the CO (plugin_data), not before.
        self.observers: list[tuple[Chain, Call, LazyMessage | None]] = []
        self.reading_plugin = False
        self.closed = False
        self.draining = False

    # -- connection life ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = f"ipv4:{peer[0]}:{peer[1]}"
        else:
            self.peer = f"unix:{peer or transport.get_extra_info('sockname') or ''}"
        self.relay.pairings.add(self)
        if self.relay.draining:
            transport.close()
            return
        self.co.start(transport)  # type: ignore[arg-type]
        self._want_plugin()  # dial now: the first call need not wait for it

    def connection_lost(self, exc: Exception | None) -> None:
        """The CO went away: its calls are cancelled, the plugin connections closed."""
        self.closed = True
        self.relay.pairings.discard(self)
        for stream in list(self.streams.values()):
            self._cancel_upstream(stream)
            self._cancelled(stream, "the CO closed the connection")
        self.waiting.clear()
        if self.connecting is not None:
            self.connecting.cancel()
        for side in self._plugins():
            side.h2.close()
        self.co.close()

    def pause_writing(self) -> None:
        self.co.set_writable(False)

    def resume_writing(self) -> None:
        self.co.set_writable(True)
        self.flush()

    def is_closed(self) -> bool:
        return self.closed

    def _plugins(self) -> list[PluginSide]:
        return [*([self.plugin] if self.plugin else []), *self.old_plugins]

    def drain(self) -> None:
        """GOAWAY to the CO: calls it started go on; it opens a new connection for new ones."""
        self.draining = True
        self.co.send_goaway()
        self._close_if_idle()
        self.flush()

    def abort(self, why: str) -> None:
        for stream in list(self.streams.values()):
            self._answer(stream, StatusCode.UNAVAILABLE, why)
        self.flush()
        self._close()

    def _close_if_idle(self) -> None:
        if self.draining and not self.streams and not self.closed:
            # A moment for the GOAWAY and the last frames to leave.
            asyncio.get_running_loop().call_later(0.05, self._close)

    def _close(self) -> None:
        self.flush()
        self.co.close()
        for side in self._plugins():
            side.h2.close()

    def flush(self) -> None:
        """Open the calls this read made ready, then write what every connection queued."""
        if self.opening:
            opening, self.opening = self.opening, []
            for stream in opening:
                if not stream.finished:
                    self._open_or_wait(stream)
        self.co.flush()
        if self.plugin is not None:
            self.plugin.h2.flush()
        for side in self.old_plugins:
            side.h2.flush()

    # -- connection events (both sides) -------------------------------------------------

    def on_headers(
        self, conn: H2Connection, end: StreamEnd, headers: list[Header], end_stream: bool
    ) -> None:
        if not conn.server:
            self._plugin_headers(end.owner, headers, end_stream)
        elif end.owner is None:
            self._request(end, headers, end_stream)
        elif end.owner is NOT_GRPC:
            self._answer_not_grpc(end, headers)
        else:
            self._co_trailers(end.owner, headers)

    def on_data(self, conn: H2Connection, end: StreamEnd, data: bytes, end_stream: bool) -> None:
        if conn.server:
            owner = end.owner
            if owner is NOT_GRPC:
                self.co.credit(end, len(data))
                if end_stream:
                    self._answer_not_grpc(end, [])
            else:
                self._co_data(owner, data, end_stream)
        else:
            self._plugin_data(end.owner, data, end_stream)

    def on_reset(
        self, conn: H2Connection, end: StreamEnd, code: int, reason: str, by_peer: bool
    ) -> None:
        stream = end.owner
        if not isinstance(stream, Stream) or stream.finished:
            return
        if conn.server:
            self._cancel_upstream(stream, code if by_peer else frames.CANCEL)
            if by_peer and stream.deadline is not None:
                remaining = stream.deadline - time.monotonic()
                if deadline_ran_out(remaining, stream.timeout):
                    self._deadline_ran_out(stream)
                    return
            why = "cancelled by the caller" if by_peer else f"HTTP/2 stream error: {reason}"
            self._cancelled(stream, why)
        elif by_peer:
            self.co.reset(stream.co, code)
            status = grpcwire.RST_STATUS.get(code, StatusCode.INTERNAL)
            self._ended(stream, status, f"the plugin reset the stream (HTTP/2 code {code})")
        else:
            self._answer(
                stream,
                StatusCode.INTERNAL,
                f"plugproxy: the plugin broke HTTP/2 on this call: {reason}",
            )

    def on_sent(self, conn: H2Connection, end: StreamEnd, size: int) -> None:
        stream = end.owner
        if not conn.server:  # request bytes reached the plugin (or were dropped)
            requests = stream.requests
            if requests is not None and requests.collect:
                self._gathered_sent(stream, size)
            else:
                self.co.credit(stream.co, size)
        elif isinstance(stream, Stream) and stream.up is not None and stream.plugin is not None:
            stream.plugin.h2.credit(stream.up, size)  # response bytes reached the CO

    def on_goaway(self, conn: H2Connection, last_stream: int, code: int) -> None:
        if conn.server:
            return  # the CO stops opening streams; ours go on until it closes
        side: PluginSide = conn.owner
        side.draining = True
        if side is self.plugin:
            self.plugin = None
            self.old_plugins.add(side)
        for stream in list(self.streams.values()):
            up = stream.up
            unprocessed = stream.plugin is side and up is not None and up.id > last_stream
            if unprocessed and not stream.response_headers_seen and not stream.finished:
                # Never processed by the plugin: refused, which gRPC clients retry.
                side.h2.unprocessed(up)  # type: ignore[arg-type]
                self.co.reset(stream.co, frames.REFUSED_STREAM)
                self._ended(
                    stream,
                    StatusCode.UNAVAILABLE,
                    f"the plugin refused the call with GOAWAY (HTTP/2 code {code})",
                )
        self._retire(side)
        if self.waiting:
            self._want_plugin()

    def on_failed(self, conn: H2Connection, code: int, reason: str) -> None:
        logger = self.relay.logger
        if conn.server:
            logger.warning("HTTP/2 error from the CO; closing", reason=reason, peer=self.peer)
            for stream in list(self.streams.values()):
                self._cancel_upstream(stream)
                self._cancelled(stream, f"HTTP/2 connection error: {reason}")
            self.closed = True
            asyncio.get_running_loop().call_soon(self._close)
            return
        side: PluginSide = conn.owner
        logger.warning("HTTP/2 error from the plugin; reconnecting", reason=reason)
        self._plugin_gone(side, self.relay.unavailable(f"HTTP/2 error from the plugin: {reason}"))
        asyncio.get_running_loop().call_soon(side.h2.close)

    # -- the plugin connection ----------------------------------------------------------

    def _want_plugin(self) -> None:
        if self.plugin is None and self.connecting is None and not self.closed:
            self.connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        relay = self.relay
        delay = 0.05
        try:
            while not self.closed:
                try:
                    side = await relay.connect_upstream(self)
                except OSError as exc:
                    self.plugin_reason = relay.upstream.describe_failure(exc)
                else:
                    if self.is_closed():  # the CO left while we dialled
                        side.h2.close()
                        return
                    self.plugin = side
                    self._open_waiting()
                    self.flush()
                    return
                now = time.monotonic()
                self._expire_waiting(now)
                self.flush()
                if not self.waiting:
                    return
                soonest = min(stream.wait_until for stream in self.waiting)
                await asyncio.sleep(max(0.0, min(delay, soonest - now)))
                delay = min(delay * 2, 1.0)
        finally:
            self.connecting = None

    def _expire_waiting(self, now: float) -> None:
        """Calls that waited for the plugin as long as they may are answered: UNAVAILABLE
        naming the upstream and why it cannot be reached, just before their deadline or
        after --plugin-wait."""
        keep: deque[Stream] = deque()
        upstream = self.relay.upstream
        for stream in self.waiting:
            if stream.finished:
                continue
            if stream.wait_until > now:
                keep.append(stream)
                continue
            since = now if stream.wait_since is None else stream.wait_since
            by_deadline = stream.wait_until < since + self.relay.plugin_wait
            details = upstream.unreachable_details(self.plugin_reason, now - since, by_deadline)
            # Past the deadline no answer reaches the CO (it has its own DEADLINE_EXCEEDED);
            # the log says what the CO saw.
            late = stream.deadline is not None and stream.deadline <= now
            code = StatusCode.DEADLINE_EXCEEDED if late else StatusCode.UNAVAILABLE
            self._answer(stream, code, details)
        self.waiting = keep

    def plugin_lost(self, side: PluginSide) -> None:
        if self.closed:
            return
        self._plugin_gone(side, self.relay.unavailable("the plugin closed the connection"))
        self.flush()

    def _plugin_gone(self, side: PluginSide, why: str) -> None:
        """Calls already sent on ``side`` get UNAVAILABLE; calls not sent yet wait for another."""
        if side is self.plugin:
            self.plugin = None
        self.old_plugins.discard(side)
        for stream in list(self.streams.values()):
            if stream.plugin is side and not stream.finished:
                self._answer(stream, StatusCode.UNAVAILABLE, why)
        side.h2.failed = True
        if self.waiting:
            self._want_plugin()

    def _retire(self, side: PluginSide) -> None:
        if side.draining and not side.h2.streams and side is not self.plugin:
            self.old_plugins.discard(side)
            side.h2.close()

    def plugin_data(self, side: PluginSide, data: bytes) -> None:
        self.reading_plugin = True
        try:
            side.h2.receive(data)
            side.h2.after_read()
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

    # -- frames from the CO -------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.in_read = True
        try:
            self.co.receive(data)
            self.co.after_read()
        finally:
            self.in_read = False
        self.flush()

    def _request(self, end: StreamEnd, headers: list[Header], ended: bool) -> None:
        relay = self.relay
        head = end.head
        assert head is not None
        timeout = grpcwire.parse_timeout(head.grpc_timeout) if head.grpc_timeout else None
        arrived = time.monotonic()  # the deadline counts from here, not after route's work
        path = head.path
        if head.method != b"POST" or not grpcwire.is_grpc(head.content_type):
            end.owner = NOT_GRPC
            if ended:
                self._answer_not_grpc(end, headers)
            return
        route = relay.route(path)
        stream = Stream(end, route, headers)
        end.owner = stream
        self.streams[end.id] = stream
        relay.call_started()
        stream.co_ended = ended
        if timeout is not None:
            stream.deadline = arrived + timeout
            stream.timeout = timeout
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
                item = grpcwire.metadata_item(name, value)
                metadata.append(item)
                if name not in grpcwire.TRANSPORT_HEADERS:
                    upstream_metadata.append(item)
            stream.call = Call(
                route.info, tuple(metadata), upstream_metadata, timeout, self.peer, self.serial
            )
        if relay.active > relay.max_concurrent_calls:
            relay.over_limit(self.peer)
            self._answer(
                stream,
                StatusCode.RESOURCE_EXHAUSTED,
                f"plugproxy: more than {relay.max_concurrent_calls} calls in flight "
                "(--max-concurrent-calls)",
            )
            return
        if chain is None:
            stream.requests = Messages(limit, False)
            self._send(stream)
            return
        kind = route.info.kind
        # Gathered whole: held until on_start passes, and judged by request hooks.
        stream.requests = Messages(limit, True)
        stream.held = []
        if not kind.unary_request:
            self._start(stream)
        elif ended:  # no request message at all: the stages and the plugin see an empty one
            stream.held.append((False, b""))
            self._start(stream)

    def _answer_not_grpc(self, end: StreamEnd, headers: list[Header]) -> None:
        """As gRPC servers do: 415 for a request that is not gRPC; it never reaches the plugin."""
        method = next((v for n, v in headers if n == b":method"), b"")
        body = b"plugproxy: this is a gRPC endpoint; send application/grpc POST requests\n"
        response: list[Header] = [
            (b":status", b"415"),
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        if method == b"HEAD":
            self.co.send_headers(end, response, True)
        else:
            self.co.send_headers(end, response, False)
            self.co.send_data(end, body, True)

    def _co_trailers(self, stream: Stream, headers: list[Header]) -> None:
        # gRPC clients send none; a CO that does ends its side with them.
        stream.co_ended = True
        if stream.up is not None and stream.plugin is not None and stream.held is None:
            stream.plugin.h2.send_headers(stream.up, headers, True)
        else:
            stream.early.append((b"", True))

    def _co_data(self, stream: Stream, data: bytes, ended: bool) -> None:
        if stream.finished:
            self.co.credit(stream.co, len(data))
            return
        if ended:
            stream.co_ended = True
        requests = stream.requests
        assert requests is not None
        try:
            messages = requests.feed(data)
        except MessageTooLarge as exc:
            self.co.credit(stream.co, len(data))
            self._answer(
                stream,
                StatusCode.RESOURCE_EXHAUSTED,
                f"plugproxy: request message of {exc.size} bytes exceeds --max-message-bytes "
                f"({self.relay.max_message_bytes})",
            )
            return
        if ended and requests.incomplete:
            # As gRPC servers do; the plugin never gets the cut message as a whole one.
            self._answer(
                stream, StatusCode.INTERNAL, "plugproxy: the request ended inside a message"
            )
            return
        if not requests.collect:
            if stream.call is not None:
                stream.call.request_count = requests.count
            self._forward(stream, data, ended)  # credited as it reaches the plugin
            return
        self._gathered(stream, len(data))
        if stream.held is not None:
            stream.held.extend(messages)
            if not stream.started and (stream.held or ended):
                if not stream.held:
                    stream.held.append((False, b""))
                self._start(stream)
            return
        for index, (compressed, body) in enumerate(messages):
            if not self._judge_request(stream, compressed, body):
                return
            last = ended and index == len(messages) - 1
            self._forward(stream, message_frame(compressed, body), last)
        if ended and not messages:
            self._forward(stream, b"", True)

    # Request bytes gathered for the stages (whole messages, held or judged) are credited to
    # the CO as they arrive, not as they leave: a message larger than the windows must be
    # able to complete. Two bounds keep that from becoming memory for the taking:
    # - per stream, credit stops while more than a stream window waits for the plugin;
    # - per connection, once more than collect_budget is held, only the stream that has
    #   held bytes longest is credited (so large messages cannot stall one another), and
    #   the connection window is withheld too, so new streams' initial windows cannot add
    #   more than one connection window on top.

    def _gathered(self, stream: Stream, size: int) -> None:
        if not size:
            return
        if not stream.queued:
            self.holding[stream] = None
        stream.queued += size
        self.held_total += size
        within = self._within_budget(stream)
        if within:
            self.co.credit(None, size)
        else:
            self.connection_owed += size
        if stream.co_ended:
            stream.credited_ahead += size  # nothing more can come: no credit needed
        elif within and self._plugin_keeps_up(stream):
            self.co.credit_stream(stream.co, size)
            stream.credited_ahead += size
        else:
            stream.owed += size
            self.owing[stream] = None

    def _gathered_sent(self, stream: Stream, size: int) -> None:
        """``size`` gathered bytes went to the plugin (or were dropped)."""
        size = min(size, stream.queued)  # an empty request the proxy made up was never held
        stream.queued -= size
        self.held_total -= size
        if not stream.queued:
            self.holding.pop(stream, None)
        ahead = min(size, stream.credited_ahead)
        stream.credited_ahead -= ahead
        owed = min(size - ahead, stream.owed)
        if owed:
            stream.owed -= owed
            self.co.credit_stream(stream.co, owed)
        self._settle()

    def _within_budget(self, stream: Stream) -> bool:
        if self.held_total <= self.relay.limits.collect_budget:
            return True
        return next(iter(self.holding), stream) is stream  # the oldest always progresses

    def _plugin_keeps_up(self, stream: Stream) -> bool:
        return stream.queued - stream.credited_ahead <= self.relay.limits.stream_window

    def _settle(self) -> None:
        """Pay the credit held back, as far as the bounds now allow."""
        if self.connection_owed and self.held_total <= self.relay.limits.collect_budget:
            self.co.credit(None, self.connection_owed)
            self.connection_owed = 0
        for stream in list(self.owing):
            if stream.co_ended or not stream.owed:
                self.owing.pop(stream, None)
            elif self._within_budget(stream) and self._plugin_keeps_up(stream):
                self.co.credit_stream(stream.co, stream.owed)
                stream.credited_ahead += stream.owed
                stream.owed = 0
                self.owing.pop(stream, None)

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
        self._send(stream)
        for index, (compressed, body) in enumerate(held):
            if (not unary or index > 0) and not self._judge_request(stream, compressed, body):
                return
            last = stream.co_ended and index == len(held) - 1
            self._forward(stream, message_frame(compressed, body), last)
        if stream.co_ended and not held:
            self._forward(stream, b"", True)

    # -- toward the plugin --------------------------------------------------------------

    def _send(self, stream: Stream) -> None:
        """The call is ready for the plugin: opened after this read (a stream the CO resets
        in the same read never reaches the plugin), or now outside a read."""
        if self.in_read:
            self.opening.append(stream)
        else:
            self._open_or_wait(stream)

    def _open_or_wait(self, stream: Stream) -> None:
        plugin = self.plugin
        if plugin is not None:
            if plugin.h2.can_open():
                self._open(stream, plugin)
                return
            if plugin.h2.next_stream_id >= STREAM_IDS_END:  # ids used up: a new connection
                plugin.draining = True
                self.plugin = None
                self.old_plugins.add(plugin)
                self._retire(plugin)
                plugin = None
        now = time.monotonic()
        stream.wait_since = now
        stream.wait_until = now + self.relay.plugin_wait
        if stream.deadline is not None and stream.timeout is not None:
            answer_by = stream.deadline - answer_margin(stream.timeout)
            stream.wait_until = min(stream.wait_until, answer_by)
        self.waiting.append(stream)
        if plugin is None:
            self._want_plugin()

    def _open_waiting(self) -> None:
        plugin = self.plugin
        while self.waiting and plugin is not None and plugin.h2.can_open():
            stream = self.waiting.popleft()
            if not stream.finished:
                self._open(stream, plugin)

    def _open(self, stream: Stream, plugin: PluginSide) -> None:
        if stream.deadline is not None and stream.deadline <= time.monotonic():
            self._answer(
                stream,
                StatusCode.DEADLINE_EXCEEDED,
                "plugproxy: deadline expired before the call reached the plugin",
            )
            return
        up = plugin.h2.open_stream(stream)
        stream.up = up
        stream.plugin = plugin
        early, stream.early = stream.early, []
        only_headers = (
            stream.co_ended and not early and stream.held is None and stream.route.chain is None
        )
        plugin.h2.send_headers(up, self._upstream_headers(stream), only_headers)
        for data, end in early:
            plugin.h2.send_data(up, data, end)

    def _forward(self, stream: Stream, data: bytes, end: bool) -> None:
        if stream.up is None or stream.plugin is None:
            stream.early.append((data, end))
        else:
            stream.plugin.h2.send_data(stream.up, data, end)

    def _upstream_headers(self, stream: Stream) -> list[Header]:
        authority = self.relay.authority
        call = stream.call
        out: list[Header] = []
        never_indexed: set[bytes] = set()  # names the CO sent never indexed (RFC 7541 §6.2.3)
        for field in stream.headers:
            name, value = field
            sent = value
            if name == b":authority" and authority is not None:
                sent = authority
            elif name == b"grpc-timeout":
                if stream.deadline is not None:
                    sent = grpcwire.format_timeout(max(0.0, stream.deadline - time.monotonic()))
            elif call is not None and name[:1] != b":" and name not in grpcwire.TRANSPORT_HEADERS:
                if field.__class__ is NeverIndexed:
                    never_indexed.add(name)
                continue  # call metadata: sent below as the stages left it
            if sent is value:
                out.append(field)
            elif field.__class__ is NeverIndexed:
                out.append(NeverIndexed(name, sent))
            else:
                out.append((name, sent))
        if call is not None:
            for key, val in call.upstream_metadata:
                name = key.encode("latin-1")
                raw = grpcwire.metadata_bytes(key, val)
                if name in never_indexed:  # two appends: see hpackcodec.decode
                    out.append(NeverIndexed(name, raw))
                else:
                    out.append((name, raw))
        return out

    def _cancel_upstream(self, stream: Stream, code: int = frames.CANCEL) -> None:
        if stream.up is not None and stream.plugin is not None:
            stream.plugin.h2.reset(stream.up, code)

    # -- frames from the plugin ---------------------------------------------------------

    def _plugin_data(self, stream: Stream, data: bytes, ended: bool) -> None:
        side = stream.plugin
        assert side is not None
        if stream.finished:
            side.h2.credit(stream.up, len(data))
            return
        responses = stream.responses
        assert responses is not None
        try:
            messages = responses.feed(data)
        except MessageTooLarge as exc:
            side.h2.credit(stream.up, len(data))
            self._answer(
                stream,
                StatusCode.RESOURCE_EXHAUSTED,
                f"plugproxy: plugin response message of {exc.size} bytes exceeds "
                f"--max-message-bytes ({self.relay.max_message_bytes})",
            )
            return
        self.co.send_data(stream.co, data, False)  # the plugin is credited as it goes out
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
        if ended:  # gRPC always ends with trailers; a bare END_STREAM is an error
            if call is not None:
                call.raw_status = ""  # no status at all: the validate stage judges that
            self._answer(stream, StatusCode.INTERNAL, "the plugin ended the stream without status")

    def _plugin_headers(self, stream: Stream, headers: list[Header], ended: bool) -> None:
        if stream.finished:
            return  # late: the CO already has its status
        self.co.send_block(
            stream.co,
            hpackcodec.encode_repeated(headers),
            ended,
            reset_after=ended and not stream.co_ended,
        )
        call = stream.call
        first = not stream.response_headers_seen
        stream.response_headers_seen = True
        if not ended:
            if call is not None:
                call.initial_metadata = grpcwire.response_metadata(headers)
            return
        code = StatusCode.UNKNOWN
        message = ""
        raw: bytes | None = None
        for name, value in headers:
            if name == b"grpc-status":
                raw = value
                number = int(value) if value.isdigit() else -1
                code = grpcwire.STATUS_BY_NUMBER.get(number, code)
            elif name == b"grpc-message":
                message = hpackcodec.percent_decode(value)
        if call is not None:
            # The CO gets the plugin's trailers as they are; the stage sees the raw value.
            call.raw_status = "" if raw is None else raw.decode("latin-1")
            call.trailing_metadata = grpcwire.response_metadata(headers)
            if first:
                call.initial_metadata = ()
            if call.method.kind.unary_response and call.response_count == 0:
                call.response = None
        self._ended(stream, code, message)
        side, up = stream.plugin, stream.up
        if side is not None and up is not None and not up.local_closed:
            side.h2.reset(up, frames.NO_ERROR)  # the plugin is done: stop our side too

    # -- ending calls -------------------------------------------------------------------

    def _answer(self, stream: Stream, code: StatusCode, message: str) -> None:
        """The relay gives the CO this status itself (rejects, limits, plugin unavailable)."""
        if stream.finished:
            return
        headers: list[Header] = []
        if not stream.response_headers_seen:
            headers += [(b":status", b"200"), (b"content-type", b"application/grpc")]
        headers.append((b"grpc-status", str(code.value[0]).encode()))
        if message:
            headers.append((b"grpc-message", hpackcodec.percent_encode(message)))
        if stream.co.id in self.co.streams:
            self.co.drop_pending(stream.co)
            self.co.send_headers(stream.co, headers, True, reset_after=not stream.co_ended)
        self._cancel_upstream(stream)
        if stream.task is not None and asyncio.current_task() is not stream.task:
            stream.task.cancel()
        self._ended(stream, code, message)

    def _deadline_ran_out(self, stream: Stream) -> None:
        """The CO reset the call at its deadline: logged as the DEADLINE_EXCEEDED the CO
        saw, with the plugin's state if the call was still waiting for it."""
        waiting = stream.up is None and stream.wait_since is not None and self.plugin is None
        reason = (self.plugin_reason or self.relay.upstream.reason) if waiting else None
        if stream.task is not None:
            stream.task.cancel()
        self._ended(
            stream, StatusCode.DEADLINE_EXCEEDED, self.relay.upstream.deadline_details(reason)
        )

    def _cancelled(self, stream: Stream, why: str) -> None:
        if stream.task is not None:
            stream.task.cancel()
        self._ended(stream, StatusCode.CANCELLED, why)

    def _ended(self, stream: Stream, code: StatusCode, message: str) -> None:
        if stream.finished:
            return
        stream.finished = True
        if stream.early:
            requests = stream.requests
            if requests is not None and not requests.collect:  # never credited: do it now
                self.co.credit(None, sum(len(data) for data, _ in stream.early))
            stream.early.clear()
        self.streams.pop(stream.co.id, None)
        if stream.queued:
            self.held_total -= stream.queued
            stream.queued = 0
            self.holding.pop(stream, None)
        self.owing.pop(stream, None)
        self.relay.call_ended()
        call = stream.call
        chain = stream.route.chain
        if call is not None and chain is not None:
            call.code, call.details = code, message
            if self.reading_plugin:  # after the response hooks queued before it
                self.observers.append((chain, call, None))
            else:
                chain.run_finish(call)
        side = stream.plugin
        if side is not None:
            if side.draining:
                self._retire(side)
            elif self.waiting and side is self.plugin:
                self._open_waiting()
        if self.owing or self.connection_owed:
            self._settle()
        if self.draining:
            self._close_if_idle()


WARNING_INTERVAL = 10.0  # seconds between two warnings of the same kind


@dataclass(frozen=True, slots=True)
class Route:
    info: MethodInfo
    chain: Chain | None


class RelayState:
    """What the pairings of one relay share: its routes (each method's stage chain), the
    upstream, the limits, the calls in flight. Kept here, with the pairings that use it,
    so that this module needs nothing of the acceptor around it
    (:class:`plugproxy.relay.framerelay.FrameRelay`)."""

    def __init__(
        self,
        registry: Registry,
        upstream: Upstream,
        stages: Sequence[Any],
        logger: Logger,
        *,
        max_message_bytes: int,
        max_concurrent_calls: int,
        plugin_wait: float = 0.0,
        limits: Limits = DEFAULT_LIMITS,
        dial: Callable[[Pairing], Awaitable[PluginSide]] | None = None,
    ) -> None:
        self.registry = registry
        # What opens a pairing's plugin side; the in-process benchmark gives its own.
        self.dial = dial
        self.upstream = upstream
        self.logger = logger
        self.max_message_bytes = max_message_bytes
        self.max_concurrent_calls = max_concurrent_calls
        self.plugin_wait = plugin_wait
        self.limits = limits
        self.stages = stages
        self.routes: dict[bytes, Route] = {
            info.path.encode(): Route(info, compile_chain(stages, info, logger))
            for info in registry.methods()
        }
        self.authority = b"localhost" if upstream.endpoint.is_unix else None
        self.pairings: set[Pairing] = set()
        self.active = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._warned_at = 0.0

    def route(self, path: bytes) -> Route:
        route = self.routes.get(path)
        if route is None:
            info = self.registry.lookup(path.decode("utf-8", "replace"))
            if not info.known:
                # Unknown paths are not cached: random paths from a CO must not grow memory.
                return Route(info, None)
            # A method of a spec the registry lists on first use: routed as the others now.
            route = self.routes[path] = Route(info, compile_chain(self.stages, info, self.logger))
        return route

    async def connect_upstream(self, pairing: Pairing) -> PluginSide:
        if self.dial is not None:
            return await self.dial(pairing)
        loop = asyncio.get_running_loop()
        endpoint = self.upstream.endpoint
        if endpoint.is_unix:
            _, side = await loop.create_unix_connection(lambda: PluginSide(pairing), endpoint.path)
        else:
            _, side = await loop.create_connection(
                lambda: PluginSide(pairing), endpoint.host, endpoint.port
            )
        return side

    def unavailable(self, why: str) -> str:
        return self.upstream.unavailable_details(why)

    def call_started(self) -> None:
        self.active += 1
        self._idle.clear()

    def call_ended(self) -> None:
        self.active -= 1
        if self.active <= 0:
            self._idle.set()

    def over_limit(self, peer: str) -> None:
        """A call refused by --max-concurrent-calls: say so, at most every few seconds."""
        now = time.monotonic()
        if now - self._warned_at >= WARNING_INTERVAL:
            self._warned_at = now
            self.logger.warning(
                "calls refused: --max-concurrent-calls reached",
                limit=self.max_concurrent_calls,
                peer=peer,
            )


__all__ = ["NOT_GRPC", "Pairing", "PluginSide", "RelayState", "Route", "Stream"]
