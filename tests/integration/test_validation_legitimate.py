"""Legitimate traffic through a real proxy in enforce mode, in front of the bundled fakes:
what real COs and plugins do, and what once drew false violations (spec-coverage audit
§5, FP-1 to FP-12). Each case reads GET /violations and /metrics over HTTP and checks that
every call the CO made reached the plugin (no proxy reject).

Where a plugin mints an id or token over 128 bytes, its own answers break CSI §Size Limits
and are reported wherever it returns the value; the CO passing it back is not.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from plugproxy.cli.serve import ProxyServer
from plugproxy.fakes import FailureRule, FakeKnobs, FakePluginHandle, SpecClient, start_fake_plugin
from tests.support import start_proxy

NOT_FOUND = grpc.StatusCode.NOT_FOUND
DRIVER = "csi.fake.plugproxy.io"
POD_UID = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
PV = "pvc-3f0e4a6e-9a43-4c3e-8a5e-3b1f3e0c9d11"
# kubelet's paths: the staging path carries a sha256 of the volume handle, the target the
# pod uid and the PV name; both are over the general 128-byte limit.
STAGE = (
    f"/var/lib/kubelet/plugins/kubernetes.io/csi/{DRIVER}/"
    f"{hashlib.sha256(PV.encode()).hexdigest()}/globalmount"
)
TARGET = f"/var/lib/kubelet/pods/{POD_UID}/volumes/kubernetes.io~csi/{PV}/mount"
assert len(STAGE) > 128 and len(TARGET) > 128


def service_account_tokens(audiences: Sequence[str]) -> str:
    """What kubelet puts in csi.storage.k8s.io/serviceAccount.tokens: a JWT per audience."""
    tokens = {}
    for audience in audiences:
        seed = hashlib.sha512(audience.encode()).digest() * 16
        jwt = ".".join(
            base64.urlsafe_b64encode(seed[:n]).decode().rstrip("=") for n in (54, 700, 256)
        )
        tokens[audience] = {"token": jwt, "expirationTimestamp": "2026-11-22T21:00:00Z"}
    return json.dumps(tokens)


def kubelet_context(volume_context: dict[str, str]) -> dict[str, str]:
    """The plugin's volume_context plus what kubelet adds (podInfoOnMount, tokenRequests)."""
    return {
        **volume_context,
        "csi.storage.k8s.io/pod.name": "web-0",
        "csi.storage.k8s.io/pod.namespace": "shop",
        "csi.storage.k8s.io/pod.uid": POD_UID,
        "csi.storage.k8s.io/serviceAccount.name": "web",
        "csi.storage.k8s.io/ephemeral": "false",
        "csi.storage.k8s.io/serviceAccount.tokens": service_account_tokens(
            ("vault", "https://kubernetes.default.svc", "sts.amazonaws.com")
        ),
    }


# -- a proxy in enforce mode, read over HTTP --------------------------------------------------


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        body: bytes = resp.read()
    return body


@dataclass
class Side:
    """One plugin behind one proxy, and a CO client that counts what it sent."""

    handle: FakePluginHandle
    proxy: ProxyServer
    client: SpecClient
    sent: Counter[str] = field(default_factory=Counter)

    async def call(self, rpc: str, *, code: grpc.StatusCode | None = None, **fields: Any) -> Any:
        """Call through the proxy; the plugin's own error ``code`` is expected when given."""
        self.sent[rpc] += 1
        try:
            reply = await self.client.call(rpc, **fields)
        except grpc.aio.AioRpcError as err:
            assert not (err.details() or "").startswith("plugproxy: "), err.details()
            assert err.code() == code, f"{rpc}: {err.code().name}: {err.details()}"
            return err
        assert code is None, f"{rpc} succeeded, expected {code}"
        return reply

    async def stream(self, rpc: str, **fields: Any) -> list[Any]:
        self.sent[rpc] += 1
        return await self.client.stream(rpc, **fields)

    async def violations(self) -> list[dict[str, Any]]:
        raw = await asyncio.to_thread(http_get, f"{self.base}/violations")
        report = json.loads(raw)
        assert report["total"] == sum(e["count"] for e in report["violations"])
        entries: list[dict[str, Any]] = report["violations"]
        return entries

    async def metric_lines(self) -> list[str]:
        text = (await asyncio.to_thread(http_get, f"{self.base}/metrics")).decode()
        return [line for line in text.splitlines() if line.startswith("plugproxy_violations")]

    @property
    def base(self) -> str:
        assert self.proxy.admin is not None
        return f"http://127.0.0.1:{self.proxy.admin.port}"

    def rejected(self) -> dict[str, int]:
        """Calls the CO sent that never reached the plugin (the proxy's own answers)."""
        seen = Counter(c.method for c in self.handle.plugin.calls)
        return {rpc: n - seen[rpc] for rpc, n in self.sent.items() if seen[rpc] < n}

    async def assert_clean(self) -> None:
        assert self.rejected() == {}
        assert await self.violations() == []
        assert await self.metric_lines() == []


