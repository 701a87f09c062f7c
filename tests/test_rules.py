"""The rule engine and the four spec tables: each family with a passing and a failing case."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from plugproxy.rules import TABLES, all_rules, find_rule
from plugproxy.rules.engine import (
    CompiledSpec,
    SpecTable,
    TableError,
    compile_table,
    plugin_name_problem,
)
from plugproxy.rules.state import SpecState
from plugproxy.spec.registry import load_spec

COMPILED: dict[str, CompiledSpec] = {
    name: compile_table(table, load_spec(name)) for name, table in TABLES.items()
}


def msg(spec: str, type_name: str, /, **fields: Any) -> Any:
    return load_spec(spec).message_class(f"{TABLES[spec].package}.{type_name}")(**fields)


def rules_of(spec: str, message: Any) -> list[tuple[str, str]]:
    return [(v.rule.id, v.field) for v in COMPILED[spec].check_message(message)]


# -- tables ----------------------------------------------------------------------------------


def test_every_table_compiles_against_its_descriptors():
    for name, compiled in COMPILED.items():
        assert compiled.checkers, name
        assert all(rule.id.startswith(compiled.table.family + ".") for rule in compiled.table.rules)


def test_required_field_counts_match_the_specs():
    # CSI v1.12: 72 "This field is REQUIRED" + 11 other wordings; plus 2 REQUIRED oneofs.
    counts = {
        name: sum(
            1
            for table in (t.required, t.required_caveat)
            for fields in table.values()
            for f in fields
            if not f.startswith("oneof:")
        )
        for name, t in TABLES.items()
    }
    # Kubernetes' plugin APIs: KMS "must not be empty" x3, DRA "REQUIRED"/"Required" x5;
    # device plugin and plugin registration: the fields kubelet cannot register without.
    assert counts == {
        "csi.v1": 83,
        "csi.v0": 40,
        "cosi.v1alpha1": 10,
        # COSI v1alpha2: 25 "REQUIRED" (two conditional ones aside), and the enums inside
        # AuthenticationType and AccessMode, where UNKNOWN is none.
        "cosi.v1alpha2": 27,
        "cmi.v1": 18,
        "kms.v2": 3,
        "deviceplugin.v1beta1": 3,
        "dra.v1beta1": 5,
        "dra.v1": 5,
        # DRA health: a DeviceHealth's device, and its pool and name.
        "drahealth.v1alpha1": 3,
        "drahealth.v1": 3,
        "pluginregistration.v1": 3,
    }


def test_a_table_naming_a_missing_field_fails_at_startup():
    bad = SpecTable(
        spec="csi.v1",
        family="csi",
        title="x",
        package="csi.v1",
        rules=TABLES["csi.v1"].rules,
        required={"CreateVolumeRequest": ("no_such_field",)},
    )
    with pytest.raises(TableError, match="no_such_field"):
        compile_table(bad, load_spec("csi.v1"))


def test_rule_ids_are_unique_and_documented():
    ids = all_rules()
    with open("docs/rules.md", encoding="utf-8") as fh:
        doc = fh.read()
    missing = [rid for rid in ids if f"`{rid}`" not in doc]
    assert not missing, missing


def test_a_rule_is_found_in_the_tables_of_its_family_alone():
    # find_rule imports only the tables of the id's family: spec a.b's table is family a.
    for spec, table in TABLES.items():
        assert table.family == spec.partition(".")[0]
        assert table.spec == spec
    for rid, rule in all_rules().items():
        assert find_rule(rid) is rule
    assert find_rule("csi.no-such-rule") is None and find_rule("warp.drive") is None
    assert "warp.v1" not in TABLES and len(TABLES) == len(list(TABLES))


def test_message_types_without_checks_get_no_checker():
    # Empty messages have nothing to check and are never walked.
    assert "csi.v1.GetPluginInfoRequest" not in COMPILED["csi.v1"].checkers
    assert "csi.v1.ProbeRequest" not in COMPILED["csi.v1"].checkers


# -- family 1: REQUIRED ------------------------------------------------------------------------

REQUIRED_CASES = [
    # spec, message, good fields, bad fields, expected field path
    ("csi.v1", "DeleteVolumeRequest", {"volume_id": "v"}, {}, "volume_id"),
    (
        "csi.v1",
        "CreateSnapshotRequest",
        {"name": "s", "source_volume_id": "v"},
        {"name": "s"},
        "source_volume_id",
    ),
    (
        "csi.v1",
        "GetPluginInfoResponse",
        {"name": "a.b", "vendor_version": "1"},
        {"name": "a.b"},
        "vendor_version",
    ),
    ("csi.v0", "NodeGetIdResponse", {"node_id": "n"}, {}, "node_id"),
    (
        "csi.v0",
        "Snapshot",
        {"id": "s", "source_volume_id": "v", "created_at": 1},
        {"id": "s", "source_volume_id": "v"},
        "created_at",
    ),
    (
        "cosi.v1alpha1",
        "DriverGrantBucketAccessRequest",
        {"bucket_id": "b", "name": "n", "authentication_type": 1},
        {"bucket_id": "b", "name": "n"},
        "authentication_type",
    ),
    (
        "cosi.v1alpha1",
        "DriverGrantBucketAccessResponse",
        {"account_id": "a", "credentials": {"s3": {"secrets": {"k": "v"}}}},
        {"account_id": "a"},
        "credentials",
    ),
    (
        "cmi.v1",
        "CreateMachineRequest",
        {"MachineName": "m", "ProviderSpec": b"x"},
        {"MachineName": "m"},
        "ProviderSpec",
    ),
    (
        "cmi.v1",
        "GetMachineStatusResponse",
        {"ProviderID": "p", "NodeName": "n"},
        {"ProviderID": "p"},
        "NodeName",
    ),
]


@pytest.mark.parametrize(("spec", "name", "good", "bad", "path"), REQUIRED_CASES)
def test_required_fields(spec, name, good, bad, path):
    family = TABLES[spec].family
    assert (f"{family}.required-field", path) not in rules_of(spec, msg(spec, name, **good))
    assert (f"{family}.required-field", path) in rules_of(spec, msg(spec, name, **bad))


def test_required_at_depth_and_required_oneofs():
    cap_ok = {"mount": {}, "access_mode": {"mode": 1}}
    good = msg("csi.v1", "CreateVolumeRequest", name="n", volume_capabilities=[cap_ok])
    assert rules_of("csi.v1", good) == []
    no_type = msg(
        "csi.v1", "CreateVolumeRequest", name="n", volume_capabilities=[{"access_mode": {}}]
    )
    found = rules_of("csi.v1", no_type)
    assert ("csi.required-field", "volume_capabilities[0].access_type") in found
    assert ("csi.required-field", "volume_capabilities[0].access_mode.mode") in found
    empty_source = msg(
        "csi.v1",
        "CreateVolumeRequest",
        name="n",
        volume_capabilities=[cap_ok],
        volume_content_source={"snapshot": {}},
    )
    assert rules_of("csi.v1", empty_source) == [
        ("csi.required-field", "volume_content_source.snapshot.snapshot_id")
    ]


def test_required_bool_and_numbers_are_not_judged():
    # proto3 cannot tell readonly=false from unset: no violation for the missing bool.
    req = msg(
        "csi.v1",
        "ControllerPublishVolumeRequest",
        volume_id="v",
        node_id="n",
        volume_capability={"block": {}, "access_mode": {"mode": 1}},
    )
    assert rules_of("csi.v1", req) == []


# -- family 2: size limits ---------------------------------------------------------------------


def publish_request(target_path: str) -> Any:
    return msg(
        "csi.v1",
        "NodePublishVolumeRequest",
        volume_id="v",
        target_path=target_path,
        volume_capability={"mount": {}, "access_mode": {"mode": 1}},
    )


def test_kubelet_target_path_of_200_bytes_is_not_flagged():
    path = "/var/lib/kubelet/pods/" + "p" * (200 - len("/var/lib/kubelet/pods/"))
    assert len(path) == 200
    assert rules_of("csi.v1", publish_request(path)) == []


def test_strings_over_128_bytes_are_flagged_and_128_is_fine():
    ok = msg("csi.v1", "Volume", volume_id="v" * 128)
    assert rules_of("csi.v1", ok) == []
    found = COMPILED["csi.v1"].check_message(msg("csi.v1", "Volume", volume_id="v" * 129))
    assert [(v.rule.id, v.field) for v in found] == [("csi.size-limit", "volume_id")]
    assert "129 bytes" in found[0].message and "v" * 10 not in found[0].message


def test_size_counts_utf8_bytes_not_characters():
    value = "é" * 65  # 65 characters, 130 bytes
    assert ("csi.size-limit", "volume_id") in rules_of(
        "csi.v1", msg("csi.v1", "Volume", volume_id=value)
    )
    # in a list, and in map keys and values: 200 characters, 400 bytes
    status = msg("csi.v1", "ListVolumesResponse.VolumeStatus", published_node_ids=["é" * 200])
    assert rules_of("csi.v1", status) == [("csi.size-limit", "published_node_ids[0]")]
    made = msg("csi.v1", "Volume", volume_id="v", volume_context={"é" * 700: "é" * 1400})
    assert rules_of("csi.v1", made) == [("csi.size-limit", "volume_context")]


def test_map_limit_is_4_kib_in_total():
    ok = {f"k{i}": "v" * 90 for i in range(40)}  # 40 * (2..3 + 90) < 4096
    big = {f"k{i}": "v" * 100 for i in range(41)}
    base = {"volume_id": "v"}
    assert rules_of("csi.v1", msg("csi.v1", "DeleteVolumeRequest", **base)) == []
    good = msg("csi.v1", "ValidateVolumeCapabilitiesRequest", parameters=ok, **base)
    bad = msg("csi.v1", "ValidateVolumeCapabilitiesRequest", parameters=big, **base)
    assert ("csi.size-limit", "parameters") not in rules_of("csi.v1", good)
    assert ("csi.size-limit", "parameters") in rules_of("csi.v1", bad)


def test_node_id_may_take_256_bytes_with_128_recommended():
    assert rules_of("csi.v1", msg("csi.v1", "NodeGetInfoResponse", node_id="n" * 128)) == []
    found = rules_of("csi.v1", msg("csi.v1", "NodeGetInfoResponse", node_id="n" * 200))
    assert found == [("csi.size-limit-recommended", "node_id")]
    found = rules_of("csi.v1", msg("csi.v1", "NodeGetInfoResponse", node_id="n" * 257))
    assert ("csi.size-limit", "node_id") in found


def test_mount_flags_are_limited_in_total_not_per_flag():
    def req(flags: list[str]) -> Any:
        return msg(
            "csi.v1",
            "NodeStageVolumeRequest",
            volume_id="v",
            staging_target_path="/s",
            volume_capability={"mount": {"mount_flags": flags}, "access_mode": {"mode": 1}},
        )

    assert rules_of("csi.v1", req(["o" * 200, "p" * 200])) == []
    assert rules_of("csi.v1", req(["o" * 2100, "p" * 2100])) == [
        ("csi.size-limit", "volume_capability.mount.mount_flags")
    ]


def test_csi_v0_paths_are_advisory_only():
    req = msg(
        "csi.v0",
        "NodeUnpublishVolumeRequest",
        volume_id="v",
        target_path="/t" * 100,
    )
    found = COMPILED["csi.v0"].check_message(req)
    assert [(v.rule.id, v.rule.level) for v in found] == [("csi.size-limit-recommended", "SHOULD")]


@pytest.mark.parametrize("spec", ["cosi.v1alpha1", "cmi.v1"])
def test_size_limit_in_cosi_and_cmi(spec):
    name, field = {
        "cosi.v1alpha1": ("DriverCreateBucketRequest", "name"),
        "cmi.v1": ("DeleteMachineRequest", "MachineName"),
    }[spec]
    extra = {"ProviderSpec": b"x"} if spec == "cmi.v1" else {}
    family = TABLES[spec].family
    ok = msg(spec, name, **{field: "x" * 128}, **extra)
    bad = msg(spec, name, **{field: "x" * 129}, **extra)
    assert rules_of(spec, ok) == []
    assert rules_of(spec, bad) == [(f"{family}.size-limit", field)]


# -- family 3: formats ---------------------------------------------------------------------------

NAME_CASES = [
    ("a", True),
    ("csi.example.com", True),
    ("a" * 63, True),
    ("a" * 64, False),
    ("A1-b.c2", True),
    ("9driver", True),
    ("-driver", False),
    ("driver-", False),
    (".driver", False),
    ("driver.", False),
    ("dri_ver", False),
    ("dri ver", False),
    ("a..b", False),
    ("a-.b", False),
    ("a.-b", False),
    ("ä.example", False),
]


@pytest.mark.parametrize(("name", "valid"), NAME_CASES)
def test_plugin_name_edge_cases(name, valid):
    assert (plugin_name_problem(name) is None) is valid


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("csi.v1", "GetPluginInfoResponse"),
        ("csi.v0", "GetPluginInfoResponse"),
        ("cosi.v1alpha1", "DriverGetInfoResponse"),
        ("cmi.v1", "GetPluginInfoResponse"),
    ],
)
def test_plugin_name_rule_per_spec(spec, message):
    family = TABLES[spec].family
    version = {"csi.v1": "vendor_version", "csi.v0": "vendor_version", "cmi.v1": "version"}
    extra = {version[spec]: "1"} if spec in version else {}
    good = msg(spec, message, name="fake.plugproxy.io", **extra)
    bad = msg(spec, message, name="-Fake_Plugin!", **extra)
    assert rules_of(spec, good) == []
    found = COMPILED[spec].check_message(bad)
    assert [(v.rule.id, v.field) for v in found] == [(f"{family}.plugin-name-format", "name")]
    assert "Fake_Plugin" not in found[0].message


def test_csi_v0_plugin_names_may_hold_underscores():
    """CSI v0.3 §GetPluginInfo allows '_' between; CSI v1.12 does not."""
    v0 = msg("csi.v0", "GetPluginInfoResponse", name="com.example_csi", vendor_version="1")
    v1 = msg("csi.v1", "GetPluginInfoResponse", name="com.example_csi", vendor_version="1")
    assert rules_of("csi.v0", v0) == []
    assert rules_of("csi.v1", v1) == [("csi.plugin-name-format", "name")]
    assert plugin_name_problem("_com.example", underscores=True) is not None


def test_csi_v0_max_volumes_per_node_is_not_negative():
    """CSI v0.3 §NodeGetInfo: the plugin MUST NOT set a negative max_volumes_per_node."""
    bad = msg("csi.v0", "NodeGetInfoResponse", node_id="n", max_volumes_per_node=-1)
    assert rules_of("csi.v0", bad) == [("csi.negative-value", "max_volumes_per_node")]
    assert rules_of("csi.v0", msg("csi.v0", "NodeGetInfoResponse", node_id="n")) == []


def test_banned_control_characters_in_names():
    cap = [{"mount": {}, "access_mode": {"mode": 1}}]
    ok = msg("csi.v1", "CreateVolumeRequest", name="pvc-1\t\u00e9", volume_capabilities=cap)
    bad = msg("csi.v1", "CreateVolumeRequest", name="pvc\x07-1", volume_capabilities=cap)
    assert rules_of("csi.v1", ok) == []
    assert rules_of("csi.v1", bad) == [("csi.name-banned-characters", "name")]
    snap = msg("csi.v1", "CreateSnapshotRequest", name="s\x85", source_volume_id="v")
    assert rules_of("csi.v1", snap) == [("csi.name-banned-characters", "name")]


def test_secret_keys_by_option_and_by_table():
    ok = msg("csi.v1", "DeleteVolumeRequest", volume_id="v", secrets={"user.name-1_x": "s"})
    bad = msg("csi.v1", "DeleteVolumeRequest", volume_id="v", secrets={"user name": "hunter2"})
    assert rules_of("csi.v1", ok) == []
    found = COMPILED["csi.v1"].check_message(bad)
    assert [(v.rule.id, v.field) for v in found] == [("csi.secret-key-format", "secrets")]
    assert "hunter2" not in found[0].message and "user name" not in found[0].message
    v0 = msg("csi.v0", "DeleteVolumeRequest", volume_id="v", controller_delete_secrets={"a/b": "s"})
    assert rules_of("csi.v0", v0) == [("csi.secret-key-format", "controller_delete_secrets")]
    cmi = msg(
        "cmi.v1", "DeleteMachineRequest", MachineName="m", ProviderSpec=b"x", Secrets={"a b": b""}
    )
    assert rules_of("cmi.v1", cmi) == [("cmi.secret-key-format", "Secrets")]


def test_negative_values():
    assert rules_of("csi.v1", msg("csi.v1", "GetCapacityResponse", available_capacity=-1)) == [
        ("csi.negative-value", "available_capacity")
    ]
    wrapped = msg("csi.v1", "GetCapacityResponse", maximum_volume_size={"value": -5})
    assert rules_of("csi.v1", wrapped) == [("csi.negative-value", "maximum_volume_size")]
    assert rules_of("csi.v1", msg("csi.v1", "GetCapacityResponse", available_capacity=0)) == []


def test_descriptors_decide_what_a_field_is():
    # Every string field of csi.v1 gets a size check unless the table overrides it.
    desc = load_spec("csi.v1").descriptor("csi.v1.NodePublishVolumeRequest")
    strings = [f.name for f in desc.fields if f.type == FieldDescriptor.TYPE_STRING]
    assert {"volume_id", "target_path", "staging_target_path"} <= set(strings)


def test_required_with_a_caveat_is_reported_at_must_and_never_rejected():
    req = msg("csi.v1", "DeleteVolumeGroupSnapshotRequest", group_snapshot_id="g")
    found = COMPILED["csi.v1"].check_message(req)
    assert [(v.rule.id, v.rule.level, v.field) for v in found] == [
        ("csi.required-field-caveat", "MUST", "snapshot_ids")
    ]
    assert found[0].rule.reject_code is None


def test_requests_are_checked_in_full_long_response_lists_by_sample():
    cs = COMPILED["csi.v1"]
    ok_cap = {"mount": {}, "access_mode": {"mode": 1}}
    caps = [ok_cap] * 1000
    caps[700] = {"mount": {}}
    req = msg("csi.v1", "CreateVolumeRequest", name="n", volume_capabilities=caps)
    assert ("csi.required-field", "volume_capabilities[700].access_mode") in rules_of("csi.v1", req)
    entries = [{"volume": {"volume_id": f"v{i}"}} for i in range(2000)]
    entries[-1] = {}
    resp = msg("csi.v1", "ListVolumesResponse", entries=entries)
    checker = cs.response_checkers["csi.v1.ListVolumesResponse"]
    out: list = []
    checker(resp, "", out)
    # the last entry is always among the sampled ones
    assert [(v.rule.id, v.field) for v in out] == [("csi.required-field", "entries[1999].volume")]


# -- size limits: who made the value (spec-coverage audit FP-1, FP-2, FP-8, FP-9) -------------


def oversized(spec: str, ref: tuple[str, str]) -> Any:
    """A message of ``ref``'s type whose field holds a value over every size limit."""
    desc = load_spec(spec).descriptor(f"{TABLES[spec].package}.{ref[0]}")
    fd = desc.fields_by_name[ref[1]]
    if fd.message_type is not None:  # map<string,string>
        value: Any = {"k": "v" * 5000}
    elif fd.is_repeated:  # over 2048 bytes too, COSI v1alpha2's limit for ids
        value = ["x" * 3000]
    else:
        value = "x" * 3000
    return msg(spec, ref[0], **{ref[1]: value})


