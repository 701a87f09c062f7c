"""The HTTP/2 frame relay: plugproxy's forwarder for plaintext sockets (unix://, tcp://).

The relay is two HTTP/2 endpoints joined by stream mapping: toward each CO it is a server,
toward the plugin a client (:mod:`plugproxy.relay.connection`), and only calls cross
between them (:mod:`plugproxy.relay.pairing`). A call costs a few frame copies instead of
a gRPC server call plus a gRPC client call (docs/performance.md has the measurements):

- Header blocks are decoded with each connection's own HPACK context, to learn the
  method, metadata, deadline and status, and re-encoded without a dynamic table
  (:mod:`plugproxy.relay.hpackcodec`). A call may wait in its stage chain (serialization,
  capability queries) or be answered by the proxy while later calls overtake it.
- Message bytes (DATA) are never re-encoded; unknown fields and unknown methods pass as
  they are. Status, message, details, headers and trailers pass unchanged; the deadline
  travels as the CO sent it, minus any time the call waited in the proxy.
- Every limit a peer could push against is in :mod:`plugproxy.relay.limits`.

The gRPC-level forwarder (:mod:`plugproxy.relay.grpcrelay`) stays for TLS endpoints, where
grpc owns the handshake and the identity checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from plugproxy.api import MethodInfo
from plugproxy.core.endpoints import Endpoint
from plugproxy.core.log import Logger
from plugproxy.pipeline import Chain, compile_chain
from plugproxy.relay.limits import DEFAULT_LIMITS, Limits
from plugproxy.relay.pairing import Pairing, PluginSide
from plugproxy.relay.upstream import Upstream
from plugproxy.spec.registry import Registry

LISTEN_BACKLOG = 1024
WARNING_INTERVAL = 10.0  # seconds between two warnings of the same kind


@dataclass(frozen=True, slots=True)
class Route:
    info: MethodInfo
    chain: Chain | None


class FrameRelay:
    """Accepts CO connections; each becomes a :class:`Pairing` with its own plugin side."""

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
        self._server: asyncio.AbstractServer | None = None
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


__all__ = ["FrameRelay", "Route"]
