"""CSI v1.12 from §RPC Interface to §CreateVolume's Topology message, and the lower-case
statements of §GetVolumeGroupSnapshot and the SnapshotMetadata service: planted breaches of
the RPCs a plugin must serve, REQUIRED fields, status codes and recovery, secrets, plugin
name and capabilities, CreateVolume's fields, capacity range and topology, and the metadata
streams. Each case's twin is the same traffic made valid."""

from __future__ import annotations

from typing import Any

from plugproxy.spec.registry import Registry
from tests.integration.planted.csi_builders import NODE, RWO, plugin_caps, rpc_caps, v1_background
from tests.integration.planted.csi_v1_part1b_builders import (
    GIB,
    GROUP,
    SNAP,
    STAGING,
    VOL,
    controller,
    create,
    group_background,
    stage,
    validate,
    volume,
)
from tests.integration.planted.harness import Case, Step

SPEC = "csi.v1"
INFO = {"name": "com.example.csi", "vendor_version": "1.4.0"}
BG = controller("CREATE_DELETE_VOLUME")
NODE_ONLY = v1_background(plugin=(), controller=())
TOPOLOGY = v1_background(plugin=("CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"))
METADATA = v1_background(plugin=("CONTROLLER_SERVICE", "SNAPSHOT_METADATA_SERVICE"))
TARGET = "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/mount"
FROM_SNAPSHOT = {"snapshot": {"snapshot_id": SNAP}}
CONTEXT = {"share": "pool-a/vol-1"}


def without(message: dict[str, Any], *names: str) -> dict[str, Any]:
    """``message`` less the fields ``names``."""
    return {k: v for k, v in message.items() if k not in names}


def _one(
    statements: tuple[str, ...],
    rule: str,
    rpc: str,
    breach: tuple[Any, Any],
    twin: tuple[Any, Any],
    bg: dict[str, Any] = BG,
    party: str = "",
    why: str = "",
    variant: str = "",
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
        variant=variant,
    )


CASES: list[Case] = []

# -- RPCs a plugin must serve (§RPC Interface and each RPC's "MUST implement") ----------------
_Unimpl = tuple[tuple[str, ...], str, Any, Any, dict[str, Any], tuple[Step, ...]]
_NODE_SERVED = (Step("NodeGetCapabilities", answer=rpc_caps()),)
_UNIMPLEMENTED: list[_Unimpl] = [
    (("RPC-Interface.4",), "GetPluginInfo", {}, INFO, BG, ()),
    (
        ("RPC-Interface.5",),
        "ValidateVolumeCapabilities",
        validate(),
        {"confirmed": {"volume_capabilities": [RWO]}},
        BG,
        (),
    ),
    (
        ("RPC-Interface.6",),
        "NodeUnpublishVolume",
        {"volume_id": VOL, "target_path": TARGET},
        {},
        NODE_ONLY,
        _NODE_SERVED,
    ),
    (
        ("GetPluginCapabilities.1",),
        "GetPluginCapabilities",
        {},
        plugin_caps("CONTROLLER_SERVICE"),
        BG,
        (),
    ),
    (
        ("GetPluginCapabilities.7",),
        "GroupControllerGetCapabilities",
        {},
        rpc_caps("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT"),
        v1_background(plugin=("CONTROLLER_SERVICE", "GROUP_CONTROLLER_SERVICE")),
        (),
    ),
    (("Probe.1",), "Probe", {}, {"ready": {"value": True}}, BG, ()),
    (("CreateVolume.1",), "CreateVolume", create(), volume(), BG, ()),
    (
        ("GetMetadataAllocated.lc1",),
        "GetMetadataAllocated",
        {"snapshot_id": SNAP},
        [{"block_metadata_type": "FIXED_LENGTH", "volume_capacity_bytes": GIB}],
        METADATA,
        (),
    ),
    (
        ("GetMetadataDelta.lc1",),
        "GetMetadataDelta",
        {"base_snapshot_id": "snap-0", "target_snapshot_id": SNAP},
        [{"block_metadata_type": "FIXED_LENGTH", "volume_capacity_bytes": GIB}],
        METADATA,
        (),
    ),
]


def _unimplemented(entry: _Unimpl) -> Case:
    statements, rpc, request, answer, bg, before = entry
    return Case(
        SPEC,
        statements,
        "csi.unimplemented-advertised",
        breach=(
            *before,
            Step(
                rpc,
                request,
                answer=[] if isinstance(answer, list) else None,
                error=("UNIMPLEMENTED", f"{rpc} not implemented"),
            ),
        ),
        twin=(*before, Step(rpc, request, answer=answer)),
        background=bg,
        party="plugin",
    )


CASES += [_unimplemented(e) for e in _UNIMPLEMENTED]

# -- REQUIRED fields ---------------------------------------------------------------------------
_REFUSED = ("INVALID_ARGUMENT", "a required field is missing")


def _required_request(
    statements: tuple[str, ...],
    rpc: str,
    breach: Any,
    twin: Any,
    answer: Any,
    bg: dict[str, Any],
    variant: str = "",
) -> Case:
    """The CO leaves a REQUIRED field out; the plugin refuses it as the errors table says.
    Twin: the request complete, answered OK."""
    return Case(
        SPEC,
        statements,
        "csi.required-field",
        breach=(Step(rpc, breach, error=_REFUSED),),
        twin=(Step(rpc, twin, answer=answer),),
        background=bg,
        party="co",
        variant=variant,
    )


CAP_NO_MODE = {"mount": {}, "access_mode": {}}
CAP_NO_TYPE = {"access_mode": {"mode": "SINGLE_NODE_WRITER"}}
CAP_NO_ACCESS_MODE = {"mount": {}}
CASES += [
    _required_request(("REQUIRED-vs-OPTIONAL.1",), "DeleteVolume", {}, {"volume_id": VOL}, {}, BG),
    _required_request(
        ("CreateVolume.8",), "CreateVolume", without(create(), "name"), create(), volume(), BG
    ),
    _required_request(
        ("CreateVolume.18", "REQUIRED-vs-OPTIONAL.2"),
        "CreateVolume",
        create(volume_capabilities=[]),
        create(),
        volume(),
        BG,
    ),
    _required_request(
        ("CreateVolume.25",),
        "CreateVolume",
        create(volume_content_source={}),
        create(volume_content_source=FROM_SNAPSHOT),
        volume(content_source=FROM_SNAPSHOT),
        controller("CREATE_DELETE_VOLUME", "CREATE_DELETE_SNAPSHOT"),
    ),
    _required_request(
        ("CreateVolume.26",),
        "CreateVolume",
        create(volume_content_source={"snapshot": {}}),
        create(volume_content_source=FROM_SNAPSHOT),
        volume(content_source=FROM_SNAPSHOT),
        controller("CREATE_DELETE_VOLUME", "CREATE_DELETE_SNAPSHOT"),
    ),
    _required_request(
        ("CreateVolume.28",),
        "CreateVolume",
        create(volume_content_source={"volume": {}}),
        create(volume_content_source={"volume": {"volume_id": "vol-src"}}),
        volume(content_source={"volume": {"volume_id": "vol-src"}}),
        controller("CREATE_DELETE_VOLUME", "CLONE_VOLUME"),
    ),
    _required_request(
        ("CreateVolume.37",),
        "CreateVolume",
        create(volume_capabilities=[CAP_NO_MODE]),
        create(),
        volume(),
        BG,
    ),
    _required_request(
        ("CreateVolume.38",),
        "CreateVolume",
        create(volume_capabilities=[CAP_NO_TYPE]),
        create(),
        volume(),
        BG,
    ),
    _required_request(
        ("CreateVolume.39",),
        "CreateVolume",
        create(volume_capabilities=[CAP_NO_ACCESS_MODE]),
        create(),
        volume(),
        BG,
    ),
    _one(
        ("GetPluginInfo.5",),
        "csi.required-field",
        "GetPluginInfo",
        ({}, without(INFO, "vendor_version")),
        ({}, INFO),
        party="plugin",
    ),
    _one(
        ("CreateVolume.30",),
        "csi.required-field",
        "CreateVolume",
        (create(), {}),
        (create(), volume()),
        party="plugin",
    ),
    _one(
        ("CreateVolume.47",),
        "csi.required-field",
        "CreateVolume",
        (create(), {"volume": {"capacity_bytes": GIB}}),
        (create(), volume()),
        party="plugin",
    ),
]

