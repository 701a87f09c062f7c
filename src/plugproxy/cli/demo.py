"""`plugproxy demo`: a fake CSI plugin, the proxy in front of it, and a full volume lifecycle
(``--spec kms.v2``, ``--spec device-plugin`` and ``--spec dra``: :mod:`plugproxy.cli.demo_k8s`;
``--spec cosi.v1alpha2``, a COSI v0.2 bucket lifecycle: :mod:`plugproxy.cli.demo_cosi`).

Everything runs on temporary UNIX sockets with real gRPC; nothing is left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import urllib.request
from typing import Any, TextIO

import grpc
from google.protobuf import json_format

from plugproxy.cli import demo_cosi, demo_k8s, report
from plugproxy.cli.tee import start_demo_proxy
from plugproxy.core.endpoints import ConfigError
from plugproxy.fakes import start_fake_plugin
from plugproxy.spec.registry import SPEC_ALIASES, Registry

GIB = 1 << 30
SECRET = "demo-secret-value-7f3c"  # must never reach the proxy's log

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
            "secrets": {"password": SECRET},
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


# The call `--trace` makes: a volume, so the proxy's span carries its resource key.
TRACED_CALL: tuple[str, dict[str, Any]] = (
    "/csi.v1.Controller/CreateVolume",
    {
        "name": "pvc-demo-traced",
        "volume_capabilities": [
            {"mount": {"fs_type": "ext4"}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
        ],
    },
)
DEMO_SPECS = (
    "csi.v1",
    "cosi.v1alpha2",
    "kms.v2",
    "deviceplugin.v1beta1",
    "dra.v1",
    "drahealth.v1",
)

# Printed at the end of the CSI demo, which leaves nothing running: the same stack to keep
# and call by hand (README.md, "Sending a call", shows the same commands).
TRY_IT_SERVERS = (
    "plugproxy fake-plugin --spec csi.v1 --listen unix:///tmp/plugin.sock &",
    "plugproxy serve --listen unix:///tmp/csi.sock --upstream unix:///tmp/plugin.sock &",
)
TRY_IT_CALLS = (
    "plugproxy call --endpoint unix:///tmp/csi.sock --spec csi.v1 GetPluginInfo",
    "plugproxy call --endpoint unix:///tmp/csi.sock csi.v1.Controller/CreateVolume"
    """ '{"name": "pvc-1", "volume_capabilities": [{"mount": {},"""
    """ "access_mode": {"mode": "SINGLE_NODE_WRITER"}}]}'""",
    "plugproxy call --list --spec csi.v1",
)


