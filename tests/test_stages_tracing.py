"""Tracing stage: spans from the SDK's in-memory exporter and over real OTLP/gRPC."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, StatusCode

from plugproxy.api import Call, LazyMessage, Reject, Stage
from plugproxy.core.endpoints import ConfigError
from plugproxy.fakes.collector import TraceCollector, start_collector
from plugproxy.spec import redact
from plugproxy.spec.redact import RedactSettings
from plugproxy.spec.registry import Registry, load_spec
from plugproxy.stages import tracing
from plugproxy.stages.tracing import TracingStage, build_from_env, sampler_from_env
from tests.support import channel, start_proxy
from tests.test_stages_metrics import ScriptedPlugin, start_plugin

CSI = load_spec("csi.v1")
CREATE = "/csi.v1.Controller/CreateVolume"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


def create_request(name: str = "pvc-1") -> bytes:
    cls = CSI.message_class("csi.v1.CreateVolumeRequest")
    return cls(name=name).SerializeToString()


async def start_receiver() -> tuple[grpc.aio.Server, TraceCollector, int]:
    handle = await start_collector()
    return handle.server, handle.collector, handle.port


class Violating(Stage):
    """Stands in for validation: records a violation event, then rejects."""

    name = "violating"

    def on_start(self, call: Call) -> None:
        call.add_event(
            "violation",
            rule="csi.create.capabilities",
            level="MUST",
            party="co",
            field="volume_capabilities",
            section="CSI v1.12 §CreateVolume",
            message="volume_capabilities is required",
        )
        raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "volume_capabilities is required")


class Waiting(Stage):
    """Stands in for serialization: waits, then records the wait as the convention says."""

    name = "waiting"

    async def on_start(self, call: Call) -> None:
        await asyncio.sleep(0.2)
        call.stage_state["serialize.wait_seconds"] = 0.2
        call.add_event("serialization.wait", seconds=0.2, keys="volume-name:pvc-1")


@pytest.fixture
async def plugin(tmp_path: Any) -> AsyncIterator[tuple[ScriptedPlugin, str, str]]:
    upstream = str(tmp_path / "plugin.sock")
    scripted = ScriptedPlugin()
    scripted.answer(CREATE, b"")
    server = await start_plugin(upstream, scripted)
    yield scripted, upstream, str(tmp_path / "proxy.sock")
    await server.stop(0)


async def run_calls(
    listen: str, upstream: str, stages: list[Stage], metadata: tuple[tuple[str, str], ...] = ()
) -> grpc.aio.AioRpcError | None:
    proxy = await start_proxy(listen, upstream, stages=stages)
    try:
        async with channel(listen) as ch:
            try:
                await ch.unary_unary(CREATE)(create_request(), timeout=5, metadata=metadata)
            except grpc.aio.AioRpcError as err:
                return err
    finally:
        await proxy.stop(0)
    return None


def by_kind(spans: Any) -> dict[SpanKind, Any]:
    out = {span.kind: span for span in spans}
    assert len(out) == len(spans), spans
    return out


async def test_trace_from_the_co_continues_through_the_proxy_into_the_plugin(plugin):
    scripted, upstream, listen = plugin
    exporter = InMemorySpanExporter()
    stage = TracingStage(exporter, upstream_address=f"unix://{upstream}")
    metadata = (
        ("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01"),
        ("tracestate", "vendor=opaque"),
    )
    assert await run_calls(listen, upstream, [stage], metadata) is None
    spans = by_kind(exporter.get_finished_spans())
    server, client = spans[SpanKind.SERVER], spans[SpanKind.CLIENT]
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert f"{server.parent.span_id:016x}" == PARENT_ID
    assert server.parent.is_remote
    assert client.context.trace_id == server.context.trace_id
    assert client.parent.span_id == server.context.span_id
    # The plugin sees one traceparent: same trace, the proxy's client span as parent.
    path, seen = scripted.seen[-1]
    assert path == CREATE
    assert seen["traceparent"] == f"00-{TRACE_ID}-{client.context.span_id:016x}-01"
    assert seen["tracestate"] == "vendor=opaque"
    assert [k for k, _ in scripted.raw_seen[-1]].count("traceparent") == 1
    assert server.name == client.name == "csi.v1.Controller/CreateVolume"
    assert server.attributes["rpc.system"] == "grpc"
    assert server.attributes["rpc.service"] == "csi.v1.Controller"
    assert server.attributes["rpc.method"] == "CreateVolume"
    assert server.attributes["rpc.grpc.status_code"] == 0
    assert server.attributes["plugproxy.keys"] == ("volume-name:pvc-1",)
    assert client.attributes["rpc.grpc.status_code"] == 0
    assert client.attributes["server.address"] == f"unix://{upstream}"
    assert server.start_time <= client.start_time <= client.end_time <= server.end_time
    assert server.status.status_code is StatusCode.UNSET


async def test_a_call_without_traceparent_starts_a_new_trace(plugin):
    scripted, upstream, listen = plugin
    exporter = InMemorySpanExporter()
    assert await run_calls(listen, upstream, [TracingStage(exporter)]) is None
    spans = by_kind(exporter.get_finished_spans())
    server, client = spans[SpanKind.SERVER], spans[SpanKind.CLIENT]
    assert server.parent is None
    _, seen = scripted.seen[-1]
    trace_id, span_id = f"{server.context.trace_id:032x}", f"{client.context.span_id:016x}"
    assert seen["traceparent"].startswith(f"00-{trace_id}-{span_id}-")
    assert int(seen["traceparent"][-2:], 16) & 1  # sampled
    assert "tracestate" not in seen


async def test_a_ratio_sampler_decides_each_new_trace_by_its_id(plugin):
    """Root calls the sampler drops never reach the SDK, yet propagate a fresh trace id
    with the not-sampled flag; the rest are recorded under the id the plugin was sent."""
    scripted, upstream, listen = plugin
    exporter = InMemorySpanExporter()
    sampler = TraceIdRatioBased(0.5)
    stage = TracingStage(exporter, sampler=ParentBased(sampler))
    proxy = await start_proxy(listen, upstream, stages=[stage])
    try:
        async with channel(listen) as ch:
            for _ in range(40):
                await ch.unary_unary(CREATE)(create_request(), timeout=5)
    finally:
        await proxy.stop(0)
    sent = [seen["traceparent"].split("-") for _, seen in scripted.seen[-40:]]
    trace_ids = [int(trace, 16) for _, trace, _, _ in sent]
    assert len(set(trace_ids)) == 40  # a new trace per call
    flags = {int(sent_flags, 16) & ~1 for *_, sent_flags in sent}
    assert len(flags) == 1  # other flags (W3C random-trace-id) as the SDK sets them, always
    sampled = {tid for tid, (*_, f) in zip(trace_ids, sent, strict=True) if int(f, 16) & 1}
    assert sampled == {tid for tid in trace_ids if tid & sampler.TRACE_ID_LIMIT < sampler.bound}
    assert 0 < len(sampled) < 40
    exported = {span.context.trace_id for span in exporter.get_finished_spans()}
    assert exported == sampled  # dropped calls left no span, sampled ones kept their id


async def test_rejected_call_has_violation_events_and_no_client_span(plugin):
    scripted, upstream, listen = plugin
    exporter = InMemorySpanExporter()
    err = await run_calls(listen, upstream, [TracingStage(exporter), Violating()])
    assert err is not None and err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert scripted.seen == []
    (server,) = exporter.get_finished_spans()
    assert server.kind is SpanKind.SERVER
    assert server.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    # A CO mistake is not a server error (OpenTelemetry RPC conventions).
    assert server.status.status_code is StatusCode.UNSET
    (event,) = server.events
    assert event.name == "violation"
    assert event.attributes["rule"] == "csi.create.capabilities"
    assert event.attributes["party"] == "co"
    assert event.attributes["section"] == "CSI v1.12 §CreateVolume"


async def test_plugin_errors_mark_both_spans(plugin):
    scripted, upstream, listen = plugin
    scripted.fail(CREATE, grpc.StatusCode.INTERNAL, "disk on fire")
    exporter = InMemorySpanExporter()
    err = await run_calls(listen, upstream, [TracingStage(exporter)])
    assert err is not None and err.code() is grpc.StatusCode.INTERNAL
    spans = by_kind(exporter.get_finished_spans())
    for span in spans.values():
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INTERNAL.value[0]
        # Status messages carry the code only, never the plugin's text.
        assert "disk on fire" not in (span.status.description or "")


async def test_serialization_wait_is_an_event_and_precedes_the_client_span(plugin):
    _, upstream, listen = plugin
    exporter = InMemorySpanExporter()
    assert await run_calls(listen, upstream, [TracingStage(exporter), Waiting()]) is None
    spans = by_kind(exporter.get_finished_spans())
    server, client = spans[SpanKind.SERVER], spans[SpanKind.CLIENT]
    assert client.start_time - server.start_time >= 200_000_000
    (event,) = server.events
    assert event.name == "serialization.wait"
    assert event.attributes["seconds"] == 0.2
    assert event.attributes["keys"] == "volume-name:pvc-1"


async def test_unsampled_calls_export_nothing_but_still_propagate(plugin):
    scripted, upstream, listen = plugin
    exporter = InMemorySpanExporter()
    stage = TracingStage(exporter, sampler=ParentBased(ALWAYS_OFF))
    metadata = (("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-00"),)
    assert await run_calls(listen, upstream, [stage], metadata) is None
    assert exporter.get_finished_spans() == ()
    _, seen = scripted.seen[-1]
    assert seen["traceparent"].startswith(f"00-{TRACE_ID}-")
    assert seen["traceparent"].endswith("-00")
    assert PARENT_ID not in seen["traceparent"]


async def test_spans_are_exported_over_otlp_grpc(plugin, monkeypatch):
    _, upstream, listen = plugin
    server, receiver, port = await start_receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    environ = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SERVICE_NAME": "node-proxy"}
    stage = build_from_env(environ)
    assert stage is not None
    try:
        proxy = await start_proxy(listen, upstream, stages=[stage])
        async with channel(listen) as ch:
            await ch.unary_unary(CREATE)(create_request(), timeout=5)
        # Flushing blocks on the exporter's own thread; the receiver runs on this loop.
        await asyncio.to_thread(stage.force_flush)
        await asyncio.wait_for(receiver.received.wait(), 10)
        await proxy.stop(0)
    finally:
        await server.stop(0)
    spans = receiver.spans()
    assert {s.name for s in spans} == {"csi.v1.Controller/CreateVolume"}
    assert len(spans) == 2
    names = {
        attr.key: attr.value.string_value for res in receiver.resources() for attr in res.attributes
    }
    assert names["service.name"] == "node-proxy"


def test_exporter_none_or_unset_builds_no_stage():
    assert build_from_env({}) is None
    assert build_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert build_from_env({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}) is None


def test_console_exporter_builds_a_stage():
    stage = build_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert isinstance(stage, TracingStage)
    asyncio.run(stage.shutdown())


def test_console_spans_are_one_json_line_each_on_stderr_away_from_the_call_log(capsys):
    """The call log is on stdout, one line per call; spans must not land among its lines."""
    stage = build_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert isinstance(stage, TracingStage)
    info = Registry(["csi.v1"]).lookup("/csi.v1.Identity/Probe")
    for _ in range(2):
        call = Call(info, (), [], 5.0)
        stage.on_start(call)
        stage.on_finish(call)
    asyncio.run(stage.shutdown())  # flushes the batch
    out, err = capsys.readouterr()
    assert out == ""
    spans = [json.loads(line) for line in err.splitlines()]
    assert len(spans) == 4  # a server and a client span per call
    assert {span["name"] for span in spans} == {"csi.v1.Identity/Probe"}


@pytest.mark.parametrize(
    ("environ", "needle"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "grpc"),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "sometimes"}, "SAMPLER"),
        (
            {
                "OTEL_TRACES_EXPORTER": "console",
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "2",
            },
            "between 0 and 1",
        ),
    ],
)
def test_bad_configuration_is_a_one_line_config_error(environ, needle):
    with pytest.raises(ConfigError) as err:
        build_from_env(environ)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_sampler_from_env():
    ratio = sampler_from_env(
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    )
    assert isinstance(ratio, ParentBased)
    assert "0.25" in ratio.get_description()
    assert isinstance(sampler_from_env({"OTEL_TRACES_SAMPLER": "traceidratio"}), TraceIdRatioBased)
    assert "AlwaysOn" in sampler_from_env({}).get_description()


def test_build_reads_the_process_environment(monkeypatch):
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)

    class Upstream:
        address = "unix:///plugin.sock"

    class Runtime:
        upstream = Upstream()
        registry = Registry(["csi.v1"])

    assert tracing.build(RedactSettings(), Runtime()) is None  # type: ignore[arg-type]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    stage = tracing.build(RedactSettings(), Runtime())  # type: ignore[arg-type]
    assert isinstance(stage, TracingStage)
    asyncio.run(stage.shutdown())


async def test_keys_read_from_an_operator_redacted_field_are_masked_in_spans(tmp_path):
    """--redact on a field a key is read from (a device id) masks the key in spans too."""
    registry = Registry(["deviceplugin.v1beta1"])
    red = redact.for_specs(
        ["deviceplugin.v1beta1"], ["v1beta1.ContainerAllocateRequest.devices_ids"]
    )
    exporter = InMemorySpanExporter()
    stage = TracingStage(exporter, redactor=red)
    info = registry.lookup("/v1beta1.DevicePlugin/Allocate")
    for masked in (True, False):
        call = Call(info, (), [], 5.0)
        request = info.request_class(container_requests=[{"devices_ids": ["serial-0042"]}])
        call.request = LazyMessage(request.SerializeToString(), info.request_class)
        if not masked:
            stage._redactor = None
        stage.on_start(call)
        stage.on_finish(call)
    stage.provider.force_flush()
    spans = exporter.get_finished_spans()
    keys = [tuple(s.attributes["plugproxy.keys"]) for s in spans if s.kind is SpanKind.SERVER]
    assert keys == [("device:***",), ("device:serial-0042",)]
    await stage.shutdown()


@pytest.mark.parametrize(
    "name",
    [
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    ],
)
def test_a_new_trace_is_decided_as_the_sdk_sampler_decides_it(name):
    """The stage decides a call without a parent from its trace id alone, before building
    any attribute; the decision must be the configured sampler's, id for id."""
    sampler = sampler_from_env({"OTEL_TRACES_SAMPLER": name, "OTEL_TRACES_SAMPLER_ARG": "0.3"})
    decide = tracing.root_decision(sampler)
    assert decide is not None
    rng = random.Random(name)
    sampled = 0
    for _ in range(3000):
        trace_id = rng.getrandbits(128) or 1
        result = sampler.should_sample(None, trace_id, "m", SpanKind.SERVER, {})
        expected = result.decision.is_sampled()
        assert decide(trace_id) is expected
        sampled += expected
    if name.endswith("traceidratio"):
        assert 700 < sampled < 1100  # about 30 %: both sides really depend on the id


def test_a_sampler_of_another_kind_is_asked_for_every_new_trace():
    class Custom(TraceIdRatioBased):
        pass  # may override should_sample: its decision is not assumed

    assert tracing.root_decision(ParentBased(ALWAYS_OFF)) is not None
    assert tracing.root_decision(Custom(0.5)) is None
    assert tracing.root_decision(ParentBased(Custom(0.5))) is None
