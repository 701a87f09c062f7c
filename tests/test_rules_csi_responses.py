"""CSI response content and streams (rules/csi_responses.py): each rule planted by the party
it judges and found, and the same call made legitimately not flagged. Driven in-process
through the real validate stage; the delete answers also through a real proxy."""

from __future__ import annotations

import io
import itertools
from collections.abc import Sequence
from typing import Any

import grpc
import pytest

from plugproxy.api import Call, LazyMessage, Runtime, StatusCode
from plugproxy.core.log import Logger
from plugproxy.core.sampling import SAMPLE_MIN_BYTES, picked_indices
from plugproxy.fakes import FailureRule, FakeKnobs
from plugproxy.rules.csi_responses import STREAM_KEY
from plugproxy.spec.registry import Registry, load_spec
from plugproxy.stages.validate import ValidateStage
from tests.integration.test_validation_lifecycle import stage_of, through_proxy

OK = grpc.StatusCode.OK
PKG = {"csi.v1": "csi.v1", "csi.v0": "csi.v0"}
SERVICE = {
    "CreateVolume": "Controller",
    "ListSnapshots": "Controller",
    "DeleteVolume": "Controller",
    "DeleteSnapshot": "Controller",
    "ControllerExpandVolume": "Controller",
    "NodeExpandVolume": "Node",
    "CreateVolumeGroupSnapshot": "GroupController",
    "GetVolumeGroupSnapshot": "GroupController",
    "DeleteVolumeGroupSnapshot": "GroupController",
    "GetMetadataAllocated": "SnapshotMetadata",
    "GetMetadataDelta": "SnapshotMetadata",
}
Finding = tuple[str, str, str, str]  # rule, party, field, message


class Harness:
    """One validate stage of one spec, fed calls message by message as the pipeline does."""

    def __init__(self, spec: str = "csi.v1") -> None:
        self.spec = spec
        self.registry = Registry([spec])
        runtime = Runtime(
            registry=self.registry, upstream=None, logger=Logger(io.StringIO()), metrics=None
        )
        self.stage = ValidateStage(runtime, "audit", {})
        self.classes = load_spec(spec)

    def new(self, type_name: str, /, **fields: Any) -> Any:
        return self.classes.message_class(f"{PKG[self.spec]}.{type_name}")(**fields)

    async def call(
        self,
        rpc: str,
        request: Any,
        responses: Sequence[Any | bytes] = (),
        code: grpc.StatusCode = OK,
        details: str = "failed",
    ) -> list[Finding]:
        method = self.registry.lookup(f"/{PKG[self.spec]}.{SERVICE[rpc]}/{rpc}")
        call = Call(method, (), [], 5.0)
        call.request = LazyMessage(request.SerializeToString(), method.request_class)
        pending = self.stage.on_start(call)
        if pending is not None:
            await pending  # a gated RPC: the capability query fails (no upstream), fail open
        for resp in responses:
            raw = resp if isinstance(resp, bytes) else resp.SerializeToString()
            message = LazyMessage(raw, method.response_class)
            call.response = message
            self.stage.on_response(call, message)
        call.code = StatusCode.of(code)
        call.details = "" if code is OK else details
        self.stage.on_finish(call)
        return [
            (
                str(e.attributes["rule"]),
                str(e.attributes["party"]),
                str(e.attributes["field"]),
                str(e.attributes["message"]),
            )
            for e in call.events
            if e.name == "violation"
        ]


def rules(findings: list[Finding]) -> set[str]:
    return {f[0] for f in findings}


def only(findings: list[Finding], rule: str) -> Finding:
    (found,) = [f for f in findings if f[0] == rule]
    return found


# -- csi.list-filter-mismatch -----------------------------------------------------------------


