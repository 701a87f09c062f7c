"""The forwarder: relays every call, known or not, to the plugin as raw bytes.

Message bytes are never re-encoded, so unknown fields survive. Request metadata, response
headers and trailers, status code, message and details (grpc-status-details-bin travels in
the trailers), the remaining deadline and cancellation all cross unchanged. Known methods
run their stage chain (see :mod:`plugproxy.pipeline`); a method no stage wants takes the
passthrough path, which builds no Call object at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

try:  # see _write_upstream
    from grpc._cython.cygrpc import InternalError as _CoreInternalError
except ImportError:  # pragma: no cover - other grpc builds
    _CoreInternalError = None

from plugproxy.api import (
    Call,
    CallKind,
    LazyMessage,
    Metadata,
    MethodInfo,
    Reject,
    Stage,
    StatusCode,
    UpstreamError,
    UpstreamState,
)
from plugproxy.core.endpoints import Endpoint
from plugproxy.core.log import Logger
from plugproxy.pipeline import Chain, compile_chain
from plugproxy.relay.upstream import Upstream, answer_margin, deadline_ran_out
from plugproxy.spec.registry import Registry

# Transport-level headers: grpc sets its own on the upstream hop.
HOP_BY_HOP = frozenset(
    {
        "user-agent",
        "te",
        "content-type",
        "grpc-timeout",
        "grpc-encoding",
        "grpc-accept-encoding",
        "grpc-message-type",
    }
)

# grpc ships no type information; its server context is dynamically typed here.
ServicerContext = Any

# grpc core reads the plugin's grpc-status itself and hides the raw value: a number outside
# 0-16 becomes UNKNOWN with the plugin's message, indistinguishable from a real UNKNOWN.
# Trailers without any status, or with one core cannot parse, end with these messages of
# core's own, which a plugin's status does not carry (the frame relay sees every case).
_CORE_NO_STATUS = {
    (StatusCode.UNKNOWN, "No status received"): "",
    (StatusCode.UNKNOWN, "Stream removed (Data frame with END_STREAM flag received)"): "",
    (StatusCode.INTERNAL, "Stream removed (Error parsing 'grpc-status' metadata)"): "?",
}


def raw_status_of(code: StatusCode, details: str) -> str | None:
    """What the plugin's grpc-status was, as far as grpc core's answer tells (see
    Call.raw_status): "" for none, "?" for an unparsable one, None when core read one."""
    return _CORE_NO_STATUS.get((code, details))


def forwardable(metadata: Any) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in (metadata or ()) if k not in HOP_BY_HOP and not k.startswith(":")]


@dataclass(frozen=True, slots=True)
class _Method:
    info: MethodInfo
    chain: Chain | None
    upstream: Any  # the channel's multi-callable for this path


class _Relay:
    """What one call needs to answer the CO: status, headers sent or not."""

    __slots__ = ("headers_sent",)

    def __init__(self) -> None:
        self.headers_sent = False

    async def send_headers(self, context: ServicerContext, initial: Metadata | None) -> None:
        if not self.headers_sent:
            self.headers_sent = True
            if initial:
                await context.send_initial_metadata(initial)


class GrpcRelay(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc is untyped
    """A generic handler that answers every method path by forwarding it upstream."""

    def __init__(
        self,
        registry: Registry,
        upstream: GrpcUpstream,
        stages: list[Stage],
        logger: Logger,
        plugin_wait: float = 0.0,
    ) -> None:
        self.registry = registry
        self.upstream = upstream
        self.stages = stages
        self.logger = logger
        self.plugin_wait = plugin_wait
        self.active = 0  # calls between arrival and their status (the shutdown line's count)
        self._handlers: dict[str, grpc.RpcMethodHandler] = {
            info.path: self._handler(info) for info in registry.methods()
        }

    # grpc calls this once per incoming call to find the handler.
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        path: str = handler_call_details.method
        handler = self._handlers.get(path)
        if handler is None:
            info = self.registry.lookup(path)
            handler = self._handler(info)
            # Unknown methods are not cached: a CO sending random paths must not grow memory.
            # A method of a spec the registry lists on first use is, as the others are.
            if info.known:
                self._handlers[path] = handler
        return handler

    def _handler(self, info: MethodInfo) -> grpc.RpcMethodHandler:
        chain = compile_chain(self.stages, info, self.logger) if info.known else None
        channel = self.upstream.channel
        kind = info.kind
        if kind is CallKind.UNARY_UNARY:
            method = _Method(info, chain, channel.unary_unary(info.path))
            fn: Any = self._passthrough_unary if chain is None else self._unary_unary
            return grpc.unary_unary_rpc_method_handler(self._counted(fn, method))
        if kind is CallKind.UNARY_STREAM:
            method = _Method(info, chain, channel.unary_stream(info.path))
            return grpc.unary_stream_rpc_method_handler(
                self._counted_stream(self._unary_stream, method)
            )
        if kind is CallKind.STREAM_UNARY:
            method = _Method(info, chain, channel.stream_unary(info.path))
            return grpc.stream_unary_rpc_method_handler(self._counted(self._stream_unary, method))
        method = _Method(info, chain, channel.stream_stream(info.path))
        return grpc.stream_stream_rpc_method_handler(
            self._counted_stream(self._stream_stream, method)
        )

    # Made once per method (handlers are cached), so a call pays one frame for its count.
    def _counted(self, behavior: Callable[..., Any], method: _Method) -> Callable[..., Any]:
        async def counted(*args: Any) -> Any:
            self.active += 1
            try:
                return await behavior(method, *args)
            finally:
                self.active -= 1

        return counted

    def _counted_stream(
        self, behavior: Callable[..., AsyncIterator[Any]], method: _Method
    ) -> Callable[..., AsyncIterator[Any]]:
        async def counted(*args: Any) -> AsyncIterator[Any]:
            self.active += 1
            try:
                async for item in behavior(method, *args):
                    yield item
            finally:
                self.active -= 1

        return counted

    async def _await_plugin(self, remaining: float | None, timeout: float | None) -> None:
        """A call that finds the plugin unreachable waits for it: for --plugin-wait, and at
        most until just before its own deadline (as in the frame relay; plugproxy.relay.upstream
        says why). Still down then, it is answered here: raises UpstreamError UNAVAILABLE
        naming the upstream and why it cannot be reached. A channel still making its first
        connection, or reconnecting to a plugin that was up, lets the call go ahead."""
        upstream = self.upstream
        if upstream.channel_is_ready():
            return
        loop = asyncio.get_running_loop()
        since = loop.time()
        wait, before_deadline = self.plugin_wait, False
        if remaining is not None and timeout is not None:
            answer_in = remaining - answer_margin(timeout)
            if answer_in < wait:
                wait, before_deadline = max(0.0, answer_in), True
        if wait > 0 and await upstream.wait_ready(wait):
            return
        # Past --plugin-wait, a call to a tcp:// or tls:// plugin goes ahead: it fails at once,
        # and grpc's words for that (connection refused, the handshake's failure) say more
        # than the channel's state does. A UNIX socket's reason is read from the path itself.
        if upstream.is_down() and (before_deadline or upstream.endpoint.is_unix):
            details = upstream.unreachable_details(
                upstream.reason, loop.time() - since, before_deadline
            )
            raise UpstreamError(StatusCode.UNAVAILABLE, details)

    def _cancelled(self, context: ServicerContext, call: Call, waiting: bool) -> None:
        """grpc cancelled the call: at its deadline (the CO had its own DEADLINE_EXCEEDED,
        and says so in the log) or because the CO cancelled it. ``waiting``: it had not
        reached the plugin yet."""
        if deadline_ran_out(context.time_remaining(), call.timeout):
            upstream = self.upstream
            reason = upstream.reason if waiting and upstream.is_down() else None
            call.code = StatusCode.DEADLINE_EXCEEDED
            call.details = upstream.deadline_details(reason)
        else:
            call.code, call.details = StatusCode.CANCELLED, "cancelled by the caller"

    # -- errors ---------------------------------------------------------------------------

    def _upstream_error(self, err: grpc.aio.AioRpcError) -> tuple[StatusCode, str]:
        code, details = StatusCode.of(err.code()), err.details() or ""
        if code is StatusCode.UNAVAILABLE and not self.upstream.channel_is_ready():
            details = self.upstream.unavailable_details(details)
        elif code is StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
            details = f"plugproxy: plugin response exceeds --max-message-bytes: {details}"
        return code, details

    def _record_upstream_error(self, call: Call, err: grpc.aio.AioRpcError) -> None:
        """The plugin's status becomes the call's, unless a stage already answered it."""
        if call.rejected:
            return
        call.raw_status = raw_status_of(StatusCode.of(err.code()), err.details() or "")
        call.code, call.details = self._upstream_error(err)
        call.initial_metadata = tuple(err.initial_metadata() or ())
        call.trailing_metadata = tuple(err.trailing_metadata() or ())

    async def _abort(
        self,
        context: ServicerContext,
        relay: _Relay,
        code: StatusCode,
        details: str,
        initial: Metadata | None = None,
        trailing: Metadata | None = None,
    ) -> None:
        await relay.send_headers(context, tuple(initial or ()))
        await context.abort(grpc.StatusCode(code.value), details, tuple(trailing or ()))

    # -- unary → unary ----------------------------------------------------------------------

    async def _passthrough_unary(
        self, method: _Method, request: bytes, context: ServicerContext
    ) -> bytes:
        remaining = context.time_remaining()
        try:
            await self._await_plugin(remaining, remaining)
        except UpstreamError as unreachable:
            await self._abort(context, _Relay(), unreachable.code, unreachable.details)
        ucall = method.upstream(
            request,
            metadata=forwardable(context.invocation_metadata()),
            timeout=context.time_remaining(),
        )
        try:
            response: bytes = await ucall
        except grpc.aio.AioRpcError as err:
            code, details = self._upstream_error(err)
            await self._abort(
                context, _Relay(), code, details, err.initial_metadata(), err.trailing_metadata()
            )
            raise  # unreachable: abort raises
        except asyncio.CancelledError:
            ucall.cancel()
            raise
        initial = await ucall.initial_metadata()
        if initial:
            await context.send_initial_metadata(initial)
        trailing = await ucall.trailing_metadata()
        if trailing:
            context.set_trailing_metadata(trailing)
        return response

    def _new_call(self, method: _Method, context: ServicerContext) -> Call:
        md = tuple(context.invocation_metadata() or ())
        return Call(method.info, md, forwardable(md), context.time_remaining(), context.peer())

    async def _unary_unary(
        self, method: _Method, request: bytes, context: ServicerContext
    ) -> bytes:
        chain = method.chain
        assert chain is not None
        call = self._new_call(method, context)
        call.request = LazyMessage(request, method.info.request_class)
        call.request_count = 1
        relay = _Relay()
        response = b""
        ucall: Any = None
        try:
            try:
                await chain.run_start(call)
                await self._await_plugin(call.remaining_timeout(), call.timeout)
                ucall = method.upstream(
                    request, metadata=call.upstream_metadata, timeout=call.remaining_timeout()
                )
                try:
                    response = await ucall
                except asyncio.CancelledError:
                    ucall.cancel()
                    raise
                call.response = LazyMessage(response, method.info.response_class)
                call.response_count = 1
                call.initial_metadata = tuple(await ucall.initial_metadata() or ())
                call.trailing_metadata = tuple(await ucall.trailing_metadata() or ())
                chain.run_response(call, call.response)
            except Reject as rej:
                call.code, call.details, call.rejected = rej.code, rej.message, True
            except UpstreamError as unreachable:
                call.code, call.details = unreachable.code, unreachable.details
            except grpc.aio.AioRpcError as err:
                self._record_upstream_error(call, err)
        except asyncio.CancelledError:
            self._cancelled(context, call, ucall is None)
            raise
        finally:
            chain.run_finish(call)
        await self._end_stream(context, relay, call)
        return response

    # -- unary → stream ---------------------------------------------------------------------

    async def _unary_stream(
        self, method: _Method, request: bytes, context: ServicerContext
    ) -> AsyncIterator[bytes]:
        chain = method.chain
        call = self._new_call(method, context)
        call.request_count = 1
        if chain is not None:
            call.request = LazyMessage(request, method.info.request_class)
        relay = _Relay()
        response_class = method.info.response_class
        ucall: Any = None
        try:
            try:
                if chain is not None:
                    await chain.run_start(call)
                await self._await_plugin(call.remaining_timeout(), call.timeout)
                ucall = method.upstream(
                    request, metadata=call.upstream_metadata, timeout=call.remaining_timeout()
                )
                call.initial_metadata = tuple(await ucall.initial_metadata() or ())
                await relay.send_headers(context, call.initial_metadata)
                async for raw in ucall:
                    call.response_count += 1
                    if chain is not None and chain.response:
                        chain.run_response(call, LazyMessage(raw, response_class))
                    yield raw
                call.trailing_metadata = tuple(await ucall.trailing_metadata() or ())
            except Reject as rej:
                call.code, call.details, call.rejected = rej.code, rej.message, True
            except UpstreamError as unreachable:
                call.code, call.details = unreachable.code, unreachable.details
            except grpc.aio.AioRpcError as err:
                self._record_upstream_error(call, err)
        except (asyncio.CancelledError, GeneratorExit):
            self._cancelled(context, call, ucall is None)
            if ucall is not None:
                ucall.cancel()
            raise
        finally:
            if chain is not None:
                chain.run_finish(call)
        await self._end_stream(context, relay, call)

    async def _end_stream(self, context: ServicerContext, relay: _Relay, call: Call) -> None:
        """The call's status to the CO: an abort with the plugin's or a stage's status, or
        the plugin's headers and trailers."""
        if call.code is not StatusCode.OK:
            await self._abort(
                context,
                relay,
                call.code,
                call.details,
                call.initial_metadata,
                call.trailing_metadata,
            )
        await relay.send_headers(context, call.initial_metadata)
        if call.trailing_metadata:
            context.set_trailing_metadata(call.trailing_metadata)

    # -- stream → unary / stream ------------------------------------------------------------

    async def _pump(
        self, requests: AsyncIterator[bytes], ucall: Any, call: Call, chain: Chain | None
    ) -> None:
        """Copy the CO's request stream upstream; stops quietly when the upstream call ends."""
        request_class = call.method.request_class
        try:
            async for raw in requests:
                call.request_count += 1
                if chain is not None and chain.request:
                    chain.run_request(call, LazyMessage(raw, request_class))
                if not await _write_upstream(ucall, raw):
                    return
            await ucall.done_writing()
        except Reject as rej:
            call.code, call.details, call.rejected = rej.code, rej.message, True
            ucall.cancel()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            pass  # the upstream call ended; its status is read on the response side

    async def _stream_unary(
        self, method: _Method, requests: AsyncIterator[bytes], context: ServicerContext
    ) -> bytes:
        chain = method.chain
        call = self._new_call(method, context)
        relay = _Relay()
        response = b""
        pump: asyncio.Task[None] | None = None
        ucall: Any = None
        try:
            try:
                if chain is not None:
                    await chain.run_start(call)
                await self._await_plugin(call.remaining_timeout(), call.timeout)
                ucall = method.upstream(
                    metadata=call.upstream_metadata, timeout=call.remaining_timeout()
                )
                pump = asyncio.ensure_future(self._pump(requests, ucall, call, chain))
                response = await ucall
                call.response_count = 1
                call.initial_metadata = tuple(await ucall.initial_metadata() or ())
                call.trailing_metadata = tuple(await ucall.trailing_metadata() or ())
                if chain is not None and chain.response:
                    chain.run_response(call, LazyMessage(response, method.info.response_class))
            except Reject as rej:
                call.code, call.details, call.rejected = rej.code, rej.message, True
            except UpstreamError as unreachable:
                call.code, call.details = unreachable.code, unreachable.details
            except grpc.aio.AioRpcError as err:
                self._record_upstream_error(call, err)
        except asyncio.CancelledError:
            self._cancelled(context, call, ucall is None)
            if ucall is not None:
                ucall.cancel()
            raise
        finally:
            await _stop(pump)
            if chain is not None:
                chain.run_finish(call)
        await self._end_stream(context, relay, call)
        return response

    async def _stream_stream(
        self, method: _Method, requests: AsyncIterator[bytes], context: ServicerContext
    ) -> AsyncIterator[bytes]:
        chain = method.chain
        call = self._new_call(method, context)
        relay = _Relay()
        response_class = method.info.response_class
        pump: asyncio.Task[None] | None = None
        ucall: Any = None
        try:
            try:
                if chain is not None:
                    await chain.run_start(call)
                await self._await_plugin(call.remaining_timeout(), call.timeout)
                ucall = method.upstream(
                    metadata=call.upstream_metadata, timeout=call.remaining_timeout()
                )
                pump = asyncio.ensure_future(self._pump(requests, ucall, call, chain))
                call.initial_metadata = tuple(await ucall.initial_metadata() or ())
                await relay.send_headers(context, call.initial_metadata)
                while True:
                    raw = await ucall.read()
                    if raw is grpc.aio.EOF:
                        break
                    call.response_count += 1
                    if chain is not None and chain.response:
                        chain.run_response(call, LazyMessage(raw, response_class))
                    yield raw
                code = StatusCode.of(await ucall.code())
                call.trailing_metadata = tuple(await ucall.trailing_metadata() or ())
                if code is not StatusCode.OK and not call.rejected:
                    call.code, call.details = code, await ucall.details() or ""
                    call.raw_status = raw_status_of(call.code, call.details)
            except Reject as rej:
                call.code, call.details, call.rejected = rej.code, rej.message, True
            except UpstreamError as unreachable:
                call.code, call.details = unreachable.code, unreachable.details
            except grpc.aio.AioRpcError as err:
                self._record_upstream_error(call, err)
        except (asyncio.CancelledError, GeneratorExit):
            self._cancelled(context, call, ucall is None)
            if ucall is not None:
                ucall.cancel()
            raise
        finally:
            await _stop(pump)
            if chain is not None:
                chain.run_finish(call)
        await self._end_stream(context, relay, call)


