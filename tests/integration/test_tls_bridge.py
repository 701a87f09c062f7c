"""The remote bridge: CO -> UNIX -> node proxy -> mTLS -> appliance proxy -> UNIX -> plugin."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from plugproxy.cli import serve
from plugproxy.core.log import Logger
from tests.support import ECHO, RecorderPlugin, channel, start_recorder, wait_until
from tests.test_net_transport import CA, Issued, Lines, SecretDir

SERVER_NAME = "appliance.example"
NODE_SPIFFE = "spiffe://example.org/ns/kube-system/sa/csi-node"
FAST = ["--tls-reload-interval", "50ms", "--admin-listen", "off"]


@dataclass
class Side:
    proxy: serve.ProxyServer
    lines: Lines
    secret: SecretDir


@dataclass
class Bridge:
    ca: CA
    plugin: RecorderPlugin
    appliance: Side
    node: Side
    node_socket: str

    @property
    def port(self) -> int:
        return self.appliance.proxy.port


async def start_side(argv: list[str]) -> tuple[serve.ProxyServer, Lines]:
    lines = Lines()
    proxy = serve.ProxyServer(
        serve.parse_settings(argv, environ={}), logger=Logger(lines), stages=[]
    )
    await proxy.start()
    return proxy, lines


@contextlib.asynccontextmanager
async def bridge(tmp_path: Path, appliance_args: tuple[str, ...] = (), node_args=()):
    ca = CA("bridge-ca")
    plugin_sock = str(tmp_path / "plugin.sock")
    node_sock = str(tmp_path / "node.sock")
    server, plugin = await start_recorder(plugin_sock)
    app_secret = SecretDir(tmp_path / "appliance-tls")
    app_secret.write(ca.pem, ca.issue("appliance", dns=(SERVER_NAME,), ips=("127.0.0.1",)))
    node_secret = SecretDir(tmp_path / "node-tls")
    node_secret.write(ca.pem, ca.issue("node-one", dns=("node-1.example",), uris=(NODE_SPIFFE,)))
    app, app_lines = await start_side(
        ["--listen", "tls://127.0.0.1:0", "--upstream", f"unix://{plugin_sock}",
         *app_secret.args(), *FAST, *appliance_args]
    )  # fmt: skip
    node, node_lines = await start_side(
        ["--listen", f"unix://{node_sock}", "--upstream", f"tls://127.0.0.1:{app.port}",
         "--tls-server-name", SERVER_NAME, *node_secret.args(), *FAST, *node_args]
    )  # fmt: skip
    try:
        assert await node.upstream.wait_ready(10), node_lines.getvalue()
        yield Bridge(
            ca, plugin, Side(app, app_lines, app_secret), Side(node, node_lines, node_secret),
            node_sock,
        )  # fmt: skip
    finally:
        await node.stop(0)
        await app.stop(0)
        await server.stop(0)


def direct(port: int, ca_pem: bytes, issued: Issued | None) -> grpc.aio.Channel:
    """A client dialing the appliance port straight, with whatever credentials it has."""
    if issued is None:
        creds = grpc.ssl_channel_credentials(ca_pem)
    else:
        creds = grpc.ssl_channel_credentials(ca_pem, issued.key_pem, issued.cert_pem)
    return grpc.aio.secure_channel(
        f"127.0.0.1:{port}",
        creds,
        [("grpc.ssl_target_name_override", SERVER_NAME), ("grpc.use_local_subchannel_pool", 1)],
    )


def tls_handshake(
    port: int,
    ca_pem: bytes,
    issued: Issued | None,
    tmp_path: Path,
    max_version: ssl.TLSVersion | None = None,
    min_version: ssl.TLSVersion | None = None,
) -> tuple[str | None, str]:
    """A Python ssl client: negotiated version and the server certificate's SHA-256."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cadata=ca_pem.decode())
    ctx.set_alpn_protocols(["h2"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.0/1.1 on purpose
        if min_version is not None:
            ctx.minimum_version = min_version
        if max_version is not None:
            ctx.maximum_version = max_version
    if max_version is not None and max_version < ssl.TLSVersion.TLSv1_2:
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    if issued is not None:
        cert, key = tmp_path / "hs-cert.pem", tmp_path / "hs-key.pem"
        cert.write_bytes(issued.cert_pem)
        key.write_bytes(issued.key_pem)
        ctx.load_cert_chain(str(cert), str(key))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        ctx.wrap_socket(sock, server_hostname=SERVER_NAME) as tls,
    ):
        der = tls.getpeercert(binary_form=True) or b""
        # The server checks the client certificate after the TLS 1.3 handshake: read once
        # so a refusal shows up here and not later.
        tls.settimeout(2)
        with contextlib.suppress(TimeoutError, socket.timeout):
            tls.recv(1)
        return tls.version(), hashlib.sha256(der).hexdigest()


# -- the round trip -------------------------------------------------------------------------


async def test_every_call_type_crosses_the_bridge(tmp_path):
    async with bridge(tmp_path) as b, channel(b.node_socket) as ch:
        md = (("x-custom", "v1"), ("x-custom-bin", b"\x00\xff"))
        call = ch.unary_unary(ECHO + "Unary")(b"\x00payload\xff", metadata=md, timeout=5)
        assert await call == b"echo:\x00payload\xff"
        assert dict(await call.trailing_metadata())["x-trailer-bin"] == b"\xff\x00"
        assert b.plugin.last().metadata["x-custom-bin"] == b"\x00\xff"

        stream = ch.unary_stream(ECHO + "ServerStream")(b"4", timeout=5)
        assert [m async for m in stream] == [b"item-%d" % i for i in range(4)]

        async def parts():
            for p in (b"a", b"bb", b"ccc"):
                yield p

        assert await ch.stream_unary(ECHO + "ClientStream")(parts(), timeout=5) == b"a|bb|ccc"

        bidi = ch.stream_stream(ECHO + "Bidi")(timeout=5)
        for word in (b"one", b"two"):
            await bidi.write(word)
            assert await bidi.read() == b"re:" + word
        await bidi.done_writing()
        assert await bidi.read() is grpc.aio.EOF
        assert await bidi.code() is grpc.StatusCode.OK

        # Errors and their trailers cross the bridge too.
        failing = ch.unary_unary(ECHO + "Unary")(
            b"x", metadata=(("x-fail-code", "NOT_FOUND"), ("x-fail-message", "gone")), timeout=5
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await failing
        assert err.value.code() is grpc.StatusCode.NOT_FOUND
        assert err.value.details() == "gone"
        assert dict(err.value.trailing_metadata())["x-trailer"] == "error-trailer"

        started = b.appliance.lines.records("tls enabled")
        assert started and started[0]["allow_identities"] == "any CA-signed"


async def test_tls_13_preferred_12_accepted_11_refused(tmp_path, capfd):
    async with bridge(tmp_path) as b:
        client = b.ca.issue("probe", dns=("probe.example",))
        port = b.port
        version, _ = await asyncio.to_thread(tls_handshake, port, b.ca.pem, client, tmp_path)
        assert version == "TLSv1.3"
        version, _ = await asyncio.to_thread(
            tls_handshake, port, b.ca.pem, client, tmp_path, ssl.TLSVersion.TLSv1_2
        )
        assert version == "TLSv1.2"
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await asyncio.to_thread(
                tls_handshake, port, b.ca.pem, client, tmp_path, ssl.TLSVersion.TLSv1_1,
                ssl.TLSVersion.TLSv1,
            )  # fmt: skip
        await asyncio.sleep(0.1)
        assert "UNSUPPORTED_PROTOCOL" in capfd.readouterr().err


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("wrong-ca", "unable to get local issuer certificate"),
        ("expired", "certificate has expired"),
        ("not-yet-valid", "certificate is not yet valid"),
        ("no-certificate", "PEER_DID_NOT_RETURN_A_CERTIFICATE"),
        ("plaintext", "WRONG_VERSION_NUMBER"),
    ],
)
async def test_handshake_refusals(tmp_path, capfd, case, reason):
    async with bridge(tmp_path) as b:
        calls_before = len(b.plugin.seen)
        other = CA("other-ca")
        issued: Issued | None
        if case == "wrong-ca":
            issued = other.issue("evil", dns=("evil.example",))
        elif case == "expired":
            issued = b.ca.issue(
                "old", valid_from=-dt.timedelta(days=3), valid_until=-dt.timedelta(days=1)
            )
        elif case == "not-yet-valid":
            issued = b.ca.issue(
                "future", valid_from=dt.timedelta(days=1), valid_until=dt.timedelta(days=3)
            )
        else:
            issued = None
        if case == "plaintext":
            ch = grpc.aio.insecure_channel(f"127.0.0.1:{b.port}")
        else:
            ch = direct(b.port, b.ca.pem, issued)
        async with ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ch.unary_unary(ECHO + "Unary")(b"x", timeout=5)
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE
        assert len(b.plugin.seen) == calls_before  # nothing reached the plugin
        await asyncio.sleep(0.1)
        # grpc's TLS layer names the reason on stderr, one line per refused handshake.
        logged = [
            line for line in capfd.readouterr().err.splitlines() if "Handshake failed" in line
        ]
        assert any(reason in line for line in logged), logged


