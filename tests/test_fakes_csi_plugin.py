"""The CSI fake both versions share: the same RPCs answer in each version's names, with each
version's content sources, answer shapes and advertised capabilities."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from plugproxy.fakes.common import FakeError, enum_name
from plugproxy.fakes.csi_model import MAX_VOLUME_SIZE, NODE_ID
from plugproxy.fakes.csi_plugin import HEALTHY, FakeCsi
from plugproxy.fakes.csi_v0 import FakeCsiV0
from plugproxy.fakes.csi_v1 import FakeCsiV1

MOUNT = {"mount": {"fs_type": "ext4"}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
ZONE_KEY = "topology.fake.plugproxy.io/zone"


def call(plugin: FakeCsi, rpc: str, **fields: Any) -> Any:
    """The plugin's answer to ``rpc`` with a request of ``fields`` (JSON names)."""
    request = json_format.ParseDict(fields, plugin.new(f"{rpc}Request"))
    return asyncio.run(getattr(plugin, rpc)(request, None))


def failure(plugin: FakeCsi, rpc: str, **fields: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(FakeError) as err:
        call(plugin, rpc, **fields)
    return err.value.code, err.value.message


def advertised(response: Any, kind: str) -> list[str]:
    return [
        enum_name(getattr(c, kind), "type")
        for c in response.capabilities
        if c.WhichOneof("type") == kind
    ]


@pytest.fixture(params=[FakeCsiV0, FakeCsiV1], ids=["csi.v0", "csi.v1"])
def plugin(request: pytest.FixtureRequest) -> FakeCsi:
    fake: FakeCsi = request.param()
    return fake


def test_each_version_advertises_its_own_capabilities(plugin: FakeCsi) -> None:
    identity = call(plugin, "GetPluginCapabilities")
    assert advertised(identity, "service") == list(plugin.plugin_services)
    assert advertised(identity, "volume_expansion") == list(plugin.volume_expansion)
    controller = call(plugin, "ControllerGetCapabilities")
    assert advertised(controller, "rpc") == list(plugin.controller_capabilities)
    assert advertised(call(plugin, "NodeGetCapabilities"), "rpc") == list(plugin.node_capabilities)
    assert plugin.backend.multi_writer_modes is plugin.multi_writer_modes


def test_what_the_two_versions_advertise() -> None:
    assert FakeCsiV0.plugin_services == ("CONTROLLER_SERVICE", "ACCESSIBILITY_CONSTRAINTS")
    assert FakeCsiV0.volume_expansion == ()
    assert FakeCsiV1.volume_expansion == ("ONLINE",)
    # v1 keeps every controller capability of v0.3, in the same order, and adds its own
    v0, v1 = FakeCsiV0.controller_capabilities, FakeCsiV1.controller_capabilities
    assert v1[: len(v0)] == v0 and len(v1) > len(v0)
    assert not FakeCsiV0.multi_writer_modes and FakeCsiV1.multi_writer_modes


def test_volumes_and_snapshots_are_written_in_each_versions_names(plugin: FakeCsi) -> None:
    names = plugin.names
    vol = call(plugin, "CreateVolume", name="a", volume_capabilities=[MOUNT]).volume
    vid = getattr(vol, names.volume_id)
    assert vid == next(iter(plugin.backend.volumes))
    assert dict(getattr(vol, names.volume_context)) == plugin.backend.volumes[vid].context
    assert [dict(t.segments) for t in vol.accessible_topology] == [{ZONE_KEY: "zone-a"}]

    snap = call(plugin, "CreateSnapshot", name="s", source_volume_id=vid).snapshot
    sid = getattr(snap, names.snapshot_id)
    made = plugin.backend.snapshots[sid]
    assert snap.source_volume_id == vid and snap.size_bytes == made.size
    created = getattr(snap, names.snapshot_created)
    ready = getattr(snap, names.snapshot_ready)
    if isinstance(created, int):  # v0.3: nanoseconds and a SnapshotStatus
        assert created == made.created_ns
        assert enum_name(ready, "type") == "READY"
    else:
        assert created.ToNanoseconds() == made.created_ns
        assert ready is True
    assert [
        getattr(e.snapshot, names.snapshot_id) for e in call(plugin, "ListSnapshots").entries
    ] == [sid]

    source = {"snapshot": {names.snapshot_id: sid}}
    restored = call(
        plugin,
        "CreateVolume",
        name="b",
        volume_capabilities=[MOUNT],
        volume_content_source=source,
    ).volume
    assert getattr(restored.content_source.snapshot, names.snapshot_id) == sid
    assert plugin.backend.volumes[getattr(restored, names.volume_id)].source == ("snapshot", sid)


@pytest.mark.parametrize(
    ("fake", "source", "message"),
    [
        (FakeCsiV0, {}, "volume_content_source must name a snapshot"),
        (FakeCsiV0, {"snapshot": {}}, "volume_content_source.snapshot.id is required"),
        (FakeCsiV1, {}, "volume_content_source must name a snapshot or a volume"),
        (FakeCsiV1, {"snapshot": {}}, "volume_content_source.snapshot id is required"),
        (FakeCsiV1, {"volume": {}}, "volume_content_source.volume id is required"),
    ],
)
def test_a_content_source_is_refused_in_each_versions_words(
    fake: type[FakeCsi], source: dict[str, Any], message: str
) -> None:
    code, text = failure(
        fake(), "CreateVolume", name="c", volume_capabilities=[MOUNT], volume_content_source=source
    )
    assert (code, text) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_v1_clones_a_volume() -> None:
    plugin = FakeCsiV1()
    vid = call(plugin, "CreateVolume", name="a", volume_capabilities=[MOUNT]).volume.volume_id
    clone = call(
        plugin,
        "CreateVolume",
        name="b",
        volume_capabilities=[MOUNT],
        volume_content_source={"volume": {"volume_id": vid}},
    ).volume
    assert clone.content_source.volume.volume_id == vid
    assert plugin.backend.volumes[clone.volume_id].source == ("volume", vid)


def test_contexts_travel_under_each_versions_names(plugin: FakeCsi, tmp_path: Any) -> None:
    names = plugin.names
    vol = call(plugin, "CreateVolume", name="a", volume_capabilities=[MOUNT]).volume
    vid = getattr(vol, names.volume_id)
    context = dict(getattr(vol, names.volume_context))
    published = call(
        plugin,
        "ControllerPublishVolume",
        volume_id=vid,
        node_id=NODE_ID,
        volume_capability=MOUNT,
        **{names.request_context: context},
    )
    publish_context = dict(getattr(published, names.publish_context))
    assert publish_context == {"devicePath": f"/dev/fake/{vid}"}
    code, text = failure(
        plugin,
        "NodeStageVolume",
        volume_id=vid,
        staging_target_path=str(tmp_path / "stage"),
        volume_capability=MOUNT,
        **{names.request_context: {"other": "context"}},
    )
    assert (code, text) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"volume_context does not match the one of volume {vid}",
    )
    call(
        plugin,
        "NodeStageVolume",
        volume_id=vid,
        staging_target_path=str(tmp_path / "stage"),
        volume_capability=MOUNT,
        **{names.request_context: context},
    )
    call(
        plugin,
        "NodePublishVolume",
        volume_id=vid,
        target_path=str(tmp_path / "target"),
        staging_target_path=str(tmp_path / "stage"),
        volume_capability=MOUNT,
        **{names.publish_context: publish_context, names.request_context: context},
    )
    (publication,) = plugin.backend.node_publications(vid)
    assert publication.contexts == (
        tuple(sorted(publish_context.items())),
        tuple(sorted(context.items())),
    )


