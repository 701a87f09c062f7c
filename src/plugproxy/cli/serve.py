"""`plugproxy serve`: wire the registry, upstream, stages, forwarder and admin server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, disable_created_metrics

from plugproxy import __version__, pipeline
from plugproxy.admin import readiness
from plugproxy.admin import server as admin
from plugproxy.admin.readiness import ReadinessSettings
from plugproxy.api import AdminHandler, Runtime, Stage, UpstreamState
from plugproxy.cli.flags import OneLineParser, add_options, settings_from
from plugproxy.core.endpoints import ConfigError, Endpoint, Scheme, parse_endpoint
from plugproxy.core.log import LEVELS, Logger
from plugproxy.core.options import (
    SIZE_HELP,
    Option,
    Origins,
    byte_size,
    duration,
    group,
    octal_mode,
    options_of,
    setting,
)
from plugproxy.net import transport
from plugproxy.net.sockets import ListenSocket, restrict_socket
from plugproxy.net.transport import TransportSettings
from plugproxy.pipeline import StageSettings
from plugproxy.relay.framerelay import FrameRelay
from plugproxy.relay.upstream import Upstream
from plugproxy.spec.registry import SPEC_ALIASES, SPEC_NAMES, Registry, canonical_spec
from plugproxy.stages.metrics import register_process_metrics

if TYPE_CHECKING:
    import grpc

    from plugproxy.net.tlslog import TlsDiagnostics
    from plugproxy.relay.grpcrelay import GrpcRelay

# After a second signal, how long the rest of the shutdown (stages flushing, the admin
# server, the upstream) may take before the process exits anyway.
STOP_NOW_WAIT = 3.0

# grpc (its C core) and the TLS modules are imported only by a configuration that uses
# them (--relay grpc, tls://): a proxy runs beside every plugin on every node, and grpc
# alone was a quarter of its resident memory.


@dataclass(frozen=True)
class ServeSettings:
    """Everything `plugproxy serve` is configured with: its own options, and its parts'."""

    listen: str | None = setting(
        "--listen", "where COs connect: unix:///path, tcp://host:port or tls://host:port"
    )
    upstream: str | None = setting(
        "--upstream", "the plugin: unix:///path, tcp://host:port or tls://host:port"
    )
    spec: str = setting(
        "--spec",
        "which spec to decode calls with; auto picks by each method's package",
        default="auto",
        choices=("auto", *SPEC_NAMES, *SPEC_ALIASES),
    )
    descriptor_set: tuple[str, ...] = setting(
        "--descriptor-set",
        "also decode, judge and redact the services of this binary FileDescriptorSet (protoc "
        "--include_imports --descriptor_set_out, or buf build -o); see docs/any-plugin.md",
        default=[],
        repeatable=True,
        metavar="FILE",
    )
    max_message_bytes: int = setting(
        "--max-message-bytes",
        f"largest message accepted in either direction ({SIZE_HELP})",
        default=16 * 1024 * 1024,
        type=byte_size,
        metavar="SIZE",
    )
    socket_mode: int = setting(
        "--socket-mode",
        "file mode of the UNIX listen socket",
        default=0o660,
        type=octal_mode,
        metavar="MODE",
    )
    shutdown_grace: float = setting(
        "--shutdown-grace",
        "on SIGTERM/SIGINT, how long calls in flight may take to finish (a second signal "
        "ends them at once)",
        default=30.0,
        type=duration,
        metavar="DURATION",
    )
    max_concurrent_calls: int = setting(
        "--max-concurrent-calls",
        "calls in flight beyond this get RESOURCE_EXHAUSTED instead of exhausting memory",
        default=10000,
        type=int,
        metavar="N",
    )
    plugin_wait: float = setting(
        "--plugin-wait",
        "how long a call may wait for a plugin that cannot be reached (at most its own "
        "deadline), so sidecars started before the plugin come up; 0 fails such calls at once",
        default=60.0,
        type=duration,
        metavar="DURATION",
    )
    listen_when: str = setting(
        "--listen-when",
        "when the listen socket is created: plugin-up (once the plugin has answered for the "
        "first time, then kept; sidecars started before the plugin wait for the socket as "
        "they would for the plugin's own) or start (at once; calls wait per --plugin-wait)",
        default="plugin-up",
        choices=("plugin-up", "start"),
    )
    listen_wait: float = setting(
        "--listen-wait",
        "when another process listens on the UNIX listen path, wait this long for it to "
        "leave (a rolling update's old proxy draining) before refusing; 0 refuses at once",
        default=0.0,
        type=duration,
        metavar="DURATION",
    )
    admin_listen: str = setting(
        "--admin-listen",
        "admin HTTP server for /healthz, /readyz, /metrics and /violations (HOST:PORT or off)",
        default="127.0.0.1:9808",
        metavar="HOST:PORT",
    )
    relay: str = setting(
        "--relay",
        "how calls are relayed: frames (HTTP/2 frame relay, plaintext sockets only), grpc "
        "(a gRPC server and client; needed for tls://), auto (frames unless TLS is used)",
        default="auto",
        choices=("auto", "frames", "grpc"),
    )
    event_loop: str = setting(
        "--event-loop",
        "the event loop: asyncio (the standard library's), uvloop (libuv), auto (uvloop "
        "where it is installed, else asyncio); see docs/performance.md for the choice",
        # The frame relay's time is in its own Python, not the loop's transports: uvloop
        # measured no faster here and costs 2.4 MiB of resident memory on every node.
        default="asyncio",
        choices=("auto", "asyncio", "uvloop"),
    )
    log_format: str = setting(
        "--log-format", "log line format", default="json", choices=("json", "text")
    )
    log_level: str = setting(
        "--log-level", "lowest level logged", default="info", choices=tuple(LEVELS)
    )
    transport: TransportSettings = group(TransportSettings)
    readiness: ReadinessSettings = group(ReadinessSettings)
    stages: StageSettings = group(StageSettings)
    origins: Origins = field(default_factory=Origins)  # what an error calls a setting