async def test_identity_allow_list(tmp_path):
    args = ("--tls-allow-identity", NODE_SPIFFE, "--tls-allow-identity", "cn:ops-console")
    async with bridge(tmp_path, appliance_args=args) as b:
        # The node's certificate carries the allowed SPIFFE ID: every call type passes.
        async with channel(b.node_socket) as ch:
            assert await ch.unary_unary(ECHO + "Unary")(b"ok", timeout=5) == b"echo:ok"
            stream = ch.unary_stream(ECHO + "ServerStream")(b"2", timeout=5)
            assert [m async for m in stream] == [b"item-0", b"item-1"]
        console = b.ca.issue("ops-console")
        async with direct(b.port, b.ca.pem, console) as ch:
            assert await ch.unary_unary(ECHO + "Unary")(b"c", timeout=5) == b"echo:c"

        seen = len(b.plugin.seen)
        intruder = b.ca.issue("intruder", dns=("intruder.example", "ops-console"))
        async with direct(b.port, b.ca.pem, intruder) as ch:
            cases = (
                (ECHO + "Unary", "unary"),
                ("/no.Such/Method", "unary"),
                (ECHO + "ServerStream", "stream"),
                (ECHO + "Bidi", "bidi"),
            )
            for path, kind in cases:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    if kind == "unary":
                        await ch.unary_unary(path)(b"x", timeout=5)
                    elif kind == "stream":
                        _ = [m async for m in ch.unary_stream(path)(b"1", timeout=5)]
                    else:
                        call = ch.stream_stream(path)(timeout=5)
                        await call.write(b"x")
                        await call.read()
                        await call.code()
                        raise AssertionError("bidi call was not refused")
                assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED, path
                assert "dns:intruder.example" in err.value.details()
        assert len(b.plugin.seen) == seen
        [line] = b.appliance.lines.records("tls client refused")  # repeats are counted
        assert line["level"] == "warning"
        assert line["code"] == "PERMISSION_DENIED"
        assert line["presented"] == ["dns:intruder.example", "dns:ops-console", "cn:intruder"]
        assert line["method"] == ECHO + "Unary"
        assert "BEGIN" not in b.appliance.lines.getvalue()


