"""CSI snapshot metadata streams (GetMetadataAllocated, GetMetadataDelta; CSI v1.12 only):
a stream restarted from an offset beyond anything it could continue.

What a stream reported is learned as it passes: the volume capacity of its snapshot, and,
for a stream that ended OK with its ranges in order, the end of its last range. Kept in
:class:`MetadataMemory` (bounded, expiring maps, like the lifecycle state); one stream's
ranges so far live in its call's stage_state. A stream csi_responses found out of order
inside a message (csi.metadata-order, judged as the messages passed) is not remembered as
complete. Like the rest of the family, reported and never enforced.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import ExpiringMap, ago
from plugproxy.rules import csi_responses
from plugproxy.rules.engine import CO, SHOULD, Hooks, Rule, Violation, list_length

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState

_STREAM = "csi_metadata.stream"  # call.stage_state key: one metadata stream's ranges
STREAMS = ("GetMetadataAllocated", "GetMetadataDelta")


@dataclass(slots=True)
class _Stream:
    """A snapshot metadata stream that ended OK: all ranges from its start were sent."""

    end: int  # end of its last range (its starting_offset when it had none)
    at: float


@dataclass(slots=True)
class _Ranges:
    """One stream in flight (call.stage_state)."""

    end: int
    ordered: bool = True
    capacity_seen: bool = False


class MetadataMemory:
    """What this family remembers per spec table."""

    def __init__(self, st: SpecState) -> None:
        n, ttl, clock = st.max_volumes, st.lifecycle_ttl, st.clock
        self.clock = clock
        # snapshot id -> (volume_capacity_bytes a metadata stream reported, when)
        self.capacities: ExpiringMap[str, tuple[int, float]] = ExpiringMap(n, ttl, clock)
        self.streams: ExpiringMap[tuple[str, ...], _Stream] = ExpiringMap(n, ttl, clock)


def _mem(st: SpecState) -> MetadataMemory:
    return st.part(MetadataMemory)


def _stream_key(call: Call, req: Any) -> tuple[tuple[str, ...], str]:
    """(the stream's memory key, the snapshot whose volume capacity it reports)."""
    if call.method.name == "GetMetadataDelta":
        return ("delta", req.base_snapshot_id, req.target_snapshot_id), req.target_snapshot_id
    return ("allocated", req.snapshot_id), req.snapshot_id


def metadata_request(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    start = req.starting_offset
    call.stage_state[_STREAM] = _Ranges(max(start, 0))
    if start <= 0:
        return
    mem = _mem(st)
    key, snapshot = _stream_key(call, req)
    now = mem.clock()
    capacity = mem.capacities.get(snapshot)
    if capacity is not None and start > capacity[0]:
        yield Violation(
            cs.rule("metadata-restart-offset"),
            "starting_offset",
            f"starting_offset {start} is past the volume_capacity_bytes {capacity[0]} a"
            f" metadata stream reported for this snapshot {ago(now - capacity[1])}; it"
            " SHOULD be 0 or the byte after the last range received",
        )
        return
    done = mem.streams.get(key)
    if done is not None and start > done.end:
        yield Violation(
            cs.rule("metadata-restart-offset"),
            "starting_offset",
            f"starting_offset {start} is past the end {done.end} of the complete"
            f" {call.method.name} stream this socket relayed for the same snapshot(s)"
            f" {ago(now - done.at)}: no range received ends there; it SHOULD be 0 or the"
            " byte after the last range received",
        )


def metadata_response(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    ranges = call.stage_state.get(_STREAM)
    if not isinstance(ranges, _Ranges):
        return ()
    if not ranges.capacity_seen and resp.volume_capacity_bytes > 0:
        ranges.capacity_seen = True
        mem = _mem(st)
        mem.capacities[_stream_key(call, req)[1]] = (
            resp.volume_capacity_bytes,
            mem.clock(),
        )
    blocks = resp.block_metadata
    if len(blocks) < list_length(call, resp, "block_metadata"):
        ranges.ordered = False  # a sample: the true last range may be unseen
    if blocks:
        # The stream's end is its last range's: O(1) a message, whatever its size.
        # Disorder across messages makes the end untrustworthy here; inside a message
        # csi.metadata-order finds it (metadata_done reads its verdict).
        last = blocks[-1]
        end = last.byte_offset + last.size_bytes
        if end < ranges.end or blocks[0].byte_offset < ranges.end:
            ranges.ordered = False
        ranges.end = max(ranges.end, end)
    return ()


def metadata_done(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    ranges = call.stage_state.get(_STREAM)
    # csi.metadata-order (csi_responses) judged the order inside the messages.
    judged = call.stage_state.get(csi_responses.STREAM_KEY)
    if judged is not None and "metadata-order" in judged.reported:
        return
    if isinstance(ranges, _Ranges) and ranges.ordered:
        mem = _mem(st)
        mem.streams[_stream_key(call, req)[0]] = _Stream(ranges.end, mem.clock())


def hooks(title: str) -> Hooks:
    """The family's rule and checks for CSI v1, cited as ``title``."""
    rule = Rule(
        "csi.metadata-restart-offset",
        SHOULD,
        (CO,),
        f"{title} §{{rpc}}",
        "A GetMetadata* starting_offset beyond anything it can continue: past the"
        " volume_capacity_bytes a stream reported for the snapshot, or past the end of"
        " a complete stream (from a lower offset) for the same snapshot(s).",
        reject_code=None,
        note="The CO SHOULD pass 0 or the byte after the last range received. A"
        " complete stream (status OK) holds every range from its starting_offset, and"
        " snapshots do not change, so no range received through any replica ends past"
        " it; offsets within what was sent are never judged, as ranges in flight may"
        " be lost.",
    )
    return Hooks(
        rules=(rule,),
        request_checks={rpc: (metadata_request,) for rpc in STREAMS},
        response_checks={rpc: (metadata_response,) for rpc in STREAMS},
        on_success={rpc: (metadata_done,) for rpc in STREAMS},
    )
