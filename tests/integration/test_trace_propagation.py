"""One trace across the CO, the proxy and the plugin, each instrumented as it would be.

The CO is a grpc.aio client with opentelemetry-instrumentation-grpc's interceptors (spans kept
by the SDK's in-memory exporter); the proxy's tracing stage and the bundled fake plugin,
served through the instrumentation's server interceptor, export over real OTLP/gRPC to a
receiver. The plugin's server span must be the child of the proxy's client span, the proxy's
server span the child of the CO's client span, all in one trace.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry.instrumentation.grpc import aio_client_interceptors
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from plugproxy.fakes import start_fake_plugin
from plugproxy.fakes.collector import CollectorHandle, TraceSpan, start_collector
from plugproxy.fakes.otel import tracer_provider_from_env
from plugproxy.spec.registry import load_spec
from tests.support import channel, start_proxy

CSI = load_spec("csi.v1")
CREATE = "/csi.v1.Controller/CreateVolume"
SNAPSHOT = "/csi.v1.Controller/CreateSnapshot"
ALLOCATED = "/csi.v1.SnapshotMetadata/GetMetadataAllocated"
PLUGIN = "fake-csi-plugin"


def create_request(name: str) -> bytes:
    msg = CSI.message_class("csi.v1.CreateVolumeRequest")(name=name)
    cap = msg.volume_capabilities.add()
    cap.mount.fs_type = "ext4"
    cap.access_mode.mode = cap.access_mode.SINGLE_NODE_WRITER
    return bytes(msg.SerializeToString())


class Co:
    """The orchestrator's side: an instrumented channel, spans in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create({"service.name": "co"}))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def channel(self, listen: str) -> grpc.aio.Channel:
        interceptors = aio_client_interceptors(tracer_provider=self.provider)
        return grpc.aio.insecure_channel(f"unix:{listen}", interceptors=interceptors)

    def span(self, name: str) -> TraceSpan:
        (span,) = [
            s
            for s in self.exporter.get_finished_spans()
            if s.name == name and s.kind is SpanKind.CLIENT
        ]
        return TraceSpan.from_sdk(span)


@pytest.fixture
async def collector(monkeypatch: Any) -> AsyncIterator[CollectorHandle]:
    """A receiver, and the standard environment that sends every OTLP exporter to it."""
    handle = await start_collector()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", handle.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    try:
        yield handle
    finally:
        await handle.stop()


async def gathered(collector: CollectorHandle, co_span: TraceSpan) -> list[TraceSpan]:
    """The CO's span and every span of its trace the proxy and the plugin exported."""

    def spans() -> list[TraceSpan]:
        return [s for s in collector.collector.trace_spans() if s.trace_id == co_span.trace_id]

    def arrived() -> bool:
        return {"plugproxy", PLUGIN} <= {s.service for s in spans()}

    await collector.collector.wait_for(arrived, 10)
    return [co_span, *spans()]


def assert_one_chain(spans: list[TraceSpan], co_span: TraceSpan, path: str) -> None:
    """CO client -> proxy server -> proxy client -> plugin server, one trace id."""
    assert len({s.trace_id for s in spans}) == 1
    by_party = {(s.service, s.kind): s for s in spans}
    assert len(by_party) == len(spans) == 4, spans
    proxy_server = by_party["plugproxy", "SERVER"]
    proxy_client = by_party["plugproxy", "CLIENT"]
    plugin_server = by_party[PLUGIN, "SERVER"]
    assert proxy_server.parent_id == co_span.span_id
    assert proxy_client.parent_id == proxy_server.span_id
    assert plugin_server.parent_id == proxy_client.span_id
    assert co_span.name == plugin_server.name == path  # the instrumentation names by path
    assert proxy_server.name == proxy_client.name == path.lstrip("/")
    # Each span lies within its parent's time.
    for parent, child in ((proxy_server, proxy_client), (proxy_client, plugin_server)):
        assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns


