"""CSI v0.3 (csi.v0): breaches one call shows, field by field.

REQUIRED fields (§REQUIRED vs OPTIONAL and each message's field notes), RPCs a plugin must
implement (§RPC Interface, each RPC's "MUST implement"), gRPC status codes (§Error Scheme
and each RPC's errors), values and formats (§Size Limits, §Secrets Requirements,
§GetPluginInfo, §CreateVolume's CapacityRange and Topology, the node paths). Each case's
twin is the same traffic made valid.
"""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import plugin_caps
from tests.integration.planted.csi_v0_builders import (
    INFO,
    NODE,
    RWO,
    SNAP,
    SPEC,
    STAGED,
    STAGING,
    TARGET,
    TOPOLOGY,
    VOL,
    background,
    create,
    node_publish,
    node_unpublish,
    publish,
    snapshot,
    snapshot_request,
    stage,
    unstage,
    validate,
    volume,
    without,
)
from tests.integration.planted.harness import Case, Step

BG = background()
NODE_ONLY = background(plugin=(), controller=())

# -- REQUIRED fields ------------------------------------------------------------------------
# (statements, rpc, valid request, valid answer, breach request, breach answer, background)
# A request breach is refused by the plugin as the errors table says (INVALID_ARGUMENT);
# an answer breach is the plugin's OK missing the field.
_Req = tuple[tuple[str, ...], str, dict[str, Any], Any, dict[str, Any] | None, Any, dict[str, Any]]

CAP_NO_MODE = {"mount": {}, "access_mode": {}}
CAP_NO_TYPE = {"access_mode": {"mode": "SINGLE_NODE_WRITER"}}
CAP_NO_ACCESS_MODE = {"mount": {}}
_SNAP_OK = snapshot()


def _snap_less(*names: str) -> dict[str, Any]:
    return {"snapshot": without(_SNAP_OK["snapshot"], *names)}


