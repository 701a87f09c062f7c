"""Soak of one device plugin ListAndWatch stream held open through plugproxy.

    python bench/listandwatch_soak.py                 # 3 minutes
    python bench/listandwatch_soak.py --duration 600 --json listandwatch.json
    python bench/listandwatch_soak.py --duration 5    # a quick check of the script itself

The fake device plugin (``plugproxy fake-plugin --spec device-plugin``) sends a new device
list every --period seconds (1 ms by default, far more often than a real plugin); the proxy
(``python -m plugproxy serve``) runs with validation, the call log and metrics on and with
connection ageing set short (--max-connection-age 1s, grace 1s), which must not touch a
stream on a UNIX socket. One client reads the stream for --duration seconds.

Reported: updates received, the longest gap between two updates, whether the stream was
still open at the end (it must be), the proxy's resident memory and open descriptors per
sample, and the proxy's own count of the stream's messages once it ended.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from plugproxy.net.sockets import socket_answers
from plugproxy.spec.registry import Registry

ADMIN = re.compile(r'"admin":"127\.0\.0\.1:(\d+)"')
PATH = "/v1beta1.DevicePlugin/ListAndWatch"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def http_get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return str(response.read().decode())


async def wait_listening(sock: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not socket_answers(str(sock), 0.2):
        if proc.poll() is not None:
            raise SystemExit(f"listandwatch soak: a process exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"listandwatch soak: nothing listens on {sock} after {timeout}s")
        await asyncio.sleep(0.05)


def start(work: Path, period: float) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    py = [sys.executable, "-m", "plugproxy"]
    with (work / "plugin.log").open("wb") as out:
        plugin = subprocess.Popen(
            [
                *py,
                *("fake-plugin", "--spec", "device-plugin"),
                *("--listen", f"unix://{work / 'plugin.sock'}", "--stream-period", str(period)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    with (work / "proxy.log").open("wb") as out:
        proxy = subprocess.Popen(
            [
                *py,
                "serve",
                *("--listen", f"unix://{work / 'proxy.sock'}"),
                *("--upstream", f"unix://{work / 'plugin.sock'}"),
                *("--spec", "device-plugin", "--admin-listen", "127.0.0.1:0"),
                *("--validation", "audit", "--call-log", "all"),
                *("--max-connection-age", "1s", "--max-connection-age-grace", "1s"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return plugin, proxy


async def soak(ns: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="plugproxy-listandwatch-"))
    plugin, proxy = start(work, ns.period)
    info = Registry(["deviceplugin.v1beta1"]).lookup(PATH)
    assert info.request_class is not None and info.response_class is not None
    samples: list[dict[str, Any]] = []
    updates, longest_gap, state = 0, 0.0, "OK"
    try:
        await wait_listening(work / "plugin.sock", plugin)
        await wait_listening(work / "proxy.sock", proxy)
        match = None
        while match is None:
            match = ADMIN.search((work / "proxy.log").read_text(errors="replace"))
            await asyncio.sleep(0.05)
        port = int(match.group(1))
        samples.append({"at_seconds": 0.0, "rss_kib": rss_kib(proxy.pid), "updates": 0})
        async with grpc.aio.insecure_channel(f"unix:{work / 'proxy.sock'}") as ch:
            call = ch.unary_stream(
                PATH,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=info.response_class.FromString,
            )(info.request_class())
            started = last = time.monotonic()
            next_sample = started + ns.sample_every
            try:
                async for _ in call:
                    now = time.monotonic()
                    updates += 1
                    longest_gap = max(longest_gap, now - last)
                    last = now
                    if now >= next_sample:
                        samples.append(
                            {
                                "at_seconds": round(now - started, 1),
                                "rss_kib": rss_kib(proxy.pid),
                                "fds": len(os.listdir(f"/proc/{proxy.pid}/fd")),
                                "updates": updates,
                            }
                        )
                        next_sample += ns.sample_every
                    if now - started >= ns.duration:
                        call.cancel()
                        break
            except grpc.aio.AioRpcError as err:
                state = err.code().name
            held = time.monotonic() - started
        counted = ""
        for _ in range(100):
            metrics = await asyncio.to_thread(http_get, port, "/metrics")
            counted = next(
                (
                    line.rsplit(" ", 1)[1]
                    for line in metrics.splitlines()
                    if line.startswith("plugproxy_rpc_stream_messages_total{") and PATH in line
                ),
                "",
            )
            if counted:
                break
            await asyncio.sleep(0.05)
    finally:
        for proc in (proxy, plugin):
            proc.terminate()
            proc.wait(30)
        if not ns.keep:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "duration_seconds": round(held, 1),
        "period_seconds": ns.period,
        "updates": updates,
        "updates_per_second": round(updates / held, 1) if held else 0,
        "longest_gap_ms": round(longest_gap * 1000, 1),
        "stream_state_at_end": state,
        "proxy_counted_messages": float(counted) if counted else None,
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=180.0, help="seconds to hold the stream")
    parser.add_argument("--period", type=float, default=0.001, help="seconds between updates")
    parser.add_argument("--sample-every", type=float, default=15.0, help="seconds per sample")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--keep", action="store_true", help="keep the logs and sockets")
    ns = parser.parse_args(argv)
    report = asyncio.run(soak(ns))
    text = json.dumps(report, indent=2)
    print(text)
    if ns.json:
        ns.json.write_text(text + "\n")
    return 0 if report["stream_state_at_end"] == "OK" else 1


if __name__ == "__main__":
    sys.exit(main())
