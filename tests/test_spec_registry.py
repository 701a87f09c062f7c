"""Descriptor pools per spec, the method registry, and our protos against the reference wire format."""

from __future__ import annotations

import pathlib

import pytest
from google.protobuf import descriptor_pb2

from plugproxy.api import CallKind, SpecDescriptors, SpecInfo
from plugproxy.core.endpoints import ConfigError
from plugproxy.spec.registry import (
    SPEC_ALIASES,
    SPEC_NAMES,
    Registry,
    canonical_spec,
    load_spec,
    read_spec,
)
from tests.support import VAULT, build_descriptor_set, vault_descriptor_set

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "specs"
REFERENCE = {
    "csi_v1": SHARED / "csi" / "csi-v1.12.0.proto",
    "csi_v0": SHARED / "csi" / "csi-v0.3.0.proto",
    "cosi_v1alpha1": SHARED / "cosi" / "cosi-v1alpha1.proto",
    "cosi_v1alpha2": SHARED / "cosi" / "cosi-v1alpha2.proto",
    "cmi_v1": SHARED / "cmi" / "cmi-v1.proto",
    "kms_v2": SHARED / "k8s-plugins" / "kms-v2.proto",
    "deviceplugin_v1beta1": SHARED / "k8s-plugins" / "deviceplugin-v1beta1.proto",
    "dra_v1beta1": SHARED / "k8s-plugins" / "dra-v1beta1.proto",
    "dra_v1": SHARED / "k8s-plugins" / "dra-v1.proto",
    "drahealth_v1alpha1": SHARED / "k8s-plugins" / "dra-health-v1alpha1.proto",
    "drahealth_v1": SHARED / "k8s-plugins" / "dra-health-v1.proto",
    "pluginregistration_v1": SHARED / "k8s-plugins" / "pluginregistration-v1.proto",
}
K8S_SPECS = (
    "kms.v2",
    "deviceplugin.v1beta1",
    "dra.v1beta1",
    "dra.v1",
    "drahealth.v1alpha1",
    "drahealth.v1",
    "pluginregistration.v1",
)


def test_every_spec_loads_into_its_own_pool():
    pools = {load_spec(name).pool for name in SPEC_NAMES}
    assert len(pools) == len(SPEC_NAMES)


def test_csi_and_cmi_secret_share_number_1059_and_both_resolve():
    csi, cmi = load_spec("csi.v1"), load_spec("cmi.v1")
    assert csi.secret_option is not None and cmi.secret_option is not None
    assert csi.secret_option.number == cmi.secret_option.number == 1059
    assert csi.secret_option.full_name == "csi.v1.csi_secret"
    assert cmi.secret_option.full_name == "cmi.v1.cmi_secret"
    secrets = csi.descriptor("csi.v1.NodeStageVolumeRequest").fields_by_name["secrets"]
    assert csi.is_secret_field(secrets)
    assert not csi.is_secret_field(
        csi.descriptor("csi.v1.NodeStageVolumeRequest").fields_by_name["volume_id"]
    )
    machine = cmi.descriptor("cmi.v1.CreateMachineRequest")
    assert cmi.is_secret_field(machine.fields_by_name["Secrets"])
    assert load_spec("csi.v0").secret_option is None


def test_registry_maps_paths_to_spec_types_and_kinds():
    reg = Registry()
    info = reg.lookup("/csi.v1.Controller/CreateVolume")
    assert info.spec_name == "csi.v1"
    assert info.kind is CallKind.UNARY_UNARY
    assert info.request_class.DESCRIPTOR.full_name == "csi.v1.CreateVolumeRequest"
    assert info.response_class.DESCRIPTOR.full_name == "csi.v1.CreateVolumeResponse"
    for name in ("GetMetadataAllocated", "GetMetadataDelta"):
        assert reg.lookup(f"/csi.v1.SnapshotMetadata/{name}").kind is CallKind.UNARY_STREAM
    assert reg.lookup("/csi.v0.Node/NodeGetId").spec_name == "csi.v0"
    assert reg.lookup("/cosi.v1alpha1.Provisioner/DriverCreateBucket").spec_name == "cosi.v1alpha1"
    assert reg.lookup("/cmi.v1.Machine/CreateMachine").spec_name == "cmi.v1"
    assert len(reg.methods("csi.v1")) == 32
    only_v0 = Registry(["csi.v0"])
    assert not only_v0.lookup("/csi.v1.Controller/CreateVolume").known


