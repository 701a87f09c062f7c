"""Planted breaches run through a real proxy.

A :class:`Case` is data: the calls a CO makes (:class:`Step`), each with the answer a
scripted plugin gives, once as the breach of a spec statement and once as its nearest
legitimate variant (the twin). :func:`run_case` starts a scripted plugin (a real gRPC
server on a temporary UNIX socket) and an in-process proxy in front of it, sends the
steps through the proxy and returns what the validate stage reported. The breach runs in
audit mode and must be reported under the case's rule; the twin runs in enforce mode and
must pass untouched, every step answered as scripted, with no violation at all.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import Message

from plugproxy.api import CallKind, MethodInfo
from plugproxy.cli.serve import ProxyServer
from plugproxy.spec.registry import Registry
from plugproxy.stages.validate import ValidateStage
from tests.support import start_proxy

STEP_KEY = "x-planted-step"

# An answer: a response message as keyword fields (nested messages as dicts, enums by
# name), raw bytes sent as they are, or a list of either for a server-streaming call.
Answer = Mapping[str, Any] | bytes | Sequence[Mapping[str, Any] | bytes]


@dataclass(frozen=True)
class Step:
    """One call the CO sends and how the plugin answers it.

    ``error``: the plugin fails the call with (code name, message) instead of answering; a
    code of digits ("17") is sent as that raw, non-canonical grpc-status.
    ``wait``: seconds the CO waits before sending. ``hold``: seconds the plugin waits before
    answering. ``pending``: the CO sends the next step without waiting for this one's end
    (the call stays in flight), as a CO racing its own calls does. ``new_connection``: the
    call goes over a connection of its own, as another caller's (or kubelet's, which opens
    one per call) would.
    """

    rpc: str
    request: Mapping[str, Any] | bytes = field(default_factory=dict)
    answer: Answer | None = None
    error: tuple[str, str] | None = None
    wait: float = 0.0
    hold: float = 0.0
    pending: bool = False
    metadata: tuple[tuple[str, str], ...] = ()
    trailers: tuple[tuple[str, str | bytes], ...] = ()  # the plugin's, with ``error``
    new_connection: bool = False


@dataclass(frozen=True)
class Case:
    """A breach of ``statements`` that ``rule`` must report, and its silent twin.

    ``background``: what the plugin answers to calls that are no step (the proxy's own
    capability queries), by RPC name; an RPC missing here is answered UNIMPLEMENTED.
    ``party``: the party the report must blame, when set. ``twin_allows``: rules the twin
    may draw because setting up the CO's situation takes a plugin's breach too (never
    ``rule`` itself).
    """

    spec: str
    statements: tuple[str, ...]
    rule: str
    breach: tuple[Step, ...]
    twin: tuple[Step, ...]
    background: Mapping[str, Answer] = field(default_factory=dict)
    party: str = ""
    why: str = ""  # what the breach is, when the statement does not say it plainly
    variant: str = ""  # tells apart cases of the same statements and rule
    twin_allows: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        tail = f":{self.variant}" if self.variant else ""
        return f"{self.spec}:{'+'.join(self.statements)}:{self.rule}{tail}"


@dataclass
class Outcome:
    """What one run showed: the report's entries and each step's code (OK or the error)."""

    violations: list[dict[str, Any]]
    codes: list[str]

    def rules(self) -> set[str]:
        return {v["rule"] for v in self.violations}


class _RawCode:
    """A status code outside grpc.StatusCode, sent as its number (a non-canonical status)."""

    def __init__(self, number: int) -> None:
        self.value = (number, str(number))


def status_code(name: str) -> Any:
    """``Step.error``'s code: a grpc.StatusCode name, or digits for a raw (non-canonical)
    grpc-status such as "17"."""
    return _RawCode(int(name)) if name.isdigit() else grpc.StatusCode[name]


class ScriptedPlugin(grpc.GenericRpcHandler):  # type: ignore[misc, unused-ignore]
    """Answers every method of ``spec`` as the current case's steps say."""

    def __init__(self, registry: Registry, spec: str) -> None:
        self.registry = registry
        self.spec = spec
        self.steps: Sequence[Step] = ()
        self.background: Mapping[str, Answer] = {}
        self.seen: list[tuple[str, bytes]] = []  # (method name, request bytes) in order

    def service(self, details: Any) -> grpc.RpcMethodHandler | None:
        info = self.registry.lookup(details.method)
        if info.spec is None or info.spec.name != self.spec:
            return None
        if info.kind is CallKind.UNARY_STREAM:
            return grpc.unary_stream_rpc_method_handler(self._streamer(info))
        return grpc.unary_unary_rpc_method_handler(self._unary(info))

    async def _plan(
        self, info: MethodInfo, request: bytes, context: Any
    ) -> tuple[list[bytes], tuple[str, str] | None, tuple[tuple[str, str | bytes], ...]]:
        self.seen.append((info.name, request))
        md = dict(context.invocation_metadata() or ())
        if STEP_KEY in md:
            step = self.steps[int(md[STEP_KEY])]
            if step.hold:
                await asyncio.sleep(step.hold)
            if step.error is not None and step.answer is None:
                return [], step.error, step.trailers  # refused before any message
            return encode(info, step.answer), step.error, step.trailers
        if info.name in self.background:
            return encode(info, self.background[info.name]), None, ()
        return [], ("UNIMPLEMENTED", f"{info.name} is not scripted"), ()

    def _unary(self, info: MethodInfo) -> Any:
        async def handler(request: bytes, context: Any) -> bytes:
            messages, error, trailers = await self._plan(info, request, context)
            if error is not None:
                await context.abort(status_code(error[0]), error[1], trailers)
            return messages[0]

        return handler

    def _streamer(self, info: MethodInfo) -> Any:
        async def handler(request: bytes, context: Any) -> Any:
            messages, error, trailers = await self._plan(info, request, context)
            for message in messages:
                yield message
            if error is not None:
                await context.abort(status_code(error[0]), error[1], trailers)

        return handler


