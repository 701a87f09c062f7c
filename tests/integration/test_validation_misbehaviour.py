"""Each deliberate breach of the fake plugins shows up under the right rule, method and party."""

from __future__ import annotations

import grpc
import pytest

from plugproxy.fakes import FakeKnobs, SpecClient, catalogue
from plugproxy.spec.registry import Registry
from tests.integration.test_validation_lifecycle import (
    PROVIDER_SPEC,
    mount_cap,
    stage_of,
    through_proxy,
)


async def ignore_errors(coro):
    try:
        return await coro
    except grpc.aio.AioRpcError:
        return None


async def create(c: SpecClient, name: str = "pvc-1", **extra):
    return await c.call("CreateVolume", name=name, volume_capabilities=[mount_cap(c)], **extra)


def vid(c: SpecClient, volume) -> str:
    return volume.volume_id if c.spec.name == "csi.v1" else volume.id


async def csi_create(c):
    await create(c, capacity_range={"required_bytes": 1 << 30, "limit_bytes": 2 << 30})


async def csi_create_twice(c):
    await create(c)
    await create(c)


async def csi_from_snapshot(c):
    v = (await create(c)).volume
    s = (await c.call("CreateSnapshot", name="s1", source_volume_id=vid(c, v))).snapshot
    await create(c, "pvc-2", volume_content_source={"snapshot": {"snapshot_id": s.snapshot_id}})


async def csi_topology(c):
    await c.call("GetPluginCapabilities")
    await create(c)


async def csi_info(c):
    await c.call("GetPluginInfo")


async def csi_bad_delete(c):
    await ignore_errors(c.call("DeleteVolume", volume_id=""))


async def csi_list_unimplemented(c):
    await c.call("ControllerGetCapabilities")
    await ignore_errors(c.call("ListVolumes"))


async def csi_list(c):
    await create(c, "a")
    await create(c, "b")
    await c.call("ListVolumes", max_entries=1)
    await c.call(
        "CreateSnapshot", name="s1", source_volume_id=vid(c, (await create(c, "a")).volume)
    )
    await c.call(
        "CreateSnapshot", name="s2", source_volume_id=vid(c, (await create(c, "b")).volume)
    )
    await c.call("ListSnapshots", max_entries=1)


async def csi_validate(c):
    v = (await create(c)).volume
    await c.call(
        "ValidateVolumeCapabilities", volume_id=vid(c, v), volume_capabilities=[mount_cap(c)]
    )


async def csi_snapshot(c):
    v = (await create(c)).volume
    await c.call("CreateSnapshot", name="s1", source_volume_id=vid(c, v))


async def csi_node_info(c):
    await c.call("NodeGetInfo")


async def csi_capacity(c):
    await c.call("GetCapacity")


async def csi_metadata(c):
    v = (await create(c, capacity_range={"required_bytes": 1 << 30})).volume
    s = (await c.call("CreateSnapshot", name="s1", source_volume_id=v.volume_id)).snapshot
    await c.stream(
        "GetMetadataAllocated", snapshot_id=s.snapshot_id, starting_offset=256 << 20, max_results=1
    )


async def cosi_info(c):
    await c.call("DriverGetInfo")


async def cosi_create(c):
    await c.call("DriverCreateBucket", name="bucket-1")


async def cosi_bad_delete(c):
    await ignore_errors(c.call("DriverDeleteBucket", bucket_id=""))


async def cosi_bad_create(c):
    await ignore_errors(c.call("DriverCreateBucket", name="bucket-1"))


async def cosi_grant(c):
    b = await c.call("DriverCreateBucket", name="bucket-1")
    await ignore_errors(
        c.call(
            "DriverGrantBucketAccess", bucket_id=b.bucket_id, name="a1", authentication_type="Key"
        )
    )


V2_S3 = {"type": "S3"}


async def cosi2_create(c, **extra):
    return await c.call("DriverCreateBucket", name="bucket-1", protocols=[V2_S3], **extra)


async def cosi2_grant_two(c):
    made = await cosi2_create(c)
    static = await c.call("DriverGetExistingBucket", existing_bucket_id="static-archive")
    await c.call(
        "DriverGrantBucketAccess",
        account_name="ba-1",
        protocol=V2_S3,
        authentication_type={"type": "KEY"},
        buckets=[
            {"bucket_id": made.bucket_id, "access_mode": {"mode": "READ_WRITE"}},
            {"bucket_id": static.bucket_id, "access_mode": {"mode": "READ_ONLY"}},
        ],
    )


async def cosi2_gone(c):
    await ignore_errors(c.call("DriverDeleteBucket", bucket_id="bucket-gone"))
    await ignore_errors(
        c.call(
            "DriverRevokeBucketAccess",
            account_id="account-gone",
            protocol=V2_S3,
            authentication_type={"type": "KEY"},
            buckets=[{"bucket_id": "bucket-gone"}],
        )
    )


