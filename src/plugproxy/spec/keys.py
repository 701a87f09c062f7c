"""Which volume, snapshot, bucket, machine, device or resource claim a call is about.

One small table per spec names, per RPC, the request fields that identify the resources it
acts on (CSI v1.12 §Concurrency: one call in flight per volume). The descriptors supply the
rest: paths are checked against them and compiled into extractor functions at startup.
Identity, capability, probe and list calls have no entry, so they have no keys.

A key is "<kind>:<value>", e.g. "volume:pvc-1". Names and ids are different kinds: a
CreateVolume name is not yet a volume id.

``--serialize-key /pkg.Service/Method=FIELD_PATH`` adds a key to any method the registry
knows (:func:`parse_serialize_key`, checked at startup): the kind is the field path itself,
so calls of different methods share a key when the same path holds the same value. The
path goes through message fields, repeated ones included (every element); it ends in a
string or integer field, one key per value when that field is repeated. Map fields are
refused: which of key and value would name the resource is not for the proxy to guess.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from plugproxy.api import Call, MethodInfo

KeySpec = tuple[tuple[str, str], ...]  # ((kind, dotted field path), ...)

_VOLUME: KeySpec = (("volume", "volume_id"),)
_CSI_COMMON: dict[str, KeySpec] = {
    "CreateVolume": (
        ("volume-name", "name"),
        ("snapshot", "volume_content_source.snapshot.snapshot_id"),
        ("volume", "volume_content_source.volume.volume_id"),
    ),
    "DeleteVolume": _VOLUME,
    "ControllerPublishVolume": _VOLUME,
    "ControllerUnpublishVolume": _VOLUME,
    "ValidateVolumeCapabilities": _VOLUME,
    "CreateSnapshot": (("snapshot-name", "name"), ("volume", "source_volume_id")),
    "DeleteSnapshot": (("snapshot", "snapshot_id"),),
    "NodeStageVolume": _VOLUME,
    "NodeUnstageVolume": _VOLUME,
    "NodePublishVolume": _VOLUME,
    "NodeUnpublishVolume": _VOLUME,
}

_DRA: dict[str, KeySpec] = {
    "NodePrepareResources": (("claim", "claims.uid"),),
    "NodeUnprepareResources": (("claim", "claims.uid"),),
}

KEY_TABLES: dict[str, dict[str, KeySpec]] = {
    "csi.v1": {
        **_CSI_COMMON,
        "ControllerExpandVolume": _VOLUME,
        "ControllerGetVolume": _VOLUME,
        "ControllerModifyVolume": _VOLUME,
        "GetSnapshot": (("snapshot", "snapshot_id"),),
        "NodeGetVolumeStats": _VOLUME,
        "NodeExpandVolume": _VOLUME,
        "CreateVolumeGroupSnapshot": (
            ("group-snapshot-name", "name"),
            ("volume", "source_volume_ids"),
        ),
        "DeleteVolumeGroupSnapshot": (
            ("group-snapshot", "group_snapshot_id"),
            ("snapshot", "snapshot_ids"),
        ),
        "GetVolumeGroupSnapshot": (
            ("group-snapshot", "group_snapshot_id"),
            ("snapshot", "snapshot_ids"),
        ),
        "GetMetadataAllocated": (("snapshot", "snapshot_id"),),
        "GetMetadataDelta": (("snapshot", "base_snapshot_id"), ("snapshot", "target_snapshot_id")),
    },
    "csi.v0": {
        **_CSI_COMMON,
        "CreateVolume": (
            ("volume-name", "name"),
            ("snapshot", "volume_content_source.snapshot.id"),
        ),
    },
    "cosi.v1alpha1": {
        "DriverCreateBucket": (("bucket-name", "name"),),
        "DriverDeleteBucket": (("bucket", "bucket_id"),),
        "DriverGrantBucketAccess": (("bucket", "bucket_id"),),
        "DriverRevokeBucketAccess": (("bucket", "bucket_id"),),
    },
    # COSI v1alpha2: a grant or revoke names one account and every bucket it reaches; an
    # existing bucket is named by the id the admin gave. The first kind is the call's object.
    "cosi.v1alpha2": {
        "DriverCreateBucket": (("bucket-name", "name"),),
        "DriverGetExistingBucket": (("bucket", "existing_bucket_id"),),
        "DriverDeleteBucket": (("bucket", "bucket_id"),),
        "DriverGrantBucketAccess": (
            ("account-name", "account_name"),
            ("bucket", "buckets.bucket_id"),
        ),
        "DriverRevokeBucketAccess": (("account", "account_id"), ("bucket", "buckets.bucket_id")),
    },
    "cmi.v1": {
        name: (("machine", "MachineName"),)
        for name in ("CreateMachine", "DeleteMachine", "GetMachineStatus", "ShutDownMachine")
    },
    # KMS v2: none. Each Encrypt and Decrypt stands alone (the uid names the request, not a
    # resource), and kube-apiserver waits on them while it serves reads and writes.
    # Device plugins: the devices whose device-specific operations Allocate and
    # PreStartContainer run. ListAndWatch has none: a stream as long-lived as the plugin
    # must never hold a lock.
    "deviceplugin.v1beta1": {
        "Allocate": (("device", "container_requests.devices_ids"),),
        "PreStartContainer": (("device", "devices_ids"),),
    },
    # DRA: the ResourceClaims a call prepares or unprepares, by uid, the same kind in both
    # versions. DRA health's NodeWatchResources has none: an empty request, and a stream as
    # long-lived as the plugin.
    "dra.v1beta1": _DRA,
    "dra.v1": _DRA,
}

Extractor = Callable[[Message], tuple[str, ...]]


_INTEGER_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED32,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _resolve(desc: Descriptor, path: str, integers: bool = False) -> list[FieldDescriptor]:
    """The fields along ``path``; ValueError naming the first part that does not fit."""
    root = desc.full_name
    fields = []
    for part in path.split("."):
        fd = desc.fields_by_name.get(part)
        if fd is None:
            raise ValueError(f"{desc.full_name} has no field {part!r} (key path {path!r})")
        mt = fd.message_type
        if mt is not None and mt.GetOptions().map_entry:
            raise ValueError(f"{desc.full_name}.{part} is a map; a key path cannot go through one")
        fields.append(fd)
        if mt is not None:
            desc = mt
    last = fields[-1]
    if not (last.type == FieldDescriptor.TYPE_STRING or (integers and last.type in _INTEGER_TYPES)):
        wanted = "a string or integer field" if integers else "a string"
        raise ValueError(f"key path {path!r} of {root} does not end in {wanted}")
    return fields


def parse_serialize_key(item: str) -> tuple[str, str]:
    """'/pkg.Service/Method=field.path' -> (method path, field path); ValueError if malformed."""
    method, sep, path = item.partition("=")
    method, path = method.strip(), path.strip()
    if not sep or not method.startswith("/") or method.count("/") != 2 or not all(path.split(".")):
        raise ValueError("expected /package.Service/Method=FIELD_PATH")
    return method, path


def check_key_path(method: MethodInfo, path: str) -> None:
    """ValueError when ``path`` cannot key calls of ``method`` (see the module docstring)."""
    if method.request_class is None:
        raise ValueError(f"{method.path} is not a method of a loaded spec or descriptor set")
    _resolve(cast(Descriptor, method.request_class.DESCRIPTOR), path, integers=True)


def _values(message: Message, fields: list[FieldDescriptor]) -> list[str]:
    current: list[Message] = [message]
    for fd in fields[:-1]:
        nxt: list[Message] = []
        for m in current:
            if fd.is_repeated:
                nxt.extend(getattr(m, fd.name))
            elif m.HasField(fd.name):
                nxt.append(getattr(m, fd.name))
        current = nxt
    last = fields[-1]
    out: list[str] = []
    for m in current:
        value = getattr(m, last.name)
        if last.is_repeated:
            out.extend(str(v) for v in value if v)
        elif value:
            out.append(str(value))
    return out


@functools.cache
def extractor(method: MethodInfo) -> Extractor | None:
    """Compiled key extractor for ``method``, or None when its calls have no keys."""
    if method.spec is None or method.request_class is None:
        return None
    spec = KEY_TABLES.get(method.spec.name, {}).get(method.name, ())
    if not spec and not method.extra_keys:
        return None
    desc = cast(Descriptor, method.request_class.DESCRIPTOR)  # upb's class is the same thing
    compiled = [(kind, _resolve(desc, path)) for kind, path in spec]
    compiled += [(kind, _resolve(desc, path, integers=True)) for kind, path in method.extra_keys]

    def extract(message: Message) -> tuple[str, ...]:
        keys: list[str] = []
        for kind, fields in compiled:
            keys.extend(f"{kind}:{value}" for value in _values(message, fields))
        return tuple(dict.fromkeys(keys))  # a key named twice is held once

    return extract


def keys_of(call: Call) -> tuple[str, ...]:
    """The call's resource keys, computed once per call and shared by every stage."""
    cached: tuple[str, ...] | None = call.stage_state.get("keys")
    if cached is not None:
        return cached
    keys: tuple[str, ...] = ()
    fn = extractor(call.method)
    if fn is not None and call.request is not None:
        message = call.request.message
        if message is not None:
            keys = fn(message)
    call.stage_state["keys"] = keys
    return keys
