"""OpenTelemetry traces: a server span per call, a client span for the plugin call.

Ordering: first, so the server span covers everything the other stages do (validation,
serialization waits) and its ``on_finish`` runs last, when every stage has recorded its
events and the CO's status is final.

- A W3C ``traceparent``/``tracestate`` sent by the CO is continued: the server span is its
  child. The plugin receives a ``traceparent`` naming the client span as its parent; any
  incoming trace headers are replaced on the upstream hop, never forwarded twice.
- The client span starts when the call was released to the plugin (after any serialization
  wait) and ends with the call. Its span id is chosen in ``on_start`` so it can be sent
  upstream before the span itself exists. Calls a stage rejected have no client span.
- Attributes follow the OpenTelemetry RPC conventions (``rpc.system``, ``rpc.service``,
  ``rpc.method``, ``rpc.grpc.status_code``) plus ``plugproxy.spec.keys``, ``plugproxy.spec`` and
  ``plugproxy.request_id``. Call events (violations, serialization waits) become span events
  with their attributes, which by construction never quote field values. No payloads.

The stage owns its TracerProvider (the global one is left alone) and is configured only
through its constructor; :func:`build` reads the standard ``OTEL_*`` environment. With
``OTEL_TRACES_EXPORTER`` unset or ``none`` the stage is not built and costs nothing.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, Status
from opentelemetry.trace import StatusCode as SpanStatus
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from plugproxy import __version__
from plugproxy.api import Call, Runtime, Stage, StatusCode
from plugproxy.core.endpoints import ConfigError
from plugproxy.core.options import Option
from plugproxy.spec import redact
from plugproxy.spec.keys import keys_of
from plugproxy.spec.redact import Redactor, RedactSettings

OPTIONS: list[Option] = []  # configured by the standard OTEL_* environment only

TRACE_HEADERS = frozenset({"traceparent", "tracestate"})

# Server-span codes that are the server's fault (OpenTelemetry RPC conventions, gRPC).
SERVER_ERROR_CODES = frozenset(
    {
        StatusCode.UNKNOWN,
        StatusCode.DEADLINE_EXCEEDED,
        StatusCode.UNIMPLEMENTED,
        StatusCode.INTERNAL,
        StatusCode.UNAVAILABLE,
        StatusCode.DATA_LOSS,
    }
)
_CODE_NUMBERS: dict[StatusCode, int] = {code: code.value[0] for code in StatusCode}

_PROPAGATOR = TraceContextTextMapPropagator()
_STATE_SERVER = "tracing.server"
_STATE_CLIENT_ID = "tracing.client_span_id"


class _PresetIdGenerator(RandomIdGenerator):
    """Random ids, except that the next span id can be fixed in advance.

    The event loop is single-threaded and nothing awaits between setting an id and
    starting the span, so a preset id is always taken by the span it was meant for.
    """

    def __init__(self) -> None:
        self.next_span_id: int | None = None
        self.next_trace_id: int | None = None

    def generate_span_id(self) -> int:
        preset = self.next_span_id
        if preset is not None:
            self.next_span_id = None
            return preset
        return random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        preset = self.next_trace_id
        if preset is not None:
            self.next_trace_id = None
            return preset
        return random.getrandbits(128) or 1


class TracingStage(Stage):
    """Spans for every call, exported through ``exporter`` by a BatchSpanProcessor."""

    name = "tracing"
    fail_open = True

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        sampler: Sampler | None = None,
        service_name: str = "plugproxy",
        resource_attributes: Mapping[str, str] | None = None,
        upstream_address: str = "",
        redactor: Redactor | None = None,
    ) -> None:
        self._redactor = redactor
        attributes: dict[str, Any] = {
            "service.name": service_name,
            "service.version": __version__,
            **(resource_attributes or {}),
        }
        self._ids = _PresetIdGenerator()
        # Flags of a dropped new trace, as the SDK sets them: W3C random-trace-id (0x02) in
        # SDKs that know it, never sampled.
        is_random = getattr(self._ids, "is_trace_id_random", None)
        self._flags = 0x02 if is_random is not None and is_random() else 0x00
        self._sampler = sampler if sampler is not None else ParentBased(ALWAYS_ON)
        self._decide_root = root_decision(self._sampler)
        self.provider = TracerProvider(
            sampler=self._sampler,
            resource=Resource(attributes),
            id_generator=self._ids,
            shutdown_on_exit=False,
        )
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("plugproxy", __version__)
        self._upstream_address = upstream_address

    def on_start(self, call: Call) -> None:
        method = call.method
        parent = Context()
        carrier: dict[str, str] | None = None
        for key, value in call.invocation_metadata:
            if key in TRACE_HEADERS and isinstance(value, str):
                if carrier is None:
                    carrier = {}
                carrier[key] = value
        name = method.path.lstrip("/")
        if carrier is not None:
            parent = _PROPAGATOR.extract(carrier, context=parent)
        elif not self._root_sampled(call, name):
            return
        server = self.tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=self._attributes(call),
            start_time=call.start_time_ns,
        )
        call.stage_state[_STATE_SERVER] = server
        ctx = server.get_span_context()
        # Upstream trace headers: ours replace whatever the CO sent.
        upstream = call.upstream_metadata
        if any(k in TRACE_HEADERS for k, _ in upstream):
            upstream[:] = [(k, v) for k, v in upstream if k not in TRACE_HEADERS]
        span_id = ctx.span_id
        if server.is_recording():
            span_id = self._ids.generate_span_id()
            call.stage_state[_STATE_CLIENT_ID] = span_id
        upstream.append(
            ("traceparent", f"00-{ctx.trace_id:032x}-{span_id:016x}-{ctx.trace_flags:02x}")
        )
        if ctx.trace_state:
            upstream.append(("tracestate", ctx.trace_state.to_header()))

    def _attributes(self, call: Call) -> dict[str, Any]:
        method = call.method
        attributes: dict[str, Any] = {
            "rpc.system": "grpc",
            "rpc.service": method.service,
            "rpc.method": method.name,
            "plugproxy.spec": method.spec_name,
        }
        keys = keys_of(call)
        if keys:
            red = self._redactor
            if red is not None and red.call_secrets(call):
                # A key read from a field an operator marked sensitive (--redact).
                keys = tuple(red.mask_text(k, call) for k in keys)
            attributes["plugproxy.keys"] = keys
        return attributes

    def _root_sampled(self, call: Call, name: str) -> bool:
        """A call that starts a trace: ask the sampler first, as the SDK would.

        Most calls of a busy proxy are dropped by the sampler; for those the SDK would only
        build a non-recording span. Skipping it leaves what the plugin sees the same: a new
        trace id, a span id and the not-sampled flag. A call to record hands its trace id to
        the SDK, which asks the sampler again with the same inputs. The SDK's own samplers
        decide a new trace by its id alone: that decision is taken here directly, before
        any attribute is gathered."""
        trace_id = self._ids.generate_trace_id()
        decide = self._decide_root
        if decide is not None:
            sampled = decide(trace_id)
        else:
            attributes = self._attributes(call)
            decision = self._sampler.should_sample(
                None, trace_id, name, SpanKind.SERVER, attributes
            )
            sampled = decision.decision is not Decision.DROP
        if sampled:
            self._ids.next_trace_id = trace_id
            return True
        upstream = call.upstream_metadata
        if any(k in TRACE_HEADERS for k, _ in upstream):
            upstream[:] = [(k, v) for k, v in upstream if k not in TRACE_HEADERS]
        span_id = self._ids.generate_span_id()
        upstream.append(("traceparent", f"00-{trace_id:032x}-{span_id:016x}-{self._flags:02x}"))
        return False

    def on_finish(self, call: Call) -> None:
        server = call.stage_state.get(_STATE_SERVER)
        if server is None:
            return
        end = time.time_ns()
        code = call.code
        client_id = call.stage_state.get(_STATE_CLIENT_ID)
        if client_id is not None and not call.rejected:
            self._client_span(call, server, client_id, end)
        if not server.is_recording():
            server.end(end)
            return
        final: dict[str, Any] = {"rpc.grpc.status_code": _CODE_NUMBERS[code]}
        request_id = call.stage_state.get("request_id")
        if request_id:
            final["plugproxy.request_id"] = str(request_id)
        server.set_attributes(final)
        for event in call.events:
            server.add_event(event.name, event.attributes, event.time_ns)
        if code in SERVER_ERROR_CODES:
            server.set_status(Status(SpanStatus.ERROR, code.name))
        server.end(end)

    def _client_span(self, call: Call, server: Any, span_id: int, end: int) -> None:
        start = call.start_time_ns
        wait = call.stage_state.get("serialize.wait_seconds")
        if wait:
            start += int(float(wait) * 1e9)
        method = call.method
        attributes: dict[str, Any] = {
            "rpc.system": "grpc",
            "rpc.service": method.service,
            "rpc.method": method.name,
            "rpc.grpc.status_code": _CODE_NUMBERS[call.code],
        }
        if self._upstream_address:
            attributes["server.address"] = self._upstream_address
        self._ids.next_span_id = span_id
        client = self.tracer.start_span(
            method.path.lstrip("/"),
            context=trace.set_span_in_context(server, Context()),
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=min(start, end),
        )
        self._ids.next_span_id = None
        if call.code is not StatusCode.OK:
            client.set_status(Status(SpanStatus.ERROR, call.code.name))
        client.end(end)

    def force_flush(self, timeout_millis: int = 5000) -> bool:
        return bool(self.provider.force_flush(timeout_millis))

    async def shutdown(self) -> None:
        # Flushing blocks on the export; a thread keeps the event loop (and anything it
        # still serves) running meanwhile.
        await asyncio.to_thread(self._flush_and_shutdown)

    def _flush_and_shutdown(self) -> None:
        self.provider.force_flush(5000)
        self.provider.shutdown()


# -- configuration from the standard environment ---------------------------------------------


def root_decision(sampler: Sampler) -> Callable[[int], bool] | None:
    """Whether ``sampler`` records a new trace (no parent), as a function of its trace id;
    None for a sampler whose decision may depend on more (then it is asked)."""
    # ParentBased hands a call without a parent to its root sampler, which it keeps here.
    root: Any = getattr(sampler, "_root", None) if isinstance(sampler, ParentBased) else sampler
    if root is ALWAYS_ON:
        return lambda trace_id: True
    if root is ALWAYS_OFF:
        return lambda trace_id: False
    if type(root) is TraceIdRatioBased:  # a subclass may decide otherwise
        bound, limit = root.bound, TraceIdRatioBased.TRACE_ID_LIMIT
        return lambda trace_id: trace_id & limit < bound
    return None


def sampler_from_env(environ: Mapping[str, str]) -> Sampler:
    """OTEL_TRACES_SAMPLER (+ OTEL_TRACES_SAMPLER_ARG); default parentbased_always_on."""
    name = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    raw_arg = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    ratio = 1.0
    if name.endswith("traceidratio") and raw_arg:
        try:
            ratio = float(raw_arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(
                f"OTEL_TRACES_SAMPLER_ARG={raw_arg!r}: expected a ratio between 0 and 1"
            )
    samplers: dict[str, Sampler] = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": TraceIdRatioBased(ratio),
        "parentbased_always_on": ParentBased(ALWAYS_ON),
        "parentbased_always_off": ParentBased(ALWAYS_OFF),
        "parentbased_traceidratio": ParentBased(TraceIdRatioBased(ratio)),
    }
    sampler = samplers.get(name)
    if sampler is None:
        raise ConfigError(
            f"OTEL_TRACES_SAMPLER={name!r}: expected one of {', '.join(sorted(samplers))}"
        )
    return sampler


def _otlp_exporter(environ: Mapping[str, str]) -> SpanExporter:
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    ).strip()
    if protocol != "grpc":
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: plugproxy exports OTLP over grpc only"
        )
    # Imported only when used: the exporter pulls in modules a proxy without traces never needs.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )

    # The exporter reads OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, headers, TLS and timeout itself.
    exporter: SpanExporter = OTLPSpanExporter()
    return exporter


def _console_exporter() -> SpanExporter:
    """Each span as one line of JSON on standard error. The SDK's default, indented JSON on
    standard output, lands between the call log's lines there: a reader loses the calls among
    the spans, and a log shipper reading line by line gets fragments of spans."""
    return ConsoleSpanExporter(
        out=sys.stderr, formatter=lambda span: span.to_json(indent=None) + "\n"
    )


class _FanOut(SpanExporter):
    """Several exporters behind one processor (OTEL_TRACES_EXPORTER=otlp,console)."""

    def __init__(self, exporters: Sequence[SpanExporter]) -> None:
        self._exporters = list(exporters)

    def export(self, spans: Any) -> Any:
        result = None
        for exporter in self._exporters:
            result = exporter.export(spans)
        return result

    def shutdown(self) -> None:
        for exporter in self._exporters:
            exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(e.force_flush(timeout_millis) for e in self._exporters)


def exporter_from_env(environ: Mapping[str, str]) -> SpanExporter | None:
    """OTEL_TRACES_EXPORTER: otlp, console, none (default), or a comma-separated list."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    raw = environ.get("OTEL_TRACES_EXPORTER", "none")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "none":
            continue
        if name == "otlp":
            exporters.append(_otlp_exporter(environ))
        elif name == "console":
            exporters.append(_console_exporter())
        else:
            raise ConfigError(f"OTEL_TRACES_EXPORTER={raw!r}: expected otlp, console or none")
    if not exporters:
        return None
    return exporters[0] if len(exporters) == 1 else _FanOut(exporters)


def build_from_env(
    environ: Mapping[str, str],
    upstream_address: str = "",
    redactor: Callable[[], Redactor] | None = None,
) -> TracingStage | None:
    """The stage the ``OTEL_*`` environment asks for, or None; ``redactor`` is called only
    when there is a stage (a disabled stage plans no redaction)."""
    exporter = exporter_from_env(environ)
    if exporter is None:
        return None
    return TracingStage(
        exporter,
        sampler=sampler_from_env(environ),
        service_name=environ.get("OTEL_SERVICE_NAME", "").strip() or "plugproxy",
        upstream_address=upstream_address,
        redactor=redactor() if redactor is not None else None,
    )


def build(redaction: RedactSettings, runtime: Runtime) -> Stage | None:
    """The stage (:mod:`plugproxy.stages.tracing_env` builds it from its settings)."""
    specs = tuple(runtime.registry.specs.values())
    return build_from_env(
        os.environ,
        runtime.upstream.address,
        lambda: redact.from_settings(redaction, specs),
    )
