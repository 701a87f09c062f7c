"""The validate stage driven in-process for the CSI rules that remember across calls
(csi_volumes, csi_snapshots, csi_listings, csi_metadata, and the families tested beside
them): each call made by hand, on a clock of the tests' own; only the findings of the rules
in FAMILY are returned."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterable
from typing import Any

from plugproxy.api import Call, LazyMessage, Reject, Runtime, StatusCode
from plugproxy.core.log import Logger
from plugproxy.spec.registry import Registry
from plugproxy.stages.validate import ValidateStage

REG = Registry()
NODE = "node-1"
OTHER = "node-2"
RWO = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
RWO_BLOCK = {"block": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
RWX = {"mount": {}, "access_mode": {"mode": "MULTI_NODE_MULTI_WRITER"}}
RWOP = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_SINGLE_WRITER"}}
SECRET = "s3cr3t-value"
V1_CAPS = {
    "plugin": {"CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"},
    "controller": {"CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME", "EXPAND_VOLUME"},
    "node": {"STAGE_UNSTAGE_VOLUME", "EXPAND_VOLUME", "GET_VOLUME_STATS"},
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Proxy:
    """The validate stage as the pipeline runs it, each call made by hand: request, the
    plugin's answer (response messages or an error code), finish."""

    def __init__(
        self,
        spec: str = "csi.v1",
        mode: str = "audit",
        caps: dict[str, set[str]] | None = None,
        **state: Any,
    ) -> None:
        runtime = Runtime(registry=REG, upstream=None, logger=Logger(io.StringIO()), metrics=None)
        self.stage = ValidateStage(runtime, mode, {})
        self.spec = spec
        self.paths = {m.name: m.path for m in REG.methods(spec)}
        self.state = self.stage._plans[self.paths["CreateVolume"]].state
        self.clock = Clock()
        self.state.clock = self.clock  # before the family's memory is made
        for name, value in state.items():
            setattr(self.state, name, value)
        caps = V1_CAPS if caps is None else caps
        for kind in ("plugin", "controller", "node", "group"):
            if kind in caps:
                self.state.set_capabilities(kind, frozenset(caps[kind]))
            else:
                self.state.query_failed(kind)  # never asked: no upstream here

    def call(
        self,
        rpc: str,
        req: dict[str, Any] | None = None,
        resp: dict[str, Any] | list[dict[str, Any]] | None = None,
        code: str = "OK",
    ) -> list[tuple[str, str, str]]:
        """(rule, party, field) of each violation; messages are checked in ``last``."""
        info = REG.lookup(self.paths[rpc])
        assert info.request_class is not None and info.response_class is not None
        call = Call(info, (), [], None)
        raw = info.request_class(**(req or {})).SerializeToString()
        call.request = LazyMessage(raw, info.request_class)
        try:
            pending = self.stage.on_start(call)
            if pending is not None:  # a capability query of its own; no plugin here
                asyncio.run(pending)  # type: ignore[arg-type]
        except Reject as exc:
            call.rejected = True
            call.code, call.details = exc.code, exc.message
        if not call.rejected:
            if code == "OK":
                for message in resp if isinstance(resp, list) else [resp or {}]:
                    lazy = LazyMessage(
                        info.response_class(**message).SerializeToString(), info.response_class
                    )
                    call.response = lazy
                    self.stage.on_response(call, lazy)
            else:
                call.code, call.details = StatusCode[code], "the plugin says no"
        self.stage.on_finish(call)
        self.last = [
            e.attributes
            for e in call.events
            if e.name == "violation" and e.attributes["rule"] in FAMILY
        ]
        self.rejected = call.rejected
        return [(str(v["rule"]), str(v["party"]), str(v["field"])) for v in self.last]

    def ids(self, *args: Any, **kwargs: Any) -> set[str]:
        return {rule for rule, _, _ in self.call(*args, **kwargs)}

    def messages(self) -> str:
        return " | ".join(str(v["message"]) for v in self.last)

    # -- a few steps most tests take --------------------------------------------------

    def node_info(self, node: str = NODE) -> None:
        self.call("NodeGetInfo", {}, {"node_id": node})

    def create(
        self,
        vid: str = "vol-1",
        context: dict[str, str] | None = None,
        caps: Iterable[dict[str, Any]] = (RWO,),
        name: str = "pvc-1",
        **extra: Any,
    ) -> set[str]:
        field = "volume_context" if self.spec == "csi.v1" else "attributes"
        id_field = "volume_id" if self.spec == "csi.v1" else "id"
        volume = {id_field: vid, field: context or {}, **extra.pop("volume", {})}
        return self.ids(
            "CreateVolume",
            {"name": name, "volume_capabilities": list(caps), **extra},
            {"volume": volume},
        )

    def publish(
        self,
        vid: str = "vol-1",
        node: str = NODE,
        context: dict[str, str] | None = None,
        cap: dict[str, Any] = RWO,
        code: str = "OK",
        **extra: Any,
    ) -> set[str]:
        field = "publish_context" if self.spec == "csi.v1" else "publish_info"
        return self.ids(
            "ControllerPublishVolume",
            {"volume_id": vid, "node_id": node, "volume_capability": cap, **extra},
            {field: context or {}},
            code,
        )

    def stage_at(self, path: str = "/s", vid: str = "vol-1", code: str = "OK", **extra: Any):
        return self.ids(
            "NodeStageVolume",
            {"volume_id": vid, "staging_target_path": path, "volume_capability": RWO, **extra},
            {},
            code,
        )

    def publish_at(
        self,
        target: str = "/t",
        vid: str = "vol-1",
        cap: dict[str, Any] = RWO,
        code: str = "OK",
        **extra: Any,
    ) -> set[str]:
        return self.ids(
            "NodePublishVolume",
            {
                "volume_id": vid,
                "staging_target_path": "/s",
                "target_path": target,
                "volume_capability": cap,
                **extra,
            },
            {},
            code,
        )


MINE = {
    "csi.volume-context-changed",
    "csi.volume-context-mismatch",
    "csi.publish-context-changed",
    "csi.publish-context-mismatch",
    "csi.staging-path-conflict",
    "csi.target-path-conflict",
    "csi.republish-different-capability",
    "csi.republish-answer",
    "csi.publish-conflict-accepted",
    "csi.expand-published-refused",
    "csi.secrets-changed",
    "csi.list-restart-expected",
    "csi.volume-smaller-than-snapshot",
    "csi.topology-prefix-inconsistent",
    "csi.snapshot-lost",
    "csi.group-id-mismatch",
    "csi.expand-already-large-refused",
    "csi.snapshot-missing",
    "csi.deleted-group-answered",
    "csi.delete-group-member",
    "csi.metadata-restart-offset",
}
FAMILY = MINE | {
    "csi.call-order",
    "csi.create-not-idempotent",
}  # other families' findings are not these tests' business
V0_ONLY_ABSENT = {
    "csi.deleted-group-answered",
    "csi.group-id-mismatch",
    "csi.expand-already-large-refused",
    "csi.republish-different-capability",
    "csi.expand-published-refused",
    "csi.snapshot-lost",
    "csi.delete-group-member",
    "csi.metadata-restart-offset",
}
