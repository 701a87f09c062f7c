"""The admin HTTP server: /healthz, /readyz, /metrics and routes stages add.

It runs in its own thread (stdlib ThreadingHTTPServer) so a slow scrape never shares the
event loop with calls. Handlers only read state; they never see message payloads.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from plugproxy.api import AdminHandler, ReadinessCheck
from plugproxy.core.endpoints import ConfigError
from plugproxy.core.log import Logger
from plugproxy.net.sockets import socket_identity


def parse_admin_listen(raw: str, source: str = "--admin-listen") -> tuple[str, int] | None:
    """'127.0.0.1:9808', '[::1]:9808', ':9808' or 'off'."""
    if raw.strip().lower() == "off":
        return None
    host, sep, port_text = raw.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"{source} {raw!r}: expected HOST:PORT or off")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port_text)


def readiness(checks: list[ReadinessCheck]) -> AdminHandler:
    def handler() -> tuple[int, str, bytes]:
        reasons = []
        for check in checks:
            ok, reason = check()
            if not ok:
                reasons.append(reason)
        if reasons:
            return 503, "text/plain; charset=utf-8", ("not ready: " + "; ".join(reasons)).encode()
        return 200, "text/plain; charset=utf-8", b"ready"

    return handler


def metrics(registry: CollectorRegistry) -> AdminHandler:
    def handler() -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE_LATEST, generate_latest(registry)

    return handler


def healthz() -> tuple[int, str, bytes]:
    return 200, "text/plain; charset=utf-8", b"ok"


def listen_socket_healthz(path: str) -> AdminHandler:
    """/healthz that fails once the listen socket file is removed or replaced.

    kubelet empties its device plugin directory when it restarts, socket files included:
    a proxy listening there would go on accepting nothing. Failing liveness has the
    container restarted, and the socket made again."""
    bound = socket_identity(path)

    def handler() -> tuple[int, str, bytes]:
        if socket_identity(path) != bound:
            why = f"listen socket {path} was removed or replaced; restart to listen again"
            return 503, "text/plain; charset=utf-8", why.encode()
        return healthz()

    return handler


class AdminServer:
    def __init__(self, host: str, port: int, routes: dict[str, AdminHandler], logger: Logger):
        self._routes = routes
        self._logger = logger
        handler_class = _make_handler(routes, logger)
        try:
            self._server = _HTTPServer((host, port), handler_class)
        except OSError as exc:
            raise ConfigError(f"--admin-listen {host}:{port}: {exc.strerror or exc}") from None
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="plugproxy-admin", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _HTTPServer(ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer's own asks the resolver for the host's full name (getfqdn), which only
        # CGI-style handlers read; the lookup loads the resolver's libraries and the IDNA
        # codec (about 0.4 MiB resident) and may wait on DNS at startup.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = port


def _make_handler(routes: dict[str, AdminHandler], logger: Logger) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "plugproxy-admin"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            route = routes.get(path)
            if route is None:
                # Naming the paths served tells a wrong path from a route that is off
                # (`plugproxy report` reads it: no /violations means validation is off).
                served = ", ".join(sorted(routes))
                body = f"not found; this plugproxy admin server answers {served}\n".encode()
                status, ctype = 404, "text/plain; charset=utf-8"
            else:
                try:
                    status, ctype, body = route()
                except Exception as exc:
                    logger.error("admin route failed", path=path, error=type(exc).__name__)
                    status, ctype, body = 500, "text/plain; charset=utf-8", b"internal error\n"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every few seconds would drown the call log

    return Handler