REQUIRED: list[_Req] = [
    (("GetPluginInfo.4",), "GetPluginInfo", {}, INFO, None, without(INFO, "name"), BG),
    (("GetPluginInfo.5",), "GetPluginInfo", {}, INFO, None, without(INFO, "vendor_version"), BG),
    (("CreateVolume.4",), "CreateVolume", create(), volume(), without(create(), "name"), None, BG),
    (
        ("CreateVolume.9", "REQUIRED-vs-OPTIONAL.2"),
        "CreateVolume",
        create(),
        volume(),
        create(volume_capabilities=[]),
        None,
        BG,
    ),
    (
        ("CreateVolume.14",),
        "CreateVolume",
        create(volume_content_source={"snapshot": {"id": SNAP}}),
        volume(content_source={"snapshot": {"id": SNAP}}),
        create(volume_content_source={}),
        None,
        BG,
    ),
    (
        ("CreateVolume.15",),
        "CreateVolume",
        create(volume_content_source={"snapshot": {"id": SNAP}}),
        volume(content_source={"snapshot": {"id": SNAP}}),
        create(volume_content_source={"snapshot": {}}),
        None,
        BG,
    ),
    (("CreateVolume.17",), "CreateVolume", create(), volume(), None, {}, BG),
    (
        ("CreateVolume.20",),
        "CreateVolume",
        create(),
        volume(),
        create(volume_capabilities=[CAP_NO_MODE]),
        None,
        BG,
    ),
    (
        ("CreateVolume.21",),
        "CreateVolume",
        create(),
        volume(),
        create(volume_capabilities=[CAP_NO_TYPE]),
        None,
        BG,
    ),
    (
        ("CreateVolume.22",),
        "CreateVolume",
        create(),
        volume(),
        create(volume_capabilities=[CAP_NO_ACCESS_MODE]),
        None,
        BG,
    ),
    (("CreateVolume.30",), "CreateVolume", create(), volume(), None, {"volume": {}}, BG),
    (
        ("DeleteVolume.5", "CreateVolume-DeleteVolume-ListVolumes.1"),
        "DeleteVolume",
        {"volume_id": VOL},
        {},
        {},
        None,
        BG,
    ),
    (
        ("ControllerPublishVolume.6",),
        "ControllerPublishVolume",
        publish(),
        {},
        without(publish(), "volume_id"),
        None,
        BG,
    ),
    (
        ("ControllerPublishVolume.7",),
        "ControllerPublishVolume",
        publish(),
        {},
        without(publish(), "node_id"),
        None,
        BG,
    ),
    (
        ("ControllerPublishVolume.9",),
        "ControllerPublishVolume",
        publish(),
        {},
        without(publish(), "volume_capability"),
        None,
        BG,
    ),
    (
        ("ControllerUnpublishVolume.7",),
        "ControllerUnpublishVolume",
        {"volume_id": VOL, "node_id": NODE},
        {},
        {"node_id": NODE},
        None,
        BG,
    ),
    (
        ("ValidateVolumeCapabilities.4",),
        "ValidateVolumeCapabilities",
        validate(),
        {"supported": True},
        without(validate(), "volume_id"),
        None,
        BG,
    ),
    (
        ("ValidateVolumeCapabilities.6",),
        "ValidateVolumeCapabilities",
        validate(),
        {"supported": True},
        validate(volume_capabilities=[]),
        None,
        BG,
    ),
    (
        ("CreateSnapshot.7",),
        "CreateSnapshot",
        snapshot_request(),
        _SNAP_OK,
        without(snapshot_request(), "source_volume_id"),
        None,
        BG,
    ),
    (
        ("CreateSnapshot.8",),
        "CreateSnapshot",
        snapshot_request(),
        _SNAP_OK,
        without(snapshot_request(), "name"),
        None,
        BG,
    ),
    (("CreateSnapshot.9",), "CreateSnapshot", snapshot_request(), _SNAP_OK, None, {}, BG),
    (
        ("CreateSnapshot.12", "CreateSnapshot-DeleteSnapshot-ListSnapshots.2"),
        "CreateSnapshot",
        snapshot_request(),
        _SNAP_OK,
        None,
        _snap_less("id"),
        BG,
    ),
    (
        ("CreateSnapshot.13",),
        "CreateSnapshot",
        snapshot_request(),
        _SNAP_OK,
        None,
        _snap_less("source_volume_id"),
        BG,
    ),
    (
        ("CreateSnapshot.14",),
        "CreateSnapshot",
        snapshot_request(),
        _SNAP_OK,
        None,
        _snap_less("created_at"),
        BG,
    ),
    (
        ("CreateSnapshot.17",),
        "CreateSnapshot",
        snapshot_request(),
        _SNAP_OK,
        None,
        snapshot(status={"details": "cut"}),
        BG,
    ),
    (
        ("DeleteSnapshot.5", "CreateSnapshot-DeleteSnapshot-ListSnapshots.1"),
        "DeleteSnapshot",
        {"snapshot_id": SNAP},
        {},
        {},
        None,
        BG,
    ),
    (
        ("NodeStageVolume.8",),
        "NodeStageVolume",
        stage(),
        {},
        without(stage(), "volume_id"),
        None,
        STAGED,
    ),
    (
        ("NodeStageVolume.12",),
        "NodeStageVolume",
        stage(),
        {},
        without(stage(), "staging_target_path"),
        None,
        STAGED,
    ),
    (
        ("NodeStageVolume.13",),
        "NodeStageVolume",
        stage(),
        {},
        without(stage(), "volume_capability"),
        None,
        STAGED,
    ),
    (
        ("NodeUnstageVolume.9",),
        "NodeUnstageVolume",
        unstage(),
        {},
        {"staging_target_path": STAGING},
        None,
        STAGED,
    ),
    (
        ("NodeUnstageVolume.11",),
        "NodeUnstageVolume",
        unstage(),
        {},
        {"volume_id": VOL},
        None,
        STAGED,
    ),
    (
        ("NodePublishVolume.6",),
        "NodePublishVolume",
        node_publish(),
        {},
        without(node_publish(), "volume_id"),
        None,
        NODE_ONLY,
    ),
    (
        ("NodePublishVolume.13",),
        "NodePublishVolume",
        node_publish(),
        {},
        without(node_publish(), "target_path"),
        None,
        NODE_ONLY,
    ),
    (
        ("NodePublishVolume.14",),
        "NodePublishVolume",
        node_publish(),
        {},
        without(node_publish(), "volume_capability"),
        None,
        NODE_ONLY,
    ),
    (
        ("NodeUnpublishVolume.7",),
        "NodeUnpublishVolume",
        node_unpublish(),
        {},
        {"target_path": TARGET},
        None,
        NODE_ONLY,
    ),
    (
        ("NodeUnpublishVolume.9",),
        "NodeUnpublishVolume",
        node_unpublish(),
        {},
        {"volume_id": VOL},
        None,
        NODE_ONLY,
    ),
    (
        ("NodeGetId.6", "REQUIRED-vs-OPTIONAL.1"),
        "NodeGetId",
        {},
        {"node_id": NODE},
        None,
        {},
        NODE_ONLY,
    ),
    (("NodeGetInfo.5",), "NodeGetInfo", {}, {"node_id": NODE}, None, {}, NODE_ONLY),
]

