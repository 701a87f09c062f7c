"""plugproxy.net.tlslog: grpc's TLS failure lines become one structured, rate-limited warning;
other lines pass through; the last failure explains the upstream's state."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from plugproxy.core.log import Logger
from plugproxy.net.tlslog import RATE_WINDOW, RECENT, TlsDiagnostics, explain

VERIFY = (
    "I1122 22:31:22.553405   18666 ssl_transport_security.cc:2563] Handshake failed with error"
    " SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED:"
    " unable to get local issuer certificate"
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def diagnostics(listen: bool = True, upstream: str | None = None):  # type: ignore[no-untyped-def]
    out = io.StringIO()
    clock = Clock()
    return TlsDiagnostics(Logger(out), listen, upstream, clock), out, clock


def events(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_handshake_failure_is_one_line_per_problem_and_window():
    d, out, clock = diagnostics()
    assert d.feed(VERIFY) and d.feed(VERIFY) and d.feed(VERIFY)
    clock.now += RATE_WINDOW + 1
    assert d.feed(VERIFY)
    first, second = events(out)
    assert first["event"] == "tls handshake failed" and first["side"] == "listen"
    assert first["problem"] == "the client's certificate is not signed by a CA in --tls-ca"
    assert first["reason"] == "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate"
    assert (first["repeats_suppressed"], second["repeats_suppressed"]) == (0, 2)


def test_other_lines_are_not_taken():
    d, out, _ = diagnostics()
    assert not d.feed("W1122 log.cc:110] Log level DEBUG is not suitable for production.")
    assert out.getvalue() == ""


def test_the_upstream_side_names_its_peer_and_the_hint_ages():
    d, out, clock = diagnostics(listen=False, upstream="tls://appliance:7443")
    assert d.hint("Socket closed") is not None and "refused this side's" in d.hint("Socket closed")
    assert d.hint("Connection refused") is None
    d.feed(VERIFY)
    (line,) = events(out)
    assert line["peer"] == "tls://appliance:7443" and line["side"] == "upstream"
    assert "server's certificate is not signed by a CA in --tls-ca" in (d.hint() or "")
    clock.now += RECENT + 1
    assert d.hint() is None


@pytest.mark.parametrize(
    ("reason", "side", "problem"),
    [
        ("CERTIFICATE_VERIFY_FAILED: certificate has expired", "listen", "has expired"),
        ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "listen", "presented no certificate"),
        ("TLSV1_ALERT_UNKNOWN_CA", "upstream", "refused this side's certificate"),
        ("WRONG_VERSION_NUMBER", "listen", "does not speak TLS"),
        ("Peer name localhost is not in peer certificate", "upstream", "does not name the host"),
    ],
)
def test_reasons_are_explained(reason, side, problem):
    assert problem in explain(reason, side)[0]


def test_standard_error_is_read_and_given_back():
    """In a process of its own: grpc's line becomes JSON on stdout; others stay on stderr."""
    code = f"""
import os, sys
from plugproxy.core.log import Logger
from plugproxy.net.tlslog import TlsDiagnostics
d = TlsDiagnostics(Logger(sys.stdout), True, None)
d.start()
os.write(2, {VERIFY!r}.encode() + b"\\nsomething else\\n")
d.stop()
os.write(2, b"after\\n")
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stderr == "something else\nafter\n"
    (line,) = [json.loads(x) for x in result.stdout.splitlines()]
    assert line["event"] == "tls handshake failed"
