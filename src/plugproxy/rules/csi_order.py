"""CSI call order and publication answers judged from this socket's own history (CSI v1.12
and v0.3).

- Node side: NodePublishVolume with a staging_target_path after the plugin refused a
  NodePublishVolume of the volume for want of one (FAILED_PRECONDITION) and no
  NodeStageVolume of that volume and path succeeded since; NodePublishVolume for a
  (volume, staging path) whose last NodeStageVolume here failed. A node socket sees every
  NodeStageVolume of its node (kubelet has no other way to the plugin), so what it saw since
  is all there was; what came before the proxy started is unknown and never judged.
- Unified socket (controller and node): NodeStageVolume or NodePublishVolume of a volume
  created here on the node NodeGetInfo named here, with no ControllerPublishVolume to that
  node answered OK (and not undone) since, while the controller advertises
  PUBLISH_UNPUBLISH_VOLUME.
- ControllerUnpublishVolume of a volume not published to the node answered with an error.
- ControllerPublishVolume retried after FAILED_PRECONDITION (published elsewhere) or
  RESOURCE_EXHAUSTED (node full) with no unpublish seen since.
- A FAILED_PRECONDITION to ControllerPublishVolume whose message does not name the node
  this socket saw the volume published to.

HA controllers: another replica's sidecar may publish, unpublish or delete through its own
socket, but only as leader, and a leader-election lease (:data:`HANDOVER`) must lapse before
a replica takes over. The controller-side checks therefore judge only while the calls of the
sidecar concerned (external-attacher: ControllerPublish/Unpublish; external-provisioner:
CreateVolume/DeleteVolume) came through this socket without a gap of a lease since the
memory they rely on was made (:class:`_Run`): no other replica can have led meanwhile.
Everything here is reported, never enforced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import HANDOVER, ExpiringMap, ago
from plugproxy.rules.csi_common import staging_path_missing
from plugproxy.rules.engine import CO, MUST, PLUGIN, SHOULD, Hooks, Rule, Violation

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState

MAX_NODES = 256  # publications and refusals kept per volume (oldest dropped)
_STAGE_JUDGED = "csi_order.stage"  # call.stage_state: NodeStageVolume found out of order
# Answers to ControllerUnpublishVolume that say nothing of the attachment: the general rows
# of §Error Scheme (a bad or unauthorised request, an operation pending) and transient codes.
_UNPUBLISH_NOT_JUDGED = frozenset(
    {
        "INVALID_ARGUMENT",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "ABORTED",
        "UNIMPLEMENTED",
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
        "CANCELLED",
        "DEADLINE_EXCEEDED",
    }
)


def _norm(path: str) -> str:
    return path.rstrip("/") or path


def complete(req: Any, path: str) -> bool:
    """Whether a node request carries volume_id, ``path`` and volume_capability."""
    return bool(req.volume_id and getattr(req, path) and req.HasField("volume_capability"))


def _single_node(capability: Any) -> bool:
    if not capability.HasField("access_mode"):
        return False
    mode = capability.access_mode
    value = mode.DESCRIPTOR.fields_by_name["mode"].enum_type.values_by_number.get(mode.mode)
    return value is not None and value.name.startswith("SINGLE_NODE")


def _trim(entries: dict[str, float]) -> None:
    while len(entries) > MAX_NODES:
        del entries[next(iter(entries))]


@dataclass(slots=True)
class _Run:
    """One sidecar's calls on this socket: when its latest unbroken run began and its last
    call. Gaps shorter than a lease mean no other replica can have led in between. Whether
    the call being judged was marked yet makes no difference to :meth:`covers`."""

    start: float = float("-inf")
    last: float = float("-inf")

    def mark(self, now: float) -> None:
        if now - self.last > HANDOVER:
            self.start = now
        self.last = now

    def covers(self, since: float, now: float) -> bool:
        """Whether this socket's sidecar led without a break from ``since`` until ``now``."""
        return self.start <= since and now - self.last <= HANDOVER


