"""What the stateful rules cost: CPU per call and memory per volume, in-process.

    python bench/rulecost.py                    # 2,000 volume lifecycles
    python bench/rulecost.py --volumes 500 --max-volumes 100

The validate stage (audit, every rule on) judges the calls of a CSI v1 unified plugin, one
lifecycle per volume: CreateVolume (with a topology), ControllerPublishVolume,
NodeStageVolume answered ABORTED and retried, NodePublishVolume, NodeGetVolumeStats, a
repeated NodePublishVolume (an idempotent retry), CreateSnapshot twice (an idempotent
repeat), NodeUnpublishVolume, NodeUnstageVolume, ControllerUnpublishVolume, DeleteSnapshot,
DeleteVolume. Half the
volumes are left published, so the memory the rules keep grows with them; the run prints
the CPU per call against the same calls judged with every stateful family's state
discarded after each call, and the memory the stage keeps per volume it tracks. With
``--max-volumes`` below ``--volumes`` it also shows that memory stops at the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from google.protobuf import json_format

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from plugproxy.api import Call, LazyMessage, StatusCode  # noqa: E402
from plugproxy.cli import serve  # noqa: E402
from plugproxy.core.log import Logger  # noqa: E402
from plugproxy.rules.state import MAX_OBJECTS  # noqa: E402
from plugproxy.stages.validate import ValidateStage  # noqa: E402

PKG = "csi.v1"
CAPS = {
    "/csi.v1.Identity/GetPluginCapabilities": {
        "capabilities": [
            {"service": {"type": "CONTROLLER_SERVICE"}},
            {"service": {"type": "VOLUME_ACCESSIBILITY_CONSTRAINTS"}},
        ]
    },
    "/csi.v1.Controller/ControllerGetCapabilities": {
        "capabilities": [
            {"rpc": {"type": t}}
            for t in (
                "CREATE_DELETE_VOLUME",
                "PUBLISH_UNPUBLISH_VOLUME",
                "GET_VOLUME",
                "CREATE_DELETE_SNAPSHOT",
            )
        ]
    },
    "/csi.v1.Node/NodeGetCapabilities": {
        "capabilities": [{"rpc": {"type": t}} for t in ("STAGE_UNSTAGE_VOLUME", "GET_VOLUME_STATS")]
    },
}


# One call ready to judge: method path, request bytes, response bytes, the answer's code.
Prepared = tuple[str, bytes, bytes | None, StatusCode]


class Driver:
    """Builds the stage from `plugproxy serve` flags and runs calls through its hooks."""

    def __init__(self, max_volumes: int) -> None:
        settings = serve.parse_settings(
            [
                "--listen",
                "unix:///nonexistent/in.sock",
                "--upstream",
                "unix:///nonexistent/up.sock",
                "--admin-listen",
                "off",
                "--validation",
                "audit",
                "--call-log",
                "off",
                "--serialize",
                "off",
                "--disable-metrics",
                "--max-remembered-objects",
                str(max_volumes),
            ]
        )
        self.server = serve.ProxyServer(settings, logger=Logger(open(os.devnull, "w")))  # noqa: SIM115
        self.stage = next(s for s in self.server.stages if isinstance(s, ValidateStage))
        # The stage plans CSI v1 (its memory included) when it first sees one of its
        # methods, as routing a first call does.
        self.stage.wants(self.server.registry.lookup("/csi.v1.Identity/Probe"))
        self.calls = 0
        self.sink: list[Prepared] | None = None

    async def calls_of(self, volumes: int) -> list[Prepared]:
        """Every call of ``volumes`` lifecycles, encoded, so timing covers judging only."""
        self.sink = []
        for n in range(volumes):
            await self.lifecycle(n, keep=n % 2 == 0)
        out, self.sink = self.sink, None
        return out

    def message(self, path: str, kind: str, fields: dict[str, Any]) -> bytes:
        method = self.server.registry.lookup(path)
        cls = method.request_class if kind == "request" else method.response_class
        return json_format.ParseDict(fields, cls()).SerializeToString()

    async def call(
        self,
        path: str,
        request: dict[str, Any],
        response: dict[str, Any] | None = None,
        code: StatusCode = StatusCode.OK,
    ) -> None:
        prepared = self.prepare(path, request, response, code)
        if self.sink is not None:  # preparing: the run judges them later, timed
            self.sink.append(prepared)
        else:
            await self.judge(prepared)

    def prepare(
        self,
        path: str,
        request: dict[str, Any],
        response: dict[str, Any] | None = None,
        code: StatusCode = StatusCode.OK,
    ) -> Prepared:
        answer = None if response is None else self.message(path, "response", response)
        return path, self.message(path, "request", request), answer, code

    async def judge(self, prepared: Prepared) -> None:
        path, request, response, code = prepared
        method = self.server.registry.lookup(path)
        call = Call(method, (), [], 30.0, "unix:")
        call.request = LazyMessage(request, method.request_class)
        pending = self.stage.on_start(call)
        if pending is not None:
            await pending
        if response is not None and code is StatusCode.OK:
            call.response = LazyMessage(response, method.response_class)
            call.response_count = 1
            self.stage.on_response(call, call.response)
        call.code = code
        if code is not StatusCode.OK:
            call.details = "operation pending for the volume"
        self.stage.on_finish(call)
        self.calls += 1

    async def learn(self) -> None:
        for path, answer in CAPS.items():
            await self.call(path, {}, answer)
        await self.call("/csi.v1.Node/NodeGetInfo", {}, {"nodeId": "node-1"})

    async def lifecycle(self, n: int, keep: bool) -> None:
        vid = f"vol-{n:08d}"
        cap = {"mount": {}, "accessMode": {"mode": "SINGLE_NODE_WRITER"}}
        ctx = {"tier": "fast", "pool": "a"}
        await self.call(
            f"/{PKG}.Controller/CreateVolume",
            {"name": f"pvc-{n}", "volumeCapabilities": [cap]},
            {
                "volume": {
                    "volumeId": vid,
                    "capacityBytes": "1073741824",
                    "volumeContext": ctx,
                    "accessibleTopology": [{"segments": {"example.com/zone": "z1"}}],
                }
            },
        )
        pub = {"volumeId": vid, "nodeId": "node-1", "volumeCapability": cap}
        await self.call(
            f"/{PKG}.Controller/ControllerPublishVolume",
            {**pub, "volumeContext": ctx},
            {"publishContext": {"dev": "/dev/sdb"}},
        )
        stage_path = f"/var/lib/kubelet/plugins/csi/pv/{vid}/globalmount"
        target = f"/var/lib/kubelet/pods/{n}/volumes/kubernetes.io~csi/{vid}/mount"
        node = {"volumeId": vid, "volumeCapability": cap, "volumeContext": ctx}
        node["publishContext"] = {"dev": "/dev/sdb"}
        staging = {**node, "stagingTargetPath": stage_path}
        aborted = StatusCode.ABORTED
        await self.call(f"/{PKG}.Node/NodeStageVolume", staging, None, aborted)
        await self.call(f"/{PKG}.Node/NodeStageVolume", staging, {})
        publish = {**node, "stagingTargetPath": stage_path, "targetPath": target}
        await self.call(f"/{PKG}.Node/NodePublishVolume", publish, {})
        await self.call(
            f"/{PKG}.Node/NodeGetVolumeStats",
            {"volumeId": vid, "volumePath": target},
            {"usage": [{"total": "100", "unit": "BYTES"}]},
        )
        await self.call(f"/{PKG}.Node/NodePublishVolume", publish, {})
        snapshot = {"name": f"snap-{n}", "sourceVolumeId": vid}
        made = {"snapshot": {"snapshotId": f"s-{vid}", "sourceVolumeId": vid, "readyToUse": True}}
        await self.call(f"/{PKG}.Controller/CreateSnapshot", snapshot, made)
        await self.call(f"/{PKG}.Controller/CreateSnapshot", snapshot, made)
        if keep:
            return
        await self.call(
            f"/{PKG}.Node/NodeUnpublishVolume", {"volumeId": vid, "targetPath": target}, {}
        )
        await self.call(
            f"/{PKG}.Node/NodeUnstageVolume",
            {"volumeId": vid, "stagingTargetPath": stage_path},
            {},
        )
        await self.call(
            f"/{PKG}.Controller/ControllerUnpublishVolume",
            {"volumeId": vid, "nodeId": "node-1"},
            {},
        )
        await self.call(f"/{PKG}.Controller/DeleteSnapshot", {"snapshotId": f"s-{vid}"}, {})
        await self.call(f"/{PKG}.Controller/DeleteVolume", {"volumeId": vid}, {})

    def forget(self) -> None:
        """Drop what every rule family remembers, keeping the capabilities."""
        for state in {id(p.state): p.state for p in self.stage._plans.values()}.values():
            state.volumes.clear()
            state.creates.clear()
            state._parts.clear()

    def tracked(self) -> int:
        return max(len(p.state.volumes) for p in self.stage._plans.values())


async def _driver(max_volumes: int) -> Driver:
    driver = Driver(max_volumes)
    await driver.learn()
    for warm in range(50):
        await driver.lifecycle(-warm - 1, keep=False)
    driver.forget()
    gc.collect()
    return driver


async def measure(volumes: int, max_volumes: int) -> dict[str, float]:
    stateful = await _driver(max_volumes)
    prepared = await stateful.calls_of(volumes)
    start = time.process_time()
    for each in prepared:
        await stateful.judge(each)
    spent = time.process_time() - start
    # The same calls, judged with no memory carried from one call to the next.
    forgetful = await _driver(max_volumes)
    forgotten = 0.0
    for each in prepared:
        start = time.process_time()
        await forgetful.judge(each)
        forgotten += time.process_time() - start
        forgetful.forget()
    # Memory on a third run: tracemalloc slows everything, so it times nothing.
    counted = await _driver(max_volumes)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for each in prepared:
        await counted.judge(each)
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    tracked = counted.tracked()
    return {
        "calls": float(len(prepared)),
        "us_per_call": spent / len(prepared) * 1e6,
        "us_per_call_without_memory": forgotten / len(prepared) * 1e6,
        "volumes_tracked": float(tracked),
        "bytes_kept": float(kept),
        "bytes_per_tracked_volume": kept / tracked if tracked else 0.0,
    }


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench/rulecost.py", description=__doc__.split("\n")[0])
    p.add_argument("--volumes", type=int, default=2000)
    p.add_argument("--max-volumes", type=int, default=MAX_OBJECTS)
    ns = p.parse_args(argv)
    r = await measure(ns.volumes, ns.max_volumes)
    print(f"{ns.volumes} volume lifecycles, {int(r['calls'])} calls judged (audit, every rule)")
    print(f"CPU per call, stateful rules remembering: {r['us_per_call']:8.1f} µs")
    print(f"CPU per call, memory dropped each call:   {r['us_per_call_without_memory']:8.1f} µs")
    print(
        f"volumes tracked: {int(r['volumes_tracked'])} (bound {ns.max_volumes});"
        f" memory kept: {r['bytes_kept'] / 1024:.0f} KiB,"
        f" {r['bytes_per_tracked_volume']:.0f} bytes per tracked volume"
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