def size_findings(spec: str, message: Any, field: str) -> list[str]:
    return [
        rule
        for rule, path in rules_of(spec, message)
        if rule.endswith("size-limit") and (path == field or path.startswith(field + "["))
    ]


ECHOES = [(spec, echo, maker) for spec, t in TABLES.items() for echo, maker in t.echoes.items()]


@pytest.mark.parametrize(
    ("spec", "echo", "maker"), ECHOES, ids=[f"{s}-{e[0]}.{e[1]}" for s, e, _ in ECHOES]
)
def test_a_plugin_made_value_is_judged_where_made_not_where_passed_back(spec, echo, maker):
    family = TABLES[spec].family
    # The plugin returning it over the limit is its violation ...
    assert size_findings(spec, oversized(spec, maker), maker[1]) == [f"{family}.size-limit"]
    # ... the CO passing the same value back is not the CO's.
    assert size_findings(spec, oversized(spec, echo), echo[1]) == []


def test_echoes_cover_the_ids_tokens_and_contexts_the_co_passes_back():
    v1 = TABLES["csi.v1"].echoes
    for ref in (
        ("DeleteVolumeRequest", "volume_id"),
        ("ListVolumesRequest", "starting_token"),
        ("ListSnapshotsRequest", "starting_token"),
        ("DeleteSnapshotRequest", "snapshot_id"),
        ("DeleteVolumeGroupSnapshotRequest", "group_snapshot_id"),
        ("ControllerPublishVolumeRequest", "node_id"),
        ("NodePublishVolumeRequest", "volume_context"),
        ("NodeStageVolumeRequest", "publish_context"),
    ):
        assert ref in v1, ref
    assert ("DeleteMachineRequest", "ProviderID") in TABLES["cmi.v1"].echoes
    assert ("DriverDeleteBucketRequest", "bucket_id") in TABLES["cosi.v1alpha1"].echoes