def show_try_it(out: TextIO) -> None:
    out.write(
        "\nTry it yourself, with plugproxy on the PATH (in the clone: . .venv/bin/activate):"
        "\nstart a fake plugin and the proxy in the background,\n"
    )
    out.writelines(f"  {line}\n" for line in TRY_IT_SERVERS)
    out.write("then send calls through the proxy (plugproxy call --help shows more):\n")
    out.writelines(f"  {line}\n" for line in TRY_IT_CALLS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spec",
        dest="demo_spec",
        default="csi.v1",
        choices=(*DEMO_SPECS, "kms", "device-plugin", "dra", "dra-health"),
        help="which plugin API to demonstrate (default csi.v1: a volume lifecycle)",
    )
    parser.add_argument(
        "--proxy-log",
        choices=("excerpt", "stderr"),
        default="excerpt",
        help="show an excerpt of the proxy's log (default) or all of it on stderr",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="also trace one call with OpenTelemetry through CO, proxy and plugin, and print"
        " the trace as a tree",
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


async def _call(ch: grpc.aio.Channel, path: str, body: dict[str, Any]) -> str:
    info = Registry(["csi.v1"]).lookup(path)
    assert info.request_class is not None
    request = json_format.ParseDict(body, info.request_class(), ignore_unknown_fields=False)
    try:
        await ch.unary_unary(path)(request.SerializeToString(), timeout=10)
    except grpc.aio.AioRpcError as err:
        return f"{err.code().name}: {err.details()}"
    return "OK"


async def show_violations(target: str, fake: Any, admin: str, out: TextIO) -> None:
    """One request that breaks the spec, one plugin answer that does; then the report."""
    capability = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
    async with grpc.aio.insecure_channel(target) as ch:
        outcome = await _call(ch, "/csi.v1.Controller/CreateVolume", {"name": "pvc-\u0007bell"})
        # In audit mode the proxy lets the call through: the answer is the plugin's own.
        out.write(
            "  CO sends CreateVolume with a control character and no capabilities:"
            f" the proxy lets it through, the fake plugin answers {outcome}\n"
        )
        fake.plugin.knobs.misbehave.add("create-volume-capacity-out-of-range")
        outcome = await _call(
            ch,
            "/csi.v1.Controller/CreateVolume",
            {
                "name": "pvc-demo-0002",
                "capacity_range": {"required_bytes": str(GIB), "limit_bytes": str(2 * GIB)},
                "volume_capabilities": [capability],
            },
        )
        fake.plugin.knobs.misbehave.clear()
        out.write(
            "  the fake plugin answers CreateVolume with a capacity outside the range: the"
            f" proxy passes the answer on, the CO gets {outcome}\n\n"
        )
    report.render(report.fetch(admin), out)


def show_metrics(admin: str, out: TextIO) -> None:
    with urllib.request.urlopen(f"{admin}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    wanted = (
        'plugproxy_rpc_duration_seconds_count{code="OK",method="/csi.v1.Controller/CreateVolume"',
        "csi_sidecar_operations_seconds_count{",
        "plugproxy_violations_total{",
        "plugproxy_upstream_up ",
    )
    shown = 0
    for line in text.splitlines():
        if line.startswith(wanted) and shown < 8:
            out.write(f"  {line}\n")
            shown += 1


def show_log_excerpt(log: str, out: TextIO) -> None:
    for line in log.splitlines():
        if "/CreateVolume" in line and "pvc-demo-0001" in line and "request=" in line:
            out.write(f"  {line[:600]}{'…' if len(line) > 600 else ''}\n")
            break
    leaked = SECRET in log
    out.write(
        f"\n  the CreateVolume secret appears in the proxy's log: {'YES' if leaked else 'no'}\n"
    )


async def run(ns: argparse.Namespace) -> int:
    chosen = getattr(ns, "demo_spec", "csi.v1")
    spec = SPEC_ALIASES.get(chosen, chosen)
    if spec != "csi.v1" and getattr(ns, "trace", False):
        raise ConfigError("demo --trace traces the CSI demo; leave out --spec or --trace")
    if spec == "cosi.v1alpha2":
        return await demo_cosi.run(ns)
    if spec != "csi.v1":
        return await demo_k8s.run(spec, ns)
    out = sys.stdout
    with tempfile.TemporaryDirectory(prefix="plugproxy-demo-") as tmp:
        plugin_sock, proxy_sock = f"{tmp}/plugin.sock", f"{tmp}/csi.sock"
        traced = await _start_tracing() if ns.trace else None
        provider = traced.plugin_provider if traced is not None else None
        fake = await start_fake_plugin("csi.v1", f"unix://{plugin_sock}", tracer_provider=provider)
        proxy, log, admin = await start_demo_proxy(
            plugin_sock,
            proxy_sock,
            echo=ns.proxy_log == "stderr",
            environment=traced.proxy_environment if traced is not None else contextlib.nullcontext,
        )
        target = f"unix:{proxy_sock}"
        out.write("plugproxy demo: CO -> plugproxy -> fake CSI plugin\n")
        out.write(f"  CO socket     unix://{proxy_sock}\n  plugin socket unix://{plugin_sock}\n")
        out.write(f"  admin         {admin}  (/metrics /healthz /readyz /violations)\n\n")
        out.write("1. Volume lifecycle through the proxy:\n")
        trace_whole = True
        try:
            failures = await drive_lifecycle(target, tmp, out)
            out.write(f"\n  {len(LIFECYCLE) - failures}/{len(LIFECYCLE)} calls succeeded\n\n")
            out.write("2. Violations caught (audit mode: calls pass, breaches are reported):\n")
            await show_violations(target, fake, admin, out)
            out.write("\n3. Metrics scraped from /metrics (excerpt):\n")
            show_metrics(admin, out)
            out.write("\n4. The call log, secrets redacted (CreateVolume with payloads):\n")
            show_log_excerpt(log.getvalue(), out)
            if traced is not None:
                out.write("\n5. One call traced end to end (OpenTelemetry):\n")
                trace_whole = await traced.show(target, "csi.v1", *TRACED_CALL, proxy.stages, out)
        finally:
            await proxy.stop(1)
            await fake.stop(0)
            if traced is not None:
                await traced.stop()
        ok = failures == 0 and trace_whole and SECRET not in log.getvalue()
        if ok:
            show_try_it(out)
        return 0 if ok else 1


async def _start_tracing() -> Any:
    # Imported here: the SDK, the exporter and the instrumentation load only for --trace.
    from plugproxy.cli.demo_trace import TracedDemo  # noqa: PLC0415

    return await TracedDemo.start("csi.v1")