def current(secret: SecretDir) -> Issued:
    return Issued(Path(secret.cert).read_bytes(), Path(secret.key).read_bytes())


# -- rotation -------------------------------------------------------------------------------


async def test_rotation_while_calls_flow(tmp_path):
    """Rotate CA bundles and both certificates the way Kubernetes updates a Secret volume."""
    args = ("--max-connection-age", "400ms", "--max-connection-age-grace", "10s")
    async with bridge(tmp_path, appliance_args=args) as b, channel(b.node_socket) as ch:
        ca1, ca2 = b.ca, CA("bridge-ca-2")
        server2 = ca2.issue("appliance-2", dns=(SERVER_NAME,))
        client2 = ca2.issue("node-one-2", uris=(NODE_SPIFFE,))
        failures: list[str] = []
        done = 0
        stop = asyncio.Event()

        async def caller(i: int) -> None:
            nonlocal done
            while not stop.is_set():
                try:
                    if i % 2:
                        reply = await ch.unary_unary(ECHO + "Unary")(b"r%d" % i, timeout=5)
                        assert reply == b"echo:r%d" % i
                    else:
                        got = [
                            m async for m in ch.unary_stream(ECHO + "ServerStream")(b"2", timeout=5)
                        ]
                        assert got == [b"item-0", b"item-1"]
                    done += 1
                except (grpc.aio.AioRpcError, AssertionError) as exc:
                    failures.append(repr(exc))
                await asyncio.sleep(0.005)

        slow = asyncio.ensure_future(ch.unary_unary(ECHO + "Slow")(b"1.5", timeout=10))
        callers = [asyncio.ensure_future(caller(i)) for i in range(4)]
        await asyncio.sleep(0.3)
        app_watch, node_watch = b.appliance.proxy.transport.watcher, b.node.proxy.transport.watcher
        assert app_watch is not None and node_watch is not None

        async def step(app_ca: bytes, app_cert: Issued, node_ca: bytes, node_cert: Issued, n: int):
            b.appliance.secret.write(app_ca, app_cert)
            b.node.secret.write(node_ca, node_cert)
            await wait_until(lambda: app_watch.reloads == n and node_watch.reloads == n)
            await asyncio.sleep(0.6)  # longer than the connection age: every connection renews

        server1, client1 = b.appliance.secret, b.node.secret
        old_server, old_client = current(server1), current(client1)
        both = ca1.pem + ca2.pem
        await step(both, old_server, both, old_client, 1)  # trust the new CA everywhere
        await step(both, server2, both, client2, 2)  # new certificates from the new CA
        await step(ca2.pem, server2, ca2.pem, client2, 3)  # retire the old CA
        stop.set()
        await asyncio.gather(*callers)
        assert await slow == b"slow-done"  # in flight through every swap, finished on its channel

        assert failures == []
        assert done > 50
        assert b.node.proxy.transport.channel is not None
        assert b.node.proxy.transport.channel.generation == 3

        # A new handshake presents the new server certificate and wants the new client CA.
        _, served = await asyncio.to_thread(tls_handshake, b.port, ca2.pem, client2, tmp_path)
        assert served == server2.sha256
        async with direct(b.port, ca1.pem + ca2.pem, ca1.issue("stale-client")) as old:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await old.unary_unary(ECHO + "Unary")(b"x", timeout=5)
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
        reloaded = b.appliance.lines.records("tls files reloaded")
        assert [r["cert_sha256"] for r in reloaded][-1] == server2.sha256