# -- status codes (§Error Scheme) ------------------------------------------------------------
# google.rpc.Status{code: 13, message: "x", details: [Any{type_url: "type.googleapis.com/x"}]}
_ANY = b"\x0a\x15type.googleapis.com/x"
STATUS_DETAILS = b"\x08\x0d\x12\x01x\x1a" + bytes([len(_ANY)]) + _ANY

CASES += [
    Case(
        SPEC,
        ("Error-Scheme.1", "Error-Scheme.2"),
        "csi.status-code-not-canonical",
        breach=(Step("CreateVolume", create(), error=("23", "backend failure")),),
        twin=(Step("CreateVolume", create(), error=("INTERNAL", "backend failure")),),
        background=BG,
        party="plugin",
        why="a grpc-status of 23 is no code of gRPC's status, so no standard status either",
    ),
    Case(
        SPEC,
        ("Error-Scheme.14",),
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
]

# -- recovery (§Error Scheme and the SnapshotMetadata error tables) -----------------------------
_BAD_PARAMS = create(parameters={"type": "fast-ssd-typo"})
_FIXED_PARAMS = create(parameters={"type": "fast-ssd"})


def _retry(
    statements: tuple[str, ...],
    rpc: str,
    request: Any,
    code: str,
    fixed: Any,
    answer: Any,
    bg: dict[str, Any] = BG,
    first: Any = None,
    why: str = "",
) -> Case:
    """``request`` refused with ``code`` and sent again unchanged; the twin sends ``fixed``
    (answered OK). ``first``: the refused request of the twin, when the breach's is itself
    unlawful."""
    # A refused stream sends no message before its status (an answer of None would be one
    # empty message).
    none: Any = [] if isinstance(answer, list) else None
    return Case(
        SPEC,
        statements,
        "csi.retry-without-change",
        breach=(
            Step(rpc, request, answer=none, error=(code, "refused")),
            Step(rpc, request, answer=answer),
        ),
        twin=(
            Step(rpc, request if first is None else first, answer=none, error=(code, "refused")),
            Step(rpc, fixed, answer=answer),
        ),
        background=bg,
        party="co",
        why=why,
    )


_ALLOCATED = {"snapshot_id": SNAP, "starting_offset": 0}
_DELTA = {"base_snapshot_id": "snap-0", "target_snapshot_id": SNAP, "starting_offset": 0}
CASES += [
    _retry(
        ("Error-Scheme.6",),
        "CreateVolume",
        without(create(), "name"),
        "INVALID_ARGUMENT",
        _FIXED_PARAMS,
        volume(),
        first=_BAD_PARAMS,
        why="a request missing its REQUIRED name, refused, sent again as it was",
    ),
    _retry(
        ("Error-Scheme.7",),
        "CreateVolume",
        _BAD_PARAMS,
        "INVALID_ARGUMENT",
        _FIXED_PARAMS,
        volume(),
        why="a parameter the plugin refused as invalid, sent again unchanged",
    ),
]

# Operation pending: a delete held by the plugin has two more for the volume queued behind it
# (the proxy serializes calls per volume): the second is answered ABORTED, the third held in
# turn, and the retry of the second comes while the third is in flight. Twin: no third.
_ABORTED = ("ABORTED", "operation pending")
_DELETE = {"volume_id": VOL}
CASES += [
    Case(
        SPEC,
        ("Error-Scheme.10",),
        "csi.retry-while-pending",
        breach=(
            Step("DeleteVolume", _DELETE, hold=0.6, pending=True),
            Step("DeleteVolume", _DELETE, error=_ABORTED, pending=True),
            Step("DeleteVolume", _DELETE, hold=0.6, pending=True),
            Step("DeleteVolume", _DELETE, wait=0.7),
        ),
        twin=(
            Step("DeleteVolume", _DELETE, hold=0.2, pending=True),
            Step("DeleteVolume", _DELETE, error=_ABORTED, pending=True),
            Step("DeleteVolume", _DELETE, wait=0.7),
        ),
        background=BG,
        party="co",
    ),
    Case(
        SPEC,
        ("Error-Scheme.10",),
        "csi.retry-without-backoff",
        breach=(
            Step("CreateVolume", create(), error=_ABORTED),
            Step("CreateVolume", create(), error=_ABORTED, wait=0.1),
            Step("CreateVolume", create(), error=_ABORTED, wait=0.1),
            Step("CreateVolume", create(), answer=volume(), wait=0.1),
        ),
        twin=(
            Step("CreateVolume", create(), error=_ABORTED),
            Step("CreateVolume", create(), error=_ABORTED, wait=0.1),
            Step("CreateVolume", create(), error=_ABORTED, wait=0.2),
            Step("CreateVolume", create(), answer=volume(), wait=0.4),
        ),
        background=BG,
        party="co",
        why="retried after ABORTED three times, each after the same short wait",
    ),
]


# -- secrets (§Secrets Requirements) -----------------------------------------------------------
def _secrets_request(value: bytes) -> bytes:
    info = next(m for m in Registry().methods(SPEC) if m.name == "CreateVolume")
    assert info.request_class is not None
    clean = info.request_class(**create(secrets={"password": "PLACEHOLDER"}))
    raw = clean.SerializeToString()
    assert raw.count(b"PLACEHOLDER") == 1
    return raw.replace(b"PLACEHOLDER", value)


CASES += [
    _one(
        ("Secrets-Requirements.1",),
        "csi.secret-key-format",
        "CreateVolume",
        (create(secrets={"user:name": "admin"}), volume()),
        (create(secrets={"user.name": "admin"}), volume()),
        party="co",
        why="a ':' in a secret's key",
    ),
    _one(
        ("Secrets-Requirements.2",),
        "csi.malformed-message",
        "CreateVolume",
        (_secrets_request(b"\xc3\x28\xa0\xa1\xe2\x28\xa1\xf0\x28\x8c\xbc"), volume()),
        (_secrets_request(b"s3cret-word"), volume()),
        party="co",
        why="a secret value of bytes that are not UTF-8",
    ),
]

# -- plugin name and capabilities (§GetPluginInfo, §GetPluginCapabilities) ----------------------
_ONLINE = {"capabilities": [*plugin_caps("CONTROLLER_SERVICE")["capabilities"]]}


def _expansion_caps(kind: str) -> dict[str, Any]:
    caps = plugin_caps("CONTROLLER_SERVICE")["capabilities"]
    return {"capabilities": [*caps, {"volume_expansion": {"type": kind}}]}


_PUBLISH_CAPS = ("CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME")
_PUBLISHED = Step(
    "ControllerPublishVolume",
    {"volume_id": VOL, "node_id": NODE, "volume_capability": RWO},
    answer={"publish_context": {"devicePath": "/dev/xvdb"}},
)
_EXPAND = {"volume_id": VOL, "capacity_range": {"required_bytes": 2 * GIB}}
_IN_USE = ("FAILED_PRECONDITION", "volume is published")
CASES += [
    _one(
        ("GetPluginInfo.1",),
        "csi.plugin-name-format",
        "GetPluginInfo",
        ({}, {**INFO, "name": "com.example_csi"}),
        ({}, INFO),
        party="plugin",
        why="an underscore is no part of a domain name",
    ),
    _one(
        ("GetPluginInfo.3",),
        "csi.plugin-name-format",
        "GetPluginInfo",
        ({}, {**INFO, "name": "com.example.csi-"}),
        ({}, {**INFO, "name": "com.example.csi-1"}),
        party="plugin",
        why="a name ending with a dash",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.2",),
        "csi.capabilities-changed",
        breach=(
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=plugin_caps("CONTROLLER_SERVICE")),
            Step(
                "GetPluginCapabilities",
                answer=plugin_caps("CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"),
            ),
            Step("GetPluginInfo", answer=INFO),
        ),
        twin=(
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=plugin_caps("CONTROLLER_SERVICE")),
            Step("GetPluginCapabilities", answer=plugin_caps("CONTROLLER_SERVICE")),
            Step("GetPluginInfo", answer=INFO),
        ),
        background=BG,
        party="plugin",
        why="one plugin version (GetPluginInfo before and after) answers two sets of capabilities",
    ),
    _one(
        ("GetPluginCapabilities.3",),
        "csi.controller-service-recommended",
        "GetPluginCapabilities",
        ({}, {"capabilities": []}),
        ({}, plugin_caps("CONTROLLER_SERVICE")),
        party="plugin",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.8",),
        "csi.capabilities-inconsistent",
        breach=(
            Step("ControllerGetCapabilities", answer=rpc_caps("CREATE_DELETE_VOLUME")),
            Step("NodeGetCapabilities", answer=rpc_caps("STAGE_UNSTAGE_VOLUME")),
            Step("GetPluginCapabilities", answer=_expansion_caps("ONLINE")),
        ),
        twin=(
            Step("ControllerGetCapabilities", answer=rpc_caps("CREATE_DELETE_VOLUME")),
            Step("NodeGetCapabilities", answer=rpc_caps("STAGE_UNSTAGE_VOLUME", "EXPAND_VOLUME")),
            Step("GetPluginCapabilities", answer=_expansion_caps("ONLINE")),
        ),
        background=v1_background(node=("STAGE_UNSTAGE_VOLUME",)),
        party="plugin",
        why="ONLINE expansion while neither the controller nor the node lists EXPAND_VOLUME",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.11",),
        "csi.capabilities-inconsistent",
        breach=(
            Step("ControllerGetCapabilities", answer=rpc_caps("CREATE_DELETE_VOLUME")),
            Step("NodeGetCapabilities", answer=rpc_caps("EXPAND_VOLUME")),
            Step("GetPluginCapabilities", answer=_expansion_caps("OFFLINE")),
        ),
        twin=(
            Step(
                "ControllerGetCapabilities",
                answer=rpc_caps("CREATE_DELETE_VOLUME", "EXPAND_VOLUME"),
            ),
            Step("NodeGetCapabilities", answer=rpc_caps("EXPAND_VOLUME")),
            Step("GetPluginCapabilities", answer=_expansion_caps("OFFLINE")),
        ),
        background=v1_background(node=("EXPAND_VOLUME",)),
        party="plugin",
        why="OFFLINE expansion with only the node's EXPAND_VOLUME, not the controller's",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.9",),
        "csi.expand-published-refused",
        breach=(_PUBLISHED, Step("ControllerExpandVolume", _EXPAND, error=_IN_USE)),
        twin=(
            _PUBLISHED,
            Step(
                "ControllerExpandVolume",
                _EXPAND,
                answer={"capacity_bytes": 2 * GIB, "node_expansion_required": True},
            ),
        ),
        background={
            **v1_background(controller=(*_PUBLISH_CAPS, "EXPAND_VOLUME")),
            "GetPluginCapabilities": _expansion_caps("ONLINE"),
        },
        party="plugin",
        why="a published volume's expansion refused as in use although ONLINE is advertised",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.10",),
        "csi.call-order",
        breach=(_PUBLISHED, Step("ControllerExpandVolume", _EXPAND, error=_IN_USE)),
        twin=(
            _PUBLISHED,
            Step("ControllerUnpublishVolume", {"volume_id": VOL, "node_id": NODE}),
            Step("ControllerExpandVolume", _EXPAND, answer={"capacity_bytes": 2 * GIB}),
        ),
        background={
            **v1_background(controller=(*_PUBLISH_CAPS, "EXPAND_VOLUME")),
            "GetPluginCapabilities": _expansion_caps("OFFLINE"),
        },
        party="co",
        why="a volume still published is expanded while only OFFLINE expansion is advertised",
    ),
]

