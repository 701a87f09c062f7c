"""Whether the tracing stage is on, read from the OTEL_* environment without the SDK.

:mod:`plugproxy.stages.tracing` imports the OpenTelemetry SDK (about 8 MiB of resident
memory); the pipeline builds it through this module, so a proxy with no trace exporter
configured never loads it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from plugproxy.api import Runtime, Stage
from plugproxy.core.options import Option, group
from plugproxy.spec.redact import RedactSettings

OPTIONS: list[Option] = []  # configured by the standard OTEL_* environment only


@dataclass(frozen=True)
class TracingSettings:
    """What spans may show of messages; the exporter and sampler are the OTEL_* variables'.
    The redaction options are declared once, by the call log."""

    redaction: RedactSettings = group(RedactSettings)


def wanted(environ: Mapping[str, str]) -> bool:
    """True when OTEL_TRACES_EXPORTER names anything but ``none`` (an unknown name too: the
    stage's own parsing rejects it) and the SDK is not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    raw = environ.get("OTEL_TRACES_EXPORTER", "none")
    return any(name.strip().lower() not in ("", "none") for name in raw.split(","))


def build(settings: TracingSettings, runtime: Runtime) -> Stage | None:
    if not wanted(os.environ):
        return None
    from plugproxy.stages import tracing  # noqa: PLC0415  # the SDK, only when tracing is on

    return tracing.build(settings.redaction, runtime)


@contextlib.contextmanager
def environment(values: Mapping[str, str], dropped: Iterable[str] = ()) -> Iterator[None]:
    """``values`` set and ``dropped`` unset in os.environ for the block, then all as before:
    the tracing stage reads its configuration there, as the SDK does (the demo and the
    benchmarks build stages with tracing on in a process that has its own environment)."""
    gone = tuple(dropped)
    saved = {key: os.environ.get(key) for key in (*values, *gone)}
    for key in gone:
        os.environ.pop(key, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
