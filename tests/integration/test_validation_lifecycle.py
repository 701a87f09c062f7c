"""Full, spec-correct lifecycles through the proxy against the fake plugins: no violations
in audit mode, and enforce mode lets every call of them through."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from plugproxy.cli.serve import ProxyServer
from plugproxy.fakes import FakeKnobs, SpecClient, start_fake_plugin
from plugproxy.stages.validate import ValidateStage
from tests.support import start_proxy

# A kubelet-style target path over the general 128-byte limit (CSI v1.12 overrides it).
LONG_TARGET = "/var/lib/kubelet/pods/0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0/volumes/" + (
    "kubernetes.io~csi/pvc-0123456789abcdef0123456789abcdef-0123456789/mount"
)
assert len(LONG_TARGET) > 128


def stage_of(proxy: ProxyServer) -> ValidateStage:
    return next(s for s in proxy.stages if isinstance(s, ValidateStage))


@asynccontextmanager
async def through_proxy(
    spec: str, tmp_path: Any, *args: str, knobs: FakeKnobs | None = None
) -> AsyncIterator[tuple[SpecClient, ProxyServer]]:
    plugin_sock = os.path.join(tmp_path, "plugin.sock")
    proxy_sock = os.path.join(tmp_path, "proxy.sock")
    handle = await start_fake_plugin(spec, f"unix://{plugin_sock}", knobs)
    proxy = await start_proxy(proxy_sock, plugin_sock, *args)
    client = SpecClient(f"unix://{proxy_sock}", spec)
    try:
        yield client, proxy
    finally:
        await client.close()
        await proxy.stop(0)
        await handle.stop(0)


def mount_cap(c: SpecClient) -> Any:
    return c.new("VolumeCapability", mount={}, access_mode={"mode": "SINGLE_NODE_WRITER"})


async def csi_v1_lifecycle(c: SpecClient) -> None:
    await c.call("GetPluginInfo")
    await c.call("GetPluginCapabilities")
    await c.call("Probe")
    await c.call("ControllerGetCapabilities")
    await c.call("NodeGetCapabilities")
    await c.call("GroupControllerGetCapabilities")
    info = await c.call("NodeGetInfo")
    cap = mount_cap(c)
    vol = (
        await c.call(
            "CreateVolume",
            name="pvc-1",
            capacity_range={"required_bytes": 1 << 30},
            volume_capabilities=[cap],
            parameters={"type": "fast"},
            accessibility_requirements={"requisite": [info.accessible_topology]},
        )
    ).volume
    # a retry with the same arguments is idempotent
    again = await c.call(
        "CreateVolume",
        name="pvc-1",
        capacity_range={"required_bytes": 1 << 30},
        volume_capabilities=[cap],
        parameters={"type": "fast"},
        accessibility_requirements={"requisite": [info.accessible_topology]},
    )
    assert again.volume.volume_id == vol.volume_id
    vid = vol.volume_id
    await c.call("ValidateVolumeCapabilities", volume_id=vid, volume_capabilities=[cap])
    await c.call("ListVolumes", max_entries=1)
    await c.call("GetCapacity", volume_capabilities=[cap])
    await c.call("ControllerGetVolume", volume_id=vid)
    pub = await c.call(
        "ControllerPublishVolume",
        volume_id=vid,
        node_id=info.node_id,
        volume_capability=cap,
        volume_context=dict(vol.volume_context),
    )
    stage = "/var/lib/kubelet/plugins/kubernetes.io/csi/fake/globalmount"
    await c.call(
        "NodeStageVolume",
        volume_id=vid,
        staging_target_path=stage,
        volume_capability=cap,
        publish_context=dict(pub.publish_context),
        volume_context=dict(vol.volume_context),
    )
    await c.call(
        "NodePublishVolume",
        volume_id=vid,
        staging_target_path=stage,
        target_path=LONG_TARGET,
        volume_capability=cap,
        publish_context=dict(pub.publish_context),
        volume_context=dict(vol.volume_context),
    )
    await c.call("NodeGetVolumeStats", volume_id=vid, volume_path=LONG_TARGET)
    await c.call("NodeUnpublishVolume", volume_id=vid, target_path=LONG_TARGET)
    await c.call("NodeUnstageVolume", volume_id=vid, staging_target_path=stage)
    await c.call("ControllerUnpublishVolume", volume_id=vid, node_id=info.node_id)
    snap = (await c.call("CreateSnapshot", name="snap-1", source_volume_id=vid)).snapshot
    await c.call("ListSnapshots", max_entries=1)
    await c.call("GetSnapshot", snapshot_id=snap.snapshot_id)
    clone = (
        await c.call(
            "CreateVolume",
            name="pvc-2",
            volume_capabilities=[cap],
            volume_content_source={"snapshot": {"snapshot_id": snap.snapshot_id}},
            accessibility_requirements={"requisite": [info.accessible_topology]},
        )
    ).volume
    await c.stream("GetMetadataAllocated", snapshot_id=snap.snapshot_id, max_results=4)
    await c.call("DeleteVolume", volume_id=clone.volume_id)
    await c.call("DeleteSnapshot", snapshot_id=snap.snapshot_id)
    await c.call("DeleteVolume", volume_id=vid)


async def csi_v0_lifecycle(c: SpecClient) -> None:
    await c.call("GetPluginInfo")
    await c.call("GetPluginCapabilities")
    await c.call("Probe")
    await c.call("ControllerGetCapabilities")
    await c.call("NodeGetCapabilities")
    info = await c.call("NodeGetInfo")
    cap = mount_cap(c)
    vol = (
        await c.call(
            "CreateVolume",
            name="pvc-1",
            capacity_range={"required_bytes": 1 << 30},
            volume_capabilities=[cap],
        )
    ).volume
    vid = vol.id
    await c.call("ValidateVolumeCapabilities", volume_id=vid, volume_capabilities=[cap])
    await c.call("ListVolumes", max_entries=1)
    pub = await c.call(
        "ControllerPublishVolume", volume_id=vid, node_id=info.node_id, volume_capability=cap
    )
    stage = "/var/lib/kubelet/plugins/fake/globalmount"
    target = "/var/lib/kubelet/pods/p1/volumes/fake/mount"
    await c.call(
        "NodeStageVolume",
        volume_id=vid,
        staging_target_path=stage,
        volume_capability=cap,
        publish_info=dict(pub.publish_info),
    )
    await c.call(
        "NodePublishVolume",
        volume_id=vid,
        staging_target_path=stage,
        target_path=target,
        volume_capability=cap,
        publish_info=dict(pub.publish_info),
    )
    await c.call("NodeUnpublishVolume", volume_id=vid, target_path=target)
    await c.call("NodeUnstageVolume", volume_id=vid, staging_target_path=stage)
    await c.call("ControllerUnpublishVolume", volume_id=vid, node_id=info.node_id)
    snap = (await c.call("CreateSnapshot", name="snap-1", source_volume_id=vid)).snapshot
    await c.call("ListSnapshots", max_entries=1)
    await c.call("DeleteSnapshot", snapshot_id=snap.id)
    await c.call("DeleteVolume", volume_id=vid)


async def cosi_lifecycle(c: SpecClient) -> None:
    await c.call("DriverGetInfo")
    bucket = await c.call("DriverCreateBucket", name="bucket-1", parameters={"a": "b"})
    grant = await c.call(
        "DriverGrantBucketAccess",
        bucket_id=bucket.bucket_id,
        name="access-1",
        authentication_type="Key",
    )
    await c.call(
        "DriverRevokeBucketAccess", bucket_id=bucket.bucket_id, account_id=grant.account_id
    )
    await c.call("DriverDeleteBucket", bucket_id=bucket.bucket_id)


async def cosi_v1alpha2_lifecycle(c: SpecClient) -> None:
    """COSI v0.2: a bucket made and one statically provisioned, one access to both, revoked."""
    s3 = {"type": "S3"}
    key = {"type": "KEY"}
    await c.call("DriverGetInfo")
    made = await c.call(
        "DriverCreateBucket", name="bc-1", protocols=[s3], parameters={"tier": "standard"}
    )
    static = await c.call(
        "DriverGetExistingBucket", existing_bucket_id="static-archive", protocols=[s3]
    )
    ids = [made.bucket_id, static.bucket_id]
    grant = await c.call(
        "DriverGrantBucketAccess",
        account_name="ba-1",
        protocol=s3,
        authentication_type=key,
        buckets=[{"bucket_id": i, "access_mode": {"mode": "READ_WRITE"}} for i in ids],
    )
    await c.call(
        "DriverRevokeBucketAccess",
        account_id=grant.account_id,
        protocol=s3,
        authentication_type=key,
        buckets=[{"bucket_id": i} for i in ids],
    )
    await c.call("DriverDeleteBucket", bucket_id=made.bucket_id)


PROVIDER_SPEC = json.dumps(
    {"vmPool": "pool-a", "size": "small", "tags": {"kubernetes.io/cluster": "c1"}}
).encode()


async def cmi_lifecycle(c: SpecClient) -> None:
    await c.call("GetPluginInfo")
    await c.call("GetPluginCapabilities")
    await c.call("Probe")
    await c.call("CreateMachine", MachineName="m-1", ProviderSpec=PROVIDER_SPEC)
    await c.call("GetMachineStatus", MachineName="m-1", ProviderSpec=PROVIDER_SPEC)
    await c.call("ListMachines", ProviderSpec=PROVIDER_SPEC)
    await c.call(
        "GetVolumeIDs",
        PVSpecList=json.dumps([{"csi": {"volumeHandle": "vol-1"}}]).encode(),
    )
    await c.call("ShutDownMachine", MachineName="m-1", ProviderSpec=PROVIDER_SPEC)
    await c.call("DeleteMachine", MachineName="m-1", ProviderSpec=PROVIDER_SPEC)


LIFECYCLES: dict[str, Callable[[SpecClient], Awaitable[None]]] = {
    "csi.v1": csi_v1_lifecycle,
    "csi.v0": csi_v0_lifecycle,
    "cosi.v1alpha1": cosi_lifecycle,
    "cosi.v1alpha2": cosi_v1alpha2_lifecycle,
    "cmi.v1": cmi_lifecycle,
}


@pytest.mark.parametrize("mode", ["audit", "enforce"])
@pytest.mark.parametrize("spec", list(LIFECYCLES))
async def test_clean_lifecycle_has_no_violations(spec, mode, tmp_path):
    async with through_proxy(spec, tmp_path, "--validation", mode) as (client, proxy):
        await LIFECYCLES[spec](client)  # enforce: every valid call gets through
        assert stage_of(proxy).report.snapshot() == []