def _normalized(path: pathlib.Path, include: list[str]) -> descriptor_pb2.FileDescriptorProto:
    protoc = pytest.importorskip("grpc_tools.protoc")
    out = path.with_suffix(".binpb")
    args = ["protoc", *(f"-I{i}" for i in include), f"--descriptor_set_out={out}", str(path)]
    assert protoc.main(args) == 0
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    fdp = fds.file[0]
    fdp.ClearField("name")
    fdp.ClearField("source_code_info")
    return fdp


@pytest.mark.parametrize("stem", sorted(REFERENCE))
def test_transcribed_protos_match_the_reference_wire_format(stem, tmp_path):
    """Names, numbers, types and options equal the spec's own .proto (comments aside)."""
    reference = REFERENCE[stem]
    if not reference.exists():
        pytest.skip("reference specs not present beside the checkout")
    import grpc_tools

    include = str(pathlib.Path(grpc_tools.__file__).parent / "_proto")
    ours_copy = tmp_path / "ours" / f"{stem}.proto"
    ref_copy = tmp_path / "ref" / f"{stem}.proto"
    ours_copy.parent.mkdir()
    ref_copy.parent.mkdir()
    ours_copy.write_text((ROOT / "protos" / f"{stem}.proto").read_text())
    ref_copy.write_text(reference.read_text())
    ours = _normalized(ours_copy, [str(ours_copy.parent), include])
    ref = _normalized(ref_copy, [str(ref_copy.parent), include])
    assert ours == ref


# -- descriptor sets ------------------------------------------------------------------------


def test_a_descriptor_set_is_a_spec_of_its_own_beside_the_bundled_ones():
    reg = Registry(["csi.v1"], [vault_descriptor_set()])
    assert list(reg.specs) == ["csi.v1", VAULT]
    spec = reg.specs[VAULT]
    assert not spec.bundled and spec.source == vault_descriptor_set()
    assert spec.family == VAULT and spec.pool is not load_spec("csi.v1").pool
    assert spec.files[-1] == "acme/vault/v1/vault.proto"  # imports first
    put = reg.lookup(f"/{VAULT}.Vault/PutSecret")
    assert put.spec is spec and put.kind is CallKind.UNARY_UNARY
    assert put.request_class is spec.message_class(f"{VAULT}.PutSecretRequest")
    assert reg.lookup(f"/{VAULT}.Vault/ListSecrets").kind is CallKind.UNARY_STREAM
    assert [m.name for m in reg.methods(VAULT)] == ["PutSecret", "GetSecret", "ListSecrets"]
    assert "/csi.v1.Node/NodeStageVolume" in reg and "/csi.v0.Node/NodeStageVolume" not in reg


def test_a_set_spanning_packages_is_named_after_its_file(tmp_path):
    files = {
        "a.proto": 'syntax = "proto3";\npackage one.v1;\nservice A { rpc M(X) returns (X); }\n'
        "message X {}\n",
        "b.proto": 'syntax = "proto3";\npackage two.v1;\nimport "a.proto";\n'
        "service B { rpc N(one.v1.X) returns (one.v1.X); }\n",
    }
    path = build_descriptor_set(tmp_path, files, out="both.binpb")
    reg = Registry([], [path])
    assert list(reg.specs) == ["both"]
    assert reg.lookup("/one.v1.A/M").spec_name == reg.lookup("/two.v1.B/N").spec_name == "both"


def test_a_set_named_like_a_bundled_spec_is_refused(tmp_path):
    files = {
        "cmi.proto": 'syntax = "proto3";\npackage cmi.v1;\nservice Other { rpc M(X) '
        "returns (X); }\nmessage X {}\n"
    }
    path = build_descriptor_set(tmp_path, files)
    with pytest.raises(ConfigError, match=r"its spec name cmi\.v1 is already taken by a bundled"):
        Registry(["csi.v1"], [path])


def test_serialize_keys_are_checked_and_attached_to_the_method():
    reg = Registry([], [vault_descriptor_set()], [f"/{VAULT}.Vault/PutSecret=secret.name"] * 2)
    assert reg.lookup(f"/{VAULT}.Vault/PutSecret").extra_keys == (("secret.name", "secret.name"),)
    sources = {"--serialize-key": "PLUGPROXY_SERIALIZE_KEY"}
    with pytest.raises(ConfigError, match=r"^PLUGPROXY_SERIALIZE_KEY /csi.v1.Node/Nope=x: unknown"):
        Registry(["csi.v1"], (), ["/csi.v1.Node/Nope=x"], sources)


