"""How the proxy listens and dials: UNIX sockets, mutual TLS over TCP, and plain TCP.

The listen side and the upstream side each go through :class:`Transport`, so transport
security is decided in this one module. The specs leave securing a network hop to the
proxy that carries it (CSI v1.12 §Security, COSI v1alpha1 §Security, CMI §Security):

- ``tls://`` always means mutual TLS with grpc's own TLS (BoringSSL: TLS 1.2 minimum,
  TLS 1.3 preferred). The listen side requires a client certificate that chains to
  ``--tls-ca``; with ``--tls-allow-identity`` the certificate's DNS SAN, URI SAN (e.g. a
  SPIFFE ID) or subject CN must also be on the list, checked per call by a server
  interceptor so it covers every method, unknown ones included.
- ``tcp://`` (no TLS) is refused unless ``--insecure-tcp`` is given, and warned about at
  every start.
- Certificate, key and CA files are watched (:mod:`plugproxy.net.tlsfiles`). The listen side
  hands new material to grpc's per-handshake fetch callback
  (``grpc.dynamic_ssl_server_credentials``). grpc Python has no reloadable channel
  credentials, so the upstream side builds a new channel with the new material and sends
  new calls there, while calls in flight finish on the old channel, which is closed after
  ``--max-connection-age-grace``. ``--max-connection-age`` bounds how long one HTTP/2
  connection lives, so long-lived connections move to rotated certificates too.
- TCP connections on either side send keepalive pings (``--tcp-keepalive``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugproxy.core.endpoints import ConfigError, Endpoint, Scheme
from plugproxy.core.log import Logger
from plugproxy.core.options import Option, duration, options_of, setting

if TYPE_CHECKING:
    import grpc

    from plugproxy.net.tlsfiles import Material, TLSPaths, Watcher


@dataclass(frozen=True)
class TransportSettings:
    tls_ca: str | None = setting(
        "--tls-ca", "PEM CA bundle the peer's certificate must chain to", metavar="FILE"
    )
    tls_cert: str | None = setting(
        "--tls-cert", "PEM certificate (chain) this proxy presents", metavar="FILE"
    )
    tls_key: str | None = setting("--tls-key", "PEM private key of --tls-cert", metavar="FILE")
    tls_server_name: str | None = setting(
        "--tls-server-name",
        "name the tls:// upstream's certificate must carry (default: its host)",
        metavar="NAME",
    )
    tls_allow_identity: tuple[str, ...] = setting(
        "--tls-allow-identity",
        "client identity a tls:// listener accepts: DNS SAN, URI SAN (SPIFFE ID) or subject "
        "CN; prefix dns:, uri: or cn: to match one kind only (default: any CA-signed client)",
        repeatable=True,
        metavar="ID",
    )
    tls_reload_interval: float = setting(
        "--tls-reload-interval",
        "how often TLS files are checked for changes (0 = never)",
        default=1.0,
        type=duration,
        metavar="DURATION",
    )
    insecure_tcp: bool = setting(
        "--insecure-tcp",
        "allow tcp:// without TLS (calls and secrets cross the network in plaintext)",
        default=False,
        is_switch=True,
    )
    max_connection_age: float = setting(
        "--max-connection-age",
        "a TCP client connection is asked to reconnect after this long (0 = never)",
        default=3600.0,
        type=duration,
        metavar="DURATION",
    )
    max_connection_age_grace: float = setting(
        "--max-connection-age-grace",
        "calls in flight on an aged or replaced connection may take this long to finish",
        default=300.0,
        type=duration,
        metavar="DURATION",
    )
    tcp_keepalive: float = setting(
        "--tcp-keepalive",
        "interval of HTTP/2 keepalive pings on TCP connections (0 = off; at least 10s)",
        default=30.0,
        type=duration,
        metavar="DURATION",
    )


OPTIONS: list[Option] = options_of(TransportSettings)

_TLS_FLAGS = ("tls_ca", "tls_cert", "tls_key")


# grpc (its C core) and the TLS file handling (ssl) are loaded only when a configuration
# uses them: the frame relay on plaintext sockets needs neither.
def _grpc() -> Any:
    import grpc  # noqa: PLC0415

    return grpc


def load_or_config_error(paths: TLSPaths) -> Material:
    from plugproxy.net import tlsfiles  # noqa: PLC0415

    return tlsfiles.load_or_config_error(paths)


MIN_KEEPALIVE = 10.0
# The listen side accepts pings this often; below MIN_KEEPALIVE so any peer setting passes.
_MIN_PING_INTERVAL_MS = 5000


def _paths(settings: TransportSettings) -> TLSPaths:
    from plugproxy.net.tlsfiles import TLSPaths  # noqa: PLC0415

    ca, cert, key = settings.tls_ca, settings.tls_cert, settings.tls_key
    if not (ca and cert and key):
        raise ConfigError("tls:// needs --tls-ca, --tls-cert and --tls-key")
    return TLSPaths(ca, cert, key)


def check(settings: TransportSettings, listen: Endpoint, upstream: Endpoint) -> None:
    """Refuse transport settings that cannot work, before anything starts."""
    tls_sides = [
        f"{what} {ep}"
        for what, ep in (("--listen", listen), ("--upstream", upstream))
        if ep.scheme is Scheme.TLS
    ]
    given = [f"--{name.replace('_', '-')}" for name in _TLS_FLAGS if getattr(settings, name)]
    if tls_sides:
        missing = [
            f"--{name.replace('_', '-')}" for name in _TLS_FLAGS if not getattr(settings, name)
        ]
        if missing:
            raise ConfigError(
                f"{tls_sides[0]} needs {', '.join(missing)} (mutual TLS: CA, certificate, key)"
            )
        load_or_config_error(_paths(settings))
    elif given:
        raise ConfigError(
            f"{', '.join(given)} given but neither --listen nor --upstream is tls://host:port"
        )
    for what, ep in (("--listen", listen), ("--upstream", upstream)):
        if ep.scheme is Scheme.TCP and not settings.insecure_tcp:
            raise ConfigError(
                f"{what} {ep}: plain tcp:// sends calls and secrets unencrypted; use tls:// "
                "with --tls-ca/--tls-cert/--tls-key, or pass --insecure-tcp to accept that"
            )
    if settings.tls_allow_identity and listen.scheme is not Scheme.TLS:
        raise ConfigError(f"--tls-allow-identity needs a tls:// --listen, not {listen}")
    if settings.tls_server_name and upstream.scheme is not Scheme.TLS:
        raise ConfigError(f"--tls-server-name needs a tls:// --upstream, not {upstream}")
    for ident in settings.tls_allow_identity:
        parse_identity(ident)
    if settings.tcp_keepalive and settings.tcp_keepalive < MIN_KEEPALIVE:
        raise ConfigError(f"--tcp-keepalive must be 0 (off) or at least {MIN_KEEPALIVE:g}s")


# -- identities --------------------------------------------------------------------------

_KINDS = ("dns", "uri", "cn")


def parse_identity(raw: str) -> tuple[str | None, str]:
    """'dns:node-1.example' -> ('dns', 'node-1.example'); 'spiffe://td/x' -> (None, ...)."""
    text = raw.strip()
    if not text:
        raise ConfigError("--tls-allow-identity: empty identity")
    kind, sep, rest = text.partition(":")
    if sep and kind.lower() in _KINDS and not rest.startswith("//"):
        if not rest:
            raise ConfigError(f"--tls-allow-identity {raw!r}: nothing after {kind}:")
        return kind.lower(), rest
    return None, text


def presented_identities(auth_context: dict[str, list[bytes]]) -> list[tuple[str, str]]:
    """(kind, value) pairs from grpc's auth context: DNS and URI SANs, then subject CN."""
    out: list[tuple[str, str]] = []
    for key, kind in (("peer_dns", "dns"), ("peer_uri", "uri"), ("x509_common_name", "cn")):
        for value in auth_context.get(key, ()):
            out.append((kind, value.decode("utf-8", errors="replace")))
    return out


