"""Catalogue of deliberate spec breaches a fake plugin can commit (``--misbehave NAME``).

Each entry is data: the specs it applies to, the spec section it breaks, a description,
and small hook functions keyed by RPC name. Request hooks run before the plugin method
(they may raise, or bend the request the plugin sees); response hooks edit a successful
response in place; an error hook reshapes every error the plugin returns. The plugin's own
logic stays correct: a breach only exists while its entry is enabled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import grpc

from plugproxy.core.endpoints import ConfigError
from plugproxy.core.sampling import varint
from plugproxy.fakes.common import (
    DynMessage,
    FakeError,
    enum_name,
    enum_number,
    has_descriptor_field,
)
from plugproxy.fakes.csi_model import NODE_TOPOLOGY

if TYPE_CHECKING:
    from plugproxy.api import MethodInfo

CSI = frozenset({"csi.v1", "csi.v0"})
CSI_V1 = frozenset({"csi.v1"})
COSI = frozenset({"cosi.v1alpha1"})
CMI = frozenset({"cmi.v1"})
ALL = CSI | COSI | CMI
KMS = frozenset({"kms.v2"})
DEVICE_PLUGIN = frozenset({"deviceplugin.v1beta1"})
COSI_V1ALPHA2 = frozenset({"cosi.v1alpha2"})
# The DRA fake serves DRAPlugin v1 and v1beta1 and health v1 and v1alpha1: each breach is
# committed in whichever version the call was made.
DRA = frozenset({"dra.v1"})


@dataclass
class HookContext:
    # The FakePlugin serving the call; a hook reads only the objects it keeps by name, so
    # this module needs nothing of the plugin's type (fakes.base imports this module).
    plugin: object
    method: MethodInfo
    state: dict[str, Any]  # private to one misbehaviour of one plugin instance


RequestHook = Callable[[HookContext, DynMessage], None]
ResponseHook = Callable[[HookContext, DynMessage, DynMessage], None]
ErrorHook = Callable[[HookContext, FakeError], FakeError]


@dataclass(frozen=True)
class Misbehaviour:
    name: str
    specs: frozenset[str]
    section: str
    description: str
    requests: Mapping[str, RequestHook] = field(default_factory=dict)
    responses: Mapping[str, ResponseHook] = field(default_factory=dict)
    error: ErrorHook | None = None


# -- small field helpers (csi.v0 and csi.v1 name some fields differently) -------------------


def _volume_id_field(volume: DynMessage) -> str:
    return "volume_id" if has_descriptor_field(volume, "volume_id") else "id"


def _version_field(info: DynMessage) -> str:
    return "vendor_version" if has_descriptor_field(info, "vendor_version") else "version"


def drop_capabilities(response: DynMessage, unwanted: Iterable[str]) -> None:
    """Remove capability entries whose inner type enum is named in ``unwanted``."""
    names = set(unwanted)
    keep = []
    for cap in response.capabilities:
        kind = cap.WhichOneof("type")
        inner = getattr(cap, kind) if kind else None
        if inner is not None and enum_name(inner, "type") in names:
            continue
        keep.append(cap)
    del response.capabilities[:]
    response.capabilities.extend(keep)


def _len_field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def status_bytes(code: grpc.StatusCode, message: str, details: Iterable[bytes] = ()) -> bytes:
    """Wire form of a google.rpc.Status with ``details`` (each a serialized Any).

    Encoded by hand: google.rpc is not among plugproxy's dependencies.
    """
    out = varint(1 << 3) + varint(code.value[0]) + _len_field(2, message.encode())
    for detail in details:
        out += _len_field(3, detail)
    return out


def status_details_bytes(code: grpc.StatusCode, message: str) -> bytes:
    """A google.rpc.Status carrying one Any(StringValue) detail: a non-empty
    ``grpc-status-details-bin`` value."""
    detail = _len_field(1, b"deliberate status detail from the fake plugin")
    any_msg = _len_field(1, b"type.googleapis.com/google.protobuf.StringValue") + _len_field(
        2, detail
    )
    return status_bytes(code, message, (any_msg,))


# -- hooks ----------------------------------------------------------------------------------


def _clear_volume_id(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    setattr(resp.volume, _volume_id_field(resp.volume), "")


def _negative_capacity(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.volume.capacity_bytes = -1


def _capacity_outside_range(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    cr = req.capacity_range
    if cr.limit_bytes > 0:
        resp.volume.capacity_bytes = cr.limit_bytes + 1024 * 1024
    elif cr.required_bytes > 1:
        resp.volume.capacity_bytes = cr.required_bytes - 1


def _drop_content_source(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.volume.ClearField("content_source")


def _new_id_on_retry(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    seen: dict[str, int] = ctx.state.setdefault("seen", {})
    count = seen.get(req.name, 0)
    seen[req.name] = count + 1
    if count:
        fname = _volume_id_field(resp.volume)
        setattr(resp.volume, fname, f"{getattr(resp.volume, fname)}-again{count}")


def _hide_topology_capability(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    drop_capabilities(resp, {"VOLUME_ACCESSIBILITY_CONSTRAINTS", "ACCESSIBILITY_CONSTRAINTS"})


def _ensure_topology(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    if not resp.volume.accessible_topology:
        resp.volume.accessible_topology.add().segments.update(NODE_TOPOLOGY)


def _bad_name(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.name = "-Fake_Plugin!"


def _long_name(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.name = "a" * 56 + ".fake.plugproxy.io"


def _empty_version(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    setattr(resp, _version_field(resp), "")


def _long_version(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    setattr(resp, _version_field(resp), "1." + "0" * 150)


def _long_bucket_string(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    kind = resp.bucket_info.WhichOneof("type") or "s3"
    proto = getattr(resp.bucket_info, kind)
    first = next(f.name for f in proto.DESCRIPTOR.fields if f.type == f.TYPE_STRING)
    setattr(proto, first, "r" * 200)


def _empty_message(ctx: HookContext, err: FakeError) -> FakeError:
    return FakeError(err.code, "", err.trailing)


def _with_details(ctx: HookContext, err: FakeError) -> FakeError:
    details = status_details_bytes(err.code, err.message)
    return FakeError(err.code, err.message, (*err.trailing, ("grpc-status-details-bin", details)))


def _unimplemented(ctx: HookContext, req: DynMessage) -> None:
    raise FakeError(grpc.StatusCode.UNIMPLEMENTED, f"{ctx.method.name} is not implemented")


def _ignore_max_entries(ctx: HookContext, req: DynMessage) -> None:
    req.max_entries = 0


def _confirm_unrequested(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    confirmed = resp.confirmed
    extra = confirmed.volume_capabilities.add()
    extra.block.SetInParent()
    extra.access_mode.mode = enum_number(extra.access_mode, "mode", "MULTI_NODE_MULTI_WRITER")
    confirmed.parameters["fake.plugproxy.io/unrequested"] = "true"
    resp.message = ""


def _other_source(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.snapshot.source_volume_id = f"{req.source_volume_id}-elsewhere"


def _no_creation_time(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    if has_descriptor_field(resp.snapshot, "creation_time"):
        resp.snapshot.ClearField("creation_time")
    else:
        resp.snapshot.created_at = 0


def _no_node_id(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.node_id = ""


def _negative_available(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.available_capacity = -1


def _offset_zero(ctx: HookContext, req: DynMessage) -> None:
    req.starting_offset = 0


def _more_results(ctx: HookContext, req: DynMessage) -> None:
    if req.max_results > 0:
        req.max_results = req.max_results * 2 + 1


def _empty_bucket_id(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.bucket_id = ""


def _empty_account_id(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.account_id = ""


def _no_credentials(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.credentials.clear()


def _no_provider_id(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.ProviderID = ""


def _no_node_name(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.NodeName = ""


def _hide_create_machine(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    drop_capabilities(resp, {"CREATE_MACHINE"})


_INFO = ("GetPluginInfo", "DriverGetInfo")


def _empty_key_id(ctx: HookContext, request: DynMessage, response: DynMessage) -> None:
    response.key_id = ""


def _kms_version_v1(ctx: HookContext, request: DynMessage, response: DynMessage) -> None:
    response.version = "v1"


def _health_lower_case(ctx: HookContext, request: DynMessage, response: DynMessage) -> None:
    for device in response.devices:
        device.health = device.health.lower()


def _leave_out_last_claim(ctx: HookContext, request: DynMessage, response: DynMessage) -> None:
    if request.claims:
        response.claims.pop(request.claims[-1].uid, None)


def _answer_unrequested_claim(ctx: HookContext, request: DynMessage, response: DynMessage) -> None:
    response.claims["claim-nobody-asked-for"].SetInParent()


def _device_without_pool(ctx: HookContext, request: DynMessage, response: DynMessage) -> None:
    for uid in response.claims:
        for device in response.claims[uid].devices:
            device.pool_name = ""


def _health_out_of_enum(ctx: HookContext, request: DynMessage, response: DynMessage) -> None:
    if response.devices:
        response.devices[0].health = 3  # HealthStatus ends at UNHEALTHY = 2


def _health_time_milliseconds(ctx: HookContext, request: DynMessage, response: DynMessage) -> None:
    for device in response.devices:
        device.last_updated_time *= 1000


def _health_without_device(ctx: HookContext, request: DynMessage, response: DynMessage) -> None:
    if response.devices:
        response.devices[0].ClearField("device")


def _health_device_twice(ctx: HookContext, request: DynMessage, response: DynMessage) -> None:
    if response.devices:
        response.devices.add().CopyFrom(response.devices[0])


# COSI v1alpha2: a bucket info's members by protocol.
_COSI_MEMBERS = ("s3", "azure", "gcs")


def _drop_first_requested(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    names = [enum_name(p, "type").lower() for p in req.protocols]
    member = next((n for n in names if n in _COSI_MEMBERS), "s3")
    resp.protocols.ClearField(member)


def _underscore_bucket_id(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    resp.bucket_id = resp.bucket_id.replace("-", "_")


def _first_bucket_only(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    del resp.buckets[1:]


def _other_protocol_info(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    for bucket in resp.buckets:
        info = bucket.bucket_info
        given = [m for m in _COSI_MEMBERS if info.HasField(m)]
        other = next(m for m in _COSI_MEMBERS if m not in given)
        info.Clear()
        getattr(info, other).SetInParent()


def _empty_key_credentials(ctx: HookContext, req: DynMessage, resp: DynMessage) -> None:
    for member in _COSI_MEMBERS:
        if resp.credentials.HasField(member):
            getattr(resp.credentials, member).Clear()


def _gone_is_not_found(attribute: str, field_name: str) -> RequestHook:
    """A request for an object the fake does not hold answers NOT_FOUND."""

    def hook(ctx: HookContext, req: DynMessage) -> None:
        held = getattr(ctx.plugin, attribute, {})
        value = getattr(req, field_name)
        if value and value not in held:
            raise FakeError(grpc.StatusCode.NOT_FOUND, f"no {field_name} {value!r}")

    return hook


_ENTRIES = [
    Misbehaviour(
        "create-volume-no-id",
        CSI,
        "CSI v1.12 §CreateVolume (Volume.volume_id REQUIRED); CSI v0.3 §CreateVolume (Volume.id)",
        "CreateVolume succeeds with an empty volume id.",
        responses={"CreateVolume": _clear_volume_id},
    ),
    Misbehaviour(
        "create-volume-negative-capacity",
        CSI,
        "CSI v1.12 §CreateVolume (Volume.capacity_bytes MUST NOT be negative)",
        "CreateVolume reports capacity_bytes = -1.",
        responses={"CreateVolume": _negative_capacity},
    ),
    Misbehaviour(
        "create-volume-capacity-out-of-range",
        CSI,
        "CSI v1.12 §CreateVolume and §CapacityRange (the range MUST be honoured)",
        "CreateVolume reports a capacity above limit_bytes (or, without a limit, below"
        " required_bytes) whenever the request carries a capacity range.",
        responses={"CreateVolume": _capacity_outside_range},
    ),
    Misbehaviour(
        "create-volume-content-source-dropped",
        CSI,
        "CSI v1.12 §CreateVolume (Volume.content_source reports the pre-populated source)",
        "CreateVolume from a snapshot or volume answers without content_source.",
        responses={"CreateVolume": _drop_content_source},
    ),
    Misbehaviour(
        "create-volume-not-idempotent",
        CSI,
        "CSI v1.12 §CreateVolume (MUST be idempotent: same name and arguments, same volume)",
        "A repeated CreateVolume with the same name and arguments returns a different volume id.",
        responses={"CreateVolume": _new_id_on_retry},
    ),
    Misbehaviour(
        "topology-without-capability",
        CSI,
        "CSI v1.12 §CreateVolume (Volume.accessible_topology needs the"
        " VOLUME_ACCESSIBILITY_CONSTRAINTS plugin capability) and §GetPluginCapabilities",
        "GetPluginCapabilities stops advertising VOLUME_ACCESSIBILITY_CONSTRAINTS while"
        " CreateVolume and NodeGetInfo keep returning accessible_topology.",
        responses={
            "GetPluginCapabilities": _hide_topology_capability,
            "CreateVolume": _ensure_topology,
        },
    ),
    Misbehaviour(
        "plugin-name-invalid",
        ALL | COSI_V1ALPHA2,
        "CSI v1.12 §GetPluginInfo, COSI §DriverGetInfo, CMI §GetPluginInfo (name in domain"
        " name notation, alphanumeric at both ends)",
        "The plugin name is '-Fake_Plugin!'.",
        responses=dict.fromkeys(_INFO, _bad_name),
    ),
    Misbehaviour(
        "plugin-name-too-long",
        ALL | COSI_V1ALPHA2,
        "CSI v1.12 §GetPluginInfo, COSI §DriverGetInfo, CMI §GetPluginInfo (name 63"
        " characters or less)",
        "The plugin name is 74 characters long.",
        responses=dict.fromkeys(_INFO, _long_name),
    ),
    Misbehaviour(
        "vendor-version-empty",
        CSI | CMI,
        "CSI v1.12 §GetPluginInfo (vendor_version REQUIRED); CMI §GetPluginInfo (version)",
        "GetPluginInfo answers with an empty vendor_version (CMI: version).",
        responses={"GetPluginInfo": _empty_version},
    ),
    Misbehaviour(
        "string-too-long",
        ALL,
        "CSI v1.12 §Size Limits, COSI §Size Limits, CMI §Size Limits (strings <= 128 bytes)",
        "A response string exceeds 128 bytes: GetPluginInfo vendor_version/version (CSI, CMI),"
        " the first string of DriverCreateBucket's bucket_info protocol (COSI).",
        responses={"GetPluginInfo": _long_version, "DriverCreateBucket": _long_bucket_string},
    ),
    Misbehaviour(
        "error-empty-message",
        ALL | COSI_V1ALPHA2,
        "CSI v1.12 §Error Scheme, COSI §Error Scheme, CMI §Error Scheme (message MUST"
        " describe a non-OK status)",
        "Every error the plugin returns carries an empty status message.",
        error=_empty_message,
    ),
    Misbehaviour(
        "error-with-details",
        ALL | COSI_V1ALPHA2,
        "CSI v1.12 §Error Scheme, COSI §Error Scheme, CMI §Error Scheme (status details MUST"
        " be empty)",
        "Every error the plugin returns carries grpc-status-details-bin (a google.rpc.Status"
        " with one detail).",
        error=_with_details,
    ),
    Misbehaviour(
        "unimplemented-advertised",
        ALL | COSI_V1ALPHA2,
        "CSI v1.12 §ListVolumes (MUST implement with LIST_VOLUMES), COSI §DriverCreateBucket"
        " (MUST implement), CMI §GetMachineStatus (MUST implement with GET_MACHINE_STATUS)",
        "An RPC the plugin must implement answers UNIMPLEMENTED: ListVolumes (CSI),"
        " DriverCreateBucket (COSI), GetMachineStatus (CMI).",
        requests=dict.fromkeys(
            ("ListVolumes", "DriverCreateBucket", "GetMachineStatus"), _unimplemented
        ),
    ),
    Misbehaviour(
        "list-exceeds-max-entries",
        CSI,
        "CSI v1.12 §ListVolumes and §ListSnapshots (MUST NOT return more than max_entries)",
        "ListVolumes and ListSnapshots ignore max_entries and return every entry.",
        requests=dict.fromkeys(("ListVolumes", "ListSnapshots"), _ignore_max_entries),
    ),
    Misbehaviour(
        "validate-confirms-unrequested",
        CSI_V1,
        "CSI v1.12 §ValidateVolumeCapabilities (confirmed reflects what was validated; the CO"
        " compares it with its request)",
        "ValidateVolumeCapabilities confirms an extra block/MULTI_NODE_MULTI_WRITER capability"
        " and a parameter that were not requested.",
        responses={"ValidateVolumeCapabilities": _confirm_unrequested},
    ),
    Misbehaviour(
        "snapshot-source-mismatch",
        CSI,
        "CSI v1.12 §CreateSnapshot (Snapshot.source_volume_id identifies the source volume)",
        "CreateSnapshot reports a source_volume_id other than the requested one.",
        responses={"CreateSnapshot": _other_source},
    ),
    Misbehaviour(
        "snapshot-no-creation-time",
        CSI,
        "CSI v1.12 §CreateSnapshot (Snapshot.creation_time REQUIRED); CSI v0.3 (created_at)",
        "CreateSnapshot answers without a creation time.",
        responses={"CreateSnapshot": _no_creation_time},
    ),
    Misbehaviour(
        "node-info-no-node-id",
        CSI,
        "CSI v1.12 §NodeGetInfo (node_id REQUIRED); CSI v0.3 §NodeGetId",
        "NodeGetInfo (and csi.v0 NodeGetId) answer with an empty node_id.",
        responses=dict.fromkeys(("NodeGetInfo", "NodeGetId"), _no_node_id),
    ),
    Misbehaviour(
        "get-capacity-negative",
        CSI,
        "CSI v1.12 §GetCapacity (available_capacity MUST NOT be negative)",
        "GetCapacity reports available_capacity = -1.",
        responses={"GetCapacity": _negative_available},
    ),
    Misbehaviour(
        "metadata-offset-ignored",
        CSI_V1,
        "CSI v1.12 §GetMetadataAllocated and §GetMetadataDelta (no tuple may end before"
        " starting_offset)",
        "The snapshot metadata streams start at offset 0 whatever starting_offset says.",
        requests=dict.fromkeys(("GetMetadataAllocated", "GetMetadataDelta"), _offset_zero),
    ),
    Misbehaviour(
        "metadata-exceeds-max-results",
        CSI_V1,
        "CSI v1.12 §GetMetadataAllocated and §GetMetadataDelta (at most max_results tuples"
        " per message)",
        "Snapshot metadata messages carry up to 2*max_results+1 tuples.",
        requests=dict.fromkeys(("GetMetadataAllocated", "GetMetadataDelta"), _more_results),
    ),
    Misbehaviour(
        "bucket-id-empty",
        COSI,
        "COSI §DriverCreateBucket (bucket_id identifies the bucket for later calls)",
        "DriverCreateBucket succeeds with an empty bucket_id.",
        responses={"DriverCreateBucket": _empty_bucket_id},
    ),
    Misbehaviour(
        "grant-no-account-id",
        COSI,
        "COSI §DriverGrantBucketAccess (account_id REQUIRED)",
        "DriverGrantBucketAccess succeeds with an empty account_id.",
        responses={"DriverGrantBucketAccess": _empty_account_id},
    ),
    Misbehaviour(
        "grant-no-credentials",
        COSI,
        "COSI §DriverGrantBucketAccess (credentials REQUIRED: at least one entry)",
        "DriverGrantBucketAccess succeeds with no credentials.",
        responses={"DriverGrantBucketAccess": _no_credentials},
    ),
    Misbehaviour(
        "machine-no-provider-id",
        CMI,
        "CMI §CreateMachine and §GetMachineStatus (ProviderID REQUIRED)",
        "CreateMachine and GetMachineStatus answer with an empty ProviderID.",
        responses=dict.fromkeys(("CreateMachine", "GetMachineStatus"), _no_provider_id),
    ),
    Misbehaviour(
        "machine-no-node-name",
        CMI,
        "CMI §CreateMachine and §GetMachineStatus (NodeName REQUIRED)",
        "CreateMachine and GetMachineStatus answer with an empty NodeName.",
        responses=dict.fromkeys(("CreateMachine", "GetMachineStatus"), _no_node_name),
    ),
    Misbehaviour(
        "cmi-create-capability-missing",
        CMI,
        "CMI §GetPluginCapabilities and §CreateMachine (CREATE_MACHINE capability REQUIRED)",
        "GetPluginCapabilities omits CREATE_MACHINE although CreateMachine works.",
        responses={"GetPluginCapabilities": _hide_create_machine},
    ),
    Misbehaviour(
        "kms-key-id-empty",
        KMS,
        "KMS v2 api.proto §StatusResponse and §EncryptResponse (key_id must not be empty)",
        "Status and Encrypt answer with an empty key_id.",
        responses=dict.fromkeys(("Status", "Encrypt"), _empty_key_id),
    ),
    Misbehaviour(
        "kms-version-v1",
        KMS,
        'KMS v2 api.proto §StatusResponse (version must be "v2" or "v2beta1")',
        'Status answers version "v1".',
        responses={"Status": _kms_version_v1},
    ),
    Misbehaviour(
        "device-health-lower-case",
        DEVICE_PLUGIN,
        'Device plugin v1beta1 api.proto §Device (health is "Healthy" or "Unhealthy")',
        'ListAndWatch reports health as "healthy" and "unhealthy".',
        responses={"ListAndWatch": _health_lower_case},
    ),
    Misbehaviour(
        "dra-claim-left-out",
        DRA,
        "DRA api.proto §NodePrepareResourcesResponse (every requested claim gets prepared)",
        "NodePrepareResources answers without an entry for the request's last claim.",
        responses={"NodePrepareResources": _leave_out_last_claim},
    ),
    Misbehaviour(
        "dra-claim-not-requested",
        DRA,
        "DRA api.proto §NodeUnprepareResourcesResponse (the claims of the request, by uid)",
        "NodeUnprepareResources answers an entry for a claim uid the request did not name.",
        responses={"NodeUnprepareResources": _answer_unrequested_claim},
    ),
    Misbehaviour(
        "dra-device-no-pool",
        DRA,
        "DRA api.proto §Device (pool_name Required)",
        "NodePrepareResources answers devices with an empty pool_name.",
        responses={"NodePrepareResources": _device_without_pool},
    ),
    Misbehaviour(
        "drahealth-value-unknown",
        DRA,
        "DRA health api.proto §HealthStatus (UNKNOWN, HEALTHY or UNHEALTHY)",
        "Every NodeWatchResources update gives its first device the health 3.",
        responses={"NodeWatchResources": _health_out_of_enum},
    ),
    Misbehaviour(
        "drahealth-time-milliseconds",
        DRA,
        "DRA health api.proto §DeviceHealth (last_updated_time in Unix seconds)",
        "NodeWatchResources updates give last_updated_time in milliseconds.",
        responses={"NodeWatchResources": _health_time_milliseconds},
    ),
    Misbehaviour(
        "drahealth-device-missing",
        DRA,
        "DRA health api.proto §DeviceHealth and §DeviceIdentifier (the device it is about)",
        "Every NodeWatchResources update leaves its first entry without a device.",
        responses={"NodeWatchResources": _health_without_device},
    ),
    Misbehaviour(
        "drahealth-device-twice",
        DRA,
        "DRA health api.proto §NodeWatchResourcesResponse (each device's current health)",
        "Every NodeWatchResources update lists its first device twice.",
        responses={"NodeWatchResources": _health_device_twice},
    ),
    Misbehaviour(
        "cosi-protocol-dropped",
        COSI_V1ALPHA2,
        "COSI v1alpha2 §DriverCreateBucket and §DriverGetExistingBucket (support for every"
        " requested protocol indicated by its bucket info)",
        "DriverCreateBucket and DriverGetExistingBucket answer without the bucket info of the"
        " first protocol requested (S3 when none is).",
        responses=dict.fromkeys(
            ("DriverCreateBucket", "DriverGetExistingBucket"), _drop_first_requested
        ),
    ),
    Misbehaviour(
        "cosi-bucket-id-underscore",
        COSI_V1ALPHA2,
        "COSI v1alpha2 §DriverCreateBucket (bucket_id of alphanumerics, '-' and '.')",
        "DriverCreateBucket answers its bucket ids with '_' for '-'.",
        responses={"DriverCreateBucket": _underscore_bucket_id},
    ),
    Misbehaviour(
        "cosi-grant-bucket-left-out",
        COSI_V1ALPHA2,
        "COSI v1alpha2 §DriverGrantBucketAccess (info for every requested bucket)",
        "DriverGrantBucketAccess answers a BucketInfo for the first requested bucket only.",
        responses={"DriverGrantBucketAccess": _first_bucket_only},
    ),
    Misbehaviour(
        "cosi-grant-other-protocol",
        COSI_V1ALPHA2,
        "COSI v1alpha2 §DriverGrantBucketAccess (the bucket info of the requested protocol,"
        " and of no other)",
        "DriverGrantBucketAccess answers each bucket's info for another protocol than the"
        " requested one.",
        responses={"DriverGrantBucketAccess": _other_protocol_info},
    ),
    Misbehaviour(
        "cosi-key-credentials-empty",
        COSI_V1ALPHA2,
        "COSI v1alpha2 §DriverGrantBucketAccess (the requested authentication provisioned)",
        "DriverGrantBucketAccess answers KEY grants with an empty credential for the protocol.",
        responses={"DriverGrantBucketAccess": _empty_key_credentials},
    ),
    Misbehaviour(
        "cosi-delete-not-found",
        COSI_V1ALPHA2,
        "COSI v1alpha2 §DriverDeleteBucket (a bucket that does not exist gets OK)",
        "DriverDeleteBucket of a bucket the fake does not hold answers NOT_FOUND.",
        requests={"DriverDeleteBucket": _gone_is_not_found("buckets", "bucket_id")},
    ),
    Misbehaviour(
        "cosi-revoke-not-found",
        COSI_V1ALPHA2,
        "COSI v1alpha2 §DriverRevokeBucketAccess (an access that does not exist gets OK)",
        "DriverRevokeBucketAccess of an account the fake does not hold answers NOT_FOUND.",
        requests={"DriverRevokeBucketAccess": _gone_is_not_found("accesses", "account_id")},
    ),
]

MISBEHAVIOURS: Mapping[str, Misbehaviour] = MappingProxyType({m.name: m for m in _ENTRIES})


def catalogue(spec: str | None = None) -> list[Misbehaviour]:
    """Entries in definition order, optionally only those applying to ``spec``."""
    return [m for m in _ENTRIES if spec is None or spec in m.specs]


def check_misbehaviours(spec: str, names: Iterable[str]) -> None:
    """ConfigError when a name is unknown or does not apply to ``spec``."""
    for name in sorted(names):
        entry = MISBEHAVIOURS.get(name)
        valid = ", ".join(m.name for m in catalogue(spec))
        if entry is None:
            raise ConfigError(f"unknown misbehaviour {name!r}; for {spec}: {valid}")
        if spec not in entry.specs:
            raise ConfigError(f"misbehaviour {name!r} does not apply to {spec}; use: {valid}")
