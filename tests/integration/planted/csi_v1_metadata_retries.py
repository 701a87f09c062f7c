"""CSI v1.12 §GetMetadataAllocated and §GetMetadataDelta errors (lower-case keywords): the
rows for INVALID_ARGUMENT and OUT_OF_RANGE advise correcting the argument, or sending a
valid starting_offset, before the next call. The breach re-sends the refused request
unchanged; the twin corrects it first."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import v1_background
from tests.integration.planted.harness import Case, Step

SPEC = "csi.v1"
GIB = 1 << 30
METADATA = v1_background(plugin=("CONTROLLER_SERVICE", "SNAPSHOT_METADATA_SERVICE"))
STREAM = [
    {
        "block_metadata_type": "FIXED_LENGTH",
        "volume_capacity_bytes": 2 * GIB,
        "block_metadata": [{"byte_offset": GIB, "size_bytes": 1 << 20}],
    }
]
ALLOCATED = {"snapshot_id": "snap-2"}
DELTA = {"base_snapshot_id": "snap-1", "target_snapshot_id": "snap-2"}


def resent(statement: str, rpc: str, bad: dict[str, Any], code: str, good: dict[str, Any]) -> Case:
    return Case(
        SPEC,
        (statement,),
        "csi.retry-advised-unchanged",
        breach=(
            Step(rpc, bad, answer=[], error=(code, "refused")),
            Step(rpc, bad, answer=[], error=(code, "refused")),
        ),
        twin=(Step(rpc, bad, answer=[], error=(code, "refused")), Step(rpc, good, answer=STREAM)),
        background=METADATA,
        party="co",
        variant="unchanged",
    )


CASES = [
    resent(
        "GetMetadataAllocated-Errors.lc2",
        "GetMetadataAllocated",
        {"snapshot_id": "snap-typo"},
        "INVALID_ARGUMENT",
        ALLOCATED,
    ),
    resent(
        "GetMetadataAllocated-Errors.lc4",
        "GetMetadataAllocated",
        {**ALLOCATED, "starting_offset": 4 * GIB},
        "OUT_OF_RANGE",
        {**ALLOCATED, "starting_offset": GIB // 2},
    ),
    resent(
        "GetMetadataDelta-Errors.lc2",
        "GetMetadataDelta",
        {**DELTA, "base_snapshot_id": "snap-typo"},
        "INVALID_ARGUMENT",
        DELTA,
    ),
    resent(
        "GetMetadataDelta-Errors.lc5",
        "GetMetadataDelta",
        {**DELTA, "starting_offset": 4 * GIB},
        "OUT_OF_RANGE",
        {**DELTA, "starting_offset": GIB // 2},
    ),
]