def build(cls: type[Message] | None, value: Mapping[str, Any] | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    assert cls is not None
    return cls(**value).SerializeToString()


def encode(info: MethodInfo, answer: Answer | None) -> list[bytes]:
    if answer is None:
        answer = {}
    if isinstance(answer, (bytes, Mapping)):
        return [build(info.response_class, answer)]
    return [build(info.response_class, item) for item in answer]


def _identity(raw: bytes) -> bytes:
    return raw


async def _send(
    channel: grpc.aio.Channel, info: MethodInfo, step: Step, index: int, timeout: float
) -> str:
    request = build(info.request_class, step.request)
    metadata = ((STEP_KEY, str(index)), *step.metadata)
    try:
        if info.kind is CallKind.UNARY_STREAM:
            stream = channel.unary_stream(
                info.path, request_serializer=_identity, response_deserializer=_identity
            )
            async for _ in stream(request, metadata=metadata, timeout=timeout):
                pass
        else:
            unary = channel.unary_unary(
                info.path, request_serializer=_identity, response_deserializer=_identity
            )
            await unary(request, metadata=metadata, timeout=timeout)
    except grpc.aio.AioRpcError as err:
        return f"{err.code().name}: {err.details()}"
    return "OK"


REGISTRY = Registry()


async def run_steps(
    case: Case, steps: Sequence[Step], mode: str, *extra_args: str, timeout: float = 5.0
) -> Outcome:
    """``steps`` of ``case`` through a fresh proxy in ``mode`` (audit or enforce)."""
    methods = {m.name: m for m in REGISTRY.methods(case.spec)}
    with tempfile.TemporaryDirectory(prefix="pp-planted-") as tmp:
        plugin_sock = os.path.join(tmp, "plugin.sock")
        proxy_sock = os.path.join(tmp, "proxy.sock")
        plugin = ScriptedPlugin(REGISTRY, case.spec)
        plugin.steps = steps
        plugin.background = case.background
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([plugin])
        server.add_insecure_port(f"unix:{plugin_sock}")
        await server.start()
        proxy: ProxyServer | None = None
        try:
            proxy = await start_proxy(
                proxy_sock, plugin_sock, "--validation", mode, "--log-level", "error", *extra_args
            )
            codes: list[str] = []
            async with grpc.aio.insecure_channel(
                f"unix:{proxy_sock}", options=[("grpc.use_local_subchannel_pool", 1)]
            ) as channel:
                pending: list[tuple[int, asyncio.Task[str]]] = []
                results: dict[int, str] = {}
                extra: list[grpc.aio.Channel] = []
                for index, step in enumerate(steps):
                    if step.wait:
                        await asyncio.sleep(step.wait)
                    info = methods[step.rpc]
                    via = channel
                    if step.new_connection:
                        via = grpc.aio.insecure_channel(
                            f"unix:{proxy_sock}", options=[("grpc.use_local_subchannel_pool", 1)]
                        )
                        extra.append(via)
                    task = asyncio.ensure_future(_send(via, info, step, index, timeout))
                    if step.pending:
                        pending.append((index, task))
                        await asyncio.sleep(0.05)  # let it reach the plugin first
                    else:
                        results[index] = await task
                for index, task in pending:
                    results[index] = await task
                for other in extra:
                    await other.close()
                codes = [results[i] for i in range(len(steps))]
            stage = next(s for s in proxy.stages if isinstance(s, ValidateStage))
            return Outcome(stage.report.snapshot(), codes)
        finally:
            if proxy is not None:
                await proxy.stop(0)
            await server.stop(0)


def expected_code(step: Step) -> str:
    return "OK" if step.error is None else step.error[0]


def describe(outcome: Outcome) -> str:
    lines = [
        f"  {v['rule']} ({v['party']}, {v['method']}): {v.get('last_message', '')}"
        for v in outcome.violations
    ]
    return "\n".join(lines) or "  (no violation)"


SPEC_OF_MATRIX = {
    "csi_v1": "csi.v1",
    "csi_v0": "csi.v0",
    "cosi_v1alpha1": "cosi.v1alpha1",
    "cosi_v1alpha2": "cosi.v1alpha2",
    "cmi_v1": "cmi.v1",
}
