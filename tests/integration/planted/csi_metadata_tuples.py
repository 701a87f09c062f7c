"""CSI v1.12 §Metadata Format, §GetMetadataAllocated, §GetMetadataDelta: every tuple of a
long stream is judged, the breach planted far into it (beyond any sample)."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import v1_background
from tests.integration.planted.harness import Case, Step

BLOCK = 1 << 20
PER, MESSAGES = 1000, 4
FAR = (MESSAGES - 1) * PER + 737  # in the last message, far from its head and its ends


def stream(rpc: str, broken: str = "") -> Step:
    """MESSAGES messages of PER FIXED_LENGTH tuples, one of every two blocks."""
    tuples = [[i * 2 * BLOCK, BLOCK] for i in range(MESSAGES * PER)]
    if broken == "order":
        tuples[FAR][0] = tuples[FAR - 1][0] + BLOCK // 2  # overlaps the tuple before it
    elif broken == "size":
        tuples[FAR][1] = 0
    elif broken == "fixed":
        tuples[FAR][1] = BLOCK // 2
    answer: list[dict[str, Any]] = [
        {
            "block_metadata_type": "FIXED_LENGTH",
            "volume_capacity_bytes": 1 << 40,
            "block_metadata": [
                {"byte_offset": o, "size_bytes": s} for o, s in tuples[m * PER : (m + 1) * PER]
            ],
        }
        for m in range(MESSAGES)
    ]
    request = (
        {"snapshot_id": "snap-2"}
        if rpc == "GetMetadataAllocated"
        else {"base_snapshot_id": "snap-1", "target_snapshot_id": "snap-2"}
    )
    return Step(rpc, request, answer=answer)


def case(rpc: str, statements: tuple[str, ...], rule: str, broken: str) -> Case:
    return Case(
        "csi.v1",
        statements,
        rule,
        breach=(stream(rpc, broken),),
        twin=(stream(rpc),),
        background=v1_background(plugin=("CONTROLLER_SERVICE", "SNAPSHOT_METADATA_SERVICE")),
        party="plugin",
        variant="far-tuple",
    )


CASES = [
    case(
        "GetMetadataAllocated",
        ("Metadata-Format.2", "Metadata-Format.3"),
        "csi.metadata-size-zero",
        "size",
    ),
    case("GetMetadataAllocated", ("GetMetadataAllocated.5",), "csi.metadata-fixed-length", "fixed"),
    case(
        "GetMetadataAllocated",
        ("GetMetadataAllocated.10", "GetMetadataAllocated.11"),
        "csi.metadata-order",
        "order",
    ),
    case("GetMetadataDelta", ("GetMetadataDelta.6",), "csi.metadata-fixed-length", "fixed"),
    case(
        "GetMetadataDelta",
        ("GetMetadataDelta.11", "GetMetadataDelta.12"),
        "csi.metadata-order",
        "order",
    ),
]