async def cmi_info(c):
    await c.call("GetPluginInfo")


async def cmi_bad_create(c):
    await ignore_errors(c.call("CreateMachine", MachineName="", ProviderSpec=PROVIDER_SPEC))


async def cmi_status(c):
    await c.call("GetPluginCapabilities")
    await c.call("CreateMachine", MachineName="m1", ProviderSpec=PROVIDER_SPEC)
    await ignore_errors(c.call("GetMachineStatus", MachineName="m1", ProviderSpec=PROVIDER_SPEC))


async def cmi_caps(c):
    await c.call("GetPluginCapabilities")


# (misbehaviour, spec, scenario, rule, rpc)
CASES = [
    ("create-volume-no-id", "csi.v1", csi_create, "csi.required-field", "CreateVolume"),
    ("create-volume-no-id", "csi.v0", csi_create, "csi.required-field", "CreateVolume"),
    ("create-volume-negative-capacity", "csi.v1", csi_create, "csi.negative-value", "CreateVolume"),
    (
        "create-volume-capacity-out-of-range",
        "csi.v1",
        csi_create,
        "csi.capacity-out-of-range",
        "CreateVolume",
    ),
    (
        "create-volume-content-source-dropped",
        "csi.v1",
        csi_from_snapshot,
        "csi.content-source-not-echoed",
        "CreateVolume",
    ),
    (
        "create-volume-not-idempotent",
        "csi.v1",
        csi_create_twice,
        "csi.create-not-idempotent",
        "CreateVolume",
    ),
    (
        "topology-without-capability",
        "csi.v1",
        csi_topology,
        "csi.topology-without-capability",
        "CreateVolume",
    ),
    ("plugin-name-invalid", "csi.v1", csi_info, "csi.plugin-name-format", "GetPluginInfo"),
    ("plugin-name-too-long", "csi.v0", csi_info, "csi.plugin-name-format", "GetPluginInfo"),
    ("vendor-version-empty", "csi.v1", csi_info, "csi.required-field", "GetPluginInfo"),
    ("string-too-long", "csi.v1", csi_info, "csi.size-limit", "GetPluginInfo"),
    ("error-empty-message", "csi.v1", csi_bad_delete, "csi.error-message-empty", "DeleteVolume"),
    ("error-with-details", "csi.v1", csi_bad_delete, "csi.status-details-nonempty", "DeleteVolume"),
    (
        "unimplemented-advertised",
        "csi.v1",
        csi_list_unimplemented,
        "csi.unimplemented-advertised",
        "ListVolumes",
    ),
    ("list-exceeds-max-entries", "csi.v1", csi_list, "csi.list-max-entries", "ListVolumes"),
    ("list-exceeds-max-entries", "csi.v0", csi_list, "csi.list-max-entries", "ListSnapshots"),
    (
        "validate-confirms-unrequested",
        "csi.v1",
        csi_validate,
        "csi.validate-confirmed-mismatch",
        "ValidateVolumeCapabilities",
    ),
    (
        "snapshot-source-mismatch",
        "csi.v1",
        csi_snapshot,
        "csi.snapshot-source-mismatch",
        "CreateSnapshot",
    ),
    ("snapshot-no-creation-time", "csi.v1", csi_snapshot, "csi.required-field", "CreateSnapshot"),
    ("snapshot-no-creation-time", "csi.v0", csi_snapshot, "csi.required-field", "CreateSnapshot"),
    ("node-info-no-node-id", "csi.v1", csi_node_info, "csi.required-field", "NodeGetInfo"),
    ("get-capacity-negative", "csi.v1", csi_capacity, "csi.negative-value", "GetCapacity"),
    (
        "metadata-offset-ignored",
        "csi.v1",
        csi_metadata,
        "csi.metadata-offset",
        "GetMetadataAllocated",
    ),
    (
        "metadata-exceeds-max-results",
        "csi.v1",
        csi_metadata,
        "csi.metadata-max-results",
        "GetMetadataAllocated",
    ),
    ("plugin-name-invalid", "cosi.v1alpha1", cosi_info, "cosi.plugin-name-format", "DriverGetInfo"),
    (
        "plugin-name-too-long",
        "cosi.v1alpha1",
        cosi_info,
        "cosi.plugin-name-format",
        "DriverGetInfo",
    ),
    ("string-too-long", "cosi.v1alpha1", cosi_create, "cosi.size-limit", "DriverCreateBucket"),
    (
        "error-empty-message",
        "cosi.v1alpha1",
        cosi_bad_delete,
        "cosi.error-message-empty",
        "DriverDeleteBucket",
    ),
    (
        "error-with-details",
        "cosi.v1alpha1",
        cosi_bad_delete,
        "cosi.status-details-nonempty",
        "DriverDeleteBucket",
    ),
    (
        "unimplemented-advertised",
        "cosi.v1alpha1",
        cosi_bad_create,
        "cosi.unimplemented-advertised",
        "DriverCreateBucket",
    ),
    ("bucket-id-empty", "cosi.v1alpha1", cosi_create, "cosi.bucket-id-empty", "DriverCreateBucket"),
    (
        "grant-no-account-id",
        "cosi.v1alpha1",
        cosi_grant,
        "cosi.required-field",
        "DriverGrantBucketAccess",
    ),
    (
        "grant-no-credentials",
        "cosi.v1alpha1",
        cosi_grant,
        "cosi.required-field",
        "DriverGrantBucketAccess",
    ),
    ("plugin-name-invalid", "cosi.v1alpha2", cosi_info, "cosi.plugin-name-format", "DriverGetInfo"),
    (
        "unimplemented-advertised",
        "cosi.v1alpha2",
        cosi_bad_create,
        "cosi.unimplemented-advertised",
        "DriverCreateBucket",
    ),
    (
        "cosi-protocol-dropped",
        "cosi.v1alpha2",
        cosi2_create,
        "cosi.requested-protocol-missing",
        "DriverCreateBucket",
    ),
    (
        "cosi-bucket-id-underscore",
        "cosi.v1alpha2",
        cosi2_create,
        "cosi.id-format",
        "DriverCreateBucket",
    ),
    (
        "cosi-grant-bucket-left-out",
        "cosi.v1alpha2",
        cosi2_grant_two,
        "cosi.grant-bucket-not-answered",
        "DriverGrantBucketAccess",
    ),
    (
        "cosi-grant-other-protocol",
        "cosi.v1alpha2",
        cosi2_grant_two,
        "cosi.grant-protocol-mismatch",
        "DriverGrantBucketAccess",
    ),
    (
        "cosi-key-credentials-empty",
        "cosi.v1alpha2",
        cosi2_grant_two,
        "cosi.key-credentials-missing",
        "DriverGrantBucketAccess",
    ),
    (
        "cosi-delete-not-found",
        "cosi.v1alpha2",
        cosi2_gone,
        "cosi.deleted-bucket-not-ok",
        "DriverDeleteBucket",
    ),
    (
        "cosi-revoke-not-found",
        "cosi.v1alpha2",
        cosi2_gone,
        "cosi.revoked-access-not-ok",
        "DriverRevokeBucketAccess",
    ),
    ("plugin-name-invalid", "cmi.v1", cmi_info, "cmi.plugin-name-format", "GetPluginInfo"),
    ("vendor-version-empty", "cmi.v1", cmi_info, "cmi.required-field", "GetPluginInfo"),
    ("string-too-long", "cmi.v1", cmi_info, "cmi.size-limit", "GetPluginInfo"),
    ("error-empty-message", "cmi.v1", cmi_bad_create, "cmi.error-message-empty", "CreateMachine"),
    (
        "error-with-details",
        "cmi.v1",
        cmi_bad_create,
        "cmi.status-details-nonempty",
        "CreateMachine",
    ),
    (
        "unimplemented-advertised",
        "cmi.v1",
        cmi_status,
        "cmi.unimplemented-advertised",
        "GetMachineStatus",
    ),
    ("machine-no-provider-id", "cmi.v1", cmi_status, "cmi.required-field", "CreateMachine"),
    ("machine-no-node-name", "cmi.v1", cmi_status, "cmi.required-field", "GetMachineStatus"),
    (
        "cmi-create-capability-missing",
        "cmi.v1",
        cmi_caps,
        "cmi.required-capability-missing",
        "GetPluginCapabilities",
    ),
]