def test_in_one_request_what_the_co_made_is_judged_and_what_it_passes_back_is_blamed_on_the_plugin():
    cap = [{"mount": {}, "access_mode": {"mode": 1}}]
    req = msg("csi.v1", "CreateVolumeRequest", name="n" * 129, volume_capabilities=cap)
    assert ("csi.size-limit", "name") in rules_of("csi.v1", req)
    big = {f"k{i}": "v" * 100 for i in range(41)}
    publish = msg(
        "csi.v1",
        "NodePublishVolumeRequest",
        volume_id="v" * 200,  # the plugin's
        target_path="/t",
        volume_capability=cap[0],
        secrets=big,  # the CO's
        volume_context=big,  # the plugin's, passed back
    )
    # an id passed back is judged against its maker's limit and blamed on the plugin,
    # never enforced; a map passed back is not judged (the CO adds entries to some)
    assert rules_of("csi.v1", publish) == [
        ("csi.size-limit-echoed", "volume_id"),
        ("csi.size-limit", "secrets"),
    ]
    echoed = COMPILED["csi.v1"].check_message(publish)[0]
    assert (echoed.party, echoed.enforceable) == ("plugin", False)
    cmi = msg(
        "cmi.v1",
        "DeleteMachineRequest",
        MachineName="m" * 129,  # the client's
        ProviderID="p" * 190,  # the plugin's, passed back
        ProviderSpec=b"x",
    )
    assert rules_of("cmi.v1", cmi) == [
        ("cmi.size-limit", "MachineName"),
        ("cmi.size-limit-echoed", "ProviderID"),
    ]
    cosi = msg(
        "cosi.v1alpha1",
        "DriverRevokeBucketAccessRequest",
        bucket_id="b" * 200,
        account_id="a" * 200,
        revoke_access_context=big,
    )
    assert rules_of("cosi.v1alpha1", cosi) == [
        ("cosi.size-limit-echoed", "bucket_id"),
        ("cosi.size-limit-echoed", "account_id"),
        ("cosi.size-limit", "revoke_access_context"),
    ]


