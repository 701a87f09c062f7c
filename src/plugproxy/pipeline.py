"""The one ordered list of stages every call flows through, and its per-method compilation.

Order (each stage's module says why it sits where it does):

1. tracing   — first, so its span covers everything the others do, including waits.
2. metrics   — measures what the CO sees: validation rejects and serialization waits included.
3. calllog   — request ids are set before validation and serialization refer to the call.
4. validate  — judges the request before it may wait for a lock; rejects never queue.
5. serialize — holds the volume's lock only around the plugin call itself.
→ forwarder  — the last step, in :mod:`plugproxy.relay`: relays bytes to the plugin.

``on_start`` runs in this order, ``on_finish`` in reverse. At startup each method gets a
:class:`Chain` of only the stages that want it; a disabled stage is simply not in the list.

May import: :mod:`plugproxy.core`, :mod:`plugproxy.api`, :mod:`plugproxy.stages`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from plugproxy.api import Call, LazyMessage, MethodInfo, Reject, Stage, StatusCode
from plugproxy.core.log import Logger
from plugproxy.core.options import Option, group
from plugproxy.stages import calllog, metrics, serialize, tracing_env, validate
from plugproxy.stages.calllog import CallLogSettings
from plugproxy.stages.metrics import MetricsSettings
from plugproxy.stages.serialize import SerializeSettings
from plugproxy.stages.tracing_env import TracingSettings
from plugproxy.stages.validate import ValidateSettings

# The stage modules in pipeline order, each with the field of StageSettings it is built
# from: a module defines OPTIONS and build(settings, runtime). tracing_env builds
# plugproxy.stages.tracing, importing the SDK only when tracing is on.
STAGE_MODULES: tuple[tuple[ModuleType, str], ...] = (
    (tracing_env, "tracing"),
    (metrics, "metrics"),
    (calllog, "call_log"),
    (validate, "validation"),
    (serialize, "serialization"),
)


@dataclass(frozen=True)
class StageSettings:
    """Every stage's settings, made once where flags and environment are parsed."""

    tracing: TracingSettings = group(TracingSettings)
    metrics: MetricsSettings = group(MetricsSettings)
    call_log: CallLogSettings = group(CallLogSettings)
    validation: ValidateSettings = group(ValidateSettings)
    serialization: SerializeSettings = group(SerializeSettings)


def stage_options() -> list[Option]:
    return [opt for module, _ in STAGE_MODULES for opt in module.OPTIONS]


def build_stages(settings: StageSettings, runtime: Any) -> list[Stage]:
    """Instantiate the enabled stages, in order; a module returns None when disabled."""
    stages: list[Stage] = []
    for module, name in STAGE_MODULES:
        stage = module.build(getattr(settings, name), runtime)
        if stage is not None:
            stages.append(stage)
    return stages


StartFn = Callable[[Call], Awaitable[None] | None]
MessageFn = Callable[[Call, LazyMessage], None]
FinishFn = Callable[[Call], None]