def snapshot(h: Harness, sid: str, source: str, **more: Any) -> dict[str, Any]:
    if h.spec == "csi.v0":
        return {"id": sid, "source_volume_id": source, "created_at": 1, **more}
    return {
        "snapshot_id": sid,
        "source_volume_id": source,
        "creation_time": {"seconds": 1},
        "ready_to_use": True,
        **more,
    }


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
async def test_list_snapshots_outside_the_source_volume_filter(spec):
    h = Harness(spec)
    req = h.new("ListSnapshotsRequest", source_volume_id="vol-a")
    good = h.new(
        "ListSnapshotsResponse",
        entries=[{"snapshot": snapshot(h, f"s{i}", "vol-a")} for i in range(3)],
    )
    assert await h.call("ListSnapshots", req, [good]) == []
    bad = h.new(
        "ListSnapshotsResponse",
        entries=[
            {"snapshot": snapshot(h, "s0", "vol-a")},
            {"snapshot": snapshot(h, "s1", "vol-secret-b")},
            {"snapshot": snapshot(h, "s2", "vol-secret-c")},
        ],
    )
    _, party, field, message = only(
        await h.call("ListSnapshots", req, [bad]), "csi.list-filter-mismatch"
    )
    assert party == "plugin" and field == "entries[1].snapshot.source_volume_id"
    assert "source_volume_id filter" in message and "2 such entries" in message
    assert "vol-secret" not in message and "vol-a" not in message
    # An entry without a source is the required-field rule's, not a filter mismatch.
    no_source = h.new("ListSnapshotsResponse", entries=[{"snapshot": snapshot(h, "s0", "")}])
    assert rules(await h.call("ListSnapshots", req, [no_source])) == {"csi.required-field"}


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
async def test_list_snapshots_outside_the_snapshot_id_filter(spec):
    h = Harness(spec)
    id_field = "snapshot_id" if spec == "csi.v1" else "id"
    req = h.new("ListSnapshotsRequest", snapshot_id="s1")
    good = h.new("ListSnapshotsResponse", entries=[{"snapshot": snapshot(h, "s1", "v")}])
    assert await h.call("ListSnapshots", req, [good]) == []
    # an empty page for a snapshot not seen alive moments ago is fine (csi.snapshot-missing
    # judges one that was)
    gone = h.new("ListSnapshotsRequest", snapshot_id="s0")
    empty = h.new("ListSnapshotsResponse")
    assert await h.call("ListSnapshots", gone, [empty]) == []
    bad = h.new(
        "ListSnapshotsResponse",
        entries=[{"snapshot": snapshot(h, "s1", "v")}, {"snapshot": snapshot(h, "s2", "v")}],
    )
    found = only(await h.call("ListSnapshots", req, [bad]), "csi.list-filter-mismatch")
    assert found[2] == f"entries[1].snapshot.{id_field}"
    # No filter: every snapshot belongs in the listing.
    unfiltered = h.new("ListSnapshotsRequest")
    assert await h.call("ListSnapshots", unfiltered, [bad]) == []


async def test_a_sampled_listing_names_the_real_entry():
    h = Harness()
    n = 3000
    kept = picked_indices(n)
    late = kept[-5]  # kept by the sample, far past its head
    assert late > len(kept)
    page = h.new("ListSnapshotsResponse")
    for i in range(n):
        source = "vol-other" if i in (late, kept[-2]) else "vol-a"
        page.entries.add().snapshot.CopyFrom(h.new("Snapshot", **snapshot(h, f"s{i:05d}", source)))
    raw = page.SerializeToString()
    assert len(raw) >= SAMPLE_MIN_BYTES
    req = h.new("ListSnapshotsRequest", source_volume_id="vol-a")
    found = only(await h.call("ListSnapshots", req, [raw]), "csi.list-filter-mismatch")
    assert found[2] == f"entries[{late}].snapshot.source_volume_id"
    assert f"entries[{late}]" in found[3] and "(2 such entries in the sample)" in found[3]


# -- csi.capacity-out-of-range for the expansions -------------------------------------------------


