"""CSI snapshots and group snapshots across calls (CSI v1.12 and v0.3): sizes, group
membership, retrievability, and the secrets of a group's operations.

Everything is learned from calls this proxy relayed and kept in :class:`SnapshotMemory`
(bounded, expiring maps, like the lifecycle state): history the proxy did not see is
unknown, never a violation; secrets are kept and compared as digests. What another HA
replica could undo (a delete, a create anew under the same id) judges only within a
leader-election lease (:data:`~plugproxy.core.memory.HANDOVER`). No rule here is enforced:
each judges memory, so it is reported. csi_volumes reads the sizes remembered here (a
volume made from a snapshot is not smaller).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import HANDOVER, ExpiringMap, ago, digest, map_digest
from plugproxy.rules.engine import CO, MUST, PLUGIN, SHOULD, Hooks, Rule, Violation, list_length

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState

# "Snapshots which were recently created and not yet ready to use must be retrievable"
# (§GetSnapshot): judged this long after CreateSnapshot returned the snapshot.
SNAPSHOT_RECENT = 300.0
_ASKED = "csi_snapshots.asked"  # call.stage_state key: when a request naming a snapshot came
_GROUP = "csi_snapshots.group"  # the group a DeleteVolumeGroupSnapshot forgot on arrival


# -- memory -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Snapshot:
    """What the plugin reported of one snapshot."""

    size: int
    group: str  # group_snapshot_id the plugin gave it ("" independent)
    rpc: str  # the call that reported it first
    at: float
    created_at: float | None  # when a Create* call returned it through this proxy
    ready: bool | None  # last ready_to_use seen (None: v0.3, not reported)
    seen: float = 0.0  # when an answer last reported it


@dataclass(slots=True)
class _Group:
    secrets: bytes
    rpc: str
    at: float
    members: tuple[str, ...]


class SnapshotMemory:
    """What this family remembers per spec table."""

    def __init__(self, st: SpecState) -> None:
        n, ttl, clock = st.max_volumes, st.lifecycle_ttl, st.clock
        self.clock = clock
        self.snapshots: ExpiringMap[str, Snapshot] = ExpiringMap(n, ttl, clock)
        self.groups: ExpiringMap[str, _Group] = ExpiringMap(n, ttl, clock)
        # (rpc, request digest) -> (id answered, when) of a successful CreateSnapshot or
        # CreateVolumeGroupSnapshot, and id -> its key: kept only as long as no other HA
        # replica can have deleted the object and had it created anew (HANDOVER).
        self.created: ExpiringMap[tuple[str, bytes], tuple[str, float]] = ExpiringMap(
            n, HANDOVER, clock
        )
        self.created_ids: ExpiringMap[str, tuple[str, bytes]] = ExpiringMap(n, HANDOVER, clock)
        # group_snapshot_id -> when DeleteVolumeGroupSnapshot answered OK for it; only for a
        # lease, as another replica may re-create a group under the same id later.
        self.deleted_groups: ExpiringMap[str, float] = ExpiringMap(n, HANDOVER, clock)


def _mem(st: SpecState) -> SnapshotMemory:
    return st.part(SnapshotMemory)


def _same_id(
    cs: CompiledSpec, mem: SnapshotMemory, rpc: str, req: Any, made: str, field_name: str
) -> Iterable[Violation]:
    """An identical repeat of a successful create returns the id the first one did."""
    if not made or not req.name:
        return
    key = (rpc, digest(req.SerializeToString(deterministic=True)))
    now = mem.clock()
    prev = mem.created.get(key)
    # A delete finds the create by its id: with that dropped to make room, one may be missed.
    if prev is not None and prev[0] != made and not mem.created_ids.dropped_after(prev[1]):
        yield Violation(
            cs.rule("create-not-idempotent"),
            field_name,
            f"{rpc} repeated with the same name and arguments returned another {field_name}"
            f" than it did {ago(now - prev[1])}, and no delete of that one was seen since",
        )
        mem.created_ids.pop(prev[0], None)
    mem.created[key] = (made, now)
    mem.created_ids[made] = key


def _forget_created(mem: SnapshotMemory, made: str) -> None:
    """A delete of ``made`` was sent: a create with the same name may make a new one."""
    key = mem.created_ids.pop(made, None)
    if key is not None:
        mem.created.pop(key, None)


# -- rules --------------------------------------------------------------------------------


def _rules(title: str, v1: bool) -> tuple[Rule, ...]:
    rules = [
        Rule(
            "csi.snapshot-missing",
            MUST,
            (PLUGIN,),
            f"{title} §DeleteVolume, §ListSnapshots",
            "A snapshot the plugin reported within the last 15 s, with no delete of it sent"
            " since, is missing from a ListSnapshots filtered by its snapshot_id, or is refused"
            " as a CreateVolume source with NOT_FOUND.",
            reject_code=None,
            note="A snapshot outlives its volume's deletion, stays usable as a source and is"
            " listed (§DeleteVolume), and a listing holds every snapshot its filters match"
            " (§ListSnapshots). Judged only within a leader-election lease of the last answer"
            f" reporting the snapshot ({HANDOVER:.0f} s): later, another replica may have"
            " deleted it. A listing also filtered by source_volume_id, or paged, is not judged.",
        ),
    ]
    if v1:
        rules += [
            Rule(
                "csi.snapshot-lost",
                MUST,
                (PLUGIN,),
                f"{title} §GetSnapshot",
                "GetSnapshot answers NOT_FOUND for a snapshot created, not yet ready and not"
                " deleted on this socket.",
                reject_code=None,
                note='"Snapshots which were recently created and not yet ready to use must be'
                f' retrievable" (lower case in the text): judged for {SNAPSHOT_RECENT:.0f} s'
                " after the create, while the last answer said not ready; a DeleteSnapshot or"
                " DeleteVolumeGroupSnapshot request seen for it ends the judgement.",
            ),
            Rule(
                "csi.delete-group-member",
                MUST,
                (CO,),
                f"{title} §DeleteSnapshot",
                "DeleteSnapshot of a snapshot the plugin returned with a non-empty"
                " group_snapshot_id.",
                reject_code=None,
                note="The CO SHALL NOT; such a snapshot is deleted with its group"
                " (DeleteVolumeGroupSnapshot). The plugin's INVALID_ARGUMENT for it is the"
                " answer; a retry after it is this rule again, or csi.retry-without-change"
                " when identical.",
            ),
            Rule(
                "csi.deleted-group-answered",
                SHOULD,
                (PLUGIN,),
                f"{title} §GetVolumeGroupSnapshot",
                "GetVolumeGroupSnapshot answered OK for a group snapshot whose"
                " DeleteVolumeGroupSnapshot answered OK within the last 15 s (a group that no"
                " longer exists should get NOT_FOUND).",
                reject_code=None,
                note="Lower case in the text. Judged only within a leader-election lease of the"
                " delete: later, another replica may have created a group that got the same id"
                " (plugins often derive ids from names); a create answering the id ends it.",
            ),
            Rule(
                "csi.group-id-mismatch",
                MUST,
                (CO,),
                f"{title} §The ready to use Parameter",
                "GetVolumeGroupSnapshot or DeleteVolumeGroupSnapshot names in snapshot_ids a"
                " snapshot the plugin returned with another group_snapshot_id, or created"
                " alone by CreateSnapshot (an independent snapshot).",
                reject_code=None,
                note="Snapshot.group_snapshot_id: the CO MUST use it in later group operations"
                " to say which group a snapshot belongs to, and SHALL treat a snapshot without"
                " one as independent. A snapshot's group never changes, so the memory of it"
                " holds for the hour like the other snapshot memory; the plugin's INVALID_ARGUMENT"
                " is the answer the table gives.",
            ),
        ]
    return tuple(rules)


# -- checks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotChecks:
    """The family's checks, bound to one CSI version."""

    v1: bool
    snapshot_id: str  # Snapshot's id field and VolumeContentSource.SnapshotSource's

    # -- snapshots ----------------------------------------------------------------------

    def _remember_snapshot(self, mem: SnapshotMemory, snap: Any, rpc: str, created: bool) -> None:
        sid = getattr(snap, self.snapshot_id)
        if not sid:
            return
        now = mem.clock()
        prev = mem.snapshots.get(sid)
        group = snap.group_snapshot_id if self.v1 else ""
        ready = snap.ready_to_use if self.v1 else None
        if prev is None:
            mem.snapshots[sid] = Snapshot(
                snap.size_bytes, group, rpc, now, now if created else None, ready, now
            )
            return
        prev.seen = now
        prev.size = snap.size_bytes or prev.size
        prev.group = group or prev.group
        prev.ready = ready
        if created and prev.created_at is None:
            prev.created_at = now
        mem.snapshots[sid] = prev

    def create_snapshot_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if not resp.HasField("snapshot"):
            return
        mem = _mem(st)
        self._remember_snapshot(mem, resp.snapshot, "CreateSnapshot", True)
        sid = getattr(resp.snapshot, self.snapshot_id)
        yield from _same_id(cs, mem, "CreateSnapshot", req, sid, f"snapshot.{self.snapshot_id}")

    def get_snapshot_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if resp.HasField("snapshot"):
            self._remember_snapshot(_mem(st), resp.snapshot, "GetSnapshot", False)
        return ()

    def list_snapshots_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        if req.snapshot_id:
            call.stage_state[_ASKED] = _mem(st).clock()
        return ()

    def list_snapshots_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        if (
            req.snapshot_id
            and not req.source_volume_id
            and not req.starting_token
            and list_length(call, resp, "entries") == 0
        ):
            yield from self._snapshot_missing(
                cs,
                mem,
                call,
                req.snapshot_id,
                "ListSnapshots filtered by its snapshot_id answered no entry",
            )
        for entry in resp.entries:
            if entry.HasField("snapshot"):
                self._remember_snapshot(mem, entry.snapshot, "ListSnapshots", False)

    def _snapshot_missing(
        self, cs: CompiledSpec, mem: SnapshotMemory, call: Call, sid: str, what: str
    ) -> Iterable[Violation]:
        """A snapshot the plugin reported moments ago, before the request came, and no
        delete of it was sent since."""
        snap = mem.snapshots.get(sid)
        now = mem.clock()
        asked = call.stage_state.get(_ASKED)
        if snap is None or asked is None or snap.at > asked or now - snap.seen > HANDOVER:
            return
        yield Violation(
            cs.rule("snapshot-missing"),
            "",
            f"{what}, but {snap.rpc} reported the snapshot {ago(now - snap.at)} (last seen"
            f" {ago(now - snap.seen)}) and no delete of it was sent since",
            party=PLUGIN,
        )

    def create_volume_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code != "NOT_FOUND" or not req.HasField("volume_content_source"):
            return
        source = req.volume_content_source
        if source.HasField("snapshot"):
            sid = getattr(source.snapshot, self.snapshot_id)
            yield from self._snapshot_missing(
                cs, _mem(st), call, sid, "CreateVolume from the snapshot answered NOT_FOUND"
            )

    def create_volume_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        if req.HasField("volume_content_source"):
            call.stage_state[_ASKED] = _mem(st).clock()  # a snapshot seen after is not judged
        return ()

    def delete_snapshot_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        # Whatever the answer, the snapshot may be gone: judged no more.
        snap = mem.snapshots.pop(req.snapshot_id, None)
        _forget_created(mem, req.snapshot_id)
        if self.v1 and snap is not None and snap.group:
            yield Violation(
                cs.rule("delete-group-member"),
                "snapshot_id",
                f"DeleteSnapshot of a snapshot {snap.rpc} returned {ago(mem.clock() - snap.at)}"
                " with a group_snapshot_id: it is deleted with its group"
                " (DeleteVolumeGroupSnapshot)",
            )

    def get_snapshot_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code != "NOT_FOUND":
            return
        mem = _mem(st)
        snap = mem.snapshots.get(req.snapshot_id)
        if snap is None or snap.created_at is None or snap.ready is not False:
            return
        age = mem.clock() - snap.created_at
        if age > SNAPSHOT_RECENT:
            return
        yield Violation(
            cs.rule("snapshot-lost"),
            "snapshot_id",
            f"GetSnapshot answered NOT_FOUND for a snapshot {snap.rpc} returned {ago(age)},"
            " not yet ready to use and not deleted through this socket; recently created"
            " snapshots must be retrievable",
            party=PLUGIN,
        )

    # -- group snapshots ----------------------------------------------------------------

    def _group_members(self, mem: SnapshotMemory, group: Any, rpc: str, created: bool) -> None:
        for snap in group.snapshots:
            self._remember_snapshot(mem, snap, rpc, created)

    def create_group_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if not resp.HasField("group_snapshot"):
            return ()
        mem = _mem(st)
        group = resp.group_snapshot
        self._group_members(mem, group, "CreateVolumeGroupSnapshot", True)
        gid = group.group_snapshot_id
        mem.deleted_groups.pop(gid, None)
        out = list(
            _same_id(
                cs, mem, "CreateVolumeGroupSnapshot", req, gid, "group_snapshot.group_snapshot_id"
            )
        )
        known = mem.groups.get(gid) if gid else None
        if known is not None and map_digest(req.secrets) != known.secrets:
            # A create repeated for the group (polling until it is ready) is an operation on
            # it as well; the request names no group id, so it is compared here.
            out.append(
                Violation(
                    cs.rule("secrets-changed"),
                    "secrets",
                    f"secrets differ from those {known.rpc} passed for this group snapshot"
                    f" {ago(mem.clock() - known.at)} (compared as digests); they SHOULD be the"
                    " same for all operations on it",
                    party=CO,
                )
            )
        elif gid and known is None:
            mem.groups[gid] = _Group(
                map_digest(req.secrets),
                "CreateVolumeGroupSnapshot",
                mem.clock(),
                tuple(s.snapshot_id for s in group.snapshots),
            )
        return out

    def group_deleted(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        if req.group_snapshot_id:
            mem = _mem(st)
            mem.deleted_groups[req.group_snapshot_id] = mem.clock()

    def get_group_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        gone = mem.deleted_groups.get(req.group_snapshot_id)
        if gone is not None:
            return (
                Violation(
                    cs.rule("deleted-group-answered"),
                    "",
                    "GetVolumeGroupSnapshot answered OK for a group snapshot"
                    f" DeleteVolumeGroupSnapshot deleted {ago(mem.clock() - gone)}; a group"
                    " that no longer exists should get NOT_FOUND",
                ),
            )
        if not resp.HasField("group_snapshot"):
            return ()
        group = resp.group_snapshot
        self._group_members(mem, group, "GetVolumeGroupSnapshot", False)
        gid = req.group_snapshot_id
        if gid and gid not in mem.groups:
            mem.groups[gid] = _Group(
                map_digest(req.secrets),
                "GetVolumeGroupSnapshot",
                mem.clock(),
                tuple(s.snapshot_id for s in group.snapshots),
            )
        return ()

    def _group_secrets(
        self, cs: CompiledSpec, mem: SnapshotMemory, req: Any
    ) -> Iterable[Violation]:
        group = mem.groups.get(req.group_snapshot_id)
        if group is not None and map_digest(req.secrets) != group.secrets:
            yield Violation(
                cs.rule("secrets-changed"),
                "secrets",
                f"secrets differ from those {group.rpc} passed for this group snapshot"
                f" {ago(mem.clock() - group.at)} (compared as digests); they SHOULD be the"
                " same for all operations on it",
            )

    def _group_ids(self, cs: CompiledSpec, mem: SnapshotMemory, req: Any) -> Iterable[Violation]:
        """snapshot_ids of a group operation name members of that group only."""
        gid = req.group_snapshot_id
        for i, sid in enumerate(req.snapshot_ids):
            snap = mem.snapshots.get(sid)
            if snap is None:
                continue
            if snap.group and snap.group != gid:
                why = "with another group_snapshot_id"
            elif not snap.group and snap.rpc == "CreateSnapshot":
                why = "from CreateSnapshot, without a group_snapshot_id (an independent snapshot)"
            else:
                continue
            yield Violation(
                cs.rule("group-id-mismatch"),
                f"snapshot_ids[{i}]",
                f"snapshot_ids[{i}] names a snapshot {snap.rpc} returned"
                f" {ago(mem.clock() - snap.at)} {why}; a group operation names its own"
                " group's snapshots",
            )
            return

    def get_group_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        yield from self._group_secrets(cs, mem, req)
        yield from self._group_ids(cs, mem, req)

    def delete_group_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        yield from self.get_group_request(cs, st, call, req)  # judged as any group operation
        mem = _mem(st)
        # The group goes with its members, whatever the answer: judged no more.
        group = mem.groups.pop(req.group_snapshot_id, None)
        _forget_created(mem, req.group_snapshot_id)
        for sid in (*req.snapshot_ids, *(group.members if group is not None else ())):
            mem.snapshots.pop(sid, None)
            _forget_created(mem, sid)
        if req.group_snapshot_id:
            call.stage_state[_GROUP] = group or _Group(
                map_digest(req.secrets), "DeleteVolumeGroupSnapshot", mem.clock(), ()
            )

    def delete_group_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        # A refused delete (in use, a transport error) leaves the group there: its secrets
        # stay the ones a retry is compared with. NOT_FOUND says it is gone.
        group = call.stage_state.get(_GROUP)
        mem = _mem(st)
        gid = req.group_snapshot_id
        if isinstance(group, _Group) and code != "NOT_FOUND" and gid not in mem.groups:
            mem.groups[gid] = group
        return ()


def hooks(title: str, v1: bool) -> Hooks:
    """The family's rules and checks for the CSI version cited as ``title`` (group
    snapshots and GetSnapshot are CSI v1's)."""
    c = SnapshotChecks(v1, "snapshot_id" if v1 else "id")
    return Hooks(
        rules=_rules(title, v1),
        request_checks={
            "CreateVolume": (c.create_volume_request,),
            "ListSnapshots": (c.list_snapshots_request,),
            "DeleteSnapshot": (c.delete_snapshot_request,),
            **(
                {
                    "GetVolumeGroupSnapshot": (c.get_group_request,),
                    "DeleteVolumeGroupSnapshot": (c.delete_group_request,),
                }
                if v1
                else {}
            ),
        },
        response_checks={
            "CreateSnapshot": (c.create_snapshot_response,),
            "ListSnapshots": (c.list_snapshots_response,),
            **(
                {
                    "GetSnapshot": (c.get_snapshot_response,),
                    "CreateVolumeGroupSnapshot": (c.create_group_response,),
                    "GetVolumeGroupSnapshot": (c.get_group_response,),
                }
                if v1
                else {}
            ),
        },
        on_success={"DeleteVolumeGroupSnapshot": (c.group_deleted,)} if v1 else {},
        on_error={
            "CreateVolume": (c.create_volume_error,),
            **(
                {
                    "GetSnapshot": (c.get_snapshot_error,),
                    "DeleteVolumeGroupSnapshot": (c.delete_group_error,),
                }
                if v1
                else {}
            ),
        },
    )