async def kms_round_trip(c):
    await c.call("Status")
    enc = await c.call("Encrypt", plaintext=b"k" * 32, uid="u1")
    await ignore_errors(c.call("Decrypt", ciphertext=enc.ciphertext, key_id=enc.key_id))


async def device_updates(c, count: int = 1):
    """The first ``count`` lists of ListAndWatch (the first comes at once)."""
    info = c.method("ListAndWatch")
    call = c.channel.unary_stream(
        info.path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=info.response_class.FromString,
    )(c.new("Empty"))
    seen = 0
    async for _ in call:
        seen += 1
        if seen == count:
            call.cancel()
            break


async def device_allocation(c):
    await c.call("GetDevicePluginOptions")
    await device_updates(c, 3)
    ids = ["acc-0", "acc-1", "acc-2"]
    await c.call(
        "GetPreferredAllocation",
        container_requests=[
            {"available_deviceIDs": ids, "must_include_deviceIDs": ids[2:], "allocation_size": 2}
        ],
    )
    await c.call("Allocate", container_requests=[{"devices_ids": ids[:2]}])
    await c.call("PreStartContainer", devices_ids=ids[:2])


CASES += [
    ("kms-key-id-empty", "kms.v2", kms_round_trip, "kms.required-field", "Encrypt"),
    ("kms-version-v1", "kms.v2", kms_round_trip, "kms.version-unsupported", "Status"),
    (
        "device-health-lower-case",
        "deviceplugin.v1beta1",
        device_updates,
        "deviceplugin.device-health-value",
        "ListAndWatch",
    ),
]