CORE_OPTIONS: list[Option] = options_of(ServeSettings)


def loop_factory(ns: argparse.Namespace) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The --event-loop choice as a loop factory; None is asyncio's own loop."""
    choice = getattr(ns, "event_loop", "asyncio")
    if choice == "asyncio":
        return None
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "--event-loop uvloop: uvloop is not installed (pip install uvloop); "
                "--event-loop asyncio uses the standard library's loop"
            ) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def all_options() -> list[Option]:
    return [*CORE_OPTIONS, *transport.OPTIONS, *readiness.OPTIONS, *pipeline.stage_options()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `serve` subcommand's options (with their PLUGPROXY_* environment defaults)."""
    add_options(parser, all_options())


def parse_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Parse `serve` arguments on their own."""
    parser = OneLineParser(prog="plugproxy serve")
    add_options(parser, all_options(), environ)
    return parser.parse_args(list(argv))


def parse_settings(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> ServeSettings:
    """`serve` arguments, with their environment twins, as settings (the demos and tests
    build proxies this way)."""
    return settings_from(ServeSettings, parse_args(argv, environ))


@dataclass
class Resolved:
    """What the settings resolve to; building this is where misconfiguration fails fast."""

    listen: Endpoint
    upstream: Endpoint
    specs: tuple[str, ...]
    admin: tuple[str, int] | None
    relay: str = "grpc"  # "frames" or "grpc", decided from --relay and the endpoints
    extra: dict[str, object] = field(default_factory=dict)


def resolve(settings: ServeSettings) -> Resolved:
    names = settings.origins
    if not settings.listen:
        raise ConfigError("--listen is required (or PLUGPROXY_LISTEN)")
    if not settings.upstream:
        raise ConfigError("--upstream is required (or PLUGPROXY_UPSTREAM)")
    listen = parse_endpoint(settings.listen, names.name("--listen"))
    upstream = parse_endpoint(settings.upstream, names.name("--upstream"))
    if listen.is_unix and upstream.is_unix and listen.path == upstream.path:
        raise ConfigError(f"--listen and --upstream are the same socket {listen.path}")
    if settings.max_concurrent_calls <= 0:
        raise ConfigError("--max-concurrent-calls must be positive")
    transport.check(settings.transport, listen, upstream)
    specs = SPEC_NAMES if settings.spec == "auto" else (canonical_spec(settings.spec),)
    uses_tls = Scheme.TLS in (listen.scheme, upstream.scheme)
    relay = settings.relay
    if relay == "frames" and uses_tls:
        raise ConfigError("--relay frames relays plaintext sockets only; tls:// needs --relay grpc")
    if relay == "auto":
        relay = "grpc" if uses_tls else "frames"
    admin_at = admin.parse_admin_listen(settings.admin_listen, names.name("--admin-listen"))
    return Resolved(listen, upstream, specs, admin_at, relay)


class ProxyServer:
    """One running proxy: usable in-process (tests, demo) and by `plugproxy serve`."""

    def __init__(
        self,
        settings: ServeSettings,
        logger: Logger | None = None,
        stages: list[Stage] | None = None,
    ) -> None:
        self.settings = settings
        self.resolved = resolve(settings)
        self.logger = logger or Logger(fmt=settings.log_format, level=settings.log_level)
        serialization = settings.stages.serialization
        self.registry = Registry(
            self.resolved.specs,
            settings.descriptor_set,
            serialization.serialize_key,
            sources={
                flag: settings.origins.name(flag)
                for flag in ("--descriptor-set", "--serialize-key")
            },
            # A bundled spec costs its pool, rule tables and plans only once a call uses it.
            lazy=True,
        )
        self.transport = transport.Transport(
            settings.transport,
            self.resolved.listen,
            self.resolved.upstream,
            self.logger,
            settings.socket_mode,
        )
        if self.resolved.relay == "frames":
            self.upstream = Upstream(
                self.resolved.upstream, self.logger, settings.max_message_bytes
            )
        else:
            from plugproxy.relay.grpcrelay import GrpcUpstream  # noqa: PLC0415

            self.upstream = GrpcUpstream(
                self.resolved.upstream,
                self.logger,
                settings.max_message_bytes,
                extra_options=self.transport.channel_options(),
                channel_factory=self.transport.make_channel,
            )
        # No `_created` sample beside each counter and histogram: nothing reads them, and they
        # double the series a scrape carries.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        # A tls:// endpoint: grpc's handshake failures become log lines and hints (run()
        # routes standard error through it; an in-process server only gets the hints).
        self.tls_diagnostics: TlsDiagnostics | None = None
        upstream_url = self.resolved.upstream
        listen_tls = self.resolved.listen.scheme is Scheme.TLS
        if listen_tls or upstream_url.scheme is Scheme.TLS:
            from plugproxy.net.tlslog import TlsDiagnostics  # noqa: PLC0415

            self.tls_diagnostics = TlsDiagnostics(
                self.logger,
                listen_tls,
                upstream_url.url if upstream_url.scheme is Scheme.TLS else None,
            )
            self.upstream.tls_hint = self.tls_diagnostics.hint
        self.metrics = CollectorRegistry()
        self.runtime = Runtime(
            registry=self.registry, upstream=self.upstream, logger=self.logger, metrics=self.metrics
        )
        self.runtime.readiness_checks.append(self._upstream_ready)
        register_process_metrics(self.metrics, self.upstream)
        # `stages` replaces the configured pipeline (embedding and tests of the seam itself).
        self.stages: list[Stage] = (
            stages if stages is not None else pipeline.build_stages(settings.stages, self.runtime)
        )
        self.proxy: GrpcRelay | None = None
        self.relay: FrameRelay | None = None
        if self.resolved.relay == "frames":
            self.relay = FrameRelay(
                self.registry,
                self.upstream,
                self.stages,
                self.logger,
                max_message_bytes=settings.max_message_bytes,
                max_concurrent_calls=settings.max_concurrent_calls,
                plugin_wait=settings.plugin_wait,
            )
        else:
            from plugproxy.relay.grpcrelay import GrpcRelay, GrpcUpstream  # noqa: PLC0415

            assert isinstance(self.upstream, GrpcUpstream)
            self.proxy = GrpcRelay(
                self.registry, self.upstream, self.stages, self.logger, settings.plugin_wait
            )
        self.server: grpc.aio.Server | None = None
        self.admin: admin.AdminServer | None = None
        self.port = 0
        listen = self.resolved.listen
        self.socket = ListenSocket(listen.path) if listen.is_unix else None
        self.listening = False
        self.stopping = False
        self.runtime.readiness_checks.append(self._listen_ready)

    def _upstream_ready(self) -> tuple[bool, str]:
        if self.upstream.state is UpstreamState.UP:
            return True, "upstream ready"
        return False, f"upstream {self.upstream.address}: {self.upstream.reason}"

    def _listen_ready(self) -> tuple[bool, str]:
        where = self.resolved.listen.url
        if self.stopping:
            return False, "shutting down: no longer accepting calls"
        if self.socket is not None and self.socket.waiting_for_holder:
            return False, f"not listening yet: another process listens on {where}"
        if not self.listening:
            return False, f"not listening on {where} yet: waiting for the plugin to answer"
        if self.socket is not None and not self.socket.is_ours():
            return False, f"listen socket {self.socket.path} was removed or replaced"
        return True, "listening"

    def _healthz(self) -> tuple[int, str, bytes]:
        """Alive while waiting to listen; once listening, only while the socket file is still
        ours: kubelet empties its device plugin directory when it restarts, and a proxy
        listening there would go on accepting nothing, so a restart makes the socket again."""
        if self.socket is not None and self.listening and not self.socket.is_ours():
            why = f"listen socket {self.socket.path} was removed or replaced; restart to listen"
            return 503, "text/plain; charset=utf-8", why.encode()
        return admin.healthz()

    async def start(self) -> None:
        """Admin and upstream at once; the listener once the plugin has answered (with
        --listen-when plugin-up). Returns when calls are accepted."""
        self.upstream.start()
        self._start_admin()
        for stage in self.stages:
            await stage.startup()
        # A missing directory, a file in the way or a live listener fails now, not once the
        # plugin is up; the path is claimed again when the socket is made.
        await self._claim_path()
        if self.settings.listen_when == "plugin-up":
            if self.upstream.state is not UpstreamState.UP:
                self.logger.info(
                    "waiting for the plugin before listening",
                    listen=self.resolved.listen.url,
                    upstream=self.upstream.address,
                )
            await self.upstream.wait_ready(None)
        await self._listen()
        self.logger.info(
            "plugproxy listening",
            version=__version__,
            listen=self.resolved.listen.url,
            upstream=self.upstream.address,
            stages=[s.name for s in self.stages],
            relay=self.resolved.relay,
            event_loop=type(asyncio.get_running_loop()).__module__.split(".", 1)[0],
            admin=f"{self.resolved.admin[0]}:{self.admin.port}"
            if self.admin and self.resolved.admin
            else "off",
        )

    async def _claim_path(self) -> None:
        if self.socket is not None:
            await self.socket.claim(
                self.settings.listen_wait,
                on_busy=lambda: self.logger.warning(
                    "another process listens on the listen path; waiting for it to leave",
                    listen=self.resolved.listen.url,
                    wait_seconds=self.settings.listen_wait,
                ),
            )

    async def _listen(self) -> None:
        listen = self.resolved.listen
        await self._claim_path()
        if self.relay is not None:
            try:
                self.port = await self.relay.listen(listen, self.settings.socket_mode)
            except OSError as exc:
                raise ConfigError(f"cannot listen on {listen.url}: {exc.strerror or exc}") from None
        else:
            await self._start_grpc_server()
        self.transport.start()
        if self.socket is not None:
            restrict_socket(listen.path, self.settings.socket_mode)
            self.socket.bound()
        self.listening = True

    def _start_admin(self) -> None:
        diagnostics = self.tls_diagnostics
        paths = self.transport.paths
        if diagnostics is not None and paths and self.resolved.upstream.scheme is Scheme.TLS:
            from plugproxy.net.tlslog import UpstreamTls  # noqa: PLC0415

            up = self.resolved.upstream
            diagnostics.watch_upstream(
                UpstreamTls(
                    up.host,
                    up.port,
                    self.settings.transport.tls_server_name or up.host,
                    paths.ca,
                    paths.cert,
                    paths.key,
                ),
                lambda: self.upstream.state is not UpstreamState.UP,
            )
        probe = readiness.from_settings(
            self.settings.readiness, self.upstream, self.registry.specs, asyncio.get_running_loop()
        )
        if probe is not None:
            self.runtime.readiness_checks.append(probe.check)
        routes = self.admin_routes()
        if self.resolved.admin is not None:
            host, port = self.resolved.admin
            self.admin = admin.AdminServer(host, port, routes, self.logger)
            self.admin.start()

    def admin_routes(self) -> dict[str, AdminHandler]:
        """Every path the admin server answers: the stages' (/violations while validation
        is on) and the proxy's own. docs/observability.md lists them; a test holds the two
        together. Called on the proxy's event loop."""
        routes = self.runtime.admin_routes
        routes.setdefault("/healthz", self._healthz)
        routes.setdefault("/readyz", admin.readiness(self.runtime.readiness_checks))
        routes.setdefault("/metrics", admin.metrics(self.metrics))
        routes.setdefault("/debug/tasks", _task_count(asyncio.get_running_loop()))
        return routes

    async def _start_grpc_server(self) -> None:
        import grpc  # noqa: PLC0415

        size = self.settings.max_message_bytes
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", size),
                ("grpc.max_send_message_length", size),
                ("grpc.so_reuseport", 0),  # a second proxy on the same port must fail, not share
                *self.transport.server_options(),
            ],
            interceptors=self.transport.server_interceptors(),
            maximum_concurrent_rpcs=self.settings.max_concurrent_calls,
        )
        self.server.add_generic_rpc_handlers([self.proxy])
        self.port = self.transport.add_listen_port(self.server)
        await self.server.start()

    def calls_in_flight(self) -> int:
        """Calls between arrival and their status, on either relay."""
        if self.relay is not None:
            return self.relay.active
        return self.proxy.active if self.proxy is not None else 0

    async def stop_now(self) -> None:
        """End the calls in flight at once (a second signal while :meth:`stop` drains them):
        the CO gets UNAVAILABLE, the plugin sees the call cancelled. A drain under way then
        finishes at once."""
        self.stopping = True
        if self.socket is not None:
            self.socket.release()
        self.listening = False
        if self.relay is not None:
            await self.relay.stop(0)
        if self.server is not None:
            await self.server.stop(None)  # grpc: cancel every call now

    async def stop(self, grace: float | None = None) -> None:
        grace = self.settings.shutdown_grace if grace is None else grace
        self.stopping = True
        if self.socket is not None:
            # First, so a successor waiting on the path (--listen-wait) binds while calls in
            # flight here drain; new connections could not reach this proxy anyway.
            self.socket.release()
        self.listening = False
        if self.relay is not None:
            await self.relay.stop(grace)
        if self.server is not None:
            await self.server.stop(grace)
        await self.transport.stop()
        for stage in reversed(self.stages):
            with contextlib.suppress(Exception):
                await stage.shutdown()
        if self.admin is not None:
            self.admin.stop()
        if self.tls_diagnostics is not None:
            await self.tls_diagnostics.close()
        await self.upstream.close()


