"""Soak of a DRA kubelet plugin through plugproxy: one DRA device health stream held open,
with claims prepared and unprepared beside it, counted on both sides of the proxy.

    python bench/dra_health_soak.py                  # 3 minutes
    python bench/dra_health_soak.py --duration 600 --json dra.json
    python bench/dra_health_soak.py --duration 5     # a quick check of the script itself

The fake DRA plugin (plugproxy's, in this process, so its own counts can be read) serves
DRAPlugin v1 and v1beta1 and DRA health v1 and v1alpha1 on one socket and sends a health
update every --period seconds (1 ms by default, far more often than a real driver). The
proxy (``python -m plugproxy serve --spec auto``) runs with validation, the call log and
metrics on and connection ageing set short, which must not touch a stream on a UNIX socket.
One client reads the v1 stream for --duration seconds while another prepares and
unprepares a fresh claim every --claim-every seconds (one in ten in v1beta1).

Every update carries one planted breach (the fake's ``drahealth-value-unknown``), so the
proxy's count of ``drahealth.health-value`` violations is its count of updates judged;
``--clean`` leaves it out. At the end the plugin ends the stream itself, so nothing is in
flight: the updates the plugin sent, the client read, the proxy relayed and the proxy
judged must all be equal, and so must the claim calls on each side.

Reported: those counts, the longest gap between two updates, the proxy's resident memory
and open descriptors per sample (before the first call, then every --sample-every
seconds), and whether the stream ended as it should (OK, by the plugin).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from listandwatch_soak import ADMIN, http_get, rss_kib, wait_listening

from plugproxy.fakes import FakeKnobs, SpecClient, start_fake_plugin
from plugproxy.fakes.dra import FakeDraV1

WATCH = "/v1.DRAResourceHealth/NodeWatchResources"
DRA = "/k8s.io.kubelet.pkg.apis.dra"
RULE = "drahealth.health-value"


def start_proxy(work: Path) -> subprocess.Popen[bytes]:
    with (work / "proxy.log").open("wb") as out:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "plugproxy", "serve"),
                *("--listen", f"unix://{work / 'proxy.sock'}"),
                *("--upstream", f"unix://{work / 'plugin.sock'}"),
                *("--spec", "auto", "--admin-listen", "127.0.0.1:0"),
                *("--validation", "audit", "--call-log", "all"),
                *("--max-connection-age", "1s", "--max-connection-age-grace", "1s"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def metric(text: str, name: str, *parts: str) -> float:
    """The sum of ``name``'s samples whose labels hold every one of ``parts``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(p in line for p in parts):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Claims:
    """Prepares and unprepares a fresh claim every ``every`` seconds until stopped."""

    def __init__(self, target: str, every: float) -> None:
        self.clients = {v: SpecClient(target, f"dra.{v}") for v in ("v1", "v1beta1")}
        self.every = every
        self.calls = {"v1": 0, "v1beta1": 0}  # prepare + unprepare answered OK, by version
        self.failed = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            version = "v1beta1" if n % 10 == 9 else "v1"
            claim = {"namespace": "soak", "uid": f"soak-{n:08d}", "name": f"claim-{n}"}
            client = self.clients[version]
            try:
                await client.call("NodePrepareResources", claims=[claim])
                await client.call("NodeUnprepareResources", claims=[claim])
                self.calls[version] += 2
            except grpc.aio.AioRpcError:
                self.failed += 1
            n += 1
            await asyncio.sleep(self.every)

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()


