"""The csi.v1 fake plugin: lifecycle, idempotency, error codes, pagination and streaming."""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import re
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import pytest

from plugproxy.fakes import FakeKnobs, SpecClient
from plugproxy.fakes.csi_model import (
    BLOCK_SIZE,
    CBT_PARAMETER,
    DEFAULT_VOLUME_SIZE,
    MAX_VOLUME_SIZE,
    MAX_VOLUMES_PER_NODE,
    NODE_ID,
    TOPOLOGY_KEY,
    MiB,
)
from plugproxy.fakes.csi_v1 import CONTROLLER_CAPABILITIES, NODE_CAPABILITIES
from plugproxy.fakes.testing import expect_status, running_fake

Code = grpc.StatusCode
MOUNT = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
BLOCK = {"block": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
MULTI = {"mount": {}, "access_mode": {"mode": "MULTI_NODE_MULTI_WRITER"}}


def async_test(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


def _kind(path: str) -> str:
    """What is at ``path`` (what NodePublish/NodeUnpublish leave on the filesystem)."""
    if os.path.isdir(path):
        return "dir"
    return "file" if os.path.isfile(path) else "missing"


async def create(
    c: SpecClient, name: str, size: int = 10 * MiB, cap: Any = MOUNT, **kw: Any
) -> Any:
    resp = await c.call(
        "CreateVolume",
        name=name,
        volume_capabilities=[cap],
        capacity_range={"required_bytes": size},
        **kw,
    )
    return resp.volume


async def attach(c: SpecClient, tmp: Path, vol_id: str, cap: Any = MOUNT) -> tuple[str, str]:
    """Controller-publish to this node, stage and node-publish; returns (staging, target)."""
    staging, target = str(tmp / f"stage-{vol_id}"), str(tmp / f"target-{vol_id}")
    pub = await c.call(
        "ControllerPublishVolume", volume_id=vol_id, node_id=NODE_ID, volume_capability=cap
    )
    await c.call(
        "NodeStageVolume",
        volume_id=vol_id,
        staging_target_path=staging,
        volume_capability=cap,
        publish_context=dict(pub.publish_context),
    )
    await c.call(
        "NodePublishVolume",
        volume_id=vol_id,
        staging_target_path=staging,
        target_path=target,
        volume_capability=cap,
        publish_context=dict(pub.publish_context),
    )
    return staging, target


# -- Identity --------------------------------------------------------------------------


@async_test
async def test_identity(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        info = await c.call("GetPluginInfo")
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,61}[A-Za-z0-9]", info.name)
        assert info.vendor_version
        caps = await c.call("GetPluginCapabilities")
        services = {str(x.service.type) for x in caps.capabilities if x.HasField("service")}
        assert len(services) == 4
        expansion = [x for x in caps.capabilities if x.HasField("volume_expansion")]
        assert len(expansion) == 1
        assert (await c.call("Probe")).ready.value is True
        ctrl = await c.call("ControllerGetCapabilities")
        assert len(ctrl.capabilities) == len(CONTROLLER_CAPABILITIES)
        node = await c.call("NodeGetCapabilities")
        assert len(node.capabilities) == len(NODE_CAPABILITIES)
        group = await c.call("GroupControllerGetCapabilities")
        assert len(group.capabilities) == 1
        ninfo = await c.call("NodeGetInfo")
        assert ninfo.node_id == NODE_ID
        assert ninfo.max_volumes_per_node == MAX_VOLUMES_PER_NODE
        assert TOPOLOGY_KEY in ninfo.accessible_topology.segments


# -- full lifecycle --------------------------------------------------------------------


@async_test
async def test_full_lifecycle(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (handle, c):
        vol = await create(c, "data", 10 * MiB, parameters={"kind": "fast"})
        assert vol.volume_id and vol.capacity_bytes == 10 * MiB
        assert vol.accessible_topology[0].segments[TOPOLOGY_KEY] == "zone-a"
        vid = vol.volume_id
        staging, target = await attach(c, tmp_path, vid)
        assert _kind(target) == "dir"  # the SP creates target_path (CSI v1.12 §NodePublishVolume)

        got = await c.call("ControllerGetVolume", volume_id=vid)
        assert list(got.status.published_node_ids) == [NODE_ID]
        assert not got.status.volume_condition.abnormal

        stats = await c.call("NodeGetVolumeStats", volume_id=vid, volume_path=target)
        assert stats.usage[0].total == 10 * MiB
        assert len(stats.usage) == 2  # bytes and inodes for a mount volume

        exp = await c.call(
            "ControllerExpandVolume", volume_id=vid, capacity_range={"required_bytes": 20 * MiB}
        )
        assert exp.capacity_bytes == 20 * MiB and exp.node_expansion_required
        nexp = await c.call(
            "NodeExpandVolume",
            volume_id=vid,
            volume_path=target,
            capacity_range={"required_bytes": 20 * MiB},
        )
        assert nexp.capacity_bytes == 20 * MiB
        await c.call("ControllerModifyVolume", volume_id=vid, mutable_parameters={"iops": "500"})

        snap = (await c.call("CreateSnapshot", name="snap", source_volume_id=vid)).snapshot
        assert snap.ready_to_use and snap.size_bytes == 20 * MiB
        assert snap.creation_time.seconds > 0

        await c.call("NodeUnpublishVolume", volume_id=vid, target_path=target)
        assert _kind(target) == "missing"  # and removes it again
        await c.call("NodeUnstageVolume", volume_id=vid, staging_target_path=staging)
        await c.call("ControllerUnpublishVolume", volume_id=vid, node_id=NODE_ID)
        await c.call("DeleteVolume", volume_id=vid)
        assert not (await c.call("ListVolumes")).entries
        # the snapshot outlives its volume (CSI v1.12 §DeleteVolume: independent snapshots)
        restored = await c.call(
            "CreateVolume",
            name="restored",
            volume_capabilities=[MOUNT],
            volume_content_source={"snapshot": {"snapshot_id": snap.snapshot_id}},
        )
        assert restored.volume.capacity_bytes == DEFAULT_VOLUME_SIZE  # >= snapshot size
        assert restored.volume.content_source.snapshot.snapshot_id == snap.snapshot_id
        assert max(handle.plugin.max_overlap_per_key().values()) == 1


@async_test
async def test_idempotent_repeats(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        first = await create(c, "same")
        again = await create(c, "same")
        assert first == again
        vid = first.volume_id
        for _ in range(2):
            staging, target = await attach(c, tmp_path, vid)
        snap1 = await c.call("CreateSnapshot", name="s", source_volume_id=vid)
        snap2 = await c.call("CreateSnapshot", name="s", source_volume_id=vid)
        assert snap1 == snap2
        exp = {"volume_id": vid, "capacity_range": {"required_bytes": 5 * MiB}}
        assert (await c.call("ControllerExpandVolume", **exp)).capacity_bytes == 10 * MiB
        for _ in range(2):
            await c.call("NodeUnpublishVolume", volume_id=vid, target_path=target)
            await c.call("NodeUnstageVolume", volume_id=vid, staging_target_path=staging)
            await c.call("ControllerUnpublishVolume", volume_id=vid, node_id=NODE_ID)
        for _ in range(2):
            await c.call("DeleteSnapshot", snapshot_id=snap1.snapshot.snapshot_id)
            await c.call("DeleteVolume", volume_id=vid)
        # unknown ids are fine for the negation calls (CSI v1.12 §DeleteVolume, ...)
        await c.call("ControllerUnpublishVolume", volume_id="nope", node_id="nowhere")
        await c.call("DeleteVolumeGroupSnapshot", group_snapshot_id="nope")


# -- CreateVolume errors -----------------------------------------------------------------


@async_test
async def test_create_volume_errors(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        cv = functools.partial(c.call, "CreateVolume")
        await expect_status(cv(volume_capabilities=[MOUNT]), Code.INVALID_ARGUMENT, contains="name")
        await expect_status(cv(name="x"), Code.INVALID_ARGUMENT, contains="volume_capabilities")
        no_type = {"access_mode": {"mode": "SINGLE_NODE_WRITER"}}
        await expect_status(cv(name="x", volume_capabilities=[no_type]), Code.INVALID_ARGUMENT)
        await expect_status(
            cv(name="x", volume_capabilities=[{"mount": {}}]), Code.INVALID_ARGUMENT
        )
        btrfs = {"mount": {"fs_type": "btrfs"}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
        await expect_status(cv(name="x", volume_capabilities=[btrfs]), Code.INVALID_ARGUMENT)
        await expect_status(cv(name="x" * 129, volume_capabilities=[MOUNT]), Code.INVALID_ARGUMENT)
        await cv(name="x" * 128, volume_capabilities=[MOUNT])
        await expect_status(cv(name="bad\x07", volume_capabilities=[MOUNT]), Code.INVALID_ARGUMENT)
        inverted = {"required_bytes": 10, "limit_bytes": 5}
        await expect_status(
            cv(name="x", volume_capabilities=[MOUNT], capacity_range=inverted),
            Code.INVALID_ARGUMENT,
        )
        huge = {"required_bytes": MAX_VOLUME_SIZE + 1}
        await expect_status(
            cv(name="x", volume_capabilities=[MOUNT], capacity_range=huge), Code.OUT_OF_RANGE
        )
        await expect_status(
            cv(name="x", volume_capabilities=[MOUNT], mutable_parameters={"XXX": "1"}),
            Code.INVALID_ARGUMENT,
        )
        await expect_status(
            cv(name="x", volume_capabilities=[MOUNT], mutable_parameters={"iops": "lots"}),
            Code.INVALID_ARGUMENT,
        )
        # same name, other arguments: ALREADY_EXISTS (CSI v1.12 §CreateVolume Errors)
        await create(c, "taken", 10 * MiB)
        await expect_status(create(c, "taken", 20 * MiB), Code.ALREADY_EXISTS)
        await expect_status(create(c, "taken", cap=BLOCK), Code.ALREADY_EXISTS)
        await expect_status(create(c, "taken", parameters={"a": "b"}), Code.ALREADY_EXISTS)


@async_test
async def test_create_volume_sources(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        src = await create(c, "src", 10 * MiB)
        snap = (await c.call("CreateSnapshot", name="s", source_volume_id=src.volume_id)).snapshot
        from_snap = {"snapshot": {"snapshot_id": snap.snapshot_id}}
        from_vol = {"volume": {"volume_id": src.volume_id}}
        clone = await create(c, "clone", 20 * MiB, volume_content_source=from_vol)
        assert clone.content_source.volume.volume_id == src.volume_id
        assert clone.capacity_bytes == 20 * MiB  # larger than the source is supported
        restored = await create(c, "restored", 10 * MiB, volume_content_source=from_snap)
        assert restored.content_source.snapshot.snapshot_id == snap.snapshot_id
        # a retry with another source is incompatible
        await expect_status(
            create(c, "restored", 10 * MiB, volume_content_source=from_vol), Code.ALREADY_EXISTS
        )
        missing_snap = {"snapshot": {"snapshot_id": "snap-nope"}}
        await expect_status(
            create(c, "n1", volume_content_source=missing_snap), Code.NOT_FOUND, contains="snap"
        )
        missing_vol = {"volume": {"volume_id": "vol-nope"}}
        await expect_status(create(c, "n2", volume_content_source=missing_vol), Code.NOT_FOUND)
        await expect_status(
            create(c, "n3", volume_content_source={"volume": {}}), Code.INVALID_ARGUMENT
        )
        # a limit below the source size cannot hold the data: OUT_OF_RANGE
        small = {"required_bytes": MiB, "limit_bytes": MiB}
        await expect_status(
            c.call(
                "CreateVolume",
                name="small",
                volume_capabilities=[MOUNT],
                capacity_range=small,
                volume_content_source=from_snap,
            ),
            Code.OUT_OF_RANGE,
        )


@async_test
async def test_create_volume_topology(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):

        def zone(z: str) -> dict[str, Any]:
            return {"segments": {TOPOLOGY_KEY: z}}

        req = {"requisite": [zone("zone-x"), zone("zone-b")], "preferred": [zone("zone-b")]}
        vol = await create(c, "t1", accessibility_requirements=req)
        assert vol.accessible_topology[0].segments[TOPOLOGY_KEY] == "zone-b"
        await expect_status(
            create(c, "t2", accessibility_requirements={"requisite": [zone("zone-x")]}),
            Code.RESOURCE_EXHAUSTED,
        )
        bad = {"requisite": [zone("zone-a")], "preferred": [zone("zone-b")]}
        await expect_status(create(c, "t3", accessibility_requirements=bad), Code.INVALID_ARGUMENT)
        cap = await c.call("GetCapacity", accessible_topology=zone("zone-x"))
        assert cap.available_capacity == 0
        before = (await c.call("GetCapacity")).available_capacity
        await create(c, "t4", 100 * MiB)
        after = await c.call("GetCapacity", volume_capabilities=[MOUNT])
        assert before - after.available_capacity == 100 * MiB
        assert after.maximum_volume_size.value == MAX_VOLUME_SIZE
        btrfs = {"mount": {"fs_type": "btrfs"}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
        assert (await c.call("GetCapacity", volume_capabilities=[btrfs])).available_capacity == 0


@async_test
async def test_default_capacity(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        vol = (await c.call("CreateVolume", name="d", volume_capabilities=[MOUNT])).volume
        assert vol.capacity_bytes == DEFAULT_VOLUME_SIZE
        only_limit = {"limit_bytes": 5 * MiB}
        resp = await c.call(
            "CreateVolume", name="l", volume_capabilities=[MOUNT], capacity_range=only_limit
        )
        assert resp.volume.capacity_bytes == 5 * MiB


# -- publish / validate / delete --------------------------------------------------------


@async_test
async def test_controller_publish_errors(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        pub = functools.partial(c.call, "ControllerPublishVolume")
        await expect_status(pub(node_id=NODE_ID, volume_capability=MOUNT), Code.INVALID_ARGUMENT)
        await expect_status(pub(volume_id="v", volume_capability=MOUNT), Code.INVALID_ARGUMENT)
        await expect_status(pub(volume_id="v", node_id=NODE_ID), Code.INVALID_ARGUMENT)
        await expect_status(
            pub(volume_id="v", node_id=NODE_ID, volume_capability=MOUNT), Code.NOT_FOUND
        )
        vid = (await create(c, "single")).volume_id
        await expect_status(
            pub(volume_id=vid, node_id="node-9", volume_capability=MOUNT), Code.NOT_FOUND
        )
        await pub(volume_id=vid, node_id=NODE_ID, volume_capability=MOUNT)
        await expect_status(
            pub(volume_id=vid, node_id=NODE_ID, volume_capability=MOUNT, readonly=True),
            Code.ALREADY_EXISTS,
        )
        await expect_status(
            pub(volume_id=vid, node_id="node-2", volume_capability=MOUNT),
            Code.FAILED_PRECONDITION,
            contains=NODE_ID,  # names the node holding it (CSI v1.12 §ControllerPublishVolume)
        )
        await expect_status(
            pub(volume_id=vid, node_id=NODE_ID, volume_capability=BLOCK), Code.INVALID_ARGUMENT
        )
        await expect_status(
            c.call("DeleteVolume", volume_id=vid), Code.FAILED_PRECONDITION, contains=NODE_ID
        )
        # a multi-node volume may be published to several nodes
        multi = (await create(c, "multi", cap=MULTI)).volume_id
        for node in ("node-1", "node-2", "node-3"):
            await pub(volume_id=multi, node_id=node, volume_capability=MULTI)
        got = await c.call("ControllerGetVolume", volume_id=multi)
        assert list(got.status.published_node_ids) == ["node-1", "node-2", "node-3"]
        await c.call("ControllerUnpublishVolume", volume_id=multi)  # no node: all nodes
        got = await c.call("ControllerGetVolume", volume_id=multi)
        assert not got.status.published_node_ids
        await expect_status(c.call("ControllerGetVolume", volume_id="gone"), Code.NOT_FOUND)


@async_test
async def test_max_volumes_per_node(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        for i in range(MAX_VOLUMES_PER_NODE + 1):
            vid = (await create(c, f"v{i}")).volume_id
            call = c.call(
                "ControllerPublishVolume", volume_id=vid, node_id="node-2", volume_capability=MOUNT
            )
            if i < MAX_VOLUMES_PER_NODE:
                await call
            else:
                await expect_status(call, Code.RESOURCE_EXHAUSTED)


@async_test
async def test_validate_volume_capabilities(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        vol = await create(c, "v", parameters={"p": "1"}, mutable_parameters={"tier": "premium"})
        vvc = functools.partial(c.call, "ValidateVolumeCapabilities")
        ok = await vvc(
            volume_id=vol.volume_id,
            volume_capabilities=[MOUNT],
            volume_context=dict(vol.volume_context),
            parameters={"p": "1"},
        )
        assert len(ok.confirmed.volume_capabilities) == 1
        assert dict(ok.confirmed.parameters) == {"p": "1"}
        weaker = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_READER_ONLY"}}
        assert (await vvc(volume_id=vol.volume_id, volume_capabilities=[weaker])).confirmed
        for caps, kw in (
            ([MULTI], {}),
            ([BLOCK], {}),
            ([MOUNT], {"parameters": {"p": "2"}}),
            ([MOUNT], {"mutable_parameters": {"tier": "standard"}}),
        ):
            no = await vvc(volume_id=vol.volume_id, volume_capabilities=caps, **kw)
            assert not no.HasField("confirmed") and no.message
        await expect_status(vvc(volume_capabilities=[MOUNT]), Code.INVALID_ARGUMENT)
        await expect_status(vvc(volume_id=vol.volume_id), Code.INVALID_ARGUMENT)
        await expect_status(vvc(volume_id="nope", volume_capabilities=[MOUNT]), Code.NOT_FOUND)


# -- listing ------------------------------------------------------------------------------


@async_test
async def test_list_volumes_pagination(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        ids = [(await create(c, f"v{i}")).volume_id for i in range(5)]
        page1 = await c.call("ListVolumes", max_entries=2)
        assert [e.volume.volume_id for e in page1.entries] == ids[:2]
        assert page1.next_token
        # deleting the last entry of a page must not invalidate its token
        await c.call("DeleteVolume", volume_id=ids[1])
        newer = (await create(c, "late")).volume_id
        page2 = await c.call("ListVolumes", max_entries=2, starting_token=page1.next_token)
        assert [e.volume.volume_id for e in page2.entries] == ids[2:4]
        page3 = await c.call("ListVolumes", max_entries=2, starting_token=page2.next_token)
        assert [e.volume.volume_id for e in page3.entries] == [ids[4], newer]
        assert page3.next_token == ""
        everything = await c.call("ListVolumes")
        assert len(everything.entries) == 5 and not everything.next_token
        await expect_status(c.call("ListVolumes", starting_token="bogus"), Code.ABORTED)
        await expect_status(c.call("ListVolumes", starting_token="v:999999"), Code.ABORTED)
        await expect_status(c.call("ListVolumes", max_entries=-1), Code.INVALID_ARGUMENT)


@async_test
async def test_list_snapshots(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        v1, v2 = (await create(c, "a")).volume_id, (await create(c, "b")).volume_id
        snaps = []
        for i, vid in enumerate((v1, v1, v2, v2, v2)):
            snap = await c.call("CreateSnapshot", name=f"s{i}", source_volume_id=vid)
            snaps.append(snap.snapshot.snapshot_id)
        page = await c.call("ListSnapshots", max_entries=2)
        assert [e.snapshot.snapshot_id for e in page.entries] == snaps[:2]
        rest = await c.call("ListSnapshots", starting_token=page.next_token)
        assert [e.snapshot.snapshot_id for e in rest.entries] == snaps[2:]
        by_volume = await c.call("ListSnapshots", source_volume_id=v2)
        assert len(by_volume.entries) == 3
        by_id = await c.call("ListSnapshots", snapshot_id=snaps[3])
        assert [e.snapshot.snapshot_id for e in by_id.entries] == [snaps[3]]
        assert not (await c.call("ListSnapshots", snapshot_id="none")).entries
        assert not (await c.call("ListSnapshots", source_volume_id="none")).entries
        await expect_status(c.call("ListSnapshots", starting_token="v:1"), Code.ABORTED)


# -- snapshots ----------------------------------------------------------------------------


@async_test
async def test_snapshot_errors(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        v1, v2 = (await create(c, "a")).volume_id, (await create(c, "b")).volume_id
        cs = functools.partial(c.call, "CreateSnapshot")
        await expect_status(cs(source_volume_id=v1), Code.INVALID_ARGUMENT, contains="name")
        await expect_status(cs(name="s"), Code.INVALID_ARGUMENT, contains="source_volume_id")
        await expect_status(cs(name="s", source_volume_id="nope"), Code.NOT_FOUND)
        snap = (await cs(name="s", source_volume_id=v1)).snapshot
        await expect_status(cs(name="s", source_volume_id=v2), Code.ALREADY_EXISTS)
        got = await c.call("GetSnapshot", snapshot_id=snap.snapshot_id)
        assert got.snapshot == snap
        await expect_status(c.call("GetSnapshot", snapshot_id="nope"), Code.NOT_FOUND)
        await expect_status(c.call("GetSnapshot"), Code.INVALID_ARGUMENT)
        await expect_status(c.call("DeleteSnapshot"), Code.INVALID_ARGUMENT)
        await c.call("DeleteSnapshot", snapshot_id="nope")


# -- expand / modify ----------------------------------------------------------------------


@async_test
async def test_expand_and_modify(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        mount = (await create(c, "m")).volume_id
        block = (await create(c, "b", cap=BLOCK)).volume_id
        ex = functools.partial(c.call, "ControllerExpandVolume")
        await expect_status(ex(volume_id=mount), Code.INVALID_ARGUMENT, contains="capacity_range")
        await expect_status(
            ex(capacity_range={"required_bytes": MiB}), Code.INVALID_ARGUMENT, contains="volume_id"
        )
        await expect_status(
            ex(volume_id="nope", capacity_range={"required_bytes": MiB}), Code.NOT_FOUND
        )
        await expect_status(
            ex(volume_id=mount, capacity_range={"required_bytes": MAX_VOLUME_SIZE + 1}),
            Code.OUT_OF_RANGE,
        )
        await expect_status(
            ex(
                volume_id=mount, capacity_range={"required_bytes": 2 * MiB}, volume_capability=MULTI
            ),
            Code.INVALID_ARGUMENT,
        )
        grown = await ex(volume_id=block, capacity_range={"required_bytes": 64 * MiB})
        assert grown.capacity_bytes == 64 * MiB and not grown.node_expansion_required

        mod = functools.partial(c.call, "ControllerModifyVolume")
        await mod(volume_id=mount, mutable_parameters={"iops": "3000", "tier": "premium"})
        await expect_status(mod(volume_id=mount), Code.INVALID_ARGUMENT)
        await expect_status(
            mod(volume_id=mount, mutable_parameters={"XXX_FakeKey": "v"}), Code.INVALID_ARGUMENT
        )
        await expect_status(
            mod(volume_id=mount, mutable_parameters={"tier": "gold"}), Code.INVALID_ARGUMENT
        )
        await expect_status(
            mod(volume_id="nope", mutable_parameters={"iops": "100"}), Code.NOT_FOUND
        )
        check = await c.call(
            "ValidateVolumeCapabilities",
            volume_id=mount,
            volume_capabilities=[MOUNT],
            mutable_parameters={"tier": "premium"},
        )
        assert check.confirmed


# -- node ---------------------------------------------------------------------------------


@async_test
async def test_node_errors(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        vid = (await create(c, "n")).volume_id
        stage = str(tmp_path / "stage")
        target = str(tmp_path / "target")
        st = functools.partial(c.call, "NodeStageVolume")
        await expect_status(
            st(staging_target_path=stage, volume_capability=MOUNT), Code.INVALID_ARGUMENT
        )
        await expect_status(st(volume_id=vid, volume_capability=MOUNT), Code.INVALID_ARGUMENT)
        await expect_status(st(volume_id=vid, staging_target_path=stage), Code.INVALID_ARGUMENT)
        await expect_status(
            st(volume_id=vid, staging_target_path="rel/path", volume_capability=MOUNT),
            Code.INVALID_ARGUMENT,
        )
        await expect_status(
            st(volume_id="nope", staging_target_path=stage, volume_capability=MOUNT),
            Code.NOT_FOUND,
        )
        # the volume must be attached to this node first
        await expect_status(
            st(volume_id=vid, staging_target_path=stage, volume_capability=MOUNT),
            Code.FAILED_PRECONDITION,
        )
        await c.call(
            "ControllerPublishVolume", volume_id=vid, node_id=NODE_ID, volume_capability=MOUNT
        )
        await expect_status(
            st(volume_id=vid, staging_target_path=stage, volume_capability=MULTI),
            Code.FAILED_PRECONDITION,  # exceeds the volume's capabilities
        )
        await st(volume_id=vid, staging_target_path=stage, volume_capability=MOUNT)
        ro = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_READER_ONLY"}}
        await expect_status(
            st(volume_id=vid, staging_target_path=stage, volume_capability=ro), Code.ALREADY_EXISTS
        )
        await expect_status(
            st(volume_id=vid, staging_target_path=stage + "2", volume_capability=MOUNT),
            Code.FAILED_PRECONDITION,
        )

        np = functools.partial(c.call, "NodePublishVolume")
        await expect_status(np(target_path=target, volume_capability=MOUNT), Code.INVALID_ARGUMENT)
        await expect_status(np(volume_id=vid, volume_capability=MOUNT), Code.INVALID_ARGUMENT)
        await expect_status(np(volume_id=vid, target_path=target), Code.INVALID_ARGUMENT)
        await expect_status(
            np(volume_id=vid, target_path=target, volume_capability=MOUNT),
            Code.FAILED_PRECONDITION,
            contains="staging_target_path",
        )
        args = {"volume_id": vid, "staging_target_path": stage, "volume_capability": MOUNT}
        await np(target_path=target, **args)
        await expect_status(np(target_path=target, readonly=True, **args), Code.ALREADY_EXISTS)
        await expect_status(np(target_path=target + "2", **args), Code.FAILED_PRECONDITION)
        await expect_status(
            c.call("NodeUnstageVolume", volume_id=vid, staging_target_path=stage),
            Code.FAILED_PRECONDITION,
        )
        await expect_status(
            c.call("ControllerUnpublishVolume", volume_id=vid, node_id=NODE_ID),
            Code.FAILED_PRECONDITION,
        )
        stats = functools.partial(c.call, "NodeGetVolumeStats")
        await expect_status(stats(volume_path=target), Code.INVALID_ARGUMENT)
        await expect_status(stats(volume_id=vid), Code.INVALID_ARGUMENT)
        await expect_status(stats(volume_id="nope", volume_path="some/path"), Code.NOT_FOUND)
        await expect_status(stats(volume_id=vid, volume_path="some/path"), Code.NOT_FOUND)
        assert (await stats(volume_id=vid, volume_path=stage)).usage
        nx = functools.partial(c.call, "NodeExpandVolume")
        await expect_status(nx(volume_id="nope", volume_path="x"), Code.NOT_FOUND)
        await expect_status(nx(volume_id=vid), Code.INVALID_ARGUMENT)
        await expect_status(
            nx(volume_id=vid, volume_path=target, capacity_range={"required_bytes": 1 << 40}),
            Code.OUT_OF_RANGE,
        )
        un = functools.partial(c.call, "NodeUnpublishVolume")
        await expect_status(un(target_path=target), Code.INVALID_ARGUMENT)
        await expect_status(un(volume_id=vid), Code.INVALID_ARGUMENT)
        await expect_status(un(volume_id="nope", target_path=target), Code.NOT_FOUND)
        await expect_status(
            c.call("NodeUnstageVolume", volume_id="nope", staging_target_path=stage),
            Code.NOT_FOUND,
        )


@async_test
async def test_node_publish_sharing_rules(tmp_path: Path) -> None:
    """CSI v1.12 §NodePublishVolume second table: several targets only for shareable modes."""
    async with running_fake("csi.v1", tmp_path) as (_, c):
        snmw = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_MULTI_WRITER"}}
        for name, cap in (("multi", MULTI), ("snmw", snmw)):
            vid = (await create(c, name, cap=cap)).volume_id
            staging, target = await attach(c, tmp_path, vid, cap)
            await c.call(
                "NodePublishVolume",
                volume_id=vid,
                staging_target_path=staging,
                target_path=target + "-second",
                volume_capability=cap,
            )
        block = (await create(c, "blk", cap=BLOCK)).volume_id
        _, target = await attach(c, tmp_path, block, BLOCK)
        assert _kind(target) == "file"  # block volumes are a file at target_path


# -- group snapshots ----------------------------------------------------------------------


@async_test
async def test_group_snapshots(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        v1, v2 = (await create(c, "a")).volume_id, (await create(c, "b")).volume_id
        cg = functools.partial(c.call, "CreateVolumeGroupSnapshot")
        await expect_status(cg(source_volume_ids=[v1]), Code.INVALID_ARGUMENT)
        await expect_status(cg(name="g"), Code.INVALID_ARGUMENT)
        await expect_status(cg(name="g", source_volume_ids=[v1, v1]), Code.INVALID_ARGUMENT)
        await expect_status(cg(name="g", source_volume_ids=[v1, "nope"]), Code.NOT_FOUND)
        group = (await cg(name="g", source_volume_ids=[v1, v2])).group_snapshot
        assert group.ready_to_use and len(group.snapshots) == 2
        assert {s.source_volume_id for s in group.snapshots} == {v1, v2}
        assert all(s.group_snapshot_id == group.group_snapshot_id for s in group.snapshots)
        again = (await cg(name="g", source_volume_ids=[v2, v1])).group_snapshot
        assert again == group
        await expect_status(cg(name="g", source_volume_ids=[v1]), Code.ALREADY_EXISTS)
        members = [s.snapshot_id for s in group.snapshots]
        gid = group.group_snapshot_id
        got = await c.call("GetVolumeGroupSnapshot", group_snapshot_id=gid, snapshot_ids=members)
        assert got.group_snapshot == group
        get = functools.partial(c.call, "GetVolumeGroupSnapshot")
        await expect_status(get(snapshot_ids=members), Code.INVALID_ARGUMENT)
        await expect_status(get(group_snapshot_id="nope"), Code.NOT_FOUND)
        await expect_status(
            get(group_snapshot_id=gid, snapshot_ids=members[:1]), Code.INVALID_ARGUMENT
        )
        await expect_status(
            c.call("DeleteSnapshot", snapshot_id=members[0]),
            Code.INVALID_ARGUMENT,
            contains=gid,
        )
        member = await c.call("GetSnapshot", snapshot_id=members[0])
        assert member.snapshot.group_snapshot_id == gid
        delete = functools.partial(c.call, "DeleteVolumeGroupSnapshot")
        await expect_status(delete(snapshot_ids=members), Code.INVALID_ARGUMENT)
        await expect_status(
            delete(group_snapshot_id=gid, snapshot_ids=["x"]), Code.INVALID_ARGUMENT
        )
        await delete(group_snapshot_id=gid, snapshot_ids=members)
        await delete(group_snapshot_id=gid, snapshot_ids=members)
        assert not (await c.call("ListSnapshots")).entries


# -- snapshot metadata streams ------------------------------------------------------------


def _tuples(messages: list[Any]) -> list[tuple[int, int]]:
    return [(b.byte_offset, b.size_bytes) for m in messages for b in m.block_metadata]


def _check_stream(messages: list[Any], style: str, capacity: int, max_results: int) -> None:
    assert messages
    for m in messages:
        assert m.block_metadata_type == _style_number(m, style)
        assert m.volume_capacity_bytes == capacity
        if max_results:
            assert len(m.block_metadata) <= max_results
    tuples = _tuples(messages)
    for (a_off, a_size), (b_off, _) in itertools.pairwise(tuples):
        assert a_off + a_size <= b_off  # ascending, non-overlapping (CSI v1.12 §Metadata Format)
    assert all(size > 0 for _, size in tuples)


def _style_number(message: Any, style: str) -> int:
    fd = message.DESCRIPTOR.fields_by_name["block_metadata_type"]
    return int(fd.enum_type.values_by_name[style].number)


@async_test
async def test_metadata_allocated_stream(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        vid = (await create(c, "v", 40 * MiB)).volume_id
        snap = (await c.call("CreateSnapshot", name="s", source_volume_id=vid)).snapshot
        sid = snap.snapshot_id
        full = await c.stream("GetMetadataAllocated", snapshot_id=sid, max_results=4)
        _check_stream(full, "FIXED_LENGTH", 40 * MiB, 4)
        all_tuples = _tuples(full)
        assert len(full) > 2  # really batched
        assert {size for _, size in all_tuples} == {BLOCK_SIZE}
        assert len(all_tuples) < 40  # not every block is allocated
        unlimited = await c.stream("GetMetadataAllocated", snapshot_id=sid)
        assert _tuples(unlimited) == all_tuples and len(unlimited) == 1
        # resuming: nothing that ends at or before starting_offset, nothing lost after it
        k = len(all_tuples) // 2
        resume_at = sum(all_tuples[k - 1])
        resumed = await c.stream(
            "GetMetadataAllocated", snapshot_id=sid, starting_offset=resume_at, max_results=3
        )
        assert _tuples(resumed) == all_tuples[k:]
        mid_block = all_tuples[k][0] + 10
        partial = await c.stream("GetMetadataAllocated", snapshot_id=sid, starting_offset=mid_block)
        assert _tuples(partial)[0] == all_tuples[k]  # S < B0.byte_offset + B0.size_bytes
        at_end = await c.stream("GetMetadataAllocated", snapshot_id=sid, starting_offset=40 * MiB)
        assert len(at_end) == 1 and not at_end[0].block_metadata

        ga = functools.partial(c.stream, "GetMetadataAllocated")
        await expect_status(ga(), Code.INVALID_ARGUMENT)
        await expect_status(ga(snapshot_id="nope"), Code.NOT_FOUND)
        await expect_status(ga(snapshot_id=sid, starting_offset=-1), Code.OUT_OF_RANGE)
        await expect_status(ga(snapshot_id=sid, starting_offset=40 * MiB + 1), Code.OUT_OF_RANGE)
        await expect_status(ga(snapshot_id=sid, max_results=-1), Code.INVALID_ARGUMENT)


@async_test
async def test_metadata_delta_stream(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (_, c):
        vid = (await create(c, "v", 32 * MiB)).volume_id
        other = (await create(c, "o", 32 * MiB)).volume_id
        base = (await c.call("CreateSnapshot", name="b", source_volume_id=vid)).snapshot
        await c.call(
            "ControllerExpandVolume", volume_id=vid, capacity_range={"required_bytes": 48 * MiB}
        )
        target = (await c.call("CreateSnapshot", name="t", source_volume_id=vid)).snapshot
        foreign = (await c.call("CreateSnapshot", name="f", source_volume_id=other)).snapshot
        ids = {"base_snapshot_id": base.snapshot_id, "target_snapshot_id": target.snapshot_id}
        delta = await c.stream("GetMetadataDelta", max_results=2, **ids)
        _check_stream(delta, "VARIABLE_LENGTH", 48 * MiB, 2)
        extents = _tuples(delta)
        assert extents[-1] == (32 * MiB, 16 * MiB)  # the grown range changed
        resumed = await c.stream("GetMetadataDelta", starting_offset=sum(extents[0]), **ids)
        assert _tuples(resumed) == extents[1:]

        gd = functools.partial(c.stream, "GetMetadataDelta")
        await expect_status(gd(target_snapshot_id=target.snapshot_id), Code.INVALID_ARGUMENT)
        await expect_status(gd(base_snapshot_id=base.snapshot_id), Code.INVALID_ARGUMENT)
        await expect_status(
            gd(base_snapshot_id="nope", target_snapshot_id=target.snapshot_id), Code.NOT_FOUND
        )
        await expect_status(
            gd(base_snapshot_id=base.snapshot_id, target_snapshot_id=foreign.snapshot_id),
            Code.INVALID_ARGUMENT,
        )
        await expect_status(
            gd(base_snapshot_id=target.snapshot_id, target_snapshot_id=base.snapshot_id),
            Code.INVALID_ARGUMENT,
        )
        await expect_status(gd(starting_offset=49 * MiB, **ids), Code.OUT_OF_RANGE)
        # changed block tracking disabled on the volume: FAILED_PRECONDITION
        nocbt = (await create(c, "n", parameters={CBT_PARAMETER: "false"})).volume_id
        s1 = (await c.call("CreateSnapshot", name="n1", source_volume_id=nocbt)).snapshot
        s2 = (await c.call("CreateSnapshot", name="n2", source_volume_id=nocbt)).snapshot
        await expect_status(
            gd(base_snapshot_id=s1.snapshot_id, target_snapshot_id=s2.snapshot_id),
            Code.FAILED_PRECONDITION,
        )


# -- misbehaviours (each one commits its breach) -------------------------------------------


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("create-volume-no-id", lambda v, r: v.volume_id == ""),
        ("create-volume-negative-capacity", lambda v, r: v.capacity_bytes == -1),
        (
            "create-volume-capacity-out-of-range",
            lambda v, r: v.capacity_bytes > r["capacity_range"]["limit_bytes"],
        ),
        ("create-volume-content-source-dropped", lambda v, r: not v.HasField("content_source")),
    ],
)
@async_test
async def test_misbehave_create_volume(tmp_path: Path, name: str, check: Any) -> None:
    async with running_fake("csi.v1", tmp_path) as (handle, c):
        src = await create(c, "src")
        handle.plugin.knobs.misbehave.add(name)  # knobs may change while running
        req = {
            "name": "v",
            "volume_capabilities": [MOUNT],
            "capacity_range": {"required_bytes": 10 * MiB, "limit_bytes": 10 * MiB},
            "volume_content_source": {"volume": {"volume_id": src.volume_id}},
        }
        vol = (await c.call("CreateVolume", **req)).volume
        assert check(vol, req)


@async_test
async def test_misbehave_not_idempotent(tmp_path: Path) -> None:
    knobs = FakeKnobs(misbehave={"create-volume-not-idempotent"})
    async with running_fake("csi.v1", tmp_path, knobs) as (_, c):
        first, second = await create(c, "same"), await create(c, "same")
        assert first.volume_id != second.volume_id


@async_test
async def test_misbehave_topology_without_capability(tmp_path: Path) -> None:
    knobs = FakeKnobs(misbehave={"topology-without-capability"})
    async with running_fake("csi.v1", tmp_path, knobs) as (_, c):
        caps = await c.call("GetPluginCapabilities")
        names = {
            x.service.DESCRIPTOR.fields_by_name["type"]
            .enum_type.values_by_number[x.service.type]
            .name
            for x in caps.capabilities
            if x.HasField("service")
        }
        assert "VOLUME_ACCESSIBILITY_CONSTRAINTS" not in names
        assert "CONTROLLER_SERVICE" in names
        assert (await create(c, "v")).accessible_topology


@async_test
async def test_misbehave_controller_responses(tmp_path: Path) -> None:
    knobs = FakeKnobs(
        misbehave={
            "validate-confirms-unrequested",
            "snapshot-source-mismatch",
            "snapshot-no-creation-time",
            "node-info-no-node-id",
            "get-capacity-negative",
        }
    )
    async with running_fake("csi.v1", tmp_path, knobs) as (_, c):
        vid = (await create(c, "v")).volume_id
        v = await c.call("ValidateVolumeCapabilities", volume_id=vid, volume_capabilities=[MOUNT])
        assert len(v.confirmed.volume_capabilities) == 2  # one more than requested
        assert "fake.plugproxy.io/unrequested" in v.confirmed.parameters
        snap = (await c.call("CreateSnapshot", name="s", source_volume_id=vid)).snapshot
        assert snap.source_volume_id != vid
        assert not snap.HasField("creation_time")
        assert (await c.call("NodeGetInfo")).node_id == ""
        assert (await c.call("GetCapacity")).available_capacity == -1


@async_test
async def test_misbehave_lists_and_unimplemented(tmp_path: Path) -> None:
    knobs = FakeKnobs(misbehave={"list-exceeds-max-entries"})
    async with running_fake("csi.v1", tmp_path, knobs) as (handle, c):
        for i in range(3):
            vid = (await create(c, f"v{i}")).volume_id
            await c.call("CreateSnapshot", name=f"s{i}", source_volume_id=vid)
        assert len((await c.call("ListVolumes", max_entries=1)).entries) == 3
        assert len((await c.call("ListSnapshots", max_entries=2)).entries) == 3
        handle.plugin.knobs.misbehave = {"unimplemented-advertised"}
        await expect_status(c.call("ListVolumes"), Code.UNIMPLEMENTED)
        assert (await c.call("ListSnapshots", max_entries=2)).next_token


@async_test
async def test_misbehave_metadata(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (handle, c):
        vid = (await create(c, "v", 40 * MiB)).volume_id
        sid = (await c.call("CreateSnapshot", name="s", source_volume_id=vid)).snapshot.snapshot_id
        handle.plugin.knobs.misbehave = {"metadata-offset-ignored"}
        start = 20 * MiB
        msgs = await c.stream("GetMetadataAllocated", snapshot_id=sid, starting_offset=start)
        first = _tuples(msgs)[0]
        assert first[0] + first[1] <= start  # a tuple ending before starting_offset
        handle.plugin.knobs.misbehave = {"metadata-exceeds-max-results"}
        msgs = await c.stream("GetMetadataAllocated", snapshot_id=sid, max_results=2)
        assert max(len(m.block_metadata) for m in msgs) > 2
