"""Soak: plugproxy with every stage on, under sustained load, watched for leaks.

    python bench/soak.py                      # 3 minutes, 16 concurrent lifecycles
    python bench/soak.py --duration 600 --concurrency 32 --json soak.json
    python bench/soak.py --duration 10        # a quick check of the script itself

The proxy (``python -m plugproxy serve``) and the fake CSI v1 plugin (``plugproxy
fake-plugin``) run as their own processes. Everything is on: validation in audit mode,
the call log with redacted payloads (written to a file), serialization in wait mode,
metrics, and tracing sampled at 10 % to the console exporter (into the same file).

Each worker runs full volume lifecycles (create, publish, stage, publish on the node, and
back down to delete) and, after each create, three concurrent calls on the same volume so
serialization has real waits to do. The run is bounded by --duration and --max-calls.

Reported before the load (idle), at the start (after a warm-up) and at the end (after the
load stopped and the calls drained): the proxy's resident memory (VmRSS), open file
descriptors (/proc/PID/fd) and asyncio tasks (GET /debug/tasks on the admin server), plus
calls, errors by code and latency percentiles. Growth from start to end is what a leak
looks like.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from plugproxy.fakes import SpecClient
from plugproxy.net.sockets import socket_answers

ADMIN = re.compile(r'"admin":"127\.0\.0\.1:(\d+)"')


@dataclass
class Sample:
    at_seconds: float
    rss_kib: int
    fds: int
    tasks: int
    calls: int


@dataclass
class Load:
    calls: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    lifecycles: int = 0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def http_get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return str(response.read().decode())


async def sample(pid: int, port: int, started: float, load: Load) -> Sample:
    tasks = int(await asyncio.to_thread(http_get, port, "/debug/tasks"))
    return Sample(
        round(time.monotonic() - started, 1), rss_kib(pid), fd_count(pid), tasks, load.calls
    )


async def wait_listening(sock: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not socket_answers(str(sock), 0.2):
        if proc.poll() is not None:
            raise SystemExit(f"soak: {proc.args[3]} exited with {proc.returncode} at startup")
        if time.monotonic() > deadline:
            raise SystemExit(f"soak: nothing listens on {sock} after {timeout}s")
        await asyncio.sleep(0.05)


class Worker:
    def __init__(self, client: SpecClient, load: Load, index: int, node: Any) -> None:
        self.c, self.load, self.index, self.node = client, load, index, node
        self.cap = client.new("VolumeCapability", mount={}, access_mode={"mode": 1})

    async def call(self, rpc: str, **fields: Any) -> Any:
        start = time.perf_counter()
        try:
            response = await self.c.call(rpc, timeout=30, **fields)
            code = "OK"
        except grpc.aio.AioRpcError as err:
            response, code = None, err.code().name
        self.load.latencies.append(time.perf_counter() - start)
        self.load.calls += 1
        self.load.codes[code] += 1
        return response

    async def lifecycle(self, n: int) -> None:
        cap, node = self.cap, self.node
        created = await self.call(
            "CreateVolume",
            name=f"soak-{self.index}-{n}",
            capacity_range={"required_bytes": 1 << 30},
            volume_capabilities=[cap],
            parameters={"type": "fast"},
            accessibility_requirements={"requisite": [node.accessible_topology]},
        )
        if created is None:
            return
        vol = created.volume
        vid, ctx = vol.volume_id, dict(vol.volume_context)
        # Three calls on one volume at once: serialization queues two of them.
        await asyncio.gather(
            self.call("ControllerGetVolume", volume_id=vid),
            self.call("ValidateVolumeCapabilities", volume_id=vid, volume_capabilities=[cap]),
            self.call("ControllerGetVolume", volume_id=vid),
        )
        pub = await self.call(
            "ControllerPublishVolume",
            volume_id=vid,
            node_id=node.node_id,
            volume_capability=cap,
            volume_context=ctx,
        )
        pctx = dict(pub.publish_context) if pub is not None else {}
        stage = f"/var/lib/kubelet/plugins/kubernetes.io/csi/fake/{vid}/globalmount"
        target = f"/var/lib/kubelet/pods/soak-{self.index}/volumes/kubernetes.io~csi/{vid}/mount"
        common = {"volume_id": vid, "publish_context": pctx, "volume_context": ctx}
        await self.call(
            "NodeStageVolume", staging_target_path=stage, volume_capability=cap, **common
        )
        await self.call(
            "NodePublishVolume",
            staging_target_path=stage,
            target_path=target,
            volume_capability=cap,
            **common,
        )
        await self.call("NodeGetVolumeStats", volume_id=vid, volume_path=target)
        await self.call("NodeUnpublishVolume", volume_id=vid, target_path=target)
        await self.call("NodeUnstageVolume", volume_id=vid, staging_target_path=stage)
        await self.call("ControllerUnpublishVolume", volume_id=vid, node_id=node.node_id)
        await self.call("DeleteVolume", volume_id=vid)
        await self.call("ListVolumes", max_entries=5)
        self.load.lifecycles += 1

    async def run(self, until: float, max_calls: int) -> None:
        n = 0
        while time.monotonic() < until and self.load.calls < max_calls:
            await self.lifecycle(n)
            n += 1


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_processes(
    work: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """The fake plugin and the proxy with every stage on, logging into ``work``."""
    py = [sys.executable, "-m", "plugproxy"]
    with (work / "plugin.log").open("wb") as plugin_out:
        plugin = subprocess.Popen(
            [*py, "fake-plugin", "--spec", "csi.v1", "--listen", f"unix://{work / 'plugin.sock'}"],
            stdout=plugin_out,
            stderr=subprocess.STDOUT,
        )
    with (work / "proxy.log").open("wb") as proxy_out:
        proxy = subprocess.Popen(
            [
                *py,
                "serve",
                "--listen",
                f"unix://{work / 'proxy.sock'}",
                "--upstream",
                f"unix://{work / 'plugin.sock'}",
                "--admin-listen",
                "127.0.0.1:0",
                "--validation",
                "audit",
                "--call-log",
                "all",
                "--log-payloads",
                "--serialize",
                "wait",
            ],
            stdout=proxy_out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    return plugin, proxy


async def soak(ns: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="plugproxy-soak-"))
    plugin_sock, proxy_sock, log = work / "plugin.sock", work / "proxy.sock", work / "proxy.log"
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_TRACES_SAMPLER": "traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    }
    plugin, proxy = start_processes(work, env)
    load = Load()
    samples: list[Sample] = []
    try:
        await wait_listening(plugin_sock, plugin)
        await wait_listening(proxy_sock, proxy)
        match = None
        while match is None:
            match = ADMIN.search(log.read_text(errors="replace"))
            await asyncio.sleep(0.05)
        port = int(match.group(1))
        client = SpecClient(f"unix:{proxy_sock}", "csi.v1")
        node = await client.call("NodeGetInfo")
        started = time.monotonic()
        idle = await sample(proxy.pid, port, started, load)
        print(f"idle    {idle}", flush=True)
        until = started + ns.duration
        workers = [Worker(client, load, i, node) for i in range(ns.concurrency)]
        running = asyncio.gather(*(w.run(until, ns.max_calls) for w in workers))
        warmup = min(10.0, ns.duration / 5)
        await asyncio.sleep(warmup)
        samples.append(await sample(proxy.pid, port, started, load))
        print(f"start   {samples[-1]}", flush=True)
        while not running.done():
            await asyncio.wait({running}, timeout=ns.sample_every)
            if not running.done():
                samples.append(await sample(proxy.pid, port, started, load))
                print(f"running {samples[-1]}", flush=True)
        await running
        elapsed = time.monotonic() - started
        await asyncio.sleep(1.0)  # let the last calls' bookkeeping finish
        samples.append(await sample(proxy.pid, port, started, load))
        print(f"end     {samples[-1]}", flush=True)
        await client.close()
        proxy.send_signal(signal.SIGTERM)
        exit_code = await asyncio.to_thread(proxy.wait, 30)
    finally:
        for proc in (proxy, plugin):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    first, last = samples[0], samples[-1]
    lat = load.latencies
    report = {
        "duration_seconds": round(elapsed, 1),
        "concurrency": ns.concurrency,
        "calls": load.calls,
        "lifecycles": load.lifecycles,
        "calls_per_second": round(load.calls / elapsed, 1),
        "codes": dict(load.codes),
        "latency_ms": {
            "p50": round(percentile(lat, 0.5) * 1000, 2),
            "p99": round(percentile(lat, 0.99) * 1000, 2),
            "max": round(max(lat, default=0) * 1000, 2),
            "mean": round(statistics.fmean(lat) * 1000, 2) if lat else 0,
        },
        "idle_before_load": asdict(idle),
        "start": asdict(first),
        "end": asdict(last),
        "growth": {
            "rss_kib": last.rss_kib - first.rss_kib,
            "fds": last.fds - first.fds,
            "tasks": last.tasks - first.tasks,
            "tasks_vs_idle_before_load": last.tasks - idle.tasks,
        },
        "peak": {
            "rss_kib": max(s.rss_kib for s in samples),
            "fds": max(s.fds for s in samples),
            "tasks": max(s.tasks for s in samples),
        },
        "log_bytes": log.stat().st_size,
        "proxy_exit_code": exit_code,
        "samples": [asdict(s) for s in samples],
    }
    if ns.keep:
        report["work_dir"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of load")
    parser.add_argument("--max-calls", type=int, default=2_000_000, help="stop after this many")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent lifecycles")
    parser.add_argument("--sample-every", type=float, default=15.0, help="seconds per sample")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--keep", action="store_true", help="keep the logs and sockets")
    ns = parser.parse_args(argv)
    if ns.duration <= 0 or ns.concurrency <= 0 or ns.max_calls <= 0:
        parser.error("--duration, --concurrency and --max-calls must be positive")
    report = asyncio.run(soak(ns))
    text = json.dumps(report, indent=1)
    print(text)
    if ns.json is not None:
        ns.json.write_text(text + "\n")
    failed = sum(n for code, n in report["codes"].items() if code != "OK")
    return 0 if failed == 0 and report["proxy_exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
