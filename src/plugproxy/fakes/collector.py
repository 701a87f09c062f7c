"""A small OTLP/gRPC trace receiver: the collector's Export RPC, keeping what arrives.

It stands in for an OpenTelemetry Collector where spans of several processes have to be
seen together (the demo's end-to-end trace, tests of trace propagation). Spans arrive as
the OTLP exporter sends them, over real gRPC; :func:`trace_tree` prints one trace as a tree.

Imported only by what gathers traces: it loads the OTLP protobuf modules.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

# OTLP's Span.SpanKind numbers, by the names the SDK's SpanKind uses.
_KIND_NAMES = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass(frozen=True)
class TraceSpan:
    """One span, from either source (OTLP or the SDK), with what a trace tree needs."""

    service: str
    name: str
    kind: str  # SERVER, CLIENT, …
    trace_id: int
    span_id: int
    parent_id: int | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @classmethod
    def from_sdk(cls, span: Any) -> TraceSpan:
        """From an SDK ReadableSpan (e.g. what an InMemorySpanExporter holds)."""
        service = str(span.resource.attributes.get("service.name", ""))
        parent = span.parent.span_id if span.parent is not None else None
        return cls(
            service,
            span.name,
            span.kind.name,
            span.context.trace_id,
            span.context.span_id,
            parent,
            span.start_time,
            span.end_time,
            dict(span.attributes or {}),
        )


class TraceCollector(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc, unused-ignore]
    """Keeps every ExportTraceServiceRequest; answers each with success."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.received = asyncio.Event()  # set by the first export
        self._changed = asyncio.Event()  # set by every export

    async def Export(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        self.received.set()
        self._changed.set()
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[Any]:
        """Every span received, as OTLP protobuf messages."""
        return [
            span
            for req in self.requests
            for rs in req.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def resources(self) -> list[Any]:
        return [rs.resource for req in self.requests for rs in req.resource_spans]

    def trace_spans(self) -> list[TraceSpan]:
        """Every span received, with the service.name of the resource it came with."""
        out: list[TraceSpan] = []
        for req in self.requests:
            for rs in req.resource_spans:
                service = next(
                    (
                        a.value.string_value
                        for a in rs.resource.attributes
                        if a.key == "service.name"
                    ),
                    "",
                )
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        out.append(
                            TraceSpan(
                                service,
                                span.name,
                                _KIND_NAMES.get(span.kind, "UNSPECIFIED"),
                                int.from_bytes(span.trace_id, "big"),
                                int.from_bytes(span.span_id, "big"),
                                int.from_bytes(span.parent_span_id, "big") or None,
                                span.start_time_unix_nano,
                                span.end_time_unix_nano,
                                {a.key: _value(a.value) for a in span.attributes},
                            )
                        )
        return out

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Until ``predicate()`` holds after some export; TimeoutError past ``timeout``."""
        deadline = time.monotonic() + timeout
        while not predicate():
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the spans did not arrive in time")
            await asyncio.wait_for(self._changed.wait(), remaining)


def _value(value: Any) -> Any:
    """An OTLP AnyValue as the Python value the SDK would hold (arrays as tuples)."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return None if which is None else getattr(value, which)


@dataclass
class CollectorHandle:
    """A running receiver: the server, what it keeps, and where exporters send to."""

    server: grpc.aio.Server
    collector: TraceCollector
    port: int

    @property
    def endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT (plain gRPC on loopback)."""
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.server.stop(0)


async def start_collector() -> CollectorHandle:
    """Listen on a free loopback port (OTLP exporters speak TCP)."""
    collector = TraceCollector()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return CollectorHandle(server, collector, port)


def trace_tree(spans: Iterable[TraceSpan]) -> list[str]:
    """One line per span, children indented under their parent, with span id and duration.

    Spans whose parent is not among ``spans`` are roots (a trace's first span, or one whose
    parent's process sent nothing). Siblings are in start order.
    """
    spans = sorted(spans, key=lambda s: s.start_ns)
    ids = {s.span_id for s in spans}
    children: dict[int | None, list[TraceSpan]] = {}
    for span in spans:
        parent = span.parent_id if span.parent_id in ids else None
        children.setdefault(parent, []).append(span)
    rows: list[tuple[str, TraceSpan]] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in children.get(parent, []):
            indent = "   " * (depth - 1) + "└─ " if depth else ""
            rows.append((f"{indent}{span.service} {span.kind} {span.name}", span))
            walk(span.span_id, depth + 1)

    walk(None, 0)
    width = max((len(label) for label, _ in rows), default=0)
    return [
        f"{label:{width}}  span {span.span_id:016x}  {span.duration_ms:8.2f} ms"
        for label, span in rows
    ]
