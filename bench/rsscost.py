"""What `plugproxy serve` costs in resident memory, and where it goes.

    python bench/rsscost.py                # all three reports below
    python bench/rsscost.py startup --runs 5
    python bench/rsscost.py layers specs

startup  VmRSS of run.py's passthrough, defaults and full targets once they answered their
         first call (run.py's own start-up figure), median of --runs fresh starts each.
layers   One fresh interpreter that imports what serve imports, layer by layer, then builds,
         starts and sends a first CSI v1 call through a proxy with the defaults target's
         flags: VmRSS after each step. A step's delta depends on what came before it (freed
         memory is reused), so the order is serve's own.
specs    Per bundled spec, in fresh interpreters with a started proxy: what routing the
         first method of the spec costs (its pool, rule table, checkers and stage plans are
         built then), in VmRSS and CPU milliseconds; medians of --runs.

Modules are compiled to bytecode first, as run.py does (run.compile_plugproxy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import payloads  # noqa: E402
import run  # noqa: E402

from plugproxy.registry import SPEC_NAMES, declared_paths  # noqa: E402

# Run in a fresh interpreter: prints one JSON object of VmRSS marks (MiB) and timings.
PROBE = textwrap.dedent(
    """
    import json, sys, time

    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024

    marks = [("interpreter", rss())]
    for name in LAYERS:
        __import__(name)
        marks.append((name, rss()))

    import asyncio, os, tempfile
    from plugproxy import serve
    from plugproxy.log import Logger

    tmp = tempfile.mkdtemp()
    ns = serve.parse_args([
        "--listen", f"unix://{tmp}/proxy.sock", "--upstream", f"unix://{tmp}/plugin.sock",
        "--admin-listen", "127.0.0.1:0", "--max-message-bytes", "256MiB", "--log-payloads",
        "--listen-when", "start",  # no plugin here: what a started proxy holds, listening
    ])

    async def main():
        server = serve.ProxyServer(ns, Logger(open(os.devnull, "w")))
        marks.append(("ProxyServer built", rss()))
        await server.start()
        await asyncio.sleep(0.05)
        marks.append(("started", rss()))
        timings = {}
        for spec, path in PATHS:
            before = time.process_time()
            server.relay.route(path.encode())  # as a call's headers do
            timings[spec] = (time.process_time() - before) * 1000
            marks.append((f"first {spec} call routed", rss()))
        await server.stop(0)
        print(json.dumps({"marks": marks, "ms": timings}))

    with asyncio.Runner(loop_factory=serve.loop_factory(ns)) as runner:
        runner.run(main())
    """
)
# serve's import order: the standard library's event loop (ssl comes with it), then the
# third-party packages, then plugproxy itself.
LAYERS = (
    "ssl",
    "asyncio",
    "http.server",
    "google.protobuf.descriptor_pb2",
    "prometheus_client",
    "hpack",
    "orjson",
    "uvloop",
    "plugproxy.serve",
)


def probe(layers: tuple[str, ...], paths: list[tuple[str, str]]) -> dict[str, Any]:
    code = f"LAYERS = {layers!r}\nPATHS = {paths!r}\n{PROBE}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def first_path(spec: str) -> str:
    return sorted(declared_paths(spec))[0]


def report_startup(runs: int) -> None:
    ns = argparse.Namespace(
        loadgen="auto",
        plugin="auto",
        targets=["passthrough", "defaults", "full"],
        passthrough_args="",
        full_args="",
        features=[],
        csi_grpc_proxy="",
    )
    found: dict[str, list[float]] = {name: [] for name in ns.targets}
    with tempfile.TemporaryDirectory(prefix="plugproxy-rsscost-") as tmp:
        workdir = Path(tmp)
        tools = run.pick_tools(ns, workdir)
        table = payloads.write_all(workdir / "payloads", 10, 10)
        for _ in range(runs):
            with run.targets(ns, tools, workdir, table) as running:
                for name in ns.targets:
                    found[name].append(running[name].startup_rss / 2**20)
    print(f"VmRSS after start-up, first call answered (median of {runs}):")
    for name, values in found.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"  {name:12} {statistics.median(values):6.2f} MiB   ({shown})")
    goal = run.STARTUP_RSS_GOAL / 2**20
    print(f"  goal for defaults: {goal:.0f} MiB")


def report_layers() -> None:
    result = probe(LAYERS, [("csi.v1", payloads.PLUGIN_INFO)])
    print("VmRSS, one interpreter, serve's layers in order (delta, total):")
    previous = result["marks"][0][1]
    for name, value in result["marks"]:
        print(f"  {name:34} {value - previous:+6.2f} {value:7.2f} MiB")
        previous = value
    ms = result["ms"]["csi.v1"]
    print(f"  routing the first csi.v1 call built csi.v1 in {ms:.1f} ms of CPU")


def report_specs(runs: int) -> None:
    print(f"First call of each bundled spec after start-up (median of {runs} interpreters):")
    for spec in SPEC_NAMES:
        grew, ms = [], []
        for _ in range(runs):
            result = probe((), [(spec, first_path(spec))])
            marks = dict(result["marks"])
            grew.append(marks[f"first {spec} call routed"] - marks["started"])
            ms.append(result["ms"][spec])
        print(
            f"  {spec:22} {statistics.median(grew):+6.2f} MiB"
            f"  {statistics.median(ms):6.1f} ms of CPU"
        )


REPORTS = ("startup", "layers", "specs")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/rsscost.py", description=__doc__.split("\n")[0])
    p.add_argument("reports", nargs="*", metavar="REPORT", help=f"any of {', '.join(REPORTS)}")
    p.add_argument("--runs", type=int, default=3, help="fresh processes per figure")
    ns = p.parse_args(argv)
    unknown = [name for name in ns.reports if name not in REPORTS]
    if unknown:
        p.error(f"unknown report(s) {', '.join(unknown)}; known: {', '.join(REPORTS)}")
    run.compile_plugproxy()
    for name in ns.reports or REPORTS:
        if name == "startup":
            report_startup(ns.runs)
        elif name == "layers":
            report_layers()
        else:
            report_specs(ns.runs)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