# -- CreateVolume's values (§CreateVolume: CapacityRange, mount flags, content source) ----------
_SNAP_CAPS = controller("CREATE_DELETE_VOLUME", "CREATE_DELETE_SNAPSHOT")
CASES += [
    _one(
        ("CreateVolume.11",),
        "csi.capacity-out-of-range",
        "CreateVolume",
        (
            create(volume_content_source=FROM_SNAPSHOT, capacity_range={"required_bytes": 4 * GIB}),
            volume(capacity_bytes=2 * GIB, content_source=FROM_SNAPSHOT),
        ),
        (
            create(volume_content_source=FROM_SNAPSHOT, capacity_range={"required_bytes": 4 * GIB}),
            volume(capacity_bytes=4 * GIB, content_source=FROM_SNAPSHOT),
        ),
        _SNAP_CAPS,
        party="plugin",
        why="a volume restored at its snapshot's size, smaller than the range asked",
    ),
    _one(
        ("CreateVolume.42",),
        "csi.capacity-out-of-range",
        "CreateVolume",
        (create(capacity_range={"required_bytes": 2 * GIB}), volume(capacity_bytes=GIB)),
        (create(capacity_range={"required_bytes": 2 * GIB}), volume(capacity_bytes=2 * GIB)),
        party="plugin",
    ),
    _one(
        ("CreateVolume.44",),
        "csi.capacity-out-of-range",
        "CreateVolume",
        (create(capacity_range={"limit_bytes": GIB}), volume(capacity_bytes=2 * GIB)),
        (create(capacity_range={"limit_bytes": GIB}), volume(capacity_bytes=GIB)),
        party="plugin",
    ),
    _one(
        ("CreateVolume.41",),
        "csi.capacity-range-empty",
        "CreateVolume",
        (create(capacity_range={}), volume()),
        (create(capacity_range={"limit_bytes": GIB}), volume(capacity_bytes=GIB)),
        party="co",
    ),
    _one(
        ("CreateVolume.43",),
        "csi.negative-value",
        "CreateVolume",
        (create(capacity_range={"required_bytes": -GIB}), volume()),
        (create(capacity_range={"required_bytes": GIB}), volume(capacity_bytes=GIB)),
        party="co",
    ),
    _one(
        ("CreateVolume.45",),
        "csi.negative-value",
        "CreateVolume",
        (create(capacity_range={"limit_bytes": -GIB}), volume()),
        (create(capacity_range={"limit_bytes": GIB}), volume(capacity_bytes=GIB)),
        party="co",
    ),
    _one(
        ("CreateVolume.46",),
        "csi.negative-value",
        "CreateVolume",
        (create(), volume(capacity_bytes=-GIB)),
        (create(), volume(capacity_bytes=GIB)),
        party="plugin",
    ),
    _one(
        ("CreateVolume.32",),
        "csi.size-limit",
        "CreateVolume",
        (
            create(volume_capabilities=[{**RWO, "mount": {"mount_flags": ["o" * 64] * 65}}]),
            volume(),
        ),
        (
            create(volume_capabilities=[{**RWO, "mount": {"mount_flags": ["o" * 64] * 64}}]),
            volume(),
        ),
        party="co",
        why="65 mount flags of 64 bytes: 4160 bytes in all",
    ),
    Case(
        SPEC,
        ("CreateVolume.24",),
        "csi.field-without-capability",
        breach=(
            Step("ControllerGetCapabilities", answer=rpc_caps("CREATE_DELETE_VOLUME")),
            Step("CreateVolume", create(mutable_parameters={"iops": "3000"}), answer=volume()),
        ),
        twin=(
            Step(
                "ControllerGetCapabilities",
                answer=rpc_caps("CREATE_DELETE_VOLUME", "MODIFY_VOLUME"),
            ),
            Step("CreateVolume", create(mutable_parameters={"iops": "3000"}), answer=volume()),
        ),
        background={"GetPluginCapabilities": plugin_caps("CONTROLLER_SERVICE")},
        party="co",
        why="mutable_parameters sent to a controller without MODIFY_VOLUME",
    ),
]