@asynccontextmanager
async def sides(tmp_path: Any, spec: str, *knobs: FakeKnobs | None) -> AsyncIterator[list[Side]]:
    """One plugin (with ``knobs``) behind one enforcing proxy per knobs given."""
    async with AsyncExitStack() as stack:
        out = []
        for i, k in enumerate(knobs):
            plugin_sock = os.path.join(tmp_path, f"plugin{i}.sock")
            proxy_sock = os.path.join(tmp_path, f"proxy{i}.sock")
            handle = await start_fake_plugin(spec, f"unix://{plugin_sock}", k)
            stack.push_async_callback(handle.stop, 0)
            proxy = await start_proxy(
                proxy_sock,
                plugin_sock,
                "--validation",
                "enforce",
                "--admin-listen",
                "127.0.0.1:0",
            )
            stack.push_async_callback(proxy.stop, 0)
            client = SpecClient(f"unix://{proxy_sock}", spec)
            stack.push_async_callback(client.close)
            out.append(Side(handle, proxy, client))
        yield out


@asynccontextmanager
async def one_side(tmp_path: Any, spec: str, knobs: FakeKnobs | None = None) -> AsyncIterator[Side]:
    async with sides(tmp_path, spec, knobs) as (side,):
        yield side


def cap(side: Side, **mount: Any) -> Any:
    return side.client.new(
        "VolumeCapability", mount=mount, access_mode={"mode": "SINGLE_NODE_WRITER"}
    )


async def discover(side: Side) -> Any:
    """What external-provisioner, external-attacher and kubelet ask first."""
    await side.call("GetPluginInfo")
    await side.call("GetPluginCapabilities")
    await side.call("ControllerGetCapabilities")
    await side.call("NodeGetCapabilities")
    return await side.call("NodeGetInfo")


async def create(side: Side, name: str = PV, **extra: Any) -> Any:
    reply = await side.call("CreateVolume", name=name, volume_capabilities=[cap(side)], **extra)
    return reply.volume


async def attach_and_mount(side: Side, vol: Any, node_id: str, **publish: Any) -> None:
    pub = await side.call(
        "ControllerPublishVolume",
        volume_id=vol.volume_id,
        node_id=node_id,
        volume_capability=cap(side),
        volume_context=dict(vol.volume_context),
    )
    await side.call(
        "NodeStageVolume",
        volume_id=vol.volume_id,
        staging_target_path=STAGE,
        volume_capability=cap(side),
        publish_context=dict(pub.publish_context),
        volume_context=dict(vol.volume_context),
    )
    await side.call(
        "NodePublishVolume",
        volume_id=vol.volume_id,
        staging_target_path=STAGE,
        target_path=TARGET,
        volume_capability=cap(side),
        publish_context=dict(pub.publish_context),
        volume_context=publish.get("volume_context", dict(vol.volume_context)),
    )


# -- kubelet --------------------------------------------------------------------------------


