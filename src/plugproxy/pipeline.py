"""The one ordered list of stages every call flows through, and its per-method compilation.

Order (each stage's module says why it sits where it does):

1. tracing   — first, so its span covers everything the others do, including waits.
2. metrics   — measures what the CO sees: validation rejects and serialization waits included.
3. calllog   — request ids are set before validation and serialization refer to the call.
4. validate  — judges the request before it may wait for a lock; rejects never queue.
5. serialize — holds the volume's lock only around the plugin call itself.
→ forwarder  — the last step, in :mod:`plugproxy.proxy`: relays bytes to the plugin.

``on_start`` runs in this order, ``on_finish`` in reverse. At startup each method gets a
:class:`Chain` of only the stages that want it; a disabled stage is simply not in the list.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

from plugproxy.api import Call, LazyMessage, MethodInfo, Reject, Stage
from plugproxy.log import Logger
from plugproxy.options import Option
from plugproxy.stages import calllog, metrics, serialize, tracing, validate

# The stage modules in pipeline order. Each defines OPTIONS and build(ns, runtime).
STAGE_MODULES: tuple[ModuleType, ...] = (tracing, metrics, calllog, validate, serialize)


def stage_options() -> list[Option]:
    return [opt for module in STAGE_MODULES for opt in module.OPTIONS]


def build_stages(ns: argparse.Namespace, runtime: Any) -> list[Stage]:
    """Instantiate the enabled stages, in order; a module returns None when disabled."""
    stages: list[Stage] = []
    for module in STAGE_MODULES:
        stage = module.build(ns, runtime)
        if stage is not None:
            stages.append(stage)
    return stages


StartFn = Callable[[Call], Awaitable[None] | None]
MessageFn = Callable[[Call, LazyMessage], None]
FinishFn = Callable[[Call], None]


@dataclass(frozen=True, slots=True)
class Chain:
    """The hooks of the stages that take part in one method's calls."""

    names: tuple[str, ...]
    start: tuple[StartFn | None, ...]
    start_is_async: tuple[bool, ...]
    request: tuple[MessageFn, ...]
    response: tuple[MessageFn, ...]
    finish: tuple[FinishFn | None, ...]
    all_sync: bool = False  # no on_start awaits: the forwarder may skip creating a task

    def run_start_sync(self, call: Call) -> None:
        """run_start for chains whose on_start hooks are all plain functions."""
        for index, hook in enumerate(self.start):
            call.started_stages = index + 1
            if hook is not None:
                hook(call)

    async def run_start(self, call: Call) -> None:
        """Run on_start hooks in order; ``call.started_stages`` counts the ones that ran."""
        for index, hook in enumerate(self.start):
            call.started_stages = index + 1
            if hook is None:
                continue
            if self.start_is_async[index]:
                await hook(call)  # type: ignore[misc]
            else:
                hook(call)

    def run_request(self, call: Call, message: LazyMessage) -> None:
        for hook in self.request:
            hook(call, message)

    def run_response(self, call: Call, message: LazyMessage) -> None:
        for hook in self.response:
            hook(call, message)

    def run_finish(self, call: Call) -> None:
        for index in range(call.started_stages - 1, -1, -1):
            hook = self.finish[index]
            if hook is not None:
                hook(call)


def _guard_start(stage: Stage, hook: Any, logger: Logger, is_async: bool) -> StartFn:
    """Wrap on_start with the stage's failure mode (Reject always passes through)."""
    name = stage.name

    def failed(exc: Exception) -> None:
        # Type and place only: an exception's text may quote message contents.
        logger.error("stage failed", stage=name, hook="on_start", error=type(exc).__name__)
        if not stage.fail_open:
            raise Reject(grpc.StatusCode.INTERNAL, f"plugproxy: {name} stage failed") from None

    if is_async:

        async def guarded_async(call: Call) -> None:
            try:
                await hook(call)
            except Reject:
                raise
            except Exception as exc:
                failed(exc)

        return guarded_async

    def guarded(call: Call) -> None:
        try:
            hook(call)
        except Reject:
            raise
        except Exception as exc:
            failed(exc)

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
                raise Reject(
                    grpc.StatusCode.INTERNAL, f"plugproxy: {stage.name} stage failed"
                ) from None

    return guarded


def _guard_observer(stage: Stage, hook: Any, hook_name: str, logger: Logger) -> Any:
    """Response and finish hooks never block or alter what the plugin said: always fail open."""

    def guarded(*args: Any) -> None:
        try:
            hook(*args)
        except Exception as exc:
            logger.error("stage failed", stage=stage.name, hook=hook_name, error=type(exc).__name__)

    return guarded


def compile_chain(stages: Sequence[Stage], method: MethodInfo, logger: Logger) -> Chain | None:
    """The chain for ``method``, or None when no stage takes part (pure passthrough)."""
    taking_part = [s for s in stages if s.wants(method)]
    if not taking_part:
        return None
    start: list[StartFn | None] = []
    start_async: list[bool] = []
    request: list[MessageFn] = []
    response: list[MessageFn] = []
    finish: list[FinishFn | None] = []
    for stage in taking_part:
        on_start = getattr(stage, "on_start", None)
        is_async = on_start is not None and inspect.iscoroutinefunction(on_start)
        start.append(_guard_start(stage, on_start, logger, is_async) if on_start else None)
        start_async.append(is_async)
        if (on_request := getattr(stage, "on_request", None)) is not None:
            request.append(_guard_request(stage, on_request, logger))
        if (on_response := getattr(stage, "on_response", None)) is not None:
            response.append(_guard_observer(stage, on_response, "on_response", logger))
        on_finish = getattr(stage, "on_finish", None)
        finish.append(_guard_observer(stage, on_finish, "on_finish", logger) if on_finish else None)
    return Chain(
        names=tuple(s.name for s in taking_part),
        start=tuple(start),
        start_is_async=tuple(start_async),
        request=tuple(request),
        response=tuple(response),
        finish=tuple(finish),
        all_sync=not any(start_async),
    )