def test_kubernetes_plugin_apis_load_together_without_a_path_clash():
    """Short packages ("v2", "v1beta1") and two services named Registration: every method
    path of every bundled spec is distinct, and each spec keeps its own pool."""
    together = Registry(SPEC_NAMES)
    per_spec = {name: Registry([name]).methods(name) for name in SPEC_NAMES}
    assert len(together.methods()) == sum(len(m) for m in per_spec.values())
    for name, methods in per_spec.items():
        for m in methods:
            assert together.lookup(m.path).spec_name == name
    assert {name: len(per_spec[name]) for name in K8S_SPECS} == {
        "kms.v2": 3,
        "deviceplugin.v1beta1": 6,
        "dra.v1beta1": 2,
        "dra.v1": 2,
        "drahealth.v1alpha1": 1,
        "drahealth.v1": 1,
        "pluginregistration.v1": 2,
    }
    device = together.lookup("/v1beta1.Registration/Register")
    kubelet = together.lookup("/pluginregistration.Registration/GetInfo")
    assert (device.spec_name, kubelet.spec_name) == (
        "deviceplugin.v1beta1",
        "pluginregistration.v1",
    )
    assert device.spec is not None and kubelet.spec is not None
    assert device.spec.pool is not kubelet.spec.pool
    stream = together.lookup("/v1beta1.DevicePlugin/ListAndWatch")
    assert stream.kind is CallKind.UNARY_STREAM
    assert stream.response_class.DESCRIPTOR.full_name == "v1beta1.ListAndWatchResponse"
    dra = together.lookup("/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources")
    assert dra.request_class.DESCRIPTOR.full_name.endswith(
        "dra.v1beta1.NodePrepareResourcesRequest"
    )
    # Same short names, different types: v1beta1.Device (device plugin) and DRA's Device.
    assert load_spec("deviceplugin.v1beta1").message_class("v1beta1.Device") is not (
        load_spec("dra.v1beta1").message_class("k8s.io.kubelet.pkg.apis.dra.v1beta1.Device")
    )


def test_auto_tells_the_two_cosi_versions_apart_by_package():
    """--spec auto: a COSI v0.2 sidecar's calls are v1alpha2's, a v0.1 one's v1alpha1's; the
    services have the same names in both."""
    reg = Registry(lazy=True)
    v2 = reg.lookup("/sigs.k8s.io.cosi.v1alpha2.Provisioner/DriverGrantBucketAccess")
    v1 = reg.lookup("/cosi.v1alpha1.Provisioner/DriverGrantBucketAccess")
    assert (v2.spec_name, v1.spec_name) == ("cosi.v1alpha2", "cosi.v1alpha1")
    assert v2.request_class.DESCRIPTOR.fields_by_name["buckets"].is_repeated
    assert reg.lookup("/sigs.k8s.io.cosi.v1alpha2.Provisioner/DriverGetExistingBucket").known
    assert not reg.lookup("/cosi.v1alpha1.Provisioner/DriverGetExistingBucket").known
    secret = load_spec("cosi.v1alpha2").secret_option
    assert secret is not None and secret.full_name == "sigs.k8s.io.cosi.v1alpha2.cosi_secret"


def test_spec_aliases_name_bundled_specs():
    assert canonical_spec("kms") == "kms.v2"
    assert canonical_spec("device-plugin") == "deviceplugin.v1beta1"
    assert canonical_spec("dra.v1beta1") == "dra.v1beta1"
    assert canonical_spec("dra") == "dra.v1"  # what kubelet asks for first
    assert canonical_spec("dra-health") == "drahealth.v1"
    assert all(target in SPEC_NAMES for target in SPEC_ALIASES.values())
    with pytest.raises(ValueError, match=r"unknown spec 'kms\.v1'"):
        canonical_spec("kms.v1")


