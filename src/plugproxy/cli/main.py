"""Command line: plugproxy serve | fake-plugin | fake-registrar | demo | report | call | inject
| webhook | prepare-dir.

Only the chosen subcommand's module is imported: `plugproxy serve` on every node should not
pay for the YAML editor of `inject` or the fake plugins of `demo`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from plugproxy import __version__, build
from plugproxy.cli.flags import DefaultsHelpFormatter, OneLineParser
from plugproxy.core.endpoints import ConfigError

DESCRIPTION = (
    "A spec-aware gRPC sidecar for Kubernetes plugins: CSI (volumes), COSI (buckets) and CMI"
    " (machines), Kubernetes' own plugin APIs (KMS v2, device plugins, DRA and its device"
    " health, plugin registration), or any gRPC API from its descriptors. It sits on the"
    " plugin's socket, passes every call through untouched, judges both sides against the"
    " spec, keeps secrets out of its logs, serializes calls per volume, and exports metrics"
    " and traces."
)

# subcommand -> (module with add_arguments(parser) and async run(ns), one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("plugproxy.cli.serve", "run the proxy between a CO and a plugin"),
    "fake-plugin": ("plugproxy.fakes.cli", "serve an in-memory, spec-correct plugin"),
    "fake-registrar": (
        "plugproxy.fakes.registrar",
        "start like node-driver-registrar: wait for the socket, one GetPluginInfo in 1 s",
    ),
    "demo": (
        "plugproxy.cli.demo",
        "run a fake plugin's calls through the proxy (a CSI volume lifecycle by default)",
    ),
    "report": (
        "plugproxy.cli.report",
        "print the spec violations a proxy has seen (its admin server or --violations-file)",
    ),
    "call": (
        "plugproxy.cli.call",
        "send one call to a plugin or proxy socket and print the answer as JSON",
    ),
    "inject": ("plugproxy.cli.inject", "add plugproxy to the workloads of manifests"),
    "webhook": ("plugproxy.cli.webhook", "inject plugproxy into pods on admission"),
    "prepare-dir": (
        "plugproxy.cli.preparedir",
        "create a directory with an owner and mode (init containers; the image has no shell)",
    ),
}


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand argv names (its first word that is not an option), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv``, only the subcommand it names gets its arguments (and its
    module imported) — the others are listed by name and help alone."""
    chosen = _chosen(argv) if argv is not None else None
    parser = OneLineParser(prog="plugproxy", description=DESCRIPTION)
    parser.add_argument(
        "--version", action="version", version=f"plugproxy {__version__} ({build()})"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        # The one-line help is the description too, unless the module gives a longer one;
        # every option's help states its default.
        sub_parser = sub.add_parser(
            name,
            help=help_text,
            description=help_text[0].upper() + help_text[1:] + ".",
            formatter_class=DefaultsHelpFormatter,
        )
        if argv is None or name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub_parser)
            # A module may choose its event loop (serve: --event-loop); None is asyncio's.
            choose_loop = getattr(module, "loop_factory", None)
            sub_parser.set_defaults(run=module.run, loop_factory=choose_loop)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand; its exit status. A reader that stops reading stdout early
    (`plugproxy inject --diff ... | head`) ends it quietly, with the status of a command
    killed by SIGPIPE (141), as the shell's own tools do."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe could not be handled
    except BrokenPipeError:
        return _stdout_closed()
    except SystemExit:  # --help and --version: their text too may meet a closed pipe
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            return _stdout_closed()
        raise
    return code


def _stdout_closed() -> int:
    # What is still buffered goes nowhere at exit, instead of raising again there.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(args)
        ns = parser.parse_args(args)
        choose = getattr(ns, "loop_factory", None)
        with asyncio.Runner(loop_factory=choose(ns) if choose is not None else None) as runner:
            code: int = runner.run(ns.run(ns))
    except ConfigError as exc:
        print(f"plugproxy: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