_BAD = ("INVALID_ARGUMENT", "a REQUIRED field is missing")


def _required(entry: _Req) -> Case:
    statements, rpc, request, answer, bad_request, bad_answer, bg = entry
    if bad_request is not None:
        breach = Step(rpc, bad_request, error=_BAD)
        party = "co"
    else:
        breach = Step(rpc, request, answer=bad_answer)
        party = "plugin"
    return Case(
        SPEC,
        statements,
        "csi.required-field",
        breach=(breach,),
        twin=(Step(rpc, request, answer=answer),),
        background=bg,
        party=party,
    )


CASES = [_required(e) for e in REQUIRED]

# -- RPCs a plugin must implement --------------------------------------------------------
# (statements, the RPC answered UNIMPLEMENTED, its request, its OK answer, background, the
# calls before it that show the plugin serves the service). A node plugin is known to serve
# the Node service once one of its RPCs answered OK; NodeGetCapabilities does here (not
# NodeGetInfo, after which NodeGetId draws the deprecation advisory).
_NODE_SERVED = (Step("NodeGetCapabilities", answer={"capabilities": []}),)
_Unimpl = tuple[tuple[str, ...], str, dict[str, Any], Any, dict[str, Any], tuple[Step, ...]]
UNIMPLEMENTED: list[_Unimpl] = [
    (("RPC-Interface.3", "Connectivity.3"), "GetPluginInfo", {}, INFO, BG, ()),
    (
        ("GetPluginCapabilities.1",),
        "GetPluginCapabilities",
        {},
        {"capabilities": [{"service": {"type": "CONTROLLER_SERVICE"}}]},
        BG,
        (),
    ),
    (("Probe.1",), "Probe", {}, {}, BG, ()),
    (
        ("RPC-Interface.4", "ValidateVolumeCapabilities.1"),
        "ValidateVolumeCapabilities",
        validate(),
        {"supported": True},
        BG,
        (),
    ),
    (
        ("ControllerGetCapabilities.1", "Connectivity.6"),
        "ControllerGetCapabilities",
        {},
        {"capabilities": [{"rpc": {"type": "CREATE_DELETE_VOLUME"}}]},
        BG,
        (),
    ),
    (("CreateVolume.1",), "CreateVolume", create(), volume(), BG, ()),
    (("DeleteVolume.1",), "DeleteVolume", {"volume_id": VOL}, {}, BG, ()),
    (("ControllerPublishVolume.1",), "ControllerPublishVolume", publish(), {}, BG, ()),
    (
        ("ControllerUnpublishVolume.1",),
        "ControllerUnpublishVolume",
        {"volume_id": VOL, "node_id": NODE},
        {},
        BG,
        (),
    ),
    (("ListVolumes.1",), "ListVolumes", {}, {"entries": [{"volume": {"id": VOL}}]}, BG, ()),
    (("GetCapacity.1",), "GetCapacity", {}, {"available_capacity": 1 << 30}, BG, ()),
    (("CreateSnapshot.1",), "CreateSnapshot", snapshot_request(), snapshot(), BG, ()),
    (("DeleteSnapshot.1",), "DeleteSnapshot", {"snapshot_id": SNAP}, {}, BG, ()),
    (("ListSnapshots.1",), "ListSnapshots", {}, {"entries": [snapshot()]}, BG, ()),
    (("NodeStageVolume.1",), "NodeStageVolume", stage(), {}, STAGED, ()),
    (("NodeUnstageVolume.1",), "NodeUnstageVolume", unstage(), {}, STAGED, ()),
    (
        ("RPC-Interface.5", "NodeGetCapabilities.1"),
        "NodeGetCapabilities",
        {},
        {"capabilities": []},
        NODE_ONLY,
        (Step("NodeUnpublishVolume", node_unpublish()),),
    ),
    (
        ("NodeUnpublishVolume.1",),
        "NodeUnpublishVolume",
        node_unpublish(),
        {},
        NODE_ONLY,
        _NODE_SERVED,
    ),
    (
        ("RPC-Interface.6", "NodeGetId.2"),
        "NodeGetId",
        {},
        {"node_id": NODE},
        BG,
        _NODE_SERVED,
    ),
    (
        ("RPC-Interface.7", "NodeGetInfo.1"),
        "NodeGetInfo",
        {},
        {"node_id": NODE},
        BG,
        _NODE_SERVED,
    ),
]