# -- volume_context (§CreateVolume: Volume) ---------------------------------------------------
_CREATED = Step("CreateVolume", create(), answer=volume(volume_context=CONTEXT))
CASES += [
    Case(
        SPEC,
        ("CreateVolume.51", "CreateVolume.56"),
        "csi.volume-context-changed",
        breach=(
            _CREATED,
            Step("CreateVolume", create(), answer=volume(volume_context={"share": "pool-b/vol-1"})),
        ),
        twin=(_CREATED, _CREATED),
        background=BG,
        party="plugin",
        why="the same volume id, created again idempotently, reported with another context",
    ),
    Case(
        SPEC,
        ("CreateVolume.57",),
        "csi.volume-context-mismatch",
        breach=(
            _CREATED,
            Step(
                "ValidateVolumeCapabilities",
                validate(volume_context={"share": "pool-b/vol-1"}),
                answer={"confirmed": {"volume_capabilities": [RWO]}},
            ),
        ),
        twin=(
            _CREATED,
            Step(
                "ValidateVolumeCapabilities",
                validate(volume_context=CONTEXT),
                answer={"confirmed": {"volume_capabilities": [RWO]}},
            ),
        ),
        background=BG,
        party="co",
    ),
]


# -- topology (§CreateVolume: TopologyRequirement, Topology) ----------------------------------
def _topology(**segments: str) -> dict[str, Any]:
    return {"segments": segments}


ZONE_A = _topology(**{"example.com/zone": "zone-a"})
ZONE_B = _topology(**{"example.com/zone": "zone-b"})


def _caps_differ(statements: tuple[str, ...], rule: str, step: Step, party: str) -> Case:
    """``step`` after GetPluginCapabilities answered without VOLUME_ACCESSIBILITY_CONSTRAINTS
    (the breach) and with it (the twin)."""
    return Case(
        SPEC,
        statements,
        rule,
        breach=(Step("GetPluginCapabilities", answer=plugin_caps("CONTROLLER_SERVICE")), step),
        twin=(
            Step(
                "GetPluginCapabilities",
                answer=plugin_caps("CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"),
            ),
            step,
        ),
        background=without(BG, "GetPluginCapabilities"),
        party=party,
    )


def _segment_case(
    statements: tuple[str, ...],
    rule: str,
    bad: dict[str, str],
    good: dict[str, str],
    why: str,
    variant: str = "",
) -> Case:
    """The plugin answers a volume accessible from a segment map ``bad``; twin: ``good``."""
    return _one(
        statements,
        rule,
        "CreateVolume",
        (create(), volume(accessible_topology=[_topology(**bad)])),
        (create(), volume(accessible_topology=[_topology(**good)])),
        TOPOLOGY,
        party="plugin",
        why=why,
        variant=variant,
    )


