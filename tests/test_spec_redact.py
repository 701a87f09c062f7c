"""Redaction plans for every spec, masking shapes, capped rendering and free-text masking."""

from __future__ import annotations

import json

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor

from plugproxy.api import Call, LazyMessage, SpecInfo
from plugproxy.cli import serve
from plugproxy.core.endpoints import ConfigError
from plugproxy.spec import redact
from plugproxy.spec.redact import MASK, TRUNCATED_KEY, Redactor
from plugproxy.spec.registry import Registry, load_spec, read_spec
from tests.support import VAULT, vault_descriptor_set

CSI1 = load_spec("csi.v1")
CSI0 = load_spec("csi.v0")
COSI = load_spec("cosi.v1alpha1")
CMI = load_spec("cmi.v1")
ALL = redact.for_specs()


def masked_fields(red: Redactor, name: str) -> set[str]:
    plan = red.plan_for(name)
    return {f for f, a in plan.fields.items() if a is MASK} if plan else set()


def call_for(method_path: str, message) -> Call:
    info = Registry().lookup(method_path)
    call = Call(info, (), [], None)
    call.request = LazyMessage(message.SerializeToString(), info.request_class)
    return call


# -- plans --------------------------------------------------------------------------------


def test_csi_v1_secret_option_marks_every_secrets_map():
    tagged = {
        name
        for name, cls in CSI1.message_classes.items()
        for fd in cls.DESCRIPTOR.fields
        if CSI1.is_secret_field(fd)
    }
    assert "csi.v1.NodeStageVolumeRequest" in tagged and len(tagged) >= 15
    for name in tagged:
        assert "secrets" in masked_fields(ALL, name), name


def test_csi_v1_nested_repeated_and_oneof_paths_lead_to_mount_flags():
    create = ALL.plan_for("csi.v1.CreateVolumeRequest")
    assert create is not None
    capability = create.fields["volume_capabilities"]  # repeated message
    assert isinstance(capability, redact.Plan)
    assert capability.full_name == "csi.v1.VolumeCapability"
    mount = capability.fields["mount"]  # a oneof member
    assert isinstance(mount, redact.Plan) and mount.fields == {"mount_flags": MASK}
    assert "block" not in capability.fields


def test_types_with_nothing_sensitive_have_no_plan():
    for name in (
        "csi.v1.ListVolumesResponse",
        "csi.v1.GetPluginInfoResponse",
        "csi.v1.NodeGetInfoResponse",
        "cosi.v1alpha1.DriverCreateBucketRequest",
        "cmi.v1.ListMachinesResponse",
    ):
        assert ALL.plan_for(name) is None, name


def test_csi_v0_secrets_are_found_by_the_specs_names():
    fields = {
        "csi.v0.CreateVolumeRequest": "controller_create_secrets",
        "csi.v0.DeleteVolumeRequest": "controller_delete_secrets",
        "csi.v0.ControllerPublishVolumeRequest": "controller_publish_secrets",
        "csi.v0.ControllerUnpublishVolumeRequest": "controller_unpublish_secrets",
        "csi.v0.CreateSnapshotRequest": "create_snapshot_secrets",
        "csi.v0.DeleteSnapshotRequest": "delete_snapshot_secrets",
        "csi.v0.NodeStageVolumeRequest": "node_stage_secrets",
        "csi.v0.NodePublishVolumeRequest": "node_publish_secrets",
    }
    for message, field in fields.items():
        fd = CSI0.descriptor(message).fields_by_name[field]
        assert not CSI0.is_secret_field(fd)  # v0.3 has no option...
        assert field in masked_fields(ALL, message)  # ...its naming is enough
    # Every `*_secrets` field of the v0 descriptors is covered by the table.
    for name, cls in CSI0.message_classes.items():
        for fd in cls.DESCRIPTOR.fields:
            if fd.name.endswith("_secrets"):
                assert fd.name in masked_fields(ALL, name), (name, fd.name)


