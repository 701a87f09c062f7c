"""Resource keys per spec, from the key tables and the descriptors."""

from __future__ import annotations

from plugproxy.api import Call, LazyMessage
from plugproxy.keys import KEY_TABLES, extractor, keys_of
from plugproxy.registry import Registry

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


def test_empty_key_fields_give_no_key():
    assert keys_for("/csi.v1.Node/NodeStageVolume") == ()
