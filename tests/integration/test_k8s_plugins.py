"""Kubernetes' own plugin APIs through a real proxy: KMS v2 keeps the plaintext out of every
output, the device plugin's ListAndWatch stream carries thousands of updates and outlives
connection ageing where ageing does not apply, and is cut by it where it does."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from plugproxy.cli import serve
from plugproxy.fakes import FakeKnobs, start_fake_plugin
from plugproxy.net.sockets import socket_answers
from plugproxy.spec.registry import Registry
from tests.support import start_proxy

REPO = Path(__file__).resolve().parents[2]
KMS = "/v2.KeyManagementService"
DEVICES = "/v1beta1.DevicePlugin"
REGISTRY = Registry(["kms.v2", "deviceplugin.v1beta1"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read().decode("utf-8", "replace")


def _stub(ch: grpc.aio.Channel, path: str) -> Any:
    info = REGISTRY.lookup(path)
    return ch.unary_unary(
        path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=info.response_class.FromString,
    )


def _new(path: str, **fields: Any) -> Any:
    info = REGISTRY.lookup(path)
    return info.request_class(**fields)


async def _wait_socket(path: Path, proc: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 30
    while not socket_answers(str(path), 0.2):
        assert proc.returncode is None, f"proxy exited with {proc.returncode}"
        assert time.monotonic() < deadline, "proxy did not listen in time"
        await asyncio.sleep(0.05)


def _forms(secret: bytes) -> dict[str, str]:
    return {
        "raw": secret.decode("latin-1"),
        "base64": base64.b64encode(secret).decode(),
        "hex": secret.hex(),
        "HEX": secret.hex().upper(),
    }


async def test_kms_round_trip_leaks_no_plaintext_from_a_real_proxy_process(tmp_path):
    plugin_sock, listen = tmp_path / "kms-plugin.sock", tmp_path / "kms.sock"
    fake = await start_fake_plugin("kms.v2", f"unix://{plugin_sock}")
    port = _free_port()
    out, err = tmp_path / "proxy.out", tmp_path / "proxy.err"
    args = [
        *("serve", "--listen", f"unix://{listen}", "--upstream", f"unix://{plugin_sock}"),
        *("--spec", "kms", "--admin-listen", f"127.0.0.1:{port}", "--log-level", "debug"),
        *("--log-payloads", "--validation", "audit"),
    ]
    # Spans go to the console exporter, i.e. into the stderr checked below.
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "kms-canary"}
    with out.open("wb") as o, err.open("wb") as e:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "plugproxy", *args, stdout=o, stderr=e, cwd=REPO, env=env
        )
    # Printable canaries make a raw match meaningful; random ones cover every byte value.
    plaintexts = [b"CANARY-DEK-%02d-" % i + os.urandom(8).hex().encode() for i in range(3)]
    plaintexts += [os.urandom(32) for _ in range(3)]
    try:
        await _wait_socket(listen, proc)
        async with grpc.aio.insecure_channel(f"unix:{listen}") as ch:
            status = await _stub(ch, f"{KMS}/Status")(_new(f"{KMS}/Status"), timeout=10)
            assert (status.healthz, status.version) == ("ok", "v2")
            for i, plaintext in enumerate(plaintexts):
                enc = await _stub(ch, f"{KMS}/Encrypt")(
                    _new(f"{KMS}/Encrypt", plaintext=plaintext, uid=f"enc-{i}"), timeout=10
                )
                assert enc.key_id == status.key_id and plaintext not in enc.ciphertext
                dec = await _stub(ch, f"{KMS}/Decrypt")(
                    _new(
                        f"{KMS}/Decrypt",
                        ciphertext=enc.ciphertext,
                        uid=f"dec-{i}",
                        key_id=enc.key_id,
                        annotations=dict(enc.annotations),
                    ),
                    timeout=10,
                )
                assert dec.plaintext == plaintext  # the round trip through the proxy works
            # A tampered ciphertext is refused by the plugin, and that refusal is logged too.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _stub(ch, f"{KMS}/Decrypt")(
                    _new(
                        f"{KMS}/Decrypt",
                        ciphertext=enc.ciphertext[:-1] + bytes([enc.ciphertext[-1] ^ 1]),
                        key_id=enc.key_id,
                    ),
                    timeout=10,
                )
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        metrics = _http(port, "/metrics")
        violations = _http(port, "/violations")
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 15)
        await fake.stop(0)
    stdout, stderr = out.read_text("latin-1"), err.read_text("latin-1")
    assert proc.returncode == 0
    assert stdout.count('"event":"call"') == 2 + 2 * len(plaintexts)  # payload log on
    assert stdout.count('"plaintext":"***"') == 2 * len(plaintexts)  # masked, not dropped
    assert "kms-canary" in stderr  # the spans were exported there
    assert 'spec="kms.v2"' in metrics and 'method="/v2.KeyManagementService/Decrypt"' in metrics
    outputs = {"stdout": stdout, "stderr": stderr, "/metrics": metrics, "/violations": violations}
    for i, plaintext in enumerate(plaintexts):
        for form, text in _forms(plaintext).items():
            for where, output in outputs.items():
                assert text not in output, f"plaintext {i} leaks as {form} in {where}"


async def _listandwatch(
    ch: grpc.aio.Channel, min_seconds: float, min_updates: int = 0, limit: float = 20.0
) -> tuple[int, grpc.StatusCode]:
    """Read updates until at least ``min_seconds`` passed and ``min_updates`` arrived (the
    stream then counts as open: OK), or the stream ends (its code), or ``limit`` passes."""
    info = REGISTRY.lookup(f"{DEVICES}/ListAndWatch")
    call = ch.unary_stream(
        info.path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=info.response_class.FromString,
    )(info.request_class())
    count = 0
    start = time.monotonic()
    try:
        async for update in call:
            assert len(update.devices) == 8
            count += 1
            elapsed = time.monotonic() - start
            if (elapsed >= min_seconds and count >= min_updates) or elapsed > limit:
                call.cancel()
                return count, grpc.StatusCode.OK
    except grpc.aio.AioRpcError as err:
        return count, err.code()
    return count, grpc.StatusCode.UNKNOWN  # the plugin never ends the stream by itself


AGE = ("--max-connection-age", "500ms", "--max-connection-age-grace", "500ms")


async def test_listandwatch_outlives_connection_age_on_a_unix_socket(tmp_path):
    """kubelet dials device plugins on UNIX sockets, where connections are not aged: the
    stream carries thousands of updates well past age + grace."""
    plugin_sock, listen = tmp_path / "dp.sock", tmp_path / "proxy.sock"
    fake = await start_fake_plugin(
        "deviceplugin.v1beta1", f"unix://{plugin_sock}", FakeKnobs(stream_period=0)
    )
    # --spec auto (the default) recognises the device plugin's methods by their paths.
    proxy = await start_proxy(str(listen), str(plugin_sock), "--admin-listen", "127.0.0.1:0", *AGE)
    try:
        async with grpc.aio.insecure_channel(f"unix:{listen}") as ch:
            count, state = await _listandwatch(ch, 1.5, min_updates=3000)
        assert proxy.admin is not None
        for _ in range(100):  # the stream's counts are added once the proxy saw it end
            metrics = _http(proxy.admin.port, "/metrics")
            if "ListAndWatch" in metrics and "CANCELLED" in metrics:
                break
            await asyncio.sleep(0.02)
    finally:
        await proxy.stop(0)
        await fake.stop(0)
    assert state is grpc.StatusCode.OK, f"stream ended with {state.name} after {count} updates"
    assert count >= 3000, count
    path = f"{DEVICES}/ListAndWatch"
    assert (
        f'plugproxy_rpc_duration_seconds_count{{code="CANCELLED",method="{path}",'
        'spec="deviceplugin.v1beta1"} 1.0'
    ) in metrics
    sent = next(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("plugproxy_rpc_stream_messages_total{") and path in line
    )
    assert sent >= count
    assert "csi_sidecar_operations_seconds_count{" not in metrics  # a CSI-only histogram


async def _tcp_proxy(tmp_path: Path, *extra: str) -> tuple[Any, Any, str]:
    plugin_sock = tmp_path / "dp.sock"
    fake = await start_fake_plugin(
        "deviceplugin.v1beta1", f"unix://{plugin_sock}", FakeKnobs(stream_period=0.001)
    )
    port = _free_port()
    settings = serve.parse_settings(
        [
            *("--listen", f"tcp://127.0.0.1:{port}", "--upstream", f"unix://{plugin_sock}"),
            *("--insecure-tcp", "--relay", "grpc", "--admin-listen", "off"),
            *("--spec", "device-plugin", *extra),
        ],
        environ={},
    )
    proxy = serve.ProxyServer(settings)
    await proxy.start()
    return fake, proxy, f"127.0.0.1:{port}"


async def test_connection_age_cuts_listandwatch_after_the_grace_on_tcp(tmp_path):
    """Over TCP the listen side ages connections: GOAWAY at --max-connection-age, then the
    connection is closed after the grace, stream or not."""
    fake, proxy, target = await _tcp_proxy(tmp_path, *AGE)
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            start = time.monotonic()
            count, state = await _listandwatch(ch, 10.0)
            took = time.monotonic() - start
    finally:
        await proxy.stop(0)
        await fake.stop(0)
    assert state is grpc.StatusCode.UNAVAILABLE, state
    assert 0.9 < took < 8.0, took  # age + grace, with grpc's jitter and a loaded machine
    assert count > 100


async def test_connection_age_zero_keeps_listandwatch_open_on_tcp(tmp_path):
    """What an operator configures for a TCP listener carrying ListAndWatch."""
    fake, proxy, target = await _tcp_proxy(tmp_path, "--max-connection-age", "0")
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            count, state = await _listandwatch(ch, 1.5, min_updates=500)
    finally:
        await proxy.stop(0)
        await fake.stop(0)
    assert state is grpc.StatusCode.OK, state
    assert count >= 500
