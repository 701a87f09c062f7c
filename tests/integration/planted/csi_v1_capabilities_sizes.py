"""CSI v1.12 and v0.3: capability answers judged on a fresh proxy, confirmed access modes
against the controller's capabilities, REQUIRED fields with a caveat, and ids over their
size limit where the CO passes them back (§Size Limits)."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import RWO, rpc_caps, v1_background
from tests.integration.planted.harness import Case, Step

V1 = "csi.v1"
RWOP = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_SINGLE_WRITER"}}
GROUP = v1_background(group=("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT",))

NODE = v1_background(
    controller=("CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME"), node=("STAGE_UNSTAGE_VOLUME",)
)
STAGE = Step(
    "NodeStageVolume",
    {"volume_id": "vol-1", "staging_target_path": "/var/lib/stage/vol-1", "volume_capability": RWO},
)


def served_later(statement: str, rpc: str, answer: dict[str, Any]) -> Case:
    """kubelet asks NodeGetInfo (and NodeGetCapabilities) before anything shows the Node
    service served: the refusal is judged when a Node RPC answers OK later."""
    return Case(
        V1,
        (statement,),
        "csi.unimplemented-advertised",
        breach=(Step(rpc, error=("UNIMPLEMENTED", "not served")), STAGE),
        twin=(Step(rpc, answer=answer), STAGE),
        background=NODE,
        party="plugin",
        variant="served-later",
    )


CASES = [
    served_later("NodeGetInfo.1", "NodeGetInfo", {"node_id": "node-1"}),
    served_later("NodeGetCapabilities.1", "NodeGetCapabilities", rpc_caps("STAGE_UNSTAGE_VOLUME")),
    Case(
        V1,
        ("Volume-Lifecycle.1",),
        "csi.unimplemented-recommended",
        # An optional RPC the plugin does not advertise: UNIMPLEMENTED is allowed, and
        # leaves part of the Controller service out (advisory).
        breach=(
            Step("ControllerGetCapabilities", answer=rpc_caps("CREATE_DELETE_VOLUME")),
            Step("ListVolumes", error=("UNIMPLEMENTED", "listing is not supported")),
        ),
        twin=(
            Step(
                "ControllerGetCapabilities", answer=rpc_caps("CREATE_DELETE_VOLUME", "LIST_VOLUMES")
            ),
            Step("ListVolumes", answer={"entries": []}),
        ),
        background=v1_background(controller=("CREATE_DELETE_VOLUME", "LIST_VOLUMES")),
        party="plugin",
    ),
    Case(
        V1,
        ("GetPluginCapabilities.5",),
        "csi.unimplemented-advertised",
        # The first call of a fresh proxy: it learns CONTROLLER_SERVICE by asking itself.
        breach=(Step("ControllerGetCapabilities", error=("UNIMPLEMENTED", "not served")),),
        twin=(Step("ControllerGetCapabilities", answer=rpc_caps("CREATE_DELETE_VOLUME")),),
        background=v1_background(),
        party="plugin",
        variant="fresh-proxy",
    ),
    Case(
        V1,
        ("ValidateVolumeCapabilities.2", "ValidateVolumeCapabilities.7"),
        "csi.validate-confirmed-unsupported",
        breach=(
            Step(
                "ValidateVolumeCapabilities",
                {"volume_id": "vol-1", "volume_capabilities": [RWOP]},
                answer={"confirmed": {"volume_capabilities": [RWOP]}},
            ),
        ),
        twin=(
            Step(
                "ValidateVolumeCapabilities",
                {"volume_id": "vol-1", "volume_capabilities": [RWOP]},
                answer={"message": "SINGLE_NODE_SINGLE_WRITER is not supported"},
            ),
        ),
        background=v1_background(),
        party="plugin",
    ),
    Case(
        V1,
        ("DeleteVolumeGroupSnapshot.7",),
        "csi.required-field-caveat",
        breach=(Step("DeleteVolumeGroupSnapshot", {"group_snapshot_id": "group-1"}),),
        twin=(
            Step(
                "DeleteVolumeGroupSnapshot",
                {"group_snapshot_id": "group-1", "snapshot_ids": ["snap-1", "snap-2"]},
            ),
        ),
        background=GROUP,
        party="co",
    ),
    Case(
        V1,
        ("GetVolumeGroupSnapshot.5",),
        "csi.required-field-caveat",
        breach=(
            Step(
                "GetVolumeGroupSnapshot",
                {"group_snapshot_id": "group-1"},
                error=("NOT_FOUND", "no group group-1"),
            ),
        ),
        twin=(
            Step(
                "GetVolumeGroupSnapshot",
                {"group_snapshot_id": "group-1", "snapshot_ids": ["snap-1"]},
                error=("NOT_FOUND", "no group group-1"),
            ),
        ),
        background=GROUP,
        party="co",
    ),
    Case(
        V1,
        ("Size-Limits.1",),
        "csi.size-limit-echoed",
        # Made where the proxy did not see it (another replica, before a restart).
        breach=(Step("DeleteVolume", {"volume_id": "v" * 129}),),
        twin=(Step("DeleteVolume", {"volume_id": "v" * 128}),),
        background=v1_background(),
        party="plugin",
    ),
    Case(
        "csi.v0",
        ("Size-Limits.1",),
        "csi.size-limit-echoed",
        breach=(Step("DeleteVolume", {"volume_id": "v" * 129}),),
        twin=(Step("DeleteVolume", {"volume_id": "v" * 128}),),
        background={
            "GetPluginCapabilities": {
                "capabilities": [{"service": {"type": "CONTROLLER_SERVICE"}}]
            },
            "ControllerGetCapabilities": rpc_caps("CREATE_DELETE_VOLUME"),
        },
        party="plugin",
    ),
]
