"""Fake plugins served through opentelemetry-instrumentation-grpc's server interceptor."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from plugproxy.core.endpoints import ConfigError
from plugproxy.fakes import cli as fake_cli
from plugproxy.fakes import otel
from plugproxy.fakes.server import FAKE_SPECS, FakeRpcHandler, start_fake_plugin
from tests.support import channel

TRACE_ID = "5b8efff798038103d269b633813fc60c"
PARENT_ID = "eee19b7ec3c1b174"


def unary_path(spec: str) -> str:
    """A unary method the fake of ``spec`` serves (whatever it answers an empty request)."""
    handlers = FakeRpcHandler(FAKE_SPECS[spec](None)).handlers
    return min(path for path, h in handlers.items() if h.unary_unary is not None)


@pytest.mark.parametrize("spec", sorted(FAKE_SPECS))
async def test_every_fake_continues_the_callers_trace_in_a_server_span(spec, tmp_path):
    exporter = InMemorySpanExporter()
    provider = otel.tracer_provider(exporter, otel.default_service_name(spec))
    sock = str(tmp_path / "plugin.sock")
    handle = await start_fake_plugin(spec, f"unix://{sock}", tracer_provider=provider)
    path = unary_path(spec)
    try:
        async with channel(sock) as ch:
            metadata = (("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01"),)
            try:
                await ch.unary_unary(path)(b"", timeout=5, metadata=metadata)
            except grpc.aio.AioRpcError as err:  # an empty request may be refused: still traced
                assert err.code() is not grpc.StatusCode.UNIMPLEMENTED
    finally:
        await handle.stop(0)
    provider.force_flush()
    (span,) = exporter.get_finished_spans()
    assert span.kind is SpanKind.SERVER
    assert span.name == path
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert f"{span.parent.span_id:016x}" == PARENT_ID
    assert span.parent.is_remote
    service, method = path.lstrip("/").split("/")
    assert span.attributes["rpc.service"] == service
    assert span.attributes["rpc.method"] == method
    assert span.resource.attributes["service.name"] == f"fake-{spec.split('.')[0]}-plugin"
    provider.shutdown()


def test_without_a_provider_the_instrumentation_is_never_imported(tmp_path):
    script = f"""
import asyncio, sys
import grpc
from plugproxy.fakes import start_fake_plugin

async def main():
    handle = await start_fake_plugin("csi.v1", "unix://{tmp_path}/plugin.sock")
    async with grpc.aio.insecure_channel("unix:{tmp_path}/plugin.sock") as ch:
        await ch.unary_unary("/csi.v1.Identity/Probe")(b"", timeout=5)
    await handle.stop(0)

asyncio.run(main())
loaded = [m for m in sys.modules if m.startswith(("opentelemetry.instrumentation", "wrapt"))]
print(loaded)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_provider_from_the_standard_environment():
    # OTEL_TRACES_EXPORTER unset means otlp here: --otel asked for traces.
    provider = otel.tracer_provider_from_env({}, "cosi.v1alpha1")
    assert provider is not None
    assert provider.resource.attributes["service.name"] == "fake-cosi-plugin"
    provider.shutdown()
    named = otel.tracer_provider_from_env(
        {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "vendor-plugin"}, "csi.v1"
    )
    assert named is not None
    assert named.resource.attributes["service.name"] == "vendor-plugin"
    named.shutdown()
    assert otel.tracer_provider_from_env({"OTEL_TRACES_EXPORTER": "none"}, "csi.v1") is None
    assert otel.tracer_provider_from_env({"OTEL_SDK_DISABLED": "true"}, "csi.v1") is None
    with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER"):
        otel.tracer_provider_from_env({"OTEL_TRACES_SAMPLER": "sometimes"}, "csi.v1")


def test_otel_flag_with_a_bad_exporter_is_a_one_line_error(tmp_path, monkeypatch, capsys: Any):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    argv = ["--spec", "csi.v1", "--listen", f"unix://{tmp_path}/plugin.sock", "--otel"]
    assert fake_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "OTEL_TRACES_EXPORTER='jaeger'" in err
    assert not (tmp_path / "plugin.sock").exists()
