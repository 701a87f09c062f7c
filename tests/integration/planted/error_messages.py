"""§Error Scheme of CSI v1.12, CSI v0.3, COSI and CMI: a non-OK status carries a readable
message. A control character in it is no text; a tab or a line break is."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import RWO, rpc_caps, v1_background
from tests.integration.planted.harness import Case, Step

UNREADABLE = "volume vol-1 \x00\x1b[31mnot found"
READABLE = "volume vol-1 not found:\n\tno such volume on the backend"
CSI_V0_BACKGROUND = {
    "GetPluginCapabilities": {"capabilities": [{"service": {"type": "CONTROLLER_SERVICE"}}]},
    "ControllerGetCapabilities": rpc_caps("CREATE_DELETE_VOLUME"),
}


def case(
    spec: str,
    statements: tuple[str, ...],
    rule: str,
    rpc: str,
    request: dict[str, Any],
    code: str,
    background: dict[str, Any],
) -> Case:
    return Case(
        spec,
        statements,
        rule,
        breach=(Step(rpc, request, error=(code, UNREADABLE)),),
        twin=(Step(rpc, request, error=(code, READABLE)),),
        background=background,
        party="plugin",
    )


SOURCE = {
    "name": "pvc-1",
    "volume_capabilities": [RWO],
    "volume_content_source": {"snapshot": {"snapshot_id": "snap-1"}},
}

CASES = [
    case(
        "csi.v1",
        ("Error-Scheme.13",),
        "csi.error-message-unreadable",
        "ControllerGetVolume",
        {"volume_id": "vol-1"},
        "NOT_FOUND",
        v1_background(controller=("GET_VOLUME",)),
    ),
    case(
        "csi.v1",
        ("CreateVolume-Errors.6",),
        "csi.error-message-unreadable",
        "CreateVolume",
        SOURCE,
        "INVALID_ARGUMENT",
        v1_background(controller=("CREATE_DELETE_VOLUME", "CREATE_DELETE_SNAPSHOT")),
    ),
    case(
        "csi.v0",
        ("Error-Scheme.7",),
        "csi.error-message-unreadable",
        "DeleteVolume",
        {"volume_id": "vol-1"},
        "INTERNAL",
        CSI_V0_BACKGROUND,
    ),
    case(
        "cosi.v1alpha1",
        ("Error-Scheme.13",),
        "cosi.error-message-unreadable",
        "DriverDeleteBucket",
        {"bucket_id": "bucket-1"},
        "INTERNAL",
        {},
    ),
    case(
        "cmi.v1",
        ("Error-Scheme.13",),
        "cmi.error-message-unreadable",
        "GetPluginInfo",
        {},
        "INTERNAL",
        {},
    ),
]


def wrong_code(
    spec: str,
    statements: tuple[str, ...],
    rpc: str,
    bad: dict[str, Any],
    good: dict[str, Any],
    background: dict[str, Any],
) -> Case:
    """A request missing a REQUIRED field refused with another code than INVALID_ARGUMENT
    (§Error Scheme's general table); the twin is a whole request refused the same way."""
    family = spec.split(".", maxsplit=1)[0]
    return Case(
        spec,
        statements,
        f"{family}.bad-request-wrong-code",
        breach=(Step(rpc, bad, error=("NOT_FOUND", "no such object")),),
        twin=(Step(rpc, good, error=("NOT_FOUND", "no such object")),),
        background=background,
        party="plugin",
    )


GRANT = {
    "bucket_id": "bucket-1",
    "name": "access-1",
    "authentication_type": "Key",
}
GRANT_BAD = {k: v for k, v in GRANT.items() if k != "bucket_id"}

CASES += [
    wrong_code(
        "csi.v1",
        ("Error-Scheme.5",),
        "ControllerGetVolume",
        {"volume_id": ""},
        {"volume_id": "vol-1"},
        v1_background(controller=("GET_VOLUME",)),
    ),
    wrong_code(
        "csi.v0",
        ("Error-Scheme.4",),
        "ValidateVolumeCapabilities",
        {"volume_capabilities": [RWO]},
        {"volume_id": "vol-1", "volume_capabilities": [RWO]},
        CSI_V0_BACKGROUND,
    ),
    wrong_code(
        "cosi.v1alpha1", ("Error-Scheme.5",), "DriverGrantBucketAccess", GRANT_BAD, GRANT, {}
    ),
    wrong_code(
        "cmi.v1",
        ("Error-Scheme.5", "Error-Scheme.4", "GetMachineStatus-Errors.2"),
        "GetMachineStatus",
        {"ProviderSpec": b"spec"},
        {"MachineName": "m-1", "ProviderSpec": b"spec"},
        {},
    ),
]
