"""`plugproxy demo --spec kms.v2|device-plugin`: Kubernetes' own plugin APIs through the proxy.

Same shape as the CSI demo: the bundled fake plugin, the proxy in front of it with payload
logging on, a real gRPC client, then the call log with the sensitive fields masked. The KMS
demo shows that the Encrypt/Decrypt round trip worked without printing the plaintext; the
device plugin demo reads a stream of device health updates through the proxy.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import grpc

from plugproxy import serve
from plugproxy.demo import Tee
from plugproxy.fakes import FakeKnobs, start_fake_plugin
from plugproxy.log import Logger
from plugproxy.registry import Registry, spec_package

LISTANDWATCH_UPDATES = 5


class _Client:
    """Unary and server-streaming calls of one spec, messages built from its descriptors."""

    def __init__(self, ch: grpc.aio.Channel, spec: str, out: TextIO) -> None:
        self.ch = ch
        self.registry = Registry([spec])
        self.out = out
        self.failures = 0

    def _info(self, path: str) -> Any:
        info = self.registry.lookup(path)
        assert info.request_class is not None and info.response_class is not None
        return info

    def _show(self, path: str, code: str, start: float, note: str) -> None:
        ms = (time.perf_counter() - start) * 1000
        self.out.write(f"  {path:52} {code:18} {ms:7.1f} ms  {note}\n")

    async def unary(self, path: str, note: Callable[[Any], str], **fields: Any) -> Any:
        info = self._info(path)
        stub = self.ch.unary_unary(
            path,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=info.response_class.FromString,
        )
        start = time.perf_counter()
        try:
            response = await stub(info.request_class(**fields), timeout=10)
        except grpc.aio.AioRpcError as err:
            self.failures += 1
            self._show(path, err.code().name, start, err.details() or "")
            return None
        self._show(path, "OK", start, note(response))
        return response

    async def stream(self, path: str, count: int, note: Callable[[list[Any]], str]) -> list[Any]:
        info = self._info(path)
        stub = self.ch.unary_stream(
            path,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=info.response_class.FromString,
        )
        start = time.perf_counter()
        call = stub(info.request_class(), timeout=30)
        got: list[Any] = []
        try:
            async for message in call:
                got.append(message)
                if len(got) >= count:
                    break
        except grpc.aio.AioRpcError as err:
            self.failures += 1
            self._show(path, err.code().name, start, err.details() or "")
            return got
        call.cancel()  # kubelet keeps it open for the plugin's lifetime; the demo has seen enough
        self._show(path, "OK (cancelled)", start, note(got))
        return got


def _leaks(secret: bytes, text: str) -> list[str]:
    """Where ``secret`` shows in ``text``: raw, base64 or hex."""
    forms = {
        "raw": secret.decode("latin-1"),
        "base64": base64.b64encode(secret).decode(),
        "hex": secret.hex(),
    }
    return [name for name, form in forms.items() if form in text]


async def _kms(client: _Client, out: TextIO) -> tuple[bool, bytes]:
    pkg = spec_package("kms.v2")
    service = f"/{pkg}.KeyManagementService"
    # What kube-apiserver encrypts: the seed of a fresh data encryption key.
    plaintext = os.urandom(32)
    await client.unary(
        f"{service}/Status",
        lambda r: f"healthz={r.healthz} version={r.version} key_id={r.key_id}",
    )
    enc = await client.unary(
        f"{service}/Encrypt",
        lambda r: f"{len(r.ciphertext)} ciphertext bytes, key_id={r.key_id}",
        plaintext=plaintext,
        uid="demo-encrypt-0001",
    )
    if enc is None:
        return False, plaintext
    dec = await client.unary(
        f"{service}/Decrypt",
        lambda r: f"{len(r.plaintext)} plaintext bytes",
        ciphertext=enc.ciphertext,
        uid="demo-decrypt-0001",
        key_id=enc.key_id,
        annotations=dict(enc.annotations),
    )
    ok = dec is not None and dec.plaintext == plaintext
    digest = hashlib.sha256(plaintext).hexdigest()[:12]
    out.write(
        f"\n  round trip: Decrypt returned {'the same' if ok else 'OTHER'} {len(plaintext)}"
        f" bytes that went into Encrypt (sha256 {digest}…; the plaintext itself is not shown)\n"
    )
    return ok, plaintext


async def _device_plugin(client: _Client, out: TextIO) -> tuple[bool, bytes]:
    service = f"/{spec_package('deviceplugin.v1beta1')}.DevicePlugin"
    await client.unary(
        f"{service}/GetDevicePluginOptions",
        lambda r: (
            f"pre_start_required={r.pre_start_required}"
            f" get_preferred_allocation_available={r.get_preferred_allocation_available}"
        ),
    )

    def health(updates: list[Any]) -> str:
        counts = [sum(d.health == "Healthy" for d in u.devices) for u in updates]
        total = len(updates[0].devices) if updates else 0
        return f"{len(updates)} updates, healthy of {total}: {counts}"

    updates = await client.stream(f"{service}/ListAndWatch", LISTANDWATCH_UPDATES, health)
    ids = [d.ID for d in updates[0].devices] if updates else []
    await client.unary(
        f"{service}/GetPreferredAllocation",
        lambda r: f"prefers {list(r.container_responses[0].deviceIDs)}",
        container_requests=[
            {"available_deviceIDs": ids, "must_include_deviceIDs": ids[-1:], "allocation_size": 2}
        ],
    )
    await client.unary(
        f"{service}/Allocate",
        lambda r: (
            f"{len(r.container_responses[0].devices)} device nodes, envs"
            f" {sorted(r.container_responses[0].envs)}"
        ),
        container_requests=[{"devices_ids": ids[:2]}],
    )
    await client.unary(f"{service}/PreStartContainer", lambda r: "", devices_ids=ids[:2])
    return len(updates) == LISTANDWATCH_UPDATES, b""


def _show_metrics(admin: str, spec: str, out: TextIO) -> None:
    with urllib.request.urlopen(f"{admin}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    wanted = (
        f'plugproxy_rpc_duration_seconds_count{{code="OK",method="/{spec_package(spec)}.',
        "plugproxy_rpc_stream_messages_total{",
        "plugproxy_violations_total{",
    )
    for line in text.splitlines():
        if line.startswith(wanted):
            out.write(f"  {line}\n")


def _show_log(log: str, out: TextIO) -> None:
    for line in log.splitlines():
        if " call " in line and "request=" in line and "***" in line:
            out.write(f"  {line[:500]}{'…' if len(line) > 500 else ''}\n")


async def run(spec: str, ns: argparse.Namespace) -> int:
    out = sys.stdout
    drive: Callable[[_Client, TextIO], Awaitable[tuple[bool, bytes]]] = (
        _kms if spec == "kms.v2" else _device_plugin
    )
    with tempfile.TemporaryDirectory(prefix="plugproxy-demo-") as tmp:
        plugin_sock, proxy_sock = f"{tmp}/plugin.sock", f"{tmp}/proxy.sock"
        fake = await start_fake_plugin(spec, f"unix://{plugin_sock}", FakeKnobs(stream_period=0.05))
        proxy_ns = serve.parse_args(
            [
                *("--listen", f"unix://{proxy_sock}", "--upstream", f"unix://{plugin_sock}"),
                *("--spec", spec, "--admin-listen", "127.0.0.1:0"),
                *("--log-payloads", "--log-format", "text"),
            ],
            environ={},
        )
        log = Tee(echo=ns.proxy_log == "stderr")
        proxy = serve.ProxyServer(proxy_ns, logger=Logger(log, fmt="text"))
        await proxy.start()
        await proxy.upstream.wait_ready(5)
        assert proxy.admin is not None
        admin = f"http://127.0.0.1:{proxy.admin.port}"
        what = "KMS v2 plugin" if spec == "kms.v2" else "device plugin"
        out.write(f"plugproxy demo: client -> plugproxy -> fake {what} ({spec})\n")
        out.write(f"  client socket unix://{proxy_sock}\n  plugin socket unix://{plugin_sock}\n")
        out.write(f"  admin         {admin}  (/metrics /healthz /readyz /violations)\n\n")
        out.write("1. Calls through the proxy:\n")
        try:
            async with grpc.aio.insecure_channel(f"unix:{proxy_sock}") as ch:
                client = _Client(ch, spec, out)
                ok, secret = await drive(client, out)
            out.write("\n2. Metrics scraped from /metrics (excerpt):\n")
            _show_metrics(admin, spec, out)
        finally:
            await proxy.stop(1)
            await fake.stop(0)
        out.write("\n3. The call log, sensitive fields masked (***):\n")
        text = log.getvalue()
        _show_log(text, out)
        leaked = _leaks(secret, text) if secret else []
        if secret:
            out.write(
                "\n  the plaintext appears in the proxy's log (raw, base64 or hex):"
                f" {'YES: ' + ', '.join(leaked) if leaked else 'no'}\n"
            )
        return 0 if ok and client.failures == 0 and not leaked else 1