@pytest.mark.parametrize(
    ("rpc", "request_fields"),
    [
        ("ControllerExpandVolume", {"volume_id": "v"}),
        ("NodeExpandVolume", {"volume_id": "v", "volume_path": "/mnt/v"}),
    ],
)
async def test_expansion_below_required_bytes(rpc, request_fields):
    h = Harness()
    gib = 1 << 30
    req = h.new(f"{rpc}Request", capacity_range={"required_bytes": 2 * gib}, **request_fields)
    answer = f"{rpc}Response"
    extra = {"node_expansion_required": True} if rpc == "ControllerExpandVolume" else {}
    assert await h.call(rpc, req, [h.new(answer, capacity_bytes=2 * gib, **extra)]) == []
    # A volume already larger than the target SHOULD be answered 0 OK, with its real size.
    limited = h.new(
        f"{rpc}Request",
        capacity_range={"required_bytes": 2 * gib, "limit_bytes": 2 * gib},
        **request_fields,
    )
    assert await h.call(rpc, limited, [h.new(answer, capacity_bytes=5 * gib, **extra)]) == []
    # NodeExpandVolume's capacity is OPTIONAL: 0 is unknown, not too small.
    if rpc == "NodeExpandVolume":
        assert await h.call(rpc, req, [h.new(answer)]) == []
    found = only(
        await h.call(rpc, req, [h.new(answer, capacity_bytes=gib, **extra)]),
        "csi.capacity-out-of-range",
    )
    assert found[1:] == (
        "plugin",
        "capacity_bytes",
        f"capacity_bytes {gib} is below capacity_range.required_bytes {2 * gib}",
    )


async def test_capacity_out_of_range_cites_the_rpc_it_judges():
    h = Harness()
    method = h.registry.lookup("/csi.v1.Controller/CreateVolume")
    assert method is not None
    rule = h.stage._plans[method.path].spec.rule("capacity-out-of-range")
    assert rule.section_for("CreateVolume") == "CSI v1.12 §CreateVolume"
    assert rule.section_for("NodeExpandVolume") == "CSI v1.12 §NodeExpandVolume"


# -- group snapshots ------------------------------------------------------------------------------


def group(h: Harness, gid: str, members: list[dict[str, Any]], ready: bool) -> Any:
    return {
        "group_snapshot_id": gid,
        "snapshots": members,
        "creation_time": {"seconds": 1},
        "ready_to_use": ready,
    }


def member(h: Harness, sid: str, gid: str, ready: bool = True) -> dict[str, Any]:
    return snapshot(h, sid, f"vol-{sid}", group_snapshot_id=gid, ready_to_use=ready)


GROUP_CALLS = [
    ("CreateVolumeGroupSnapshot", {"name": "g", "source_volume_ids": ["vol-a", "vol-b"]}),
    ("GetVolumeGroupSnapshot", {"group_snapshot_id": "g1", "snapshot_ids": ["a", "b"]}),
]


@pytest.mark.parametrize(("rpc", "fields"), GROUP_CALLS)
async def test_member_group_snapshot_id_must_be_the_groups(rpc, fields):
    h = Harness()
    req = h.new(f"{rpc}Request", **fields)
    answer = f"{rpc}Response"
    good = h.new(answer, group_snapshot=group(h, "g1", [member(h, "a", "g1")], True))
    assert await h.call(rpc, req, [good]) == []
    # An empty member id is tolerated (OPTIONAL: a member deletable on its own).
    unset = h.new(answer, group_snapshot=group(h, "g1", [member(h, "a", "")], True))
    assert await h.call(rpc, req, [unset]) == []
    bad = h.new(
        answer,
        group_snapshot=group(h, "g1", [member(h, "a", "g1"), member(h, "b", "g-secret")], True),
    )
    found = only(await h.call(rpc, req, [bad]), "csi.group-snapshot-id-mismatch")
    assert found[1:3] == ("plugin", "group_snapshot.snapshots[1].group_snapshot_id")
    assert "1 of 2 members" in found[3] and "g-secret" not in found[3]