async def soak(ns: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="plugproxy-dra-soak-"))
    knobs = FakeKnobs(
        stream_period=ns.period, misbehave=set() if ns.clean else {"drahealth-value-unknown"}
    )
    fake = await start_fake_plugin("dra.v1", f"unix://{work / 'plugin.sock'}", knobs)
    plugin = fake.plugin
    assert isinstance(plugin, FakeDraV1)
    proxy = start_proxy(work)
    samples: list[dict[str, Any]] = []
    updates, longest_gap, state, held = 0, 0.0, "UNKNOWN", 0.0
    claims: Claims | None = None
    try:
        await wait_listening(work / "proxy.sock", proxy)
        match = None
        while match is None:
            match = ADMIN.search((work / "proxy.log").read_text(errors="replace"))
            await asyncio.sleep(0.05)
        port = int(match.group(1))

        def sample(at: float) -> None:
            samples.append(
                {
                    "at_seconds": round(at, 1),
                    "rss_kib": rss_kib(proxy.pid),
                    "fds": len(os.listdir(f"/proc/{proxy.pid}/fd")),
                    "updates": updates,
                    "claim_calls": sum(claims.calls.values()) if claims else 0,
                }
            )

        sample(0.0)
        target = f"unix://{work / 'proxy.sock'}"
        claims = Claims(target, ns.claim_every)
        claimer = asyncio.ensure_future(claims.run())
        async with SpecClient(target, "drahealth.v1") as health:
            info = health.method("NodeWatchResources")
            assert info.response_class is not None
            call = health.channel.unary_stream(
                info.path,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=info.response_class.FromString,
            )(health.new("NodeWatchResourcesRequest"))
            started = last = time.monotonic()
            next_sample = started + ns.sample_every
            ending = False
            try:
                async for _ in call:
                    now = time.monotonic()
                    updates += 1
                    longest_gap = max(longest_gap, now - last)
                    last = now
                    if now >= next_sample:
                        sample(now - started)
                        next_sample += ns.sample_every
                    if not ending and now - started >= ns.duration:
                        # The plugin ends it: every update it sent then reaches the client.
                        claims.stop.set()
                        await claimer
                        plugin.end_streams()
                        ending = True
                state = (await call.code()).name
            except grpc.aio.AioRpcError as err:
                state = err.code().name
            held = time.monotonic() - started
        claims.stop.set()
        await claimer
        sample(held)
        want = float(updates)
        text, report = "", {}
        for _ in range(200):  # until the proxy has counted what the client read
            text = await asyncio.to_thread(http_get, port, "/metrics")
            report = json.loads(await asyncio.to_thread(http_get, port, "/violations"))
            relayed = metric(text, "plugproxy_rpc_stream_messages_total", f'method="{WATCH}"')
            if relayed >= want:
                break
            await asyncio.sleep(0.05)
    finally:
        if claims is not None:
            await claims.close()
        proxy.terminate()
        proxy.wait(30)
        await fake.stop(0)
        if not ns.keep:
            shutil.rmtree(work, ignore_errors=True)
    assert claims is not None
    proxy_calls = {
        v: metric(text, "plugproxy_rpc_duration_seconds_count", f'method="{DRA}.{v}.', 'code="OK"')
        for v in ("v1", "v1beta1")
    }
    return {
        "duration_seconds": round(held, 1),
        "period_seconds": ns.period,
        "stream_state_at_end": state,
        "updates": {
            "plugin_sent": plugin.updates_sent,
            "client_received": updates,
            "proxy_relayed": metric(
                text, "plugproxy_rpc_stream_messages_total", f'method="{WATCH}"'
            ),
            "proxy_judged": None
            if ns.clean
            else metric(text, "plugproxy_violations_total", f'rule="{RULE}"', f'method="{WATCH}"'),
            "per_second": round(updates / held, 1) if held else 0,
        },
        "longest_gap_ms": round(longest_gap * 1000, 1),
        "claim_calls": {
            "client_ok": claims.calls,
            "client_failed": claims.failed,
            "plugin_seen": {
                v: sum(1 for r in plugin.calls if r.path.startswith(f"{DRA}.{v}."))
                for v in ("v1", "v1beta1")
            },
            "proxy_counted": proxy_calls,
        },
        "violations": {v["rule"]: v["count"] for v in report.get("violations", [])},
        "calls_judged_by_spec": report.get("calls_judged_by_spec", {}),
        "rss_kib_start": samples[0]["rss_kib"],
        "rss_kib_end": samples[-1]["rss_kib"],
        "samples": samples,
    }


def counts_agree(report: dict[str, Any]) -> bool:
    u, c = report["updates"], report["claim_calls"]
    judged = u["proxy_judged"] is None or u["proxy_judged"] == u["client_received"]
    same_updates = u["plugin_sent"] == u["client_received"] == u["proxy_relayed"]
    same_calls = all(
        c["client_ok"][v] == c["plugin_seen"][v] == c["proxy_counted"][v] for v in ("v1", "v1beta1")
    )
    return judged and same_updates and same_calls and c["client_failed"] == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=180.0, help="seconds to hold the stream")
    parser.add_argument("--period", type=float, default=0.001, help="seconds between updates")
    parser.add_argument(
        "--claim-every", type=float, default=0.05, help="seconds between claims prepared"
    )
    parser.add_argument("--sample-every", type=float, default=15.0, help="seconds per sample")
    parser.add_argument("--clean", action="store_true", help="no planted breach in the updates")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--keep", action="store_true", help="keep the logs and sockets")
    ns = parser.parse_args(argv)
    report = asyncio.run(soak(ns))
    text = json.dumps(report, indent=2)
    print(text)
    if ns.json:
        ns.json.write_text(text + "\n")
    return 0 if report["stream_state_at_end"] == "OK" and counts_agree(report) else 1


if __name__ == "__main__":
    sys.exit(main())
