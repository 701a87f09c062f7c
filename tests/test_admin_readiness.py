"""/readyz over real HTTP: upstream reachable and the plugin's Probe says ready."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from plugproxy.admin.readiness import probe_paths
from plugproxy.spec.registry import load_spec
from tests.support import start_proxy, wait_until
from tests.test_stages_metrics import ScriptedPlugin, http_get, start_plugin

CSI_PROBE = "/csi.v1.Identity/Probe"
CMI_PROBE = "/cmi.v1.Identity/Probe"


def probe_response(spec: str, ready: bool | None) -> bytes:
    msg = load_spec(spec).message_class(f"{spec}.ProbeResponse")()
    if ready is not None:
        msg.ready.value = ready
    return bytes(msg.SerializeToString())


def probes(plugin: ScriptedPlugin, path: str = CSI_PROBE) -> int:
    return sum(1 for p, _ in plugin.seen if p == path)


@pytest.fixture
async def paths(tmp_path: Any) -> AsyncIterator[tuple[str, str]]:
    yield str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")


async def start(listen: str, upstream: str, *args: str) -> Any:
    return await start_proxy(listen, upstream, "--admin-listen", "127.0.0.1:0", *args, stages=[])


async def test_readyz_follows_the_plugin_and_its_probe(paths):
    upstream, listen = paths
    plugin = ScriptedPlugin()
    plugin.answer(CSI_PROBE, probe_response("csi.v1", True))
    server = await start_plugin(upstream, plugin)
    proxy = await start(listen, upstream, "--readiness-cache-ttl", "0")
    try:
        await wait_until(lambda: proxy.upstream.state.value == "up")
        assert await http_get(proxy, "/readyz") == (200, "ready")
        assert probes(plugin) == 1

        plugin.answer(CSI_PROBE, probe_response("csi.v1", False))
        status, body = await http_get(proxy, "/readyz")
        assert status == 503
        assert "ready: false" in body

        # ready is a BoolValue: absent means ready (CSI v1.12 §Probe).
        plugin.answer(CSI_PROBE, probe_response("csi.v1", None))
        assert (await http_get(proxy, "/readyz"))[0] == 200

        plugin.fail(CSI_PROBE, grpc.StatusCode.FAILED_PRECONDITION, "missing device")
        status, body = await http_get(proxy, "/readyz")
        assert status == 503
        assert "Probe failed: FAILED_PRECONDITION" in body

        plugin.answer(CSI_PROBE, probe_response("csi.v1", True))
        await server.stop(0)
        await wait_until(lambda: proxy.upstream.state.value == "down")
        status, body = await http_get(proxy, "/readyz")
        assert status == 503
        assert upstream in body

        server = await start_plugin(upstream, plugin)
        await wait_until(lambda: proxy.upstream.state.value == "up")
        assert await http_get(proxy, "/readyz") == (200, "ready")
        assert (await http_get(proxy, "/healthz"))[0] == 200
    finally:
        await proxy.stop(0)
        await server.stop(0)


async def test_probe_results_are_cached_across_concurrent_probers(paths):
    upstream, listen = paths
    plugin = ScriptedPlugin()
    plugin.answer(CSI_PROBE, probe_response("csi.v1", True), delay=0.1)
    server = await start_plugin(upstream, plugin)
    proxy = await start(listen, upstream, "--readiness-cache-ttl", "30s")
    try:
        await wait_until(lambda: proxy.upstream.state.value == "up")
        results = await asyncio.gather(*(http_get(proxy, "/readyz") for _ in range(8)))
        assert all(r == (200, "ready") for r in results)
        assert probes(plugin) == 1
    finally:
        await proxy.stop(0)
        await server.stop(0)


async def test_cmi_probe_is_used_when_the_plugin_has_no_csi_identity(paths):
    upstream, listen = paths
    plugin = ScriptedPlugin()
    plugin.answer(CMI_PROBE, probe_response("cmi.v1", False))
    server = await start_plugin(upstream, plugin)
    proxy = await start(listen, upstream, "--readiness-cache-ttl", "0")
    try:
        await wait_until(lambda: proxy.upstream.state.value == "up")
        status, body = await http_get(proxy, "/readyz")
        assert status == 503 and "not ready" in body
        plugin.answer(CMI_PROBE, probe_response("cmi.v1", True))
        assert (await http_get(proxy, "/readyz"))[0] == 200
        # The spec that answered is remembered: csi.v1 is not asked again.
        assert probes(plugin, CMI_PROBE) == 2
    finally:
        await proxy.stop(0)
        await server.stop(0)


async def test_plugin_without_any_probe_is_ready_when_reachable(paths):
    upstream, listen = paths
    plugin = ScriptedPlugin()  # answers nothing: every Probe is UNIMPLEMENTED (like COSI)
    server = await start_plugin(upstream, plugin)
    proxy = await start(listen, upstream, "--readiness-cache-ttl", "0")
    try:
        await wait_until(lambda: proxy.upstream.state.value == "up")
        assert (await http_get(proxy, "/readyz"))[0] == 200
        assert (await http_get(proxy, "/readyz"))[0] == 200
    finally:
        await proxy.stop(0)
        await server.stop(0)


async def test_a_slow_probe_answers_503_within_the_timeout(paths):
    upstream, listen = paths
    plugin = ScriptedPlugin()
    plugin.answer(CSI_PROBE, probe_response("csi.v1", True), delay=3)
    server = await start_plugin(upstream, plugin)
    proxy = await start(listen, upstream, "--readiness-probe-timeout", "300ms")
    try:
        await wait_until(lambda: proxy.upstream.state.value == "up")
        loop = asyncio.get_running_loop()
        began = loop.time()
        status, body = await http_get(proxy, "/readyz")
        assert loop.time() - began < 2
        assert status == 503
        assert "did not answer within 0.3s" in body
    finally:
        await proxy.stop(0)
        await server.stop(0)


async def test_probe_off_checks_only_the_connection(paths):
    upstream, listen = paths
    plugin = ScriptedPlugin()
    plugin.answer(CSI_PROBE, probe_response("csi.v1", False))
    server = await start_plugin(upstream, plugin)
    proxy = await start(listen, upstream, "--readiness-probe", "off")
    try:
        await wait_until(lambda: proxy.upstream.state.value == "up")
        assert (await http_get(proxy, "/readyz"))[0] == 200
        assert probes(plugin) == 0
    finally:
        await proxy.stop(0)
        await server.stop(0)


def test_probe_order_follows_the_served_specs():
    assert probe_paths(["csi.v0", "csi.v1", "cosi.v1alpha1", "cmi.v1"]) == [
        ("csi.v1", CSI_PROBE),
        ("cmi.v1", CMI_PROBE),
        ("csi.v0", "/csi.v0.Identity/Probe"),
    ]
    assert probe_paths(["cosi.v1alpha1"]) == []