async def test_kubelet_node_traffic_with_service_account_tokens(tmp_path):
    """Long kubelet paths, and volume_context with pod info and three audiences' tokens
    (FP-8: ~4.6 KB, over the 4 KiB map limit, made by the CO around the plugin's context)."""
    async with one_side(tmp_path, "csi.v1") as side:
        info = await discover(side)
        vol = await create(side)
        context = kubelet_context(dict(vol.volume_context))
        assert 4500 < sum(len(k) + len(v) for k, v in context.items()) < 4800
        await attach_and_mount(side, vol, info.node_id, volume_context=context)
        await side.call("NodeGetVolumeStats", volume_id=vol.volume_id, volume_path=TARGET)
        await side.call("NodeUnpublishVolume", volume_id=vol.volume_id, target_path=TARGET)
        await side.call("NodeUnstageVolume", volume_id=vol.volume_id, staging_target_path=STAGE)
        await side.call("ControllerUnpublishVolume", volume_id=vol.volume_id, node_id=info.node_id)
        await side.call("DeleteVolume", volume_id=vol.volume_id)
        await side.assert_clean()


# -- what the plugin made, passed back by the CO -----------------------------------------------


async def plugin_made_violations(side: Side) -> set[tuple[str, str, str]]:
    found = {
        (e["rule"], e["party"], e["method"].rsplit("/", 1)[-1]) for e in await side.violations()
    }
    assert all(party == "plugin" for _, party, _ in found), found
    assert not [line for line in await side.metric_lines() if 'party="co"' in line]
    assert side.rejected() == {}
    return found


async def test_paging_with_300_byte_tokens(tmp_path):
    """FP-2: the plugin's next_token is over 128 bytes; the CO's starting_token passes it
    back and is neither blamed nor rejected."""
    async with one_side(tmp_path, "csi.v1", FakeKnobs(token_bytes=300)) as side:
        await discover(side)
        for i in range(3):
            vol = await create(side, f"pvc-{i}")
            await side.call("CreateSnapshot", name=f"snap-{i}", source_volume_id=vol.volume_id)
        for rpc in ("ListVolumes", "ListSnapshots"):
            token, pages = "", 0
            while True:
                page = await side.call(rpc, max_entries=1, starting_token=token)
                pages += 1
                token = page.next_token
                if not token:
                    break
                assert len(token) == 300
            assert pages == 3
        assert await plugin_made_violations(side) == {
            ("csi.size-limit", "plugin", "ListVolumes"),
            ("csi.size-limit", "plugin", "ListSnapshots"),
        }