def test_an_id_passed_back_is_reported_once_where_this_socket_saw_it_made():
    cs = compile_table(TABLES["csi.v1"], load_spec("csi.v1"))
    long_id = "v" * 200
    delete = msg("csi.v1", "DeleteVolumeRequest", volume_id=long_id)
    assert [v.rule.id for v in cs.check_message(delete)] == ["csi.size-limit-echoed"]
    made = msg("csi.v1", "CreateVolumeResponse", volume={"volume_id": long_id})
    found: list[Any] = []
    cs.response_checkers["csi.v1.CreateVolumeResponse"](made, "", found)
    assert [(v.rule.id, v.field) for v in found] == [("csi.size-limit", "volume.volume_id")]
    # reported where it was made: passing it back adds nothing
    assert cs.check_message(delete) == []
    other = msg("csi.v1", "DeleteVolumeRequest", volume_id="w" * 200)
    assert [v.rule.id for v in cs.check_message(other)] == ["csi.size-limit-echoed"]


def test_kubelet_volume_context_with_tokens_is_not_judged_at_the_echo():
    context = {"csi.storage.k8s.io/serviceAccount.tokens": "t" * 4600, "pool": "default"}
    req = publish_request("/var/lib/kubelet/pods/p/volumes/mount")
    req.volume_context.update(context)
    assert rules_of("csi.v1", req) == []
    made = msg("csi.v1", "Volume", volume_id="v", volume_context=context)
    assert rules_of("csi.v1", made) == [("csi.size-limit", "volume_context")]