@dataclass(slots=True)
class _Volume:
    """A volume seen created or published through this socket, and its publications here."""

    created_at: float | None  # when CreateVolume returned it here (None: not seen)
    published: dict[str, float] = field(default_factory=dict)  # node -> publish answered OK
    # node -> when it was last known unpublished from that node ("" key: from all nodes)
    unpublished: dict[str, float] = field(default_factory=dict)


def _full(vol: _Volume) -> bool:
    """Whether ``vol`` may have dropped a publication (the node asked about, perhaps)."""
    return len(vol.published) >= MAX_NODES


def _unpublished_since(created: float, vol: _Volume, node: str) -> tuple[float, str]:
    """Since when ``vol``, created at ``created``, is known not published to ``node`` (it
    is not now), and how: its creation, or the latest unpublish from that node or from all
    nodes."""
    gone = [t for t in (vol.unpublished.get(node), vol.unpublished.get("")) if t is not None]
    if not gone:
        return created, "created"
    return max(created, *gone), "unpublished"


@dataclass(slots=True)
class _Stage:
    """The last NodeStageVolume outcome of one (volume, staging path) on this socket."""

    ok: bool  # answered OK (False: failed, or undone by NodeUnstageVolume)
    by: str  # what made it so
    at: float


class OrderState:
    """What this family remembers per spec table; bounded and expiring like the lifecycle."""

    def __init__(self, st: SpecState) -> None:
        n, ttl, clock = st.max_volumes, st.lifecycle_ttl, st.clock
        self.clock = clock
        self.stages: ExpiringMap[tuple[str, str], _Stage] = ExpiringMap(n, ttl, clock)
        # volume -> when the plugin refused a NodePublishVolume without staging path with
        # FAILED_PRECONDITION (the "staging target path not set" row)
        self.unstaged_refusals: ExpiringMap[str, float] = ExpiringMap(n, ttl, clock)
        self.volumes: ExpiringMap[str, _Volume] = ExpiringMap(n, ttl, clock)
        self.attacher = _Run()  # ControllerPublishVolume / ControllerUnpublishVolume
        self.provisioner = _Run()  # CreateVolume / DeleteVolume
        # node -> when a ControllerPublishVolume to it was answered OK (the node exists)
        self.nodes: ExpiringMap[str, float] = ExpiringMap(n, ttl, clock)
        # ControllerPublishVolume refusals awaiting an unpublish: volume -> node -> when
        # (FAILED_PRECONDITION), node -> volume -> when (RESOURCE_EXHAUSTED)
        self.elsewhere: ExpiringMap[str, dict[str, float]] = ExpiringMap(n, ttl, clock)
        self.full: ExpiringMap[str, dict[str, float]] = ExpiringMap(n, ttl, clock)


def _mem(st: SpecState) -> OrderState:
    return st.part(OrderState)