@dataclass(frozen=True, slots=True)
class Chain:
    """The hooks of the stages that take part in one method's calls.

    Start and request hooks are wrapped with their stage's failure mode. Response and finish
    hooks always fail open, so they are kept bare, with their stage's name, and the chain's
    own loop catches what they raise: no wrapper call per hook on every call."""

    names: tuple[str, ...]
    start: tuple[StartFn | None, ...]
    request: tuple[MessageFn, ...]
    response: tuple[tuple[str, MessageFn], ...]
    finish: tuple[tuple[str, FinishFn] | None, ...]
    logger: Logger

    def begin(self, call: Call) -> Awaitable[None] | None:
        """Run on_start hooks in order until one has to wait.

        Returns None when all of them ran, or an awaitable that waits and runs the rest: a
        call that waits for nothing costs no task. ``call.started_stages`` counts the hooks
        that ran (their on_finish will run). Raises :class:`Reject`.
        """
        start = self.start
        for index, hook in enumerate(start):
            call.started_stages = index + 1
            if hook is not None:
                pending = hook(call)
                if pending is not None:
                    return self._resume(call, pending, index + 1)
        return None

    async def _resume(self, call: Call, pending: Awaitable[None], index: int) -> None:
        await pending
        for later in range(index, len(self.start)):
            call.started_stages = later + 1
            hook = self.start[later]
            if hook is not None:
                more = hook(call)
                if more is not None:
                    await more

    async def run_start(self, call: Call) -> None:
        pending = self.begin(call)
        if pending is not None:
            await pending

    def run_request(self, call: Call, message: LazyMessage) -> None:
        for hook in self.request:
            hook(call, message)

    def run_response(self, call: Call, message: LazyMessage) -> None:
        for name, hook in self.response:
            try:
                hook(call, message)
            except Exception as exc:
                self._observer_failed(name, "on_response", exc)

    def run_finish(self, call: Call) -> None:
        finish = self.finish
        for index in range(call.started_stages - 1, -1, -1):
            entry = finish[index]
            if entry is not None:
                try:
                    entry[1](call)
                except Exception as exc:
                    self._observer_failed(entry[0], "on_finish", exc)

    def _observer_failed(self, stage: str, hook: str, exc: Exception) -> None:
        # Response and finish hooks never block or alter what the plugin said. Type and
        # place only: an exception's text may quote message contents.
        self.logger.error("stage failed", stage=stage, hook=hook, error=type(exc).__name__)


def _guard_start(stage: Stage, hook: Any, logger: Logger) -> StartFn:
    """Wrap on_start with the stage's failure mode (Reject always passes through).

    on_start is a plain function returning None, or an awaitable when it has to wait (an
    ``async def`` hook always does)."""
    name = stage.name

    def failed(exc: Exception) -> None:
        # Type and place only: an exception's text may quote message contents.
        logger.error("stage failed", stage=name, hook="on_start", error=type(exc).__name__)
        if not stage.fail_open:
            raise Reject(StatusCode.INTERNAL, f"plugproxy: {name} stage failed") from None

    async def guarded_wait(pending: Awaitable[None]) -> None:
        try:
            await pending
        except Reject:
            raise
        except Exception as exc:
            failed(exc)

    def guarded(call: Call) -> Awaitable[None] | None:
        try:
            pending = hook(call)
        except Reject:
            raise
        except Exception as exc:
            failed(exc)
            return None
        return None if pending is None else guarded_wait(pending)

    return guarded


def _guard_request(stage: Stage, hook: MessageFn, logger: Logger) -> MessageFn:
    def guarded(call: Call, message: LazyMessage) -> None:
        try:
            hook(call, message)
        except Reject:
            raise
        except Exception as exc:
            logger.error(
                "stage failed", stage=stage.name, hook="on_request", error=type(exc).__name__
            )
            if not stage.fail_open:
                raise Reject(StatusCode.INTERNAL, f"plugproxy: {stage.name} stage failed") from None

    return guarded


def compile_chain(stages: Sequence[Stage], method: MethodInfo, logger: Logger) -> Chain | None:
    """The chain for ``method``, or None when no stage takes part (pure passthrough)."""
    taking_part = [s for s in stages if s.wants(method)]
    if not taking_part:
        return None
    start: list[StartFn | None] = []
    request: list[MessageFn] = []
    response: list[tuple[str, MessageFn]] = []
    finish: list[tuple[str, FinishFn] | None] = []
    for stage in taking_part:
        on_start = getattr(stage, "on_start", None)
        start.append(_guard_start(stage, on_start, logger) if on_start else None)
        if (on_request := getattr(stage, "on_request", None)) is not None:
            request.append(_guard_request(stage, on_request, logger))
        if (on_response := getattr(stage, "on_response", None)) is not None:
            response.append((stage.name, on_response))
        on_finish = getattr(stage, "on_finish", None)
        finish.append((stage.name, on_finish) if on_finish else None)
    return Chain(
        names=tuple(s.name for s in taking_part),
        start=tuple(start),
        request=tuple(request),
        response=tuple(response),
        finish=tuple(finish),
        logger=logger,
    )