CASES += [
    _caps_differ(
        ("CreateVolume.22",),
        "csi.topology-requirement-without-capability",
        Step(
            "CreateVolume",
            create(accessibility_requirements={"requisite": [ZONE_A]}),
            answer=volume(accessible_topology=[ZONE_A]),
        ),
        party="co",
    ),
    _caps_differ(
        ("CreateVolume.58",),
        "csi.topology-without-capability",
        Step("CreateVolume", create(), answer=volume(accessible_topology=[ZONE_A])),
        party="plugin",
    ),
    _one(
        ("CreateVolume.60", "CreateVolume.62", "CreateVolume.73"),
        "csi.topology-requirement-empty",
        "CreateVolume",
        (create(accessibility_requirements={}), volume()),
        (
            create(accessibility_requirements={"requisite": [ZONE_A], "preferred": [ZONE_A]}),
            volume(accessible_topology=[ZONE_A]),
        ),
        TOPOLOGY,
        party="co",
        why="a requirement with neither requisite nor preferred: no requisite topology (n = 0)",
    ),
    _one(
        ("CreateVolume.61", "CreateVolume.76"),
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
        why="a volume created OK though reachable from none of the requisite zones",
    ),
    _one(
        ("CreateVolume.75",),
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
    _segment_case(
        ("CreateVolume.80",),
        "csi.topology-key-format",
        {"example.com/": "zone-a"},
        {"example.com/zone": "zone-a"},
        "a key with a prefix and no name",
    ),
    _segment_case(
        ("CreateVolume.81",),
        "csi.topology-key-format",
        {"example.com/zone_": "zone-a"},
        {"example.com/zone_a": "zone-a"},
        "a key name ending with an underscore",
    ),
    _segment_case(
        ("CreateVolume.82",),
        "csi.topology-key-format",
        {"Example.com/zone": "zone-a"},
        {"example.com/zone": "zone-a"},
        "a key prefix with an upper-case letter",
    ),
    _segment_case(
        ("CreateVolume.85", "CreateVolume.86"),
        "csi.topology-key-duplicate",
        {"example.com/Zone": "zone-a", "example.com/zone": "zone-a"},
        {"example.com/rack": "rack-1", "example.com/zone": "zone-a"},
        "keys 'Zone' and 'zone' in one segment map",
    ),
    _segment_case(
        ("CreateVolume.87",),
        "csi.topology-value-format",
        {"example.com/zone": ""},
        {"example.com/zone": "z"},
        "an empty segment value",
    ),
    _segment_case(
        ("CreateVolume.88",),
        "csi.topology-value-format",
        {"example.com/zone": "zone.a."},
        {"example.com/zone": "zone.a"},
        "a segment value ending with a dot",
    ),
]

# -- group snapshots and metadata streams (lower-case statements) --------------------------
_GROUP_REQ = {"group_snapshot_id": GROUP, "snapshot_ids": ["snap-a"]}
_GONE = ("NOT_FOUND", "no such group snapshot")


def _group_answer() -> dict[str, Any]:
    from tests.integration.planted.csi_v1_part1b_builders import group

    return group()


def _stream_case(
    rpc: str,
    statement: str,
    field: str,
    value: Any,
    request: dict[str, Any],
    at: int = 1,
    variant: str = "",
) -> Case:
    """A metadata stream of three messages whose message ``at`` changes ``field`` to
    ``value``; twin: constant."""
    messages = [
        {
            "block_metadata_type": "FIXED_LENGTH",
            "volume_capacity_bytes": 4 * GIB,
            "block_metadata": [{"byte_offset": i << 21, "size_bytes": 1 << 20}],
        }
        for i in range(3)
    ]
    broken = [{**m, field: value} if i == at else m for i, m in enumerate(messages)]
    return Case(
        SPEC,
        (statement,),
        "csi.metadata-stream-changed",
        breach=(Step(rpc, request, answer=broken),),
        twin=(Step(rpc, request, answer=messages),),
        background=METADATA,
        party="plugin",
        variant=variant,
    )


CASES += [
    Case(
        SPEC,
        ("GetVolumeGroupSnapshot.lc2",),
        "csi.deleted-group-answered",
        breach=(
            Step("DeleteVolumeGroupSnapshot", _GROUP_REQ),
            Step("GetVolumeGroupSnapshot", _GROUP_REQ, answer=_group_answer()),
        ),
        twin=(
            Step("DeleteVolumeGroupSnapshot", _GROUP_REQ),
            Step("GetVolumeGroupSnapshot", _GROUP_REQ, error=_GONE),
        ),
        background=group_background(),
        party="plugin",
        why="a group snapshot answered OK after its delete answered OK",
    ),
    _stream_case(
        "GetMetadataAllocated",
        "GetMetadataAllocated.lc3",
        "block_metadata_type",
        "VARIABLE_LENGTH",
        _ALLOCATED,
    ),
    _stream_case(
        "GetMetadataAllocated",
        "GetMetadataAllocated.lc4",
        "volume_capacity_bytes",
        8 * GIB,
        _ALLOCATED,
    ),
    _stream_case(
        "GetMetadataDelta", "GetMetadataDelta.lc3", "block_metadata_type", "VARIABLE_LENGTH", _DELTA
    ),
    _stream_case(
        "GetMetadataDelta", "GetMetadataDelta.lc4", "volume_capacity_bytes", 8 * GIB, _DELTA
    ),
]

# -- variants: the same statements breached another way ---------------------------------------
_EXPAND_CAPS = rpc_caps("CREATE_DELETE_VOLUME", "EXPAND_VOLUME")
_GET_VOLUME = controller("CREATE_DELETE_VOLUME", "GET_VOLUME")
_LIST_VOLUMES = controller("CREATE_DELETE_VOLUME", "LIST_VOLUMES")
_CLONE = {"volume": {"volume_id": "vol-src"}}


def _listed(context: dict[str, str]) -> dict[str, Any]:
    return {
        "entries": [
            {"volume": {"volume_id": VOL, "capacity_bytes": GIB, "volume_context": context}}
        ]
    }


def _got(context: dict[str, str]) -> dict[str, Any]:
    return {
        "volume": {"volume_id": VOL, "capacity_bytes": GIB, "volume_context": context},
        "status": {},
    }


CASES += [
    Case(
        SPEC,
        ("Error-Scheme.1", "Error-Scheme.2"),
        "csi.status-code-not-canonical",
        breach=(Step("DeleteVolume", _DELETE, error=("17", "backend failure")),),
        twin=(Step("DeleteVolume", _DELETE, error=("INTERNAL", "backend failure")),),
        background=BG,
        party="plugin",
        variant="first-past-canonical",
        why="17, one past UNAUTHENTICATED (16), the last canonical code",
    ),
    _one(
        ("Secrets-Requirements.1",),
        "csi.secret-key-format",
        "DeleteVolume",
        ({**_DELETE, "secrets": {"tenant/user": "admin"}}, {}),
        ({**_DELETE, "secrets": {"tenant.user": "admin"}}, {}),
        party="co",
        variant="slash-on-delete",
    ),
    _one(
        ("GetPluginInfo.1",),
        "csi.plugin-name-format",
        "GetPluginInfo",
        ({}, {**INFO, "name": "com..example"}),
        ({}, {**INFO, "name": "com.example"}),
        party="plugin",
        variant="empty-label",
    ),
    _one(
        ("GetPluginInfo.3",),
        "csi.plugin-name-format",
        "GetPluginInfo",
        ({}, {**INFO, "name": "com.example." + "p" * 52}),
        ({}, {**INFO, "name": "com.example." + "p" * 51}),
        party="plugin",
        variant="64-characters",
    ),
    _one(
        ("REQUIRED-vs-OPTIONAL.1",),
        "csi.required-field",
        "NodeGetInfo",
        ({}, {"max_volumes_per_node": 8}),
        ({}, {"node_id": NODE, "max_volumes_per_node": 8}),
        NODE_ONLY,
        party="plugin",
        variant="answer",
    ),
    # The proxy learns the capabilities by asking the plugin itself (no CO query before).
    _one(
        ("CreateVolume.22",),
        "csi.topology-requirement-without-capability",
        "CreateVolume",
        (create(accessibility_requirements={"requisite": [ZONE_A]}), volume()),
        (create(), volume()),
        party="co",
        variant="proxy-asks",
    ),
    _one(
        ("CreateVolume.58",),
        "csi.topology-without-capability",
        "CreateVolume",
        (create(), volume(accessible_topology=[ZONE_A])),
        (create(), volume()),
        party="plugin",
        variant="proxy-asks",
    ),
    _one(
        ("CreateVolume.24",),
        "csi.field-without-capability",
        "CreateVolume",
        (create(mutable_parameters={"iops": "3000"}), volume()),
        (create(parameters={"iops": "3000"}), volume()),
        party="co",
        variant="proxy-asks",
    ),
    _one(
        ("CreateVolume.11",),
        "csi.capacity-out-of-range",
        "CreateVolume",
        (
            create(volume_content_source=_CLONE, capacity_range={"required_bytes": 4 * GIB}),
            volume(capacity_bytes=GIB, content_source=_CLONE),
        ),
        (
            create(volume_content_source=_CLONE, capacity_range={"required_bytes": 4 * GIB}),
            volume(capacity_bytes=4 * GIB, content_source=_CLONE),
        ),
        controller("CREATE_DELETE_VOLUME", "CLONE_VOLUME"),
        party="plugin",
        variant="clone",
        why="a clone returned at its source's size, smaller than the range asked",
    ),
    Case(
        SPEC,
        ("CreateVolume.51", "CreateVolume.56"),
        "csi.volume-context-changed",
        breach=(_CREATED, Step("ListVolumes", answer=_listed({"share": "pool-b/vol-1"}))),
        twin=(_CREATED, Step("ListVolumes", answer=_listed(CONTEXT))),
        background=_LIST_VOLUMES,
        party="plugin",
        variant="listed",
    ),
    Case(
        SPEC,
        ("CreateVolume.51", "CreateVolume.56"),
        "csi.volume-context-changed",
        breach=(
            _CREATED,
            Step("ControllerGetVolume", _DELETE, answer=_got({"share": "pool-b/vol-1"})),
        ),
        twin=(_CREATED, Step("ControllerGetVolume", _DELETE, answer=_got(CONTEXT))),
        background=_GET_VOLUME,
        party="plugin",
        variant="got",
    ),
    Case(
        SPEC,
        ("CreateVolume.57",),
        "csi.volume-context-mismatch",
        breach=(
            _CREATED,
            Step(
                "ControllerPublishVolume",
                {**_PUBLISHED.request, "volume_context": {"share": "pool-b/vol-1"}},
                answer=_PUBLISHED.answer,
            ),
        ),
        twin=(
            _CREATED,
            Step(
                "ControllerPublishVolume",
                {**_PUBLISHED.request, "volume_context": CONTEXT},
                answer=_PUBLISHED.answer,
            ),
        ),
        background=controller(*_PUBLISH_CAPS),
        party="co",
        variant="publish",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.8",),
        "csi.capabilities-inconsistent",
        breach=(
            Step("GetPluginCapabilities", answer=_expansion_caps("ONLINE")),
            Step("ControllerGetCapabilities", answer=rpc_caps("CREATE_DELETE_VOLUME")),
            Step("NodeGetCapabilities", answer=rpc_caps("STAGE_UNSTAGE_VOLUME")),
        ),
        twin=(
            Step("GetPluginCapabilities", answer=_expansion_caps("ONLINE")),
            Step("ControllerGetCapabilities", answer=_EXPAND_CAPS),
            Step("NodeGetCapabilities", answer=rpc_caps("STAGE_UNSTAGE_VOLUME")),
        ),
        background=v1_background(node=("STAGE_UNSTAGE_VOLUME",)),
        party="plugin",
        variant="plugin-first",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.11",),
        "csi.capabilities-inconsistent",
        breach=(
            Step(
                "GetPluginCapabilities",
                answer={"capabilities": [{"volume_expansion": {"type": "OFFLINE"}}]},
            ),
        ),
        twin=(
            Step("ControllerGetCapabilities", answer=_EXPAND_CAPS),
            Step("GetPluginCapabilities", answer=_expansion_caps("OFFLINE")),
        ),
        background=v1_background(node=("EXPAND_VOLUME",)),
        party="plugin",
        variant="no-controller-service",
        why="OFFLINE expansion from a plugin that serves no controller at all",
    ),
    Case(
        SPEC,
        ("Error-Scheme.10",),
        "csi.retry-without-backoff",
        breach=(
            Step("DeleteVolume", _DELETE, error=_ABORTED),
            Step("DeleteVolume", _DELETE, error=_ABORTED, wait=0.1),
            Step("DeleteVolume", _DELETE, error=_ABORTED, wait=0.1),
            Step("DeleteVolume", _DELETE, wait=0.1),
        ),
        twin=(
            Step("DeleteVolume", _DELETE, error=_ABORTED),
            Step("DeleteVolume", _DELETE, error=_ABORTED, wait=0.1),
            Step("DeleteVolume", _DELETE, error=_ABORTED, wait=0.2),
            Step("DeleteVolume", _DELETE, wait=0.4),
        ),
        background=BG,
        party="co",
        variant="delete",
    ),
    Case(
        SPEC,
        ("Error-Scheme.7",),
        "csi.retry-without-change",
        breach=(
            Step("CreateVolume", _BAD_PARAMS, error=("INVALID_ARGUMENT", "refused")),
            Step("CreateVolume", _BAD_PARAMS, answer=volume(), new_connection=True),
        ),
        twin=(
            Step("CreateVolume", _BAD_PARAMS, error=("INVALID_ARGUMENT", "refused")),
            Step("CreateVolume", _FIXED_PARAMS, answer=volume(), new_connection=True),
        ),
        background=BG,
        party="co",
        variant="other-connection",
        why="the refused create re-sent unchanged over a connection of its own",
    ),
    _stream_case(
        "GetMetadataAllocated",
        "GetMetadataAllocated.lc4",
        "volume_capacity_bytes",
        2 * GIB,
        {"snapshot_id": SNAP},
        at=2,
        variant="last-message",
    ),
    _segment_case(
        ("CreateVolume.81",),
        "csi.topology-key-format",
        {"example.com/" + "z" * 64: "zone-a"},
        {"example.com/" + "z" * 63: "zone-a"},
        "a key name of 64 characters",
        "64-characters",
    ),
    _segment_case(
        ("CreateVolume.82",),
        "csi.topology-key-format",
        {"e" * 60 + ".com/zone": "zone-a"},
        {"e" * 59 + ".com/zone": "zone-a"},
        "a key prefix of 64 characters",
        "long-prefix",
    ),
    _segment_case(
        ("CreateVolume.88",),
        "csi.topology-value-format",
        {"example.com/zone": "zone a"},
        {"example.com/zone": "zone-a"},
        "a segment value with a space",
        "space",
    ),
    _one(
        ("CreateVolume.81",),
        "csi.topology-key-format",
        "CreateVolume",
        (
            create(
                accessibility_requirements={"requisite": [_topology(**{"example.com/-zone": "a"})]}
            ),
            volume(),
        ),
        (
            create(
                accessibility_requirements={"requisite": [_topology(**{"example.com/zone": "a"})]}
            ),
            volume(),
        ),
        TOPOLOGY,
        party="co",
        variant="requested",
        why="the CO's requisite topology has a key name beginning with a dash",
    ),
]

# -- more variants: other RPCs and sockets carrying the same breach ----------------------------
_STAGED_CONTEXT = v1_background(
    controller=("CREATE_DELETE_VOLUME",), node=("STAGE_UNSTAGE_VOLUME",)
)
_UNIFIED_OFFLINE = {
    **v1_background(
        controller=("CREATE_DELETE_VOLUME", "EXPAND_VOLUME"), node=("STAGE_UNSTAGE_VOLUME",)
    ),
    "GetPluginCapabilities": _expansion_caps("OFFLINE"),
}
_UNIFIED_ONLINE = {**_UNIFIED_OFFLINE, "GetPluginCapabilities": _expansion_caps("ONLINE")}
_NODE_STAGE = Step("NodeStageVolume", stage())
_NODE_PUBLISH = Step(
    "NodePublishVolume",
    {
        "volume_id": VOL,
        "target_path": TARGET,
        "volume_capability": RWO,
        "staging_target_path": STAGING,
    },
)
_WIDE = {**CONTEXT, "tier": "gold"}
_ZONE_C = _topology(**{"example.com/zone": "zone-c"})
_ZONE_D = _topology(**{"example.com/zone": "zone-d"})
_RACK_1 = _topology(**{"example.com/zone": "zone-a", "example.com/rack": "rack-1"})
_RACK_2 = _topology(**{"example.com/zone": "zone-a", "example.com/rack": "rack-2"})
_MANY_FLAGS = {**RWO, "mount": {"mount_flags": ["o" * 64] * 65}}
_FLAGS = {**RWO, "mount": {"mount_flags": ["o" * 64] * 64}}

CASES += [
    Case(
        SPEC,
        ("CreateVolume.57",),
        "csi.volume-context-mismatch",
        breach=(_CREATED, Step("NodeStageVolume", stage(volume_context={"share": "pool-b/vol-1"}))),
        twin=(_CREATED, Step("NodeStageVolume", stage(volume_context=CONTEXT))),
        background=_STAGED_CONTEXT,
        party="co",
        variant="stage",
    ),
    Case(
        SPEC,
        ("CreateVolume.57",),
        "csi.volume-context-mismatch",
        breach=(
            Step("CreateVolume", create(), answer=volume(volume_context=_WIDE)),
            Step(
                "ControllerPublishVolume",
                {**_PUBLISHED.request, "volume_context": CONTEXT},
                answer=_PUBLISHED.answer,
            ),
        ),
        twin=(
            Step("CreateVolume", create(), answer=volume(volume_context=_WIDE)),
            Step(
                "ControllerPublishVolume",
                {**_PUBLISHED.request, "volume_context": _WIDE},
                answer=_PUBLISHED.answer,
            ),
        ),
        background=controller(*_PUBLISH_CAPS),
        party="co",
        variant="entry-left-out",
        why="one of the two entries CreateVolume returned is not passed on",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.10",),
        "csi.call-order",
        breach=(
            _PUBLISHED,
            Step("ControllerExpandVolume", _EXPAND, answer={"capacity_bytes": 2 * GIB}),
        ),
        twin=(
            _PUBLISHED,
            Step("ControllerUnpublishVolume", {"volume_id": VOL, "node_id": NODE}),
            Step("ControllerExpandVolume", _EXPAND, answer={"capacity_bytes": 2 * GIB}),
        ),
        background={
            **v1_background(controller=(*_PUBLISH_CAPS, "EXPAND_VOLUME")),
            "GetPluginCapabilities": _expansion_caps("OFFLINE"),
        },
        party="co",
        variant="plugin-expands",
        why="the CO expands a published volume under OFFLINE and the plugin goes along",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.10",),
        "csi.call-order",
        breach=(_NODE_STAGE, _NODE_PUBLISH, Step("ControllerExpandVolume", _EXPAND, error=_IN_USE)),
        twin=(
            _NODE_STAGE,
            _NODE_PUBLISH,
            Step("NodeUnpublishVolume", {"volume_id": VOL, "target_path": TARGET}),
            Step("NodeUnstageVolume", {"volume_id": VOL, "staging_target_path": STAGING}),
            Step("ControllerExpandVolume", _EXPAND, answer={"capacity_bytes": 2 * GIB}),
        ),
        background=_UNIFIED_OFFLINE,
        party="co",
        variant="node-published",
        why="a volume published by the node service of the same socket, expanded under OFFLINE",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.9",),
        "csi.expand-published-refused",
        breach=(_NODE_STAGE, _NODE_PUBLISH, Step("ControllerExpandVolume", _EXPAND, error=_IN_USE)),
        twin=(
            _NODE_STAGE,
            _NODE_PUBLISH,
            Step(
                "ControllerExpandVolume",
                _EXPAND,
                answer={"capacity_bytes": 2 * GIB, "node_expansion_required": True},
            ),
        ),
        background=_UNIFIED_ONLINE,
        party="plugin",
        variant="node-published",
    ),
    _one(
        ("CreateVolume.61", "CreateVolume.76"),
        "csi.topology-outside-requisite",
        "CreateVolume",
        (
            create(accessibility_requirements={"requisite": [ZONE_A, ZONE_B]}),
            volume(accessible_topology=[_ZONE_C, _ZONE_D]),
        ),
        (
            create(accessibility_requirements={"requisite": [ZONE_A, ZONE_B]}),
            volume(accessible_topology=[ZONE_B, ZONE_A]),
        ),
        TOPOLOGY,
        party="plugin",
        variant="two-outside",
        why="two accessible topologies, neither a requisite one",
    ),
    _one(
        ("CreateVolume.61", "CreateVolume.76"),
        "csi.topology-outside-requisite",
        "CreateVolume",
        (
            create(accessibility_requirements={"requisite": [_RACK_1]}),
            volume(accessible_topology=[_RACK_2]),
        ),
        (
            create(accessibility_requirements={"requisite": [_RACK_1]}),
            volume(accessible_topology=[_RACK_1]),
        ),
        TOPOLOGY,
        party="plugin",
        variant="one-segment-off",
        why="the zone matches but the rack does not",
    ),
    _one(
        ("CreateVolume.75",),
        "csi.topology-preferred-not-requisite",
        "CreateVolume",
        (
            create(
                accessibility_requirements={
                    "requisite": [ZONE_A, ZONE_B],
                    "preferred": [ZONE_B, _ZONE_C],
                }
            ),
            volume(accessible_topology=[ZONE_B]),
        ),
        (
            create(
                accessibility_requirements={
                    "requisite": [ZONE_A, ZONE_B],
                    "preferred": [ZONE_B, ZONE_A],
                }
            ),
            volume(accessible_topology=[ZONE_B]),
        ),
        TOPOLOGY,
        party="co",
        variant="second-preferred",
    ),
    Case(
        SPEC,
        ("GetVolumeGroupSnapshot.lc2",),
        "csi.deleted-group-answered",
        breach=(
            Step("DeleteVolumeGroupSnapshot", _GROUP_REQ),
            Step("GetVolumeGroupSnapshot", _GROUP_REQ, answer=_group_answer(), new_connection=True),
        ),
        twin=(
            Step("DeleteVolumeGroupSnapshot", _GROUP_REQ),
            Step("GetVolumeGroupSnapshot", _GROUP_REQ, error=_GONE, new_connection=True),
        ),
        background=group_background(),
        party="plugin",
        variant="other-connection",
    ),
    Case(
        SPEC,
        ("Probe.1",),
        "csi.unimplemented-advertised",
        breach=(Step("Probe", error=("UNIMPLEMENTED", "Probe not implemented")),),
        twin=(Step("Probe", answer={"ready": {"value": True}}),),
        background=NODE_ONLY,
        party="plugin",
        variant="node-plugin",
    ),
    Case(
        SPEC,
        ("RPC-Interface.5",),
        "csi.unimplemented-advertised",
        breach=(
            Step("CreateVolume", create(), answer=volume()),
            Step("ValidateVolumeCapabilities", validate(), error=("UNIMPLEMENTED", "no")),
        ),
        twin=(
            Step("CreateVolume", create(), answer=volume()),
            Step(
                "ValidateVolumeCapabilities",
                validate(),
                answer={"confirmed": {"volume_capabilities": [RWO]}},
            ),
        ),
        background=v1_background(plugin=(), controller=("CREATE_DELETE_VOLUME",)),
        party="plugin",
        variant="served-not-advertised",
        why="a controller served (CreateVolume answered) though CONTROLLER_SERVICE is not listed",
    ),
    Case(
        SPEC,
        ("CreateVolume.32",),
        "csi.size-limit",
        breach=(
            Step(
                "ControllerPublishVolume",
                {**_PUBLISHED.request, "volume_capability": _MANY_FLAGS},
                answer=_PUBLISHED.answer,
            ),
        ),
        twin=(
            Step(
                "ControllerPublishVolume",
                {**_PUBLISHED.request, "volume_capability": _FLAGS},
                answer=_PUBLISHED.answer,
            ),
        ),
        background=controller(*_PUBLISH_CAPS),
        party="co",
        variant="publish",
    ),
]

# -- the same messages carried by other RPCs (CapacityRange, VolumeCapability, Volume, Topology)
_EXPANDS = controller("CREATE_DELETE_VOLUME", "EXPAND_VOLUME")
_LISTS = controller("CREATE_DELETE_VOLUME", "LIST_VOLUMES")
_NODE_STAGES = v1_background(node=("STAGE_UNSTAGE_VOLUME",))
_TOPOLOGY_NODE = v1_background(
    plugin=("CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"),
    node=("STAGE_UNSTAGE_VOLUME",),
)
_CAPACITY_TOPOLOGY = {
    **TOPOLOGY,
    "ControllerGetCapabilities": rpc_caps("CREATE_DELETE_VOLUME", "GET_CAPACITY"),
}


def _expand(capacity_range: dict[str, Any]) -> dict[str, Any]:
    return {"volume_id": VOL, "capacity_range": capacity_range}


def _node_info(segments: dict[str, str]) -> dict[str, Any]:
    return {"node_id": NODE, "accessible_topology": {"segments": segments}}


def _entry(**volume_fields: Any) -> dict[str, Any]:
    return {"entries": [{"volume": volume_fields}]}


CASES += [
    _one(
        ("CreateVolume.43",),
        "csi.negative-value",
        "ControllerExpandVolume",
        (_expand({"required_bytes": -GIB}), {"capacity_bytes": GIB}),
        (_expand({"required_bytes": GIB}), {"capacity_bytes": GIB}),
        _EXPANDS,
        party="co",
        variant="expand",
    ),
    _one(
        ("CreateVolume.42",),
        "csi.capacity-out-of-range",
        "ControllerExpandVolume",
        (_expand({"required_bytes": 4 * GIB}), {"capacity_bytes": 2 * GIB}),
        (_expand({"required_bytes": 4 * GIB}), {"capacity_bytes": 4 * GIB}),
        _EXPANDS,
        party="plugin",
        variant="expand",
    ),
    _one(
        ("CreateVolume.41",),
        "csi.capacity-range-empty",
        "ControllerExpandVolume",
        (_expand({}), {"capacity_bytes": 4 * GIB}),
        (_expand({"required_bytes": 4 * GIB}), {"capacity_bytes": 4 * GIB}),
        _EXPANDS,
        party="co",
        variant="expand",
    ),
    _one(
        ("CreateVolume.46",),
        "csi.negative-value",
        "ListVolumes",
        ({}, _entry(volume_id=VOL, capacity_bytes=-1)),
        ({}, _entry(volume_id=VOL, capacity_bytes=GIB)),
        _LISTS,
        party="plugin",
        variant="listed",
    ),
    _one(
        ("CreateVolume.47",),
        "csi.required-field",
        "ListVolumes",
        ({}, _entry(capacity_bytes=GIB)),
        ({}, _entry(volume_id=VOL, capacity_bytes=GIB)),
        _LISTS,
        party="plugin",
        variant="listed",
    ),
    _required_request(
        ("CreateVolume.37",),
        "ValidateVolumeCapabilities",
        validate(volume_capabilities=[CAP_NO_MODE]),
        validate(),
        {"confirmed": {"volume_capabilities": [RWO]}},
        BG,
        "validate",
    ),
    _required_request(
        ("CreateVolume.38",),
        "NodePublishVolume",
        {**_NODE_PUBLISH.request, "volume_capability": CAP_NO_TYPE},
        _NODE_PUBLISH.request,
        {},
        NODE_ONLY,
        "node-publish",
    ),
    _required_request(
        ("CreateVolume.39",),
        "NodeStageVolume",
        stage(volume_capability=CAP_NO_ACCESS_MODE),
        stage(),
        {},
        _NODE_STAGES,
        "node-stage",
    ),
    _one(
        ("CreateVolume.26",),
        "csi.required-field",
        "CreateVolume",
        (
            create(volume_content_source=FROM_SNAPSHOT),
            volume(content_source={"snapshot": {}}),
        ),
        (create(volume_content_source=FROM_SNAPSHOT), volume(content_source=FROM_SNAPSHOT)),
        _SNAP_CAPS,
        party="plugin",
        variant="answer",
    ),
    _one(
        ("CreateVolume.81",),
        "csi.topology-key-format",
        "NodeGetInfo",
        ({}, _node_info({"example.com/zone-": "zone-a"})),
        ({}, _node_info({"example.com/zone": "zone-a"})),
        _TOPOLOGY_NODE,
        party="plugin",
        variant="node",
    ),
    _one(
        ("CreateVolume.85", "CreateVolume.86"),
        "csi.topology-key-duplicate",
        "NodeGetInfo",
        ({}, _node_info({"example.com/Zone": "zone-a", "example.com/zone": "zone-a"})),
        ({}, _node_info({"example.com/rack": "rack-1", "example.com/zone": "zone-a"})),
        _TOPOLOGY_NODE,
        party="plugin",
        variant="node",
    ),
    _one(
        ("CreateVolume.87",),
        "csi.topology-value-format",
        "NodeGetInfo",
        ({}, _node_info({"example.com/zone": ""})),
        ({}, _node_info({"example.com/zone": "zone-a"})),
        _TOPOLOGY_NODE,
        party="plugin",
        variant="node",
    ),
    _one(
        ("CreateVolume.82",),
        "csi.topology-key-format",
        "GetCapacity",
        (
            {"accessible_topology": {"segments": {"Example.com/zone": "zone-a"}}},
            {"available_capacity": GIB},
        ),
        (
            {"accessible_topology": {"segments": {"example.com/zone": "zone-a"}}},
            {"available_capacity": GIB},
        ),
        _CAPACITY_TOPOLOGY,
        party="co",
        variant="capacity",
    ),
    _one(
        ("CreateVolume.88",),
        "csi.topology-value-format",
        "CreateVolume",
        (
            create(
                accessibility_requirements={
                    "preferred": [_topology(**{"example.com/zone": "z" * 64})]
                }
            ),
            volume(),
        ),
        (
            create(
                accessibility_requirements={
                    "preferred": [_topology(**{"example.com/zone": "z" * 63})]
                }
            ),
            volume(),
        ),
        TOPOLOGY,
        party="co",
        variant="requested",
    ),
]

# -- a REQUIRED field the text around it lets a plugin do without; recovery variants ----------
_PUBLISH_REQUEST = _PUBLISHED.request
CASES += [
    Case(
        SPEC,
        ("REQUIRED-vs-OPTIONAL.1",),
        "csi.required-field-caveat",
        breach=(
            Step("GetVolumeGroupSnapshot", {"group_snapshot_id": GROUP}, answer=_group_answer()),
        ),
        twin=(Step("GetVolumeGroupSnapshot", _GROUP_REQ, answer=_group_answer()),),
        background=group_background(),
        party="co",
        why="a group snapshot asked for without its REQUIRED snapshot_ids, which the plugin"
        " can do without",
    ),
    _one(
        ("CreateVolume.11",),
        "csi.capacity-out-of-range",
        "CreateVolume",
        (
            create(volume_content_source=FROM_SNAPSHOT, capacity_range={"limit_bytes": 2 * GIB}),
            volume(capacity_bytes=4 * GIB, content_source=FROM_SNAPSHOT),
        ),
        (
            create(volume_content_source=FROM_SNAPSHOT, capacity_range={"limit_bytes": 4 * GIB}),
            volume(capacity_bytes=4 * GIB, content_source=FROM_SNAPSHOT),
        ),
        _SNAP_CAPS,
        party="plugin",
        variant="over-limit",
        why="restored at its snapshot's size, above the range's limit",
    ),
    Case(
        SPEC,
        ("Error-Scheme.10",),
        "csi.retry-while-pending",
        breach=(
            Step("ControllerPublishVolume", _PUBLISH_REQUEST, hold=0.6, pending=True),
            Step("DeleteVolume", _DELETE, error=_ABORTED, pending=True),
            Step("ControllerPublishVolume", _PUBLISH_REQUEST, hold=0.6, pending=True),
            Step("DeleteVolume", _DELETE, wait=0.7),
        ),
        twin=(
            Step("ControllerPublishVolume", _PUBLISH_REQUEST, hold=0.2, pending=True),
            Step("DeleteVolume", _DELETE, error=_ABORTED, pending=True),
            Step("DeleteVolume", _DELETE, wait=0.7),
        ),
        background=controller(*_PUBLISH_CAPS),
        party="co",
        variant="other-rpc",
        why="a delete retried while a publish of the same volume is in flight",
    ),
    Case(
        SPEC,
        ("Error-Scheme.10",),
        "csi.retry-without-backoff",
        breach=(
            Step("DeleteVolume", _DELETE, error=_ABORTED),
            Step("DeleteVolume", _DELETE, error=_ABORTED, wait=0.3),
            Step("DeleteVolume", _DELETE, error=_ABORTED, wait=0.2),
            Step("DeleteVolume", _DELETE, wait=0.1),
        ),
        twin=(
            Step("DeleteVolume", _DELETE, error=_ABORTED),
            Step("DeleteVolume", _DELETE, error=_ABORTED, wait=0.1),
            Step("DeleteVolume", _DELETE, error=_ABORTED, wait=0.2),
            Step("DeleteVolume", _DELETE, wait=0.4),
        ),
        background=BG,
        party="co",
        variant="shrinking-waits",
    ),
]
