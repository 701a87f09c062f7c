"""grpc's TLS handshake failures as plugproxy's own log lines, and as hints to the caller.

grpc's C core performs the TLS handshake of `tls://` endpoints and reports a failure only
as a raw line on standard error (``ssl_transport_security.cc ... Handshake failed with
error SSL_ERROR_SSL: ... CERTIFICATE_VERIFY_FAILED: ...``), outside the JSON log, about once
a second while the peer retries. While a `tls://` endpoint is configured, the proxy reads
its own standard error through a pipe: such a line becomes one ``tls handshake failed``
warning (the side, what went wrong, the flag to check), at most one per problem every 10 s
with a count of the ones held back; every other line passes through unchanged. grpc does
not say which peer a refused handshake came from; on the upstream side the peer is the
upstream. The last failure also explains a call's UNAVAILABLE and /readyz.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RATE_WINDOW = 10.0  # seconds between two lines about the same problem
RECENT = 30.0  # a failure this recent explains the upstream being down
PROBE_EVERY = 5.0  # while a tls:// upstream is down, one handshake of our own this often
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")

_HANDSHAKE = re.compile(r"Handshake failed with error \S+: (?:error:\w+:[^:]*:\w+:)?(.*)$")
_PEER_NAME = re.compile(r"Peer name (\S+) is not in peer certificate")


@dataclass(frozen=True, slots=True)
class Failure:
    side: str  # "listen", "upstream", or "listen or upstream" when both are TLS
    reason: str  # grpc's words (BoringSSL's reason and detail)
    problem: str  # what it means, in plugproxy's words
    check: str  # the flag(s) to look at
    when: float


@dataclass(frozen=True, slots=True)
class UpstreamTls:
    """Where and how the upstream side connects, to try the handshake itself."""

    host: str
    port: int
    server_name: str
    ca: str
    cert: str
    key: str


async def probe(target: UpstreamTls, timeout: float = 3.0) -> str | None:
    """One TLS handshake with the upstream, as the proxy's channel makes it: what went wrong,
    in plugproxy's words, or None when the handshake works (or nothing answers at all)."""
    try:
        context = ssl.create_default_context(cafile=target.ca)
        context.load_cert_chain(target.cert, target.key)
    except (OSError, ssl.SSLError) as exc:
        return f"this side's TLS files do not load ({exc})"
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    writer = None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                target.host, target.port, ssl=context, server_hostname=target.server_name
            ),
            timeout,
        )
        # TLS 1.3: the server judges the client certificate after the client's handshake is
        # done, and says so in an alert on the first read.
        writer.write(H2_PREFACE)
        await writer.drain()
        if not await asyncio.wait_for(reader.read(1), timeout):
            # An HTTP/2 server speaks first (its SETTINGS); closing instead is a refusal,
            # whose alert the client's TLS layer may not surface.
            return (
                "the peer closed the connection right after the TLS handshake: it refused"
                " this side's certificate (check that --tls-cert is signed by a CA in the"
                " peer's --tls-ca, and valid)"
            )
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code == 62 or "mismatch" in str(exc):
            return (
                f"the server certificate does not name {target.server_name} (check"
                " --tls-server-name, or the DNS SANs of the server certificate)"
            )
        if exc.verify_code == 10:
            return "the server's certificate has expired (check the peer's --tls-cert)"
        return (
            "the server's certificate is not signed by a CA in --tls-ca"
            f" ({exc.verify_message}; check --tls-ca on this side)"
        )
    except ssl.SSLError as exc:
        reason = (exc.reason or str(exc)).upper()
        if "EXPIRED" in reason:
            return "the peer refused this side's certificate: it has expired (--tls-cert)"
        if "ALERT" in reason:
            return (
                f"the peer refused this side's certificate ({exc.reason}: check that"
                " --tls-cert is signed by a CA in the peer's --tls-ca)"
            )
        return f"the TLS handshake failed ({exc.reason or exc})"
    except (OSError, TimeoutError):
        return None  # nothing listening, or slow: not a TLS matter
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    return None


def explain(reason: str, side: str) -> tuple[str, str]:
    """(what went wrong, what to check) for a handshake failure seen on ``side``."""
    text = reason.upper()
    peer = "the client's" if side == "listen" else "the server's"
    if "PEER NAME" in text:
        return (
            "the server certificate does not name the host this side dials",
            "--tls-server-name, or the DNS SANs of the server certificate",
        )
    if "EXPIRED" in text:
        return f"{peer} certificate has expired", "the peer's --tls-cert (renew it)"
    if "NOT YET VALID" in text:
        return f"{peer} certificate is not valid yet", "the peer's --tls-cert and both clocks"
    if "PEER_DID_NOT_RETURN_A_CERTIFICATE" in text or "NO CERTIFICATE" in text:
        return "the client presented no certificate", "the client side's --tls-cert"
    if "ALERT" in text:  # the peer sent an alert: it refused what this side presented
        return (
            "the peer refused this side's certificate",
            "this side's --tls-cert is signed by a CA in the peer's --tls-ca, and valid",
        )
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return f"{peer} certificate is not signed by a CA in --tls-ca", "--tls-ca on this side"
    if "WRONG_VERSION_NUMBER" in text or "HTTP_REQUEST" in text:
        return "the peer does not speak TLS", "the peer's endpoint (tls:// on both sides)"
    if "UNSUPPORTED_PROTOCOL" in text or "VERSION" in text:
        return "the peer offers only a TLS version below 1.2", "the peer's TLS settings"
    return "the TLS handshake failed", "--tls-ca, --tls-cert and --tls-key on both sides"


