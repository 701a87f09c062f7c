"""The field names CSI v0.3 and v1.12 give the fields both have: each one is a field of the
message it names, in its version's descriptors, of the kind the shared code expects."""

from __future__ import annotations

import dataclasses

import pytest
from google.protobuf.descriptor import FieldDescriptor

from plugproxy.spec.csi_names import CSI_V0_NAMES, CSI_V1_NAMES, CsiNames
from plugproxy.spec.registry import load_spec

VERSIONS = [("csi.v0", CSI_V0_NAMES), ("csi.v1", CSI_V1_NAMES)]

# CsiNames field -> the messages that carry a field of that name
WHERE = {
    "volume_id": ("Volume",),
    "snapshot_id": ("Snapshot", "VolumeContentSource.SnapshotSource"),
    "volume_context": ("Volume",),
    "request_context": (
        "ControllerPublishVolumeRequest",
        "ValidateVolumeCapabilitiesRequest",
        "NodeStageVolumeRequest",
        "NodePublishVolumeRequest",
    ),
    "publish_context": (
        "ControllerPublishVolumeResponse",
        "NodeStageVolumeRequest",
        "NodePublishVolumeRequest",
    ),
    "snapshot_created": ("Snapshot",),
    "snapshot_ready": ("Snapshot",),
}


def field(spec: str, message: str, name: str) -> FieldDescriptor:
    desc = load_spec(spec).descriptor(f"{spec}.{message}")
    assert name in desc.fields_by_name, f"{spec}: {message} has no field {name!r}"
    fd: FieldDescriptor = desc.fields_by_name[name]
    return fd


def test_every_name_says_where_it_is_found() -> None:
    assert set(WHERE) == {f.name for f in dataclasses.fields(CsiNames)}


@pytest.mark.parametrize(("spec", "names"), VERSIONS)
def test_each_name_is_a_field_of_its_versions_messages(spec: str, names: CsiNames) -> None:
    for role, messages in WHERE.items():
        for message in messages:
            field(spec, message, getattr(names, role))


@pytest.mark.parametrize(("spec", "names"), VERSIONS)
def test_ids_are_strings_and_contexts_string_maps(spec: str, names: CsiNames) -> None:
    for role in ("volume_id", "snapshot_id"):
        for message in WHERE[role]:
            assert field(spec, message, getattr(names, role)).type == FieldDescriptor.TYPE_STRING
    for role in ("volume_context", "request_context", "publish_context"):
        for message in WHERE[role]:
            entry = field(spec, message, getattr(names, role)).message_type
            assert entry is not None and entry.GetOptions().map_entry, (spec, message, role)


def test_v1_renamed_what_v0_3_called_otherwise() -> None:
    assert CSI_V0_NAMES.volume_id == CSI_V0_NAMES.snapshot_id == "id"
    assert CSI_V1_NAMES.volume_id == "volume_id"
    assert CSI_V0_NAMES.request_context != CSI_V0_NAMES.volume_context
    assert CSI_V1_NAMES.request_context == CSI_V1_NAMES.volume_context == "volume_context"


def test_snapshot_times_and_readiness_change_kind_between_the_versions() -> None:
    """The fakes set these by the kind of field they find: an int64 of nanoseconds or a
    Timestamp, a SnapshotStatus or a bool."""
    created = field("csi.v0", "Snapshot", CSI_V0_NAMES.snapshot_created)
    assert created.type == FieldDescriptor.TYPE_INT64
    created = field("csi.v1", "Snapshot", CSI_V1_NAMES.snapshot_created)
    assert created.message_type is not None
    assert created.message_type.full_name == "google.protobuf.Timestamp"
    ready = field("csi.v0", "Snapshot", CSI_V0_NAMES.snapshot_ready)
    assert ready.message_type is not None and ready.message_type.name == "SnapshotStatus"
    assert "READY" in ready.message_type.fields_by_name["type"].enum_type.values_by_name
    ready = field("csi.v1", "Snapshot", CSI_V1_NAMES.snapshot_ready)
    assert ready.type == FieldDescriptor.TYPE_BOOL