# -- across network namespaces ------------------------------------------------------------------


def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def netns():
    """A second network namespace joined to this one by a veth pair, or skip."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("network namespaces need root and iproute2")
    name = f"pptls{os.getpid() % 100000}"
    host_if, ns_if = f"{name}a", f"{name}b"
    try:
        _ip("netns", "add", name)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot create a network namespace here: {exc}")
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", name)
        _ip("addr", "add", "10.203.7.1/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", "10.203.7.2/30", "dev", ns_if)
        _ip("netns", "exec", name, "ip", "link", "set", ns_if, "up")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
        pytest.skip(f"cannot wire a veth pair here: {exc.stderr.decode().strip()}")
    yield name, "10.203.7.2"
    subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
    subprocess.run(["ip", "link", "del", host_if], check=False, capture_output=True)


async def test_bridge_across_network_namespaces(tmp_path, netns):
    name, address = netns
    ca = CA("netns-ca")
    app_secret = SecretDir(tmp_path / "appliance-tls")
    app_secret.write(ca.pem, ca.issue("appliance", dns=(SERVER_NAME,)))
    node_secret = SecretDir(tmp_path / "node-tls")
    node_secret.write(ca.pem, ca.issue("node-one", uris=(NODE_SPIFFE,)))
    plugin_sock, node_sock = str(tmp_path / "plugin.sock"), str(tmp_path / "node.sock")
    server, plugin = await start_recorder(plugin_sock)
    # The appliance runs as `plugproxy serve` inside the other namespace; UNIX sockets are
    # files, so the plugin socket is shared while TCP crosses the veth pair.
    appliance = spawn(
        ["ip", "netns", "exec", name, sys.executable, "-m", "plugproxy", "serve",
         "--listen", f"tls://{address}:7443", "--upstream", f"unix://{plugin_sock}",
         *app_secret.args(), "--tls-allow-identity", NODE_SPIFFE, "--admin-listen", "off",
         "--log-format", "json"]
    )  # fmt: skip
    node: serve.ProxyServer | None = None
    try:
        node, lines = await start_side(
            ["--listen", f"unix://{node_sock}", "--upstream", f"tls://{address}:7443",
             "--tls-server-name", SERVER_NAME, *node_secret.args(), *FAST]
        )  # fmt: skip
        deadline = time.monotonic() + 15
        while not await node.upstream.wait_ready(0.5):
            assert appliance.poll() is None, appliance.communicate()[0].decode()
            assert time.monotonic() < deadline, lines.getvalue()
        async with channel(node_sock) as ch:
            assert await ch.unary_unary(ECHO + "Unary")(b"far", timeout=5) == b"echo:far"
            bidi = ch.stream_stream(ECHO + "Bidi")(timeout=5)
            await bidi.write(b"ping")
            assert await bidi.read() == b"re:ping"
            await bidi.done_writing()
            assert await bidi.code() is grpc.StatusCode.OK
        assert plugin.seen[0].requests == [b"far"]
        # Nothing listens on the appliance address from this namespace's point of view.
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", 7443), timeout=1).close()
    finally:
        if node is not None:
            await node.stop(0)
        appliance.terminate()
        try:
            out = appliance.communicate(timeout=10)[0].decode()
        except subprocess.TimeoutExpired:
            appliance.kill()
            out = appliance.communicate()[0].decode()
        await server.stop(0)
    assert '"event":"tls enabled"' in out
