"""`plugproxy demo`: a fake CSI plugin, the proxy in front of it, and a full volume lifecycle.

Everything runs on temporary UNIX sockets with real gRPC; nothing is left behind.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any, TextIO

import grpc
from google.protobuf import json_format

from plugproxy import serve
from plugproxy.fakes import start_fake_plugin
from plugproxy.log import Logger
from plugproxy.registry import Registry

GIB = 1 << 30

# (method path, request as JSON) in lifecycle order; "{volume_id}" and "{snapshot_id}" are
# filled from earlier responses.
LIFECYCLE: list[tuple[str, dict[str, Any]]] = [
    ("/csi.v1.Identity/GetPluginInfo", {}),
    ("/csi.v1.Identity/GetPluginCapabilities", {}),
    ("/csi.v1.Identity/Probe", {}),
    ("/csi.v1.Controller/ControllerGetCapabilities", {}),
    ("/csi.v1.Node/NodeGetCapabilities", {}),
    ("/csi.v1.Node/NodeGetInfo", {}),
    (
        "/csi.v1.Controller/CreateVolume",
        {
            "name": "pvc-demo-0001",
            "capacity_range": {"required_bytes": str(GIB)},
            "volume_capabilities": [
                {"mount": {"fs_type": "ext4"}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
            ],
            "secrets": {"password": "demo-secret-value"},
        },
    ),
    (
        "/csi.v1.Controller/ControllerPublishVolume",
        {
            "volume_id": "{volume_id}",
            "node_id": "{node_id}",
            "volume_capability": {
                "mount": {"fs_type": "ext4"},
                "access_mode": {"mode": "SINGLE_NODE_WRITER"},
            },
        },
    ),
    (
        "/csi.v1.Node/NodeStageVolume",
        {
            "volume_id": "{volume_id}",
            "staging_target_path": "{tmp}/staging/pvc-demo-0001",
            "volume_capability": {
                "mount": {"fs_type": "ext4"},
                "access_mode": {"mode": "SINGLE_NODE_WRITER"},
            },
        },
    ),
    (
        "/csi.v1.Node/NodePublishVolume",
        {
            "volume_id": "{volume_id}",
            "staging_target_path": "{tmp}/staging/pvc-demo-0001",
            "target_path": "{tmp}/pods/7f3c/volumes/kubernetes.io~csi/pvc-demo-0001/mount",
            "volume_capability": {
                "mount": {"fs_type": "ext4"},
                "access_mode": {"mode": "SINGLE_NODE_WRITER"},
            },
        },
    ),
    (
        "/csi.v1.Node/NodeGetVolumeStats",
        {
            "volume_id": "{volume_id}",
            "volume_path": "{tmp}/pods/7f3c/volumes/kubernetes.io~csi/pvc-demo-0001/mount",
        },
    ),
    (
        "/csi.v1.Node/NodeUnpublishVolume",
        {
            "volume_id": "{volume_id}",
            "target_path": "{tmp}/pods/7f3c/volumes/kubernetes.io~csi/pvc-demo-0001/mount",
        },
    ),
    (
        "/csi.v1.Node/NodeUnstageVolume",
        {"volume_id": "{volume_id}", "staging_target_path": "{tmp}/staging/pvc-demo-0001"},
    ),
    (
        "/csi.v1.Controller/ControllerUnpublishVolume",
        {"volume_id": "{volume_id}", "node_id": "{node_id}"},
    ),
    (
        "/csi.v1.Controller/CreateSnapshot",
        {"source_volume_id": "{volume_id}", "name": "snap-demo-0001"},
    ),
    ("/csi.v1.Controller/ListSnapshots", {"source_volume_id": "{volume_id}"}),
    ("/csi.v1.Controller/DeleteSnapshot", {"snapshot_id": "{snapshot_id}"}),
    ("/csi.v1.Controller/DeleteVolume", {"volume_id": "{volume_id}"}),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--proxy-log",
        choices=("stderr", "off"),
        default="stderr",
        help="where the proxy's own log lines go while the demo runs",
    )


def _fill(value: Any, known: dict[str, str]) -> Any:
    if isinstance(value, str):
        for key, replacement in known.items():
            value = value.replace("{" + key + "}", replacement)
        return value
    if isinstance(value, dict):
        return {k: _fill(v, known) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, known) for v in value]
    return value


def _summary(path: str, response: Any) -> str:
    fields = json_format.MessageToDict(response, preserving_proto_field_name=True)
    if path.endswith("CreateVolume"):
        vol = fields.get("volume", {})
        return f"volume_id={vol.get('volume_id')} capacity={vol.get('capacity_bytes')}"
    if path.endswith("CreateSnapshot"):
        return f"snapshot_id={fields.get('snapshot', {}).get('snapshot_id')}"
    if path.endswith("GetPluginInfo"):
        return f"name={fields.get('name')} version={fields.get('vendor_version')}"
    if path.endswith("NodeGetInfo"):
        return f"node_id={fields.get('node_id')}"
    if path.endswith("ListSnapshots"):
        return f"{len(fields.get('entries', []))} snapshot(s)"
    if path.endswith("Capabilities"):
        return f"{len(fields.get('capabilities', []))} capabilities"
    return ""


def _learn(path: str, response: Any, known: dict[str, str]) -> None:
    if path.endswith("/CreateVolume"):
        known["volume_id"] = response.volume.volume_id
    elif path.endswith("/CreateSnapshot"):
        known["snapshot_id"] = response.snapshot.snapshot_id
    elif path.endswith("/NodeGetInfo"):
        known["node_id"] = response.node_id


async def drive_lifecycle(target: str, tmp: str, out: TextIO) -> int:
    """Run the lifecycle against ``target`` with a real gRPC client; returns failures."""
    registry = Registry(["csi.v1"])
    known = {"tmp": tmp}
    failures = 0
    async with grpc.aio.insecure_channel(target) as ch:
        for path, body in LIFECYCLE:
            info = registry.lookup(path)
            assert info.request_class is not None and info.response_class is not None
            request = json_format.ParseDict(_fill(body, known), info.request_class())
            stub = ch.unary_unary(
                path,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=info.response_class.FromString,
            )
            start = time.perf_counter()
            try:
                response = await stub(request, timeout=10)
                code, note = "OK", _summary(path, response)
                _learn(path, response, known)
            except grpc.aio.AioRpcError as err:
                failures += 1
                code, note = err.code().name, err.details() or ""
            ms = (time.perf_counter() - start) * 1000
            out.write(f"  {path:48} {code:18} {ms:7.1f} ms  {note}\n")
    return failures


async def run(ns: argparse.Namespace) -> int:
    out = sys.stdout
    with tempfile.TemporaryDirectory(prefix="plugproxy-demo-") as tmp:
        plugin_sock, proxy_sock = f"{tmp}/plugin.sock", f"{tmp}/csi.sock"
        fake = await start_fake_plugin("csi.v1", f"unix://{plugin_sock}")
        proxy_ns = serve.parse_args(
            ["--listen", f"unix://{proxy_sock}", "--upstream", f"unix://{plugin_sock}"]
            + ["--admin-listen", "off"],
            environ={},
        )
        log_stream = sys.stderr if ns.proxy_log == "stderr" else open("/dev/null", "w")  # noqa: SIM115
        proxy = serve.ProxyServer(proxy_ns, logger=Logger(log_stream, fmt="text"))
        await proxy.start()
        await proxy.upstream.wait_ready(5)
        out.write("plugproxy demo: CO -> plugproxy -> fake CSI plugin\n")
        out.write(f"  CO socket     unix://{proxy_sock}\n  plugin socket unix://{plugin_sock}\n\n")
        out.write("Volume lifecycle through the proxy:\n")
        try:
            failures = await drive_lifecycle(f"unix:{proxy_sock}", tmp, out)
        finally:
            await proxy.stop(1)
            await fake.stop(0)
            if log_stream is not sys.stderr:
                log_stream.close()
        out.write(f"\n{len(LIFECYCLE) - failures}/{len(LIFECYCLE)} calls succeeded through the proxy\n")
        return 0 if failures == 0 else 1
