"""Metrics stage: values and labels scraped over real HTTP after real calls through the proxy."""

from __future__ import annotations

import asyncio
import io
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from plugproxy import __version__
from plugproxy.admin import server as admin
from plugproxy.api import Call, CallKind, MethodInfo, Runtime, StatusCode
from plugproxy.cli import serve
from plugproxy.core.log import Logger
from plugproxy.spec.registry import Registry, load_spec
from plugproxy.stages import metrics
from plugproxy.stages.metrics import MetricsStage, go_code_name, register_process_metrics
from tests.support import channel, start_proxy, wait_until

CSI = load_spec("csi.v1")
INFO = "/csi.v1.Identity/GetPluginInfo"
CREATE = "/csi.v1.Controller/CreateVolume"
DELETE = "/csi.v1.Controller/DeleteVolume"
ALLOCATED = "/csi.v1.SnapshotMetadata/GetMetadataAllocated"
DRIVER = "fake.example.com"

Unary = Callable[[bytes, Any], Awaitable[bytes]]
Streaming = Callable[[bytes, Any], AsyncIterator[bytes]]


class ScriptedPlugin(grpc.GenericRpcHandler):
    """A raw-bytes plugin answering the paths it is given; records each call's metadata."""

    def __init__(self) -> None:
        self.unary: dict[str, Unary] = {}
        self.streams: dict[str, Streaming] = {}
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.raw_seen: list[tuple[tuple[str, Any], ...]] = []

    def _record(self, path: str, context: Any) -> None:
        metadata = tuple(context.invocation_metadata() or ())
        self.seen.append((path, dict(metadata)))
        self.raw_seen.append(metadata)

    def service(self, details: Any) -> grpc.RpcMethodHandler | None:
        path = details.method
        if path in self.unary:
            fn = self.unary[path]

            async def unary(request: bytes, context: Any) -> bytes:
                self._record(path, context)
                return await fn(request, context)

            return grpc.unary_unary_rpc_method_handler(unary)
        if path in self.streams:
            gen = self.streams[path]

            async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
                self._record(path, context)
                async for item in gen(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(stream)
        return None

    def answer(self, path: str, response: bytes, delay: float = 0.0) -> None:
        async def fn(request: bytes, context: Any) -> bytes:
            if delay:
                await asyncio.sleep(delay)
            return response

        self.unary[path] = fn

    def fail(self, path: str, code: grpc.StatusCode, message: str = "") -> None:
        async def fn(request: bytes, context: Any) -> bytes:
            await context.abort(code, message)
            return b""

        self.unary[path] = fn


def info_response(name: str = DRIVER) -> bytes:
    cls = CSI.message_class("csi.v1.GetPluginInfoResponse")
    return cls(name=name, vendor_version="1").SerializeToString()


def allocated_stream(count: int) -> Streaming:
    cls = CSI.message_class("csi.v1.GetMetadataAllocatedResponse")

    async def gen(request: bytes, context: Any) -> AsyncIterator[bytes]:
        for i in range(count):
            yield cls(volume_capacity_bytes=1024 * (i + 1)).SerializeToString()

    return gen


async def start_plugin(path: str, plugin: ScriptedPlugin) -> grpc.aio.Server:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([plugin])
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server


async def start_metrics_proxy(
    listen: str, upstream: str, *args: str
) -> tuple[serve.ProxyServer, MetricsStage]:
    """A proxy whose only stage is metrics; /metrics serves that stage's registry."""
    settings = serve.parse_settings(
        ["--listen", f"unix://{listen}", "--upstream", f"unix://{upstream}", *args], environ={}
    )
    registry = CollectorRegistry()
    stage = MetricsStage(registry)
    proxy = serve.ProxyServer(settings, stages=[stage])
    stage._upstream = proxy.upstream
    stage._csi_info_path = metrics.csi_info_path(proxy.registry)
    register_process_metrics(registry, proxy.upstream)
    proxy.runtime.admin_routes["/metrics"] = admin.metrics(registry)
    await proxy.start()
    return proxy, stage


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def http_get(proxy: serve.ProxyServer, path: str) -> tuple[int, str]:
    """GET an admin path over real HTTP, from a thread (the admin server may call the loop)."""
    assert proxy.admin is not None
    return await asyncio.to_thread(_get, f"http://127.0.0.1:{proxy.admin.port}{path}")


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


async def scrape(proxy: serve.ProxyServer) -> Samples:
    status, body = await http_get(proxy, "/metrics")
    assert status == 200
    return parse(body)


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
async def plugin(tmp_path: Any) -> AsyncIterator[tuple[ScriptedPlugin, str, str]]:
    upstream = str(tmp_path / "plugin.sock")
    scripted = ScriptedPlugin()
    server = await start_plugin(upstream, scripted)
    yield scripted, upstream, str(tmp_path / "proxy.sock")
    await server.stop(0)


ADMIN = ("--admin-listen", "127.0.0.1:0")


async def test_unary_calls_are_counted_by_spec_method_and_code(plugin):
    scripted, upstream, listen = plugin
    scripted.answer(INFO, info_response())
    scripted.answer(CREATE, b"")
    scripted.fail(DELETE, grpc.StatusCode.NOT_FOUND, "no such volume")
    proxy, stage = await start_metrics_proxy(listen, upstream, *ADMIN)
    try:
        await wait_until(lambda: stage.driver_name == DRIVER)
        async with channel(listen) as ch:
            for _ in range(3):
                await ch.unary_unary(CREATE)(b"", timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ch.unary_unary(DELETE)(b"", timeout=5)
            assert err.value.code() is grpc.StatusCode.NOT_FOUND
        samples = await scrape(proxy)
    finally:
        await proxy.stop(0)
    count = "plugproxy_rpc_duration_seconds_count"
    assert value(samples, count, spec="csi.v1", method=CREATE, code="OK") == 3
    assert value(samples, count, spec="csi.v1", method=DELETE, code="NOT_FOUND") == 1
    # Buckets from 1 ms to 600 s; every call of a local plugin is under a second.
    bucket = "plugproxy_rpc_duration_seconds_bucket"
    assert value(samples, bucket, spec="csi.v1", method=CREATE, code="OK", le="600.0") == 3
    assert value(samples, bucket, spec="csi.v1", method=CREATE, code="OK", le="0.001") is not None
    # csi-lib-utils' histogram: driver learned from GetPluginInfo, Go-style code names.
    csi = "csi_sidecar_operations_seconds_count"
    assert value(samples, csi, driver_name=DRIVER, method_name=CREATE, grpc_status_code="OK") == 3
    assert (
        value(samples, csi, driver_name=DRIVER, method_name=DELETE, grpc_status_code="NotFound")
        == 1
    )
    assert (
        value(
            samples,
            "csi_sidecar_operations_seconds_bucket",
            driver_name=DRIVER,
            method_name=CREATE,
            grpc_status_code="OK",
            le="0.1",
        )
        == 3
    )
    assert value(samples, "plugproxy_rpc_in_flight", method=CREATE) == 0
    assert value(samples, "plugproxy_upstream_up") == 1
    assert value(samples, "plugproxy_build_info", version=__version__) == 1


async def test_in_flight_gauge_counts_calls_until_they_end(plugin):
    scripted, upstream, listen = plugin
    scripted.answer(CREATE, b"", delay=0.5)
    scripted.fail(INFO, grpc.StatusCode.UNIMPLEMENTED)
    proxy, _ = await start_metrics_proxy(listen, upstream, *ADMIN)
    try:
        async with channel(listen) as ch:
            calls = [
                asyncio.ensure_future(ch.unary_unary(CREATE)(b"", timeout=5)) for _ in range(4)
            ]
            await wait_until(lambda: len(scripted.seen) >= 4)
            during = await scrape(proxy)
            await asyncio.gather(*calls)
        after = await scrape(proxy)
    finally:
        await proxy.stop(0)
    assert value(during, "plugproxy_rpc_in_flight", method=CREATE) == 4
    assert value(after, "plugproxy_rpc_in_flight", method=CREATE) == 0
    # GetPluginInfo is not implemented: the driver stays unnamed, as csi-lib-utils names it.
    assert (
        value(
            after,
            "csi_sidecar_operations_seconds_count",
            driver_name="unknown-driver",
            method_name=CREATE,
            grpc_status_code="OK",
        )
        == 4
    )


async def test_driver_name_is_learned_from_get_plugin_info_on_the_wire(plugin):
    scripted, upstream, listen = plugin
    scripted.answer(CREATE, b"")
    registry = CollectorRegistry()
    stage = MetricsStage(registry)  # no upstream: it cannot ask, only listen
    settings = serve.parse_settings(
        [
            "--listen",
            f"unix://{listen}",
            "--upstream",
            f"unix://{upstream}",
            "--admin-listen",
            "off",
        ],
        environ={},
    )
    proxy = serve.ProxyServer(settings, stages=[stage])
    await proxy.start()
    try:
        async with channel(listen) as ch:
            await ch.unary_unary(CREATE)(b"", timeout=5)
            scripted.answer(INFO, info_response("wire.example.com"))
            await ch.unary_unary(INFO)(b"", timeout=5)
            await ch.unary_unary(CREATE)(b"", timeout=5)
    finally:
        await proxy.stop(0)
    samples = parse(generate_latest(registry).decode())
    csi = "csi_sidecar_operations_seconds_count"
    labels = {"method_name": CREATE, "grpc_status_code": "OK"}
    assert value(samples, csi, driver_name="unknown-driver", **labels) == 1
    assert value(samples, csi, driver_name="wire.example.com", **labels) == 1
    # GetPluginInfo's own call is counted under the name it just told
    info = {"method_name": INFO, "grpc_status_code": "OK"}
    assert value(samples, csi, driver_name="wire.example.com", **info) == 1
    assert value(samples, csi, driver_name="unknown-driver", **info) is None


async def test_stream_messages_are_counted_per_direction(plugin):
    scripted, upstream, listen = plugin
    scripted.answer(INFO, info_response())
    scripted.streams[ALLOCATED] = allocated_stream(5)
    proxy, _ = await start_metrics_proxy(listen, upstream, *ADMIN)
    request = CSI.message_class("csi.v1.GetMetadataAllocatedRequest")(snapshot_id="s1")
    try:
        async with channel(listen) as ch:
            for _ in range(2):
                got = [m async for m in ch.unary_stream(ALLOCATED)(request.SerializeToString())]
                assert len(got) == 5
        samples = await scrape(proxy)
    finally:
        await proxy.stop(0)
    name = "plugproxy_rpc_stream_messages_total"
    assert value(samples, name, method=ALLOCATED, direction="response") == 10
    # The request side of a server stream is one message, not a stream: no series for it.
    assert value(samples, name, method=ALLOCATED, direction="request") is None
    assert (
        value(
            samples,
            "plugproxy_rpc_duration_seconds_count",
            spec="csi.v1",
            method=ALLOCATED,
            code="OK",
        )
        == 2
    )


async def test_a_stream_is_counted_while_it_flows(plugin):
    """A stream that lasts (ListAndWatch lasts as long as the plugin) counts its messages
    as they pass, not only when it ends."""
    scripted, upstream, listen = plugin
    scripted.answer(INFO, info_response())
    cls = CSI.message_class("csi.v1.GetMetadataAllocatedResponse")
    release = asyncio.Event()

    async def three_then_wait(request: bytes, context: Any) -> AsyncIterator[bytes]:
        for i in range(3):
            yield cls(volume_capacity_bytes=i + 1).SerializeToString()
        await release.wait()
        yield cls(volume_capacity_bytes=4).SerializeToString()

    scripted.streams[ALLOCATED] = three_then_wait
    proxy, _ = await start_metrics_proxy(listen, upstream, *ADMIN)
    name = "plugproxy_rpc_stream_messages_total"
    request = CSI.message_class("csi.v1.GetMetadataAllocatedRequest")(snapshot_id="s1")
    try:
        async with channel(listen) as ch:
            stream = ch.unary_stream(ALLOCATED)(request.SerializeToString())
            for _ in range(3):
                await stream.read()
            during = await scrape(proxy)
            release.set()
            assert await stream.read() is not grpc.aio.EOF
            assert await stream.read() is grpc.aio.EOF
        after = await scrape(proxy)
    finally:
        await proxy.stop(0)
    assert value(during, name, method=ALLOCATED, direction="response") == 3
    assert value(after, name, method=ALLOCATED, direction="response") == 4


async def test_upstream_up_follows_the_plugin(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    scripted = ScriptedPlugin()
    server = await start_plugin(upstream, scripted)
    proxy, _ = await start_metrics_proxy(listen, upstream, *ADMIN)
    try:
        await wait_until(lambda: proxy.upstream.state.value == "up")
        assert value(await scrape(proxy), "plugproxy_upstream_up") == 1
        await server.stop(0)
        await wait_until(lambda: proxy.upstream.state.value == "down")
        assert value(await scrape(proxy), "plugproxy_upstream_up") == 0
        server = await start_plugin(upstream, scripted)
        await wait_until(lambda: proxy.upstream.state.value == "up")
        assert value(await scrape(proxy), "plugproxy_upstream_up") == 1
    finally:
        await proxy.stop(0)
        await server.stop(0)


def test_go_code_names_match_grpc_go():
    assert go_code_name(StatusCode.OK) == "OK"
    assert go_code_name(StatusCode.CANCELLED) == "Canceled"
    assert go_code_name(StatusCode.DEADLINE_EXCEEDED) == "DeadlineExceeded"
    assert go_code_name(StatusCode.INVALID_ARGUMENT) == "InvalidArgument"
    assert go_code_name(StatusCode.UNAVAILABLE) == "Unavailable"
    assert go_code_name(StatusCode.DATA_LOSS) == "DataLoss"


def test_unknown_method_paths_are_capped():
    registry = CollectorRegistry()
    stage = MetricsStage(registry, max_unknown_methods=3)
    for i in range(10):
        info = MethodInfo(
            path=f"/x.Y/M{i}", service="x.Y", name=f"M{i}", kind=CallKind.STREAM_STREAM
        )
        call = Call(info, (), [], None)
        stage.on_start(call)
        stage.on_finish(call)
    samples = parse(generate_latest(registry).decode())
    methods = {
        dict(labels)["method"]
        for name, labels in samples
        if name == "plugproxy_rpc_duration_seconds_count"
    }
    assert methods == {"/x.Y/M0", "/x.Y/M1", "/x.Y/M2", "unknown"}
    assert (
        value(
            samples,
            "plugproxy_rpc_duration_seconds_count",
            spec="unknown",
            method="unknown",
            code="OK",
        )
        == 7
    )


def test_series_are_resolved_once_per_method_and_code():
    registry = CollectorRegistry()
    stage = MetricsStage(registry)
    info = Registry(["csi.v1"]).lookup(CREATE)
    stage.wants(info)
    first = Call(info, (), [], None)
    stage.on_start(first)
    stage.on_finish(first)
    children = stage.methods[CREATE].by_code[StatusCode.OK]
    second = Call(info, (), [], None)
    stage.on_start(second)
    stage.on_finish(second)
    assert stage.methods[CREATE].by_code[StatusCode.OK] is children


def test_disabled_by_option_builds_nothing():
    runtime = Runtime(Registry(), upstream=None, logger=Logger(io.StringIO()), metrics=None)
    assert metrics.build(metrics.MetricsSettings(disable_metrics=True), runtime) is None
    settings = serve.parse_settings(["--disable-metrics"], environ={})
    assert metrics.build(settings.stages.metrics, runtime) is None
    settings = serve.parse_settings([], environ={"PLUGPROXY_DISABLE_METRICS": "true"})
    assert metrics.build(settings.stages.metrics, runtime) is None


async def test_a_fresh_proxy_exposes_what_the_alerts_compare_and_no_created_samples(plugin):
    """Before any call: the gauges the alerts compare with a threshold have a sample, and no
    `_created` sample doubles the series. The labelled counters the alerts watch have no
    series yet; the alerts count a series from its birth (deploy/prometheus-alerts.test.yaml)."""
    _, upstream, listen = plugin
    proxy = await start_proxy(listen, upstream, *ADMIN, "--serialize", "wait")
    try:
        await wait_until(lambda: proxy.upstream.state.value == "up")
        status, body = await http_get(proxy, "/metrics")
    finally:
        await proxy.stop(0)
    assert status == 200
    samples = parse(body)
    assert value(samples, "plugproxy_upstream_up") == 1
    assert value(samples, "plugproxy_serialization_queue_depth") == 0
    assert "_created" not in body


def test_histograms_expose_what_prometheus_client_would_for_the_same_observations():
    """The stage keeps its own counts; the exposition must match prometheus_client's
    Histogram sample for sample (cumulative buckets, le spelling, sum and count)."""
    values = (0.0, 0.0005, 0.001, 0.0011, 0.3, 2.5, 599.0, 601.0, 1e9)
    reference_registry = CollectorRegistry()
    reference = Histogram("ref", "ref", buckets=metrics.RPC_BUCKETS, registry=reference_registry)
    ours = metrics._Histogram(metrics.RPC_BUCKETS)
    for v in values:
        reference.observe(v)
        ours.observe(v)
    (family,) = text_string_to_metric_families(generate_latest(reference_registry).decode())
    expected = [(s.labels["le"], s.value) for s in family.samples if s.name == "ref_bucket"]
    assert ours.cumulative() == expected
    ref_sum = next(s.value for s in family.samples if s.name == "ref_sum")
    assert ours.sum == pytest.approx(ref_sum)