@pytest.mark.parametrize(("rpc", "fields"), GROUP_CALLS)
async def test_group_ready_to_use_follows_its_members(rpc, fields):
    h = Harness()
    req = h.new(f"{rpc}Request", **fields)
    answer = f"{rpc}Response"
    mixed = [member(h, "a", "g1"), member(h, "b", "g1", ready=False)]
    ready = [member(h, "a", "g1"), member(h, "b", "g1")]
    # Legitimate: not ready while a member is processing; ready once all are.
    assert (
        await h.call(rpc, req, [h.new(answer, group_snapshot=group(h, "g1", mixed, False))]) == []
    )
    assert await h.call(rpc, req, [h.new(answer, group_snapshot=group(h, "g1", ready, True))]) == []
    found = await h.call(rpc, req, [h.new(answer, group_snapshot=group(h, "g1", mixed, True))])
    assert rules(found) == {"csi.group-ready-mismatch"}
    assert found[0][1:3] == ("plugin", "group_snapshot.ready_to_use")
    assert "1 of 2 member snapshots are not ready" in found[0][3]
    found = await h.call(rpc, req, [h.new(answer, group_snapshot=group(h, "g1", ready, False))])
    assert rules(found) == {"csi.group-not-ready"}
    levels = {e["rule"]: e["level"] for e in h.stage.report.snapshot()}
    assert levels == {"csi.group-ready-mismatch": "MUST", "csi.group-not-ready": "SHOULD"}


# -- snapshot metadata streams --------------------------------------------------------------------

FIXED, VARIABLE = 1, 2
BLOCK = 4096


def metadata(
    h: Harness,
    tuples: Sequence[tuple[int, int]],
    style: int = FIXED,
    capacity: int = 1 << 30,
    rpc: str = "GetMetadataAllocated",
) -> Any:
    resp = h.new(f"{rpc}Response", block_metadata_type=style, volume_capacity_bytes=capacity)
    for offset, size in tuples:
        resp.block_metadata.add(byte_offset=offset, size_bytes=size)
    return resp


def blocks(start: int, count: int, step: int = 2) -> list[tuple[int, int]]:
    """``count`` FIXED_LENGTH tuples from block ``start``, every ``step``-th block."""
    return [((start + i * step) * BLOCK, BLOCK) for i in range(count)]


ALLOCATED = ("GetMetadataAllocated", {"snapshot_id": "s1"})
DELTA = ("GetMetadataDelta", {"base_snapshot_id": "s1", "target_snapshot_id": "s2"})


@pytest.mark.parametrize(("rpc", "fields"), [ALLOCATED, DELTA])
async def test_a_well_formed_stream_is_clean(rpc, fields):
    h = Harness()
    req = h.new(f"{rpc}Request", **fields)
    stream = [
        metadata(h, blocks(0, 4), rpc=rpc),
        metadata(h, blocks(8, 4), rpc=rpc),  # adjacent to the last tuple is fine: end == next
        metadata(h, [], rpc=rpc),
        metadata(h, blocks(16, 4, step=1), rpc=rpc),
    ]
    assert await h.call(rpc, req, stream) == []
    variable = [
        metadata(h, [(0, 100), (100, 5000)], VARIABLE, rpc=rpc),
        metadata(h, [(9000, 1), (9001, 70000)], VARIABLE, rpc=rpc),
    ]
    assert await h.call(rpc, req, variable) == []


