"""TLS mistakes between a node and an appliance proxy, as an operator meets them: each side
logs what went wrong in its own structured line (grpc's raw TLS chatter no longer reaches
standard error), and the caller's UNAVAILABLE and the node's /readyz name the likely cause.
Both proxies run as real `plugproxy serve` processes; certificates are made in the test."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from plugproxy.fakes import start_fake_plugin
from tests.test_net_transport import CA, Issued

INFO = "/csi.v1.Identity/GetPluginInfo"
NODE_ID = "spiffe://example.org/ns/kube-system/sa/csi-node"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write(directory: Path, name: str, issued: Issued) -> tuple[str, str]:
    (directory / f"{name}.crt").write_bytes(issued.cert_pem)
    (directory / f"{name}.key").write_bytes(issued.key_pem)
    return str(directory / f"{name}.crt"), str(directory / f"{name}.key")


@dataclass
class Proxy:
    process: subprocess.Popen[bytes]
    out: Path
    err: Path
    admin: int

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)

    def events(self, name: str) -> list[dict[str, object]]:
        lines = [json.loads(x) for x in self.out.read_text().splitlines() if x.startswith("{")]
        return [x for x in lines if x.get("event") == name]

    def readyz(self) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/readyz", timeout=2) as r:
                return str(r.read().decode())
        except urllib.error.HTTPError as exc:
            return str(exc.read().decode())
        except OSError:
            return ""  # not listening yet


def serve(tmp: Path, name: str, *argv: str) -> Proxy:
    admin = free_port()
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    process = subprocess.Popen(
        [sys.executable, "-m", "plugproxy", "serve", *argv, "--admin-listen", f"127.0.0.1:{admin}"],
        stdout=out.open("wb"),
        stderr=err.open("wb"),
    )
    return Proxy(process, out, err, admin)


@dataclass
class Pki:
    ca: CA
    ca_file: str
    server: tuple[str, str]
    client: tuple[str, str]
    other_ca_file: str


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca, other = CA("bridge-ca"), CA("other-ca")
    (tmp_path / "ca.crt").write_bytes(ca.pem)
    (tmp_path / "other-ca.crt").write_bytes(other.pem)
    server = write(tmp_path, "server", ca.issue("appliance", dns=("localhost",)))
    client = write(tmp_path, "client", ca.issue("csi-node", uris=(NODE_ID,)))
    return Pki(ca, str(tmp_path / "ca.crt"), server, client, str(tmp_path / "other-ca.crt"))


@pytest.fixture
async def plugin(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "plugin.sock")
    handle = await start_fake_plugin("csi.v1", f"unix://{path}")
    yield path
    await handle.stop(0)


def appliance(tmp: Path, plugin: str, port: int, ca: str, cert: tuple[str, str], *extra: str):
    return serve(
        tmp,
        "appliance",
        "--listen",
        f"tls://127.0.0.1:{port}",
        "--upstream",
        f"unix://{plugin}",
        "--tls-ca",
        ca,
        "--tls-cert",
        cert[0],
        "--tls-key",
        cert[1],
        *extra,
    )


def node(tmp: Path, port: int, ca: str, cert: tuple[str, str]) -> Proxy:
    return serve(
        tmp,
        "node",
        "--listen",
        f"unix://{tmp}/csi.sock",
        "--upstream",
        f"tls://localhost:{port}",
        "--tls-ca",
        ca,
        "--tls-cert",
        cert[0],
        "--tls-key",
        cert[1],
        "--plugin-wait",
        "2s",
        # What a CO's call is told: listen before the appliance ever answered (by default
        # the socket appears only once it has, and /readyz carries the same diagnosis).
        "--listen-when",
        "start",
    )


async def call_through(sock: str) -> grpc.aio.AioRpcError | None:
    async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
        try:
            await ch.unary_unary(INFO)(b"", timeout=8)
        except grpc.aio.AioRpcError as err:
            return err
    return None


async def until(predicate, timeout: float = 40.0) -> None:  # type: ignore[no-untyped-def]
    # Generous: the node probes every 5 s, and on a loaded machine two processes start slowly.
    # Waits on the event loop: the fake plugin runs there, and the appliance listens only
    # once it has answered the appliance's probe.
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.2)


async def run_case(tmp: Path, app: Proxy, nd: Proxy) -> tuple[str, str]:
    """(the caller's UNAVAILABLE message, the node's /readyz) once the node has tried."""
    try:
        seen: list[str] = []

        def failed() -> bool:
            seen.append(nd.readyz())
            return "TLS handshake failed" in seen[-1]

        try:
            await until(failed)
        except AssertionError:
            raise AssertionError(f"the node's /readyz kept saying {seen[-1]!r}") from None
        err = await call_through(str(tmp / "csi.sock"))
        assert err is not None and err.code() is grpc.StatusCode.UNAVAILABLE
        return err.details() or "", nd.readyz()
    finally:
        app.stop()
        nd.stop()


def no_raw_tls_lines(*proxies: Proxy) -> None:
    for p in proxies:
        assert "Handshake failed" not in p.err.read_text(), p.err.read_text()


async def test_appliance_trusting_another_ca(tmp_path, pki, plugin):
    port = free_port()
    app = appliance(tmp_path, plugin, port, pki.other_ca_file, pki.server)
    nd = node(tmp_path, port, pki.ca_file, pki.client)
    message, ready = await run_case(tmp_path, app, nd)
    (line, *_) = app.events("tls handshake failed")
    assert line["side"] == "listen"
    assert line["problem"] == "the client's certificate is not signed by a CA in --tls-ca"
    assert line["check"] == "--tls-ca on this side"
    for said in (message, ready):
        assert "refused this side's certificate" in said and "peer's --tls-ca" in said
    no_raw_tls_lines(app, nd)


async def test_node_trusting_another_ca(tmp_path, pki, plugin):
    port = free_port()
    app = appliance(tmp_path, plugin, port, pki.ca_file, pki.server)
    nd = node(tmp_path, port, pki.other_ca_file, pki.client)
    message, ready = await run_case(tmp_path, app, nd)
    problems = {str(x["problem"]) for x in nd.events("tls handshake failed")}
    assert any("server's certificate is not signed by a CA in --tls-ca" in p for p in problems)
    assert all(x["side"] == "upstream" for x in nd.events("tls handshake failed"))
    for said in (message, ready):
        assert "the server's certificate is not signed by a CA in --tls-ca" in said
    no_raw_tls_lines(app, nd)


async def test_expired_client_certificate(tmp_path, pki, plugin):
    port = free_port()
    old = pki.ca.issue(
        "csi-node",
        uris=(NODE_ID,),
        valid_from=-dt.timedelta(days=3),
        valid_until=-dt.timedelta(days=1),
    )
    app = appliance(tmp_path, plugin, port, pki.ca_file, pki.server)
    nd = node(tmp_path, port, pki.ca_file, write(tmp_path, "old", old))
    message, ready = await run_case(tmp_path, app, nd)
    (line, *_) = app.events("tls handshake failed")
    assert line["problem"] == "the client's certificate has expired"
    assert "refused this side's certificate" in message and "refused" in ready
    no_raw_tls_lines(app, nd)


async def test_client_without_certificate_and_identity_not_allowed(tmp_path, pki, plugin):
    port = free_port()
    app = appliance(
        tmp_path, plugin, port, pki.ca_file, pki.server, "--tls-allow-identity", "cn:ops-console"
    )
    try:
        await until(lambda: "ready" in app.readyz())
        anonymous = grpc.ssl_channel_credentials(Path(pki.ca_file).read_bytes())
        async with grpc.aio.secure_channel(f"localhost:{port}", anonymous) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as no_cert:
                await ch.unary_unary(INFO)(b"", timeout=5)
        client = pki.client
        named = grpc.ssl_channel_credentials(
            Path(pki.ca_file).read_bytes(),
            Path(client[1]).read_bytes(),
            Path(client[0]).read_bytes(),
        )
        async with grpc.aio.secure_channel(f"localhost:{port}", named) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as not_allowed:
                await ch.unary_unary(INFO)(b"", timeout=5)
        await until(lambda: bool(app.events("tls handshake failed")))
    finally:
        app.stop()
    assert no_cert.value.code() is grpc.StatusCode.UNAVAILABLE
    (line, *_) = app.events("tls handshake failed")
    assert line["problem"] == "the client presented no certificate"
    assert line["check"] == "the client side's --tls-cert"
    assert not_allowed.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert NODE_ID in (not_allowed.value.details() or "")
    (refused, *_) = app.events("tls client refused")
    assert NODE_ID in str(refused["presented"])
    no_raw_tls_lines(app)
