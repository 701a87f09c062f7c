"""`plugproxy demo --spec kms.v2|device-plugin|dra`: Kubernetes' own plugin APIs through the proxy.

Same shape as the CSI demo: the bundled fake plugin, the proxy in front of it with payload
logging on, a real gRPC client, then the call log with the sensitive fields masked. The KMS
demo shows that the Encrypt/Decrypt round trip worked without printing the plaintext; the
device plugin demo reads a stream of device health updates through the proxy; the DRA demo
prepares claims in v1 and v1beta1 on one socket, each judged by its own version, and reads
the DRA device health stream.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import grpc

from plugproxy.cli.tee import start_demo_proxy
from plugproxy.fakes import FakeKnobs, start_fake_plugin
from plugproxy.fakes.knobs import served_specs
from plugproxy.spec.registry import Registry, spec_package

LISTANDWATCH_UPDATES = 5
DRA = "k8s.io.kubelet.pkg.apis.dra"


class _Client:
    """Unary and server-streaming calls of one spec, messages built from its descriptors."""

    def __init__(self, ch: grpc.aio.Channel, spec: str, out: TextIO) -> None:
        self.ch = ch
        self.registry = Registry(served_specs(spec))
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


async def _dra(client: _Client, out: TextIO) -> tuple[bool, bytes]:
    claims = [
        {"namespace": "default", "uid": f"4a3f-demo-000{i}", "name": f"gpu-claim-{i}"}
        for i in range(3)
    ]

    def devices(r: Any) -> str:
        got = {uid: [d.device_name for d in e.devices] or e.error for uid, e in r.claims.items()}
        return f"{len(r.claims)} claim(s): {got}"

    # kubelet asks for v1 first; an older kubelet speaks v1beta1 to the same socket.
    v1, v1beta1 = f"/{DRA}.v1.DRAPlugin", f"/{DRA}.v1beta1.DRAPlugin"
    prepared = await client.unary(f"{v1}/NodePrepareResources", devices, claims=claims[:2])
    await client.unary(f"{v1beta1}/NodePrepareResources", devices, claims=claims[2:])

    def health(updates: list[Any]) -> str:
        counts = [sum(d.health == 1 for d in u.devices) for u in updates]
        total = len(updates[0].devices) if updates else 0
        return f"{len(updates)} updates, healthy of {total}: {counts}"

    updates = await client.stream(
        "/v1.DRAResourceHealth/NodeWatchResources", LISTANDWATCH_UPDATES, health
    )
    for service, mine in ((v1, claims[:2]), (v1beta1, claims[2:])):
        await client.unary(
            f"{service}/NodeUnprepareResources",
            lambda r: f"{len(r.claims)} claim(s) unprepared",
            claims=mine,
        )
    return prepared is not None and len(updates) == LISTANDWATCH_UPDATES, b""


def _show_metrics(admin: str, spec: str, out: TextIO) -> None:
    with urllib.request.urlopen(f"{admin}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    # Every spec the fake serves (a DRA plugin's socket has four), streams cancelled included.
    methods = tuple(f'method="/{spec_package(s)}.' for s in served_specs(spec))
    for line in text.splitlines():
        calls = line.startswith("plugproxy_rpc_duration_seconds_count{")
        if (calls and any(m in line for m in methods)) or line.startswith(
            ("plugproxy_rpc_stream_messages_total{", "plugproxy_violations_total{")
        ):
            out.write(f"  {line}\n")


def _show_judged(admin: str, out: TextIO) -> None:
    with urllib.request.urlopen(f"{admin}/violations", timeout=5) as resp:
        report = json.loads(resp.read())
    by_spec = ", ".join(f"{s} {n}" for s, n in report["calls_judged_by_spec"].items())
    out.write(f"  calls judged by spec: {by_spec}; violations: {report['total']}\n")


def _show_log(log: str, out: TextIO, marker: str = "***") -> None:
    for line in log.splitlines():
        if " call " in line and "request=" in line and marker in line:
            out.write(f"  {line[:500]}{'…' if len(line) > 500 else ''}\n")


async def run(spec: str, ns: argparse.Namespace) -> int:
    out = sys.stdout
    if spec.startswith("drahealth."):
        spec = "dra.v1"  # the health stream is served by a DRA plugin, beside DRAPlugin
    drivers: dict[str, Callable[[_Client, TextIO], Awaitable[tuple[bool, bytes]]]] = {
        "kms.v2": _kms,
        "deviceplugin.v1beta1": _device_plugin,
        "dra.v1": _dra,
    }
    drive = drivers[spec]
    with tempfile.TemporaryDirectory(prefix="plugproxy-demo-") as tmp:
        plugin_sock, proxy_sock = f"{tmp}/plugin.sock", f"{tmp}/proxy.sock"
        fake = await start_fake_plugin(spec, f"unix://{plugin_sock}", FakeKnobs(stream_period=0.05))
        proxy, log, admin = await start_demo_proxy(
            plugin_sock,
            proxy_sock,
            # A DRA socket serves two DRAPlugin versions and the health service: auto
            # judges each call by its own.
            *("--spec", "auto" if spec == "dra.v1" else spec),
            echo=ns.proxy_log == "stderr",
        )
        what = {"kms.v2": "KMS v2 plugin", "dra.v1": "DRA kubelet plugin"}.get(
            spec, "device plugin"
        )
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
            _show_judged(admin, out)
        finally:
            await proxy.stop(1)
            await fake.stop(0)
        text = log.getvalue()
        if spec == "dra.v1":
            out.write("\n3. The call log (nothing in these APIs is sensitive; none masked):\n")
            _show_log(text, out, "/NodePrepareResources")
        else:
            out.write("\n3. The call log, sensitive fields masked (***):\n")
            _show_log(text, out)
        leaked = _leaks(secret, text) if secret else []
        if secret:
            out.write(
                "\n  the plaintext appears in the proxy's log (raw, base64 or hex):"
                f" {'YES: ' + ', '.join(leaked) if leaked else 'no'}\n"
            )
        return 0 if ok and client.failures == 0 and not leaked else 1
