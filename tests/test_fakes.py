"""Fake plugins: serving, knobs, observability, misbehaviours, CLI; csi.v0, COSI and CMI."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import pytest

from plugproxy.core.endpoints import ConfigError
from plugproxy.fakes import (
    FAKE_SPECS,
    MISBEHAVIOURS,
    FailureRule,
    FakeKnobs,
    SpecClient,
    catalogue,
    knobs_from_flags,
    start_fake_plugin,
)
from plugproxy.fakes import cli as fake_cli
from plugproxy.fakes.csi_model import NODE_ID
from plugproxy.fakes.knobs import parse_status_code, served_specs
from plugproxy.fakes.misbehave import status_bytes, status_details_bytes
from plugproxy.fakes.server import FakeRpcHandler
from plugproxy.fakes.testing import STATUS_DETAILS_KEY, expect_status, running_fake
from plugproxy.spec.registry import Registry

Code = grpc.StatusCode
MOUNT = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
INFO_RPC = {"csi.v1": "GetPluginInfo", "csi.v0": "GetPluginInfo", "cmi.v1": "GetPluginInfo"}
INFO_RPC["cosi.v1alpha1"] = INFO_RPC["cosi.v1alpha2"] = "DriverGetInfo"
MACHINE_SPEC = json.dumps(
    {"vmPool": "pool-a", "size": "small", "tags": {"kubernetes.io/cluster": "c1"}}
).encode()


def async_test(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


# -- serving ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", list(FAKE_SPECS))
def test_every_spec_method_is_routed(spec: str) -> None:
    plugin = FAKE_SPECS[spec]()
    handler = FakeRpcHandler(plugin)
    served = served_specs(spec)  # the DRA fake serves four specs on its socket
    paths = {m.path for s in served for m in Registry(served).methods(s)}
    # The device plugin API's Registration service is kubelet's, not the plugin's.
    paths -= set(getattr(plugin, "served_by_kubelet", ()))
    assert set(handler.handlers) == paths
    assert plugin.spec_name == spec


@async_test
async def test_unknown_method_is_unimplemented(tmp_path: Path) -> None:
    async with (
        running_fake("csi.v1", tmp_path) as (handle, _),
        grpc.aio.insecure_channel(handle.target) as channel,
    ):
        for path in ("/csi.v1.Controller/Nope", "/cosi.v1alpha1.Identity/DriverGetInfo"):
            call = channel.unary_unary(path)(b"", timeout=5)
            await expect_status(call, Code.UNIMPLEMENTED)


@async_test
async def test_unix_socket_lifecycle(tmp_path: Path) -> None:
    path = tmp_path / "p.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # a stale socket file from an earlier run
    handle = await start_fake_plugin("cmi.v1", f"unix://{path}")
    assert handle.url == f"unix://{path}"
    async with SpecClient(handle.target, "cmi.v1") as c:
        assert (await c.call("Probe")).ready.value
    await handle.stop()
    assert not path.exists()
    path.write_text("not a socket")
    with pytest.raises(ConfigError, match="not a socket"):
        await start_fake_plugin("cmi.v1", f"unix://{path}")
    with pytest.raises(ConfigError, match="does not exist"):
        await start_fake_plugin("cmi.v1", f"unix://{tmp_path}/missing/p.sock")


@async_test
async def test_tcp_and_bad_listen(tmp_path: Path) -> None:
    handle = await start_fake_plugin("cosi.v1alpha1", "tcp://127.0.0.1:0")
    assert handle.url.startswith("tcp://127.0.0.1:") and not handle.url.endswith(":0")
    async with SpecClient(handle.target, "cosi.v1alpha1") as c:
        assert (await c.call("DriverGetInfo")).name == "cosi.fake.plugproxy.io"
    await handle.stop()
    with pytest.raises(ConfigError, match="tls"):
        await start_fake_plugin("csi.v1", "tls://127.0.0.1:0")
    with pytest.raises(ConfigError, match="no fake plugin"):
        await start_fake_plugin("csi.v9", f"unix://{tmp_path}/x.sock")


# -- knobs --------------------------------------------------------------------------------


@async_test
async def test_delay_knob(tmp_path: Path) -> None:
    knobs = FakeKnobs(delays={"Probe": 0.2, "/csi.v1.Node/NodeGetInfo": 5})
    async with running_fake("csi.v1", tmp_path, knobs) as (handle, c):
        assert handle.plugin.knobs.delays == {"Probe": 0.2, "NodeGetInfo": 5.0}
        start = time.monotonic()
        await c.call("Probe")
        assert time.monotonic() - start >= 0.2
        rec = handle.plugin.calls_to("Probe")[0]
        assert rec.end is not None and rec.end - rec.start >= 0.2
        # a caller giving up ends the delayed call at the plugin too
        await expect_status(c.call("NodeGetInfo", timeout=0.1), Code.DEADLINE_EXCEEDED)
        for _ in range(100):
            if handle.plugin.calls_to("NodeGetInfo")[0].done:
                break
            await asyncio.sleep(0.02)
        assert handle.plugin.calls_to("NodeGetInfo")[0].code == Code.CANCELLED


@async_test
async def test_failure_knob(tmp_path: Path) -> None:
    knobs = FakeKnobs(
        failures={
            "Probe": FailureRule(Code.UNAVAILABLE, remaining=2),
            "Identity/GetPluginInfo": FailureRule(Code.PERMISSION_DENIED),
        }
    )
    async with running_fake("csi.v1", tmp_path, knobs) as (handle, c):
        for _ in range(2):
            await expect_status(c.call("Probe"), Code.UNAVAILABLE, contains="injected")
        await c.call("Probe")
        for _ in range(3):
            await expect_status(c.call("GetPluginInfo"), Code.PERMISSION_DENIED)
        handle.plugin.knobs.failures["*"] = FailureRule(Code.INTERNAL, remaining=1)
        await expect_status(c.call("NodeGetInfo"), Code.INTERNAL)
        await c.call("NodeGetInfo")
        codes = [r.code for r in handle.plugin.calls]
        assert codes[:3] == [Code.UNAVAILABLE, Code.UNAVAILABLE, Code.OK]


@async_test
async def test_knobs_for_legitimate_behaviours(tmp_path: Path) -> None:
    """Knobs that make the fake behave like real plugins do, none of them a breach."""
    knobs = FakeKnobs(
        failures={"NodeUnpublishVolume": FailureRule(Code.NOT_FOUND, 1, after_call=True)},
        hide_capabilities={"GET_VOLUME_STATS"},
        id_bytes=200,
        token_bytes=300,
        status_in_trailer=True,
        older_csi=True,
    )
    async with running_fake("csi.v1", tmp_path, knobs) as (handle, c):
        caps = await c.call("NodeGetCapabilities")
        assert len(caps.capabilities) == 5  # GET_VOLUME_STATS left out
        mount = {"mount": {"volume_mount_group": "2000"}, "access_mode": {"mode": 1}}
        vols = [
            (await c.call("CreateVolume", name=f"v{i}", volume_capabilities=[mount])).volume
            for i in range(2)
        ]
        assert all(len(v.volume_id) == 200 for v in vols)
        page = await c.call("ListVolumes", max_entries=1)
        assert len(page.next_token) == 300
        rest = await c.call("ListVolumes", max_entries=1, starting_token=page.next_token)
        assert [e.volume.volume_id for e in rest.entries] == [vols[1].volume_id]
        checked = await c.call(
            "ValidateVolumeCapabilities", volume_id=vols[0].volume_id, volume_capabilities=[mount]
        )
        assert not checked.confirmed.volume_capabilities[0].mount.volume_mount_group
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.call("ControllerGetVolume", volume_id="missing")
        status = dict(err.value.trailing_metadata() or ())[STATUS_DETAILS_KEY]
        assert status == status_bytes(Code.NOT_FOUND, err.value.details() or "")
        # after_call: the publication is undone, then NOT_FOUND is answered
        vid, target = vols[0].volume_id, str(tmp_path / "target")
        await c.call(
            "ControllerPublishVolume", volume_id=vid, node_id=NODE_ID, volume_capability=mount
        )
        await c.call(
            "NodeStageVolume", volume_id=vid, staging_target_path="/s", volume_capability=mount
        )
        await c.call(
            "NodePublishVolume",
            volume_id=vid,
            staging_target_path="/s",
            target_path=target,
            volume_capability=mount,
        )
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await c.call("NodeUnpublishVolume", volume_id=vid, target_path=target)
        assert gone.value.code() == Code.NOT_FOUND
        assert not handle.plugin.backend.node_publications(vid)
        await c.call("NodeUnstageVolume", volume_id=vid, staging_target_path="/s")


def test_knob_validation() -> None:
    with pytest.raises(ConfigError, match=r"not a method of csi\.v1"):
        FakeKnobs(delays={"DriverGetInfo": 1}).checked("csi.v1")
    with pytest.raises(ConfigError, match=">= 0"):
        FakeKnobs(delays={"Probe": -1}).checked("csi.v1")
    with pytest.raises(ConfigError, match="OK"):
        FakeKnobs(failures={"Probe": FailureRule(Code.OK)}).checked("csi.v1")
    with pytest.raises(ConfigError, match=">= 1"):
        FakeKnobs(failures={"Probe": FailureRule(Code.ABORTED, 0)}).checked("csi.v1")
    with pytest.raises(ConfigError, match="unknown misbehaviour"):
        FakeKnobs(misbehave={"nonsense"}).checked("csi.v1")
    with pytest.raises(ConfigError, match="does not apply to cosi"):
        FakeKnobs(misbehave={"create-volume-no-id"}).checked("cosi.v1alpha1")
    with pytest.raises(ConfigError, match="empty"):
        FakeKnobs(plugin_name="").checked("csi.v1")
    with pytest.raises(ConfigError, match="id_bytes"):
        FakeKnobs(id_bytes=-1).checked("csi.v1")
    assert parse_status_code("not-found") is Code.NOT_FOUND
    assert parse_status_code("14") is Code.UNAVAILABLE
    for bad in ("0", "17", "OK", "BROKEN"):
        with pytest.raises(ConfigError):
            parse_status_code(bad)
    knobs = knobs_from_flags(
        "csi.v1",
        ["CreateVolume=0.5", "*=0"],
        ["DeleteVolume=aborted:3", "Controller/ListVolumes=13"],
        ["error-empty-message,error-with-details", "create-volume-no-id"],
        "x.example.com",
    )
    assert knobs.delays == {"CreateVolume": 0.5, "*": 0.0}
    assert knobs.failures["DeleteVolume"] == FailureRule(Code.ABORTED, 3)
    assert knobs.failures["ListVolumes"] == FailureRule(Code.INTERNAL, None)
    assert len(knobs.misbehave) == 3 and knobs.plugin_name == "x.example.com"
    for delay, fail in (
        (["CreateVolume"], []),
        (["CreateVolume=soon"], []),
        (["CreateVolume=nan"], []),
        ([], ["CreateVolume"]),
        ([], ["CreateVolume=ABORTED:0"]),
        ([], ["CreateVolume=ABORTED:x"]),
        ([], ["Nope=ABORTED"]),
    ):
        with pytest.raises(ConfigError):
            knobs_from_flags("csi.v1", delay, fail)


# -- observability ------------------------------------------------------------------------


@async_test
async def test_records_and_metadata(tmp_path: Path) -> None:
    async with running_fake("csi.v1", tmp_path) as (handle, c):
        vid = (await c.call("CreateVolume", name="v", volume_capabilities=[MOUNT])).volume.volume_id
        await c.call(
            "ControllerGetVolume",
            volume_id=vid,
            metadata=[("x-request-id", "abc"), ("k-bin", b"\x00")],
        )
        assert ("x-request-id", "abc") in handle.plugin.last_metadata
        assert ("k-bin", b"\x00") in handle.plugin.last_metadata
        await expect_status(c.call("ControllerGetVolume", volume_id="nope"), Code.NOT_FOUND)
        records = handle.plugin.calls
        assert [(r.method, r.key, r.code) for r in records] == [
            ("CreateVolume", "v", Code.OK),
            ("ControllerGetVolume", vid, Code.OK),
            ("ControllerGetVolume", "nope", Code.NOT_FOUND),
        ]
        assert records[1].path == "/csi.v1.Controller/ControllerGetVolume"
        assert all(r.end is not None and r.end >= r.start for r in records)
        handle.plugin.reset_records()
        assert handle.plugin.calls == [] and handle.plugin.max_overlap_per_key() == {}


@async_test
async def test_overlap_tracking(tmp_path: Path) -> None:
    knobs = FakeKnobs(delays={"ControllerGetVolume": 0.3})
    async with running_fake("csi.v1", tmp_path, knobs) as (handle, c):
        ids = [
            (await c.call("CreateVolume", name=n, volume_capabilities=[MOUNT])).volume.volume_id
            for n in ("a", "b")
        ]
        get = functools.partial(c.call, "ControllerGetVolume")
        await asyncio.gather(get(volume_id=ids[0]), get(volume_id=ids[0]), get(volume_id=ids[1]))
        overlap = handle.plugin.max_overlap_per_key()
        assert overlap[ids[0]] == 2 and overlap[ids[1]] == 1
        assert handle.plugin.max_inflight == 3
        handle.plugin.reset_records()
        for _ in range(2):
            await get(volume_id=ids[0])
        assert handle.plugin.max_overlap_per_key() == {ids[0]: 1}


# -- misbehaviour catalogue ---------------------------------------------------------------


def test_catalogue_is_documented() -> None:
    assert len(MISBEHAVIOURS) >= 20
    for entry in catalogue():
        assert entry.specs <= set(FAKE_SPECS) and entry.specs
        assert "§" in entry.section and entry.description.endswith(".")
        assert entry.requests or entry.responses or entry.error
        rpcs = {
            m.name
            for spec in entry.specs
            for served in served_specs(spec)
            for m in Registry([served]).methods(served)
        }
        for rpc in (*entry.requests, *entry.responses):
            assert rpc in rpcs, f"{entry.name}: {rpc} is no RPC of {sorted(entry.specs)}"
    for spec in FAKE_SPECS:
        assert catalogue(spec), spec
    for required in (
        "create-volume-no-id",
        "plugin-name-invalid",
        "plugin-name-too-long",
        "vendor-version-empty",
        "string-too-long",
        "error-empty-message",
        "error-with-details",
        "unimplemented-advertised",
        "create-volume-capacity-out-of-range",
        "create-volume-content-source-dropped",
        "list-exceeds-max-entries",
        "validate-confirms-unrequested",
        "snapshot-source-mismatch",
        "topology-without-capability",
        "create-volume-not-idempotent",
        "bucket-id-empty",
        "machine-no-provider-id",
    ):
        assert required in MISBEHAVIOURS


@pytest.mark.parametrize("spec", list(INFO_RPC))
@async_test
async def test_identity_misbehaviours(tmp_path: Path, spec: str) -> None:
    async with running_fake(spec, tmp_path) as (handle, c):
        rpc = INFO_RPC[spec]
        good = await c.call(rpc)
        knobs = handle.plugin.knobs
        knobs.misbehave = {"plugin-name-invalid"}
        assert (await c.call(rpc)).name == "-Fake_Plugin!"
        knobs.misbehave = {"plugin-name-too-long"}
        assert len((await c.call(rpc)).name) > 63
        knobs.misbehave = set()
        knobs.plugin_name = "other.example.io"
        assert (await c.call(rpc)).name == "other.example.io"
        if not spec.startswith("cosi."):
            version = "version" if spec == "cmi.v1" else "vendor_version"
            assert getattr(good, version)
            knobs.misbehave = {"vendor-version-empty"}
            assert getattr(await c.call(rpc), version) == ""
            knobs.misbehave = {"string-too-long"}
            assert len(getattr(await c.call(rpc), version).encode()) > 128


@pytest.mark.parametrize(
    ("spec", "failing", "unimplemented"),
    [
        ("csi.v1", ("ControllerGetVolume", {}), "ListVolumes"),
        ("csi.v0", ("DeleteVolume", {}), "ListVolumes"),
        ("cosi.v1alpha1", ("DriverDeleteBucket", {}), "DriverCreateBucket"),
        ("cmi.v1", ("CreateMachine", {}), "GetMachineStatus"),
    ],
)
@async_test
async def test_error_misbehaviours(
    tmp_path: Path, spec: str, failing: tuple[str, dict[str, Any]], unimplemented: str
) -> None:
    async with running_fake(spec, tmp_path) as (handle, c):
        rpc, fields = failing
        natural = await expect_status(c.call(rpc, **fields), Code.INVALID_ARGUMENT)
        handle.plugin.knobs.misbehave = {"error-empty-message"}
        with pytest.raises(grpc.aio.AioRpcError) as empty:
            await c.call(rpc, **fields)
        assert empty.value.code() == natural.code() and not empty.value.details()
        handle.plugin.knobs.misbehave = {"error-with-details"}
        with pytest.raises(grpc.aio.AioRpcError) as detailed:
            await c.call(rpc, **fields)
        trailing = dict(detailed.value.trailing_metadata() or ())
        blob = trailing[STATUS_DETAILS_KEY]
        assert blob == status_details_bytes(natural.code(), natural.details() or "")
        assert blob[:2] == bytes([0x08, natural.code().value[0]])  # google.rpc.Status.code
        handle.plugin.knobs.misbehave = {"unimplemented-advertised"}
        with pytest.raises(grpc.aio.AioRpcError) as unimpl:
            await c.call(unimplemented)
        assert unimpl.value.code() == Code.UNIMPLEMENTED and unimpl.value.details()
        handle.plugin.knobs.misbehave = {"no-such-breach"}  # a typo made while running
        await expect_status(c.call(unimplemented), Code.INTERNAL, contains="no-such-breach")


# -- csi.v0 -------------------------------------------------------------------------------


@async_test
async def test_csi_v0_lifecycle(tmp_path: Path) -> None:
    async with running_fake("csi.v0", tmp_path) as (handle, c):
        assert (await c.call("GetPluginInfo")).vendor_version
        assert len((await c.call("GetPluginCapabilities")).capabilities) == 2
        assert len((await c.call("ControllerGetCapabilities")).capabilities) == 6
        assert (await c.call("NodeGetId")).node_id == NODE_ID
        cv = functools.partial(c.call, "CreateVolume", volume_capabilities=[MOUNT])
        vol = (await cv(name="a", capacity_range={"required_bytes": 1 << 20})).volume
        assert vol.id and vol.capacity_bytes == 1 << 20 and vol.attributes
        assert (await cv(name="a", capacity_range={"required_bytes": 1 << 20})).volume == vol
        await expect_status(
            cv(name="a", capacity_range={"required_bytes": 2 << 20}), Code.ALREADY_EXISTS
        )
        await expect_status(cv(), Code.INVALID_ARGUMENT)
        ok = await c.call(
            "ValidateVolumeCapabilities", volume_id=vol.id, volume_capabilities=[MOUNT]
        )
        assert ok.supported
        multi = {"mount": {}, "access_mode": {"mode": "MULTI_NODE_MULTI_WRITER"}}
        no = await c.call(
            "ValidateVolumeCapabilities", volume_id=vol.id, volume_capabilities=[multi]
        )
        assert not no.supported and no.message
        snap = (await c.call("CreateSnapshot", name="s", source_volume_id=vol.id)).snapshot
        assert snap.id and snap.created_at > 0 and snap.status.type == 1  # READY
        restored = (await cv(name="r", volume_content_source={"snapshot": {"id": snap.id}})).volume
        assert restored.content_source.snapshot.id == snap.id
        page = await c.call("ListVolumes", max_entries=1)
        assert len(page.entries) == 1 and page.next_token
        rest = await c.call("ListVolumes", starting_token=page.next_token)
        assert len(rest.entries) == 1
        assert len((await c.call("ListSnapshots", source_volume_id=vol.id)).entries) == 1
        assert (await c.call("GetCapacity")).available_capacity > 0

        pub = await c.call(
            "ControllerPublishVolume", volume_id=vol.id, node_id=NODE_ID, volume_capability=MOUNT
        )
        stage, target = str(tmp_path / "stage"), str(tmp_path / "target")
        await c.call(
            "NodeStageVolume",
            volume_id=vol.id,
            staging_target_path=stage,
            volume_capability=MOUNT,
            publish_info=dict(pub.publish_info),
        )
        await c.call(
            "NodePublishVolume",
            volume_id=vol.id,
            staging_target_path=stage,
            target_path=target,
            volume_capability=MOUNT,
        )
        await expect_status(c.call("DeleteVolume", volume_id=vol.id), Code.FAILED_PRECONDITION)
        await c.call("NodeUnpublishVolume", volume_id=vol.id, target_path=target)
        await c.call("NodeUnstageVolume", volume_id=vol.id, staging_target_path=stage)
        await c.call("ControllerUnpublishVolume", volume_id=vol.id, node_id=NODE_ID)
        await c.call("DeleteSnapshot", snapshot_id=snap.id)
        for _ in range(2):
            await c.call("DeleteVolume", volume_id=vol.id)
        assert max(handle.plugin.max_overlap_per_key().values()) == 1


@async_test
async def test_csi_v0_misbehaviours(tmp_path: Path) -> None:
    knobs = FakeKnobs(
        misbehave={"create-volume-no-id", "snapshot-no-creation-time", "node-info-no-node-id"}
    )
    async with running_fake("csi.v0", tmp_path, knobs) as (handle, c):
        vol = (await c.call("CreateVolume", name="a", volume_capabilities=[MOUNT])).volume
        assert vol.id == ""
        real_id = next(iter(handle.plugin.backend.volumes))
        snap = (await c.call("CreateSnapshot", name="s", source_volume_id=real_id)).snapshot
        assert snap.created_at == 0
        assert (await c.call("NodeGetId")).node_id == ""
        assert (await c.call("NodeGetInfo")).node_id == ""


# -- COSI ---------------------------------------------------------------------------------


@async_test
async def test_cosi_lifecycle(tmp_path: Path) -> None:
    async with running_fake("cosi.v1alpha1", tmp_path) as (handle, c):
        created = await c.call("DriverCreateBucket", name="photos", parameters={"region": "eu-1"})
        assert created.bucket_id and created.bucket_info.s3.region == "eu-1"
        again = await c.call("DriverCreateBucket", name="photos", parameters={"region": "eu-1"})
        assert again == created
        bid = created.bucket_id
        grant = functools.partial(c.call, "DriverGrantBucketAccess", bucket_id=bid)
        access = await grant(name="app", authentication_type="Key")
        creds = access.credentials["s3"].secrets
        assert access.account_id and creds["accessKeyID"] and creds["accessSecretKey"]
        assert (await grant(name="app", authentication_type="Key")) == access
        iam = await grant(name="other", authentication_type="IAM")
        assert "accessSecretKey" not in iam.credentials["s3"].secrets
        assert iam.account_id != access.account_id
        for _ in range(2):
            await c.call("DriverRevokeBucketAccess", bucket_id=bid, account_id=access.account_id)
        fresh = await grant(name="app", authentication_type="Key")
        assert fresh.account_id != access.account_id
        gcs = await c.call("DriverCreateBucket", name="logs", parameters={"protocol": "gcs"})
        assert gcs.bucket_info.WhichOneof("type") == "gcs"
        gcs_access = await c.call(
            "DriverGrantBucketAccess",
            bucket_id=gcs.bucket_id,
            name="reader",
            authentication_type="Key",
        )
        assert "gcs" in gcs_access.credentials
        for _ in range(2):
            await c.call("DriverDeleteBucket", bucket_id=bid)
        assert bid not in handle.plugin.buckets and handle.plugin.buckets[gcs.bucket_id].accounts


@async_test
async def test_cosi_errors(tmp_path: Path) -> None:
    async with running_fake("cosi.v1alpha1", tmp_path) as (_, c):
        cb = functools.partial(c.call, "DriverCreateBucket")
        await expect_status(cb(), Code.INVALID_ARGUMENT)
        for bad in ("Upper", "a", "-start", "end-", "dots..dots", "x" * 64):
            await expect_status(cb(name=bad), Code.INVALID_ARGUMENT, contains="bucket name")
        await expect_status(cb(name="bk1", parameters={"protocol": "ftp"}), Code.INVALID_ARGUMENT)
        await expect_status(cb(name="bk1", parameters={"quotaGiB": "0"}), Code.OUT_OF_RANGE)
        await expect_status(cb(name="bk1", parameters={"quotaGiB": "lots"}), Code.INVALID_ARGUMENT)
        bid = (await cb(name="bk1", parameters={"quotaGiB": "10"})).bucket_id
        await expect_status(cb(name="bk1"), Code.ALREADY_EXISTS)
        await expect_status(c.call("DriverDeleteBucket"), Code.INVALID_ARGUMENT)
        gr = functools.partial(c.call, "DriverGrantBucketAccess")
        await expect_status(gr(name="a", authentication_type="Key"), Code.INVALID_ARGUMENT)
        await expect_status(gr(bucket_id=bid, authentication_type="Key"), Code.INVALID_ARGUMENT)
        await expect_status(gr(bucket_id=bid, name="a"), Code.INVALID_ARGUMENT)
        await expect_status(
            gr(bucket_id="nope", name="a", authentication_type="Key"), Code.NOT_FOUND
        )
        await gr(bucket_id=bid, name="a", authentication_type="Key")
        await expect_status(
            gr(bucket_id=bid, name="a", authentication_type="IAM"), Code.ALREADY_EXISTS
        )
        rv = functools.partial(c.call, "DriverRevokeBucketAccess")
        await expect_status(rv(bucket_id=bid), Code.INVALID_ARGUMENT)
        await expect_status(rv(account_id="x"), Code.INVALID_ARGUMENT)
        await rv(bucket_id=bid, account_id="unknown")


@async_test
async def test_cosi_misbehaviours(tmp_path: Path) -> None:
    knobs = FakeKnobs(
        misbehave={
            "bucket-id-empty",
            "grant-no-account-id",
            "grant-no-credentials",
            "string-too-long",
        }
    )
    async with running_fake("cosi.v1alpha1", tmp_path, knobs) as (handle, c):
        created = await c.call("DriverCreateBucket", name="bk1")
        assert created.bucket_id == "" and len(created.bucket_info.s3.region) > 128
        real_id = next(iter(handle.plugin.buckets))
        access = await c.call(
            "DriverGrantBucketAccess", bucket_id=real_id, name="a", authentication_type="Key"
        )
        assert access.account_id == "" and not access.credentials


# -- COSI v1alpha2 --------------------------------------------------------------------------

S3 = {"type": "S3"}
KEY = {"type": "KEY"}


def v2_grant(name: str, protocol: str, *bucket_ids: str, **extra: Any) -> dict[str, Any]:
    return {
        "account_name": name,
        "protocol": {"type": protocol},
        "authentication_type": KEY,
        "buckets": [{"bucket_id": b, "access_mode": {"mode": "READ_WRITE"}} for b in bucket_ids],
        **extra,
    }


@async_test
async def test_cosi_v1alpha2_lifecycle(tmp_path: Path) -> None:
    async with running_fake("cosi.v1alpha2", tmp_path) as (handle, c):
        info = await c.call("DriverGetInfo")
        assert [p.type for p in info.supported_protocols] == [1, 2, 3]  # S3, AZURE, GCS
        create = functools.partial(c.call, "DriverCreateBucket", protocols=[S3])
        bucket = await create(name="photos", parameters={"quotaGiB": "10"})
        assert (await create(name="photos", parameters={"quotaGiB": "10"})) == bucket
        assert [bucket.protocols.HasField(m) for m in ("s3", "azure", "gcs")] == [True] * 3
        static = await c.call("DriverGetExistingBucket", existing_bucket_id="static-archive")
        assert static.bucket_id == "static-archive" and static.protocols.s3.endpoint
        grant = functools.partial(c.call, "DriverGrantBucketAccess")
        both = v2_grant("ba-1", "S3", bucket.bucket_id, static.bucket_id)
        access = await grant(**both)
        assert [b.bucket_id for b in access.buckets] == [bucket.bucket_id, "static-archive"]
        assert all(b.bucket_info.HasField("s3") for b in access.buckets)
        assert access.credentials.s3.access_secret_key and not access.credentials.HasField("gcs")
        assert (await grant(**both)) == access  # the same access again
        azure = await grant(**v2_grant("ba-2", "AZURE", bucket.bucket_id))
        assert azure.credentials.azure.access_token.startswith("sv=")
        gcs = await grant(**v2_grant("ba-3", "GCS", bucket.bucket_id))
        assert gcs.credentials.gcs.access_secret and gcs.buckets[0].bucket_info.HasField("gcs")
        sa = await grant(
            **v2_grant(
                "ba-4",
                "S3",
                bucket.bucket_id,
                authentication_type={"type": "SERVICE_ACCOUNT"},
                service_account_name="app",
            )
        )
        assert sa.HasField("credentials") and not sa.credentials.HasField("s3")
        revoke = {"account_id": access.account_id, "buckets": [{"bucket_id": bucket.bucket_id}]}
        for _ in range(2):
            await c.call("DriverRevokeBucketAccess", **revoke)
        assert access.account_id not in handle.plugin.accesses
        for _ in range(2):
            await c.call("DriverDeleteBucket", bucket_id=bucket.bucket_id)
        assert bucket.bucket_id not in handle.plugin.buckets
        assert not handle.plugin.accesses  # the bucket's other accesses went with it


@async_test
async def test_cosi_v1alpha2_errors(tmp_path: Path) -> None:
    async with running_fake("cosi.v1alpha2", tmp_path) as (_, c):
        cb = functools.partial(c.call, "DriverCreateBucket")
        await expect_status(cb(), Code.INVALID_ARGUMENT)
        await expect_status(cb(name="Upper"), Code.INVALID_ARGUMENT, contains="bucket name")
        await expect_status(cb(name="bk1", protocols=[{"type": 0}]), Code.INVALID_ARGUMENT)
        await expect_status(cb(name="bk1", parameters={"quotaGiB": "0"}), Code.OUT_OF_RANGE)
        bid = (await cb(name="bk1")).bucket_id
        await expect_status(cb(name="bk1", parameters={"a": "b"}), Code.ALREADY_EXISTS)
        get = functools.partial(c.call, "DriverGetExistingBucket")
        await expect_status(get(existing_bucket_id="legacy-7"), Code.NOT_FOUND)
        await expect_status(get(existing_bucket_id="static/7"), Code.INVALID_ARGUMENT)
        gr = functools.partial(c.call, "DriverGrantBucketAccess")
        await expect_status(gr(**v2_grant("ba-1", "UNKNOWN", bid)), Code.INVALID_ARGUMENT)
        await expect_status(gr(**v2_grant("ba-1", "S3")), Code.INVALID_ARGUMENT)
        await expect_status(gr(**v2_grant("ba-1", "S3", "nope")), Code.NOT_FOUND)
        sa = v2_grant("ba-1", "S3", bid, authentication_type={"type": "SERVICE_ACCOUNT"})
        await expect_status(gr(**sa), Code.INVALID_ARGUMENT, contains="service_account_name")
        await gr(**v2_grant("ba-1", "S3", bid))
        await expect_status(
            gr(**v2_grant("ba-1", "S3", bid, parameters={"role": "admin"})), Code.ALREADY_EXISTS
        )
        await expect_status(c.call("DriverRevokeBucketAccess"), Code.INVALID_ARGUMENT)


@async_test
async def test_cosi_v1alpha2_misbehaviours(tmp_path: Path) -> None:
    knobs = FakeKnobs(
        misbehave={
            "cosi-protocol-dropped",
            "cosi-bucket-id-underscore",
            "cosi-grant-bucket-left-out",
            "cosi-grant-other-protocol",
            "cosi-key-credentials-empty",
            "cosi-delete-not-found",
            "cosi-revoke-not-found",
        }
    )
    async with running_fake("cosi.v1alpha2", tmp_path, knobs) as (handle, c):
        created = await c.call("DriverCreateBucket", name="bk1", protocols=[{"type": "GCS"}])
        assert created.bucket_id == "bucket_000001" and not created.protocols.HasField("gcs")
        real = "bucket-000001"
        assert real in handle.plugin.buckets
        access = await c.call("DriverGrantBucketAccess", **v2_grant("a1", "S3", real, real))
        assert len(access.buckets) == 1
        assert access.buckets[0].bucket_info.HasField("azure")  # S3 was asked for
        assert not access.buckets[0].bucket_info.HasField("s3")
        assert access.credentials.HasField("s3") and not access.credentials.s3.access_key_id
        await expect_status(c.call("DriverDeleteBucket", bucket_id="gone"), Code.NOT_FOUND)
        await c.call("DriverDeleteBucket", bucket_id=real)
        await expect_status(
            c.call("DriverRevokeBucketAccess", account_id="gone", buckets=[{"bucket_id": real}]),
            Code.NOT_FOUND,
        )


# -- CMI ----------------------------------------------------------------------------------


@async_test
async def test_cmi_lifecycle(tmp_path: Path) -> None:
    async with running_fake("cmi.v1", tmp_path) as (_, c):
        caps = await c.call("GetPluginCapabilities")
        assert len(caps.capabilities) == 6
        spec = {"ProviderSpec": MACHINE_SPEC}
        created = await c.call("CreateMachine", MachineName="m1", Secrets={"k": b"v"}, **spec)
        assert created.ProviderID.startswith("fake://c1/") and created.NodeName == "m1"
        assert json.loads(created.LastKnownState)["state"] == "Running"
        again = await c.call("CreateMachine", MachineName="m1", **spec)
        assert again.ProviderID == created.ProviderID
        status = await c.call("GetMachineStatus", MachineName="m1", **spec)
        assert (status.ProviderID, status.NodeName) == (created.ProviderID, "m1")
        listed = await c.call("ListMachines", **spec)
        assert dict(listed.MachineList) == {created.ProviderID: "m1"}
        other_cluster = json.dumps(
            {"vmPool": "p", "size": "small", "tags": {"kubernetes.io/cluster": "c2"}}
        ).encode()
        assert not (await c.call("ListMachines", ProviderSpec=other_cluster)).MachineList
        await expect_status(
            c.call("GetMachineStatus", MachineName="m1", ProviderSpec=other_cluster),
            Code.NOT_FOUND,
        )
        down = await c.call("ShutDownMachine", MachineName="m1", **spec)
        assert json.loads(down.LastKnownState)["state"] == "Stopped"
        await c.call("ShutDownMachine", MachineName="absent", **spec)
        for _ in range(2):
            await c.call("DeleteMachine", MachineName="m1", **spec)
        await expect_status(c.call("GetMachineStatus", MachineName="m1", **spec), Code.NOT_FOUND)
        pvs = [
            {"spec": {"csi": {"driver": "d", "volumeHandle": "vol-1"}}},
            {"awsElasticBlockStore": {"volumeID": "aws-2"}},
            {"spec": {"nfs": {"server": "x"}}},
        ]
        ids = await c.call("GetVolumeIDs", PVSpecList=json.dumps(pvs).encode())
        assert list(ids.VolumeIDs) == ["vol-1", "aws-2"]


@async_test
async def test_cmi_errors(tmp_path: Path) -> None:
    async with running_fake("cmi.v1", tmp_path) as (_, c):
        cm = functools.partial(c.call, "CreateMachine")
        await expect_status(cm(ProviderSpec=MACHINE_SPEC), Code.INVALID_ARGUMENT)
        await expect_status(cm(MachineName="m"), Code.INVALID_ARGUMENT)
        await expect_status(cm(MachineName="m", ProviderSpec=b"{"), Code.INVALID_ARGUMENT)
        await expect_status(cm(MachineName="m", ProviderSpec=b"[]"), Code.INVALID_ARGUMENT)
        no_tags = json.dumps({"vmPool": "p", "size": "small"}).encode()
        await expect_status(cm(MachineName="m", ProviderSpec=no_tags), Code.INVALID_ARGUMENT)
        huge = json.dumps({"vmPool": "p", "size": "galactic", "tags": {}}).encode()
        await expect_status(cm(MachineName="m", ProviderSpec=huge), Code.OUT_OF_RANGE)
        root = json.dumps({"vmPool": "p", "size": "small", "tags": {}, "rootFsSize": 0}).encode()
        await expect_status(cm(MachineName="m", ProviderSpec=root), Code.OUT_OF_RANGE)
        await cm(MachineName="m", ProviderSpec=MACHINE_SPEC)
        other = json.dumps({"vmPool": "p", "size": "large", "tags": {}}).encode()
        await expect_status(cm(MachineName="m", ProviderSpec=other), Code.ALREADY_EXISTS)
        await expect_status(c.call("DeleteMachine", MachineName="m"), Code.INVALID_ARGUMENT)
        await expect_status(c.call("ListMachines"), Code.INVALID_ARGUMENT)
        await expect_status(c.call("GetVolumeIDs"), Code.INVALID_ARGUMENT)
        await expect_status(c.call("GetVolumeIDs", PVSpecList=b"{}"), Code.INVALID_ARGUMENT)


@async_test
async def test_cmi_misbehaviours(tmp_path: Path) -> None:
    knobs = FakeKnobs(
        misbehave={
            "machine-no-provider-id",
            "machine-no-node-name",
            "cmi-create-capability-missing",
        }
    )
    async with running_fake("cmi.v1", tmp_path, knobs) as (_, c):
        created = await c.call("CreateMachine", MachineName="m", ProviderSpec=MACHINE_SPEC)
        assert created.ProviderID == "" and created.NodeName == ""
        status = await c.call("GetMachineStatus", MachineName="m", ProviderSpec=MACHINE_SPEC)
        assert status.ProviderID == "" and status.NodeName == ""
        caps = await c.call("GetPluginCapabilities")
        assert len(caps.capabilities) == 5 and all(x.rpc.type != 1 for x in caps.capabilities)


# -- CLI ----------------------------------------------------------------------------------


def _namespace(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    fake_cli.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--spec is required"),
        (["--spec", "csi.v2", "--listen", "unix:///tmp/x.sock"], "choose one of"),
        (["--spec", "csi.v1"], "--listen is required"),
        (["--spec", "csi.v1", "--listen", "unix:///x", "--fail", "Probe=BROKEN"], "BROKEN"),
        (["--spec", "csi.v1", "--listen", "unix:///x", "--delay", "Probe=-1"], ">= 0"),
        (["--spec", "cmi.v1", "--listen", "unix:///x", "--misbehave", "bucket-id-empty"], "cmi"),
        (["--spec", "csi.v1", "--listen", "relative.sock"], "unsupported scheme"),
    ],
)
def test_cli_config_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        asyncio.run(fake_cli.run(_namespace(argv)))


def test_cli_main_exit_code_and_listing(capsys: pytest.CaptureFixture[str]) -> None:
    assert fake_cli.main(["--spec", "csi.v1", "--listen", "unix:///x", "--fail", "X=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a method of csi.v1" in err
    assert fake_cli.main(["--spec", "cosi.v1alpha1", "--list-misbehaviours"]) == 0
    out = capsys.readouterr().out
    assert "bucket-id-empty" in out and "create-volume-no-id" not in out


def test_cli_serves_until_sigterm(tmp_path: Path) -> None:
    sock = tmp_path / "cli.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "plugproxy.fakes.cli",
            "--spec",
            "csi.v1",
            "--listen",
            f"unix://{sock}",
            "--fail",
            "Probe=UNAVAILABLE:1",
            "--misbehave",
            "plugin-name-invalid",
            "--delay",
            "NodeGetInfo=0.01",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line == f"fake csi.v1 plugin listening on unix://{sock}\n"

        async def talk() -> None:
            async with SpecClient(f"unix:{sock}", "csi.v1") as c:
                await expect_status(c.call("Probe"), Code.UNAVAILABLE)
                await c.call("Probe")
                assert (await c.call("GetPluginInfo")).name == "-Fake_Plugin!"

        asyncio.run(talk())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert not sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
