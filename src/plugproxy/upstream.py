"""The connection to the plugin: one gRPC channel, its state, and clear errors when down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from plugproxy.api import UpstreamState
from plugproxy.endpoints import Endpoint
from plugproxy.log import Logger
from plugproxy.sockets import describe_connect_error

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


class Upstream:
    """Owns the channel to the plugin and watches its connectivity."""

    def __init__(
        self,
        endpoint: Endpoint,
        logger: Logger,
        max_message_bytes: int,
        credentials: grpc.ChannelCredentials | None = None,
        extra_options: Sequence[tuple[str, Any]] = (),
        channel_factory: Callable[[str, Sequence[tuple[str, Any]]], Any] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._logger = logger
        options = channel_options(endpoint, max_message_bytes, extra_options)
        if channel_factory is not None:
            # The transport builds the channel (e.g. one that follows rotated certificates).
            self.channel = channel_factory(endpoint.grpc_target, options)
        elif credentials is not None:
            self.channel = grpc.aio.secure_channel(endpoint.grpc_target, credentials, options)
        else:
            self.channel = grpc.aio.insecure_channel(endpoint.grpc_target, options)
        self._state = UpstreamState.DOWN
        self._reason = "not connected yet"
        self._watcher: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[UpstreamState], None]] = []
        self._ready = asyncio.Event()
        # For a tls:// upstream: why its handshakes fail, if anything says (plugproxy.tlslog).
        self.tls_hint: Callable[[str], str | None] | None = None

    @property
    def address(self) -> str:
        return self.endpoint.url

    @property
    def state(self) -> UpstreamState:
        return self._state

    @property
    def reason(self) -> str:
        # Read when asked: grpc reports a handshake failure just after the state changed.
        if self._state is UpstreamState.DOWN and self.tls_hint is not None:
            hint = self.tls_hint("")
            if hint:
                return f"{self._reason}: {hint}"
        return self._reason

    def add_listener(self, listener: Callable[[UpstreamState], None]) -> None:
        self._listeners.append(listener)
        listener(self._state)

    def start(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def wait_ready(self, timeout: float) -> bool:
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
        await self.channel.close()

    def _why_down(self) -> str:
        if self.endpoint.is_unix:
            return describe_connect_error(self.endpoint.path)
        return "connection failed"

    def _set(self, state: UpstreamState) -> None:
        if state is self._state and self._reason != "not connected yet":
            return
        first = self._reason == "not connected yet"
        self._state = state
        if state is UpstreamState.UP:
            self._reason = "ready"
            self._ready.set()
            self._logger.info("upstream ready", upstream=self.address)
        else:
            self._ready.clear()
            self._reason = self._why_down()
            self._logger.warning(
                "upstream unavailable" if not first else "upstream not reachable yet",
                upstream=self.address,
                reason=self._reason,
                retry="backoff up to 1s",
            )
        for listener in self._listeners:
            listener(state)

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
            elif state is grpc.ChannelConnectivity.IDLE and self._state is UpstreamState.UP:
                # The plugin closed the connection; only say so if reconnecting fails.
                pass
            await self.channel.wait_for_state_change(state)
            state = self.channel.get_state(try_to_connect=True)

    def channel_is_ready(self) -> bool:
        return self.channel.get_state() is grpc.ChannelConnectivity.READY

    def unavailable_details(self, details: str) -> str:
        """Name the upstream in an UNAVAILABLE that came from the connection, not the plugin,
        and for a tls:// upstream the likely cause."""
        hint = self.tls_hint(details) if self.tls_hint is not None else None
        more = f"; {hint}" if hint else ""
        return f"plugproxy: upstream {self.address} unavailable: {details}{more}"

    async def unary(
        self, method: str, request: bytes, timeout: float, metadata: Sequence[tuple[str, str]] = ()
    ) -> bytes:
        response: bytes = await self.channel.unary_unary(method)(
            request, timeout=timeout, metadata=tuple(metadata)
        )
        return response
