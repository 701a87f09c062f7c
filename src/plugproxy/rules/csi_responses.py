"""CSI response content and streams: what one answer (or one stream) must hold by itself.

Judged on the answer alone, with no memory between calls: a listing against its filters,
a group snapshot against its members, expansion capacities against the requested range,
delete answers against their idempotency, and the snapshot metadata streams, whose only
memory is per stream (``call.stage_state``, dropped with the call).

Large answers are judged on a sample (:mod:`plugproxy.core.sampling`): per-entry checks look at
what was kept. A metadata message is the exception: every tuple of it is judged, the whole
message decoded when the proxy had kept a sample, as a breach between two tuples anywhere
on the stream is one the wire shows.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plugproxy.rules.engine import (
    JUDGED_RESPONSE,
    JUDGED_WHOLE,
    MUST,
    PLUGIN,
    SHOULD,
    CompiledSpec,
    ErrorCheck,
    Hooks,
    ResponseCheck,
    Rule,
    Violation,
)

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.state import SpecState

# call.stage_state key of a metadata stream's memory (_Stream).
STREAM_KEY = "csi_responses.metadata"
# Every tuple of every metadata message is judged: a message the proxy decoded from a
# sample (plugproxy.core.sampling, for long lists) is decoded whole here, and the checks run
# over plain lists with C-level comparisons, the tuple-by-tuple walk only once one fails
# (about 0.6 µs a tuple, mostly reading its two numbers out of the decoded message).


def _rules(title: str, v1: bool) -> list[Rule]:
    rules = [
        Rule(
            "csi.list-filter-mismatch",
            MUST,
            (PLUGIN,),
            f"{title} §ListSnapshots",
            "ListSnapshots lists a snapshot outside the request's snapshot_id or"
            " source_volume_id filter.",
            reject_code=None,
            note='The plugin SHALL return the snapshots "within the given parameters"; the'
            " filters are ids the plugin made, compared exactly. An entry without an id is"
            " left to csi.required-field.",
        ),
        Rule(
            "csi.delete-not-idempotent",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "A delete RPC answered NOT_FOUND: deleting an object that does not exist MUST"
            " reply 0 OK.",
            reject_code=None,
            note="NOT_FOUND is the code the error tables give an object that does not exist;"
            " DeleteVolume, DeleteSnapshot"
            + (" and DeleteVolumeGroupSnapshot" if v1 else "")
            + ' MUST answer 0 OK for it instead ("This operation MUST be idempotent"). This'
            " MUST takes the case over from the SHOULD csi.error-code-unexpected.",
        ),
        Rule(
            "csi.topology-outside-requisite",
            MUST,
            (PLUGIN,),
            f"{title} §CreateVolume",
            "CreateVolume returns an accessible_topology of which no entry lies within any"
            " requisite topology of the request.",
            reject_code=None,
            note="With requisite set the volume MUST be accessible from at least one requisite"
            " topology. An entry lies within a requisite topology when they agree on every"
            " key both hold (keys case-insensitive): a coarser entry (zone without rack) is"
            " legitimate. Only an answer every entry of which contradicts every requisite"
            " topology is a sure breach; how many requisite topologies the volume reaches is"
            " csi.topology-count's.",
        ),
        Rule(
            "csi.topology-count",
            MUST,
            (PLUGIN,),
            f"{title} §CreateVolume",
            "CreateVolume's accessible_topology breaks the count rules of its requisite"
            " topologies: with x entries and n requisite, x <= n needs every entry within a"
            " requisite topology (x unique ones), x >= n needs every requisite topology"
            " reached.",
            reject_code=None,
            note="Within, as for csi.topology-outside-requisite: agreeing on every key both"
            " hold, so a coarser entry (a region for zones of it) reaches each of its zones."
            " An empty accessible_topology is not judged: it means accessible from"
            " everywhere, which reaches every requisite topology.",
        ),
    ]
    if not v1:
        return rules
    return [
        *rules,
        Rule(
            "csi.group-snapshot-id-mismatch",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "A member snapshot of a VolumeGroupSnapshot carries a group_snapshot_id other"
            " than the group's.",
            reject_code=None,
            note="Snapshot.group_snapshot_id (§CreateSnapshot): inside a VolumeGroupSnapshot"
            ' "the value MUST be the same as the group_snapshot_id in that message". An'
            " empty member id is not judged: the field is OPTIONAL, and a member that may be"
            " deleted on its own leaves it unset.",
        ),
        Rule(
            "csi.group-ready-mismatch",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "VolumeGroupSnapshot.ready_to_use is true while a member snapshot is not ready.",
            reject_code=None,
        ),
        Rule(
            "csi.group-not-ready",
            SHOULD,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "VolumeGroupSnapshot.ready_to_use is false while every member snapshot is ready"
            " (advisory).",
            reject_code=None,
        ),
        Rule(
            "csi.metadata-order",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "Snapshot metadata tuples whose byte_offset does not strictly increase or that"
            " overlap, within a message or across the messages of one stream.",
            reject_code=None,
            note="For tuples A before B, A.byte_offset + A.size_bytes <= B.byte_offset. Of a"
            " message over 1,024 tuples (or one judged on a sample) a head and a spread of"
            " tuples are read, each with the one before it, and only neighbours on the wire"
            " are compared; a message's first and last tuples are always read, so the order"
            " across messages is judged exactly. Reported once per stream.",
        ),
        Rule(
            "csi.metadata-size-zero",
            MUST,
            (PLUGIN,),
            f"{title} §Metadata Format",
            "A snapshot metadata tuple with size_bytes zero or negative (MUST be greater than"
            " zero).",
            reject_code=None,
            note="Reported once per stream.",
        ),
        Rule(
            "csi.metadata-stream-changed",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "block_metadata_type or volume_capacity_bytes changes between the messages of one"
            " stream.",
            reject_code=None,
            note='The field comments say the values "must be the same in all such messages"'
            ' (lower case); §Metadata Format permits either style "as long as the style does'
            ' not change mid-stream". Judged as a MUST: a CO cannot read a stream whose style'
            " or volume size changed. Reported once per stream.",
        ),
        Rule(
            "csi.metadata-fixed-length",
            MUST,
            (PLUGIN,),
            f"{title} §Metadata Format",
            "FIXED_LENGTH snapshot metadata with tuples of different size_bytes, within a"
            " message or across one stream.",
            reject_code=None,
            note='"If block_metadata_type is FIXED_LENGTH, then the size_bytes field of each'
            ' message in the block_metadata list MUST be constant"; §Metadata Format: "a'
            ' fixed value ... in all tuples in a given sequence". Reported once per stream.',
        ),
    ]


# -- listings ---------------------------------------------------------------------------------


def _sampled(call: Call) -> bool:
    judged = call.stage_state.get(JUDGED_RESPONSE)
    return judged is not None and judged.sample is not None


def _counted(count: int, partial: bool, noun: str) -> str:
    """ "``count`` such ``noun``", saying so when only part of the list was judged."""
    return f"{count} such {noun}{' in the sample' if partial else ''}"


def _real_indices(call: Call, field_name: str) -> Sequence[int] | None:
    """Wire index of each entry of the sampled top-level list ``field_name``; None: whole."""
    judged = call.stage_state.get(JUDGED_RESPONSE)
    sample = judged.sample if judged is not None else None
    if sample is None:
        return None
    indices: Sequence[int] | None = sample.indices.get(field_name)
    return indices


def _list_filter_check(snapshot_id_field: str) -> ResponseCheck:
    def check(
        cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        for name, wanted, got in (
            ("snapshot_id", req.snapshot_id, snapshot_id_field),
            ("source_volume_id", req.source_volume_id, "source_volume_id"),
        ):
            if not wanted:
                continue
            outside = [
                i
                for i, entry in enumerate(resp.entries)
                if entry.HasField("snapshot")
                and getattr(entry.snapshot, got)
                and getattr(entry.snapshot, got) != wanted
            ]
            if not outside:
                continue
            where = f"entries[{outside[0]}].snapshot.{got}"
            more = ""
            if len(outside) > 1:
                more = f" ({_counted(len(outside), _sampled(call), 'entries')})"
            yield Violation(
                cs.rule("list-filter-mismatch"),
                where,
                f"{where} differs from the request's {name} filter{more}",
            )

    return check


# -- expansion --------------------------------------------------------------------------------


def _expand_response(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    """capacity_bytes against the lower bound of the requested range.

    Only "Volume MUST be at least this big" (CapacityRange) is judged: a volume already larger
    than the target SHOULD be answered 0 OK (§ControllerExpandVolume, §NodeExpandVolume), with
    its real capacity, which may exceed limit_bytes. 0 means unknown (NodeExpandVolume's is
    OPTIONAL) and is not judged.
    """
    cap = resp.capacity_bytes
    if cap <= 0 or not req.HasField("capacity_range"):
        return
    required = req.capacity_range.required_bytes
    if required > 0 and cap < required:
        yield Violation(
            cs.rule("capacity-out-of-range"),
            "capacity_bytes",
            f"capacity_bytes {cap} is below capacity_range.required_bytes {required}",
        )


# -- group snapshots --------------------------------------------------------------------------


def _group_response(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if not resp.HasField("group_snapshot"):
        return
    group = resp.group_snapshot
    members = group.snapshots
    if not members:
        return  # REQUIRED: csi.required-field reports it
    gid = group.group_snapshot_id
    if gid:
        wrong = [
            i for i, s in enumerate(members) if s.group_snapshot_id and s.group_snapshot_id != gid
        ]
        if wrong:
            where = f"group_snapshot.snapshots[{wrong[0]}].group_snapshot_id"
            yield Violation(
                cs.rule("group-snapshot-id-mismatch"),
                where,
                f"{where} differs from group_snapshot.group_snapshot_id ({len(wrong)} of"
                f" {len(members)} members)",
            )
    not_ready = [i for i, s in enumerate(members) if not s.ready_to_use]
    if group.ready_to_use and not_ready:
        yield Violation(
            cs.rule("group-ready-mismatch"),
            "group_snapshot.ready_to_use",
            f"group_snapshot.ready_to_use is true but {len(not_ready)} of {len(members)}"
            f" member snapshots are not ready (first: group_snapshot.snapshots[{not_ready[0]}])",
        )
    elif not group.ready_to_use and not not_ready:
        yield Violation(
            cs.rule("group-not-ready"),
            "group_snapshot.ready_to_use",
            f"group_snapshot.ready_to_use is false but all {len(members)} member snapshots"
            " are ready",
        )


# -- volume statistics ------------------------------------------------------------------------


def _stats_response(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    """VolumeUsage.total is REQUIRED; proto3 reads an unset number as 0. In BYTES no volume
    has 0 bytes; in INODES 0 is a real answer (file systems without an inode table)."""
    for i, usage in enumerate(resp.usage):
        unit = usage.DESCRIPTOR.fields_by_name["unit"].enum_type.values_by_number.get(usage.unit)
        if unit is not None and unit.name == "BYTES" and usage.total == 0:
            yield Violation(
                cs.rule("required-field"),
                f"usage[{i}].total",
                f"usage[{i}].total is missing (0) in BYTES: no volume has 0 bytes",
                enforceable=False,
            )
            return


# -- snapshot metadata streams ----------------------------------------------------------------


@dataclass(slots=True)
class _Stream:
    """What one GetMetadata* stream showed so far (a few numbers, dropped with the call)."""

    messages: int = 0
    style: int = 0
    capacity: int = 0
    fixed_size: int = 0  # size_bytes of the FIXED_LENGTH tuples so far; 0: none yet
    last_offset: int = 0
    last_end: int | None = None  # end of the stream's last tuple; None: no tuple yet
    last_message: int = 0  # the message that held it
    read: int = 0  # tuples judged so far
    reported: set[str] = field(default_factory=set)  # rules reported on this stream


def _style_name(resp: Any, number: int) -> str:
    value = resp.DESCRIPTOR.fields_by_name["block_metadata_type"].enum_type.values_by_number.get(
        number
    )
    return value.name if value is not None else str(number)


def _order_problem(offset: int, before: int, end: int) -> str | None:
    """Why a tuple at ``offset`` cannot follow one at ``before`` ending at ``end``, or None."""
    if offset <= before:
        return f"is not above {before}, the byte_offset of"
    if offset < end:
        return f"is below {end}, the end of"
    return None


def _metadata_stream(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    stream = call.stage_state.get(STREAM_KEY)
    if stream is None:
        stream = call.stage_state[STREAM_KEY] = _Stream()
    stream.messages += 1
    n = stream.messages
    out: list[Violation] = []

    def report(suffix: str, where: str, message: str, key: str = "") -> None:
        # Once per stream and rule: a plugin wrong in one way is usually wrong in every
        # message, and one line says it as well as thousands.
        key = key or suffix
        if key not in stream.reported:
            stream.reported.add(key)
            out.append(Violation(cs.rule(suffix), where, f"{message} (message #{n})"))

    style = resp.block_metadata_type
    capacity = resp.volume_capacity_bytes
    if n > 1:
        if style != stream.style:
            report(
                "metadata-stream-changed",
                "block_metadata_type",
                f"block_metadata_type is {_style_name(resp, style)}, message #{n - 1} of this"
                f" stream said {_style_name(resp, stream.style)}",
                key="type changed",
            )
        if capacity != stream.capacity:
            report(
                "metadata-stream-changed",
                "volume_capacity_bytes",
                f"volume_capacity_bytes is {capacity}, message #{n - 1} of this stream said"
                f" {stream.capacity}",
                key="capacity changed",
            )
    stream.style, stream.capacity = style, capacity

    blocks = resp.block_metadata
    if _real_indices(call, "block_metadata") is not None:
        whole = call.stage_state[JUDGED_RESPONSE].message  # a sample: decode the whole
        if whole is not None:
            blocks = whole.block_metadata
            call.stage_state.setdefault(JUDGED_WHOLE, set()).add("block_metadata")
    if not blocks:
        return out
    offsets = [b.byte_offset for b in blocks]
    sizes = [b.size_bytes for b in blocks]
    stream.read += len(offsets)

    empty = [k for k, size in enumerate(sizes) if size <= 0] if min(sizes) <= 0 else []
    if empty:
        where = f"block_metadata[{empty[0]}].size_bytes"
        report(
            "metadata-size-zero",
            where,
            f"{where} is {sizes[empty[0]]}; size_bytes MUST be greater than zero"
            f" ({_counted(len(empty), False, 'tuple(s)')})",
        )

    if stream.last_end is not None:
        problem = _order_problem(offsets[0], stream.last_offset, stream.last_end)
        if problem is not None:
            report(
                "metadata-order",
                "block_metadata[0].byte_offset",
                f"block_metadata[0].byte_offset {offsets[0]} {problem} the last tuple of"
                f" message #{stream.last_message} of this stream",
            )
    ends = list(map(operator.add, offsets, sizes))
    in_order = all(map(operator.gt, offsets[1:], offsets)) and all(
        map(operator.ge, offsets[1:], ends)
    )
    walk = not in_order and "metadata-order" not in stream.reported
    for k in range(1, len(offsets) if walk else 0):
        problem = _order_problem(offsets[k], offsets[k - 1], ends[k - 1])
        if problem is not None:
            where = f"block_metadata[{k}].byte_offset"
            report(
                "metadata-order",
                where,
                f"{where} {offsets[k]} {problem} the tuple before it",
            )
            break

    if _style_name(resp, style) == "FIXED_LENGTH":
        fixed = stream.fixed_size or sizes[0]
        same = sizes.count(fixed) == len(sizes)
        differ = [] if same else [k for k, size in enumerate(sizes) if size != fixed]
        if differ:
            where = f"block_metadata[{differ[0]}].size_bytes"
            report(
                "metadata-fixed-length",
                where,
                f"{where} is {sizes[differ[0]]}, the stream's FIXED_LENGTH tuples before it"
                f" are {fixed} bytes ({_counted(len(differ), False, 'tuple(s)')})",
            )
        stream.fixed_size = sizes[-1]

    stream.last_offset = offsets[-1]
    stream.last_end = offsets[-1] + sizes[-1]
    stream.last_message = n
    return out


# -- deletes ----------------------------------------------------------------------------------


def _delete_error(what: str, id_field: str) -> ErrorCheck:
    def check(
        cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code != "NOT_FOUND":
            return ()
        return (
            Violation(
                cs.rule("delete-not-idempotent"),
                id_field,
                f"{call.method.name} answered NOT_FOUND; deleting a {what} that does not exist"
                " MUST reply 0 OK",
                party=PLUGIN,  # on_error findings default to the CO
            ),
        )

    return check


def _segments(topology: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in topology.segments.items()}


def _within(entry: dict[str, str], requisite: dict[str, str]) -> bool:
    return all(requisite.get(k, v) == v for k, v in entry.items())


def _requisite_response(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if not req.HasField("accessibility_requirements") or not resp.HasField("volume"):
        return
    requisite = [_segments(t) for t in req.accessibility_requirements.requisite]
    returned = [_segments(t) for t in resp.volume.accessible_topology]
    if not requisite or not returned:
        return
    if not any(_within(entry, r) for entry in returned for r in requisite):
        yield Violation(
            cs.rule("topology-outside-requisite"),
            "volume.accessible_topology",
            f"none of the {len(returned)} accessible_topology entries lies within any of the"
            f" {len(requisite)} requisite topologies (each contradicts each on a shared key)",
        )
        return
    yield from _topology_count(cs, requisite, returned)


def _topology_count(
    cs: CompiledSpec, requisite: list[dict[str, str]], returned: list[dict[str, str]]
) -> Iterable[Violation]:
    """CSI v1.12 §CreateVolume, TopologyRequirement.requisite: x entries for n requisite."""
    x, n = len(returned), len(requisite)
    rule = cs.rule("topology-count")
    found = False  # with x == n, one entry outside already means one requisite missed
    if x <= n:
        outside = [i for i, e in enumerate(returned) if not any(_within(e, r) for r in requisite)]
        if outside:
            found = True
            yield Violation(
                rule,
                f"volume.accessible_topology[{outside[0]}]",
                f"{len(outside)} of the {x} accessible_topology entries lie outside every"
                f" requisite topology; with x <= n ({x} <= {n}) each MUST be one of them",
            )
        unique = {tuple(sorted(e.items())) for e in returned}
        if len(unique) < x:
            yield Violation(
                rule,
                "volume.accessible_topology",
                f"{x - len(unique)} accessible_topology entries repeat another; with x <= n"
                f" ({x} <= {n}) the plugin chooses x unique requisite topologies",
            )
    if x >= n and not found:
        missed = [i for i, r in enumerate(requisite) if not any(_within(e, r) for e in returned)]
        if missed:
            yield Violation(
                rule,
                "volume.accessible_topology",
                f"{len(missed)} of the {n} requisite topologies (first:"
                f" accessibility_requirements.requisite[{missed[0]}]) are reached by no"
                f" accessible_topology entry; with x >= n ({x} >= {n}) the volume MUST be"
                " accessible from all of them",
            )


def hooks(title: str, v1: bool) -> Hooks:
    """The family's rules and checks for the CSI version cited as ``title``."""
    response_checks: dict[str, tuple[ResponseCheck, ...]] = {
        "ListSnapshots": (_list_filter_check("snapshot_id" if v1 else "id"),),
        "CreateVolume": (_requisite_response,),
    }
    on_error: dict[str, tuple[ErrorCheck, ...]] = {
        "DeleteVolume": (_delete_error("volume", "volume_id"),),
        "DeleteSnapshot": (_delete_error("snapshot", "snapshot_id"),),
    }
    if v1:  # CSI v0.3 has no expansion, group snapshots or snapshot metadata
        response_checks |= {
            "ControllerExpandVolume": (_expand_response,),
            "NodeExpandVolume": (_expand_response,),
            "NodeGetVolumeStats": (_stats_response,),
            "CreateVolumeGroupSnapshot": (_group_response,),
            "GetVolumeGroupSnapshot": (_group_response,),
            "GetMetadataAllocated": (_metadata_stream,),
            "GetMetadataDelta": (_metadata_stream,),
        }
        on_error["DeleteVolumeGroupSnapshot"] = (
            _delete_error("group snapshot", "group_snapshot_id"),
        )
    return Hooks(rules=tuple(_rules(title, v1)), response_checks=response_checks, on_error=on_error)
