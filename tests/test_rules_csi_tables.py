"""What the csi.v1 and csi.v0 tables share: written once, it names fields and RPCs each
version has, under that version's names, and both tables carry it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from plugproxy.rules import (
    TABLES,
    csi_capabilities,
    csi_listings,
    csi_metadata,
    csi_order,
    csi_placement,
    csi_readonly,
    csi_recovery,
    csi_responses,
    csi_snapshots,
    csi_tables,
    csi_volumes,
)
from plugproxy.rules.engine import CO, MUST, Hooks, Rule, Violation, merged
from plugproxy.spec.csi_names import CSI_V0_NAMES, CSI_V1_NAMES, CsiNames
from plugproxy.spec.registry import declared_paths, load_spec

VERSIONS = [("csi.v0", CSI_V0_NAMES), ("csi.v1", CSI_V1_NAMES)]


def message(spec: str, name: str) -> Descriptor:
    desc: Descriptor = load_spec(spec).descriptor(f"{spec}.{name}")
    return desc


def field(spec: str, ref: tuple[str, str]) -> FieldDescriptor:
    fields = message(spec, ref[0]).fields_by_name
    assert ref[1] in fields, f"{spec}: {ref[0]} has no field {ref[1]!r}"
    fd: FieldDescriptor = fields[ref[1]]
    return fd


def rpcs(spec: str) -> set[str]:
    return {path.rsplit("/", 1)[1] for path in declared_paths(spec)}


@pytest.mark.parametrize(("spec", "names"), VERSIONS)
def test_required_fields_exist_in_each_version(spec: str, names: CsiNames) -> None:
    for msg, fields in csi_tables.required(names).items():
        desc = message(spec, msg)
        for name in fields:
            if name.startswith("oneof:"):
                assert name[6:] in desc.oneofs_by_name, (spec, msg, name)
            else:
                field(spec, (msg, name))


@pytest.mark.parametrize(("spec", "names"), VERSIONS)
def test_each_echo_passes_back_a_value_of_its_makers_kind(spec: str, names: CsiNames) -> None:
    made = csi_tables.echoes(names)
    assert ("Volume", names.volume_id) in made.values()
    for echo, maker in made.items():
        passed, original = field(spec, echo), field(spec, maker)
        assert passed.type == original.type, (spec, echo, maker)
        assert not echo[0].endswith("Response") and not maker[0].endswith("Request"), echo


@pytest.mark.parametrize(("spec", "names"), VERSIONS)
def test_rows_name_rpcs_and_request_fields_each_version_has(spec: str, names: CsiNames) -> None:
    defined = rpcs(spec)
    shared = [
        csi_tables.RPC_GATES,
        csi_tables.BACKOFF_RPC,
        csi_tables.state_changes(csi_tables.REQUEST_CODES, bool),
    ]
    for rows in shared:
        assert set(rows) <= defined, (spec, set(rows) - defined)
    assert csi_tables.CONTROLLER_SERVICE.rpcs | csi_tables.NODE_RPCS <= defined
    for rpc, row in (
        ("NodeStageVolume", csi_tables.staged_arguments(names)),
        ("NodePublishVolume", csi_tables.node_published_arguments(names)),
    ):
        assert row.must_change
        for name in row.must_change:
            field(spec, (f"{rpc}Request", name))
    for rpc, change in csi_tables.state_changes(csi_tables.REQUEST_CODES, bool).items():
        for name in change.paths:
            field(spec, (f"{rpc}Request", name))


@pytest.mark.parametrize(("spec", "names"), VERSIONS)
def test_both_tables_carry_what_they_share(spec: str, names: CsiNames) -> None:
    table = TABLES[spec]
    assert csi_tables.required(names).items() <= table.required.items()
    assert csi_tables.echoes(names).items() <= table.echoes.items()
    assert csi_tables.RPC_GATES.items() <= table.rpc_gates.items()
    assert table.services["Controller"] == csi_tables.CONTROLLER_SERVICE
    assert table.services["Node"].rpcs >= csi_tables.NODE_RPCS
    assert table.fix_first["INVALID_ARGUMENT"] == csi_tables.FIX_REQUEST
    rows = table.fix_first_rpc
    assert rows["NodeStageVolume"]["ALREADY_EXISTS"] == csi_tables.staged_arguments(names)
    assert rows["NodePublishVolume"] == {
        "ALREADY_EXISTS": csi_tables.node_published_arguments(names),
        "FAILED_PRECONDITION": csi_tables.STAGE_FIRST,
    }
    assert rows["CreateVolume"]["ALREADY_EXISTS"] == csi_tables.VOLUME_ARGUMENTS
    assert rows["CreateVolume"]["OUT_OF_RANGE"] == csi_tables.CAPACITY_RANGE
    assert rows["CreateSnapshot"]["ALREADY_EXISTS"] == csi_tables.SNAPSHOT_ARGUMENTS
    for rpc, change in csi_tables.state_changes(csi_tables.REQUEST_CODES, bool).items():
        if rpc != "CreateVolume":
            assert table.state_changes[rpc].broken_by == change.broken_by, rpc
            assert table.state_changes[rpc].paths == change.paths, rpc
    assert table.accepted_not_judged == {"csi.call-order"}


def test_v0_3_backs_off_its_pending_rows_and_v1_every_aborted() -> None:
    v0, v1 = TABLES["csi.v0"], TABLES["csi.v1"]
    assert v1.backoff == {"ABORTED"} and not v0.backoff
    for rpc, rows in csi_tables.BACKOFF_RPC.items():
        assert v1.backoff_rpc[rpc] == rows, rpc
        pending = {"ABORTED": True} if rpc in (v0.pending_rpcs or ()) else {}
        assert v0.backoff_rpc[rpc] == {**rows, **pending}, rpc
    assert v0.pending_rpcs is not None
    # every RPC whose v0.3 table has "Operation pending" may answer ABORTED
    assert all("ABORTED" in v0.error_codes[rpc] for rpc in v0.pending_rpcs)
    assert v0.backoff_rpc["CreateSnapshot"] == {"ABORTED": True}


@pytest.mark.parametrize("spec", ["csi.v0", "csi.v1"])
def test_capability_queries_name_the_versions_own_rpcs(spec: str) -> None:
    table = TABLES[spec]
    assert set(table.capability_queries.values()) <= declared_paths(spec)
    assert {path.rsplit("/", 1)[1] for path in table.capability_queries.values()} == set(
        table.capability_responses
    )
    assert set(table.capability_responses.values()) == set(table.capability_queries)
    assert ("group" in table.capability_queries) is (spec == "csi.v1")


def test_a_table_runs_its_own_checks_first_then_the_csi_families() -> None:
    own = Hooks(
        rules=(Rule("csi.example", MUST, (CO,), "Example §x", "An example."),),
        request_checks={"CreateVolume": (example_check,)},
    )
    table = csi_tables.csi_table(
        spec="csi.v1", title="Example", v1=True, capability_kinds=("plugin",), own=(own,)
    )
    families = merged(
        csi_capabilities.hooks("Example", v1=True),
        csi_volumes.hooks("Example", v1=True),
        csi_snapshots.hooks("Example", v1=True),
        csi_listings.hooks("Example"),
        csi_metadata.hooks("Example"),
        csi_order.hooks("Example", v1=True),
        csi_responses.hooks("Example", v1=True),
        csi_readonly.hooks("Example", v1=True),
        csi_recovery.hooks("Example", v1=True),
        csi_placement.hooks("Example", v1=True),
    )
    assert table.rules == (own.rules[0], *families["rules"])
    assert table.request_checks["CreateVolume"][0] is example_check
    assert table.capability_queries == {"plugin": "/csi.v1.Identity/GetPluginCapabilities"}
    assert table.capability_responses == {"GetPluginCapabilities": "plugin"}
    assert (table.spec, table.package, table.family, table.title) == (
        "csi.v1",
        "csi.v1",
        "csi",
        "Example",
    )


def example_check(cs: Any, st: Any, call: Any, req: Any) -> Iterable[Violation]:
    return ()