def _rules(title: str) -> tuple[Rule, ...]:
    rules: list[Rule] = []
    lease = f"{HANDOVER:.0f} s"
    rules.append(
        Rule(
            "csi.unpublish-not-published-refused",
            MUST,
            (PLUGIN,),
            f"{title} §ControllerUnpublishVolume",
            "ControllerUnpublishVolume of a volume this socket knows is not published to the"
            " node (created here and never published to it, or unpublished from it since)"
            " answered with an error; it MUST answer OK.",
            reject_code=None,
            note="Judged while the external-attacher's calls (ControllerPublish/Unpublish)"
            f" came through this socket with no gap of a lease ({lease}) since the volume was"
            " created or unpublished: no other replica can have published it meanwhile. Codes"
            " that say nothing of the attachment are not judged: INVALID_ARGUMENT,"
            " PERMISSION_DENIED, UNAUTHENTICATED, ABORTED, UNIMPLEMENTED and the transient"
            " ones (UNAVAILABLE, RESOURCE_EXHAUSTED, CANCELLED, DEADLINE_EXCEEDED). NOT_FOUND"
            " is a tabled answer when the volume or the node does not exist: judged only when"
            " the node is this socket's own (NodeGetInfo) or had a publish answered OK within"
            f" {lease}, and the external-provisioner's calls (CreateVolume/DeleteVolume) came"
            " through this socket unbroken since the volume's creation (no delete elsewhere).",
        )
    )
    rules.append(
        Rule(
            "csi.publish-retry-unresolved",
            SHOULD,
            (CO,),
            f"{title} §ControllerPublishVolume",
            "ControllerPublishVolume retried after FAILED_PRECONDITION (published to another"
            " node) with no unpublish of the volume from another node seen since, or after"
            " RESOURCE_EXHAUSTED (node full) with no unpublish from that node and no other"
            " publish to it answered OK since.",
            reject_code=None,
            note="Advisory, for both rows: the CO may learn by other means that the volume or"
            " a slot was freed (a detach outside CSI); a ControllerGetVolume answer showing the"
            " volume published to no other node counts as the CO's check. Judged only while the"
            " external-attacher's calls came through this socket with no gap of a lease"
            f" ({lease}) since the refusal, so no other replica can have unpublished"
            " meanwhile.",
        )
    )
    rules.append(
        Rule(
            "csi.publish-conflict-node-unnamed",
            SHOULD,
            (PLUGIN,),
            f"{title} §ControllerPublishVolume",
            "ControllerPublishVolume with a single-node access mode answered"
            " FAILED_PRECONDITION while this socket saw the volume published to another node,"
            " and the status message does not name that node.",
            reject_code=None,
            note="The node ids compared are those this socket saw published and not undone,"
            f" within a lease ({lease}) of the publish or while the external-attacher's"
            " calls came through this socket unbroken since it. The message is searched,"
            " never quoted.",
        )
    )
    return tuple(rules)