def test_cosi_credentials_are_masked_with_their_keys_visible():
    assert masked_fields(ALL, "cosi.v1alpha1.DriverGrantBucketAccessResponse") == {"credentials"}
    cls = COSI.message_class("cosi.v1alpha1.DriverGrantBucketAccessResponse")
    msg = cls(account_id="acct-7")
    msg.credentials["s3"].secrets["accessKeyID"] = "AKIA-canary"
    msg.credentials["s3"].secrets["accessSecretKey"] = "s3cr3t-canary"
    out = ALL.render(msg)
    assert out == {
        "account_id": "acct-7",
        "credentials": {"s3": {"secrets": {"accessKeyID": MASK, "accessSecretKey": MASK}}},
    }
    assert ALL.secret_values(msg) == {"AKIA-canary", "s3cr3t-canary"}


def test_cosi_v1alpha2_credentials_are_masked_though_no_field_is_tagged():
    spec = load_spec("cosi.v1alpha2")
    pkg = "sigs.k8s.io.cosi.v1alpha2"
    assert not any(
        spec.is_secret_field(fd)
        for cls in spec.message_classes.values()
        for fd in cls.DESCRIPTOR.fields
    )
    assert masked_fields(ALL, f"{pkg}.S3CredentialInfo") == {"access_key_id", "access_secret_key"}
    assert masked_fields(ALL, f"{pkg}.AzureCredentialInfo") == {"access_token"}
    assert masked_fields(ALL, f"{pkg}.GcsCredentialInfo") == {
        "access_id",
        "access_secret",
        "private_key_name",
        "service_account",
    }
    # A create's bucket info is for administrators; a grant's is secret (§DriverGrant...).
    assert ALL.plan_for(f"{pkg}.DriverCreateBucketResponse") is None
    cls = spec.message_class(f"{pkg}.DriverGrantBucketAccessResponse")
    msg = cls(
        account_id="acct-7",
        buckets=[{"bucket_id": "b-1", "bucket_info": {"azure": {"storage_account": "acct"}}}],
        credentials={
            "azure": {"access_token": "sv=2024&sig=canary", "expiry_timestamp": "2030-01-01Z"}
        },
    )
    assert ALL.render(msg) == {
        "account_id": "acct-7",
        "buckets": [{"bucket_id": "b-1", "bucket_info": MASK}],
        "credentials": {"azure": {"access_token": MASK, "expiry_timestamp": "2030-01-01Z"}},
    }
    assert ALL.secret_values(msg) == {"sv=2024&sig=canary", "acct"}
    # Not advisory: --redact-defaults off keeps them masked.
    off = redact.for_specs(defaults=False)
    assert masked_fields(off, f"{pkg}.S3CredentialInfo") == {"access_key_id", "access_secret_key"}


def test_cmi_secret_option_resolves_in_its_own_pool():
    # cmi_secret and csi_secret share field number 1059; each resolves in its own pool.
    assert CMI.secret_option is not None and CSI1.secret_option is not None
    assert CMI.secret_option.full_name == "cmi.v1.cmi_secret"
    assert masked_fields(ALL, "cmi.v1.CreateMachineRequest") == {"Secrets"}
    msg = CMI.message_class("cmi.v1.CreateMachineRequest")(MachineName="m-1")
    msg.Secrets["cloud-credentials"] = b"token-xyz"
    out = ALL.render(msg)
    assert out["Secrets"] == {"cloud-credentials": MASK}
    assert out["MachineName"] == "m-1"
    assert "token-xyz" in ALL.secret_values(msg)


def test_advisory_defaults_can_be_turned_off():
    off = redact.for_specs(defaults=False)
    assert off.plan_for("csi.v1.VolumeCapability") is None
    assert "volume_context" not in masked_fields(off, "csi.v1.NodePublishVolumeRequest")
    assert "secrets" in masked_fields(off, "csi.v1.NodePublishVolumeRequest")
    # Spec-named secrets stay whatever the defaults say.
    assert "node_stage_secrets" in masked_fields(off, "csi.v0.NodeStageVolumeRequest")
    assert masked_fields(off, "cosi.v1alpha1.DriverGrantBucketAccessResponse") == {"credentials"}


