"""Whether the CO did what an error row's recovery asks before retrying, as far as the
socket shows it (CSI v1.12 and v0.3).

- After NOT_FOUND the CO MUST verify the volume (or the source snapshot or volume) exists
  before retrying with exponential back off: a retry naming one whose delete answered OK on
  this socket, with no create answering it since, shows it did not
  (``csi.retry-deleted-object``).
- After DeleteVolume's FAILED_PRECONDITION (in use) the CO SHOULD make sure the volume has
  no snapshots before retrying: a retry while snapshots of it created here are not deleted
  shows it did not (``csi.delete-retry-with-snapshots``).
- After ControllerExpandVolume's FAILED_PRECONDITION (published, and no online expansion)
  the CO SHOULD unpublish the volume before retrying: a retry refused the same way again,
  with no ControllerUnpublishVolume of it answered OK between, shows it did not
  (``csi.expand-retry-while-published``).

The plugin's side of the same rows: an OK to a call naming a volume or snapshot (or a
CreateVolume or CreateSnapshot source) whose delete answered OK on this socket within a
leader-election lease (:data:`HANDOVER`), and with no create answering that id since,
where the table prescribes NOT_FOUND (``csi.deleted-object-answered``). Later, another
replica may have made an object of that id again (ids derived from names).

The same holds for a name: an OK to CreateSnapshot or CreateVolumeGroupSnapshot reusing a
name this socket saw answered within a lease for other sources, with another id and no
delete of the first seen, where the ALREADY_EXISTS row prescribes a refusal
(``csi.name-reused``); for CreateVolume, which a plugin may answer for compatible
arguments, a second volume for one name is the SHOULD ``csi.volume-name-reused``. A name
repeated with the same arguments (other secrets, maps or sources in another order) and
answered with another id within a lease is ``csi.create-not-idempotent``, which elsewhere
judges byte-identical repeats only. The other way round, one id answered for two names
within a lease, no delete seen between, is ``csi.id-reused`` (snapshots and groups of other
sources) or the SHOULD ``csi.volume-id-reused`` (a shared volume may serve several names).

A snapshot listed by ListSnapshots asked after its DeleteSnapshot answered OK within a lease,
with no create answering it since, is ``csi.deleted-snapshot-listed``.

The memory is bounded and expires with the lifecycle (SpecState.lifecycle_ttl): objects
deleted longer ago, and refusals older than that, are not judged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import HANDOVER, ExpiringMap, ago, message_digest
from plugproxy.rules.csi_common import CREATE_SNAPSHOT_ARGUMENTS, CREATE_VOLUME_ARGUMENTS
from plugproxy.rules.engine import CO, MUST, PLUGIN, SHOULD, Hooks, Rule, Violation

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState

# RPCs whose NOT_FOUND row asks the CO to verify the volume (or the source) still exists.
_VERIFY_AFTER_NOT_FOUND = (
    "CreateVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "ControllerModifyVolume",
    "CreateSnapshot",
    "GetMetadataAllocated",
    "GetMetadataDelta",
)


class RecoveryMemory:
    def __init__(self, st: SpecState) -> None:
        self.clock = st.clock
        n, ttl = st.max_volumes, st.lifecycle_ttl
        # "volume:<id>" / "snapshot:<id>" -> when its delete answered OK
        self.deleted: ExpiringMap[str, float] = ExpiringMap(n, ttl, st.clock)
        # (rpc, object key) -> when the plugin answered NOT_FOUND
        self.not_found: ExpiringMap[tuple[str, str], float] = ExpiringMap(n, ttl, st.clock)
        # snapshot id -> its source volume id, while no delete of it answered OK
        self.snapshots: ExpiringMap[str, str] = ExpiringMap(n, ttl, st.clock)
        # volume id -> when DeleteVolume answered FAILED_PRECONDITION
        self.in_use: ExpiringMap[str, float] = ExpiringMap(n, ttl, st.clock)
        # (create rpc, name) -> (digest of its arguments, the id it answered, when, digest
        # of the whole request)
        self.names: ExpiringMap[tuple[str, str], tuple[bytes, str, float, bytes]] = ExpiringMap(
            n, ttl, st.clock
        )
        # (create rpc, id answered) -> (the name it was answered for, digest of its
        # arguments, when)
        self.ids: ExpiringMap[tuple[str, str], tuple[str, bytes, float]] = ExpiringMap(
            n, ttl, st.clock
        )
        # volume id -> when ControllerExpandVolume answered FAILED_PRECONDITION, while no
        # ControllerUnpublishVolume of it answered OK since
        self.expand_refused: ExpiringMap[str, float] = ExpiringMap(n, ttl, st.clock)


def _rules(title: str) -> list[Rule]:
    return [
        Rule(
            "csi.name-reused",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}} errors",
            "CreateSnapshot or CreateVolumeGroupSnapshot answered OK with another id for a name"
            " this socket saw answered within the last 15 s for other sources, with no delete"
            " of that one seen: the ALREADY_EXISTS row prescribes a refusal.",
            reject_code=None,
            note="Judged within a leader-election lease of the first answer: later, another"
            " replica may have deleted the first and made the second legitimately.",
        ),
        Rule(
            "csi.volume-name-reused",
            SHOULD,
            (PLUGIN,),
            f"{title} §CreateVolume",
            "CreateVolume answered OK with another volume for a name this socket saw answered"
            " within the last 15 s with other arguments, with no delete of the first seen: a"
            " second piece of storage for one name.",
            reject_code=None,
            note="Whether the other arguments are compatible with the first volume is the"
            " plugin's judgement, so answering the first volume is allowed; making a second"
            " one is not. Judged within a leader-election lease of the first answer.",
        ),
        Rule(
            "csi.id-reused",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "CreateSnapshot or CreateVolumeGroupSnapshot answered OK with an id this socket saw"
            " answered within the last 15 s for another name and other sources, with no"
            " delete of it seen since: one id for two snapshots, where an id identifies one.",
            reject_code=None,
            note="Sources compared as a set (a group's order of volumes is no other source)."
            " Judged within a leader-election lease of the first answer: later, another"
            " replica may have deleted the first and a plugin deriving ids from its own"
            " counters made the id again. A snapshot of the same source under another name"
            " is not judged.",
        ),
        Rule(
            "csi.volume-id-reused",
            SHOULD,
            (PLUGIN,),
            f"{title} §CreateVolume",
            "CreateVolume answered OK for one name with a volume_id this socket saw answered"
            " within the last 15 s for another name, with no delete of it seen since: one id"
            " for two volumes, where an id identifies one.",
            reject_code=None,
            note="Advisory: a plugin handing several names one shared volume (a share"
            " without a directory per volume) answers one id for what is one volume. Judged"
            " within a leader-election lease of the first answer.",
        ),
        Rule(
            "csi.deleted-object-answered",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}} errors",
            "An OK to a call naming a volume or snapshot (or a create's source) whose delete"
            " answered OK on this socket within the last 15 s, with no create answering that"
            " id since: the error table prescribes NOT_FOUND for an object that does not exist.",
            reject_code=None,
            note="Judged within a leader-election lease of the delete: later, another replica"
            " may have made an object of the same id again (ids derived from names).",
        ),
        Rule(
            "csi.deleted-snapshot-listed",
            MUST,
            (PLUGIN,),
            f"{title} §ListSnapshots",
            "ListSnapshots listed a snapshot whose DeleteSnapshot answered OK on this socket"
            " within the last 15 s, before the listing was asked, with no create answering"
            " that id since: a listing holds the snapshots the storage system has.",
            reject_code=None,
            note="Judged within a leader-election lease of the delete: later, another replica"
            " may have made a snapshot of the same id again (ids derived from names). A"
            " listing asked before the delete was answered is not judged.",
        ),
        Rule(
            "csi.retry-deleted-object",
            MUST,
            (CO,),
            f"{title} §{{rpc}} errors",
            "After NOT_FOUND, the CO retried naming a volume or snapshot whose delete"
            " answered OK on this socket (and no create answered it since): the recovery asks"
            " it to verify the object exists before retrying.",
            reject_code=None,
            note="The verification itself happens off the socket; a retry for an object this"
            " socket saw deleted shows it was not made. Judged within the lifecycle memory"
            " (a day by default).",
        ),
        Rule(
            "csi.delete-retry-with-snapshots",
            SHOULD,
            (CO,),
            f"{title} §DeleteVolume errors",
            "DeleteVolume retried after FAILED_PRECONDITION (in use) while snapshots of the"
            " volume created on this socket are not deleted.",
            reject_code=None,
            note="The recovery asks the CO to make sure the volume has no snapshots and no"
            " other users before retrying; other users are off the socket, the snapshots"
            " made here are not.",
        ),
        Rule(
            "csi.expand-retry-while-published",
            SHOULD,
            (CO,),
            f"{title} §ControllerExpandVolume errors",
            "ControllerExpandVolume refused with FAILED_PRECONDITION (published) again on a"
            " retry, with no ControllerUnpublishVolume of the volume answered OK between.",
            reject_code=None,
            note="The second refusal shows the volume was still published: the recovery asks"
            " the CO to unpublish it before retrying.",
        ),
    ]


def _object_key(rpc: str, req: Any) -> str:
    """The object a call's NOT_FOUND is about: its volume, or a CreateVolume's source."""
    if rpc == "CreateVolume":
        if not req.HasField("volume_content_source"):
            return ""
        source = req.volume_content_source
        kind = source.WhichOneof("type")
        if kind not in ("snapshot", "volume"):
            return ""
        found = _id_of(getattr(source, kind), "snapshot_id", "volume_id", "id")
        return f"{kind}:{found}" if found else ""
    if rpc == "CreateSnapshot":
        return f"volume:{req.source_volume_id}" if req.source_volume_id else ""
    if rpc == "GetMetadataAllocated":
        return f"snapshot:{req.snapshot_id}" if req.snapshot_id else ""
    return f"volume:{req.volume_id}" if req.volume_id else ""


def _object_keys(rpc: str, req: Any) -> list[str]:
    """The objects a call's NOT_FOUND may be about (a delta names two snapshots)."""
    if rpc == "GetMetadataDelta":
        ids = (req.base_snapshot_id, req.target_snapshot_id)
        return [f"snapshot:{i}" for i in ids if i]
    key = _object_key(rpc, req)
    return [key] if key else []