@dataclass(frozen=True)
class OrderChecks:
    """The family's checks; ``volume_field``: Volume's id field (v1 volume_id, v0 id)."""

    volume_field: str

    # -- node side: NodePublishVolume after a refusal or a failed NodeStageVolume ------

    def staged(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        if req.volume_id:
            mem = _mem(st)
            key = (req.volume_id, _norm(req.staging_target_path))
            mem.stages[key] = _Stage(True, "NodeStageVolume", mem.clock())

    def stage_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        # A call cut short may have staged the volume: its outcome is unknown.
        if req.volume_id and code not in ("CANCELLED", "DEADLINE_EXCEEDED"):
            mem = _mem(st)
            key = (req.volume_id, _norm(req.staging_target_path))
            mem.stages[key] = _Stage(False, f"NodeStageVolume answered {code}", mem.clock())
        return ()

    def unstaged(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        if req.volume_id:
            mem = _mem(st)
            key = (req.volume_id, _norm(req.staging_target_path))
            mem.stages[key] = _Stage(False, "NodeUnstageVolume", mem.clock())

    def node_publish_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        vid, path = req.volume_id, req.staging_target_path
        if not path or not complete(req, "target_path"):
            # No staging: nothing to judge (inline ephemeral volumes, no STAGE_UNSTAGE);
            # a request without its REQUIRED fields is reported as such.
            return
        mem = _mem(st)
        now = mem.clock()
        stage = mem.stages.get((vid, _norm(path)))
        refused = mem.unstaged_refusals.pop(vid, None)
        if stage is not None and stage.ok:
            return
        if stage is not None and stage.by.startswith("NodeStageVolume"):
            yield Violation(
                cs.rule("call-order"),
                "staging_target_path",
                "NodePublishVolume at a staging_target_path whose last NodeStageVolume here"
                f" failed ({stage.by} {ago(now - stage.at)}) with none answered OK since; the"
                " volume MUST be staged successfully first",
                enforceable=False,
            )
        elif refused is not None and not (stage is None and mem.stages.dropped_after(refused)):
            # (a stage answered OK since may have been dropped to make room)
            yield Violation(
                cs.rule("call-order"),
                "staging_target_path",
                "NodePublishVolume retried with a staging_target_path after the plugin"
                " answered FAILED_PRECONDITION (staging target path not set)"
                f" {ago(now - refused)}, with no NodeStageVolume of the volume at that path"
                " answered OK since; the CO MUST stage it successfully before retrying",
                enforceable=False,
            )

    def node_published(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        """The plugin published from a staging path: the volume is staged there."""
        vid, path = req.volume_id, req.staging_target_path
        if vid and path:
            mem = _mem(st)
            key = (vid, _norm(path))
            stage = mem.stages.get(key)
            if stage is None or not stage.ok:
                mem.stages[key] = _Stage(True, "NodePublishVolume", mem.clock())

    def node_publish_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        # The "staging target path not set" row: STAGE_UNSTAGE_VOLUME advertised, no path.
        if code == "FAILED_PRECONDITION" and req.volume_id and staging_path_missing(st, req):
            mem = _mem(st)
            mem.unstaged_refusals[req.volume_id] = mem.clock()
        return ()

    # -- controller side: volumes and publications seen here ---------------------------

    def created(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        vid = getattr(resp.volume, self.volume_field) if resp is not None else ""
        mem = _mem(st)
        # An idempotent repeat keeps what is known; a volume published here before its
        # creation answered here was created elsewhere first.
        if vid and vid not in mem.volumes:
            mem.volumes[vid] = _Volume(mem.clock())

    def deleted(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        _mem(st).volumes.pop(req.volume_id, None)

    def delete_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code == "NOT_FOUND":
            self.deleted(st, call, req, None)
        return ()

    def attacher_call(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        mem.attacher.mark(mem.clock())
        return ()

    def published(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        vid, node = req.volume_id, req.node_id
        if not vid or not node:
            return
        mem = _mem(st)
        vol = mem.volumes.get(vid)
        if vol is None:
            vol = mem.volumes[vid] = _Volume(None)
        vol.published.pop(node, None)
        vol.published[node] = mem.clock()
        _trim(vol.published)

    def unpublished(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        vid, node = req.volume_id, req.node_id
        mem = _mem(st)
        vol = mem.volumes.get(vid)
        if vol is None:
            return
        if node:
            vol.published.pop(node, None)
        else:
            vol.published.clear()
        vol.unpublished.pop(node, None)
        vol.unpublished[node] = mem.clock()
        _trim(vol.unpublished)

    def unpublish_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code == "NOT_FOUND":  # tabled: the volume stays unpublished either way
            self.unpublished(st, call, req, None)
        return ()

    # -- NodeStageVolume before ControllerPublishVolume (unified socket) ---------------

    def stage_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        """NodeStageVolume, or NodePublishVolume (whatever the staging), of a volume not
        ControllerPublished to this node."""
        node = st.node_id
        rpc = call.method.name
        path = "staging_target_path" if rpc == "NodeStageVolume" else "target_path"
        # A request without its REQUIRED fields (csi-sanity's negative cases) is reported as
        # such and refused by the plugin: no order judged on it.
        if node is None or not complete(req, path):
            return
        mem = _mem(st)
        vol = mem.volumes.get(req.volume_id)
        if vol is None or vol.created_at is None or node in vol.published or _full(vol):
            return
        created = vol.created_at
        controller = st.known_capabilities("controller")
        if controller is None or "PUBLISH_UNPUBLISH_VOLUME" not in controller:
            return
        now = mem.clock()
        since, how = _unpublished_since(created, vol, node)
        if not mem.attacher.covers(since, now):
            return  # the publish may have passed through another replica
        call.stage_state[_STAGE_JUDGED] = True
        how = (
            f"unpublished from this node {ago(now - since)}"
            if how == "unpublished"
            else f"CreateVolume returned it {ago(now - since)}, never published to this node"
        )
        yield Violation(
            cs.rule("call-order"),
            "volume_id",
            f"{rpc} of a volume not ControllerPublished to this node ({how}), while"
            " the controller advertises PUBLISH_UNPUBLISH_VOLUME and ControllerPublishVolume"
            " calls pass through this socket; it MUST follow a successful"
            " ControllerPublishVolume",
            enforceable=False,
        )

    # -- ControllerUnpublishVolume of a volume not published to the node ---------------

    def provisioner_call(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        mem.provisioner.mark(mem.clock())
        return ()

    def node_exists(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        if req.node_id:
            mem = _mem(st)
            mem.nodes[req.node_id] = mem.clock()

    def unpublish_refused(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        vid, node = req.volume_id, req.node_id
        mem = _mem(st)
        vol = mem.volumes.get(vid)
        if vol is None or not node or code in _UNPUBLISH_NOT_JUDGED:
            return
        created = vol.created_at
        if created is None or node in vol.published or _full(vol):
            return
        now = mem.clock()
        since, how = _unpublished_since(created, vol, node)
        if not mem.attacher.covers(since, now):
            return  # another replica may have published it meanwhile
        if code == "NOT_FOUND":
            seen = mem.nodes.get(node)
            node_known = node == st.node_id or (seen is not None and now - seen <= HANDOVER)
            if not node_known or not mem.provisioner.covers(created, now):
                return  # the node or the volume may be gone: NOT_FOUND is tabled then
        how = (
            f"unpublished from it {ago(now - since)}"
            if how == "unpublished"
            else f"never published to it since CreateVolume returned it {ago(now - since)}"
        )
        yield Violation(
            cs.rule("unpublish-not-published-refused"),
            "",
            f"ControllerUnpublishVolume answered {code} for a volume not published to the node"
            f" ({how}, as this socket saw); the plugin MUST answer OK",
            party=PLUGIN,
        )

    # -- ControllerPublishVolume retried without the cause removed ---------------------

    def retry_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        now = mem.clock()
        vid, node = req.volume_id, req.node_id
        refused = mem.elsewhere.get(vid)
        at = refused.get(node) if refused else None
        if at is not None and mem.attacher.covers(at, now):
            yield Violation(
                cs.rule("publish-retry-unresolved"),
                "volume_id",
                "ControllerPublishVolume retried after the plugin answered FAILED_PRECONDITION"
                f" (published to another node) {ago(now - at)}, with no unpublish of the"
                " volume from another node seen since; the CO SHOULD ensure it is not"
                " published elsewhere before retrying",
            )
            return
        full = mem.full.get(node)
        at = full.get(vid) if full else None
        if at is not None and mem.attacher.covers(at, now):
            yield Violation(
                cs.rule("publish-retry-unresolved"),
                "node_id",
                "ControllerPublishVolume retried after the plugin answered RESOURCE_EXHAUSTED"
                f" (max volumes attached to the node) {ago(now - at)}, with no unpublish"
                " from that node nor other publish to it answered OK seen since; the CO"
                " must ensure a slot is free before retrying",
            )

    def publish_refused(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        vid, node = req.volume_id, req.node_id
        if not vid or not node or code not in ("FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"):
            return ()
        mem = _mem(st)
        table, key, sub = (
            (mem.elsewhere, vid, node) if code == "FAILED_PRECONDITION" else (mem.full, node, vid)
        )
        entries = table.get(key) or {}
        entries[sub] = mem.clock()
        _trim(entries)
        table[key] = entries
        return ()

    def retry_published(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        mem = _mem(st)
        refused = mem.elsewhere.get(req.volume_id)
        if refused is not None:
            refused.pop(req.node_id, None)
        mem.full.pop(req.node_id, None)  # a slot was free after all

    def retry_unpublished(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        mem = _mem(st)
        node = req.node_id
        refused = mem.elsewhere.get(req.volume_id)
        if refused is not None:  # unpublished elsewhere: a retry may succeed now
            for other in [n for n in refused if not node or n != node]:
                del refused[other]
        if node:
            mem.full.pop(node, None)
        else:  # from every node it was on, which this socket may not know: forget all
            mem.full.clear()

    def retry_unpublish_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code == "NOT_FOUND":  # tabled: nothing stays published there
            self.retry_unpublished(st, call, req, None)
        return ()

    def retry_checked(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        """ControllerGetVolume (v1.12) told the CO where the volume is published: a volume
        published to no other node than a refused one was ensured free for it."""
        refused = _mem(st).elsewhere.get(req.volume_id)
        if refused and resp.HasField("status"):
            nodes = set(resp.status.published_node_ids)
            for node in [n for n in refused if not nodes - {n}]:
                del refused[node]
        return ()

    # -- FAILED_PRECONDITION naming the node the volume is published at ----------------

    def conflict_message(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        vid, node = req.volume_id, req.node_id
        if code != "FAILED_PRECONDITION" or not _single_node(req.volume_capability):
            return
        mem = _mem(st)
        vol = mem.volumes.get(vid)
        if vol is None:
            return
        now = mem.clock()
        others = [
            other
            for other, at in vol.published.items()
            if other != node and (now - at <= HANDOVER or mem.attacher.covers(at, now))
        ]
        if others and not any(other in call.details for other in others):
            yield Violation(
                cs.rule("publish-conflict-node-unnamed"),
                "",
                "FAILED_PRECONDITION for a volume this socket saw published to"
                f" {len(others)} other node(s) and not unpublished, but the status message"
                " names none of them; it SHOULD name the node the volume is published at",
                party=PLUGIN,
            )


def stage_judged(call: Call) -> bool:
    """Whether this family already reported the NodeStageVolume or NodePublishVolume
    ``call`` out of order (before ControllerPublishVolume)."""
    return bool(call.stage_state.get(_STAGE_JUDGED))


def _join(*parts: Hooks) -> Hooks:
    """One family of ``parts``; per RPC, their checks run in the order given."""

    def each(name: str) -> dict[str, tuple[Any, ...]]:
        out: dict[str, tuple[Any, ...]] = {}
        for part in parts:
            table: Mapping[str, tuple[Any, ...]] = getattr(part, name)
            for rpc, checks in table.items():
                out[rpc] = out.get(rpc, ()) + checks
        return out

    return Hooks(
        rules=tuple(r for part in parts for r in part.rules),
        request_checks=each("request_checks"),
        response_checks=each("response_checks"),
        on_success=each("on_success"),
        on_error=each("on_error"),
    )


def hooks(title: str, v1: bool) -> Hooks:
    """The family's rules and checks for the CSI version cited as ``title``."""
    c = OrderChecks("volume_id" if v1 else "id")
    parts = [
        Hooks(
            rules=_rules(title),
            request_checks={"NodePublishVolume": (c.node_publish_request,)},
            on_success={
                "NodeStageVolume": (c.staged,),
                "NodeUnstageVolume": (c.unstaged,),
                "NodePublishVolume": (c.node_published,),
            },
            on_error={
                "NodeStageVolume": (c.stage_error,),
                "NodePublishVolume": (c.node_publish_error,),
            },
        ),
        Hooks(
            request_checks={
                "CreateVolume": (c.provisioner_call,),
                "DeleteVolume": (c.provisioner_call,),
            },
            on_success={"ControllerPublishVolume": (c.node_exists,)},
            # before the memory of publications learns from a NOT_FOUND (below)
            on_error={"ControllerUnpublishVolume": (c.unpublish_refused,)},
        ),
        Hooks(
            request_checks={"ControllerPublishVolume": (c.retry_request,)},
            response_checks={"ControllerGetVolume": (c.retry_checked,)} if v1 else {},
            on_success={
                "ControllerPublishVolume": (c.retry_published,),
                "ControllerUnpublishVolume": (c.retry_unpublished,),
            },
            on_error={
                "ControllerPublishVolume": (c.publish_refused,),
                "ControllerUnpublishVolume": (c.retry_unpublish_error,),
            },
        ),
        Hooks(on_error={"ControllerPublishVolume": (c.conflict_message,)}),
        Hooks(
            request_checks={
                "ControllerPublishVolume": (c.attacher_call,),
                "ControllerUnpublishVolume": (c.attacher_call,),
                "NodeStageVolume": (c.stage_request,),
                "NodePublishVolume": (c.stage_request,),
            },
            on_success={
                "CreateVolume": (c.created,),
                "DeleteVolume": (c.deleted,),
                "ControllerPublishVolume": (c.published,),
                "ControllerUnpublishVolume": (c.unpublished,),
            },
            on_error={
                "DeleteVolume": (c.delete_error,),
                "ControllerUnpublishVolume": (c.unpublish_error,),
            },
        ),
    ]
    return _join(*parts)