def _unimplemented(entry: _Unimpl) -> Case:
    statements, rpc, request, answer, bg, before = entry
    return Case(
        SPEC,
        statements,
        "csi.unimplemented-advertised",
        breach=(*before, Step(rpc, request, error=("UNIMPLEMENTED", f"{rpc} not implemented"))),
        twin=(*before, Step(rpc, request, answer=answer)),
        background=bg,
        party="plugin",
    )


CASES += [_unimplemented(e) for e in UNIMPLEMENTED]

_UNPUBLISH = {"volume_id": VOL, "node_id": NODE}

# -- status codes ------------------------------------------------------------------------
# A failure answered with a grpc-status that is no canonical gRPC code; the twin fails the
# same call with a canonical one.
CASES.append(
    Case(
        SPEC,
        ("Error-Scheme.1", "Error-Scheme.2"),
        "csi.status-code-not-canonical",
        breach=(Step("Probe", error=("42", "not ready")),),
        twin=(Step("Probe", error=("FAILED_PRECONDITION", "not ready")),),
        background=BG,
        party="plugin",
        why="a grpc-status of 42 is no code of gRPC's status, so no standard status either",
    )
)

CASES.append(
    Case(
        SPEC,
        ("ControllerUnpublishVolume-Errors.1",),
        "csi.status-code-not-canonical",
        breach=(Step("ControllerUnpublishVolume", _UNPUBLISH, error=("17", "detach failed")),),
        twin=(Step("ControllerUnpublishVolume", _UNPUBLISH, error=("INTERNAL", "detach failed")),),
        background=BG,
        party="plugin",
        why="a failed unpublish answered with a status code that is none of gRPC's",
    )
)
# -- values and formats in one call --------------------------------------------------------
GIB = 1 << 30


def _one(
    statements: tuple[str, ...],
    rule: str,
    rpc: str,
    breach: tuple[dict[str, Any], Any],
    twin: tuple[dict[str, Any], Any],
    bg: dict[str, Any] = BG,
    party: str = "",
    why: str = "",
) -> Case:
    """One call: (request, answer) of the breach and of its twin."""
    return Case(
        SPEC,
        statements,
        rule,
        breach=(Step(rpc, breach[0], answer=breach[1]),),
        twin=(Step(rpc, twin[0], answer=twin[1]),),
        background=bg,
        party=party,
        why=why,
    )


def _caps_differ(statements: tuple[str, ...], rule: str, step: Step, party: str) -> Case:
    """``step`` after GetPluginCapabilities answered without ACCESSIBILITY_CONSTRAINTS (the
    breach) and with it (the twin)."""
    without_topology = plugin_caps("CONTROLLER_SERVICE")
    with_topology = plugin_caps("CONTROLLER_SERVICE", "ACCESSIBILITY_CONSTRAINTS")
    return Case(
        SPEC,
        statements,
        rule,
        breach=(Step("GetPluginCapabilities", answer=without_topology), step),
        twin=(Step("GetPluginCapabilities", answer=with_topology), step),
        background=without(BG, "GetPluginCapabilities"),
        party=party,
    )


def _topology(**segments: str) -> dict[str, Any]:
    return {"segments": segments}


ZONE_A = _topology(**{"example.com/zone": "zone-a"})
ZONE_B = _topology(**{"example.com/zone": "zone-b"})


def _bytes_with(message: bytes, placeholder: bytes, raw: bytes) -> bytes:
    assert message.count(placeholder) == 1
    return message.replace(placeholder, raw)


def _secrets_request(value: bytes) -> bytes:
    from plugproxy.spec.registry import Registry

    info = next(m for m in Registry().methods(SPEC) if m.name == "CreateVolume")
    assert info.request_class is not None
    clean = info.request_class(**create(controller_create_secrets={"password": "PLACEHOLDER"}))
    return _bytes_with(clean.SerializeToString(), b"PLACEHOLDER", value)