class IdentityPolicy:
    """Allow-list of client identities; the decision is a set lookup per presented name."""

    def __init__(self, allowed: Sequence[str]) -> None:
        self.any_kind: frozenset[str] = frozenset(
            v for k, v in map(parse_identity, allowed) if k is None
        )
        self.by_kind: frozenset[tuple[str, str]] = frozenset(
            (k, v) for k, v in map(parse_identity, allowed) if k is not None
        )

    def allows(self, identities: Sequence[tuple[str, str]]) -> bool:
        return any(v in self.any_kind or (k, v) in self.by_kind for k, v in identities)


def _describe(identities: Sequence[tuple[str, str]]) -> list[str]:
    return [f"{kind}:{value}" for kind, value in identities]


class _DenialLog:
    """One log line per denied identity set and window; repeats are counted, not printed."""

    WINDOW = 10.0

    def __init__(self, logger: Logger) -> None:
        self._logger = logger
        self._last: dict[tuple[str, ...], tuple[float, int]] = {}

    def denied(self, code: str, identities: list[str], peer: str, method: str) -> None:
        key = (code, *identities)
        now = time.monotonic()
        last, suppressed = self._last.get(key, (0.0, 0))
        if now - last < self.WINDOW:
            self._last[key] = (last, suppressed + 1)
            return
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = (now, 0)
        self._logger.warning(
            "tls client refused",
            code=code,
            reason="identity not on --tls-allow-identity"
            if identities
            else "no client certificate identity",
            presented=identities,
            peer=peer,
            method=method,
            repeats_suppressed=suppressed,
        )


