"""What the stateful rules remember (rules/state.py and the families' parts), bounded by
--max-remembered-objects: no memory holds more, counted call by call; and what is forgotten
past the bound costs a missed violation, never a false one. Each case below first shows the
calls judged while remembered, then the same calls after enough other objects pushed what
they need out: nothing is reported. Where a rule takes an absence as evidence ("no
unpublish was sent since"), the absence is made by the bound and must prove nothing.

The validate stage runs in-process, as the pipeline runs it, every call made by hand."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from typing import Any

from plugproxy.api import Call, LazyMessage, Runtime, StatusCode
from plugproxy.core.log import Logger
from plugproxy.core.memory import ExpiringMap
from plugproxy.rules.state import SpecState
from plugproxy.spec.registry import Registry
from plugproxy.stages.validate import ValidateStage

REG = Registry()
BOUND = 6
NODE = "node-1"
RWO = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
CAPS = {
    "plugin": {"CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"},
    "controller": {
        "CREATE_DELETE_VOLUME",
        "PUBLISH_UNPUBLISH_VOLUME",
        "EXPAND_VOLUME",
        "CREATE_DELETE_SNAPSHOT",
    },
    "node": {"STAGE_UNSTAGE_VOLUME", "EXPAND_VOLUME", "GET_VOLUME_STATS"},
}


def memories(state: SpecState) -> list[tuple[str, ExpiringMap[Any, Any]]]:
    """Every bounded memory of one spec: the lifecycle's own and each family's."""
    found: list[tuple[str, ExpiringMap[Any, Any]]] = [
        ("SpecState.volumes", state.volumes),
        ("SpecState.creates", state.creates),
        ("SpecState.publications", state.publications),
    ]
    for part in state.parts():
        for name in dir(part):
            value = getattr(part, name) if not name.startswith("__") else None
            if isinstance(value, ExpiringMap):
                found.append((f"{type(part).__name__}.{name}", value))
    return found


class Judge:
    """The validate stage (audit, every rule) remembering at most ``bound`` objects."""

    def __init__(self, bound: int = BOUND, spec: str = "csi.v1") -> None:
        runtime = Runtime(registry=REG, upstream=None, logger=Logger(io.StringIO()), metrics=None)
        self.stage = ValidateStage(runtime, "audit", {}, max_objects=bound)
        self.paths = {m.name: m.path for m in REG.methods(spec)}
        self.state = self.stage._plans[self.paths["CreateVolume"]].state
        for kind, names in CAPS.items():
            self.state.set_capabilities(kind, frozenset(names))
        self.state.query_failed("group")  # never asked: no plugin here
        assert self.call("NodeGetInfo", {}, {"node_id": NODE}) == set()

    def call(
        self,
        rpc: str,
        req: dict[str, Any] | None = None,
        resp: dict[str, Any] | None = None,
        code: str = "OK",
    ) -> set[str]:
        """The ids of every rule the call was found to break."""
        info = REG.lookup(self.paths[rpc])
        assert info.request_class is not None and info.response_class is not None
        call = Call(info, (), [], None)
        call.request = LazyMessage(
            info.request_class(**(req or {})).SerializeToString(), info.request_class
        )
        pending = self.stage.on_start(call)
        if pending is not None:
            asyncio.run(pending)  # type: ignore[arg-type]
        if code == "OK":
            raw = info.response_class(**(resp or {})).SerializeToString()
            call.response = LazyMessage(raw, info.response_class)
            self.stage.on_response(call, call.response)
        else:
            call.code, call.details = StatusCode[code], "the plugin says no"
        self.stage.on_finish(call)
        return {str(e.attributes["rule"]) for e in call.events if e.name == "violation"}

    # -- steps ----------------------------------------------------------------------------

    def create(self, vid: str, name: str | None = None, size: int = 1 << 30) -> set[str]:
        req = {
            "name": name or f"pvc-{vid}",
            "volume_capabilities": [RWO],
            "capacity_range": {"required_bytes": size},
        }
        return self.call(
            "CreateVolume", req, {"volume": {"volume_id": vid, "capacity_bytes": size}}
        )

    def publish(self, vid: str, device: str = "/dev/a", code: str = "OK") -> set[str]:
        req = {"volume_id": vid, "node_id": NODE, "volume_capability": RWO}
        return self.call("ControllerPublishVolume", req, {"publish_context": {"dev": device}}, code)

    def unpublish(self, vid: str, code: str = "OK") -> set[str]:
        return self.call("ControllerUnpublishVolume", {"volume_id": vid, "node_id": NODE}, {}, code)

    def stage_at(self, vid: str, path: str) -> set[str]:
        req = {"volume_id": vid, "staging_target_path": path, "volume_capability": RWO}
        return self.call("NodeStageVolume", req, {})

    def delete(self, vid: str) -> set[str]:
        return self.call("DeleteVolume", {"volume_id": vid}, {})

    def expand(self, vid: str) -> set[str]:
        req = {"volume_id": vid, "capacity_range": {"required_bytes": 2 << 30}}
        return self.call("ControllerExpandVolume", req, {"capacity_bytes": 2 << 30})

    def validate(self, vid: str, confirmed: bool) -> set[str]:
        req = {"volume_id": vid, "volume_capabilities": [RWO]}
        resp = {"confirmed": {"volume_capabilities": [RWO]}} if confirmed else {}
        return self.call("ValidateVolumeCapabilities", req, resp)


Step = Callable[[Judge, str], object]


def flood(j: Judge, step: Step, times: int = 3 * BOUND) -> None:
    """Legitimate calls for ``times`` other volumes, enough to push one out of each memory
    ``step`` touches."""
    for i in range(times):
        assert step(j, f"other-{i}") == set(), i


# -- the bound, counted ---------------------------------------------------------------------


def lifecycle(j: Judge, n: int) -> list[set[str]]:
    """A volume's calls as a unified plugin's CO makes them; half are torn down again."""
    vid, stage, target = f"vol-{n}", f"/stage/{n}", f"/pods/{n}/mount"
    node = {"volume_id": vid, "volume_capability": RWO, "publish_context": {"dev": "/dev/a"}}
    snap = {
        "snapshot_id": f"s-{vid}",
        "source_volume_id": vid,
        "ready_to_use": True,
        "size_bytes": 1 << 20,
        "creation_time": {"seconds": 1_700_000_000},
    }
    found = [
        j.create(vid),
        j.publish(vid),
        j.call("NodeStageVolume", {**node, "staging_target_path": stage}, {}),
        j.call(
            "NodePublishVolume",
            {**node, "staging_target_path": stage, "target_path": target},
            {},
        ),
        j.call(
            "NodeGetVolumeStats",
            {"volume_id": vid, "volume_path": target},
            {"usage": [{"total": 100, "unit": "BYTES"}]},
        ),
        j.validate(vid, confirmed=True),
        j.call(
            "CreateSnapshot", {"name": f"snap-{n}", "source_volume_id": vid}, {"snapshot": snap}
        ),
    ]
    if n % 2:
        found += [
            j.call("NodeUnpublishVolume", {"volume_id": vid, "target_path": target}, {}),
            j.call("NodeUnstageVolume", {"volume_id": vid, "staging_target_path": stage}, {}),
            j.unpublish(vid),
            j.call("DeleteSnapshot", {"snapshot_id": f"s-{vid}"}, {}),
            j.delete(vid),
        ]
    return found


def test_no_memory_holds_more_objects_than_the_bound_after_any_call():
    j = Judge(BOUND)
    peak: dict[str, int] = {}
    for n in range(6 * BOUND):
        for found in lifecycle(j, n):
            assert found == set()
            for name, memory in memories(j.state):
                assert len(memory) <= BOUND, name
                peak[name] = max(peak.get(name, 0), len(memory))
    bounded = [name for name, memory in memories(j.state) if memory.maxsize == BOUND]
    assert len(bounded) >= 30  # the bound reaches every family's per-object memory
    # the traffic filled the lifecycle's, the families' and the generic rules' memories
    full = {name for name, most in peak.items() if most == BOUND}
    assert {"SpecState.volumes", "SpecState.creates", "GenericMemory.changed"} <= full
    assert {"SpecState.publications", "OrderState.volumes", "RecoveryMemory.names"} <= full
    assert len(full) >= 15, sorted(full)


def test_the_lifecycle_state_keeps_no_empty_collections_per_volume():
    """Most volumes a controller remembers were published and never staged on its node: an
    empty collection per volume would cost more than what is remembered of it."""
    j = Judge(BOUND)
    j.create("vol-1")
    j.publish("vol-1")
    state = j.state.peek("vol-1")
    assert state is not None
    assert j.state.controller_nodes("vol-1") == (NODE,)
    assert state.staged == () and state.published == ()
    j.publish("vol-1")  # again: held once
    j.unpublish("vol-1")
    assert j.state.peek("vol-1") is not None and j.state.controller_nodes("vol-1") == ()


# -- forgotten past the bound: missed, never false ----------------------------------------


def judged_then_forgotten(before: Step, step: Step, probe: Step, rule: str) -> None:
    """``probe`` breaks ``rule`` while ``before`` is remembered, and breaks nothing once
    other volumes' ``step`` pushed it out."""
    j = Judge()
    before(j, "vol-a")
    flood(j, step, times=BOUND // 2)
    assert rule in probe(j, "vol-a")
    j = Judge()
    before(j, "vol-a")
    flood(j, step)
    assert probe(j, "vol-a") == set()


def test_a_publication_forgotten_is_not_compared_with_the_next():
    def published(j: Judge, vid: str) -> set[str]:
        return j.create(vid) | j.publish(vid, "/dev/a")

    judged_then_forgotten(
        published,
        published,
        lambda j, vid: j.publish(vid, "/dev/b"),  # an identical publish, another context
        "csi.publish-context-changed",
    )


def test_a_staging_path_forgotten_is_no_conflict():
    def staged(j: Judge, vid: str) -> set[str]:
        return j.create(vid) | j.stage_at(vid, f"/stage/{vid}")

    judged_then_forgotten(
        staged, staged, lambda j, vid: j.stage_at(vid, "/elsewhere"), "csi.staging-path-conflict"
    )


def test_a_delete_forgotten_leaves_the_volume_unknown():
    def deleted(j: Judge, vid: str) -> set[str]:
        return j.create(vid) | j.delete(vid)

    judged_then_forgotten(deleted, deleted, Judge.publish, "csi.deleted-object-answered")


def test_a_create_forgotten_leaves_its_name_free():
    judged_then_forgotten(
        Judge.create,
        Judge.create,
        lambda j, vid: j.create("vol-b", name=f"pvc-{vid}"),  # the same request, another id
        "csi.create-not-idempotent",
    )


# -- an absence made by the bound proves nothing --------------------------------------------


def absence_proves_nothing(
    evidence: Step, answer: Step, step: Step, probe: Step, rule: str, flood_first: bool = False
) -> None:
    """``probe`` after ``evidence`` breaks ``rule``; after ``evidence`` and the ``answer``
    that makes it legitimate, it does not, also once other volumes' ``step`` pushed that
    answer out of its memory (before it came, with ``flood_first``) and left the evidence."""
    j = Judge()
    evidence(j, "vol-a")
    assert rule in probe(j, "vol-a")
    j = Judge()
    evidence(j, "vol-a")
    assert answer(j, "vol-a") == set()
    assert probe(j, "vol-a") == set()
    j = Judge()
    evidence(j, "vol-a")
    if flood_first:
        flood(j, step)
    assert answer(j, "vol-a") == set()
    if not flood_first:
        flood(j, step)
    assert probe(j, "vol-a") == set()


def test_a_change_of_the_volume_pushed_out_still_explains_another_validation_answer():
    absence_proves_nothing(
        lambda j, vid: j.validate(vid, confirmed=True),
        Judge.expand,  # the volume changed: a validation may answer otherwise now
        Judge.expand,
        lambda j, vid: j.validate(vid, confirmed=False),
        "csi.validate-not-idempotent",
    )


def test_a_stage_pushed_out_still_answers_the_staging_path_refusal():
    absence_proves_nothing(
        # NodePublishVolume without a staging path, refused as the row for it says
        lambda j, vid: j.call(
            "NodePublishVolume",
            {"volume_id": vid, "target_path": "/t", "volume_capability": RWO},
            code="FAILED_PRECONDITION",
        ),
        lambda j, vid: j.stage_at(vid, "/s"),
        lambda j, vid: j.stage_at(vid, f"/stage/{vid}"),
        lambda j, vid: j.call(
            "NodePublishVolume",
            {
                "volume_id": vid,
                "staging_target_path": "/s",
                "target_path": "/t",
                "volume_capability": RWO,
            },
            {},
        ),
        "csi.call-order",
    )


def test_an_unpublish_in_flight_pushed_out_still_explains_a_refused_publish():
    absence_proves_nothing(
        Judge.publish,
        lambda j, vid: j.unpublish(vid, code="INTERNAL"),  # sent; its outcome unknown
        lambda j, vid: j.unpublish(vid, code="INTERNAL"),
        lambda j, vid: j.publish(vid, code="FAILED_PRECONDITION"),
        "csi.not-idempotent",
    )


def test_a_delete_pushed_out_still_frees_the_name_for_other_arguments():
    absence_proves_nothing(
        Judge.create,
        Judge.delete,
        Judge.delete,
        lambda j, vid: j.create("vol-b", name=f"pvc-{vid}", size=2 << 30),
        "csi.volume-name-reused",
    )


def test_a_volume_pushed_out_before_its_delete_still_frees_its_name():
    """The delete finds the name through what is remembered of the volume; with that gone
    first, the delete of the earlier volume is not tied to the name."""
    absence_proves_nothing(
        Judge.create,
        Judge.delete,
        Judge.publish,  # remembers other volumes, not other names
        lambda j, vid: j.create("vol-b", name=f"pvc-{vid}"),
        "csi.create-not-idempotent",
        flood_first=True,
    )


def test_a_publication_pushed_out_still_explains_a_refused_node_stage():
    def published(j: Judge, vid: str) -> set[str]:  # no publish_context to pass on
        req = {"volume_id": vid, "node_id": NODE, "volume_capability": RWO}
        return j.call("ControllerPublishVolume", req, {})

    def refused_stage(j: Judge, vid: str) -> set[str]:
        req = {"volume_id": vid, "staging_target_path": "/s", "volume_capability": RWO}
        return j.call("NodeStageVolume", req, code="FAILED_PRECONDITION")

    absence_proves_nothing(Judge.create, published, published, refused_stage, "csi.call-order")


def test_a_publication_pushed_out_is_not_denied_by_a_later_one_elsewhere():
    """The volume's publications are remembered again from the next one on: one to another
    node says nothing of this node."""
    rwx = {"mount": {}, "access_mode": {"mode": "MULTI_NODE_MULTI_WRITER"}}

    def published(j: Judge, vid: str, node: str = NODE) -> set[str]:
        req = {"volume_id": vid, "node_id": node, "volume_capability": rwx}
        return j.call("ControllerPublishVolume", req, {})

    j = Judge()
    made = {"volume": {"volume_id": "vol-a", "capacity_bytes": 1 << 30}}
    assert j.call("CreateVolume", {"name": "pvc-a", "volume_capabilities": [rwx]}, made) == set()
    assert published(j, "vol-a") == set()
    flood(j, published)
    assert published(j, "vol-a", "node-2") == set()
    req = {"volume_id": "vol-a", "staging_target_path": "/s", "volume_capability": rwx}
    assert j.call("NodeStageVolume", req, code="FAILED_PRECONDITION") == set()


def test_csi_v0_a_volume_pushed_out_may_be_the_one_a_delete_names():
    """CSI v0.3's DeleteVolume naming a create's name is judged only while no volume of
    that id is known; one pushed out of memory may have been."""
    j = Judge(spec="csi.v0")

    def created(name: str, vid: str) -> set[str]:
        req = {"name": name, "volume_capabilities": [RWO]}
        return j.call("CreateVolume", req, {"volume": {"id": vid, "capacity_bytes": 1 << 30}})

    def published(vid: str) -> set[str]:
        req = {"volume_id": vid, "node_id": NODE, "volume_capability": RWO}
        return j.call("ControllerPublishVolume", req, {})

    assert created("pvc-1", "vol-1") == set()
    assert "csi.delete-by-name" in j.call("DeleteVolume", {"volume_id": "pvc-1"}, {})
    j = Judge(spec="csi.v0")
    assert created("pvc-1", "vol-1") | published("pvc-1") == set()  # a volume whose id it is
    assert j.call("DeleteVolume", {"volume_id": "pvc-1"}, {}) == set()
    j = Judge(spec="csi.v0")
    assert created("pvc-1", "vol-1") | published("pvc-1") == set()
    for i in range(3 * BOUND):
        assert published(f"other-{i}") == set()
    assert j.call("DeleteVolume", {"volume_id": "pvc-1"}, {}) == set()


def test_a_node_dropped_from_a_volumes_own_list_may_be_where_it_is_published():
    """Each volume keeps its latest 256 publications: a node dropped from that list is
    unknown, not unpublished."""
    rwx = {"mount": {}, "access_mode": {"mode": "MULTI_NODE_MULTI_WRITER"}}

    def published(j: Judge, node: str, vid: str = "vol-a") -> set[str]:
        req = {"volume_id": vid, "node_id": node, "volume_capability": rwx}
        return j.call("ControllerPublishVolume", req, {})

    def staged(j: Judge) -> set[str]:
        req = {"volume_id": "vol-a", "staging_target_path": "/s", "volume_capability": rwx}
        return j.call("NodeStageVolume", req, {})

    create = {"name": "pvc-a", "volume_capabilities": [rwx]}
    made = {"volume": {"volume_id": "vol-a", "capacity_bytes": 1 << 30}}
    j = Judge()
    assert published(j, "node-2", "vol-z") == set()  # the attacher's calls pass here
    assert j.call("CreateVolume", create, made) | published(j, "node-2") == set()
    assert "csi.call-order" in staged(j)  # published elsewhere, not to this node
    j = Judge()
    assert published(j, "node-2", "vol-z") == set()
    assert j.call("CreateVolume", create, made) | published(j, NODE) == set()
    for i in range(300):
        assert published(j, f"node-{i + 2}") == set()
    assert staged(j) == set()


def test_a_volumes_publications_live_as_long_as_the_volume_is_in_use():
    """A volume published long ago and used on its node since is still published: the
    lifecycle rules (csi.delete-while-published) see its nodes while the volume is known."""
    from plugproxy.rules.state import LIFECYCLE_TTL, Publication

    now = [0.0]
    state = SpecState(clock=lambda: now[0])
    publication = Publication(b"", b"", 0, b"", True, 0.0)
    for vid in ("in-use", "idle"):
        state.volume(vid)
        state.controller_published(vid, NODE, publication)
    for _ in range(3):  # three lifecycle TTLs, the volume used on its node in each
        now[0] += LIFECYCLE_TTL * 0.9
        state.touch("in-use")
    assert state.controller_nodes("in-use") == (NODE,)
    assert state.controller_nodes("idle") == ()  # forgotten with the volume, never longer
    assert state.peek("idle") is None
