"""The connection to the plugin: whether it can be reached, and the proxy's own calls to it.

:class:`Upstream` speaks HTTP/2 itself (the frame relay's client side,
:mod:`plugproxy.relay.connection`), so a proxy on plaintext sockets never imports grpc. It
keeps one connection to the plugin, open while the plugin is up and redialled as soon as it
closes, which is what the readiness state follows; capability queries, the driver name and
readiness probes are unary calls on it. Calls from the CO never use it: each CO connection
has its own plugin connection (:mod:`plugproxy.relay.pairing`). The gRPC relay's variant,
over a grpc channel, is :class:`plugproxy.relay.grpcrelay.GrpcUpstream`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from plugproxy.api import StatusCode, UpstreamError, UpstreamState
from plugproxy.core.endpoints import Endpoint
from plugproxy.core.log import Logger
from plugproxy.net.sockets import describe_connect_error, path_problem
from plugproxy.relay import frames, grpcwire, hpackcodec
from plugproxy.relay.connection import H2Connection, StreamEnd
from plugproxy.relay.hpackcodec import Header
from plugproxy.relay.limits import DEFAULT_LIMITS

# Redial at once, then back off to at most 0.8 s (as the gRPC relay's channel is set up):
# a plugin back on its socket is seen as up in under a second.
FIRST_RETRY, MAX_RETRY = 0.1, 0.8
# A connection that ended sooner than this after it came up is redialled after the
# backoff, not at once: a socket that accepts and closes must not make the proxy spin.
STABLE_SECONDS = 1.0
HANDSHAKE_SECONDS = 10.0  # how long a connected plugin may take to send its SETTINGS

# A call waiting for a plugin that is down is answered this long before its own deadline
# (at most ANSWER_MARGIN_SECONDS, and a tenth of a short timeout): a gRPC client ends a
# call at its deadline by itself (a bare DEADLINE_EXCEEDED and RST_STREAM), so an answer
# sent at the deadline never reaches the caller, which would learn nothing of the cause.
# The answer is UNAVAILABLE, not DEADLINE_EXCEEDED: the call never reached the plugin, and
# UNAVAILABLE is the code that says so (gRPC's "transient, retry"; csi-lib-utils and the
# CSI sidecars retry it as they do a deadline). The same margin tells a CO's RST_STREAM at
# its deadline from a real cancellation (deadline_ran_out).
ANSWER_MARGIN_SECONDS = 0.1
ANSWER_MARGIN_FRACTION = 0.1
NOT_CONNECTED = "not connected yet"
START_HINTS = {
    "directory": "check --upstream for a typo: a plugin's socket directory normally exists "
    "before its containers start; waiting in case the plugin creates it",
    "not a socket": "check --upstream: something other than the plugin's socket is at that "
    "path; waiting in case the plugin replaces it",
}


def answer_margin(timeout: float) -> float:
    """How long before its deadline a call of ``timeout`` seconds that waits for the plugin
    is answered."""
    return max(0.0, min(ANSWER_MARGIN_SECONDS, ANSWER_MARGIN_FRACTION * timeout))


def deadline_ran_out(remaining: float | None, timeout: float | None) -> bool:
    """Whether a call ended by its caller with ``remaining`` seconds left of ``timeout``
    ended at its deadline: gRPC clients reset the stream themselves when it passes."""
    if remaining is None or timeout is None:
        return False
    return remaining <= answer_margin(timeout)


class Upstream:
    """The plugin's address and state, watched over a connection of the proxy's own."""

    def __init__(
        self,
        endpoint: Endpoint,
        logger: Logger,
        max_message_bytes: int,
        **_grpc_only: Any,  # the gRPC variant's channel settings; nothing here uses them
    ) -> None:
        self.endpoint = endpoint
        self._logger = logger
        self.max_message_bytes = max_message_bytes
        self._state = UpstreamState.DOWN
        self._reason = NOT_CONNECTED
        self._watcher: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[UpstreamState], None]] = []
        self._ready = asyncio.Event()
        self._client: _Client | None = None
        # For a tls:// upstream: why its handshakes fail, if anything says (plugproxy.net.tlslog).
        self.tls_hint: Callable[[str], str | None] | None = None

    @property
    def address(self) -> str:
        return self.endpoint.url

    @property
    def state(self) -> UpstreamState:
        return self._state

    @property
    def reason(self) -> str:
        """Why the plugin cannot be reached, found when asked (readiness, UNAVAILABLE
        messages): the words of the state log, and never stale while the state stays DOWN
        (gRPC's channel reports no new state between its redials)."""
        if self._state is not UpstreamState.DOWN or self._reason == NOT_CONNECTED:
            return self._reason
        if self.endpoint.is_unix:
            return describe_connect_error(self.endpoint.path)
        # Read when asked: grpc reports a handshake failure just after the state changed.
        if self.tls_hint is not None:
            hint = self.tls_hint("")
            if hint:
                return f"{self._reason}: {hint}"
        return self._reason

    def add_listener(self, listener: Callable[[UpstreamState], None]) -> None:
        self._listeners.append(listener)
        listener(self._state)

    def start(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def wait_ready(self, timeout: float | None) -> bool:
        """Whether the plugin answered within ``timeout`` seconds (None: wait for it)."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._client is not None:
            self._client.close()
            self._client = None

    def channel_is_ready(self) -> bool:
        return self._state is UpstreamState.UP

    def is_down(self) -> bool:
        """Known to be unreachable: DOWN after a connection attempt (not before the first)."""
        return self._state is UpstreamState.DOWN and self._reason != NOT_CONNECTED

    def describe_failure(self, error: OSError | None = None) -> str:
        """Why a connection to the plugin failed (``error``: the dial's), in the words
        of the state log, /readyz and the UNAVAILABLE a waiting call gets."""
        if self.endpoint.is_unix:
            return describe_connect_error(self.endpoint.path, error.errno if error else None)
        if error is not None and error.strerror:
            return error.strerror[:1].lower() + error.strerror[1:]
        return "connection failed"

    def _set(self, state: UpstreamState, error: OSError | None = None) -> None:
        if state is self._state and self._reason != NOT_CONNECTED:
            return
        first = self._reason == NOT_CONNECTED
        self._state = state
        if state is UpstreamState.UP:
            self._reason = "ready"
            self._ready.set()
            self._logger.info("upstream ready", upstream=self.address)
        else:
            self._ready.clear()
            self._reason = self.describe_failure(error)
            fields = {"upstream": self.address, "reason": self._reason}
            if self.endpoint.is_unix and path_problem(self.endpoint.path) is not None:
                # Most often a typo in --upstream: said once, on the line that reports it.
                key = "not a socket" if self._reason.startswith("not a socket") else "directory"
                fields["hint"] = START_HINTS[key]
            self._logger.warning(
                "upstream unavailable" if not first else "upstream not reachable yet",
                **fields,
                retry="backoff up to 1s",
            )
        for listener in self._listeners:
            listener(state)

    def unavailable_details(self, details: str) -> str:
        """Name the upstream in an UNAVAILABLE that came from the connection, not the plugin,
        and for a tls:// upstream the likely cause."""
        hint = self.tls_hint(details) if self.tls_hint is not None else None
        more = f"; {hint}" if hint else ""
        return f"plugproxy: upstream {self.address} unavailable: {details}{more}"

    def unreachable_details(self, reason: str, waited: float, before_deadline: bool) -> str:
        """The UNAVAILABLE of a call that waited ``waited`` seconds for a plugin that
        stayed unreachable, for ``reason``: until just before its deadline, or for
        --plugin-wait."""
        text = f"plugproxy: plugin unreachable: upstream {self.address}: {reason}"
        if before_deadline:
            return f"{text}; waited {waited:.1f} s, answered just before the call's deadline"
        if waited > 0:
            return f"{text}; waited {waited:.1f} s (--plugin-wait)"
        return text

    def deadline_details(self, reason: str | None) -> str:
        """What a call whose deadline ran out is logged with (the CO had its own
        DEADLINE_EXCEEDED): while it waited for the plugin, the plugin's ``reason``."""
        if reason is None:
            return "plugproxy: the call's deadline ran out"
        return (
            f"plugproxy: plugin unreachable: upstream {self.address}: {reason}; "
            "the call's deadline ran out while it waited"
        )

    async def _dial(self) -> _Client:
        loop = asyncio.get_running_loop()
        endpoint = self.endpoint
        if endpoint.is_unix:
            _, client = await loop.create_unix_connection(lambda: _Client(self), endpoint.path)
        else:
            _, client = await loop.create_connection(
                lambda: _Client(self), endpoint.host, endpoint.port
            )
        return client

    async def _watch(self) -> None:
        delay = FIRST_RETRY
        loop = asyncio.get_running_loop()
        while True:
            error: OSError | None = None
            try:
                client = await self._dial()
                # Up once the plugin's SETTINGS arrived (an HTTP/2 server answers there).
                await asyncio.wait(
                    (client.ready, client.lost),
                    timeout=HANDSHAKE_SECONDS,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            except OSError as exc:
                client, error = None, exc
            if client is None or not client.ready.done() or client.lost.done():
                if client is not None:
                    client.close()
                self._set(UpstreamState.DOWN, error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY)
                continue
            self._client = client
            self._set(UpstreamState.UP)
            up_at = loop.time()
            # The plugin closed the connection: redial (DOWN only if that fails).
            await client.lost
            if self._client is client:
                self._client = None
            if loop.time() - up_at < STABLE_SECONDS:
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY)
            else:
                delay = FIRST_RETRY

    async def unary(
        self, method: str, request: bytes, timeout: float, metadata: Sequence[tuple[str, str]] = ()
    ) -> bytes:
        """One unary call of the proxy's own; raises :class:`UpstreamError`."""
        client = self._client
        if client is None and self._reason == NOT_CONNECTED:
            await self.wait_ready(timeout)  # the first dial is under way
            client = self._client
        if client is None or not client.h2.can_open():
            raise UpstreamError(StatusCode.UNAVAILABLE, self.unavailable_details(self.reason))
        return await client.unary(method, request, timeout, metadata)


class _Pending:
    __slots__ = ("data", "done", "headers_seen")

    def __init__(self, done: asyncio.Future[bytes]) -> None:
        self.done = done
        self.data: list[bytes] = []
        self.headers_seen = False


class _Client(asyncio.Protocol):
    """One HTTP/2 client connection to the plugin, for unary calls of the proxy's own."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.h2 = H2Connection(DEFAULT_LIMITS, self, server=False)
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = loop.create_future()  # the plugin's SETTINGS came
        self.lost: asyncio.Future[None] = loop.create_future()
        endpoint = upstream.endpoint
        self.authority = (
            b"localhost" if endpoint.is_unix else f"{endpoint.host}:{endpoint.port}".encode()
        )

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.h2.start(transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.h2.receive(data)
        self.h2.after_read()
        self.h2.flush()
        if self.h2.settings_seen and not self.ready.done():
            self.ready.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all("the plugin closed the connection")
        self.h2.close()
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        self.h2.set_writable(False)

    def resume_writing(self) -> None:
        self.h2.set_writable(True)

    def close(self) -> None:
        self._fail_all("the proxy is stopping")
        self.h2.close()
        for future in (self.ready, self.lost):
            if not future.done():
                future.cancel()

    # -- calls

    async def unary(
        self, method: str, request: bytes, timeout: float, metadata: Sequence[tuple[str, str]]
    ) -> bytes:
        done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        end = self.h2.open_stream(_Pending(done))
        headers: list[Header] = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", method.encode()),
            (b":authority", self.authority),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (b"grpc-timeout", grpcwire.format_timeout(timeout)),
            *((key.encode("latin-1"), grpcwire.metadata_bytes(key, v)) for key, v in metadata),
        ]
        self.h2.send_headers(end, headers, False)
        self.h2.send_data(end, grpcwire.message_frame(False, request), True)
        self.h2.flush()
        try:
            return await asyncio.wait_for(asyncio.shield(done), timeout)
        except TimeoutError:
            _abandon(done)
            self.h2.reset(end, frames.CANCEL)
            self.h2.flush()
            raise UpstreamError(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except asyncio.CancelledError:
            # Nobody waits for the answer any more (a task ended at shutdown): cancel the
            # stream, so that close() does not fail it into a future no one retrieves.
            _abandon(done)
            self.h2.reset(end, frames.CANCEL)
            self.h2.flush()
            raise

    def _fail_all(self, why: str) -> None:
        for end in list(self.h2.streams.values()):
            self._end(
                end, UpstreamError(StatusCode.UNAVAILABLE, self.upstream.unavailable_details(why))
            )

    @staticmethod
    def _end(end: StreamEnd, result: bytes | UpstreamError) -> None:
        pending = end.owner
        if not isinstance(pending, _Pending) or pending.done.done():
            return
        if isinstance(result, UpstreamError):
            pending.done.set_exception(result)
        else:
            pending.done.set_result(result)

    # -- connection events

    def on_headers(
        self, conn: H2Connection, end: StreamEnd, headers: list[Header], end_stream: bool
    ) -> None:
        pending = end.owner
        if not isinstance(pending, _Pending):
            return
        if not end_stream:
            pending.headers_seen = True
            return
        code, message = StatusCode.UNKNOWN, ""
        for name, value in headers:
            if name == b"grpc-status":
                number = int(value) if value.isdigit() else -1
                found = grpcwire.STATUS_BY_NUMBER.get(number)
                code = found if found is not None else StatusCode.UNKNOWN
            elif name == b"grpc-message":
                message = hpackcodec.percent_decode(value)
        if code is not StatusCode.OK:
            self._end(end, UpstreamError(code, message))
            return
        try:
            messages = grpcwire.Messages(self.upstream.max_message_bytes, True)
            bodies = messages.feed(b"".join(pending.data))
        except grpcwire.MessageTooLarge as exc:
            self._end(end, UpstreamError(StatusCode.RESOURCE_EXHAUSTED, f"{exc.size} bytes"))
            return
        if len(bodies) != 1 or bodies[0][0] or messages.incomplete:
            self._end(end, UpstreamError(StatusCode.INTERNAL, "not one uncompressed message"))
            return
        self._end(end, bodies[0][1])

    def on_data(self, conn: H2Connection, end: StreamEnd, data: bytes, end_stream: bool) -> None:
        conn.credit(end, len(data))
        pending = end.owner
        if isinstance(pending, _Pending):
            pending.data.append(data)
            if end_stream:
                self._end(end, UpstreamError(StatusCode.INTERNAL, "the plugin sent no status"))

    def on_reset(
        self, conn: H2Connection, end: StreamEnd, code: int, reason: str, by_peer: bool
    ) -> None:
        status = grpcwire.RST_STATUS.get(code, StatusCode.INTERNAL) if by_peer else None
        why = f"the plugin reset the stream (HTTP/2 code {code})" if by_peer else reason
        self._end(end, UpstreamError(status or StatusCode.INTERNAL, why))

    def on_sent(self, conn: H2Connection, end: StreamEnd, size: int) -> None:
        pass

    def on_goaway(self, conn: H2Connection, last_stream: int, code: int) -> None:
        why = f"the plugin refused the call with GOAWAY (HTTP/2 code {code})"
        for end in list(conn.streams.values()):
            if end.id > last_stream:
                self._end(end, UpstreamError(StatusCode.UNAVAILABLE, why))
        # New calls need a new connection: this one's end makes the watcher redial.
        if conn.transport is not None:
            conn.transport.close()

    def on_failed(self, conn: H2Connection, code: int, reason: str) -> None:
        self._fail_all(f"HTTP/2 error from the plugin: {reason}")
        asyncio.get_running_loop().call_soon(conn.close)


def _abandon(done: asyncio.Future[bytes]) -> None:
    """Nobody will read ``done``: an answer that came while the wait was given up (the
    plugin's own DEADLINE_EXCEEDED arrives with the proxy's timeout) is taken here, and a
    later one is not set at all, so asyncio reports no unretrieved exception."""
    if not done.done():
        done.cancel()
    elif not done.cancelled():
        done.exception()


__all__ = ["Upstream", "UpstreamError"]