@pytest.mark.parametrize(
    ("tuples", "words"),
    [
        ([(0, BLOCK), (BLOCK // 2, BLOCK)], f"is below {BLOCK}, the end of"),  # overlap
        ([(2 * BLOCK, BLOCK), (0, BLOCK)], f"is not above {2 * BLOCK}, the byte_offset of"),
        ([(0, BLOCK), (0, BLOCK)], "is not above 0"),  # not strictly increasing
    ],
)
async def test_metadata_order_within_a_message(tuples, words):
    h = Harness()
    req = h.new("GetMetadataAllocatedRequest", snapshot_id="s1")
    found = only(await h.call(*ALLOCATED[:1], req, [metadata(h, tuples)]), "csi.metadata-order")
    assert found[1:3] == ("plugin", "block_metadata[1].byte_offset")
    assert words in found[3] and "the tuple before it" in found[3]


async def test_metadata_order_across_messages_is_reported_once_per_stream():
    h = Harness()
    req = h.new("GetMetadataAllocatedRequest", snapshot_id="s1")
    # Each message restarts at 0: in order inside, out of order across the stream.
    stream = [metadata(h, blocks(0, 4)) for _ in range(5)]
    found = await h.call("GetMetadataAllocated", req, stream)
    assert rules(found) == {"csi.metadata-order"} and len(found) == 1
    assert found[0][2] == "block_metadata[0].byte_offset"
    assert "last tuple of message #1 of this stream (message #2)" in found[0][3]
    # A new call is a new stream: its first message is judged afresh.
    assert await h.call("GetMetadataAllocated", req, stream[:1]) == []


async def test_metadata_size_zero():
    h = Harness()
    req = h.new("GetMetadataDeltaRequest", base_snapshot_id="a", target_snapshot_id="b")
    bad = metadata(h, [(0, 10), (10, 0), (20, -5)], VARIABLE, rpc="GetMetadataDelta")
    found = only(await h.call("GetMetadataDelta", req, [bad]), "csi.metadata-size-zero")
    assert found[1:3] == ("plugin", "block_metadata[1].size_bytes")
    assert "is 0" in found[3] and "2 such tuple(s)" in found[3]


@pytest.mark.parametrize(
    ("second", "field"),
    [
        ({"style": VARIABLE}, "block_metadata_type"),
        ({"capacity": 2 << 30}, "volume_capacity_bytes"),
    ],
)
async def test_metadata_stream_changed(second, field):
    h = Harness()
    req = h.new("GetMetadataAllocatedRequest", snapshot_id="s1")
    stream = [metadata(h, blocks(0, 2)), metadata(h, blocks(4, 2), **second)]
    stream.append(metadata(h, blocks(8, 2), **second))  # stays changed: reported once
    found = await h.call("GetMetadataAllocated", req, stream)
    assert rules(found) == {"csi.metadata-stream-changed"} and len(found) == 1
    assert found[0][1:3] == ("plugin", field)
    assert "message #1 of this stream said" in found[0][3]
    if field == "block_metadata_type":
        assert "VARIABLE_LENGTH" in found[0][3] and "FIXED_LENGTH" in found[0][3]


async def test_metadata_fixed_length_within_and_across_messages():
    h = Harness()
    req = h.new("GetMetadataAllocatedRequest", snapshot_id="s1")
    within = metadata(h, [(0, BLOCK), (BLOCK, BLOCK), (4 * BLOCK, 2 * BLOCK)])
    found = only(await h.call("GetMetadataAllocated", req, [within]), "csi.metadata-fixed-length")
    assert found[1:3] == ("plugin", "block_metadata[2].size_bytes")
    across = [metadata(h, blocks(0, 2)), metadata(h, [(100 * BLOCK, 2 * BLOCK)])]
    found = only(await h.call("GetMetadataAllocated", req, across), "csi.metadata-fixed-length")
    assert found[2] == "block_metadata[0].size_bytes" and f"are {BLOCK} bytes" in found[3]
    # VARIABLE_LENGTH sizes may vary freely.
    variable = [metadata(h, [(0, BLOCK), (BLOCK, 3 * BLOCK)], VARIABLE)]
    assert await h.call("GetMetadataAllocated", req, variable) == []


def big_message(h: Harness, offsets: Sequence[int]) -> bytes:
    raw = metadata(h, [(o, BLOCK) for o in offsets]).SerializeToString()
    assert len(raw) >= SAMPLE_MIN_BYTES
    return raw


async def test_a_sampled_message_raises_no_false_order_alarm():
    """Tuples the sample keeps side by side are far apart on the wire: only neighbours on
    the wire are compared, so a well-ordered large message is clean."""
    h = Harness()
    n = 20_000
    kept = picked_indices(n)
    assert any(b - a > 1 for a, b in itertools.pairwise(kept))
    offsets = [i * 2 * BLOCK for i in range(n)]
    req = h.new("GetMetadataAllocatedRequest", snapshot_id="s1")
    first = big_message(h, offsets)
    # The next message continues after the real last tuple, which the sample keeps.
    second = big_message(h, [offsets[-1] + 2 * BLOCK + o for o in offsets])
    assert await h.call("GetMetadataAllocated", req, [first, second]) == []


async def test_a_sampled_message_is_judged_on_every_tuple():
    """A message the proxy keeps only a sample of (plugproxy.core.sampling) is decoded whole for
    its tuples: a breach anywhere is found and named by its wire index."""
    h = Harness()
    n = 20_000
    kept = picked_indices(n)
    req = h.new("GetMetadataAllocatedRequest", snapshot_id="s1")
    for where in (50, next(i for i in range(1, n) if i not in kept and i - 1 not in kept)):
        bad = [i * 2 * BLOCK for i in range(n)]
        bad[where] = bad[where - 1] + BLOCK // 2  # overlaps the tuple before it
        found = only(
            await h.call("GetMetadataAllocated", req, [big_message(h, bad)]),
            "csi.metadata-order",
        )
        assert found[2] == f"block_metadata[{where}].byte_offset"
    # and a zero size or a FIXED_LENGTH size that differs, far from what the sample keeps
    far = next(i for i in range(n // 2, n) if i not in kept)
    for size, rule in ((0, "csi.metadata-size-zero"), (BLOCK // 2, "csi.metadata-fixed-length")):
        msg = metadata(h, [(i * 2 * BLOCK, size if i == far else BLOCK) for i in range(n)])
        raw = msg.SerializeToString()
        assert len(raw) >= SAMPLE_MIN_BYTES
        found = only(await h.call("GetMetadataAllocated", req, [raw]), rule)
        assert found[2] == f"block_metadata[{far}].size_bytes"


async def test_a_long_message_is_judged_on_every_tuple():
    """A message under the sampling size with thousands of tuples: each is judged."""
    h = Harness()
    n = 3000
    good = [i * 2 * BLOCK for i in range(n)]
    raw = metadata(h, [(o, BLOCK) for o in good]).SerializeToString()
    assert len(raw) < SAMPLE_MIN_BYTES
    req = h.new("GetMetadataAllocatedRequest", snapshot_id="s1")
    assert await h.call("GetMetadataAllocated", req, [raw]) == []
    for p in (1, n // 3 + 7, n - 1):
        bad = list(good)
        bad[p] = bad[p - 1]
        found = only(
            await h.call("GetMetadataAllocated", req, [metadata(h, [(o, BLOCK) for o in bad])]),
            "csi.metadata-order",
        )
        assert found[2] == f"block_metadata[{p}].byte_offset"


# -- csi.delete-not-idempotent --------------------------------------------------------------------

DELETES = {
    "csi.v1": [
        ("DeleteVolume", {"volume_id": "v"}, "volume_id"),
        ("DeleteSnapshot", {"snapshot_id": "s"}, "snapshot_id"),
        ("DeleteVolumeGroupSnapshot", {"group_snapshot_id": "g", "snapshot_ids": ["s"]}, None),
    ],
    "csi.v0": [
        ("DeleteVolume", {"volume_id": "v"}, "volume_id"),
        ("DeleteSnapshot", {"snapshot_id": "s"}, "snapshot_id"),
    ],
}


@pytest.mark.parametrize(
    ("spec", "rpc", "fields", "field"),
    [(spec, *case) for spec, cases in DELETES.items() for case in cases],
)
async def test_delete_answered_not_found(spec, rpc, fields, field):
    h = Harness(spec)
    req = h.new(f"{rpc}Request", **fields)
    assert await h.call(rpc, req, [h.new(f"{rpc}Response")]) == []
    assert await h.call(rpc, req, code=grpc.StatusCode.FAILED_PRECONDITION) == []
    found = await h.call(rpc, req, code=grpc.StatusCode.NOT_FOUND)
    # The MUST replaces the SHOULD csi.error-code-unexpected for this answer.
    assert rules(found) == {"csi.delete-not-idempotent"}
    _, party, where, message = found[0]
    assert party == "plugin" and where == (field or "group_snapshot_id")
    assert message.startswith(f"{rpc} answered NOT_FOUND")


async def test_delete_not_found_through_a_real_proxy(tmp_path):
    knobs = FakeKnobs(failures={"DeleteVolume": FailureRule(grpc.StatusCode.NOT_FOUND, 1)})
    async with through_proxy("csi.v1", tmp_path, "--validation", "enforce", knobs=knobs) as (
        c,
        proxy,
    ):
        await c.call("ControllerGetCapabilities")
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.call("DeleteVolume", volume_id="vol-gone")
        assert exc.value.code() is grpc.StatusCode.NOT_FOUND  # the plugin's answer, unaltered
        await c.call("DeleteVolume", volume_id="vol-gone")  # the legitimate answer: 0 OK
        found = {
            (e["rule"], e["level"], e["party"], e["count"])
            for e in stage_of(proxy).report.snapshot()
        }
    assert found == {("csi.delete-not-idempotent", "MUST", "plugin", 1)}


def test_v0_has_only_the_rules_that_apply_to_it():
    v0 = {
        r.id
        for r in Harness("csi.v0").stage._plans["/csi.v0.Controller/DeleteVolume"].spec.table.rules
    }
    assert {"csi.list-filter-mismatch", "csi.delete-not-idempotent"} <= v0
    assert not {r for r in v0 if r.startswith(("csi.metadata-", "csi.group-"))} - {
        "csi.metadata-max-results",
        "csi.metadata-offset",
    }


# -- csi.topology-outside-requisite --------------------------------------------------------


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
async def test_a_volume_placed_outside_every_requisite_topology_is_found(spec):
    """§CreateVolume: with requisite set, the volume MUST be accessible from a requisite
    topology. A coarser entry (no rack) or another case of a key is within it."""
    h = Harness(spec)
    zone, rack = "topology.example.com/zone", "topology.example.com/rack"
    requirement = h.new(
        "TopologyRequirement",
        requisite=[
            h.new("Topology", segments={zone: "z1", rack: "r1"}),
            h.new("Topology", segments={zone: "z2"}),
        ],
    )
    cap = h.new("VolumeCapability", mount=h.new("VolumeCapability.MountVolume"))
    cap.access_mode.mode = 1
    req = h.new(
        "CreateVolumeRequest",
        name="pvc-1",
        volume_capabilities=[cap],
        accessibility_requirements=requirement,
    )
    id_field = "volume_id" if spec == "csi.v1" else "id"

    def answer(*segments: dict[str, str]) -> Any:
        volume = h.new(
            "Volume",
            **{id_field: "vol-1"},
            accessible_topology=[h.new("Topology", segments=s) for s in segments],
        )
        return h.new("CreateVolumeResponse", volume=volume)

    ours = "csi.topology-outside-requisite"
    for fine in (
        answer({zone: "z1"}),  # coarser than the first requisite topology
        answer({"Topology.Example.com/Zone": "z2", rack: "r9"}),  # the second, finer
        answer({zone: "z9"}, {zone: "z2"}),  # one of them is enough
        answer(),  # no topology returned: not judged here
    ):
        assert ours not in [f[0] for f in await h.call("CreateVolume", req, [fine])]
    found = await h.call("CreateVolume", req, [answer({zone: "z1", rack: "r2"}, {zone: "z3"})])
    mine = [f for f in found if f[0] == ours]
    assert [(f[1], f[2]) for f in mine] == [("plugin", "volume.accessible_topology")]
    assert "z3" not in mine[0][3] and "none of the 2" in mine[0][3]


@pytest.mark.parametrize("spec", ["csi.v1", "csi.v0"])
async def test_the_count_rules_of_requisite_topologies_are_judged(spec):
    """§CreateVolume, TopologyRequirement: with x entries returned for n requisite, x <= n
    takes x unique requisite topologies, x >= n reaches every one; a coarser entry reaches
    each topology of it, and no entry at all means accessible from everywhere."""
    h = Harness(spec)
    region, zone = "topology.example.com/region", "topology.example.com/zone"
    id_field = "volume_id" if spec == "csi.v1" else "id"

    def z(name: str) -> dict[str, str]:
        return {region: "r1", zone: name}

    def judged(requisite: list[dict[str, str]], *returned: dict[str, str]) -> list[Any]:
        req = h.new(
            "CreateVolumeRequest",
            name="pvc-1",
            volume_capabilities=[h.new("VolumeCapability", mount={}, access_mode={"mode": 1})],
            accessibility_requirements={"requisite": [{"segments": s} for s in requisite]},
        )
        volume = h.new(
            "Volume",
            **{id_field: "vol-1"},
            accessible_topology=[{"segments": s} for s in returned],
        )
        return h.call("CreateVolume", req, [h.new("CreateVolumeResponse", volume=volume)])

    ours = "csi.topology-count"
    for requisite, returned in (
        ([z("a"), z("b")], [z("a"), z("b")]),  # x == n: all of them
        ([z("a"), z("b"), z("c")], [z("c"), z("a")]),  # x < n: unique, from requisite
        ([z("a")], [z("a"), z("q")]),  # x > n: requisite plus a free choice
        ([z("a"), z("b")], [{region: "r1"}]),  # a regional volume reaches both zones
        ([z("a"), z("b")], []),  # accessible from everywhere
    ):
        found = await judged(requisite, *returned)
        assert ours not in [f[0] for f in found], (requisite, returned, found)
    for requisite, returned, said in (
        ([z("a"), z("b")], [z("a"), z("q")], "1 of the 2 accessible_topology entries"),
        ([z("a"), z("b"), z("c")], [z("a"), z("a")], "repeat another"),
        ([z("a"), z("b")], [z("a"), z("q"), z("w")], "1 of the 2 requisite topologies"),
    ):
        mine = [f for f in await judged(requisite, *returned) if f[0] == ours]
        assert len(mine) == 1 and mine[0][1] == "plugin" and said in mine[0][3], mine
        assert "topology.example.com" not in mine[0][3]  # no value is quoted


async def test_a_long_stream_is_judged_on_every_tuple_and_across_messages():
    """30,000 tuples in 30 messages: every one is judged, and order across messages too."""
    h = Harness()
    req = h.new("GetMetadataAllocatedRequest", snapshot_id="s1")
    per, messages = 1000, 30
    stream = [metadata(h, blocks(m * per * 2, per)) for m in range(messages)]
    assert await h.call("GetMetadataAllocated", req, stream) == []
    # the last message starts inside the one before it: found at the message boundary
    late = [*stream[:-1], metadata(h, blocks((messages - 1) * per * 2 - 4, per))]
    method = h.registry.lookup("/csi.v1.SnapshotMetadata/GetMetadataAllocated")
    call = Call(method, (), [], 5.0)
    call.request = LazyMessage(req.SerializeToString(), method.request_class)
    h.stage.on_start(call)
    for resp in late:
        lazy = LazyMessage(resp.SerializeToString(), method.response_class)
        call.response = lazy
        h.stage.on_response(call, lazy)
    assert call.stage_state[STREAM_KEY].read == messages * per
    h.stage.on_finish(call)
    found = [e.attributes for e in call.events if e.name == "violation"]
    assert [(f["rule"], f["field"]) for f in found] == [
        ("csi.metadata-order", "block_metadata[0].byte_offset")
    ]
