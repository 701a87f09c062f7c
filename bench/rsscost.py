"""What `plugproxy serve` costs in resident memory, and where it goes.

    python bench/rsscost.py                # startup, layers and specs below
    python bench/rsscost.py startup --runs 5
    python bench/rsscost.py layers specs
    python bench/rsscost.py objects --volumes 20000,100000,200000
    python bench/rsscost.py holders --volumes 20000

startup  VmRSS of run.py's passthrough, defaults and full targets once they answered their
         first call (run.py's own start-up figure), median of --runs fresh starts each.
layers   One fresh interpreter that imports what serve imports, layer by layer, then builds,
         starts and sends a first CSI v1 call through a proxy with the defaults target's
         flags: VmRSS after each step. A step's delta depends on what came before it (freed
         memory is reused), so the order is serve's own.
specs    Per bundled spec, in fresh interpreters with a started proxy: what routing the
         first method of the spec costs (its pool, rule table, checkers and stage plans are
         built then), in VmRSS and CPU milliseconds; medians of --runs.
objects  ControllerPublishVolume for distinct volume ids through `plugproxy serve` with the
         default flags (--serve-args adds more) in front of the benchmark's mock plugin,
         which answers each with a publish context: VmRSS of the proxy after start-up and
         once each count of --volumes has been published. Not among the default reports
         (minutes of calls).
holders  The same calls through a proxy built in this process with tracemalloc on: the
         source lines that allocated what the proxy still holds after the last count of
         --volumes, largest first (tracemalloc slows the proxy several times). It
         names Python lines only: run it on the sources, `PYTHONPATH=src`, when the
         installed build is compiled.

Modules are compiled to bytecode first, as run.py does (run.compile_plugproxy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import linecache
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import payloads  # noqa: E402
import run  # noqa: E402

from plugproxy.spec.registry import SPEC_NAMES, declared_paths  # noqa: E402

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
    from plugproxy.cli import serve
    from plugproxy.cli.flags import settings_from
    from plugproxy.core.log import Logger

    tmp = tempfile.mkdtemp()
    ns = serve.parse_args([
        "--listen", f"unix://{tmp}/proxy.sock", "--upstream", f"unix://{tmp}/plugin.sock",
        "--admin-listen", "127.0.0.1:0", "--max-message-bytes", "256MiB", "--log-payloads",
        "--listen-when", "start",  # no plugin here: what a started proxy holds, listening
    ])

    async def main():
        server = serve.ProxyServer(settings_from(serve.ServeSettings, ns), Logger(open(os.devnull, "w")))
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
    "plugproxy.cli.serve",
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


# -- many objects ---------------------------------------------------------------------

PUBLISH = "/csi.v1.Controller/ControllerPublishVolume"
# Sends ControllerPublishVolume for ids FIRST..LAST-1 over one connection, STREAMS at a
# time, as an attacher would; a separate process, so the proxy's memory is its own.
PUBLISHER = textwrap.dedent(
    """
    import asyncio, sys
    import grpc
    sys.path.insert(0, BENCH)
    import payloads

    async def main():
        cls = payloads._cls("ControllerPublishVolumeRequest")
        template = cls(node_id="node-0001", readonly=False)
        template.volume_capability.mount.fs_type = "ext4"
        template.volume_capability.access_mode.mode = 1  # SINGLE_NODE_WRITER
        template.volume_context["storage.example/pool"] = "fast"
        ids = iter(range(FIRST, LAST))
        errors = []
        target = ADDR.replace("unix://", "unix:", 1)
        options = [("grpc.default_authority", "localhost")]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            publish = channel.unary_unary(METHOD)

            async def stream():
                for i in ids:
                    request = cls()
                    request.CopyFrom(template)
                    request.volume_id = f"pvc-{i:08d}-0000-4000-8000-{i:012d}"
                    request.volume_context["storage.example/token"] = f"tok-{i:08d}"
                    try:
                        await publish(request.SerializeToString(), timeout=60)
                    except grpc.aio.AioRpcError as err:
                        errors.append(f"{err.code().name}: {err.details()}")

            await asyncio.gather(*(stream() for _ in range(STREAMS)))
        if errors:
            sys.exit(f"{len(errors)} calls failed, the first: {errors[0]}")

    asyncio.run(main())
    """
)


def publish_payloads(directory: Path) -> Path:
    """The mock plugin's table for the objects reports: the usual answers, the plugin's
    capabilities (the proxy asks for them before judging a publish) and an OK publish."""
    table_path = payloads.write_all(directory, 10, 10)
    table = json.loads(table_path.read_text())
    response = payloads._cls("ControllerPublishVolumeResponse")()
    response.publish_context["devicePath"] = "/dev/disk/by-id/scsi-0bench"
    answers = {**payloads.capability_responses(), PUBLISH: bytes(response.SerializeToString())}
    for n, (method, answer) in enumerate(sorted(answers.items())):
        name = f"answer-{n}.bin"
        (directory / name).write_bytes(answer)
        table[method] = {"file": name, "stream": False}
    table_path.write_text(json.dumps(table, indent=1))
    return table_path


def publish_ids(addr: str, first: int, last: int, streams: int = 16) -> None:
    values = {
        "BENCH": str(HERE),
        "ADDR": addr,
        "METHOD": PUBLISH,
        "FIRST": first,
        "LAST": last,
        "STREAMS": streams,
    }
    code = "".join(f"{k} = {v!r}\n" for k, v in values.items()) + PUBLISHER
    subprocess.run([sys.executable, "-c", code], check=True)


@contextlib.contextmanager
def mock_plugin(workdir: Path, kind: str = "auto") -> Iterator[tuple[run.Target, run.Tools]]:
    """The benchmark's mock plugin (Go, or Python with ``kind`` python) serving the table of
    :func:`publish_payloads`."""
    tools = run.pick_tools(argparse.Namespace(loadgen=kind, plugin=kind), workdir)
    table = publish_payloads(workdir / "payloads")
    sock = workdir / "plugin.sock"
    args = [str(sock), str(table)]
    if tools.plugin_kind == "go":
        args = [f"--listen={sock}", f"--table={table}"]
    proc = subprocess.Popen([*tools.plugin, *args], stdout=subprocess.DEVNULL)
    try:
        plugin = run.Target("plugin", sock, proc)
        run.wait_ready(tools, plugin)
        yield plugin, tools
    finally:
        run.stop(proc)


def _counts(raw: str) -> list[int]:
    return sorted({int(part.replace("_", "")) for part in raw.split(",") if part.strip()})


def report_objects(counts: list[int], serve_args: str, tools_kind: str = "auto") -> None:
    flags = shlex.split(serve_args)
    with tempfile.TemporaryDirectory(prefix="plugproxy-rsscost-") as tmp:
        workdir = Path(tmp)
        with mock_plugin(workdir, tools_kind) as (plugin, tools):
            sock = workdir / "proxy.sock"
            # The defaults but for the admin port, which may be taken on a shared machine.
            cmd = [
                sys.executable, "-c", run.SERVE, "--listen", f"unix://{sock}",
                "--upstream", f"unix://{plugin.socket}", "--admin-listen", "127.0.0.1:0", *flags,
            ]  # fmt: skip
            with (workdir / "serve.log").open("wb") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
                try:
                    run.wait_ready(tools, run.Target("serve", sock, proc))
                    start = run.proc_rss(proc.pid)
                    shown = " ".join(flags) or "(defaults)"
                    print(f"ControllerPublishVolume for distinct volume ids, serve {shown}:")
                    print(f"  {0:>9,} ids  VmRSS {start / 2**20:7.2f} MiB")
                    done = 0
                    for count in counts:
                        began = time.monotonic()
                        publish_ids(f"unix://{sock}", done, count)
                        took = time.monotonic() - began
                        done = count
                        rss = run.proc_rss(proc.pid)
                        print(
                            f"  {count:>9,} ids  VmRSS {rss / 2**20:7.2f} MiB"
                            f"  {(rss - start) / 2**20:+7.2f} MiB  ({took:.0f} s)",
                            flush=True,
                        )
                finally:
                    run.stop(proc)


HOLDER_FRAMES = 6  # frames of each allocation's traceback kept: enough to name its owner


def report_holders(counts: list[int], serve_args: str, top: int, tools_kind: str = "auto") -> None:
    from plugproxy.cli import serve  # noqa: PLC0415
    from plugproxy.core.log import Logger  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="plugproxy-rsscost-") as tmp:
        workdir = Path(tmp)
        with mock_plugin(workdir, tools_kind) as (plugin, _):
            sock = workdir / "proxy.sock"
            argv = [
                "--listen", f"unix://{sock}", "--upstream", f"unix://{plugin.socket}",
                "--admin-listen", "127.0.0.1:0", *shlex.split(serve_args),
            ]  # fmt: skip
            settings = serve.parse_settings(argv)

            logger = Logger(open(os.devnull, "w"))  # noqa: SIM115

            async def main() -> tuple[tracemalloc.Snapshot, tracemalloc.Snapshot]:
                server = serve.ProxyServer(settings, logger)
                await server.start()
                # One first call builds CSI v1 (plan, rules, checkers) before the baseline.
                await asyncio.to_thread(publish_ids, f"unix://{sock}", -1, 0, 1)
                gc.collect()
                tracemalloc.start(HOLDER_FRAMES)
                before = tracemalloc.take_snapshot()
                done = 0
                for count in counts:
                    await asyncio.to_thread(publish_ids, f"unix://{sock}", done, count)
                    done = count
                    traced = tracemalloc.get_traced_memory()[0] / 2**20
                    print(f"  {count:,} ids: traced {traced:.2f} MiB", flush=True)
                gc.collect()
                after = tracemalloc.take_snapshot()
                tracemalloc.stop()
                await server.stop(0)
                return before, after

            before, after = asyncio.run(main())
    ours = [tracemalloc.Filter(False, tracemalloc.__file__)]
    grew = after.filter_traces(ours).compare_to(before.filter_traces(ours), "traceback")
    total = sum(d.size_diff for d in grew)
    print(f"held after {counts[-1]:,} ids: {total / 2**20:+.2f} MiB; largest holders:")
    for diff in grew[:top]:
        frames = list(reversed(diff.traceback))  # the allocating line first
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames)
        print(f"  {diff.size_diff / 2**20:+7.2f} MiB {diff.count_diff:+9,} blocks  {where}")
        if frames:
            print(f"      {linecache.getline(frames[0].filename, frames[0].lineno).strip()}")


REPORTS = ("startup", "layers", "specs", "objects", "holders")
DEFAULT_REPORTS = ("startup", "layers", "specs")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/rsscost.py", description=__doc__.split("\n")[0])
    p.add_argument("reports", nargs="*", metavar="REPORT", help=f"any of {', '.join(REPORTS)}")
    p.add_argument("--runs", type=int, default=3, help="fresh processes per figure")
    p.add_argument(
        "--volumes",
        default="20000,100000,200000",
        help="objects, holders: comma-separated counts of distinct volume ids",
    )
    p.add_argument("--serve-args", default="", help="objects, holders: more `serve` flags")
    p.add_argument("--top", type=int, default=15, help="holders: how many to show")
    ns = p.parse_args(argv)
    unknown = [name for name in ns.reports if name not in REPORTS]
    if unknown:
        p.error(f"unknown report(s) {', '.join(unknown)}; known: {', '.join(REPORTS)}")
    run.compile_plugproxy()
    for name in ns.reports or DEFAULT_REPORTS:
        if name == "startup":
            report_startup(ns.runs)
        elif name == "layers":
            report_layers()
        elif name == "specs":
            report_specs(ns.runs)
        elif name == "objects":
            report_objects(_counts(ns.volumes), ns.serve_args)
        else:
            report_holders(_counts(ns.volumes), ns.serve_args, ns.top)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
