"""Command line: plugproxy serve | fake-plugin | demo | report | inject | webhook."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from plugproxy import __version__, demo, inject, report, serve, webhook
from plugproxy.endpoints import ConfigError
from plugproxy.fakes import cli as fake_cli
from plugproxy.options import OneLineParser, add_options


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="plugproxy", description="Spec-aware sidecar for CSI/COSI/CMI.")
    parser.add_argument("--version", action="version", version=f"plugproxy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    serve_parser = sub.add_parser("serve", help="run the proxy between a CO and a plugin")
    add_options(serve_parser, serve.all_options())
    serve_parser.set_defaults(run=serve.run)

    fake_parser = sub.add_parser("fake-plugin", help="serve an in-memory, spec-correct plugin")
    fake_cli.add_arguments(fake_parser)
    fake_parser.set_defaults(run=fake_cli.run)

    demo_parser = sub.add_parser("demo", help="run a volume lifecycle through the proxy")
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(run=demo.run)

    report_parser = sub.add_parser("report", help="print the spec violations a proxy has seen")
    report.add_arguments(report_parser)
    report_parser.set_defaults(run=report.run)

    inject_parser = sub.add_parser("inject", help="add plugproxy to the workloads of manifests")
    inject.add_arguments(inject_parser)
    inject_parser.set_defaults(run=inject.run)

    webhook_parser = sub.add_parser("webhook", help="inject plugproxy into pods on admission")
    webhook.add_arguments(webhook_parser)
    webhook_parser.set_defaults(run=webhook.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        ns = parser.parse_args(argv)
        code: int = asyncio.run(ns.run(ns))
    except ConfigError as exc:
        print(f"plugproxy: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