def test_redact_paths_add_fields_and_make_their_containers_walked():
    red = redact.for_specs(
        paths=["csi.v1.NodeStageVolumeRequest.volume_context", "csi.v1.Volume.volume_id"],
        defaults=False,
    )
    assert "volume_context" in masked_fields(red, "csi.v1.NodeStageVolumeRequest")
    # Volume is reached from responses, now they are walked too.
    for name in ("csi.v1.CreateVolumeResponse", "csi.v1.ListVolumesResponse"):
        assert red.plan_for(name) is not None, name
    msg = CSI1.message_class("csi.v1.ListVolumesResponse")()
    msg.entries.add().volume.volume_id = "vol-hidden"
    assert red.render(msg) == {"entries": [{"volume": {"volume_id": MASK}}]}


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("csi.v1.NoSuchRequest.secrets", "csi.v1 has no message csi.v1.NoSuchRequest"),
        ("csi.v1.NodeStageVolumeRequest.nope", "has no field 'nope'"),
        ("volume_context", "expected <message full name>.<field>"),
        ("other.v9.Foo.bar", "expected <message full name>.<field>"),
    ],
)
def test_unknown_redact_paths_are_one_line_config_errors(path, says):
    with pytest.raises(ConfigError) as err:
        Redactor([CSI1], [path])
    assert says in str(err.value) and "\n" not in str(err.value)


def test_redact_paths_from_the_environment_are_comma_separated():
    settings = serve.parse_settings(
        ["--listen", "unix:///tmp/a", "--upstream", "unix:///tmp/b"],
        environ={
            "PLUGPROXY_REDACT": "csi.v1.NodeStageVolumeRequest.volume_context, "
            "csi.v1.NodeStageVolumeRequest.publish_context",
            "PLUGPROXY_REDACT_DEFAULTS": "off",
        },
    )
    red = redact.from_settings(settings.stages.call_log.redaction, ["csi.v1"])
    assert {"volume_context", "publish_context", "secrets"} <= masked_fields(
        red, "csi.v1.NodeStageVolumeRequest"
    )
    assert red.plan_for("csi.v1.VolumeCapability") is None
    again = redact.RedactSettings(
        redact=(
            "csi.v1.NodeStageVolumeRequest.volume_context",
            "csi.v1.NodeStageVolumeRequest.publish_context",
        ),
        redact_defaults="off",
    )
    assert redact.from_settings(again, ["csi.v1"]) is red  # plans are built once per config


# -- cycles and masking shapes (a synthetic spec) -----------------------------------------