@pytest.mark.parametrize(
    "status", ["ListVolumesResponse.VolumeStatus", "ControllerGetVolumeResponse.VolumeStatus"]
)
def test_node_id_allowance_covers_published_node_ids(status):
    assert rules_of("csi.v1", msg("csi.v1", status, published_node_ids=["n" * 256])) == []
    over = msg("csi.v1", status, published_node_ids=["n" * 128, "n" * 257])
    assert rules_of("csi.v1", over) == [("csi.size-limit", "published_node_ids[1]")]


@pytest.mark.parametrize(
    ("spec", "name", "fields", "field"),
    [
        ("csi.v1", "VolumeCondition", {"abnormal": True}, "message"),
        ("csi.v1", "ValidateVolumeCapabilitiesResponse", {}, "message"),
        ("csi.v0", "ValidateVolumeCapabilitiesResponse", {"supported": False}, "message"),
        ("csi.v0", "SnapshotStatus", {"type": 3}, "details"),
    ],
)
def test_human_readable_messages_over_128_bytes_are_advisory(spec, name, fields, field):
    assert rules_of(spec, msg(spec, name, **fields, **{field: "m" * 128})) == []
    found = COMPILED[spec].check_message(msg(spec, name, **fields, **{field: "m" * 149}))
    assert [(v.rule.id, v.rule.level, v.field) for v in found] == [
        ("csi.size-limit-recommended", "SHOULD", field)
    ]


def test_cmi_machine_list_is_judged_per_provider_id_not_in_total():
    listing = {f"azure:///subscriptions/s/vm-{i:05d}": f"shoot--worker-{i:05d}" for i in range(300)}
    resp = msg("cmi.v1", "ListMachinesResponse", MachineList=listing)
    assert sum(len(k) + len(v) for k, v in listing.items()) > 4096
    assert rules_of("cmi.v1", resp) == []
    listing["p" * 190] = "m"
    found = rules_of("cmi.v1", msg("cmi.v1", "ListMachinesResponse", MachineList=listing))
    assert [(rule, path.split("[")[0]) for rule, path in found] == [
        ("cmi.size-limit", "MachineList")
    ]
    assert found[0][1].startswith("MachineList[key ")
    # the names came from the client: not the plugin's to answer for
    names = msg("cmi.v1", "ListMachinesResponse", MachineList={"p": "m" * 300})
    assert rules_of("cmi.v1", names) == []
    ids = msg("cmi.v1", "GetVolumeIDsResponse", VolumeIDs=["v" * 300])
    assert rules_of("cmi.v1", ids) == []


# -- ValidateVolumeCapabilities: field by field (FP-6) ----------------------------------------


def validate_findings(requested: list[dict], confirmed: list[dict]) -> list[str]:
    from plugproxy.rules.csi_v1 import _checks

    req = msg(
        "csi.v1", "ValidateVolumeCapabilitiesRequest", volume_id="v", volume_capabilities=requested
    )
    resp = msg(
        "csi.v1",
        "ValidateVolumeCapabilitiesResponse",
        confirmed={"volume_capabilities": confirmed},
    )
    st = SpecState()
    return [v.rule.id for v in _checks.validate_response(COMPILED["csi.v1"], st, None, req, resp)]


MOUNT_GROUP = {
    "mount": {"fs_type": "ext4", "volume_mount_group": "2000"},
    "access_mode": {"mode": 1},
}


@pytest.mark.parametrize(
    "confirmed",
    [
        {"mount": {"fs_type": "xfs"}, "access_mode": {"mode": 1}},  # another value
        {"block": {}, "access_mode": {"mode": 1}},  # another access type
        {"mount": {"fs_type": "ext4"}, "access_mode": {"mode": 5}},  # another mode
        {"mount": {"mount_flags": ["ro"]}, "access_mode": {"mode": 1}},  # a flag not asked for
    ],
)
def test_confirmed_capabilities_are_compared_field_by_field(confirmed):
    # An older plugin confirms without the newer fields it does not know: tolerated.
    older = {"mount": {"fs_type": "ext4"}, "access_mode": {"mode": 1}}
    assert validate_findings([MOUNT_GROUP], [older]) == []
    assert validate_findings([MOUNT_GROUP], [MOUNT_GROUP]) == []
    # What a confirmed capability does set must be what was asked for.
    assert validate_findings([MOUNT_GROUP], [confirmed]) == ["csi.validate-confirmed-mismatch"]


# -- lifecycle state: bounded and forgetting (FP-4, FP-7) ------------------------------------


