"""CSI v1.12 §GetPluginInfo and §CreateVolume: first cases of the table."""

from __future__ import annotations

from tests.integration.planted.csi_builders import RWO, v1_background
from tests.integration.planted.harness import Case, Step

SPEC = "csi.v1"
INFO_OK = {"name": "example.com.plugin", "vendor_version": "1.0.0"}

CASES = [
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
            Step(
                "CreateVolume",
                {"name": "pvc-1", "volume_capabilities": [RWO]},
                answer={"volume": {"volume_id": "v1"}},
            ),
            Step(
                "CreateVolume",
                {"name": "pvc-1", "volume_capabilities": [RWO]},
                answer={"volume": {"volume_id": "v2"}},
            ),
        ),
        twin=(
            Step(
                "CreateVolume",
                {"name": "pvc-1", "volume_capabilities": [RWO]},
                answer={"volume": {"volume_id": "v1"}},
            ),
            Step(
                "CreateVolume",
                {"name": "pvc-1", "volume_capabilities": [RWO]},
                answer={"volume": {"volume_id": "v1"}},
            ),
        ),
        background=v1_background(),
    ),
]
