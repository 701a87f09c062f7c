"""CSI call order and publication answers judged from this socket's own history (CSI v1.12
and v0.3).

- Node side: NodePublishVolume with a staging_target_path after the plugin refused a
  NodePublishVolume of the volume for want of one (FAILED_PRECONDITION) and no
  NodeStageVolume of that volume and path succeeded since; NodePublishVolume for a
  (volume, staging path) whose last NodeStageVolume here failed. A node socket sees every
  NodeStageVolume of its node (kubelet has no other way to the plugin), so what it saw since
  is all there was; what came before the proxy started is unknown and never judged.
Everything here is reported, never enforced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugproxy.rules.csi_common import staging_path_missing
from plugproxy.rules.engine import Hooks, Rule, Violation
from plugproxy.rules.memory import ExpiringMap, ago

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState


def _norm(path: str) -> str:
    return path.rstrip("/") or path


def complete(req: Any, path: str) -> bool:
    """Whether a node request carries volume_id, ``path`` and volume_capability."""
    return bool(req.volume_id and getattr(req, path) and req.HasField("volume_capability"))


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


def _mem(st: SpecState) -> OrderState:
    return st.part(OrderState)


def _rules(title: str) -> tuple[Rule, ...]:
    rules: list[Rule] = []
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
        elif refused is not None:
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
    ]
    return _join(*parts)
