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

from plugproxy.core.endpoints import Endpoint
from plugproxy.relay.pairing import Pairing, RelayState

LISTEN_BACKLOG = 1024


class FrameRelay(RelayState):
    """Accepts CO connections; each becomes a :class:`Pairing` with its own plugin side.
    What the pairings share (routes, counts, limits) is its :class:`RelayState`."""

    # The listening server, once listen() has made it.
    _server: asyncio.AbstractServer | None = None

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


__all__ = ["FrameRelay"]