def test_lifecycle_state_expires_and_is_bounded():
    now = [0.0]
    st = SpecState(max_volumes=2, lifecycle_ttl=60.0, clock=lambda: now[0])
    st.volume("a").published = ("/t",)
    now[0] = 30.0
    st.touch("a")  # in use: kept for another TTL
    now[0] = 80.0
    assert st.peek("a") is not None
    now[0] = 200.0
    assert st.peek("a") is None  # nobody touched it: forgotten, i.e. unknown
    for vid in ("b", "c", "d"):
        st.volume(vid)
    assert len(st.volumes) == 2


# -- absolute paths (CSI v1.12 and v0.3: "It MUST be an absolute path") -----------------------

POD_UID = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
PV = "pvc-3f0e4a6e-9a43-4c3e-8a5e-3b1f3e0c9d11"
KUBELET_TARGET = f"/var/lib/kubelet/pods/{POD_UID}/volumes/kubernetes.io~csi/{PV}/mount"
KUBELET_STAGE = (
    f"/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/{'a1' * 32}/globalmount"
)
MOUNT_CAP = {"mount": {}, "access_mode": {"mode": 1}}

# spec, message, the path field, the other fields a legitimate call sets
PATH_CASES = [
    ("csi.v1", "NodeStageVolumeRequest", "staging_target_path", {"volume_capability": MOUNT_CAP}),
    ("csi.v1", "NodeUnstageVolumeRequest", "staging_target_path", {}),
    (
        "csi.v1",
        "NodePublishVolumeRequest",
        "staging_target_path",
        {"target_path": KUBELET_TARGET, "volume_capability": MOUNT_CAP},
    ),
    ("csi.v1", "NodePublishVolumeRequest", "target_path", {"volume_capability": MOUNT_CAP}),
    ("csi.v1", "NodeUnpublishVolumeRequest", "target_path", {}),
    ("csi.v1", "NodeGetVolumeStatsRequest", "volume_path", {}),
    ("csi.v1", "NodeGetVolumeStatsRequest", "staging_target_path", {"volume_path": KUBELET_TARGET}),
    ("csi.v1", "NodeExpandVolumeRequest", "staging_target_path", {"volume_path": KUBELET_TARGET}),
    ("csi.v0", "NodeStageVolumeRequest", "staging_target_path", {"volume_capability": MOUNT_CAP}),
    ("csi.v0", "NodeUnstageVolumeRequest", "staging_target_path", {}),
    (
        "csi.v0",
        "NodePublishVolumeRequest",
        "staging_target_path",
        {"target_path": KUBELET_TARGET, "volume_capability": MOUNT_CAP},
    ),
    ("csi.v0", "NodePublishVolumeRequest", "target_path", {"volume_capability": MOUNT_CAP}),
    ("csi.v0", "NodeUnpublishVolumeRequest", "target_path", {}),
]


@pytest.mark.parametrize(
    ("spec", "message", "path", "others"),
    PATH_CASES,
    ids=[f"{s}-{m}.{p}" for s, m, p, _ in PATH_CASES],
)
def test_node_paths_must_be_absolute(spec, message, path, others):
    def req(value: str) -> Any:
        return msg(spec, message, volume_id="vol-1", **{**others, path: value})

    judged = [
        (rule, field)
        for rule, field in rules_of(spec, req("var/lib/kubelet/x"))
        if "size" not in rule
    ]
    assert judged == [("csi.path-not-absolute", path)]
    assert ("csi.path-not-absolute", path) in rules_of(spec, req("./globalmount"))
    for good in (KUBELET_TARGET, KUBELET_STAGE, "/s", "c:\\var\\lib\\kubelet\\pods\\x\\mount"):
        # (CSI v0.3 paths over 128 bytes draw the advisory csi.size-limit-recommended)
        assert [r for r, _ in rules_of(spec, req(good)) if "size" not in r] == [], good


def test_every_path_the_spec_calls_absolute_is_listed_and_no_other():
    assert TABLES["csi.v1"].absolute_paths == tuple(
        (m, p) for s, m, p, _ in PATH_CASES if s == "csi.v1"
    )
    assert TABLES["csi.v0"].absolute_paths == tuple(
        (m, p) for s, m, p, _ in PATH_CASES if s == "csi.v0"
    )
    # NodeExpandVolumeRequest.volume_path: the spec says "REQUIRED", not "absolute".
    expand = msg("csi.v1", "NodeExpandVolumeRequest", volume_id="v", volume_path="rel")
    assert rules_of("csi.v1", expand) == []


def test_an_empty_optional_path_is_not_judged_a_missing_required_one_is_reported_once():
    optional = msg("csi.v1", "NodeGetVolumeStatsRequest", volume_id="v", volume_path=KUBELET_TARGET)
    assert rules_of("csi.v1", optional) == []
    optional.staging_target_path = "staging/x"  # set: judged
    assert rules_of("csi.v1", optional) == [("csi.path-not-absolute", "staging_target_path")]
    required = msg("csi.v1", "NodeUnpublishVolumeRequest", volume_id="v")
    assert rules_of("csi.v1", required) == [("csi.required-field", "target_path")]


# -- topology (CSI §CreateVolume, Topology and TopologyRequirement) --------------------------

ZONE = "topology.kubernetes.io/zone"
EBS_ZONE = "topology.ebs.csi.aws.com/zone"
REAL_TOPOLOGIES = [
    {ZONE: "us-east-1a"},
    {EBS_ZONE: "us-east-1a", "kubernetes.io/hostname": "ip-10-0-1-23.ec2.internal"},
    {"topology.gke.io/zone": "europe-west1-b", "topology.kubernetes.io/region": "europe-west1"},
    {"rack": "R3", "zone": "Z_1"},  # keys without a prefix
    {"com.company.example/zone": "z" * 63, "n" * 63: "v"},  # 63 is the limit
]
# a key or value -> the rule it breaks
BAD_KEYS = [
    ("Topology.Example.com/zone", "csi.topology-key-format"),  # upper-case prefix
    ("topology.example_x.com/zone", "csi.topology-key-format"),  # '_' in the prefix
    ("topology..example.com/zone", "csi.topology-key-format"),  # empty label
    ("-topology.example.com/zone", "csi.topology-key-format"),
    (("p" * 64) + "/zone", "csi.topology-key-format"),
    ("/zone", "csi.topology-key-format"),
    ("topology.example.com/", "csi.topology-key-format"),  # no name
    ("a/b/zone", "csi.topology-key-format"),
    ("zone-", "csi.topology-key-format"),
    ("zo ne", "csi.topology-key-format"),
    ("z" * 64, "csi.topology-key-format"),
]
BAD_VALUES = ["", "-us-east-1a", "us-east-1a.", "us east", "v" * 64, "zone/1"]


