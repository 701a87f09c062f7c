"""Benchmark plugproxy against the bare plugin and other proxies; one command, one report.

    python bench/run.py --quick        # about a minute: every figure, short runs
    python bench/run.py                # full: 10 s runs, 3 interleaved repeats
    python bench/run.py --smoke        # seconds: checks the harness itself (the test suite)
    python bench/run.py --quick --features --no-big   # what each stage costs on its own

Targets, all serving the same prepared CSI v1 payloads (bench/payloads.py):
  direct          the mock plugin itself (Go, or Python where Go is missing)
  passthrough     plugproxy with every stage off
  defaults        plugproxy as it starts with no flags, plus --log-payloads
  full            plugproxy with every stage on (audit validation, payload log with
                  redaction, serialization, metrics, tracing sampled at 10 %)
  csi-grpc-proxy  an already built democratic-csi/csi-grpc-proxy binary, when
                  --csi-grpc-proxy PATH or PLUGPROXY_BENCH_CSI_GRPC_PROXY names one

Results go to bench/results/<time>.json and .md; every figure is also given as a ratio
to the direct path measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import payloads  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
GOPATH_SYSTEM = "/usr/share/gocode"
# As `plugproxy serve` runs (its event loop included: --event-loop, asyncio by default).
SERVE = "import sys; from plugproxy.cli import main as cli; sys.exit(cli.main(['serve', *sys.argv[1:]]))"
# The budget for a proxy with its default configuration, just started.
STARTUP_RSS_GOAL = 36 * 2**20

# Stage flags for the "full" target, applied when this build offers them (None: a switch).
# A wanted value the flag does not offer is replaced by its first choice other than "off".
FULL_WANTED: dict[str, str | None] = {
    "--validation": "audit",
    "--serialize": "wait",
    "--call-log": "all",
    "--log-payloads": None,
    "--redact-defaults": "on",
    "--tracing": "on",
}
# For "passthrough" every flag whose choices include "off" is set to off, and these
# switches are given.
PASSTHROUGH_SWITCHES = ("--disable-metrics", "--disable-tracing", "--disable-validation")
FULL_ENV = {
    "OTEL_TRACES_EXPORTER": "console",
    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    "OTEL_TRACES_SAMPLER_ARG": "0.1",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
}


# --features: passthrough plus one stage, to price each one. (flags added, flags dropped, env)
FEATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]] = {
    "validation": (("--validation", "audit"), (), {}),
    "call-log": (("--call-log", "all"), (), {}),
    "call-log+payloads": (
        ("--call-log", "all", "--log-payloads", "--redact-defaults", "on"),
        (),
        {},
    ),
    "serialization": (("--serialize", "wait"), (), {}),
    "metrics": ((), ("--disable-metrics",), {}),
    "tracing": ((), (), FULL_ENV),
}


@dataclass
class Mode:
    name: str
    duration: float
    warmup: int
    repeat: int
    list_entries: int
    list_calls: int
    blocks: int
    stream_calls: int
    companion_seconds: float


MODES = {
    "smoke": Mode("smoke", 0.3, 0, 1, 200, 1, 2000, 1, 0.5),
    "quick": Mode("quick", 2.0, 100, 1, 10_000, 20, 100_000, 3, 2.0),
    "full": Mode("full", 10.0, 500, 3, 10_000, 50, 100_000, 10, 5.0),
}


# -- machine ---------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg()[0],
    }
    probe = (
        "import json, grpc; from google.protobuf.internal import api_implementation as a; "
        "d = {'grpc': grpc.__version__, 'protobuf_backend': a.Type()}\n"
        "try:\n import uvloop; d['uvloop'] = uvloop.__version__\n"
        "except ImportError: d['uvloop'] = None\n"
        "print(json.dumps(d))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    info.update(json.loads(out.stdout))
    go = shutil.which("go")
    if go:
        info["go"] = subprocess.run(
            [go, "version"], capture_output=True, text=True, check=False
        ).stdout.strip()
    return info


# -- tools -----------------------------------------------------------------------------


def build_go(workdir: Path) -> tuple[Path, Path] | None:
    """Build the Go generator and mock plugin into workdir; None when Go or grpc-go is missing."""
    go = shutil.which("go")
    if go is None or not Path(GOPATH_SYSTEM, "src/google.golang.org/grpc").is_dir():
        return None
    digest = hashlib.sha256()
    for src in sorted((HERE / "go").rglob("*.go")):
        digest.update(src.read_bytes())
    cache = Path(tempfile.gettempdir()) / f"plugproxy-bench-go-{digest.hexdigest()[:12]}"
    cache.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": GOPATH_SYSTEM,
        "GOCACHE": str(Path(tempfile.gettempdir()) / "plugproxy-bench-gocache"),
        "GOFLAGS": "",
    }
    built = []
    for name in ("loadgen", "mockplugin"):
        out = cache / name
        if not out.exists():
            subprocess.run(
                [go, "build", "-o", str(out), f"./{name}"],
                env=env,
                check=True,
                cwd=HERE / "go",
            )
        built.append(out)
    return built[0], built[1]


@dataclass
class Tools:
    loadgen: list[str]
    plugin: list[str]  # followed by SOCKET TABLE
    loadgen_kind: str
    plugin_kind: str


def pick_tools(ns: argparse.Namespace, workdir: Path) -> Tools:
    go = (
        build_go(workdir)
        if "go" in (ns.loadgen, ns.plugin)
        or "auto"
        in (
            ns.loadgen,
            ns.plugin,
        )
        else None
    )
    if (ns.loadgen == "go" and go is None) or (ns.plugin == "go" and go is None):
        raise SystemExit("bench: Go or Debian's golang-google-grpc-dev is missing")
    use_go_loadgen = go is not None and ns.loadgen in ("go", "auto")
    use_go_plugin = go is not None and ns.plugin in ("go", "auto")
    loadgen = (
        [str(go[0])] if use_go_loadgen and go else [sys.executable, str(HERE / "pyloadgen.py")]
    )
    plugin = [str(go[1])] if use_go_plugin and go else [sys.executable, str(HERE / "pyplugin.py")]
    return Tools(
        loadgen,
        plugin,
        "go" if use_go_loadgen else "python",
        "go" if use_go_plugin else "python",
    )


# -- processes -------------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process, all threads."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Target:
    name: str
    socket: Path
    proc: subprocess.Popen[bytes]
    flags: list[str] = field(default_factory=list)
    startup_rss: int = 0  # VmRSS once it answered its first call, before any load

    @property
    def addr(self) -> str:
        return f"unix://{self.socket}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def loadgen(
    tools: Tools,
    addr: str,
    *,
    method: str = payloads.PLUGIN_INFO,
    request: Path | None = None,
    streams: int = 1,
    duration: float = 0.0,
    calls: int = 0,
    warmup: int = 0,
    server_stream: bool = False,
    background: bool = False,
) -> Any:
    args = [
        *tools.loadgen,
        f"--addr={addr}",
        f"--method={method}",
        f"--streams={streams}",
        f"--warmup={warmup}",
    ]
    if request is not None:
        args.append(f"--request={request}")
    if duration:
        args.append(f"--duration={duration}s")
    else:
        args.append(f"--calls={calls}")
    if server_stream:
        args.append("--server-stream")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if background:
        return proc
    return finish_loadgen(proc)


def finish_loadgen(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    """Wait for a generator; its JSON result plus its own CPU time (from wait4's rusage)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read() if proc.stdout else b""
    err = proc.stderr.read() if proc.stderr else b""
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed: {err.decode(errors='replace').strip()}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    result["loadgen_cpu_s"] = usage.ru_utime + usage.ru_stime
    return result


def wait_ready(tools: Tools, target: Target, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if target.proc.poll() is not None:
            raise RuntimeError(
                f"{target.name} exited with {target.proc.returncode}: {target.flags}"
            )
        if target.socket.exists():
            try:
                result = loadgen(tools, target.addr, calls=1)
                if result["errors"] == 0:
                    return
                last = result["first_error"]
            except (RuntimeError, ValueError) as exc:
                last = str(exc)
        time.sleep(0.2)
    raise RuntimeError(f"{target.name} not ready in {timeout:.0f}s: {last}")


def compile_plugproxy() -> None:
    """Compile plugproxy's modules to bytecode, as the image and pip install do. Read from
    source, a proxy's start-up RSS would count the compiler's own memory too (about 3 MiB
    once a first call has compiled the spec's rule tables)."""
    code = "import os, plugproxy; print(os.path.dirname(plugproxy.__file__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", out.stdout.strip()], check=True)


