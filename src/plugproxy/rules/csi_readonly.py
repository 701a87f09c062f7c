"""Read-only CSI calls answered consistently with what this socket saw (CSI v1.12, v0.3).

§ValidateVolumeCapabilities, "This operation MUST be idempotent": two identical
validations of one volume answered differently (confirmed, then not, or the other way
round) break it when nothing that could change the volume was answered OK on this socket
between them. Only OK answers are compared: an error says nothing of what
the volume supports. The memory is one entry per request digest, bounded and expiring
(REPEAT_WINDOW): answers further apart are not compared, as the plugin may have been
upgraded or the volume changed through another replica in between.

§ListVolumes, the plugin returns every volume it knows: a whole listing (one answer with no
next_token, or the pages of one walk from an empty starting_token to an empty next_token)
without a volume CreateVolume answered within HANDOVER before the listing began, with no
DeleteVolume of it sent since. Later another replica may have deleted it; a volume made
while the walk went on may fall between its pages (§ListVolumes gives no consistent view).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import HANDOVER, ExpiringMap, ago, digest
from plugproxy.rules.engine import MUST, PLUGIN, Hooks, Rule, Violation, list_length

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState

REPEAT_WINDOW = 600.0  # seconds two identical validations are compared across

# RPCs whose OK may change what a volume supports: a validation before one of them is not
# compared with one after it.
_CHANGES = ("ControllerModifyVolume", "ControllerExpandVolume", "DeleteVolume", "CreateVolume")


class ValidationMemory:
    def __init__(self, st: SpecState) -> None:
        self.clock = st.clock
        # request digest -> (volume id, answer, when)
        self.answers: ExpiringMap[bytes, tuple[str, bool, float]] = ExpiringMap(
            st.max_volumes, REPEAT_WINDOW, st.clock
        )
        # volume id -> when an RPC that may change it last answered OK
        self.changed: ExpiringMap[str, float] = ExpiringMap(st.max_volumes, REPEAT_WINDOW, st.clock)
        # volume id -> when CreateVolume answered it, while no DeleteVolume of it was sent
        self.created: ExpiringMap[str, float] = ExpiringMap(st.max_volumes, HANDOVER, st.clock)
        # next_token -> (when its walk began, the recent creates its pages listed so far,
        # or None when a page was sampled and what it lists is not known)
        self.walks: ExpiringMap[str, tuple[float, frozenset[str] | None]] = ExpiringMap(
            64, REPEAT_WINDOW, st.clock
        )
        # volume id -> (digests of the capabilities, parameters digest, volume context
        # digest) of the CreateVolume answered with it
        self.made_with: ExpiringMap[str, tuple[frozenset[bytes], bytes, bytes]] = ExpiringMap(
            st.max_volumes, REPEAT_WINDOW, st.clock
        )
        # digest of a validation with its single-node writer modes made one -> (whether
        # SINGLE_NODE_WRITER was confirmed, whether the newer modes were), each None unseen
        self.single_node: ExpiringMap[bytes, tuple[bool | None, bool | None]] = ExpiringMap(
            st.max_volumes, REPEAT_WINDOW, st.clock
        )
        # snapshot id -> when an answer said it is ready, while no delete of it was sent
        self.ready: ExpiringMap[str, float] = ExpiringMap(
            st.max_volumes, st.lifecycle_ttl, st.clock
        )


def _rules(title: str, v1: bool) -> list[Rule]:
    rules = [
        Rule(
            "csi.validate-not-idempotent",
            MUST,
            (PLUGIN,),
            f"{title} §ValidateVolumeCapabilities",
            "Two identical ValidateVolumeCapabilities calls answered differently (confirmed"
            " once, not the other time) with nothing that could change the volume answered"
            " OK between them.",
            reject_code=None,
            note="Compared within 10 minutes; CreateVolume, DeleteVolume,"
            " ControllerExpandVolume or ControllerModifyVolume answered OK for the volume"
            " in between starts over. Error answers are not compared.",
        ),
        Rule(
            "csi.volume-missing",
            MUST,
            (PLUGIN,),
            f"{title} §ListVolumes",
            "A whole ListVolumes listing (one answer, or the pages of one walk from an empty"
            " starting_token to an empty next_token) lacks a volume CreateVolume answered"
            " within 15 s before it began, with no DeleteVolume of it sent since.",
            reject_code=None,
            note="Judged only within a leader-election lease of the create"
            f" ({HANDOVER:.0f} s): later, another replica may have deleted the volume. A"
            " volume made during a walk may fall between its pages; a walk with a sampled"
            " long page is not judged.",
        ),
        Rule(
            "csi.validate-contradicts-create",
            MUST,
            (PLUGIN,),
            f"{title} §CreateVolume, §ValidateVolumeCapabilities",
            "ValidateVolumeCapabilities does not confirm capabilities that a CreateVolume"
            " answered OK with on this socket, for the volume it made, with the same"
            " parameters and volume context and nothing changing the volume since.",
            reject_code=None,
            note="CreateVolume MUST fail when any requested capability is unsupported and"
            " MUST provision a volume satisfying all: the validation of the same capabilities"
            " contradicts it. Judged within 10 minutes of the create.",
        ),
        Rule(
            "csi.snapshot-ready-regressed",
            MUST,
            (PLUGIN,),
            f"{title} §{'CreateSnapshot, ListSnapshots' if v1 else 'Snapshot Statuses'}",
            "A snapshot an answer on this socket said was ready is later answered as not ready"
            " (still being processed), with no delete of it sent since.",
            reject_code=None,
            note="Listings report a snapshot's current state, which turns ready when the"
            " processing is done; processing done does not start again.",
        ),
    ]
    if v1:
        rules.append(
            Rule(
                "csi.single-node-writer-refused",
                MUST,
                (PLUGIN,),
                f"{title} §ControllerGetCapabilities",
                "A plugin listing SINGLE_NODE_MULTI_WRITER does not confirm SINGLE_NODE_WRITER"
                " in a ValidateVolumeCapabilities whose same request with"
                " SINGLE_NODE_SINGLE_WRITER or SINGLE_NODE_MULTI_WRITER it confirms.",
                reject_code=None,
                note="Such a plugin MUST keep accepting SINGLE_NODE_WRITER for older COs."
                " Validation changes nothing, so two validations differing only in that mode"
                " show the refusal is the mode's; other calls refused may have other causes.",
            )
        )
    return rules


def _confirmed(resp: Any) -> bool:
    if "confirmed" in resp.DESCRIPTOR.fields_by_name:
        return bool(resp.HasField("confirmed"))
    return bool(resp.supported)  # CSI v0.3


def _validate_response(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    memory = st.part(ValidationMemory)
    key = digest(req.SerializeToString(deterministic=True))
    confirmed = _confirmed(resp)
    now = memory.clock()
    earlier = memory.answers.get(key)
    memory.answers[key] = (req.volume_id, confirmed, now)
    if earlier is None or earlier[1] == confirmed:
        return
    changed = memory.changed.get(req.volume_id)
    if changed is not None and changed >= earlier[2]:
        return
    if changed is None and memory.changed.dropped_after(earlier[2]):
        return  # a change since may have been dropped to make room
    said = "confirmed" if earlier[1] else "did not confirm"
    says = "confirms" if confirmed else "does not confirm"
    yield Violation(
        cs.rule("validate-not-idempotent"),
        "confirmed" if "confirmed" in resp.DESCRIPTOR.fields_by_name else "supported",
        f"the same ValidateVolumeCapabilities request {said} {ago(now - earlier[2])} and"
        f" {says} now, with no change of the volume answered OK in between",
    )


def _volume_id(volume: Any) -> str:
    return str(getattr(volume, "volume_id", "") or getattr(volume, "id", ""))


def _capabilities(caps: Iterable[Any]) -> frozenset[bytes]:
    return frozenset(digest(c.SerializeToString(deterministic=True)) for c in caps)


def _maps(*maps: Any) -> bytes:
    return digest(repr([sorted(m.items()) for m in maps]).encode())


def _arguments(req: Any) -> bytes:
    """The parameters a volume was made or is validated with (CSI v1: and mutable ones)."""
    names = [n for n in ("parameters", "mutable_parameters") if n in req.DESCRIPTOR.fields_by_name]
    return _maps(*(getattr(req, n) for n in names))


def _context(message: Any) -> bytes:
    for name in ("volume_context", "attributes", "volume_attributes"):
        if name in message.DESCRIPTOR.fields_by_name:
            return _maps(getattr(message, name))
    return _maps()


def _created(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    if resp is not None and resp.HasField("volume") and _volume_id(resp.volume):
        memory = st.part(ValidationMemory)
        vid = _volume_id(resp.volume)
        memory.created[vid] = memory.clock()
        made = (_capabilities(req.volume_capabilities), _arguments(req), _context(resp.volume))
        memory.made_with[vid] = made


def _validate_against_create(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    memory = st.part(ValidationMemory)
    made = memory.made_with.get(req.volume_id) if len(memory.made_with) else None
    if made is None or _confirmed(resp):
        return
    caps, arguments, context = made
    if not _capabilities(req.volume_capabilities) <= caps or _context(req) != context:
        return
    if "parameters" in req.DESCRIPTOR.fields_by_name and _arguments(req) != arguments:
        return
    yield Violation(
        cs.rule("validate-contradicts-create"),
        "confirmed" if "confirmed" in resp.DESCRIPTOR.fields_by_name else "supported",
        "the capabilities are not confirmed, though CreateVolume answered OK with them for"
        " this volume on this socket, with the same parameters and volume context",
    )


_WRITER_MODES = {
    "SINGLE_NODE_WRITER": 0,
    "SINGLE_NODE_SINGLE_WRITER": 1,
    "SINGLE_NODE_MULTI_WRITER": 1,
}


def _single_node_writer(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    caps = st.known_capabilities("controller")
    if caps is None or "SINGLE_NODE_MULTI_WRITER" not in caps:
        return
    normal = type(req)()
    normal.CopyFrom(req)
    kinds = set()
    for cap in normal.volume_capabilities:
        mode = cap.access_mode.DESCRIPTOR.fields_by_name["mode"].enum_type
        name = mode.values_by_number[cap.access_mode.mode].name
        if name in _WRITER_MODES:
            kinds.add(_WRITER_MODES[name])
            cap.access_mode.mode = mode.values_by_name["SINGLE_NODE_WRITER"].number
    if len(kinds) != 1:
        return  # no single-node writer mode, or old and new ones mixed in one request
    memory = st.part(ValidationMemory)
    key = digest(normal.SerializeToString(deterministic=True))
    old, new = memory.single_node.get(key) or (None, None)
    confirmed = _confirmed(resp)
    if kinds == {0}:
        old = confirmed
    else:
        new = confirmed
    memory.single_node[key] = (old, new)
    if old is False and new is True:
        yield Violation(
            cs.rule("single-node-writer-refused"),
            "volume_capabilities",
            "SINGLE_NODE_WRITER is not confirmed where the same validation with"
            " SINGLE_NODE_SINGLE_WRITER or SINGLE_NODE_MULTI_WRITER is, though the plugin"
            " lists SINGLE_NODE_MULTI_WRITER",
        )


def _snapshot_ready(snapshot: Any) -> bool | None:
    """Whether an answer says the snapshot is ready (None: it says neither)."""
    if "ready_to_use" in snapshot.DESCRIPTOR.fields_by_name:
        return bool(snapshot.ready_to_use)
    if not snapshot.HasField("status"):
        return None
    kind = snapshot.status.DESCRIPTOR.fields_by_name["type"].enum_type
    name = kind.values_by_number[snapshot.status.type].name
    return True if name == "READY" else False if name == "UPLOADING" else None


def _snapshots_answered(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if "entries" in resp.DESCRIPTOR.fields_by_name:
        snapshots = [e.snapshot for e in resp.entries if e.HasField("snapshot")]
    elif resp.HasField("snapshot"):
        snapshots = [resp.snapshot]
    else:
        return
    memory = st.part(ValidationMemory)
    now = memory.clock()
    for snapshot in snapshots:
        sid = str(getattr(snapshot, "snapshot_id", "") or getattr(snapshot, "id", ""))
        ready = _snapshot_ready(snapshot)
        if not sid or ready is None:
            continue
        if ready:
            memory.ready[sid] = now
            continue
        when = memory.ready.get(sid)
        if when is not None:
            yield Violation(
                cs.rule("snapshot-ready-regressed"),
                "snapshot",
                f"a snapshot answered ready on this socket ({ago(now - when)}) is answered as"
                " still being processed, with no delete of it sent since",
            )
            return  # once a call


def _deleting_snapshot(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any
) -> Iterable[Violation]:
    st.part(ValidationMemory).ready.pop(req.snapshot_id, None)
    return ()


def _deleting(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    st.part(ValidationMemory).created.pop(req.volume_id, None)
    return ()


def _list_response(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    memory = st.part(ValidationMemory)
    if req.starting_token:
        walk = memory.walks.pop(req.starting_token, None)
        if walk is None:
            return  # a walk begun before this proxy, or by a token of its own
        began, seen = walk
    elif not len(memory.created):
        return  # nothing recent to look for: no walk worth following
    else:
        began, seen = memory.clock(), frozenset()
    if seen is not None:
        if list_length(call, resp, "entries") != len(resp.entries):
            seen = None  # a sample of a long page: what it lists is not known
        else:
            listed = {_volume_id(e.volume) for e in resp.entries}
            seen = seen | {vid for vid in memory.created if vid in listed}
    if resp.next_token:
        memory.walks[resp.next_token] = (began, seen)
        return
    if seen is None:
        return
    missing = [
        vid for vid in memory.created if vid not in seen and memory.created.get(vid, began) <= began
    ]
    if missing:
        when = memory.created.get(missing[0]) or began
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        yield Violation(
            cs.rule("volume-missing"),
            "entries",
            f"a whole listing lacks a volume CreateVolume answered {ago(memory.clock() - when)}"
            f"{more}, before the listing began, with no DeleteVolume of it sent since",
        )


def _changed(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    volume_id = getattr(req, "volume_id", "")
    if not volume_id and resp is not None and "volume" in resp.DESCRIPTOR.fields_by_name:
        volume_id = _volume_id(resp.volume)  # CreateVolume: the id its answer made
    if volume_id:
        memory = st.part(ValidationMemory)
        memory.changed[volume_id] = memory.clock()
        if call.method.name != "CreateVolume":
            memory.made_with.pop(volume_id, None)  # what it was made with may not hold now


def hooks(title: str, v1: bool) -> Hooks:
    """The family for the CSI version cited as ``title`` (v0.3 has no expansion or modify)."""
    changes = _CHANGES if v1 else ("DeleteVolume", "CreateVolume")
    on_success: dict[str, tuple[Any, ...]] = {rpc: (_changed,) for rpc in changes}
    on_success["CreateVolume"] = (_changed, _created)
    snapshots = ("CreateSnapshot", "ListSnapshots", *(("GetSnapshot",) if v1 else ()))
    return Hooks(
        rules=tuple(_rules(title, v1)),
        request_checks={"DeleteVolume": (_deleting,), "DeleteSnapshot": (_deleting_snapshot,)},
        response_checks={
            "ValidateVolumeCapabilities": (
                _validate_response,
                _validate_against_create,
                *((_single_node_writer,) if v1 else ()),
            ),
            "ListVolumes": (_list_response,),
            **{rpc: (_snapshots_answered,) for rpc in snapshots},
        },
        on_success=on_success,
    )