async def test_plugin_made_ids_of_200_bytes_passed_back_by_the_co(tmp_path):
    """FP-2: every volume, snapshot and group snapshot id is 200 bytes; the plugin is
    reported where it returns them, and every request passing them back goes through."""
    async with one_side(tmp_path, "csi.v1", FakeKnobs(id_bytes=200)) as side:
        info = await discover(side)
        await side.call("GroupControllerGetCapabilities")
        vol = await create(side, capacity_range={"required_bytes": 1 << 30})
        vid = vol.volume_id
        assert len(vid) == 200
        await side.call(
            "ValidateVolumeCapabilities", volume_id=vid, volume_capabilities=[cap(side)]
        )
        await side.call("ControllerGetVolume", volume_id=vid)
        await side.call("ControllerModifyVolume", volume_id=vid, mutable_parameters={"iops": "500"})
        await side.call(
            "ControllerExpandVolume", volume_id=vid, capacity_range={"required_bytes": 2 << 30}
        )
        await attach_and_mount(side, vol, info.node_id)
        await side.call("NodeGetVolumeStats", volume_id=vid, volume_path=TARGET)
        await side.call(
            "NodeExpandVolume",
            volume_id=vid,
            volume_path=TARGET,
            staging_target_path=STAGE,
            capacity_range={"required_bytes": 2 << 30},
        )
        await side.call("NodeUnpublishVolume", volume_id=vid, target_path=TARGET)
        await side.call("NodeUnstageVolume", volume_id=vid, staging_target_path=STAGE)
        await side.call("ControllerUnpublishVolume", volume_id=vid, node_id=info.node_id)
        base = (await side.call("CreateSnapshot", name="snap-a", source_volume_id=vid)).snapshot
        target = (await side.call("CreateSnapshot", name="snap-b", source_volume_id=vid)).snapshot
        assert len(base.snapshot_id) == 200
        await side.call("GetSnapshot", snapshot_id=base.snapshot_id)
        await side.call("ListSnapshots", snapshot_id=base.snapshot_id, source_volume_id=vid)
        await side.stream("GetMetadataAllocated", snapshot_id=base.snapshot_id, max_results=64)
        await side.stream(
            "GetMetadataDelta",
            base_snapshot_id=base.snapshot_id,
            target_snapshot_id=target.snapshot_id,
        )
        clone = await create(
            side,
            "pvc-clone",
            volume_content_source={"snapshot": {"snapshot_id": base.snapshot_id}},
        )
        copy = await create(side, "pvc-copy", volume_content_source={"volume": {"volume_id": vid}})
        group = (
            await side.call(
                "CreateVolumeGroupSnapshot",
                name="group-1",
                source_volume_ids=[vid, clone.volume_id],
            )
        ).group_snapshot
        members = [s.snapshot_id for s in group.snapshots]
        await side.call(
            "GetVolumeGroupSnapshot",
            group_snapshot_id=group.group_snapshot_id,
            snapshot_ids=members,
        )
        await side.call(
            "DeleteVolumeGroupSnapshot",
            group_snapshot_id=group.group_snapshot_id,
            snapshot_ids=members,
        )
        for snap in (base, target):
            await side.call("DeleteSnapshot", snapshot_id=snap.snapshot_id)
        for v in (copy, clone, vol):
            await side.call("DeleteVolume", volume_id=v.volume_id)
        found = await plugin_made_violations(side)
        assert {rule for rule, _, _ in found} == {"csi.size-limit"}
        assert ("csi.size-limit", "plugin", "CreateVolume") in found


# -- HA controllers ----------------------------------------------------------------------------


async def test_ha_controller_pair_sharing_nothing(tmp_path):
    """Two controller replicas, each a plugin behind its own proxy, sharing nothing: the
    attacher publishes through one, the next leader unpublishes and deletes through the
    other (FP-4 ii)."""
    async with sides(tmp_path, "csi.v1", None, None) as (one, two):
        info = await discover(one)
        await discover(two)
        vol = await create(one)
        await attach_and_mount(one, vol, info.node_id)
        await one.call("NodeUnpublishVolume", volume_id=vol.volume_id, target_path=TARGET)
        await one.call("NodeUnstageVolume", volume_id=vol.volume_id, staging_target_path=STAGE)
        await two.call("ControllerUnpublishVolume", volume_id=vol.volume_id, node_id=info.node_id)
        await two.call("DeleteVolume", volume_id=vol.volume_id)
        await one.assert_clean()
        await two.assert_clean()


async def test_ha_replicas_of_one_driver_provisioner_stays_put(tmp_path):
    """The same pair as replicas of one driver over one storage system: the attacher
    leader moved to the second replica for the unpublish while the provisioner stayed on
    the first, whose proxy saw the volume published and now sees it deleted (FP-4 ii)."""
    async with sides(tmp_path, "csi.v1", None, None) as (one, two):
        two.handle.plugin.backend = one.handle.plugin.backend  # one storage system
        info = await discover(one)
        await discover(two)
        vol = await create(one)
        await one.call(
            "ControllerPublishVolume",
            volume_id=vol.volume_id,
            node_id=info.node_id,
            volume_capability=cap(one),
        )
        await two.call("ControllerUnpublishVolume", volume_id=vol.volume_id, node_id=info.node_id)
        await one.call("DeleteVolume", volume_id=vol.volume_id)
        await one.assert_clean()
        await two.assert_clean()


# -- NOT_FOUND answers from the error tables -------------------------------------------------