class IdentityInterceptor:
    """Checks every call's client certificate identity before any handler runs."""

    def __init__(self, policy: IdentityPolicy, logger: Logger) -> None:
        self.policy = policy
        self._log = _DenialLog(logger)

    async def check(self, context: Any, method: str) -> None:
        auth = context.auth_context() or {}
        identities = presented_identities(auth)
        if auth.get("transport_security_type") != [b"ssl"] or not identities:
            self._log.denied("UNAUTHENTICATED", [], context.peer(), method)
            await context.abort(
                _grpc().StatusCode.UNAUTHENTICATED,
                "plugproxy: a client certificate with a DNS SAN, URI SAN or CN is required",
            )
        if not self.policy.allows(identities):
            names = _describe(identities)
            self._log.denied("PERMISSION_DENIED", names, context.peer(), method)
            await context.abort(
                _grpc().StatusCode.PERMISSION_DENIED,
                f"plugproxy: client identity {', '.join(names)} is not on --tls-allow-identity",
            )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None
        return self._wrap(handler, details.method)

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        check = self.check
        ser, deser = handler.response_serializer, handler.request_deserializer
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: Any) -> Any:
                await check(context, method)
                return await inner_uu(request, context)

            return _grpc().unary_unary_rpc_method_handler(unary_unary, deser, ser)
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary

            async def stream_unary(requests: Any, context: Any) -> Any:
                await check(context, method)
                return await inner_su(requests, context)

            return _grpc().stream_unary_rpc_method_handler(stream_unary, deser, ser)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                await check(context, method)
                async for item in inner_us(request, context):
                    yield item

            return _grpc().unary_stream_rpc_method_handler(unary_stream, deser, ser)
        inner_ss = handler.stream_stream

        async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            await check(context, method)
            async for item in inner_ss(requests, context):
                yield item

        return _grpc().stream_stream_rpc_method_handler(stream_stream, deser, ser)


# -- upstream channel that follows rotated credentials ------------------------------------


class _MultiCallable:
    """Stable stand-in for a channel's multi-callable; each call goes to the newest channel."""

    __slots__ = ("_callable", "_generation", "_kind", "_method", "_owner")

    def __init__(self, owner: ReloadingChannel, kind: str, method: str) -> None:
        self._owner = owner
        self._kind = kind
        self._method = method
        self._generation = -1
        self._callable: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = self._owner
        if self._generation != owner.generation:
            self._callable = getattr(owner.current, self._kind)(self._method)
            self._generation = owner.generation
        return self._callable(*args, **kwargs)


