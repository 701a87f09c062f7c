"""OpenTelemetry server spans for the fake plugins, from opentelemetry-instrumentation-grpc.

A fake plugin started with a tracer provider serves through the instrumentation's grpc.aio
server interceptor, the way a vendor's Python plugin would be instrumented: every call gets a
SERVER span that continues the caller's W3C trace context, so behind the proxy the plugin's
span is a child of the proxy's client span.

Off unless asked for. The SDK and the instrumentation are imported inside the functions
below, so a fake plugin without traces never loads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# OTEL_TRACES_EXPORTER left unset means what the OpenTelemetry specification says it means:
# otlp. (The proxy reads unset as off; a fake plugin is traced only when asked to be.)
DEFAULT_EXPORTER = "otlp"


def default_service_name(spec: str) -> str:
    """``fake-csi-plugin`` for csi.v1 and csi.v0, ``fake-cosi-plugin`` for cosi.v1alpha1, …"""
    return f"fake-{spec.split('.', 1)[0]}-plugin"


def tracer_provider(exporter: Any, service_name: str, sampler: Any = None) -> Any:
    """A TracerProvider of its own (the global one is left alone), batching to ``exporter``."""
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased  # noqa: PLC0415

    provider = TracerProvider(
        sampler=sampler if sampler is not None else ParentBased(ALWAYS_ON),
        resource=Resource.create({"service.name": service_name}),
        shutdown_on_exit=False,
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def tracer_provider_from_env(environ: Mapping[str, str], spec: str) -> Any | None:
    """The provider the standard ``OTEL_*`` environment describes; None when it says none.

    Exporter, sampler and their errors are the proxy's (one-line ConfigError); the OTLP
    exporter reads its endpoint, TLS and headers from the process environment itself.
    """
    from plugproxy.stages.tracing import exporter_from_env, sampler_from_env  # noqa: PLC0415

    settings = dict(environ)
    if not settings.get("OTEL_TRACES_EXPORTER", "").strip():
        settings["OTEL_TRACES_EXPORTER"] = DEFAULT_EXPORTER
    exporter = exporter_from_env(settings)
    if exporter is None:
        return None
    service = settings.get("OTEL_SERVICE_NAME", "").strip() or default_service_name(spec)
    return tracer_provider(exporter, service, sampler_from_env(settings))


def server_interceptor(provider: Any) -> Any:
    """The instrumentation's grpc.aio server interceptor (the fakes serve with grpc.aio)."""
    from opentelemetry.instrumentation.grpc import aio_server_interceptor  # noqa: PLC0415

    return aio_server_interceptor(tracer_provider=provider)  # type: ignore[no-untyped-call]
