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
