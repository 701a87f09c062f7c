"""`plugproxy demo --trace`: one call traced end to end, CO -> plugproxy -> fake plugin.

Each party traces the way it would in production. The CO is a gRPC client instrumented with
opentelemetry-instrumentation-grpc; the proxy's tracing stage is turned on by the standard
``OTEL_*`` environment; the fake plugin serves through the instrumentation's server
interceptor. The proxy and the plugin export over OTLP/gRPC to a small receiver in this
process, as they would to a collector; the CO's spans are read from the SDK's in-memory
exporter. The spans of the CO's trace are then printed as a tree.

Imported only with ``--trace``: it loads the OpenTelemetry SDK, the OTLP exporter and the
instrumentation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

import grpc
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.grpc import aio_client_interceptors
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from plugproxy.api import Stage
from plugproxy.fakes import otel
from plugproxy.fakes.collector import CollectorHandle, TraceSpan, start_collector, trace_tree
from plugproxy.spec.registry import Registry
from plugproxy.stages.tracing_env import environment

CO_SERVICE = "co"
PROXY_SERVICE = "plugproxy"

# What the proxy's environment holds while its stages are built: traces on, sent to the
# receiver, whatever the user's shell says about OTLP.
_DROPPED = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
)


class TracedDemo:
    """The receiver, the fake plugin's tracer provider and the CO's, for one demo run."""

    def __init__(self, collector: CollectorHandle, spec: str) -> None:
        self.collector = collector
        self.plugin_service = otel.default_service_name(spec)
        exporter = OTLPSpanExporter(endpoint=collector.endpoint, insecure=True)
        self.plugin_provider: Any = otel.tracer_provider(exporter, self.plugin_service)
        self.co_spans = InMemorySpanExporter()
        self.co_provider = TracerProvider(
            resource=Resource.create({"service.name": CO_SERVICE}), shutdown_on_exit=False
        )
        self.co_provider.add_span_processor(SimpleSpanProcessor(self.co_spans))

    @classmethod
    async def start(cls, spec: str) -> TracedDemo:
        return cls(await start_collector(), spec)

    @contextlib.contextmanager
    def proxy_environment(self) -> Iterator[None]:
        """The standard variables that turn the proxy's tracing on, for building its stages."""
        wanted = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.collector.endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true",
            "OTEL_SERVICE_NAME": PROXY_SERVICE,
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        }
        with environment(wanted, _DROPPED):
            yield

    async def show(
        self,
        target: str,
        spec: str,
        path: str,
        body: dict[str, Any],
        stages: Sequence[Stage],
        out: TextIO,
    ) -> bool:
        """Make one call as an instrumented CO, gather its trace and print it.

        True when the trace is whole: the CO's client span, the proxy's server and client
        spans and the plugin's server span, each the child of the one before, one trace id.
        """
        info = Registry([spec]).lookup(path)
        assert info.request_class is not None
        request = json_format.ParseDict(body, info.request_class())
        interceptors = aio_client_interceptors(tracer_provider=self.co_provider)  # type: ignore[no-untyped-call]
        async with grpc.aio.insecure_channel(target, interceptors=interceptors) as ch:
            await ch.channel_ready()  # the CO's span then times the call, not the connect
            try:
                await ch.unary_unary(path)(request.SerializeToString(), timeout=10)
                outcome = "OK"
            except grpc.aio.AioRpcError as err:
                outcome = err.code().name
        finished = [s for s in self.co_spans.get_finished_spans() if s.kind is SpanKind.CLIENT]
        if not finished:
            out.write(f"  the CO's call of {path} left no span ({outcome})\n")
            return False
        co = finished[-1]
        trace_id = co.context.trace_id

        def spans() -> list[TraceSpan]:
            return [s for s in self.collector.collector.trace_spans() if s.trace_id == trace_id]

        def arrived() -> bool:
            services = {s.service for s in spans()}
            return {PROXY_SERVICE, self.plugin_service} <= services

        # The export runs on the exporters' threads; the receiver answers on this loop.
        for stage in stages:
            flush = getattr(stage, "force_flush", None)
            if stage.name == "tracing" and flush is not None:
                await asyncio.to_thread(flush)
        await asyncio.to_thread(self.plugin_provider.force_flush)
        with contextlib.suppress(TimeoutError):
            await self.collector.collector.wait_for(arrived, 10)
        gathered = [TraceSpan.from_sdk(co), *spans()]
        out.write(f"  the CO calls {path} (answer {outcome}) with an instrumented channel\n")
        out.write(f"  trace {trace_id:032x}, {len(gathered)} spans:\n\n")
        for line in trace_tree(gathered):
            out.write(f"    {line}\n")
        whole = _is_chain(gathered, self.plugin_service)
        if whole:
            out.write(
                "\n  one trace id; each span is the child of the one above it: the plugin's"
                " server span\n  has the proxy's client span as parent, which the proxy sent"
                " in traceparent\n"
            )
        else:
            out.write(
                "\n  NOT one chain: expected one trace of CO client -> proxy server -> proxy"
                " client -> plugin server spans, each the parent of the next\n"
            )
        return whole

    async def stop(self) -> None:
        await asyncio.to_thread(self.plugin_provider.shutdown)
        self.co_provider.shutdown()
        await self.collector.stop()


def _is_chain(spans: Sequence[TraceSpan], plugin_service: str) -> bool:
    """CO client -> proxy server -> proxy client -> plugin server, linked by parent ids."""
    steps = (
        (CO_SERVICE, "CLIENT"),
        (PROXY_SERVICE, "SERVER"),
        (PROXY_SERVICE, "CLIENT"),
        (plugin_service, "SERVER"),
    )
    parent: int | None = None
    for index, (service, kind) in enumerate(steps):
        found = [
            s
            for s in spans
            if s.service == service and s.kind == kind and (index == 0 or s.parent_id == parent)
        ]
        if len(found) != 1:
            return False
        parent = found[0].span_id
    return len({s.trace_id for s in spans}) == 1
