"""``plugproxy webhook``: ``plugproxy inject`` as a mutating admission webhook for Pods.

AdmissionReview v1 in, AdmissionReview v1 out with an RFC 6902 JSONPatch. Pods opt in
with the annotation ``plugproxy.io/inject: "true"``; everything else is allowed unchanged.
A request that cannot be understood, or a pod that cannot be wired unambiguously, is
allowed unchanged with a warning the client sees, unless ``--fail-closed``: a proxy that
cannot be added must not keep a storage driver from starting.

HTTPS with the standard library. The certificate and key are re-read when the files
change (cert-manager rotates them through a Secret volume): every new connection first
checks the files' stat signature, so the next handshake after a rotation uses the new
certificate.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import json
import signal
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from plugproxy.cli import inject
from plugproxy.core.endpoints import ConfigError
from plugproxy.core.log import LEVELS, Logger
from plugproxy.net import tlsfiles

ADMISSION_API = "admission.k8s.io/v1"
MAX_BODY = 8 * 1024 * 1024  # the API server sends at most a few MiB per object
HANDSHAKE_TIMEOUT = 10.0


# ------------------------------------------------------------------------ JSONPatch


def _pointer(path: str, key: str | int) -> str:
    return f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """RFC 6902 operations turning `old` into `new` (lists that change length are replaced)."""
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[dict[str, Any]] = []
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": _pointer(path, key)})
        for key, value in new.items():
            if key not in old:
                ops.append({"op": "add", "path": _pointer(path, key), "value": value})
            else:
                ops += json_patch(old[key], value, _pointer(path, key))
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        ops = []
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            ops += json_patch(a, b, _pointer(path, i))
        return ops
    if _same(old, new):
        return []
    return [{"op": "replace", "path": path, "value": new}]


# ------------------------------------------------------------------------ admission


def _response(uid: str, allowed: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": ADMISSION_API,
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": allowed, **extra},
    }


class Admission:
    """Answers one AdmissionReview; no I/O, so tests and the server share it."""

    def __init__(self, options: inject.InjectOptions, fail_closed: bool = False) -> None:
        self.options = options
        self.fail_closed = fail_closed

    def _refuse(self, uid: str, message: str) -> dict[str, Any]:
        if self.fail_closed:
            return _response(uid, False, status={"code": 400, "message": message})
        return _response(uid, warnings=[f"plugproxy not injected: {message}"])

    def review(self, body: bytes) -> tuple[dict[str, Any], str]:
        """(AdmissionReview to answer with, one word on what was done, for the log)."""
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return self._refuse("", "request body is not JSON"), "bad-request"
        request = doc.get("request") if isinstance(doc, dict) else None
        uid = request.get("uid") if isinstance(request, dict) else None
        if not isinstance(uid, str) or not uid:
            return self._refuse("", "not an AdmissionReview: request.uid is missing"), "bad-request"
        assert isinstance(request, dict)
        if doc.get("apiVersion") != ADMISSION_API or doc.get("kind") != "AdmissionReview":
            return self._refuse(uid, f"expected an {ADMISSION_API} AdmissionReview"), "bad-request"
        kind_field = request.get("kind")
        kind = kind_field.get("kind") if isinstance(kind_field, dict) else None
        if kind != "Pod" or request.get("operation") != "CREATE" or request.get("subResource"):
            return _response(uid), "not-a-pod-creation"
        pod = request.get("object")
        if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
            return self._refuse(uid, "request.object is not a Pod"), "bad-request"
        meta: dict[str, Any] = pod["metadata"] if isinstance(pod.get("metadata"), dict) else {}
        annotations = meta.get("annotations")
        if not isinstance(annotations, dict) or annotations.get(inject.OPT_IN) != "true":
            return _response(uid), "not-opted-in"
        if not isinstance(pod["spec"].get("containers"), list):
            return self._refuse(uid, "request.object.spec.containers is not a list"), "bad-request"
        namespace = meta.get("namespace") or request.get("namespace") or ""
        name = meta.get("name") or meta.get("generateName") or "<unnamed>"
        who = f"Pod/{namespace}/{name}" if namespace else f"Pod/{name}"
        mutated = copy.deepcopy(pod)
        mutated.setdefault("metadata", {})
        outcome = inject.Outcome()
        try:
            inject.inject_pod(mutated["spec"], mutated["metadata"], who, self.options, outcome)
        except inject.InjectError as exc:
            return self._refuse(uid, str(exc)), "refused"
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
            # A malformed pod spec the API server would reject anyway: never crash on it.
            return self._refuse(
                uid, f"{who}: malformed pod spec ({type(exc).__name__})"
            ), "bad-request"
        extra: dict[str, Any] = {}
        if outcome.warnings:
            extra["warnings"] = outcome.warnings
        ops = json_patch(pod, mutated)
        if not ops:
            return _response(uid, **extra), "unchanged"
        patch = base64.b64encode(json.dumps(ops).encode()).decode("ascii")
        return _response(uid, patchType="JSONPatch", patch=patch, **extra), "injected"


# ------------------------------------------------------------------------ HTTPS


class ServingCertificate:
    """The server's certificate and key, checked and turned into an SSLContext; re-read when
    the files change. No client certificates: the API server authenticates us, not we it."""

    def __init__(self, cert: str, key: str, logger: Logger) -> None:
        # tlsfiles checks a CA bundle too; the certificate file stands in for it.
        self.paths = tlsfiles.TLSPaths(ca=cert, cert=cert, key=key)
        self.logger = logger
        self._lock = threading.Lock()
        self._signature = tlsfiles.signature(self.paths)
        self.material = self._load()
        self._context = self._build()
        self.reloads = 0
        self._last_error = ""

    def _load(self) -> tlsfiles.Material:
        try:
            return tlsfiles.load(self.paths)
        except tlsfiles.MaterialError as exc:
            raise ConfigError(str(exc).replace("--tls-ca", "--tls-cert")) from None

    def _build(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.paths.cert, self.paths.key)
        return ctx

    def context(self) -> ssl.SSLContext:
        """The context for the next connection, after a cheap check for new files."""
        with self._lock:
            signature = tlsfiles.signature(self.paths)
            if signature == self._signature:
                return self._context
            try:
                material = self._load()
                context = self._build()
            except (ConfigError, ssl.SSLError, OSError) as exc:
                # Keep serving with what works; say so once per problem, retry next time.
                if str(exc) != self._last_error:
                    self._last_error = str(exc)
                    self.logger.warning(
                        "tls files changed but are not usable yet; keeping the current ones",
                        reason=str(exc),
                    )
                return self._context
            self._signature, self._last_error = signature, ""
            if material.digest != self.material.digest:
                old, self.material, self._context = self.material, material, context
                self.reloads += 1
                self.logger.info(
                    "tls files reloaded",
                    cert=self.paths.cert,
                    cert_sha256=material.cert_fingerprint,
                    previous_cert_sha256=old.cert_fingerprint,
                )
            return self._context


class _Handler(BaseHTTPRequestHandler):
    server: WebhookServer
    timeout = HANDSHAKE_TIMEOUT
    protocol_version = "HTTP/1.1"

    def handle(self) -> None:
        try:
            self.connection.do_handshake()
        except (ssl.SSLError, OSError):
            return  # a scanner or a client that does not trust us: nothing to answer
        super().handle()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one structured line per review instead

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path in ("/healthz", "/readyz"):
            self._send(HTTPStatus.OK, b"ok\n", "text/plain")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        if self.path.partition("?")[0] != "/mutate":
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, b"bad Content-Length\n", "text/plain")
            return
        answer, what = self.server.admission.review(self.rfile.read(length))
        response = answer["response"]
        self.server.logger.info(
            "admission review",
            uid=response["uid"],
            result=what,
            allowed=response["allowed"],
            warnings=response.get("warnings", []),
        )
        self._send(HTTPStatus.OK, json.dumps(answer).encode())


class WebhookServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        certificate: ServingCertificate,
        admission: Admission,
        logger: Logger,
    ) -> None:
        self.certificate = certificate
        self.admission = admission
        self.logger = logger
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        # The handshake happens in the handler's thread, so a slow client holds up no one.
        wrapped = self.certificate.context().wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False
        )
        return wrapped, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr; a client gone mid-answer is routine
        # (one debug line), anything else is one structured error line.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, ssl.SSLError, TimeoutError)):
            self.logger.debug("client went away", peer=str(client_address[0]), error=str(exc))
        else:
            self.logger.error(
                "request failed", peer=str(client_address[0]), error=f"{type(exc).__name__}: {exc}"
            )


# ------------------------------------------------------------------------ command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default="0.0.0.0:8443",
        metavar="HOST:PORT",
        help="HTTPS address (default: %(default)s)",
    )
    parser.add_argument(
        "--tls-cert",
        required=True,
        metavar="FILE",
        help="serving certificate chain (PEM); re-read when it changes",
    )
    parser.add_argument("--tls-key", required=True, metavar="FILE", help="its private key (PEM)")
    inject.add_injection_arguments(parser)
    parser.add_argument(
        "--fail-closed",
        action="store_true",
        help="deny pods that opt in but cannot be injected, and bad requests",
    )
    parser.add_argument(
        "--log-format", default="json", choices=("json", "text"), help="log line format"
    )
    parser.add_argument(
        "--log-level", default="info", choices=tuple(LEVELS), help="lowest level logged"
    )


def parse_listen(raw: str) -> tuple[str, int]:
    host, sep, port = raw.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen {raw!r}: expected HOST:PORT, e.g. 0.0.0.0:8443")
    return host.strip("[]") or "0.0.0.0", int(port)


def build_server(ns: argparse.Namespace, logger: Logger) -> WebhookServer:
    options = inject.options_from(ns)
    address = parse_listen(ns.listen)
    certificate = ServingCertificate(ns.tls_cert, ns.tls_key, logger)
    try:
        return WebhookServer(address, certificate, Admission(options, ns.fail_closed), logger)
    except OSError as exc:
        raise ConfigError(f"--listen {ns.listen}: cannot listen ({exc.strerror})") from None


async def run(ns: argparse.Namespace) -> int:
    logger = Logger(sys.stdout, ns.log_format, ns.log_level)
    server = build_server(ns, logger)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    logger.info(
        "plugproxy webhook listening",
        listen=f"{host}:{port}",
        cert_sha256=server.certificate.material.cert_fingerprint,
        fail_closed=ns.fail_closed,
    )
    loop = asyncio.get_running_loop()
    stopping = threading.Event()

    def stop(name: str) -> Callable[[], None]:
        def handler() -> None:
            if not stopping.is_set():
                stopping.set()
                logger.info("stopping", signal=name)
                threading.Thread(target=server.shutdown, daemon=True).start()

        return handler

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop(sig.name))
    try:
        await asyncio.to_thread(server.serve_forever, 0.5)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        server.server_close()
    return 0