class ReloadingChannel:
    """The parts of grpc.aio.Channel the proxy uses, over a channel replaced on rotation.

    New calls use the newest channel; calls in flight finish on the channel they started
    on, which is closed once they are done or after the grace period.
    """

    def __init__(
        self,
        target: str,
        options: Sequence[tuple[str, Any]],
        credentials: grpc.ChannelCredentials,
        grace: float,
        logger: Logger,
    ) -> None:
        self._target = target
        self._options = list(options)
        self._grace = grace
        self._logger = logger
        self.current: Any = _grpc().aio.secure_channel(target, credentials, self._options)
        self.generation = 0
        self._swapped = asyncio.Event()
        self._retiring: set[asyncio.Task[None]] = set()

    def replace(self, credentials: grpc.ChannelCredentials) -> None:
        """Send new calls over a new channel built with these credentials."""
        old = self.current
        self.current = _grpc().aio.secure_channel(self._target, credentials, self._options)
        self.generation += 1
        swapped, self._swapped = self._swapped, asyncio.Event()
        swapped.set()
        task = asyncio.get_running_loop().create_task(old.close(self._grace))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    @property
    def retiring(self) -> int:
        return len(self._retiring)

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> _MultiCallable:
        return _MultiCallable(self, "unary_unary", method)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> _MultiCallable:
        return _MultiCallable(self, "unary_stream", method)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> _MultiCallable:
        return _MultiCallable(self, "stream_unary", method)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> _MultiCallable:
        return _MultiCallable(self, "stream_stream", method)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.current.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed: grpc.ChannelConnectivity) -> None:
        """Returns on a state change of the current channel, or when it is replaced."""
        change = asyncio.ensure_future(self.current.wait_for_state_change(last_observed))
        swap = asyncio.ensure_future(self._swapped.wait())
        try:
            await asyncio.wait((change, swap), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (change, swap):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    async def channel_ready(self) -> None:
        await self.current.channel_ready()

    async def close(self, grace: float | None = None) -> None:
        await self.current.close(grace)
        for task in list(self._retiring):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


# -- the transport ------------------------------------------------------------------------


def _keepalive(settings: TransportSettings) -> list[tuple[str, Any]]:
    if not settings.tcp_keepalive:
        return []
    interval_ms = int(settings.tcp_keepalive * 1000)
    return [
        ("grpc.keepalive_time_ms", interval_ms),
        ("grpc.keepalive_timeout_ms", min(interval_ms, 20000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def channel_credentials(material: Material) -> grpc.ChannelCredentials:
    return _grpc().ssl_channel_credentials(material.ca, material.key, material.cert)


def server_certificate_configuration(material: Material) -> Any:
    return _grpc().ssl_server_certificate_configuration(
        [(material.key, material.cert)], material.ca
    )


class Transport:
    """Listen and upstream security for one proxy, built from checked settings."""

    def __init__(
        self,
        settings: TransportSettings,
        listen: Endpoint,
        upstream: Endpoint,
        logger: Logger,
        socket_mode: int = 0o660,
    ) -> None:
        self.settings = settings
        self.socket_mode = socket_mode
        self.listen = listen
        self.upstream = upstream
        self.logger = logger
        self.watcher: Watcher | None = None
        self.paths: TLSPaths | None = None
        self.channel: ReloadingChannel | None = None
        self._server_lock = threading.Lock()
        self._server_generation = 0
        self._server_served = 0
        self._server_config: Any = None
        self.uses_tls = Scheme.TLS in (listen.scheme, upstream.scheme)
        if self.uses_tls:
            self.paths = paths = _paths(settings)
            material = load_or_config_error(paths)
            from plugproxy.net.tlsfiles import Watcher  # noqa: PLC0415

            self.watcher = Watcher(paths, material, logger, settings.tls_reload_interval)
            self.watcher.add_listener(self._on_new_material)

    @property
    def material(self) -> Material | None:
        return self.watcher.material if self.watcher is not None else None

    # upstream side

    def channel_options(self) -> list[tuple[str, Any]]:
        if self.upstream.is_unix:
            return []
        options = _keepalive(self.settings)
        if self.upstream.scheme is Scheme.TLS:
            # A private subchannel pool: a replaced channel must not reuse an old connection.
            options.append(("grpc.use_local_subchannel_pool", 1))
            if self.settings.tls_server_name:
                options.append(("grpc.ssl_target_name_override", self.settings.tls_server_name))
        return options

    def make_channel(self, target: str, options: Sequence[tuple[str, Any]]) -> Any:
        """The upstream channel: insecure for unix:// and tcp://, reloading for tls://."""
        material = self.material
        if self.upstream.scheme is not Scheme.TLS or material is None:
            return _grpc().aio.insecure_channel(target, list(options))
        self.channel = ReloadingChannel(
            target,
            options,
            channel_credentials(material),
            self.settings.max_connection_age_grace,
            self.logger,
        )
        return self.channel

    # listen side

    def server_options(self) -> list[tuple[str, Any]]:
        if self.listen.is_unix:
            return []
        options = _keepalive(self.settings)
        if options:
            options += [("grpc.http2.min_ping_interval_without_data_ms", _MIN_PING_INTERVAL_MS)]
        if self.settings.max_connection_age:
            options += [
                ("grpc.max_connection_age_ms", int(self.settings.max_connection_age * 1000)),
                (
                    "grpc.max_connection_age_grace_ms",
                    int(self.settings.max_connection_age_grace * 1000),
                ),
            ]
        return options

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        if self.listen.scheme is Scheme.TLS and self.settings.tls_allow_identity:
            # A virtual subclass: grpc checks isinstance, and this module loads without grpc.
            _grpc().aio.ServerInterceptor.register(IdentityInterceptor)
            return [
                IdentityInterceptor(IdentityPolicy(self.settings.tls_allow_identity), self.logger)
            ]
        return []

    def add_listen_port(self, server: grpc.aio.Server) -> int:
        """Bind the listen endpoint; UNIX sockets are created with --socket-mode."""
        listen = self.listen
        if listen.is_unix:
            old = os.umask(0o777 & ~self.socket_mode)
            try:
                return int(server.add_insecure_port(listen.grpc_target))
            finally:
                os.umask(old)
        material = self.material
        try:
            if listen.scheme is Scheme.TLS and material is not None:
                self._server_config = server_certificate_configuration(material)
                credentials = _grpc().dynamic_ssl_server_credentials(
                    self._server_config,
                    self._fetch_server_config,
                    require_client_authentication=True,
                )
                port = int(server.add_secure_port(listen.grpc_target, credentials))
            else:
                port = int(server.add_insecure_port(listen.grpc_target))
        except RuntimeError:  # newer grpc raises where older ones returned 0
            port = 0
        if port == 0:
            raise ConfigError(f"--listen {listen}: cannot bind (address in use or not permitted)")
        return port

    def _fetch_server_config(self) -> Any:
        # Called by grpc core before each handshake, on one of its threads: no I/O here.
        with self._server_lock:
            if self._server_served == self._server_generation:
                return None
            self._server_served = self._server_generation
            return self._server_config

    def _on_new_material(self, material: Material) -> None:
        if self.listen.scheme is Scheme.TLS:
            config = server_certificate_configuration(material)
            with self._server_lock:
                self._server_config = config
                self._server_generation += 1
        if self.channel is not None:
            self.channel.replace(channel_credentials(material))

    # lifecycle

    def start(self) -> None:
        insecure = [
            f"{what}={ep}"
            for what, ep in (("listen", self.listen), ("upstream", self.upstream))
            if ep.scheme is Scheme.TCP
        ]
        if insecure:
            self.logger.warning(
                "insecure tcp: calls and secrets cross the network unencrypted",
                endpoints=insecure,
                flag="--insecure-tcp",
            )
        material = self.material
        if self.watcher is not None and material is not None:
            self.logger.info(
                "tls enabled",
                listen=self.listen.url if self.listen.scheme is Scheme.TLS else "",
                upstream=self.upstream.url if self.upstream.scheme is Scheme.TLS else "",
                cert_sha256=material.cert_fingerprint,
                ca_certificates=material.ca_count,
                allow_identities=list(self.settings.tls_allow_identity) or "any CA-signed",
                reload_interval_seconds=self.settings.tls_reload_interval,
            )
            self.watcher.start()

    async def stop(self) -> None:
        if self.watcher is not None:
            await self.watcher.stop()