@pytest.mark.parametrize(
    "gone",
    ["ControllerUnpublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"],
)
async def test_not_found_counts_as_gone_and_the_lifecycle_goes_on(tmp_path, gone):
    """FP-4 i, FP-7: NOT_FOUND is in the error tables of the three undo calls (the volume
    or node no longer exists); what they undo is gone and the rest of the lifecycle runs."""
    knobs = FakeKnobs(failures={gone: FailureRule(NOT_FOUND, 1, after_call=True)})
    async with one_side(tmp_path, "csi.v1", knobs) as side:
        info = await discover(side)
        vol = await create(side)
        vid = vol.volume_id
        await attach_and_mount(side, vol, info.node_id)
        steps = [
            ("NodeUnpublishVolume", {"target_path": TARGET}),
            ("NodeUnstageVolume", {"staging_target_path": STAGE}),
            ("ControllerUnpublishVolume", {"node_id": info.node_id}),
            ("DeleteVolume", {}),
        ]
        for rpc, fields in steps:
            await side.call(rpc, volume_id=vid, code=NOT_FOUND if rpc == gone else None, **fields)
        await side.assert_clean()


# -- capabilities ----------------------------------------------------------------------------


async def test_volume_condition_only_plugin_serves_node_get_volume_stats(tmp_path):
    """FP-3: NodeGetVolumeStats is implemented with GET_VOLUME_STATS or VOLUME_CONDITION."""
    async with one_side(
        tmp_path, "csi.v1", FakeKnobs(hide_capabilities={"GET_VOLUME_STATS"})
    ) as side:
        info = await discover(side)
        caps = await side.call("NodeGetCapabilities")
        names = {c.rpc.type for c in caps.capabilities}
        enum = caps.capabilities[0].rpc.DESCRIPTOR.fields_by_name["type"].enum_type
        assert enum.values_by_name["VOLUME_CONDITION"].number in names
        assert enum.values_by_name["GET_VOLUME_STATS"].number not in names
        vol = await create(side)
        await attach_and_mount(side, vol, info.node_id)
        stats = await side.call("NodeGetVolumeStats", volume_id=vol.volume_id, volume_path=TARGET)
        assert stats.HasField("volume_condition")
        await side.assert_clean()


# -- error scheme ----------------------------------------------------------------------------


async def test_status_details_holding_a_status_without_details(tmp_path):
    """FP-5: grpc-status-details-bin with a google.rpc.Status of zero details, as
    grpcio-status and grpc-java attach to every error."""
    async with one_side(tmp_path, "csi.v1", FakeKnobs(status_in_trailer=True)) as side:
        await discover(side)
        err = await side.call("ControllerGetVolume", volume_id="vol-missing", code=NOT_FOUND)
        trailing = dict(err.trailing_metadata() or ())
        assert trailing["grpc-status-details-bin"][:2] == bytes([0x08, 5])
        await side.assert_clean()


# -- CMI -------------------------------------------------------------------------------------


async def test_cmi_list_machines_with_300_machines(tmp_path):
    """FP-9: a listing of 300 machines is a map of about 9 KB; each entry is judged, not the
    total."""
    spec = json.dumps(
        {"vmPool": "pool-a", "size": "small", "tags": {"kubernetes.io/cluster": "c1"}}
    ).encode()
    async with one_side(tmp_path, "cmi.v1") as side:
        await side.call("GetPluginInfo")
        await side.call("GetPluginCapabilities")
        for i in range(300):
            await side.call(
                "CreateMachine", MachineName=f"shoot--prod--worker-z1-{i:05d}", ProviderSpec=spec
            )
        listing = await side.call("ListMachines", ProviderSpec=spec)
        assert len(listing.MachineList) == 300
        assert sum(len(k) + len(v) for k, v in listing.MachineList.items()) > 4096
        await side.assert_clean()


# -- ValidateVolumeCapabilities ----------------------------------------------------------------