# google.rpc.Status{code: 13, message: "x", details: [Any{type_url: "type.googleapis.com/x"}]}
_ANY = b"\x0a\x15type.googleapis.com/x"
STATUS_DETAILS = b"\x08\x0d\x12\x01x\x1a" + bytes([len(_ANY)]) + _ANY

CASES += [
    _one(
        ("Size-Limits.1",),
        "csi.size-limit",
        "CreateVolume",
        (create("p" * 129), volume()),
        (create("p" * 128), volume()),
        party="co",
    ),
    _one(
        ("CreateVolume.19",),
        "csi.size-limit",
        "CreateVolume",
        (
            create(volume_capabilities=[{**RWO, "mount": {"mount_flags": ["o" * 128] * 33}}]),
            volume(),
        ),
        (
            create(volume_capabilities=[{**RWO, "mount": {"mount_flags": ["o" * 128] * 32}}]),
            volume(),
        ),
        party="co",
        why="33 mount flags of 128 bytes: 4224 bytes in all",
    ),
    _one(
        ("Error-Scheme.4",),
        "csi.bad-request-accepted",
        "CreateVolume",
        (without(create(), "name"), volume()),
        (create(), volume()),
        party="plugin",
        why="the plugin answers OK to a request missing its REQUIRED name",
    ),
    Case(
        SPEC,
        ("Error-Scheme.8",),
        "csi.status-details-nonempty",
        breach=(
            Step(
                "CreateVolume",
                create(),
                error=("INTERNAL", "x"),
                trailers=(("grpc-status-details-bin", STATUS_DETAILS),),
            ),
        ),
        twin=(Step("CreateVolume", create(), error=("INTERNAL", "x")),),
        background=BG,
        party="plugin",
    ),
    _one(
        ("Secrets-Requirements.1",),
        "csi.secret-key-format",
        "CreateVolume",
        (create(controller_create_secrets={"pass word": "s3cret"}), volume()),
        (create(controller_create_secrets={"pass-word": "s3cret"}), volume()),
        party="co",
    ),
    _one(
        ("Secrets-Requirements.2",),
        "csi.malformed-message",
        "CreateVolume",
        (_secrets_request(b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8\xf7\xf6\xf5"), volume()),
        (_secrets_request(b"s3cret-word"), volume()),
        party="co",
        why="a secret value of bytes that are not UTF-8",
    ),
    _one(
        ("GetPluginInfo.1",),
        "csi.plugin-name-format",
        "GetPluginInfo",
        ({}, {**INFO, "name": "example.com/plugin"}),
        ({}, INFO),
        party="plugin",
        why="a '/' is not part of a reverse domain name",
    ),
    _one(
        ("GetPluginInfo.3",),
        "csi.plugin-name-format",
        "GetPluginInfo",
        ({}, {**INFO, "name": "com.example." + "p" * 52}),
        ({}, {**INFO, "name": "com.example." + "p" * 51}),
        party="plugin",
        why="64 characters",
    ),
    _one(
        ("GetPluginCapabilities.3",),
        "csi.controller-service-recommended",
        "GetPluginCapabilities",
        ({}, {"capabilities": []}),
        ({}, {"capabilities": [{"service": {"type": "CONTROLLER_SERVICE"}}]}),
        party="plugin",
    ),
    _one(
        ("CreateVolume.25", "CreateVolume.5"),
        "csi.capacity-out-of-range",
        "CreateVolume",
        (create(capacity_range={"required_bytes": 2 * GIB}), volume(capacity_bytes=GIB)),
        (create(capacity_range={"required_bytes": 2 * GIB}), volume(capacity_bytes=2 * GIB)),
        party="plugin",
    ),
    _one(
        ("CreateVolume.27",),
        "csi.capacity-out-of-range",
        "CreateVolume",
        (create(capacity_range={"limit_bytes": GIB}), volume(capacity_bytes=2 * GIB)),
        (create(capacity_range={"limit_bytes": GIB}), volume(capacity_bytes=GIB)),
        party="plugin",
    ),
    _one(
        ("CreateVolume.24",),
        "csi.capacity-range-empty",
        "CreateVolume",
        (create(capacity_range={}), volume()),
        (create(capacity_range={"required_bytes": GIB}), volume(capacity_bytes=GIB)),
        party="co",
    ),
    _one(
        ("CreateVolume.26",),
        "csi.negative-value",
        "CreateVolume",
        (create(capacity_range={"required_bytes": -GIB}), volume()),
        (create(capacity_range={"required_bytes": GIB}), volume(capacity_bytes=GIB)),
        party="co",
    ),
    _one(
        ("CreateVolume.28",),
        "csi.negative-value",
        "CreateVolume",
        (create(capacity_range={"limit_bytes": -GIB}), volume()),
        (create(capacity_range={"limit_bytes": GIB}), volume(capacity_bytes=GIB)),
        party="co",
    ),
    _one(
        ("CreateVolume.29",),
        "csi.negative-value",
        "CreateVolume",
        (create(), volume(capacity_bytes=-GIB)),
        (create(), volume(capacity_bytes=GIB)),
        party="plugin",
    ),
    _one(
        ("ListVolumes.5",),
        "csi.negative-value",
        "ListVolumes",
        ({"max_entries": -1}, {}),
        ({"max_entries": 1}, {}),
        party="co",
    ),
    _one(
        ("ListSnapshots.6",),
        "csi.negative-value",
        "ListSnapshots",
        ({"max_entries": -1}, {}),
        ({"max_entries": 1}, {}),
        party="co",
    ),
    _one(
        ("GetCapacity.8",),
        "csi.negative-value",
        "GetCapacity",
        ({}, {"available_capacity": -GIB}),
        ({}, {"available_capacity": GIB}),
        party="plugin",
    ),
    _one(
        ("CreateSnapshot.11",),
        "csi.negative-value",
        "CreateSnapshot",
        (snapshot_request(), snapshot(size_bytes=-GIB)),
        (snapshot_request(), snapshot(size_bytes=GIB)),
        party="plugin",
    ),
    _one(
        ("NodeGetInfo.7",),
        "csi.negative-value",
        "NodeGetInfo",
        ({}, {"node_id": NODE, "max_volumes_per_node": -1}),
        ({}, {"node_id": NODE, "max_volumes_per_node": 16}),
        NODE_ONLY,
        party="plugin",
    ),
    _one(
        ("ListVolumes.3",),
        "csi.list-max-entries",
        "ListVolumes",
        (
            {"max_entries": 1},
            {"entries": [{"volume": {"id": "vol-1"}}, {"volume": {"id": "vol-2"}}]},
        ),
        ({"max_entries": 1}, {"entries": [{"volume": {"id": "vol-1"}}], "next_token": "2"}),
        party="plugin",
    ),
    _one(
        ("ListSnapshots.4",),
        "csi.list-max-entries",
        "ListSnapshots",
        ({"max_entries": 1}, {"entries": [snapshot("snap-1"), snapshot("snap-2")]}),
        ({"max_entries": 1}, {"entries": [snapshot("snap-1")], "next_token": "2"}),
        party="plugin",
    ),
    # Topology (§CreateVolume: TopologyRequirement, Topology)
    _caps_differ(
        ("CreateVolume.13",),
        "csi.topology-requirement-without-capability",
        Step(
            "CreateVolume",
            create(accessibility_requirements={"requisite": [ZONE_A]}),
            answer=volume(accessible_topology=[ZONE_A]),
        ),
        party="co",
    ),
    _caps_differ(
        ("CreateVolume.37",),
        "csi.topology-without-capability",
        Step("CreateVolume", create(), answer=volume(accessible_topology=[ZONE_A])),
        party="plugin",
    ),
    _caps_differ(
        ("NodeGetInfo.8",),
        "csi.topology-without-capability",
        Step("NodeGetInfo", answer={"node_id": NODE, "accessible_topology": ZONE_A}),
        party="plugin",
    ),
    _one(
        ("CreateVolume.39", "CreateVolume.41", "CreateVolume.52"),
        "csi.topology-requirement-empty",
        "CreateVolume",
        (create(accessibility_requirements={}), volume()),
        (
            create(accessibility_requirements={"preferred": [ZONE_A]}),
            volume(accessible_topology=[ZONE_A]),
        ),
        TOPOLOGY,
        party="co",
        why="a requirement with neither requisite nor preferred: no requisite topology (n = 0)",
    ),
    _one(
        ("CreateVolume.40",),
        "csi.topology-outside-requisite",
        "CreateVolume",
        (
            create(accessibility_requirements={"requisite": [ZONE_A]}),
            volume(accessible_topology=[ZONE_B]),
        ),
        (
            create(accessibility_requirements={"requisite": [ZONE_A]}),
            volume(accessible_topology=[ZONE_A]),
        ),
        TOPOLOGY,
        party="plugin",
    ),
    _one(
        ("CreateVolume.54",),
        "csi.topology-preferred-not-requisite",
        "CreateVolume",
        (
            create(accessibility_requirements={"requisite": [ZONE_A], "preferred": [ZONE_B]}),
            volume(accessible_topology=[ZONE_A]),
        ),
        (
            create(
                accessibility_requirements={"requisite": [ZONE_A, ZONE_B], "preferred": [ZONE_B]}
            ),
            volume(accessible_topology=[ZONE_B]),
        ),
        TOPOLOGY,
        party="co",
    ),
    _one(
        ("CreateVolume.59",),
        "csi.topology-key-format",
        "CreateVolume",
        (create(), volume(accessible_topology=[_topology(**{"example.com/zone-": "zone-a"})])),
        (create(), volume(accessible_topology=[ZONE_A])),
        TOPOLOGY,
        party="plugin",
        why="a key name ending with a dash",
    ),
    _one(
        ("CreateVolume.63", "CreateVolume.64"),
        "csi.topology-key-duplicate",
        "CreateVolume",
        (
            create(),
            volume(
                accessible_topology=[
                    _topology(**{"example.com/Zone": "zone-a", "example.com/zone": "zone-a"})
                ]
            ),
        ),
        (
            create(),
            volume(
                accessible_topology=[
                    _topology(**{"example.com/rack": "rack-1", "example.com/zone": "zone-a"})
                ]
            ),
        ),
        TOPOLOGY,
        party="plugin",
    ),
    _one(
        ("CreateVolume.65",),
        "csi.topology-value-format",
        "CreateVolume",
        (create(), volume(accessible_topology=[_topology(**{"example.com/zone": ""})])),
        (create(), volume(accessible_topology=[ZONE_A])),
        TOPOLOGY,
        party="plugin",
    ),
    _one(
        ("CreateVolume.66",),
        "csi.topology-value-format",
        "CreateVolume",
        (create(), volume(accessible_topology=[_topology(**{"example.com/zone": "z" * 64})])),
        (create(), volume(accessible_topology=[_topology(**{"example.com/zone": "z" * 63})])),
        TOPOLOGY,
        party="plugin",
    ),
    _one(
        ("ValidateVolumeCapabilities.8",),
        "csi.field-without-capability",
        "ValidateVolumeCapabilities",
        (validate(accessible_topology=[ZONE_A]), {"supported": True}),
        (validate(), {"supported": True}),
        party="co",
    ),
    _one(
        ("GetCapacity.5",),
        "csi.capacity-topology-without-capability",
        "GetCapacity",
        ({"accessible_topology": ZONE_A}, {"available_capacity": GIB}),
        ({}, {"available_capacity": GIB}),
        party="co",
    ),
]

# -- node paths (§NodeStageVolume .. §NodeUnpublishVolume: absolute paths) --------------------
_RELATIVE = "kubelet/pods/uid-1/mount"
CASES += [
    _one(
        ("NodeStageVolume.10",),
        "csi.path-not-absolute",
        "NodeStageVolume",
        (stage(path=_RELATIVE), {}),
        (stage(), {}),
        STAGED,
        party="co",
    ),
    _one(
        ("NodeUnstageVolume.10",),
        "csi.path-not-absolute",
        "NodeUnstageVolume",
        (unstage(path=_RELATIVE), {}),
        (unstage(), {}),
        STAGED,
        party="co",
    ),
    _one(
        ("NodePublishVolume.10",),
        "csi.path-not-absolute",
        "NodePublishVolume",
        (node_publish(target=_RELATIVE), {}),
        (node_publish(), {}),
        NODE_ONLY,
        party="co",
    ),
    _one(
        ("NodeUnpublishVolume.8",),
        "csi.path-not-absolute",
        "NodeUnpublishVolume",
        (node_unpublish(target=_RELATIVE), {}),
        (node_unpublish(), {}),
        NODE_ONLY,
        party="co",
    ),
    Case(
        SPEC,
        ("NodePublishVolume.8",),
        "csi.path-not-absolute",
        breach=(
            Step("NodeStageVolume", stage()),
            Step("NodePublishVolume", node_publish(staging_target_path=_RELATIVE)),
        ),
        twin=(
            Step("NodeStageVolume", stage()),
            Step("NodePublishVolume", node_publish(staging_target_path=STAGING)),
        ),
        background=STAGED,
        party="co",
    ),
]