async def _write_upstream(ucall: Any, raw: bytes) -> bool:
    """Write one request message upstream; False when the upstream call has already ended.

    grpc.aio's own ``write`` marks the call INTERNAL ("Internal error from Core") when a
    write races with the plugin ending the call, and that INTERNAL replaces the plugin's
    real status. Here a failed write only stops the pump; the status read on the response
    side stays the plugin's. Falls back to ``write`` if grpc's internals ever change.
    """
    cython_call = getattr(ucall, "_cython_call", None)
    metadata_sent = getattr(ucall, "_metadata_sent", None)
    if cython_call is None or metadata_sent is None or _CoreInternalError is None:
        await ucall.write(raw)
        return True
    if ucall.done():
        return False
    if not metadata_sent.is_set():
        await metadata_sent.wait()
        if ucall.done():
            return False
    try:
        await cython_call.send_serialized_message(raw)
    except _CoreInternalError:
        return False
    return True


async def _stop(task: asyncio.Task[None] | None) -> None:
    if task is None:
        return
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


# -- the upstream as a grpc channel -----------------------------------------------------

# Reconnect quickly and never back off longer than about a second (a restarted plugin
# should be served again at once), as csi-lib-utils' connection helper does. gRPC adds
# up to 20 % jitter, so the cap is 800 ms: a plugin back on its socket is reached in < 1 s.
RECONNECT_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 800),
    # A proxy must not pick up http_proxy from its environment for the plugin hop.
    ("grpc.enable_http_proxy", 0),
)