def serve_flags(mode: str, log_file: Path) -> list[str]:
    """Stage flags for 'passthrough' (all off) or 'full' (all on), from what serve offers."""
    code = (
        "import json; from plugproxy.cli import serve; print(json.dumps([[o.flag, "
        "list(o.choices or []), o.is_switch] for o in serve.all_options()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    offered = {flag: (choices, switch) for flag, choices, switch in json.loads(out.stdout)}
    flags: list[str] = []
    for flag, (choices, switch) in offered.items():
        if mode == "passthrough":
            if "off" in choices:
                flags += [flag, "off"]
            elif switch and flag in PASSTHROUGH_SWITCHES:
                flags.append(flag)
        elif mode == "full" and flag in FULL_WANTED:
            value = FULL_WANTED[flag]
            if switch:
                flags.append(flag)
            elif value is not None and choices and value not in choices:
                flags += [flag, next(c for c in choices if c != "off")]
            elif value is not None:
                flags += [flag, value]
    for flag, value in (
        ("--payload-log-file", str(log_file)),
        ("--log-payload-file", str(log_file)),
    ):
        if mode == "full" and flag in offered:
            flags += [flag, value]
    return flags


def serve_command(sock: Path, plugin_sock: Path, admin: str, flags: Sequence[str]) -> list[str]:
    return [
        sys.executable,
        "-c",
        SERVE,
        "--listen",
        f"unix://{sock}",
        "--upstream",
        f"unix://{plugin_sock}",
        "--admin-listen",
        admin,
        "--max-message-bytes",
        "256MiB",
        *flags,
    ]


@contextlib.contextmanager
def targets(
    ns: argparse.Namespace, tools: Tools, workdir: Path, table: Path
) -> Iterator[dict[str, Target]]:
    started: list[subprocess.Popen[bytes]] = []
    running: dict[str, Target] = {}
    logs: list[Any] = []

    def spawn(cmd: Sequence[str], env: dict[str, str] | None = None, log: str = "") -> Any:
        out: Any = subprocess.DEVNULL
        if log:
            out = (workdir / log).open("wb")
            logs.append(out)
        proc = subprocess.Popen(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        started.append(proc)
        return proc

    try:
        plugin_sock = workdir / "plugin.sock"
        args = [str(plugin_sock), str(table)]
        if tools.plugin_kind == "go":
            args = [f"--listen={plugin_sock}", f"--table={table}"]
        direct = Target("direct", plugin_sock, spawn([*tools.plugin, *args]))
        running["direct"] = direct
        wait_ready(tools, direct)
        for name in ("passthrough", "defaults", "full"):
            if name not in ns.targets:
                continue
            sock = workdir / f"{name}.sock"
            if name == "defaults":
                flags = ["--log-payloads"]  # the rest as a deployment without flags runs it
            else:
                flags = serve_flags(name, workdir / f"{name}-payloads.log")
            extra = shlex.split(ns.passthrough_args if name == "passthrough" else ns.full_args)
            admin = "off" if name == "passthrough" else "127.0.0.1:0"
            cmd = serve_command(sock, plugin_sock, admin, [*flags, *extra])
            env = FULL_ENV if name == "full" else {}
            target = Target(name, sock, spawn(cmd, env, f"{name}.log"), [*flags, *extra])
            running[name] = target
            wait_ready(tools, target)
            target.startup_rss = proc_rss(target.proc.pid)
        for feature in ns.features:
            added, dropped, env = FEATURES[feature]
            sock = workdir / f"feature-{feature}.sock"
            base = [f for f in serve_flags("passthrough", workdir / "unused") if f not in dropped]
            cmd = serve_command(sock, plugin_sock, "off", [*base, *added])
            name = f"+{feature}"
            target = Target(name, sock, spawn(cmd, env, f"feature-{feature}.log"), [*base, *added])
            running[name] = target
            wait_ready(tools, target)
        binary = ns.csi_grpc_proxy or os.environ.get("PLUGPROXY_BENCH_CSI_GRPC_PROXY", "")
        if binary and "csi-grpc-proxy" in ns.targets:
            if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
                sys.exit(f"bench/run.py: csi-grpc-proxy {binary!r} is not an executable file")
            sock = workdir / "cgp.sock"
            env = {"BIND_TO": f"unix://{sock}", "PROXY_TO": f"unix://{plugin_sock}"}
            target = Target("csi-grpc-proxy", sock, spawn([binary], env))
            running["csi-grpc-proxy"] = target
            wait_ready(tools, target)
            target.startup_rss = proc_rss(target.proc.pid)
        yield running
    finally:
        for proc in reversed(started):
            stop(proc)
        for f in logs:
            f.close()


# -- scenarios -------------------------------------------------------------------------


def measured(target: Target, plugin: Target, tools: Tools, **kwargs: Any) -> dict[str, Any]:
    """One generator run with the target's and the plugin's CPU and memory around it."""
    warm = kwargs.pop("warmup", 0)
    if warm:
        loadgen(tools, target.addr, **{**kwargs, "duration": 0.0, "calls": warm})
    cpu0, pcpu0 = proc_cpu(target.proc.pid), proc_cpu(plugin.proc.pid)
    result: dict[str, Any] = loadgen(tools, target.addr, **kwargs)
    cpu1, pcpu1 = proc_cpu(target.proc.pid), proc_cpu(plugin.proc.pid)
    calls = max(result["calls"], 1)
    result["target_cpu_us_per_call"] = (cpu1 - cpu0) / calls * 1e6
    result["plugin_cpu_us_per_call"] = (pcpu1 - pcpu0) / calls * 1e6
    result["loadgen_cpu_us_per_call"] = result["loadgen_cpu_s"] / calls * 1e6
    result["rss_bytes"] = proc_rss(target.proc.pid)
    if result["errors"]:
        print(f"  ! {target.name}: {result['errors']} errors: {result['first_error']}")
    return result


def throughput(mode: Mode, tools: Tools, running: dict[str, Target]) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    plugin = running["direct"]
    for rep in range(mode.repeat):
        for streams in (1, 16):
            for name, target in running.items():
                r = measured(
                    target,
                    plugin,
                    tools,
                    streams=streams,
                    duration=mode.duration,
                    warmup=mode.warmup,
                )
                runs.setdefault(name, {}).setdefault(str(streams), []).append(r)
                print(
                    f"  [{rep + 1}/{mode.repeat}] {name:15} {streams:2} streams: "
                    f"{r['throughput']:8.0f} calls/s  p50 {r['p50_us']:7.0f} µs  "
                    f"p99 {r['p99_us']:7.0f} µs  cpu {r['target_cpu_us_per_call']:6.0f} µs/call"
                )
    return runs


def big_calls(mode: Mode, tools: Tools, running: dict[str, Target], files: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    plugin = running["direct"]
    big = {name: target for name, target in running.items() if not name.startswith("+")}
    # ListVolumes alone, interleaved across targets like the throughput runs; the run with
    # the median p50 is kept (features are priced on small calls only).
    pages: dict[str, list[dict[str, Any]]] = {name: [] for name in big}
    for _ in range(mode.repeat):
        for name, target in big.items():
            pages[name].append(
                measured(
                    target,
                    plugin,
                    tools,
                    method=payloads.LIST_VOLUMES,
                    request=files / "empty.bin",
                    calls=mode.list_calls,
                    warmup=min(mode.warmup, 1),
                )
            )
    for name, target in big.items():
        ranked = sorted(pages[name], key=lambda r: float(r["p50_us"]))
        lv = ranked[len(ranked) // 2]
        # Other calls must keep flowing while big answers are validated and redacted.
        companion = loadgen(
            tools,
            target.addr,
            duration=mode.companion_seconds,
            warmup=min(mode.warmup, 10),
            background=True,
        )
        busy = loadgen(
            tools,
            target.addr,
            method=payloads.LIST_VOLUMES,
            request=files / "empty.bin",
            duration=mode.companion_seconds,
        )
        side = finish_loadgen(companion)
        md = measured(
            target,
            plugin,
            tools,
            method=payloads.METADATA_ALLOCATED,
            request=files / "metadata_request.bin",
            server_stream=True,
            calls=mode.stream_calls,
            warmup=min(mode.warmup, 1),
        )
        out[name] = {
            "list_volumes": lv,
            "list_volumes_busy": busy,
            "companion": side,
            "metadata": md,
        }
        print(
            f"  {name:15} ListVolumes({mode.list_entries}) p50 {lv['p50_us'] / 1000:7.1f} ms  "
            f"GetMetadataAllocated({mode.blocks} blocks) {md['mean_us'] / 1000:7.1f} ms  "
            f"GetPluginInfo during ListVolumes: {side['calls']} calls, "
            f"p99 {side.get('p99_us', 0) / 1000:.1f} ms"
        )
    return out


def rss_run(calls: int, tools: Tools, running: dict[str, Target]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    chunk = max(calls // 10, 1)
    for name in ("passthrough", "defaults", "full"):
        if name not in running:
            continue
        target = running[name]
        samples = []
        for _ in range(10):
            loadgen(tools, target.addr, streams=16, calls=chunk)
            samples.append(proc_rss(target.proc.pid))
        growth = (samples[-1] - samples[0]) / samples[0] * 100
        out[name] = {"calls": chunk * 10, "rss_samples": samples, "growth_after_first_pct": growth}
        print(f"  {name:15} RSS over {chunk * 10} calls: {[s >> 20 for s in samples]} MiB")
    return out


# -- summary ---------------------------------------------------------------------------


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(float(r.get(key, 0.0)) for r in runs))


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    runs = report["throughput"]
    rows: dict[str, Any] = {}
    for name, by_streams in runs.items():
        row: dict[str, Any] = {}
        for streams, rs in by_streams.items():
            row[streams] = {
                k: _median(rs, k)
                for k in (
                    "throughput",
                    "p50_us",
                    "p99_us",
                    "target_cpu_us_per_call",
                    "loadgen_cpu_us_per_call",
                    "rss_bytes",
                )
            }
            row[streams]["spread_pct"] = (
                (max(r["throughput"] for r in rs) - min(r["throughput"] for r in rs))
                / max(_median(rs, "throughput"), 1e-9)
                * 100
            )
        rows[name] = row
    direct = rows["direct"]
    for row in rows.values():
        for streams, m in row.items():
            m["throughput_vs_direct"] = m["throughput"] / max(direct[streams]["throughput"], 1e-9)
            m["added_p50_us"] = m["p50_us"] - direct[streams]["p50_us"]
    goals: dict[str, Any] = {}
    if "passthrough" in rows and "csi-grpc-proxy" in rows:
        ours, theirs = rows["passthrough"], rows["csi-grpc-proxy"]
        goals["1_added_latency_1_stream_vs_csi_grpc_proxy"] = {
            "passthrough_us": ours["1"]["added_p50_us"],
            "csi_grpc_proxy_us": theirs["1"]["added_p50_us"],
            "met": ours["1"]["added_p50_us"] <= 0.5 * theirs["1"]["added_p50_us"],
        }
        share = ours["16"]["throughput"] / max(theirs["16"]["throughput"], 1e-9)
        goals["1_throughput_16_streams_vs_csi_grpc_proxy"] = {"share": share, "met": share >= 2}
    for name, floor in (("defaults", 0.90), ("full", 0.85)):
        if "passthrough" in rows and name in rows:
            share = rows[name]["16"]["throughput"] / max(
                rows["passthrough"]["16"]["throughput"], 1e-9
            )
            goals[f"2_{name}_vs_passthrough_16_streams"] = {"share": share, "met": share >= floor}
    big = report.get("big_calls", {})
    if "passthrough" in big and "full" in big:
        ratio = big["full"]["list_volumes"]["p50_us"] / max(
            big["passthrough"]["list_volumes"]["p50_us"], 1e-9
        )
        goals["3_list_volumes_full_vs_passthrough"] = {
            "ratio": ratio,
            "companion_calls_during": big["full"]["companion"]["calls"],
            "met": ratio <= 1.5 and big["full"]["companion"]["calls"] > 0,
        }
    startup = report.get("startup_rss_bytes", {})
    if "defaults" in startup:
        goals["4_startup_rss_defaults"] = {
            "mib": startup["defaults"] / 2**20,
            "met": startup["defaults"] <= STARTUP_RSS_GOAL,
        }
    features: dict[str, Any] = {}
    if "passthrough" in rows:
        base = rows["passthrough"]["16"]
        features = {
            name[1:]: {
                "share_of_passthrough": row["16"]["throughput"] / max(base["throughput"], 1e-9),
                "added_cpu_us_per_call": row["16"]["target_cpu_us_per_call"]
                - base["target_cpu_us_per_call"],
            }
            for name, row in rows.items()
            if name.startswith("+")
        }
    rss = report.get("rss", {})
    for name, r in rss.items():
        goals[f"4_rss_flat_{name}"] = {
            "calls": r["calls"],
            "growth_pct": r["growth_after_first_pct"],
            "met": abs(r["growth_after_first_pct"]) <= 5.0,
        }
    return {"rows": rows, "goals": goals, "features": features}


def markdown(report: dict[str, Any]) -> str:
    m, s = report["machine"], report["summary"]
    lines = [
        f"Run `{report['mode']}` at {report['started']}: {m['nproc']} CPUs ({m['cpu']}), "
        f"Python {m['python']}, grpcio {m['grpc']}, protobuf {m['protobuf_backend']}, "
        f"load generator {report['tools']['loadgen']}, plugin {report['tools']['plugin']}, "
        f"load average {m['loadavg_start']:.2f} → {m['loadavg_end']:.2f}, "
        f"{report['repeat']} repeat(s), medians.",
        "",
        "| target | streams | calls/s | vs direct | p50 µs | p99 µs | added p50 µs "
        "| proxy CPU µs/call | RSS MiB | spread % |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in s["rows"].items():
        for streams in ("1", "16"):
            r = row[streams]
            cpu = "—" if name == "direct" else f"{r['target_cpu_us_per_call']:.0f}"
            lines.append(
                f"| {name} | {streams} | {r['throughput']:.0f} | {r['throughput_vs_direct']:.2f} "
                f"| {r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['added_p50_us']:.0f} | {cpu} "
                f"| {r['rss_bytes'] / 2**20:.0f} | {r['spread_pct']:.0f} |"
            )
    direct_lg = s["rows"]["direct"]["16"]
    lines += [
        "",
        f"Load generator's own cost against the bare plugin at 16 streams: "
        f"{direct_lg['loadgen_cpu_us_per_call']:.0f} µs CPU per call "
        f"(ceiling ≈ {direct_lg['throughput']:.0f} calls/s with the plugin on the same CPUs).",
    ]
    startup = report.get("startup_rss_bytes", {})
    if startup:
        shown = ", ".join(f"{name} {rss / 2**20:.1f} MiB" for name, rss in startup.items())
        lines += ["", f"RSS after start-up (first call answered, before any load): {shown}."]
    big = report.get("big_calls", {})
    if big:
        lines += [
            "",
            "| target | ListVolumes p50 ms | vs direct | GetMetadataAllocated ms | vs direct "
            "| GetPluginInfo calls during ListVolumes | their p99 ms |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        d = big["direct"]
        for name, b in big.items():
            lines.append(
                f"| {name} | {b['list_volumes']['p50_us'] / 1000:.1f} "
                f"| {b['list_volumes']['p50_us'] / d['list_volumes']['p50_us']:.2f} "
                f"| {b['metadata']['mean_us'] / 1000:.1f} "
                f"| {b['metadata']['mean_us'] / d['metadata']['mean_us']:.2f} "
                f"| {b['companion']['calls']} | {b['companion'].get('p99_us', 0) / 1000:.1f} |"
            )
    if s.get("features"):
        lines += [
            "",
            "Each stage alone on top of passthrough, 16 streams:",
            "",
            "| stage | calls/s vs passthrough | added proxy CPU µs/call |",
            "|---|---:|---:|",
        ]
        for feature, f in s["features"].items():
            lines.append(
                f"| {feature} | {f['share_of_passthrough']:.2f} "
                f"| {f['added_cpu_us_per_call']:.0f} |"
            )
    if s["goals"]:
        lines += ["", "| goal | measured | met |", "|---|---|---|"]
        for goal, g in s["goals"].items():
            shown = ", ".join(
                f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                for k, v in g.items()
                if k != "met"
            )
            lines.append(f"| {goal} | {shown} | {'yes' if g['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


# -- main ------------------------------------------------------------------------------


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n")[0])
    group = p.add_mutually_exclusive_group()
    group.add_argument("--quick", dest="mode", action="store_const", const="quick")
    group.add_argument("--smoke", dest="mode", action="store_const", const="smoke")
    p.set_defaults(mode="full")
    p.add_argument("--loadgen", choices=("auto", "go", "python"), default="auto")
    p.add_argument("--plugin", choices=("auto", "go", "python"), default="auto")
    p.add_argument("--csi-grpc-proxy", default="", metavar="PATH", help="a built binary")
    p.add_argument(
        "--targets",
        default="passthrough,defaults,full,csi-grpc-proxy",
        help="comma-separated, besides direct (always measured)",
    )
    p.add_argument("--repeat", type=int, default=0, help="interleaved repeats (mode default)")
    p.add_argument("--duration", type=float, default=0.0, help="seconds per run (mode default)")
    p.add_argument("--rss-calls", type=int, default=0, help="also run N calls watching RSS")
    p.add_argument("--passthrough-args", default="", help="extra serve flags for passthrough")
    p.add_argument("--full-args", default="", help="extra serve flags for full")
    p.add_argument("--no-big", action="store_true", help="skip ListVolumes/streaming calls")
    p.add_argument(
        "--features",
        nargs="?",
        const=",".join(FEATURES),
        default="",
        help=f"also measure passthrough plus each of these stages alone ({', '.join(FEATURES)};"
        " all when given no list)",
    )
    p.add_argument("--out", type=Path, default=HERE / "results")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ns = parse(sys.argv[1:] if argv is None else argv)
    ns.targets = [t.strip() for t in ns.targets.split(",") if t.strip()]
    ns.features = [f.strip() for f in ns.features.split(",") if f.strip()]
    unknown = [f for f in ns.features if f not in FEATURES]
    if unknown:
        sys.exit(
            f"bench/run.py: unknown feature(s) {', '.join(unknown)}; known: {', '.join(FEATURES)}"
        )
    if ns.features and "passthrough" not in ns.targets:
        ns.targets.append("passthrough")  # features are priced against it
    base = MODES[ns.mode]
    mode = Mode(
        **{
            **base.__dict__,
            "repeat": ns.repeat or base.repeat,
            "duration": ns.duration or base.duration,
        }
    )
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    with tempfile.TemporaryDirectory(prefix="plugproxy-bench-") as tmp:
        workdir = Path(tmp)
        tools = pick_tools(ns, workdir)
        table = payloads.write_all(workdir / "payloads", mode.list_entries, mode.blocks)
        report: dict[str, Any] = {
            "mode": mode.name,
            "started": started,
            "repeat": mode.repeat,
            "duration_s": mode.duration,
            "machine": machine(),
            "tools": {"loadgen": tools.loadgen_kind, "plugin": tools.plugin_kind},
        }
        print(f"bench {mode.name}: {report['machine']}")
        compile_plugproxy()
        with targets(ns, tools, workdir, table) as running:
            report["flags"] = {name: t.flags for name, t in running.items()}
            report["startup_rss_bytes"] = {
                name: t.startup_rss for name, t in running.items() if t.startup_rss
            }
            report["throughput"] = throughput(mode, tools, running)
            if not ns.no_big:
                report["big_calls"] = big_calls(mode, tools, running, workdir / "payloads")
            if ns.rss_calls:
                report["rss"] = rss_run(ns.rss_calls, tools, running)
        report["machine"]["loadavg_end"] = os.getloadavg()[0]
    report["summary"] = summarize(report)
    ns.out.mkdir(parents=True, exist_ok=True)
    stem = ns.out / f"{started.replace(':', '')}-{mode.name}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    table_md = markdown(report)
    stem.with_suffix(".md").write_text(table_md)
    print()
    print(table_md)
    print(f"written: {stem}.json, {stem}.md")
    return report


if __name__ == "__main__":
    main()