async def flush(proxy: Any, *providers: Any) -> None:
    # Exports block on the exporters' threads while the receiver answers on this loop.
    tracing = next(s for s in proxy.stages if s.name == "tracing")
    await asyncio.to_thread(tracing.force_flush)
    for provider in providers:
        await asyncio.to_thread(provider.force_flush)


@pytest.fixture
async def traced_fake(tmp_path: Any, collector: CollectorHandle) -> AsyncIterator[Any]:
    """The fake CSI plugin, instrumented, behind a proxy with tracing on."""
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    provider = tracer_provider_from_env(os.environ, "csi.v1")
    fake = await start_fake_plugin("csi.v1", f"unix://{upstream}", tracer_provider=provider)
    proxy = await start_proxy(listen, upstream)
    try:
        yield proxy, provider, listen
    finally:
        await proxy.stop(0)
        await fake.stop(0)
        provider.shutdown()


async def test_unary_call_is_one_trace_through_proxy_into_plugin(traced_fake, collector):
    proxy, provider, listen = traced_fake
    co = Co()
    async with co.channel(listen) as ch:
        await ch.unary_unary(CREATE)(create_request("pvc-traced"), timeout=5)
    await flush(proxy, provider)
    co_span = co.span(CREATE)
    assert_one_chain(await gathered(collector, co_span), co_span, CREATE)
    spans = {(s.service, s.kind): s for s in await gathered(collector, co_span)}
    plugin, proxy_server = spans[PLUGIN, "SERVER"], spans["plugproxy", "SERVER"]
    assert plugin.attributes["rpc.service"] == proxy_server.attributes["rpc.service"]
    assert plugin.attributes["rpc.method"] == "CreateVolume"
    assert plugin.attributes["rpc.grpc.status_code"] == 0
    assert proxy_server.attributes["plugproxy.keys"] == ("volume-name:pvc-traced",)


async def test_server_streaming_call_is_one_trace_through_proxy_into_plugin(traced_fake, collector):
    proxy, provider, listen = traced_fake
    cls = CSI.message_class
    async with channel(listen) as plain:
        raw = await plain.unary_unary(CREATE)(create_request("pvc-streamed"), timeout=5)
        volume_id = cls("csi.v1.CreateVolumeResponse").FromString(raw).volume.volume_id
        request = cls("csi.v1.CreateSnapshotRequest")(source_volume_id=volume_id, name="snap-t")
        raw = await plain.unary_unary(SNAPSHOT)(request.SerializeToString(), timeout=5)
    snapshot_id = cls("csi.v1.CreateSnapshotResponse").FromString(raw).snapshot.snapshot_id
    co = Co()
    alloc = cls("csi.v1.GetMetadataAllocatedRequest")(snapshot_id=snapshot_id, max_results=1)
    async with co.channel(listen) as ch:
        got = [m async for m in ch.unary_stream(ALLOCATED)(alloc.SerializeToString(), timeout=5)]
    assert len(got) > 1
    await flush(proxy, provider)
    co_span = co.span(ALLOCATED)
    assert_one_chain(await gathered(collector, co_span), co_span, ALLOCATED)


async def test_fake_plugin_process_with_otel_flag_joins_the_trace(tmp_path, collector):
    """`plugproxy fake-plugin --otel` as its own process, configured by OTEL_* alone."""
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "plugproxy", "fake-plugin", "--spec", "csi.v1"),
        *("--listen", f"unix://{upstream}", "--otel"),
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "60000"},  # only the shutdown exports
    )
    try:
        assert process.stderr is not None
        line = await asyncio.wait_for(process.stderr.readline(), 30)
        assert line.decode().endswith(f"listening on unix://{upstream} (traced)\n")
        proxy = await start_proxy(listen, upstream)
        co = Co()
        try:
            async with co.channel(listen) as ch:
                await ch.unary_unary(CREATE)(create_request("pvc-process"), timeout=5)
            await flush(proxy)
        finally:
            await proxy.stop(0)
        process.send_signal(signal.SIGTERM)  # the plugin exports what it batched on its way out
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    co_span = co.span(CREATE)
    assert_one_chain(await gathered(collector, co_span), co_span, CREATE)
