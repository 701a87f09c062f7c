"""Resource keys per spec, from the key tables and the descriptors."""

from __future__ import annotations

import pytest

from plugproxy.api import Call, LazyMessage
from plugproxy.spec.keys import KEY_TABLES, extractor, keys_of, parse_serialize_key
from plugproxy.spec.registry import Registry
from tests.support import VAULT, vault_descriptor_set

REG = Registry()


def keys_for(path: str, **fields) -> tuple[str, ...]:
    info = REG.lookup(path)
    call = Call(info, (), [], None)
    call.request = LazyMessage(info.request_class(**fields).SerializeToString(), info.request_class)
    return keys_of(call)


def test_every_table_entry_compiles_against_the_descriptors():
    for spec, table in KEY_TABLES.items():
        for method in table:
            info = next(m for m in REG.methods(spec) if m.name == method)
            assert extractor(info) is not None, (spec, method)


def test_csi_keys():
    assert keys_for("/csi.v1.Node/NodeStageVolume", volume_id="v1") == ("volume:v1",)
    assert keys_for("/csi.v1.Controller/CreateSnapshot", name="s", source_volume_id="v1") == (
        "snapshot-name:s",
        "volume:v1",
    )
    info = REG.lookup("/csi.v1.Controller/CreateVolume")
    req = info.request_class(name="pvc")
    req.volume_content_source.snapshot.snapshot_id = "snap-9"
    call = Call(info, (), [], None)
    call.request = LazyMessage(req.SerializeToString(), info.request_class)
    assert keys_of(call) == ("volume-name:pvc", "snapshot:snap-9")
    assert keys_for(
        "/csi.v1.GroupController/CreateVolumeGroupSnapshot", name="g", source_volume_ids=["a", "b"]
    ) == ("group-snapshot-name:g", "volume:a", "volume:b")
    assert keys_for("/csi.v0.Node/NodeUnstageVolume", volume_id="old") == ("volume:old",)


def test_identity_list_and_probe_calls_have_no_keys():
    for path in (
        "/csi.v1.Identity/Probe",
        "/csi.v1.Controller/ListVolumes",
        "/csi.v1.Controller/ControllerGetCapabilities",
        "/csi.v1.Node/NodeGetInfo",
        "/cmi.v1.Machine/ListMachines",
    ):
        assert keys_for(path) == ()


def test_cosi_and_cmi_keys():
    assert keys_for("/cosi.v1alpha1.Provisioner/DriverDeleteBucket", bucket_id="b1") == (
        "bucket:b1",
    )
    assert keys_for("/cmi.v1.Machine/DeleteMachine", MachineName="m1") == ("machine:m1",)


def test_cosi_v1alpha2_keys_name_the_account_and_every_bucket_it_reaches():
    provisioner = "/sigs.k8s.io.cosi.v1alpha2.Provisioner"
    buckets = [{"bucket_id": "b1"}, {"bucket_id": "b2"}]
    assert keys_for(
        f"{provisioner}/DriverGrantBucketAccess", account_name="ba-1", buckets=buckets
    ) == ("account-name:ba-1", "bucket:b1", "bucket:b2")
    assert keys_for(
        f"{provisioner}/DriverRevokeBucketAccess", account_id="acc-1", buckets=buckets
    ) == ("account:acc-1", "bucket:b1", "bucket:b2")
    assert keys_for(f"{provisioner}/DriverGetExistingBucket", existing_bucket_id="b9") == (
        "bucket:b9",
    )
    assert keys_for(f"{provisioner}/DriverCreateBucket", name="bc-1") == ("bucket-name:bc-1",)
    assert keys_for(f"{provisioner}/DriverDeleteBucket", bucket_id="b1") == ("bucket:b1",)
    assert keys_for("/sigs.k8s.io.cosi.v1alpha2.Identity/DriverGetInfo") == ()


def test_empty_key_fields_give_no_key():
    assert keys_for("/csi.v1.Node/NodeStageVolume") == ()


# -- --serialize-key ------------------------------------------------------------------------


def _keys(reg: Registry, path: str, **fields) -> tuple[str, ...]:
    info = reg.lookup(path)
    call = Call(info, (), [], None)
    call.request = LazyMessage(info.request_class(**fields).SerializeToString(), info.request_class)
    return keys_of(call)


def test_a_serialize_key_extends_a_bundled_methods_own_keys():
    stats = "/csi.v1.Node/NodeGetVolumeStats"
    reg = Registry(["csi.v1"], (), [f"{stats}=volume_path"])
    assert _keys(reg, stats, volume_id="v1", volume_path="/p") == ("volume:v1", "volume_path:/p")
    # A method without keys of its own gets them; the unconfigured registry has none.
    listing = "/csi.v1.Controller/ListVolumes"
    reg = Registry(["csi.v1"], (), [f"{listing}=starting_token"])
    assert _keys(reg, listing, starting_token="t") == ("starting_token:t",)
    assert _keys(REG, listing, starting_token="t") == ()


def test_a_serialize_key_goes_through_messages_and_lists_and_takes_integers():
    put, get = f"/{VAULT}.Vault/PutSecret", f"/{VAULT}.Vault/GetSecret"
    reg = Registry(
        [], [vault_descriptor_set()], [f"{put}=secret.readers", f"{get}=generation", f"{put}=vault"]
    )
    secret = {"name": "n", "readers": ["ann", "bob", ""]}
    assert _keys(reg, put, vault="v", secret=secret) == (
        "secret.readers:ann",
        "secret.readers:bob",
        "vault:v",
    )
    assert _keys(reg, put) == ()  # unset fields name nothing
    assert _keys(reg, get, generation=7) == ("generation:7",)


def test_parse_serialize_key():
    assert parse_serialize_key(" /a.B/C = d.e ") == ("/a.B/C", "d.e")
    for bad in ("/a.B/C", "a.B/C=d", "/a.B/C=", "/a.B/C=d..e", "/a/B/C=d"):
        with pytest.raises(ValueError, match=r"expected /package\.Service/Method=FIELD_PATH"):
            parse_serialize_key(bad)


def test_kubernetes_plugin_api_keys():
    dra = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    claims = [
        {"namespace": "ns", "uid": "uid-a", "name": "a"},
        {"namespace": "ns", "uid": "uid-b", "name": "b"},
    ]
    assert keys_for(f"{dra}/NodePrepareResources", claims=claims) == ("claim:uid-a", "claim:uid-b")
    assert keys_for(f"{dra}/NodeUnprepareResources", claims=claims[:1]) == ("claim:uid-a",)
    device = "/v1beta1.DevicePlugin"
    assert keys_for(
        f"{device}/Allocate",
        container_requests=[{"devices_ids": ["gpu-0", "gpu-1"]}, {"devices_ids": ["gpu-1"]}],
    ) == ("device:gpu-0", "device:gpu-1")
    assert keys_for(f"{device}/PreStartContainer", devices_ids=["gpu-3"]) == ("device:gpu-3",)
    # A stream as long-lived as the plugin must never hold a key; KMS calls stand alone.
    assert keys_for(f"{device}/ListAndWatch") == ()
    assert keys_for(f"{device}/GetPreferredAllocation", container_requests=[{}]) == ()
    assert keys_for("/v2.KeyManagementService/Encrypt", plaintext=b"x", uid="u") == ()
    assert keys_for("/v2.KeyManagementService/Decrypt", ciphertext=b"x", uid="u") == ()
    assert "kms.v2" not in KEY_TABLES and "pluginregistration.v1" not in KEY_TABLES
