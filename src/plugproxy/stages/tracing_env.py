"""Whether the tracing stage is on, read from the OTEL_* environment without the SDK.

:mod:`plugproxy.stages.tracing` imports the OpenTelemetry SDK (about 8 MiB of resident
memory); the pipeline builds it through this module, so a proxy with no trace exporter
configured never loads it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from plugproxy.api import Runtime, Stage
from plugproxy.options import Option

OPTIONS: list[Option] = []  # configured by the standard OTEL_* environment only


def wanted(environ: Mapping[str, str]) -> bool:
    """True when OTEL_TRACES_EXPORTER names anything but ``none`` (an unknown name too: the
    stage's own parsing rejects it) and the SDK is not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    raw = environ.get("OTEL_TRACES_EXPORTER", "none")
    return any(name.strip().lower() not in ("", "none") for name in raw.split(","))


def build(ns: argparse.Namespace, runtime: Runtime) -> Stage | None:
    if not wanted(os.environ):
        return None
    from plugproxy.stages import tracing  # noqa: PLC0415  # the SDK, only when tracing is on

    return tracing.build(ns, runtime)
