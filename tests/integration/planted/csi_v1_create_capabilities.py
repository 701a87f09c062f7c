"""CSI v1.12 §CreateVolume, volume_capabilities and volume_content_source: the volume a
CreateVolume answered OK has every capability listed, usable with any of them (block and
mount alike when both are listed), and a plugin advertising snapshots or clones creates
from them. Also the table's first cases (§GetPluginInfo's name, CreateVolume's
idempotency). Each breach has its legitimate twin."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import RWO, v1_background
from tests.integration.planted.harness import Case, Step

SPEC = "csi.v1"
BLOCK: dict[str, Any] = {"block": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
ROX: dict[str, Any] = {"mount": {}, "access_mode": {"mode": "MULTI_NODE_READER_ONLY"}}


def validated(statements: tuple[str, ...], listed: list[Any], one: Any, variant: str) -> Case:
    create = {"name": "pvc-1", "volume_capabilities": listed}
    made = Step("CreateVolume", create, answer={"volume": {"volume_id": "vol-1"}})
    request = {"volume_id": "vol-1", "volume_capabilities": [one]}
    return Case(
        SPEC,
        statements,
        "csi.validate-contradicts-create",
        breach=(
            made,
            Step("ValidateVolumeCapabilities", request, answer={"message": "not supported"}),
        ),
        twin=(
            made,
            Step(
                "ValidateVolumeCapabilities",
                request,
                answer={"confirmed": {"volume_capabilities": [one]}},
            ),
        ),
        background=v1_background(),
        party="plugin",
        variant=variant,
    )


CASES = [
    validated(("CreateVolume.12", "CreateVolume.15"), [RWO, ROX], ROX, "one-of-two-modes"),
    validated(("CreateVolume.16",), [RWO, BLOCK], BLOCK, "block-beside-mount"),
]


# §CreateVolume, VolumeContentSource: CREATE_DELETE_SNAPSHOT implies restoring from a
# snapshot, CLONE_VOLUME cloning; UNIMPLEMENTED to such a create contradicts the
# advertised capability.
def sourced(statement: str, source: dict[str, Any], cap: str) -> Case:
    request = {"name": "pvc-1", "volume_capabilities": [RWO], "volume_content_source": source}
    return Case(
        SPEC,
        (statement,),
        "csi.unimplemented-advertised",
        breach=(Step("CreateVolume", request, error=("UNIMPLEMENTED", "no such source")),),
        twin=(
            Step(
                "CreateVolume",
                request,
                answer={"volume": {"volume_id": "vol-1", "content_source": source}},
            ),
        ),
        background=v1_background(controller=("CREATE_DELETE_VOLUME", cap)),
        party="plugin",
        variant="sourced",
    )


CASES += [
    sourced("CreateVolume.27", {"snapshot": {"snapshot_id": "snap-1"}}, "CREATE_DELETE_SNAPSHOT"),
    sourced("CreateVolume.29", {"volume": {"volume_id": "vol-0"}}, "CLONE_VOLUME"),
]


# §GetPluginInfo (name REQUIRED) and §CreateVolume (idempotent: a repeat of a create gets
# the same volume): the first two cases of the table.
INFO_OK = {"name": "example.com.plugin", "vendor_version": "1.0.0"}
_CREATE = {"name": "pvc-1", "volume_capabilities": [RWO]}
CASES += [
    Case(
        SPEC,
        ("GetPluginInfo.4",),
        "csi.required-field",
        breach=(Step("GetPluginInfo", answer={"vendor_version": "1.0.0"}),),
        twin=(Step("GetPluginInfo", answer=INFO_OK),),
        party="plugin",
    ),
    Case(
        SPEC,
        ("CreateVolume.2",),
        "csi.create-not-idempotent",
        breach=(
            Step("CreateVolume", _CREATE, answer={"volume": {"volume_id": "v1"}}),
            Step("CreateVolume", _CREATE, answer={"volume": {"volume_id": "v2"}}),
        ),
        twin=(
            Step("CreateVolume", _CREATE, answer={"volume": {"volume_id": "v1"}}),
            Step("CreateVolume", _CREATE, answer={"volume": {"volume_id": "v1"}}),
        ),
        background=v1_background(),
    ),
]