def test_v0_3_validates_with_a_yes_or_no_and_topologies() -> None:
    plugin = FakeCsiV0()
    vid = call(plugin, "CreateVolume", name="a", volume_capabilities=[MOUNT]).volume.id
    ok = call(plugin, "ValidateVolumeCapabilities", volume_id=vid, volume_capabilities=[MOUNT])
    assert (ok.supported, ok.message) == (True, "")
    elsewhere = call(
        plugin,
        "ValidateVolumeCapabilities",
        volume_id=vid,
        volume_capabilities=[MOUNT],
        accessible_topology=[{"segments": {ZONE_KEY: "zone-b"}}],
    )
    assert (elsewhere.supported, elsewhere.message) == (
        False,
        "the volume is not accessible from the given topologies",
    )
    here = call(
        plugin,
        "ValidateVolumeCapabilities",
        volume_id=vid,
        volume_capabilities=[MOUNT],
        accessible_topology=[{"segments": {ZONE_KEY: "zone-a"}}],
    )
    assert here.supported


def test_v1_confirms_what_it_validated() -> None:
    plugin = FakeCsiV1()
    vid = call(
        plugin,
        "CreateVolume",
        name="a",
        volume_capabilities=[MOUNT],
        parameters={"p": "1"},
        mutable_parameters={"iops": "200"},
    ).volume.volume_id
    ok = call(
        plugin,
        "ValidateVolumeCapabilities",
        volume_id=vid,
        volume_capabilities=[MOUNT],
        parameters={"p": "1"},
        mutable_parameters={"iops": "200"},
    )
    assert ok.message == "" and len(ok.confirmed.volume_capabilities) == 1
    assert dict(ok.confirmed.parameters) == {"p": "1"}
    assert dict(ok.confirmed.mutable_parameters) == {"iops": "200"}
    other = call(
        plugin,
        "ValidateVolumeCapabilities",
        volume_id=vid,
        volume_capabilities=[MOUNT],
        parameters={"p": "2"},
    )
    assert not other.HasField("confirmed")
    assert other.message == "parameters differ from the ones the volume was created with"


def test_what_only_v1_declares_is_filled_only_there(plugin: FakeCsi) -> None:
    call(plugin, "CreateVolume", name="a", volume_capabilities=[MOUNT])
    (entry,) = call(plugin, "ListVolumes").entries
    capacity = call(plugin, "GetCapacity")
    if isinstance(plugin, FakeCsiV1):
        assert entry.status.volume_condition.message == HEALTHY
        assert capacity.maximum_volume_size.value == MAX_VOLUME_SIZE
        assert capacity.minimum_volume_size.value == 1
    else:
        assert "status" not in entry.DESCRIPTOR.fields_by_name
        assert "maximum_volume_size" not in capacity.DESCRIPTOR.fields_by_name
    assert capacity.available_capacity > 0