def _task_count(loop: asyncio.AbstractEventLoop) -> AdminHandler:
    """GET /debug/tasks: asyncio tasks alive on the proxy's loop (leak checks, soak runs)."""

    def handler() -> tuple[int, str, bytes]:
        return 200, "text/plain; charset=utf-8", b"%d\n" % len(asyncio.all_tasks(loop))

    return handler


async def run(ns: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT, then drain for --shutdown-grace and exit 0; a second
    signal during the drain ends the calls still in flight at once and exits 128 + its
    number (130 for a second Ctrl-C)."""
    server = ProxyServer(settings_from(ServeSettings, ns))
    loop = asyncio.get_running_loop()
    signals: asyncio.Queue[signal.Signals] = asyncio.Queue()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    diagnostics = server.tls_diagnostics
    if diagnostics is not None:
        diagnostics.start()  # this process's standard error: grpc's TLS lines become ours
    try:
        # A signal may come while the proxy still waits for its plugin or its path.
        starting = asyncio.ensure_future(server.start())
        first = asyncio.ensure_future(signals.get())
        try:
            await asyncio.wait({starting, first}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                starting.result()
            else:
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
            received = await first
        except BaseException:
            first.cancel()
            await server.stop(0)
            raise
        code = await _shut_down(server, received, signals)
        server.logger.info("stopped")
    finally:
        if diagnostics is not None:
            diagnostics.stop()
    return code


async def _shut_down(
    server: ProxyServer, received: signal.Signals, signals: asyncio.Queue[signal.Signals]
) -> int:
    """Drain after the first signal, saying how many calls are in flight and what a second
    signal does; stop at once on a second one. The exit status."""
    grace = float(server.settings.shutdown_grace)
    server.logger.info(
        "shutting down",
        signal=received.name,
        calls_in_flight=server.calls_in_flight(),
        grace_seconds=grace,
        again="a second SIGINT (Ctrl-C) or SIGTERM ends the calls in flight now",
    )
    stopping = asyncio.ensure_future(server.stop())
    second = asyncio.ensure_future(signals.get())
    progress = asyncio.ensure_future(_drain_progress(server, grace))
    try:
        await asyncio.wait({stopping, second}, return_when=asyncio.FIRST_COMPLETED)
        if stopping.done():
            stopping.result()
            return 0
        again = second.result()
        server.logger.warning(
            "stopping now", signal=again.name, calls_ended=server.calls_in_flight()
        )
        await server.stop_now()
        # The first stop() finishes what is left (stages, admin server, upstream); a stage
        # that takes long to flush is not waited for.
        try:
            await asyncio.wait_for(asyncio.shield(stopping), STOP_NOW_WAIT)
        except TimeoutError:
            server.logger.warning("stopped without waiting for the rest of the shutdown")
        return 128 + again.value
    finally:
        second.cancel()
        progress.cancel()


async def _drain_progress(server: ProxyServer, grace: float) -> None:
    """While calls drain, a line each time their number has changed (at most one a second)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    last = server.calls_in_flight()
    while last:
        await asyncio.sleep(1.0)
        now = server.calls_in_flight()
        if now != last:
            left = max(0.0, grace - (loop.time() - started))
            server.logger.info("draining", calls_in_flight=now, grace_left_seconds=round(left, 1))
            last = now
