"""DRA through a real proxy in front of the bundled fake DRA plugin, whose one socket serves
DRAPlugin v1 and v1beta1 and DRA device health v1 and v1alpha1 (``--spec auto``): prepare and
unprepare in both versions and fast health streams cross it with the same message counts on
the plugin's side, the CO's side and in the proxy's metrics, every update judged (a breach
planted in each update is reported once per update), each call by its own version, and a
claim's calls in either version one at a time."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import grpc

from plugproxy.cli.serve import ProxyServer
from plugproxy.fakes import FakeKnobs, SpecClient, start_fake_plugin
from plugproxy.fakes.dra import FakeDraV1
from tests.support import start_proxy

DRA = "k8s.io.kubelet.pkg.apis.dra"
PREPARE = {v: f"/{DRA}.{v}.DRAPlugin/NodePrepareResources" for v in ("v1", "v1beta1")}
UNPREPARE = {v: f"/{DRA}.{v}.DRAPlugin/NodeUnprepareResources" for v in ("v1", "v1beta1")}
WATCH = {v: f"/{v}.DRAResourceHealth/NodeWatchResources" for v in ("v1", "v1alpha1")}


def _get(proxy: ProxyServer, path: str) -> str:
    assert proxy.admin is not None
    url = f"http://127.0.0.1:{proxy.admin.port}{path}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


async def _scrape(proxy: ProxyServer) -> tuple[dict[tuple[str, str], float], dict[str, Any]]:
    """/metrics as {(metric name, labels): value} and /violations, read over HTTP."""
    text = await asyncio.to_thread(_get, proxy, "/metrics")
    samples: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("plugproxy_") and "{" in line:
            head, value = line.rsplit(" ", 1)
            name, labels = head.split("{", 1)
            samples[(name, "{" + labels)] = float(value)
    return samples, json.loads(await asyncio.to_thread(_get, proxy, "/violations"))


def _metric(samples: dict[tuple[str, str], float], name: str, *parts: str) -> float:
    """The sum of ``name``'s samples whose labels contain every one of ``parts``."""
    return sum(
        v for (n, labels), v in samples.items() if n == name and all(p in labels for p in parts)
    )


def _claims(prefix: str, n: int) -> list[dict[str, str]]:
    return [
        {"namespace": "default", "uid": f"{prefix}-{i:04d}", "name": f"claim-{i}"} for i in range(n)
    ]


async def _watch(client: SpecClient, plugin: FakeDraV1, reads: int) -> int:
    """Read a health stream until ``reads`` updates arrived and at least two seconds passed,
    then let the plugin end it (OK) and read what it still sends; the updates read."""
    call = client.channel.unary_stream(
        client.method("NodeWatchResources").path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=client.method("NodeWatchResources").response_class.FromString,
    )(client.new("NodeWatchResourcesRequest"))
    count, start, ending = 0, time.monotonic(), False
    async for update in call:
        assert len(update.devices) == 8
        count += 1
        if not ending and count >= reads and time.monotonic() - start >= 2.0:
            plugin.end_streams()
            ending = True
    assert await call.code() is grpc.StatusCode.OK  # ended by the plugin, nothing lost
    return count