async def test_older_plugin_confirms_capabilities_without_a_newer_field(tmp_path):
    """FP-6: a plugin built before CSI v1.5 confirms the capability without
    volume_mount_group, a field it parses but does not know."""
    async with one_side(tmp_path, "csi.v1", FakeKnobs(older_csi=True)) as side:
        await discover(side)
        vol = await create(side)
        asked = cap(side, fs_type="ext4", volume_mount_group="2000")
        reply = await side.call(
            "ValidateVolumeCapabilities", volume_id=vol.volume_id, volume_capabilities=[asked]
        )
        (confirmed,) = reply.confirmed.volume_capabilities
        assert confirmed.mount.fs_type == "ext4" and not confirmed.mount.volume_mount_group
        await side.assert_clean()


# -- retries and repeats ---------------------------------------------------------------------


async def test_retries_after_transient_errors_and_idempotent_repeats(tmp_path):
    """What sidecars and kubelet do all day: every sidecar asks for the capabilities, calls
    are retried unchanged after transient errors, and kubelet repeats node calls after a
    restart or to republish; a repeat of a call the plugin refused with a code allowing
    it is fine, and so is a repeat after another call changed the volume."""
    unavailable, aborted = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    knobs = FakeKnobs(
        failures={
            "CreateVolume": FailureRule(exhausted, 1),
            "ControllerPublishVolume": FailureRule(aborted, 1),
            "NodeStageVolume": FailureRule(unavailable, 1),
        }
    )
    async with one_side(tmp_path, "csi.v1", knobs) as side:
        info = await discover(side)
        for _ in range(3):  # provisioner, attacher, resizer
            await side.call("GetPluginCapabilities")
            await side.call("ControllerGetCapabilities")
        await side.call("CreateVolume", name=PV, volume_capabilities=[cap(side)], code=exhausted)
        vol = await create(side)
        again = await create(side)  # the provisioner's repeat: same volume, OK
        assert again.volume_id == vol.volume_id
        publish = {
            "volume_id": vol.volume_id,
            "node_id": info.node_id,
            "volume_capability": cap(side),
            "volume_context": dict(vol.volume_context),
        }
        await side.call("ControllerPublishVolume", code=aborted, **publish)
        pub = await side.call("ControllerPublishVolume", **publish)
        await side.call("ControllerPublishVolume", **publish)
        stage = {
            "volume_id": vol.volume_id,
            "staging_target_path": STAGE,
            "volume_capability": cap(side),
            "publish_context": dict(pub.publish_context),
            "volume_context": dict(vol.volume_context),
        }
        await side.call("NodeStageVolume", code=unavailable, **stage)
        await side.call("NodeStageVolume", **stage)
        await side.call("NodeStageVolume", **stage)  # kubelet restarted
        publish_node = {
            "volume_id": vol.volume_id,
            "staging_target_path": STAGE,
            "target_path": TARGET,
            "volume_capability": cap(side),
            "publish_context": dict(pub.publish_context),
            "volume_context": dict(vol.volume_context),
        }
        for _ in range(2):  # requiresRepublish
            await side.call("NodePublishVolume", **publish_node)
            await side.call("NodeGetVolumeStats", volume_id=vol.volume_id, volume_path=TARGET)
        for _ in range(2):
            await side.call("NodeUnpublishVolume", volume_id=vol.volume_id, target_path=TARGET)
        await side.call("NodePublishVolume", **publish_node)  # the pod came back
        await side.call("NodeUnpublishVolume", volume_id=vol.volume_id, target_path=TARGET)
        for _ in range(2):
            await side.call("NodeUnstageVolume", volume_id=vol.volume_id, staging_target_path=STAGE)
            await side.call(
                "ControllerUnpublishVolume", volume_id=vol.volume_id, node_id=info.node_id
            )
        snap = {"name": "snap-1", "source_volume_id": vol.volume_id}
        first = await side.call("CreateSnapshot", **snap)
        assert (await side.call("CreateSnapshot", **snap)).snapshot == first.snapshot
        for _ in range(2):
            await side.call("DeleteSnapshot", snapshot_id=first.snapshot.snapshot_id)
            await side.call("DeleteVolume", volume_id=vol.volume_id)
        await side.assert_clean()
