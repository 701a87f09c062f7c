"""``plugproxy fake-plugin``: serve a fake plugin until SIGTERM or SIGINT.

The main CLI adds these options to its sub-command parser and awaits :func:`run`; bad
values raise :class:`~plugproxy.core.endpoints.ConfigError`, which it prints as one line before
exiting with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

from plugproxy.core.endpoints import ConfigError
from plugproxy.core.options import duration
from plugproxy.fakes.knobs import SERVED_WITH, knobs_from_flags
from plugproxy.fakes.misbehave import catalogue
from plugproxy.fakes.otel import tracer_provider_from_env
from plugproxy.fakes.server import FAKE_SPECS, start_fake_plugin
from plugproxy.spec.registry import SPEC_ALIASES

# Where a driver of each spec family reads its address when no flag gives it.
ENDPOINT_VARIABLES = {"csi": "CSI_ENDPOINT", "cosi": "COSI_ENDPOINT", "cmi": "CMI_ENDPOINT"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    specs = "|".join(FAKE_SPECS)
    parser.add_argument(
        "--spec",
        dest="fake_spec",
        metavar=specs,
        help="which spec the fake plugin serves; also by the short names "
        + ", ".join(
            f"{alias} ({SPEC_ALIASES[alias]})"
            for alias in SPEC_ALIASES
            if SPEC_ALIASES[alias] in FAKE_SPECS
        ),
    )
    parser.add_argument(
        "--listen",
        "--endpoint",  # a driver's usual flag, so it can stand in a driver's pod spec
        dest="fake_listen",
        metavar="URL",
        help="unix:///path/to.sock (a stale socket is replaced) or tcp://host:port; default: "
        "the spec's endpoint variable (CSI_ENDPOINT, COSI_ENDPOINT or CMI_ENDPOINT)",
    )
    parser.add_argument(
        "--start-delay",
        dest="fake_start_delay",
        type=duration,
        default=0.0,
        metavar="DURATION",
        help="wait this long before listening (a driver that is slow to start)",
    )
    parser.add_argument(
        "--delay",
        dest="fake_delay",
        action="append",
        default=[],
        metavar="METHOD=SECONDS",
        help="sleep before answering METHOD ('*' for all); repeatable",
    )
    parser.add_argument(
        "--fail",
        dest="fake_fail",
        action="append",
        default=[],
        metavar="METHOD=CODE[:COUNT]",
        help="answer METHOD with a gRPC status code (name or number), for the next COUNT"
        " calls or always; repeatable",
    )
    parser.add_argument(
        "--misbehave",
        dest="fake_misbehave",
        action="append",
        default=[],
        metavar="NAME",
        help="commit a named spec breach on purpose (see --list-misbehaviours); repeatable",
    )
    parser.add_argument(
        "--plugin-name",
        dest="fake_plugin_name",
        metavar="NAME",
        help="name reported by GetPluginInfo / DriverGetInfo",
    )
    parser.add_argument(
        "--otel",
        dest="fake_otel",
        action="store_true",
        help="a server span per call (opentelemetry-instrumentation-grpc), continuing the"
        " caller's traceparent; exported as the standard OTEL_* environment says"
        " (OTEL_TRACES_EXPORTER defaults to otlp)",
    )
    parser.add_argument(
        "--stream-period",
        dest="fake_stream_period",
        type=float,
        metavar="SECONDS",
        help="seconds between the updates of a streaming method (device plugin"
        " ListAndWatch, DRA health NodeWatchResources; default 1)",
    )
    parser.add_argument(
        "--list-misbehaviours",
        dest="fake_list_misbehaviours",
        action="store_true",
        help="print the misbehaviour catalogue (for --spec, if given) and exit",
    )


def _print_catalogue(spec: str | None) -> None:
    for entry in catalogue(spec):
        specs = ",".join(sorted(entry.specs))
        print(f"{entry.name}  [{specs}]\n    {entry.description}\n    breaks: {entry.section}")


async def run(ns: argparse.Namespace) -> int:
    spec: str | None = SPEC_ALIASES.get(ns.fake_spec, ns.fake_spec)
    # A spec served beside another on one socket (DRA v1beta1 and health): that fake.
    spec = next((host for host, also in SERVED_WITH.items() if spec in also), spec)
    if spec is not None and spec not in FAKE_SPECS:
        raise ConfigError(f"--spec {spec!r}: choose one of {', '.join(FAKE_SPECS)}")
    if ns.fake_list_misbehaviours:
        _print_catalogue(spec)
        return 0
    if spec is None:
        raise ConfigError(f"--spec is required: one of {', '.join(FAKE_SPECS)}")
    listen = ns.fake_listen or os.environ.get(ENDPOINT_VARIABLES.get(spec.split(".")[0], ""))
    if not listen:
        raise ConfigError("--listen is required, e.g. unix:///run/fake.sock")
    knobs = knobs_from_flags(
        spec,
        ns.fake_delay,
        ns.fake_fail,
        ns.fake_misbehave,
        ns.fake_plugin_name,
        getattr(ns, "fake_stream_period", None),
    )
    provider = tracer_provider_from_env(os.environ, spec) if ns.fake_otel else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    if ns.fake_start_delay > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), ns.fake_start_delay)
    try:
        handle = await start_fake_plugin(spec, listen, knobs, tracer_provider=provider)
    except BaseException:
        if provider is not None:
            provider.shutdown()
        raise
    traced = "" if provider is None else " (traced)"
    print(f"fake {spec} plugin listening on {handle.url}{traced}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await handle.stop(grace=1.0)
        if provider is not None:
            # Exports the spans still batched; blocking, so off the event loop.
            await asyncio.to_thread(provider.shutdown)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m plugproxy.fakes.cli --spec ... --listen ...``."""
    parser = argparse.ArgumentParser(prog="plugproxy fake-plugin", description=__doc__)
    add_arguments(parser)
    ns = parser.parse_args(argv)
    try:
        return asyncio.run(run(ns))
    except ConfigError as exc:
        print(f"plugproxy fake-plugin: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
