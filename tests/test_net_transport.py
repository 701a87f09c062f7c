"""Transport decisions: TLS settings checked at startup, identities, file watching, channels."""

from __future__ import annotations

import datetime as dt
import io
import ipaddress
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from plugproxy.cli import serve
from plugproxy.cli.flags import settings_from
from plugproxy.core.endpoints import ConfigError, parse_endpoint
from plugproxy.core.log import Logger
from plugproxy.net import tlsfiles, transport
from tests.support import ECHO, start_recorder

# -- test PKI -----------------------------------------------------------------------------


@dataclass
class Issued:
    cert_pem: bytes
    key_pem: bytes

    @property
    def sha256(self) -> str:
        return tlsfiles.fingerprint(self.cert_pem)


class CA:
    """A throwaway CA issuing leaf certificates with any SANs and validity window."""

    def __init__(self, name: str = "test-ca") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        cn: str,
        dns: tuple[str, ...] = (),
        uris: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        valid_from: dt.timedelta = dt.timedelta(hours=-1),
        valid_until: dt.timedelta = dt.timedelta(days=1),
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.UniformResourceIdentifier(u) for u in uris]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now + valid_from)
            .not_valid_after(now + valid_until)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )


class SecretDir:
    """Files laid out like a Kubernetes Secret volume: tls.crt -> ..data/tls.crt -> ..<ts>/."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.version = 0

    @property
    def ca(self) -> str:
        return str(self.root / "ca.crt")

    @property
    def cert(self) -> str:
        return str(self.root / "tls.crt")

    @property
    def key(self) -> str:
        return str(self.root / "tls.key")

    def args(self) -> list[str]:
        return ["--tls-ca", self.ca, "--tls-cert", self.cert, "--tls-key", self.key]

    def write(self, ca: bytes, issued: Issued) -> None:
        """Atomic update: new timestamped dir, then rename a new ..data link over the old."""
        self.version += 1
        stamp = f"..2026_01_01_00_00_{self.version:02d}.{os.getpid()}"
        data = self.root / stamp
        data.mkdir()
        (data / "ca.crt").write_bytes(ca)
        (data / "tls.crt").write_bytes(issued.cert_pem)
        (data / "tls.key").write_bytes(issued.key_pem)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(stamp)
        os.rename(tmp, self.root / "..data")
        for name in ("ca.crt", "tls.crt", "tls.key"):
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")


class Lines(io.StringIO):
    """Log stream the tests read back as JSON records."""

    def records(self, event: str | None = None) -> list[dict[str, object]]:
        out = [json.loads(line) for line in self.getvalue().splitlines() if line.strip()]
        return [r for r in out if event is None or r["event"] == event]


# -- settings checked at startup ------------------------------------------------------------


@pytest.fixture(scope="module")
def pki() -> dict[str, object]:
    ca = CA()
    return {"ca": ca, "leaf": ca.issue("node-one", dns=("node-1.example",))}


@pytest.fixture
def secret(tmp_path, pki) -> SecretDir:
    d = SecretDir(tmp_path / "tls")
    d.write(pki["ca"].pem, pki["leaf"])
    return d


def settings(*argv: str) -> serve.Resolved:
    return serve.resolve(serve.parse_settings(list(argv), environ={}))


UNIX = ("--listen", "unix:///tmp/pp-transport-test.sock")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--upstream", "tls://a:1"], "needs --tls-ca, --tls-cert, --tls-key"),
        (["--upstream", "tcp://a:1"], "pass --insecure-tcp"),
        (["--upstream", "unix:///x.sock", "--tls-cert", "c.pem"], "neither --listen nor"),
        (["--upstream", "unix:///x.sock", "--tls-allow-identity", "x"], "needs a tls:// --listen"),
        (["--upstream", "unix:///x.sock", "--tls-server-name", "x"], "needs a tls:// --upstream"),
        (["--upstream", "tcp://a:1", "--insecure-tcp", "--tcp-keepalive", "1s"], "at least 10s"),
    ],
)
def test_transport_misconfiguration_is_one_line(extra, expected):
    with pytest.raises(ConfigError) as err:
        settings(*UNIX, *extra)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_insecure_tcp_is_accepted_only_when_asked():
    got = settings(*UNIX, "--upstream", "tcp://127.0.0.1:9", "--insecure-tcp")
    assert got.upstream.port == 9


def test_tls_files_missing_directory_or_not_pem(tmp_path, secret):
    up = ["--upstream", "tls://a:1"]
    with pytest.raises(ConfigError, match=r"--tls-ca .*nope\.pem: no such file"):
        settings(*UNIX, *up, "--tls-ca", str(tmp_path / "nope.pem"), "--tls-cert", secret.cert,
                 "--tls-key", secret.key)  # fmt: skip
    with pytest.raises(ConfigError, match="is a directory"):
        settings(*UNIX, *up, "--tls-ca", str(tmp_path), "--tls-cert", secret.cert,
                 "--tls-key", secret.key)  # fmt: skip
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(ConfigError, match=r"--tls-cert .*no PEM certificate"):
        settings(*UNIX, *up, "--tls-ca", secret.ca, "--tls-cert", str(junk),
                 "--tls-key", secret.key)  # fmt: skip
    with pytest.raises(ConfigError, match=r"--tls-key .*no PEM private key"):
        settings(*UNIX, *up, "--tls-ca", secret.ca, "--tls-cert", secret.cert,
                 "--tls-key", str(junk))  # fmt: skip


def test_key_that_does_not_match_the_certificate(tmp_path, pki, secret):
    other = pki["ca"].issue("someone-else")
    wrong_key = tmp_path / "other.key"
    wrong_key.write_bytes(other.key_pem)
    with pytest.raises(ConfigError) as err:
        settings(*UNIX, "--upstream", "tls://a:1", "--tls-ca", secret.ca,
                 "--tls-cert", secret.cert, "--tls-key", str(wrong_key))  # fmt: skip
    assert "does not match the certificate" in str(err.value)
    assert "PRIVATE KEY" not in str(err.value)


def test_good_files_load_and_env_twins_work(secret, pki):
    env = {
        "PLUGPROXY_TLS_CA": secret.ca,
        "PLUGPROXY_TLS_CERT": secret.cert,
        "PLUGPROXY_TLS_KEY": secret.key,
        "PLUGPROXY_TLS_ALLOW_IDENTITY": "spiffe://td/a,dns:node-1.example",
    }
    ns = serve.parse_args(["--listen", "tls://127.0.0.1:0", "--upstream", "unix:///x"], environ=env)
    assert ns.tls_allow_identity == ["spiffe://td/a", "dns:node-1.example"]
    serve.resolve(settings_from(serve.ServeSettings, ns))
    material = tlsfiles.load(tlsfiles.TLSPaths(secret.ca, secret.cert, secret.key))
    assert material.cert_fingerprint == pki["leaf"].sha256
    assert material.ca_count == 1


# -- identities ----------------------------------------------------------------------------


def test_identity_kinds_and_matching():
    assert transport.parse_identity("dns:node-1") == ("dns", "node-1")
    assert transport.parse_identity("CN:node") == ("cn", "node")
    assert transport.parse_identity("spiffe://td/ns/x") == (None, "spiffe://td/ns/x")
    assert transport.parse_identity("uri:spiffe://td/x") == ("uri", "spiffe://td/x")
    policy = transport.IdentityPolicy(["spiffe://td/ns/csi", "cn:node-one", "dns:n2.example"])
    assert policy.allows([("uri", "spiffe://td/ns/csi")])
    assert policy.allows([("dns", "x"), ("cn", "node-one")])
    assert policy.allows([("dns", "n2.example")])
    assert not policy.allows([("cn", "n2.example")])  # typed entries match their kind only
    assert not policy.allows([("dns", "node-one")])
    assert not policy.allows([])
    with pytest.raises(ConfigError, match="nothing after dns:"):
        transport.parse_identity("dns:")


def test_presented_identities_from_auth_context():
    auth = {
        "transport_security_type": [b"ssl"],
        "x509_common_name": [b"node-one"],
        "peer_dns": [b"node-1.example"],
        "peer_uri": [b"spiffe://td/ns/csi"],
        "x509_pem_cert": [b"-----BEGIN CERTIFICATE-----..."],
    }
    assert transport.presented_identities(auth) == [
        ("dns", "node-1.example"),
        ("uri", "spiffe://td/ns/csi"),
        ("cn", "node-one"),
    ]


# -- options each side gets ------------------------------------------------------------------


def test_tcp_sides_get_keepalive_and_connection_age(secret):
    tls = transport.TransportSettings(
        tls_ca=secret.ca,
        tls_cert=secret.cert,
        tls_key=secret.key,
        max_connection_age=600.0,
        max_connection_age_grace=30.0,
    )
    listen, upstream = parse_endpoint("tls://127.0.0.1:0"), parse_endpoint("unix:///x.sock")
    t = transport.Transport(tls, listen, upstream, Logger(io.StringIO()))
    server = dict(t.server_options())
    assert server["grpc.max_connection_age_ms"] == 600_000
    assert server["grpc.max_connection_age_grace_ms"] == 30_000
    assert server["grpc.keepalive_time_ms"] == 30_000
    assert server["grpc.http2.min_ping_interval_without_data_ms"] <= 10_000
    assert t.channel_options() == []  # the UNIX upstream needs none of it

    s2 = serve.parse_settings(
        [*UNIX, "--upstream", "tls://appliance:7443", *secret.args(),
         "--tls-server-name", "appliance.example"],
        environ={},
    )  # fmt: skip
    assert s2.listen and s2.upstream
    t2 = transport.Transport(s2.transport, parse_endpoint(s2.listen), parse_endpoint(s2.upstream),
                             Logger(io.StringIO()))  # fmt: skip
    client = dict(t2.channel_options())
    assert client["grpc.keepalive_time_ms"] == 30_000
    assert client["grpc.keepalive_permit_without_calls"] == 1
    assert client["grpc.ssl_target_name_override"] == "appliance.example"
    assert t2.server_options() == []  # UNIX listen: no connection age, no keepalive


async def test_insecure_tcp_warns_at_every_start(tmp_path):
    server, _ = await start_recorder(str(tmp_path / "p.sock"))
    for _ in range(2):
        lines = Lines()
        settings = serve.parse_settings(
            ["--listen", "tcp://127.0.0.1:0", "--upstream", f"unix://{tmp_path}/p.sock",
             "--insecure-tcp", "--admin-listen", "off"],
            environ={},
        )  # fmt: skip
        proxy = serve.ProxyServer(settings, logger=Logger(lines), stages=[])
        await proxy.start()
        try:
            assert proxy.port > 0
            async with grpc.aio.insecure_channel(f"127.0.0.1:{proxy.port}") as ch:
                assert await ch.unary_unary(ECHO + "Unary")(b"x", timeout=5) == b"echo:x"
        finally:
            await proxy.stop(0)
        warned = lines.records("insecure tcp: calls and secrets cross the network unencrypted")
        assert len(warned) == 1
        assert warned[0]["level"] == "warning"
        assert warned[0]["endpoints"] == ["listen=tcp://127.0.0.1:0"]
    await server.stop(0)


# -- watching files ----------------------------------------------------------------------------


def test_watcher_follows_symlink_swap_and_ignores_touch(secret, pki):
    paths = tlsfiles.TLSPaths(secret.ca, secret.cert, secret.key)
    lines = Lines()
    watcher = tlsfiles.Watcher(paths, tlsfiles.load(paths), Logger(lines))
    got: list[tlsfiles.Material] = []
    watcher.add_listener(got.append)
    assert not watcher.poll()
    os.utime(os.path.realpath(secret.cert))  # touched, same bytes
    assert not watcher.poll()
    new_leaf = pki["ca"].issue("node-one-renewed")
    secret.write(pki["ca"].pem, new_leaf)
    assert watcher.poll()
    assert got[-1].cert_fingerprint == new_leaf.sha256
    assert watcher.reloads == 1
    [line] = lines.records("tls files reloaded")
    assert line["cert_sha256"] == new_leaf.sha256
    assert "PRIVATE" not in lines.getvalue()


def test_watcher_keeps_working_material_during_a_non_atomic_update(tmp_path, pki):
    ca = tmp_path / "ca.pem"
    cert = tmp_path / "cert.pem"
    key = tmp_path / "key.pem"
    leaf = pki["leaf"]
    ca.write_bytes(pki["ca"].pem)
    cert.write_bytes(leaf.cert_pem)
    key.write_bytes(leaf.key_pem)
    paths = tlsfiles.TLSPaths(str(ca), str(cert), str(key))
    lines = Lines()
    watcher = tlsfiles.Watcher(paths, tlsfiles.load(paths), Logger(lines))
    new = pki["ca"].issue("renewed")
    cert.write_bytes(new.cert_pem)  # the key follows a moment later
    assert not watcher.poll()
    assert not watcher.poll()
    assert watcher.material.cert_fingerprint == leaf.sha256
    assert (
        len(lines.records("tls files changed but are not usable yet; keeping the current ones"))
        == 1
    )
    key.write_bytes(new.key_pem)
    assert watcher.poll()
    assert watcher.material.cert_fingerprint == new.sha256


def test_a_tls_listen_port_in_use_is_one_line_and_exit_2(tmp_path, secret):
    """grpc raises where a plain socket bind returns an error: the same one line either way."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "plugproxy", "serve", "--listen", f"tls://127.0.0.1:{port}",
             "--upstream", f"unix://{tmp_path}/plugin.sock", "--tls-ca", secret.ca,
             "--tls-cert", secret.cert, "--tls-key", secret.key, "--admin-listen", "off",
             "--listen-when", "start"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        taken.close()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("plugproxy: error:")]
    assert f"tls://127.0.0.1:{port}" in line and "cannot bind" in line