def test_both_dra_versions_and_both_health_versions_resolve_to_their_own_spec():
    """A DRA plugin's socket serves DRAPlugin v1beta1 and v1 and, beside them,
    DRAResourceHealth (packages "v1alpha1" and "v1"): each path decodes in its own version."""
    reg = Registry(lazy=True)
    dra = "k8s.io.kubelet.pkg.apis.dra"
    for version in ("v1beta1", "v1"):
        info = reg.lookup(f"/{dra}.{version}.DRAPlugin/NodePrepareResources")
        assert info.spec_name == f"dra.{version}" and info.kind is CallKind.UNARY_UNARY
        assert info.response_class.DESCRIPTOR.full_name == (
            f"{dra}.{version}.NodePrepareResourcesResponse"
        )
    for version in ("v1alpha1", "v1"):
        info = reg.lookup(f"/{version}.DRAResourceHealth/NodeWatchResources")
        assert info.spec_name == f"drahealth.{version}" and info.kind is CallKind.UNARY_STREAM
        assert info.response_class.DESCRIPTOR.full_name == f"{version}.NodeWatchResourcesResponse"
    # v1 adds Device.share_id, with presence; v1beta1 has no such field.
    v1 = load_spec("dra.v1").descriptor(f"{dra}.v1.Device").fields_by_name["share_id"]
    assert v1.has_presence
    assert (
        "share_id"
        not in load_spec("dra.v1beta1").descriptor(f"{dra}.v1beta1.Device").fields_by_name
    )
    # The health package "v1" owns only its own service: another service there is unknown.
    assert not reg.lookup("/v1.DevicePlugin/ListAndWatch").known


# -- lazy registries (plugproxy serve's) --------------------------------------------------


def test_a_lazy_registry_lists_a_spec_when_its_first_method_is_looked_up():
    reg = Registry(lazy=True)
    assert list(reg.specs) == list(SPEC_NAMES) and reg.methods() == []
    # `in` knows every bundled method without listing a spec.
    assert "/v2.KeyManagementService/Encrypt" in reg and "/v2.KeyManagementService/Nope" not in reg
    assert reg.methods() == []
    # A method nobody defines, in a spec's package, lists nothing either.
    assert not reg.lookup("/csi.v1.Node/NodeFly").known and reg.methods() == []
    info = reg.lookup("/csi.v1.Node/NodeStageVolume")
    assert info.spec is load_spec("csi.v1") and info.kind is CallKind.UNARY_UNARY
    assert {m.spec_name for m in reg.methods()} == {"csi.v1"}
    assert len(reg.methods()) == len(Registry(["csi.v1"]).methods())
    # Naming a spec lists it too.
    assert len(reg.methods("kms.v2")) == 3
    assert {m.spec_name for m in reg.methods()} == {"csi.v1", "kms.v2"}


def test_a_lazy_registry_checks_its_configuration_at_once(tmp_path):
    reg = Registry(lazy=True, serialize_keys=["/v2.KeyManagementService/Encrypt=uid"])
    assert [m.spec_name for m in reg.methods()] == ["kms.v2"] * 3  # the key named it
    assert reg.lookup("/v2.KeyManagementService/Encrypt").extra_keys == (("uid", "uid"),)
    with pytest.raises(ConfigError, match=r"/csi.v1.Node/Nope=x: unknown method"):
        Registry(lazy=True, serialize_keys=["/csi.v1.Node/Nope=x"])
    # A descriptor set may not redefine a method of a bundled spec, listed or not.
    files = {
        "dup.proto": 'syntax = "proto3";\npackage csi.v1;\nservice Identity { rpc '
        "GetPluginInfo(X) returns (X); }\nmessage X {}\n"
    }
    path = build_descriptor_set(tmp_path, files)
    with pytest.raises(ConfigError, match=r"GetPluginInfo is already defined by the bundled spec"):
        Registry(lazy=True, descriptor_sets=[path])


def test_a_deferred_spec_reads_its_descriptors_once_and_then_runs_its_hooks():
    reads: list[str] = []

    def read() -> SpecDescriptors:
        reads.append("kms.v2")
        return read_spec("kms.v2")

    spec = SpecInfo("kms.v2", "kms", load=read)
    seen: list[bool] = []
    spec.when_loaded(lambda s: seen.append(s.loaded))
    assert not spec.loaded and reads == [] and seen == []
    request = spec.message_class("v2.EncryptRequest")(uid="u")
    assert spec.loaded and reads == ["kms.v2"] and seen == [True]
    assert spec.pool is request.DESCRIPTOR.file.pool and reads == ["kms.v2"]
    spec.when_loaded(lambda s: seen.append(s.loaded))  # loaded: called at once
    assert seen == [True, True]
    with pytest.raises(TypeError):
        SpecInfo("x", "x")  # neither a pool nor a way to read one