def _synthetic_spec() -> SpecInfo:
    fdp = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t.v1", syntax="proto3")
    node = fdp.message_type.add(name="Node")
    entry = node.nested_type.add(name="KidsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=FieldDescriptor.TYPE_STRING, label=1)
    entry.field.add(name="value", number=2, type=FieldDescriptor.TYPE_MESSAGE, label=1)
    entry.field[1].type_name = ".t.v1.Node"
    rep, opt = 3, 1
    for name, number, ftype, label, type_name in (
        ("name", 1, FieldDescriptor.TYPE_STRING, opt, ""),
        ("child", 2, FieldDescriptor.TYPE_MESSAGE, opt, ".t.v1.Node"),
        ("kids", 3, FieldDescriptor.TYPE_MESSAGE, rep, ".t.v1.Node.KidsEntry"),
        ("password", 4, FieldDescriptor.TYPE_STRING, opt, ""),
        ("tokens", 5, FieldDescriptor.TYPE_STRING, rep, ""),
        ("blob", 6, FieldDescriptor.TYPE_BYTES, opt, ""),
        ("count", 7, FieldDescriptor.TYPE_INT64, opt, ""),
    ):
        fd = node.field.add(name=name, number=number, type=ftype, label=label)
        if type_name:
            fd.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("t.v1.Node")
    classes = {d.full_name: message_factory.GetMessageClass(d) for d in (desc, *desc.nested_types)}

    class ByName(SpecInfo):
        def is_secret_field(self, fd: FieldDescriptor) -> bool:
            return fd.name in ("password", "tokens", "blob")

    return ByName("t.v1", "t", pool, None, None, classes)


def test_cyclic_types_are_planned_and_masked_at_every_depth():
    spec = _synthetic_spec()
    red = Redactor([spec], defaults=False)
    plan = red.plan_for("t.v1.Node")
    assert plan is not None
    assert plan.fields["child"] is plan and plan.fields["kids"] is plan  # the cycle, once
    node = spec.message_class("t.v1.Node")(name="root", password="pw-root", count=5)
    node.tokens.extend(["tok-a", "tok-b"])
    node.blob = b"blob-bytes"
    node.child.name = "kid"
    node.child.password = "pw-child"
    node.kids["k1"].kids["k2"].password = "pw-deep"
    out = red.render(node)
    assert out == {
        "name": "root",
        "child": {"name": "kid", "password": MASK},
        "kids": {"k1": {"kids": {"k2": {"password": MASK}}}},
        "password": MASK,
        "tokens": MASK,  # a repeated secret is masked whole: not even its length shows
        "blob": MASK,
        "count": "5",  # int64 as text, like protobuf's JSON mapping
    }
    assert red.secret_values(node) >= {"pw-root", "tok-a", "tok-b", "pw-child", "pw-deep"}
    assert "blob-bytes" in red.secret_values(node)


# -- rendering ----------------------------------------------------------------------------


def test_render_is_message_to_dict_like():
    snap = CSI1.message_class("csi.v1.CreateSnapshotResponse")()
    snap.snapshot.snapshot_id = "snap-1"
    snap.snapshot.size_bytes = 1 << 40
    snap.snapshot.creation_time.seconds = 100
    snap.snapshot.ready_to_use = True
    assert ALL.render(snap) == {
        "snapshot": {
            "size_bytes": str(1 << 40),
            "snapshot_id": "snap-1",
            "creation_time": "1970-01-01T00:01:40Z",
            "ready_to_use": True,
        }
    }
    cap = CSI1.message_class("csi.v1.VolumeCapability")()
    cap.access_mode.mode = cap.AccessMode.SINGLE_NODE_WRITER
    cap.mount.mount_flags.extend(["ro", "password=x"])
    cap.mount.fs_type = "ext4"
    assert ALL.render(cap) == {
        "mount": {"fs_type": "ext4", "mount_flags": MASK},
        "access_mode": {"mode": "SINGLE_NODE_WRITER"},
    }


def _big_list(n: int):
    msg = CSI1.message_class("csi.v1.ListVolumesResponse")(next_token="next-page")
    for i in range(n):
        vol = msg.entries.add().volume
        vol.volume_id = f"vol-{i}"
        vol.capacity_bytes = i
    return msg


def test_capped_render_stops_early_and_says_where():
    msg = _big_list(10_000)
    out = ALL.render(msg, 16 * 1024)
    text = json.dumps(out, ensure_ascii=False, separators=(",", ":"))  # as the logger writes
    assert len(text) < 16 * 1024 + 200
    assert 50 < len(out["entries"]) < 1000  # not the 10,000 entries: it stopped early
    assert out[TRUNCATED_KEY].startswith("over 16384 bytes; stopped at entries[")
    assert "of 10000]" in out[TRUNCATED_KEY]
    assert "next_token" not in out  # fields after the cut are not rendered
    assert len(ALL.render(msg)["entries"]) == 10_000  # uncapped renders everything


def test_sampled_entries_rendered_before_render_the_same_at_every_budget():
    """Entries of a sampled list are rendered once and then known by their wire bytes
    (Redactor._entries): every later render, cut or whole, is what a fresh renderer makes,
    and an entry whose bytes changed is rendered anew."""
    msg = _big_list(10_000)
    msg.entries[5].volume.volume_context["token"] = "v1"
    for entry in msg.entries:
        entry.volume.volume_context["pool"] = "gold"
    raw = msg.SerializeToString()
    cls = type(msg)
    Registry(["csi.v1"])  # prepares the sampling skeletons, as a proxy does at startup
    warmed = Redactor([CSI1])  # not for_specs(): that one is shared
    sample = LazyMessage(raw, cls).sample
    assert sample is not None
    warmed.render(sample.message, 64 * 1024, sample)
    assert len(warmed._entries) == 256  # the whole sample fitted
    cold = Redactor([CSI1])
    for budget in (*range(40, 1500), 4096, 16 * 1024, 64 * 1024):  # every cut in the head
        cold._entries.clear()
        fresh = cold.render(sample.message, budget, sample)
        assert warmed.render(sample.message, budget, sample) == fresh, budget
    msg.entries[5].volume.volume_context["token"] = "v2"
    changed = LazyMessage(msg.SerializeToString(), cls).sample
    assert changed is not None
    again = warmed.render(changed.message, 4096, changed)
    assert again["entries"][5]["volume"]["volume_context"]["token"] == "v2"
    assert again == Redactor([CSI1]).render(changed.message, 4096, changed)


def test_a_long_string_is_cut_visibly():
    msg = CSI1.message_class("csi.v1.NodeUnpublishVolumeRequest")(
        volume_id="v", target_path="/x" * 500
    )
    out = ALL.render(msg, 100)
    assert out["volume_id"] == "v"
    assert out["target_path"].endswith("…") and len(out["target_path"]) < 100
    assert out[TRUNCATED_KEY] == "over 100 bytes; stopped at target_path"


def test_masked_values_are_not_spent_from_the_budget_as_text():
    msg = CSI1.message_class("csi.v1.NodeStageVolumeRequest")(volume_id="v")
    msg.secrets["key"] = "x" * 10_000
    out = ALL.render(msg, 200)
    assert out == {"volume_id": "v", "secrets": {"key": MASK}}


# -- free text ----------------------------------------------------------------------------


def _stage_call(secret: str) -> Call:
    msg = CSI1.message_class("csi.v1.NodeStageVolumeRequest")(
        volume_id="vol-1", staging_target_path="/stage"
    )
    msg.secrets["password"] = secret
    msg.secrets["pin"] = "123"  # too short to search for in free text
    return call_for("/csi.v1.Node/NodeStageVolume", msg)


def test_mask_text_masks_request_secrets_in_error_messages():
    call = _stage_call("hunter2-canary")
    text = "login failed for password hunter2-canary at 123 Main St"
    assert ALL.mask_text(text, call) == "login failed for password *** at 123 Main St"
    assert ALL.mask_text("", call) == ""
    assert call.stage_state["redact.secrets"] == {"hunter2-canary"}  # computed once


def test_mask_text_is_a_no_op_for_calls_without_secrets():
    msg = CSI1.message_class("csi.v1.NodeUnstageVolumeRequest")(volume_id="hunter2-canary")
    call = call_for("/csi.v1.Node/NodeUnstageVolume", msg)
    assert ALL.mask_text("hunter2-canary", call) == "hunter2-canary"


def test_render_call_scrubs_request_secrets_echoed_elsewhere():
    call = _stage_call("hunter2-canary")
    echo = CSI1.message_class("csi.v1.CreateVolumeResponse")()
    echo.volume.volume_id = "vol-hunter2-canary"
    echo.volume.volume_context["hint"] = "pw is hunter2-canary"
    out = ALL.render_call(echo, call)
    assert out == {"volume": {"volume_id": "vol-***", "volume_context": {"hint": "pw is ***"}}}
    assert "hunter2-canary" not in json.dumps(out)


# -- debug_redact and descriptor sets -----------------------------------------------------------


def _vault() -> SpecInfo:
    return Registry([], [vault_descriptor_set()]).specs[VAULT]


def test_debug_redact_masks_a_descriptor_sets_fields_everywhere():
    spec = _vault()
    red = Redactor([spec])
    assert masked_fields(red, f"{VAULT}.PutSecretRequest") == {"token"}
    assert masked_fields(red, f"{VAULT}.Secret") == {"payload"}
    request = spec.message_class(f"{VAULT}.PutSecretRequest")(
        vault="v", token="tok-secret-1", secret={"name": "n", "payload": b"pay-secret-2"}
    )
    assert red.render(request) == {
        "vault": "v",
        "token": MASK,
        "secret": {"name": "n", "payload": MASK},
    }
    info = Registry([], [spec.source or ""]).lookup(f"/{VAULT}.Vault/PutSecret")
    call = Call(info, (), [], None)
    call.request = LazyMessage(request.SerializeToString(), info.request_class)
    assert red.mask_text("tok-secret-1 and pay-secret-2 refused", call) == "*** and *** refused"


def test_debug_redact_counts_in_a_bundled_spec_too():
    # A bundled-style spec (no source, no descriptor.proto in its pool) with debug_redact.
    fdp = descriptor_pb2.FileDescriptorProto(name="b.proto", package="b.v1", syntax="proto3")
    message = fdp.message_type.add(name="M")
    message.field.add(name="plain", number=1, type=FieldDescriptor.TYPE_STRING, label=1)
    hidden = message.field.add(name="hidden", number=2, type=FieldDescriptor.TYPE_STRING, label=1)
    hidden.options.debug_redact = True
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("b.v1.M")
    spec = SpecInfo(
        "b.v1", "b", pool, None, None, {"b.v1.M": message_factory.GetMessageClass(desc)}
    )
    assert spec.bundled
    assert spec.is_secret_field(desc.fields_by_name["hidden"])
    assert not spec.is_secret_field(desc.fields_by_name["plain"])
    assert masked_fields(Redactor([spec]), "b.v1.M") == {"hidden"}


def test_redact_paths_resolve_in_descriptor_sets():
    spec = _vault()
    red = redact.for_specs(["csi.v1", spec], [f"{VAULT}.Secret.labels"])
    assert masked_fields(red, f"{VAULT}.Secret") == {"labels", "payload"}
    with pytest.raises(ConfigError, match=f"{VAULT}.Secret has no field 'nope'"):
        Redactor([spec], [f"{VAULT}.Secret.nope"])
    with pytest.raises(ConfigError, match="or a --descriptor-set"):
        Redactor([load_spec("csi.v1")], [f"{VAULT}.Secret.labels"])  # set not served


def test_a_spec_is_planned_when_its_descriptors_are_read_and_not_before():
    # serve's specs read their descriptors on their first call: a redactor built before
    # must not read them, and must mask the first message all the same.
    spec = SpecInfo("kms.v2", "kms", load=lambda: read_spec("kms.v2"))
    red = Redactor([spec], ["v2.EncryptRequest.uid"])
    assert not spec.loaded
    request = spec.message_class("v2.EncryptRequest")(plaintext=b"seed", uid="u-1")
    assert red.render(request) == {"plaintext": MASK, "uid": MASK}
    annotated = spec.message_class("v2.EncryptResponse")(ciphertext=b"c", key_id="k")
    annotated.annotations["kms.example.com/wrapped"] = b"key"
    assert red.render(annotated)["annotations"] == {"kms.example.com/wrapped": MASK}


# -- Kubernetes' own plugin APIs ----------------------------------------------------------

KMS = load_spec("kms.v2")
DEVICES = load_spec("deviceplugin.v1beta1")


def test_kms_plaintext_is_secret_and_annotations_advisory():
    red = redact.for_specs(["kms.v2"])
    assert masked_fields(red, "v2.EncryptRequest") == {"plaintext"}
    assert masked_fields(red, "v2.DecryptResponse") == {"plaintext"}
    assert masked_fields(red, "v2.EncryptResponse") == {"annotations"}
    assert masked_fields(red, "v2.DecryptRequest") == {"annotations"}
    # Ciphertext is stored openly in etcd by design; the key id names the key, not its bytes.
    for name in ("v2.StatusResponse", "v2.StatusRequest"):
        assert red.plan_for(name) is None
    off = redact.for_specs(["kms.v2"], defaults=False)
    assert masked_fields(off, "v2.EncryptRequest") == {"plaintext"}
    assert masked_fields(off, "v2.DecryptResponse") == {"plaintext"}
    assert off.plan_for("v2.EncryptResponse") is None

    dek = bytes(range(32))
    request = KMS.message_class("v2.EncryptRequest")(plaintext=dek, uid="u-1")
    assert red.render(request) == {"plaintext": MASK, "uid": "u-1"}
    response = KMS.message_class("v2.EncryptResponse")(ciphertext=b"\x01c", key_id="k1")
    response.annotations["kms.example.io/wrapped-kek"] = b"wrapped"
    rendered = red.render(response)
    assert rendered["annotations"] == {"kms.example.io/wrapped-kek": MASK}
    assert rendered["key_id"] == "k1" and rendered["ciphertext"] == "AWM="
    # The plaintext of the request masks free text too (base64 form included).
    call = call_for("/v2.KeyManagementService/Encrypt", request)
    import base64

    shown = base64.b64encode(dek).decode()
    assert red.mask_text(f"cannot wrap {shown}", call) == f"cannot wrap {MASK}"


def test_device_plugin_envs_are_advisory_with_names_visible():
    red = redact.for_specs(["deviceplugin.v1beta1"])
    assert masked_fields(red, "v1beta1.ContainerAllocateResponse") == {"envs"}
    assert red.plan_for("v1beta1.AllocateResponse") is not None  # leads to envs
    assert red.plan_for("v1beta1.ListAndWatchResponse") is None  # the hot stream: no checks
    response = DEVICES.message_class("v1beta1.AllocateResponse")()
    answer = response.container_responses.add()
    answer.envs["LICENSE_TOKEN"] = "tok-123456"
    answer.annotations["cdi.k8s.io/dev"] = "vendor.com/gpu=0"
    assert red.render(response) == {
        "container_responses": [
            {"envs": {"LICENSE_TOKEN": MASK}, "annotations": {"cdi.k8s.io/dev": "vendor.com/gpu=0"}}
        ]
    }
    assert redact.for_specs(["deviceplugin.v1beta1"], defaults=False).plans == {}


def test_dra_and_plugin_registration_carry_nothing_sensitive():
    assert redact.for_specs(["dra.v1beta1", "pluginregistration.v1"]).plans == {}


@pytest.mark.parametrize(
    ("path", "owner"),
    [
        ("v1beta1.ContainerAllocateResponse.annotations", "v1beta1.ContainerAllocateResponse"),
        ("v2.DecryptRequest.key_id", "v2.DecryptRequest"),
        ("pluginregistration.PluginInfo.endpoint", "pluginregistration.PluginInfo"),
        (
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.Claim.namespace",
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.Claim",
        ),
    ],
)
def test_redact_paths_resolve_by_package_for_short_packages(path, owner):
    red = Redactor(
        [KMS, DEVICES, load_spec("dra.v1beta1"), load_spec("pluginregistration.v1")], [path]
    )
    assert path.rpartition(".")[2] in masked_fields(red, owner)


def test_unknown_redact_path_in_a_short_package_is_a_config_error():
    with pytest.raises(ConfigError, match=r"kms\.v2 has no message v2\.Nope"):
        Redactor([KMS], ["v2.Nope.field"])