class TlsDiagnostics:
    """Reads the process's standard error for grpc's TLS failures (see the module doc)."""

    def __init__(
        self,
        logger: Any,
        listen_tls: bool,
        upstream: str | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.listen_tls = listen_tls
        self.upstream = upstream  # the tls:// upstream's URL, or None
        self.clock = clock
        self.last: Failure | None = None
        self._said: dict[str, tuple[float, int]] = {}  # problem -> (last line, held back)
        self._lock = threading.Lock()
        self._saved_fd: int | None = None
        self._thread: threading.Thread | None = None
        self.probed: tuple[str, float] | None = None  # the upstream probe's finding, and when
        self._prober: asyncio.Task[None] | None = None

    @property
    def side(self) -> str:
        if self.listen_tls and self.upstream:
            return "listen or upstream"
        return "listen" if self.listen_tls else "upstream"

    # -- lines ----------------------------------------------------------------------------

    def feed(self, line: str) -> bool:
        """Handle one line of grpc's output; True when it was a TLS failure (logged)."""
        found = _HANDSHAKE.search(line)
        reason = found.group(1).strip() if found else ""
        if not found:
            name = _PEER_NAME.search(line)
            if name is None:
                return False
            reason = f"Peer name {name.group(1)} is not in peer certificate"
        problem, check = explain(reason, self.side)
        now = self.clock()
        failure = Failure(self.side, reason, problem, check, now)
        with self._lock:
            self.last = failure
            said, held = self._said.get(problem, (float("-inf"), 0))
            if now - said < RATE_WINDOW:
                self._said[problem] = (said, held + 1)
                return True
            self._said[problem] = (now, 0)
        fields: dict[str, Any] = {
            "side": failure.side,
            "problem": problem,
            "check": check,
            "reason": reason,
            "repeats_suppressed": held,
        }
        if self.upstream and not self.listen_tls:
            fields["peer"] = self.upstream
        self.logger.warning("tls handshake failed", **fields)
        return True

    def recent(self) -> Failure | None:
        with self._lock:
            last = self.last
        if last is None or self.clock() - last.when > RECENT:
            return None
        return last

    def hint(self, details: str = "") -> str | None:
        """Why a TLS upstream is likely unreachable, for its UNAVAILABLE and /readyz."""
        last = self.recent()
        if last is not None:
            return f"TLS handshake failed: {last.problem} (check {last.check})"
        if self.probed is not None and self.clock() - self.probed[1] <= RECENT:
            return f"TLS handshake failed: {self.probed[0]}"
        if "Socket closed" in details:
            return (
                "the peer closed the connection during the TLS handshake: it likely refused"
                " this side's certificate (check that --tls-cert is signed by a CA in the"
                " peer's --tls-ca, and valid)"
            )
        return None

    # -- the upstream's handshake, tried while it is down ---------------------------------

    def watch_upstream(self, target: UpstreamTls, is_down: Callable[[], bool]) -> None:
        """While ``is_down()``, try the handshake every PROBE_EVERY seconds; the finding
        explains the upstream's UNAVAILABLE and /readyz, and is logged once per change."""
        if self._prober is None:
            self._prober = asyncio.get_running_loop().create_task(self._probe(target, is_down))

    async def _probe(self, target: UpstreamTls, is_down: Callable[[], bool]) -> None:
        said = None
        while True:
            await asyncio.sleep(PROBE_EVERY if said is not None or not is_down() else 0.5)
            if not is_down():
                self.probed = said = None
                continue
            found = await probe(target)
            self.probed = (found, self.clock()) if found else None
            if found and found != said:
                self.logger.warning(
                    "tls handshake failed", side="upstream", peer=self.upstream, problem=found
                )
            said = found or ""

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
            self._prober = None

    # -- standard error -------------------------------------------------------------------

    def start(self) -> None:
        """Route file descriptor 2 through a pipe this object reads; idempotent."""
        if self._thread is not None:
            return
        read_fd, write_fd = os.pipe()
        self._saved_fd = os.dup(2)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._thread = threading.Thread(
            target=self._pump, args=(read_fd, self._saved_fd), name="tls-diagnostics", daemon=True
        )
        self._thread.start()

    def _pump(self, read_fd: int, out_fd: int) -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            pending = b""
            while True:
                try:
                    chunk = pipe.read(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    handled = False
                    with contextlib.suppress(Exception):  # never lose a line to a bug here
                        handled = self.feed(raw.decode("utf-8", "replace"))
                    if not handled:
                        with contextlib.suppress(OSError):  # keep reading, or writers block
                            os.write(out_fd, raw + b"\n")
            if pending:
                with contextlib.suppress(OSError):
                    os.write(out_fd, pending)

    def stop(self) -> None:
        """Give file descriptor 2 back; lines already in the pipe are still handled."""
        if self._saved_fd is None or self._thread is None:
            return
        os.dup2(self._saved_fd, 2)  # closes the pipe's last write end: the reader sees EOF
        self._thread.join(timeout=2)
        os.close(self._saved_fd)
        self._saved_fd = None
        self._thread = None
