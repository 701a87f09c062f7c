"""The OTLP/gRPC trace receiver and the trace tree the demo prints."""

from __future__ import annotations

import asyncio

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from plugproxy.fakes.collector import TraceSpan, start_collector, trace_tree


def span(service: str, kind: str, span_id: int, parent: int | None, start: int, end: int):
    return TraceSpan(service, "/a.B/C", kind, 7, span_id, parent, start, end)


def test_tree_nests_children_under_parents_in_start_order():
    spans = [
        span("plugin", "SERVER", 4, 3, 3_000_000, 4_000_000),
        span("proxy", "CLIENT", 3, 2, 2_000_000, 5_000_000),
        span("co", "CLIENT", 1, None, 0, 8_000_000),
        span("proxy", "SERVER", 2, 1, 1_000_000, 6_000_000),
        span("orphan", "SERVER", 9, 99, 500_000, 700_000),  # its parent sent nothing
    ]
    lines = trace_tree(spans)
    assert [line.split("  span ")[0].rstrip() for line in lines] == [
        "co CLIENT /a.B/C",
        "└─ proxy SERVER /a.B/C",
        "   └─ proxy CLIENT /a.B/C",
        "      └─ plugin SERVER /a.B/C",
        "orphan SERVER /a.B/C",  # a root of its own, after the first root's subtree
    ]
    assert lines[0].endswith("span 0000000000000001      8.00 ms")
    assert lines[3].endswith("span 0000000000000004      1.00 ms")
    assert len({len(line) for line in lines}) == 1  # columns line up


async def test_receiver_keeps_what_an_otlp_exporter_sends():
    handle = await start_collector()
    provider = TracerProvider(resource=Resource.create({"service.name": "sender"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=handle.endpoint, insecure=True))
    )
    tracer = provider.get_tracer("test")
    try:

        def send() -> None:
            with (
                tracer.start_as_current_span("outer", kind=SpanKind.SERVER),
                tracer.start_as_current_span("inner", attributes={"n": 3, "k": ("a", "b")}),
            ):
                pass  # the inner span is the outer one's child

        # The exporter blocks on its call while the receiver answers on this loop.
        await asyncio.to_thread(send)
        await handle.collector.wait_for(lambda: len(handle.collector.trace_spans()) == 2, 10)
    finally:
        provider.shutdown()
        await handle.stop()
    inner, outer = handle.collector.trace_spans()
    assert (outer.name, outer.kind, outer.service, outer.parent_id) == (
        "outer",
        "SERVER",
        "sender",
        None,
    )
    assert (inner.kind, inner.parent_id, inner.trace_id) == (
        "INTERNAL",
        outer.span_id,
        outer.trace_id,
    )
    assert inner.attributes == {"n": 3, "k": ("a", "b")}
    assert inner.start_ns <= inner.end_ns