async def test_prepare_unprepare_and_fast_health_streams_are_counted_alike_and_all_judged(tmp_path):
    plugin_sock, listen = tmp_path / "dra.sock", tmp_path / "proxy.sock"
    knobs = FakeKnobs(stream_period=0, misbehave={"drahealth-value-unknown"})
    fake = await start_fake_plugin("dra.v1", f"unix://{plugin_sock}", knobs)
    plugin = fake.plugin
    assert isinstance(plugin, FakeDraV1)
    proxy = await start_proxy(str(listen), str(plugin_sock), "--admin-listen", "127.0.0.1:0")
    target = f"unix://{listen}"
    clients = {
        s: SpecClient(target, s)
        for s in ("dra.v1", "dra.v1beta1", "drahealth.v1", "drahealth.v1alpha1")
    }
    calls = {"v1": 40, "v1beta1": 10}
    try:
        for version, n in calls.items():
            c = clients[f"dra.{version}"]
            for claim in _claims(version, n):
                prepared = await c.call("NodePrepareResources", claims=[claim])
                assert [d.device_name for d in prepared.claims[claim["uid"]].devices] == ["gpu-0"]
                unprepared = await c.call("NodeUnprepareResources", claims=[claim])
                assert list(unprepared.claims) == [claim["uid"]]
        # v1: one update in each carries a health no HealthStatus value names.
        v1 = await _watch(clients["drahealth.v1"], plugin, 1000)
        sent_v1 = plugin.updates_sent
        # v1alpha1: clean.
        plugin.knobs.misbehave = set()
        v1alpha1 = await _watch(clients["drahealth.v1alpha1"], plugin, 1000)
        sent_v1alpha1 = plugin.updates_sent - sent_v1
        expected = {
            ("plugproxy_rpc_stream_messages_total", WATCH["v1"]): float(v1),
            ("plugproxy_rpc_stream_messages_total", WATCH["v1alpha1"]): float(v1alpha1),
            ("plugproxy_violations_total", WATCH["v1"]): float(v1),
        }
        for _ in range(200):  # until the proxy has counted what the client read
            samples, report = await _scrape(proxy)
            got = {
                (name, path): _metric(samples, name, f'method="{path}"') for name, path in expected
            }
            if got == expected:
                break
            await asyncio.sleep(0.05)
    finally:
        for c in clients.values():
            await c.close()
        await proxy.stop(0)
        await fake.stop(0)
    assert v1 >= 1000 and v1alpha1 >= 1000
    # The same count on the plugin's side, the CO's side and in the proxy's metrics.
    assert (sent_v1, sent_v1alpha1) == (v1, v1alpha1)
    assert got == expected
    for version in ("v1", "v1alpha1"):
        assert (
            _metric(
                samples,
                "plugproxy_rpc_duration_seconds_count",
                f'method="{WATCH[version]}"',
                'code="OK"',
                f'spec="drahealth.{version}"',
            )
            == 1
        )
    # Every update of v1 was judged: the planted breach, once per update, and nothing else.
    assert [(v["rule"], v["method"], v["party"], v["count"]) for v in report["violations"]] == [
        ("drahealth.health-value", WATCH["v1"], "plugin", v1)
    ]
    assert report["violations"][0]["section"] == "DRA health v1 api.proto §HealthStatus"
    # Each prepare and unprepare on both sides, judged by its own version.
    for version, n in calls.items():
        for path in (PREPARE[version], UNPREPARE[version]):
            assert len([r for r in plugin.calls if r.path == path]) == n
            assert (
                _metric(
                    samples,
                    "plugproxy_rpc_duration_seconds_count",
                    f'method="{path}"',
                    'code="OK"',
                    f'spec="dra.{version}"',
                )
                == n
            )
    assert report["calls_judged_by_spec"] == {
        "dra.v1": 2 * calls["v1"],
        "dra.v1beta1": 2 * calls["v1beta1"],
        "drahealth.v1": 1,
        "drahealth.v1alpha1": 1,
    }


async def test_a_socket_serving_both_versions_gets_each_call_judged_by_its_own(tmp_path):
    plugin_sock, listen = tmp_path / "dra.sock", tmp_path / "proxy.sock"
    knobs = FakeKnobs(misbehave={"dra-device-no-pool", "dra-claim-not-requested"})
    fake = await start_fake_plugin("dra.v1", f"unix://{plugin_sock}", knobs)
    proxy = await start_proxy(str(listen), str(plugin_sock), "--admin-listen", "127.0.0.1:0")
    try:
        for version, claim in zip(("v1", "v1beta1"), _claims("both", 2), strict=True):
            async with SpecClient(f"unix://{listen}", f"dra.{version}") as c:
                await c.call("NodePrepareResources", claims=[claim])
                await c.call("NodeUnprepareResources", claims=[claim])
        _, report = await _scrape(proxy)
    finally:
        await proxy.stop(0)
        await fake.stop(0)
    found = {(v["rule"], v["method"], v["spec"], v["section"]) for v in report["violations"]}
    assert found == {
        (rule, path[version], f"dra.{version}", f"DRA {version} api.proto §{section}")
        for version in ("v1", "v1beta1")
        for rule, path, section in (
            ("dra.required-field", PREPARE, "NodePrepareResources"),
            ("dra.claim-not-requested", UNPREPARE, "NodeUnprepareResourcesResponse"),
        )
    }


async def test_one_claim_is_prepared_and_unprepared_one_call_at_a_time_across_versions(tmp_path):
    """The claim uid keys the calls of both versions alike: kubelet's v1 prepare and an
    unprepare in v1beta1 of the same claim never overlap at the plugin; other claims do."""
    plugin_sock, listen = tmp_path / "dra.sock", tmp_path / "proxy.sock"
    fake = await start_fake_plugin("dra.v1", f"unix://{plugin_sock}", FakeKnobs(delays={"*": 0.2}))
    proxy = await start_proxy(str(listen), str(plugin_sock))
    same, other = _claims("key", 2)
    try:
        async with (
            SpecClient(f"unix://{listen}", "dra.v1") as v1,
            SpecClient(f"unix://{listen}", "dra.v1beta1") as v1beta1,
        ):
            await asyncio.gather(
                v1.call("NodePrepareResources", claims=[same]),
                v1beta1.call("NodeUnprepareResources", claims=[same]),
                v1beta1.call("NodePrepareResources", claims=[same]),
                v1.call("NodePrepareResources", claims=[other]),
                v1beta1.call("NodePrepareResources", claims=[other]),
            )
    finally:
        await proxy.stop(0)
        await fake.stop(0)
    overlap = fake.plugin.max_overlap_per_key()
    assert overlap[same["uid"]] == 1
    assert fake.plugin.max_inflight >= 2  # other claims' calls ran beside them