def _id_of(message: Any, *names: str) -> str:
    for name in names:
        if name in message.DESCRIPTOR.fields_by_name and getattr(message, name):
            return str(getattr(message, name))
    return ""


# -- after NOT_FOUND ------------------------------------------------------------------------


def _not_found(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    if code == "NOT_FOUND":
        memory = st.part(RecoveryMemory)
        for key in _object_keys(call.method.name, req):
            memory.not_found[(call.method.name, key)] = memory.clock()
    return ()


def _deleted_answered(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    memory = st.part(RecoveryMemory)
    if not len(memory.deleted):
        return
    rpc = call.method.name
    key = (
        f"snapshot:{_id_of(req, 'snapshot_id')}" if rpc == "GetSnapshot" else _object_key(rpc, req)
    )
    deleted = memory.deleted.get(key) if key else None
    if deleted is None:
        return
    age = memory.clock() - deleted
    if age <= HANDOVER:
        kind = key.partition(":")[0]
        yield Violation(
            cs.rule("deleted-object-answered"),
            "",
            f"{rpc} answered OK for a {kind} whose delete answered OK on this socket"
            f" ({ago(age)}); the spec prescribes NOT_FOUND for an object that does not exist",
        )


def _retry(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    memory = st.part(RecoveryMemory)
    if not len(memory.not_found):
        return
    rpc = call.method.name
    for key in _object_keys(rpc, req):
        refused = memory.not_found.get((rpc, key))
        deleted = memory.deleted.get(key) if refused is not None else None
        if refused is not None and deleted is not None:
            break
    else:
        return
    now = memory.clock()
    kind = key.partition(":")[0]
    yield Violation(
        cs.rule("retry-deleted-object"),
        "",
        f"{rpc} retried after its NOT_FOUND ({ago(now - refused)}), naming a {kind} whose"
        f" delete answered OK on this socket ({ago(now - deleted)}): the CO MUST verify it"
        " exists before retrying",
    )


# -- a deleted snapshot listed ---------------------------------------------------------------
_ASKED = "recovery.asked"  # call.stage_state: when the listing's request came


def _list_asked(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    memory = st.part(RecoveryMemory)
    if len(memory.deleted):
        call.stage_state[_ASKED] = memory.clock()
    return ()


def _deleted_listed(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    asked = call.stage_state.get(_ASKED)
    if not isinstance(asked, float):
        return
    memory = st.part(RecoveryMemory)
    now = memory.clock()
    listed = []
    for entry in resp.entries:
        if not entry.HasField("snapshot"):
            continue
        deleted = memory.deleted.get(f"snapshot:{_id_of(entry.snapshot, 'snapshot_id', 'id')}")
        if deleted is not None and deleted <= asked and now - deleted <= HANDOVER:
            listed.append(deleted)
    if listed:
        yield Violation(
            cs.rule("deleted-snapshot-listed"),
            "entries",
            f"ListSnapshots listed {len(listed)} snapshot(s) whose DeleteSnapshot answered OK"
            f" on this socket before the listing was asked (the latest {ago(now - max(listed))}),"
            " with no create answering them since",
        )


# -- bookkeeping on success -----------------------------------------------------------------


# The arguments a create names and its ALREADY_EXISTS row compares, by RPC.
_NAME_ARGUMENTS = {
    "CreateVolume": CREATE_VOLUME_ARGUMENTS,
    "CreateSnapshot": CREATE_SNAPSHOT_ARGUMENTS,
    "CreateVolumeGroupSnapshot": ("source_volume_ids", "parameters"),
}


def _arguments(req: Any, names: tuple[str, ...]) -> bytes:
    parts = []
    fields = req.DESCRIPTOR.fields_by_name
    for name in names:
        if name not in fields:
            continue
        value = getattr(req, name)
        fd = fields[name]
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            parts.append(repr(sorted(value.items())))
        elif fd.is_repeated and fd.message_type is None:
            parts.append(repr(sorted(value)))  # an order of sources is no other argument
        elif fd.is_repeated:
            parts.append(repr([v.SerializeToString(deterministic=True) for v in value]))
        elif fd.message_type is not None:
            parts.append(repr(value.SerializeToString(deterministic=True)))
        else:
            parts.append(repr(value))
    return "\x00".join(parts).encode()


def _made(rpc: str, resp: Any) -> tuple[str, str]:
    """(object key kind, id) a create's answer made."""
    if rpc == "CreateVolume":
        return "volume", _id_of(resp.volume, "volume_id", "id") if resp.HasField("volume") else ""
    if rpc == "CreateSnapshot":
        return "snapshot", _id_of(resp.snapshot, "snapshot_id", "id") if resp.HasField(
            "snapshot"
        ) else ""
    group = resp.group_snapshot if resp.HasField("group_snapshot") else None
    return "group", group.group_snapshot_id if group is not None else ""


def _name_reused(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    rpc = call.method.name
    kind, made = _made(rpc, resp)
    if not made or not req.name:
        return
    memory = st.part(RecoveryMemory)
    now = memory.clock()
    arguments = _arguments(req, _NAME_ARGUMENTS[rpc])
    whole = message_digest(req)
    yield from _id_reused(cs, memory, rpc, kind, made, req.name, arguments, now)
    earlier = memory.names.get((rpc, req.name))
    memory.names[(rpc, req.name)] = (arguments, made, now, whole)
    if earlier is None:
        return
    first_arguments, first, when, first_whole = earlier
    deleted = memory.deleted.get(f"{kind}:{first}")
    if first == made or now - when > HANDOVER:
        return
    if deleted is not None and deleted >= when:
        return
    if deleted is None and memory.deleted.dropped_after(when):
        return  # a delete of it may have been dropped to make room
    if first_arguments == arguments:
        if first_whole != whole:  # an identical repeat is judged where it is remembered
            yield Violation(
                cs.rule("create-not-idempotent"),
                "name",
                f"{rpc} repeated with the same name and arguments (other secrets, or the"
                f" same sources or parameters in another order) answered another {kind}"
                f" than it did {ago(now - when)}, and no delete of that {kind} was seen",
            )
        return
    rule = cs.find("volume-name-reused" if rpc == "CreateVolume" else "name-reused")
    if rule is None:
        return  # CSI v0.3 states nothing of one volume per name
    yield Violation(
        rule,
        "name",
        f"{rpc} answered OK with another {kind} for a name answered {ago(now - when)} with"
        f" other arguments, and no delete of that {kind} was seen",
    )


def _id_reused(
    cs: CompiledSpec,
    memory: RecoveryMemory,
    rpc: str,
    kind: str,
    made: str,
    name: str,
    arguments: bytes,
    now: float,
) -> Iterable[Violation]:
    """The id a create answered was answered within a lease for another name (item of
    ``memory.ids``), with no delete of it seen since."""
    earlier = memory.ids.get((rpc, made))
    memory.ids[(rpc, made)] = (name, arguments, now)
    if earlier is None:
        return
    first_name, first_arguments, when = earlier
    if first_name == name or now - when > HANDOVER:
        return
    deleted = memory.deleted.get(f"{kind}:{made}")
    if deleted is not None and deleted >= when:
        return
    if deleted is None and memory.deleted.dropped_after(when):
        return  # a delete of it may have been dropped to make room
    if rpc == "CreateVolume":
        rule = cs.find("volume-id-reused")
    elif _sources(first_arguments) != _sources(arguments):
        rule = cs.find("id-reused")
    else:
        return  # a snapshot of the same source under two names: not judged
    if rule is None:
        return  # CSI v0.3 says nothing of an id identifying one object
    yield Violation(
        rule,
        _ID_FIELD[kind],
        f"{rpc} answered the {kind} id it answered {ago(now - when)} for another name"
        + ("" if rpc == "CreateVolume" else " and other sources")
        + ", with no delete of it seen since: one id for two objects",
    )


_ID_FIELD = {
    "volume": "volume.volume_id",
    "snapshot": "snapshot.snapshot_id",
    "group": "group_snapshot.group_snapshot_id",
}


def _sources(arguments: bytes) -> bytes:
    """The sources part of a snapshot create's arguments (see _NAME_ARGUMENTS)."""
    return arguments.split(b"\x00", 1)[0]


def _group_deleted(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    memory = st.part(RecoveryMemory)
    memory.deleted[f"group:{req.group_snapshot_id}"] = memory.clock()


def _volume_deleted(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    memory = st.part(RecoveryMemory)
    memory.deleted[f"volume:{req.volume_id}"] = memory.clock()
    memory.in_use.pop(req.volume_id, None)


def _snapshot_deleted(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    memory = st.part(RecoveryMemory)
    sid = _id_of(req, "snapshot_id")
    memory.deleted[f"snapshot:{sid}"] = memory.clock()
    memory.snapshots.pop(sid, None)


def _volume_created(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    if resp is not None and resp.HasField("volume"):
        vid = _id_of(resp.volume, "volume_id", "id")
        st.part(RecoveryMemory).deleted.pop(f"volume:{vid}", None)


def _snapshot_created(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    if resp is not None and resp.HasField("snapshot"):
        sid = _id_of(resp.snapshot, "snapshot_id", "id")
        memory = st.part(RecoveryMemory)
        memory.deleted.pop(f"snapshot:{sid}", None)
        if sid and req.source_volume_id:
            memory.snapshots[sid] = req.source_volume_id


def _unpublished(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    st.part(RecoveryMemory).expand_refused.pop(req.volume_id, None)


# -- DeleteVolume in use, with snapshots -----------------------------------------------------


def _delete_refused(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    if code == "FAILED_PRECONDITION":
        memory = st.part(RecoveryMemory)
        memory.in_use[req.volume_id] = memory.clock()
    return ()


def _delete_retry(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    memory = st.part(RecoveryMemory)
    refused = memory.in_use.get(req.volume_id) if len(memory.in_use) else None
    if refused is None:
        return
    snapshots = sum(1 for sid in memory.snapshots if memory.snapshots.get(sid) == req.volume_id)
    if snapshots:
        yield Violation(
            cs.rule("delete-retry-with-snapshots"),
            "volume_id",
            f"DeleteVolume retried after its FAILED_PRECONDITION ({ago(memory.clock() - refused)})"
            f" while {snapshots} snapshot(s) of the volume made on this socket are not"
            " deleted; the CO SHOULD make sure it has none before retrying",
        )


# -- ControllerExpandVolume refused while published ------------------------------------------


def _expand_refused(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    if code != "FAILED_PRECONDITION":
        return
    memory = st.part(RecoveryMemory)
    earlier = memory.expand_refused.get(req.volume_id)
    now = memory.clock()
    memory.expand_refused[req.volume_id] = now
    if earlier is not None:
        yield Violation(
            cs.rule("expand-retry-while-published"),
            "volume_id",
            "ControllerExpandVolume refused with FAILED_PRECONDITION again (the first refusal"
            f" {ago(now - earlier)}), with no ControllerUnpublishVolume of the volume answered"
            " OK between; the CO SHOULD unpublish it before retrying",
        )


# CSI v0.3 has no expansion, no snapshots named in DeleteVolume's row and no statement on
# one piece of storage per name.
_V0_RULES = frozenset(
    {
        "csi.name-reused",
        "csi.deleted-object-answered",
        "csi.retry-deleted-object",
        "csi.deleted-snapshot-listed",
    }
)


def hooks(title: str, v1: bool) -> Hooks:
    """The family for the CSI version cited as ``title`` (v0.3 has no expansion)."""
    v1_only = (
        "ControllerExpandVolume",
        "ControllerGetVolume",
        "ControllerModifyVolume",
        "GetMetadataAllocated",
        "GetMetadataDelta",
    )
    rpcs = [r for r in _VERIFY_AFTER_NOT_FOUND if v1 or r not in v1_only]
    request_checks: dict[str, tuple[Any, ...]] = {rpc: (_retry,) for rpc in rpcs}
    request_checks["ListSnapshots"] = (_list_asked,)
    on_error: dict[str, tuple[Any, ...]] = {rpc: (_not_found,) for rpc in rpcs}
    if v1:
        request_checks["DeleteVolume"] = (_delete_retry,)
        on_error["DeleteVolume"] = (_delete_refused,)
        on_error["ControllerExpandVolume"] = (_not_found, _expand_refused)
    # OK answers that name a deleted object where the table prescribes NOT_FOUND. CSI v1.12
    # lets ControllerUnpublishVolume assume an unknown volume unpublished; v0.3 does not.
    answered = ["CreateVolume", "ControllerPublishVolume", "ValidateVolumeCapabilities"]
    answered += ["CreateSnapshot", "ControllerGetVolume", "GetSnapshot"] if v1 else []
    answered += [] if v1 else ["ControllerUnpublishVolume"]
    response_checks: dict[str, tuple[Any, ...]] = {rpc: (_deleted_answered,) for rpc in answered}
    response_checks["ListSnapshots"] = (_deleted_listed,)
    creates = ["CreateVolume", "CreateSnapshot"] + (["CreateVolumeGroupSnapshot"] if v1 else [])
    for rpc in creates:
        response_checks[rpc] = (*response_checks.get(rpc, ()), _name_reused)
    success: dict[str, tuple[Any, ...]] = {
        "DeleteVolume": (_volume_deleted,),
        "DeleteSnapshot": (_snapshot_deleted,),
        "CreateVolume": (_volume_created,),
        "CreateSnapshot": (_snapshot_created,),
        "ControllerUnpublishVolume": (_unpublished,),
    }
    if v1:
        success["DeleteVolumeGroupSnapshot"] = (_group_deleted,)
    return Hooks(
        # CSI v0.3's DeleteVolume row names no snapshots, and it has no expansion.
        rules=tuple(r for r in _rules(title) if v1 or r.id in _V0_RULES),
        request_checks=request_checks,
        on_error=on_error,
        response_checks=response_checks,
        on_success=success,
    )