def topology_findings(spec: str, message: Any) -> list[tuple[str, str]]:
    return [(r, f) for r, f in rules_of(spec, message) if r.startswith("csi.topology")]


def node_info(spec: str, segments: dict[str, str]) -> Any:
    return msg(spec, "NodeGetInfoResponse", node_id="n", accessible_topology={"segments": segments})


def create_request(spec: str, **requirement: Any) -> Any:
    return msg(
        spec,
        "CreateVolumeRequest",
        name="pvc-1",
        volume_capabilities=[MOUNT_CAP],
        accessibility_requirements=requirement,
    )


def test_a_csi_v0_key_prefix_is_in_reverse_domain_name_notation():
    """CSI v0.3 §CreateVolume, Topology: the prefix is a reverse domain name, and its
    characters are a key name's (upper case and '_' allowed)."""
    for good in ("com.company.example/zone", "Com.Example_Co/rack", "topology.kubernetes.io/zone"):
        assert topology_findings("csi.v0", node_info("csi.v0", {good: "z1"})) == []
    for bad in ("company/zone", "com..company/zone"):
        assert topology_findings("csi.v0", node_info("csi.v0", {bad: "z1"})) == [
            ("csi.topology-key-format", "accessible_topology.segments[key 0]")
        ]


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
@pytest.mark.parametrize("segments", REAL_TOPOLOGIES)
def test_real_world_topologies_pass_in_both_directions(spec, segments):
    assert rules_of(spec, node_info(spec, segments)) == []
    request = create_request(
        spec, requisite=[{"segments": segments}], preferred=[{"segments": segments}]
    )
    assert rules_of(spec, request) == []
    # the same call with the last value spoilt is caught, from either party
    key = list(segments)[-1]
    spoilt = {**segments, key: segments[key] + "-"}
    plugin = node_info(spec, spoilt)
    last = list(plugin.accessible_topology.segments).index(key)  # the map's own order
    assert topology_findings(spec, plugin) == [
        ("csi.topology-value-format", f"accessible_topology.segments[value {last}]")
    ]
    request = create_request(spec, requisite=[{"segments": spoilt}])
    last = list(request.accessibility_requirements.requisite[0].segments).index(key)
    assert topology_findings(spec, request) == [
        (
            "csi.topology-value-format",
            f"accessibility_requirements.requisite[0].segments[value {last}]",
        )
    ]


@pytest.mark.parametrize(("key", "rule"), BAD_KEYS, ids=[k[:20] for k, _ in BAD_KEYS])
def test_topology_key_format_judges_the_plugin_and_the_co(key, rule):
    plugin = node_info("csi.v1", {ZONE: "us-east-1a", key: "us-east-1a"})
    # map order is the wire's: find the position the bad key landed at
    pos = list(plugin.accessible_topology.segments).index(key)
    assert topology_findings("csi.v1", plugin) == [
        (rule, f"accessible_topology.segments[key {pos}]")
    ]
    co = create_request("csi.v1", requisite=[{"segments": {key: "us-east-1a"}}])
    assert topology_findings("csi.v1", co) == [
        (rule, "accessibility_requirements.requisite[0].segments[key 0]")
    ]


@pytest.mark.parametrize("value", BAD_VALUES)
def test_topology_value_format_judges_the_plugin_and_the_co(value):
    plugin = node_info("csi.v1", {EBS_ZONE: value})
    assert topology_findings("csi.v1", plugin) == [
        ("csi.topology-value-format", "accessible_topology.segments[value 0]")
    ]
    co = create_request("csi.v1", preferred=[{"segments": {ZONE: value}}])
    assert topology_findings("csi.v1", co) == [
        ("csi.topology-value-format", "accessibility_requirements.preferred[0].segments[value 0]")
    ]
    found = COMPILED["csi.v1"].check_message(plugin)
    assert all(value not in v.message for v in found if value)  # values are never quoted


def test_topology_keys_are_case_insensitive():
    plugin = node_info("csi.v1", {"zone": "Z1", "Zone": "Z2"})
    second = list(plugin.accessible_topology.segments)[1]  # the map's own order
    assert second.lower() == "zone"
    assert topology_findings("csi.v1", plugin) == [
        ("csi.topology-key-duplicate", "accessible_topology.segments[key 1]")
    ]
    co = msg(
        "csi.v1",
        "GetCapacityRequest",
        accessible_topology={"segments": {ZONE: "a", "rack": "r1", "RACK": "r2"}},
    )
    assert [r for r, _ in topology_findings("csi.v1", co)] == ["csi.topology-key-duplicate"]
    assert topology_findings("csi.v1", node_info("csi.v1", {"zone": "Z1", "rack": "Z1"})) == []


def test_topology_requirement_needs_requisite_or_preferred():
    for spec in ("csi.v1", "csi.v0"):
        assert topology_findings(spec, create_request(spec)) == [
            ("csi.topology-requirement-empty", "accessibility_requirements")
        ]
        only_preferred = create_request(spec, preferred=[{"segments": {ZONE: "us-east-1a"}}])
        assert topology_findings(spec, only_preferred) == []
        only_requisite = create_request(spec, requisite=[{"segments": {ZONE: "us-east-1a"}}])
        assert topology_findings(spec, only_requisite) == []
    # absent altogether: nothing to judge
    plain = msg("csi.v1", "CreateVolumeRequest", name="p", volume_capabilities=[MOUNT_CAP])
    assert rules_of("csi.v1", plain) == []