def channel_options(
    endpoint: Endpoint, max_message_bytes: int, extra: Sequence[tuple[str, Any]] = ()
) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        *RECONNECT_OPTIONS,
        *extra,
    ]
    if endpoint.is_unix:
        # Strict HTTP/2 servers reject a socket path as :authority.
        options.append(("grpc.default_authority", "localhost"))
    return options


class GrpcUpstream(Upstream):
    """The upstream of the gRPC relay: one grpc channel, whose connectivity is the state."""

    def __init__(
        self,
        endpoint: Endpoint,
        logger: Logger,
        max_message_bytes: int,
        credentials: grpc.ChannelCredentials | None = None,
        extra_options: Sequence[tuple[str, Any]] = (),
        channel_factory: Callable[[str, Sequence[tuple[str, Any]]], Any] | None = None,
    ) -> None:
        super().__init__(endpoint, logger, max_message_bytes)
        options = channel_options(endpoint, max_message_bytes, extra_options)
        if channel_factory is not None:
            # The transport builds the channel (e.g. one that follows rotated certificates).
            self.channel = channel_factory(endpoint.grpc_target, options)
        elif credentials is not None:
            self.channel = grpc.aio.secure_channel(endpoint.grpc_target, credentials, options)
        else:
            self.channel = grpc.aio.insecure_channel(endpoint.grpc_target, options)

    async def close(self) -> None:
        await super().close()
        await self.channel.close()

    async def _watch(self) -> None:
        state = self.channel.get_state(try_to_connect=True)
        while True:
            # CONNECTING and IDLE are passing states: one line per real change, no flood.
            if state is grpc.ChannelConnectivity.READY:
                self._set(UpstreamState.UP)
            elif state in (
                grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                grpc.ChannelConnectivity.SHUTDOWN,
            ):
                self._set(UpstreamState.DOWN)
            # IDLE after UP: the plugin closed the connection; only said if reconnecting fails.
            await self.channel.wait_for_state_change(state)
            state = self.channel.get_state(try_to_connect=True)

    def channel_is_ready(self) -> bool:
        return self.channel.get_state() is grpc.ChannelConnectivity.READY

    async def unary(
        self, method: str, request: bytes, timeout: float, metadata: Sequence[tuple[str, str]] = ()
    ) -> bytes:
        try:
            response: bytes = await self.channel.unary_unary(method)(
                request, timeout=timeout, metadata=tuple(metadata)
            )
        except grpc.aio.AioRpcError as err:
            raise UpstreamError(StatusCode.of(err.code()), err.details() or "") from None
        return response
