"""CSI v1.12 and v0.3: capability answers judged on a fresh proxy, confirmed access modes
against the controller's capabilities, REQUIRED fields with a caveat, and ids over their
size limit where the CO passes them back (§Size Limits)."""

from __future__ import annotations

from tests.integration.planted.csi_builders import rpc_caps, v1_background
from tests.integration.planted.harness import Case, Step

V1 = "csi.v1"
RWOP = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_SINGLE_WRITER"}}
GROUP = v1_background(group=("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT",))

CASES = [
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