def test_preferred_topologies_must_be_in_requisite():
    a, b, c = ({ZONE: z} for z in ("us-east-1a", "us-east-1b", "us-east-1c"))
    for spec in ("csi.v1", "csi.v0"):
        good = create_request(
            spec,
            requisite=[{"segments": a}, {"segments": b}, {"segments": c}],
            preferred=[{"segments": c}, {"segments": a}],
        )
        assert topology_findings(spec, good) == []
        bad = create_request(
            spec,
            requisite=[{"segments": a}, {"segments": b}],
            preferred=[{"segments": a}, {"segments": c}],
        )
        assert topology_findings(spec, bad) == [
            ("csi.topology-preferred-not-requisite", "accessibility_requirements.preferred[1]")
        ]
        # keys are case-insensitive, values are not
        upper = {"Topology.Kubernetes.io/Zone": "us-east-1a"}
        same = create_request(
            spec, requisite=[{"segments": a}], preferred=[{"segments": {ZONE: "us-east-1a"}}]
        )
        assert topology_findings(spec, same) == []
        assert (
            "csi.topology-preferred-not-requisite",
            "accessibility_requirements.preferred[0]",
        ) not in (
            topology_findings(
                spec,
                create_request(spec, requisite=[{"segments": upper}], preferred=[{"segments": a}]),
            )
        )
        other_value = create_request(
            spec, requisite=[{"segments": a}], preferred=[{"segments": {ZONE: "US-EAST-1A"}}]
        )
        assert topology_findings(spec, other_value) == [
            ("csi.topology-preferred-not-requisite", "accessibility_requirements.preferred[0]")
        ]


def topology_fields(spec: str) -> list[tuple[str, str]]:
    """(message, field) of every field of type Topology in ``spec``'s descriptors."""
    s = load_spec(spec)
    full = f"{TABLES[spec].package}.Topology"
    return sorted(
        (name, fd.name)
        for name in s.message_classes
        for fd in s.descriptor(name).fields
        if fd.message_type is not None and fd.message_type.full_name == full
    )


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
def test_topology_is_judged_in_every_field_the_descriptors_hold(spec):
    fields = topology_fields(spec)
    names = {f"{m.rsplit('.', 1)[-1]}.{f}" for m, f in fields}
    assert {
        "GetCapacityRequest.accessible_topology",
        "NodeGetInfoResponse.accessible_topology",
        "Volume.accessible_topology",
        "TopologyRequirement.requisite",
        "TopologyRequirement.preferred",
    } <= names
    s = load_spec(spec)
    for message, name in fields:
        fd = s.descriptor(message).fields_by_name[name]
        value: Any = {"segments": {"zone-": "a"}}
        m = s.message_class(message)(**{name: [value] if fd.is_repeated else value})
        at = f"{name}[0]" if fd.is_repeated else name
        found = [(v.rule.id, v.field) for v in COMPILED[spec].check_message(m)]
        assert ("csi.topology-key-format", f"{at}.segments[key 0]") in found, message
    # nested at depth, in a response list
    page = msg(
        spec,
        "ListVolumesResponse",
        entries=[{"volume": {"accessible_topology": [{"segments": {ZONE: ""}}]}}],
    )
    ident = "volume_id" if spec == "csi.v1" else "id"
    page.entries[0].volume.__setattr__(ident, "v")
    assert topology_findings(spec, page) == [
        ("csi.topology-value-format", "entries[0].volume.accessible_topology[0].segments[value 0]")
    ]


def test_csi_v0_key_prefix_follows_its_own_text():
    # CSI v0.3: the prefix takes the characters of a name; v1 wants lower-case DNS notation.
    segments = {"Com.Example_Storage/zone": "z1"}
    assert topology_findings("csi.v0", node_info("csi.v0", segments)) == []
    assert topology_findings("csi.v1", node_info("csi.v1", segments)) == [
        ("csi.topology-key-format", "accessible_topology.segments[key 0]")
    ]
    bad = {"-com.example/zone": "z1"}
    assert topology_findings("csi.v0", node_info("csi.v0", bad)) == [
        ("csi.topology-key-format", "accessible_topology.segments[key 0]")
    ]


@pytest.mark.parametrize(
    ("spec", "capability"),
    [("csi.v1", "VOLUME_ACCESSIBILITY_CONSTRAINTS"), ("csi.v0", "ACCESSIBILITY_CONSTRAINTS")],
)
def test_get_capacity_topology_needs_the_accessibility_capability(spec, capability):
    (check,) = TABLES[spec].request_checks["GetCapacity"]
    assert TABLES[spec].capability_needs["GetCapacity"] == ("plugin",)
    cs = COMPILED[spec]
    with_topology = msg(
        spec, "GetCapacityRequest", accessible_topology={"segments": {ZONE: "us-east-1a"}}
    )
    without = msg(spec, "GetCapacityRequest")
    st = SpecState()
    assert list(check(cs, st, None, with_topology)) == []  # capabilities unknown: not judged
    st.set_capabilities("plugin", frozenset({"CONTROLLER_SERVICE"}))
    found = [(v.rule.id, v.field) for v in check(cs, st, None, with_topology)]
    assert found == [("csi.capacity-topology-without-capability", "accessible_topology")]
    assert list(check(cs, st, None, without)) == []
    st.set_capabilities("plugin", frozenset({"CONTROLLER_SERVICE", capability}))
    assert list(check(cs, st, None, with_topology)) == []


def test_every_controller_rpc_is_one_a_controller_plugin_should_implement():
    """CSI v1.12 §Volume Lifecycle: the list follows the Controller service's methods."""
    service = load_spec("csi.v1").descriptor("csi.v1.CreateVolumeRequest").file.services_by_name
    assert TABLES["csi.v1"].recommended_rpcs == {m.name for m in service["Controller"].methods}