DRA_CLAIMS = [{"namespace": "default", "uid": f"uid-{i}", "name": f"claim-{i}"} for i in range(2)]


async def dra_claims(c):
    """Prepare and unprepare two claims in v1, then one more in v1beta1 on the same socket."""
    await c.call("NodePrepareResources", claims=DRA_CLAIMS)
    await c.call("NodeUnprepareResources", claims=DRA_CLAIMS)
    info = Registry(["dra.v1beta1"]).lookup(
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"
    )
    stub = c.channel.unary_unary(
        info.path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=info.response_class.FromString,
    )
    await stub(info.request_class(claims=[{**DRA_CLAIMS[0], "uid": "uid-beta"}]), timeout=10)


async def dra_health_updates(c, count: int = 3):
    """The first ``count`` updates of the DRA plugin's health stream (v1)."""
    info = Registry(["drahealth.v1"]).lookup("/v1.DRAResourceHealth/NodeWatchResources")
    call = c.channel.unary_stream(
        info.path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=info.response_class.FromString,
    )(info.request_class())
    seen = 0
    async for _ in call:
        seen += 1
        if seen == count:
            call.cancel()
            break


async def dra_everything(c):
    await dra_claims(c)
    await dra_health_updates(c)


CASES += [
    ("dra-claim-left-out", "dra.v1", dra_claims, "dra.claim-not-answered", "NodePrepareResources"),
    (
        "dra-claim-not-requested",
        "dra.v1",
        dra_claims,
        "dra.claim-not-requested",
        "NodeUnprepareResources",
    ),
    ("dra-device-no-pool", "dra.v1", dra_claims, "dra.required-field", "NodePrepareResources"),
    (
        "drahealth-value-unknown",
        "dra.v1",
        dra_health_updates,
        "drahealth.health-value",
        "NodeWatchResources",
    ),
    (
        "drahealth-time-milliseconds",
        "dra.v1",
        dra_health_updates,
        "drahealth.time-not-seconds",
        "NodeWatchResources",
    ),
    (
        "drahealth-device-missing",
        "dra.v1",
        dra_health_updates,
        "drahealth.required-field",
        "NodeWatchResources",
    ),
    (
        "drahealth-device-twice",
        "dra.v1",
        dra_health_updates,
        "drahealth.device-duplicate",
        "NodeWatchResources",
    ),
]


def test_every_misbehaviour_of_the_catalogue_is_covered():
    covered = {name for name, *_ in CASES}
    assert {m.name for m in catalogue()} == covered


@pytest.mark.parametrize(
    ("name", "spec", "scenario", "rule", "rpc"),
    CASES,
    ids=[f"{c[1]}-{c[0]}" for c in CASES],
)
async def test_misbehaviour_is_reported(name, spec, scenario, rule, rpc, tmp_path):
    knobs = FakeKnobs(misbehave={name})
    async with through_proxy(spec, tmp_path, "--validation", "audit", knobs=knobs) as (c, proxy):
        await scenario(c)
        found = {
            (e["rule"], e["method"].rsplit("/", 1)[-1], e["party"])
            for e in stage_of(proxy).report.snapshot()
        }
    assert (rule, rpc, "plugin") in found, sorted(found)


async def test_clean_fake_runs_the_same_scenarios_without_plugin_violations(tmp_path):
    async with through_proxy("csi.v1", tmp_path, "--validation", "audit") as (c, proxy):
        await csi_list(c)
        await csi_validate(c)
        assert [e for e in stage_of(proxy).report.snapshot() if e["party"] == "plugin"] == []


@pytest.mark.parametrize(
    ("spec", "scenario"),
    [
        ("kms.v2", kms_round_trip),
        ("deviceplugin.v1beta1", device_allocation),
        ("dra.v1", dra_everything),
    ],
)
async def test_clean_kubernetes_plugin_fakes_draw_no_violation(spec, scenario, tmp_path):
    knobs = FakeKnobs(stream_period=0.001)
    async with through_proxy(spec, tmp_path, "--validation", "audit", knobs=knobs) as (c, proxy):
        await scenario(c)
        assert stage_of(proxy).report.snapshot() == []
        assert stage_of(proxy).report.calls_judged >= 3
