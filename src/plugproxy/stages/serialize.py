"""Serialization: at most one call in flight per volume, snapshot, bucket or machine.

CSI v1.12 §Concurrency asks the CO to keep one call in flight per volume and lets a plugin
answer a second one with ABORTED (CSI v1.12 §Error Scheme, code 10, "operation pending");
COSI v1alpha1 and CMI plugins have the same need per bucket and machine. Real COs do not
always manage it, so this stage enforces it in front of the plugin, for every keyed RPC of
every spec (keys from :func:`plugproxy.spec.keys.keys_of`).

Modes (``--serialize``):

- ``wait`` (default): a call on a busy key queues FIFO behind the holder, for at most the
  smaller of ``--serialize-timeout`` and the call's own remaining deadline, then gets
  ABORTED naming the key and the call (method, request id) that holds it.
- ``abort``: a call on a busy key gets ABORTED at once.
- ``off``: the stage is not built.

A call with several keys takes them one at a time in sorted order, the same global order
for every call, so two calls can never each hold a key the other waits for. When one key
cannot be had, the keys already taken are given back before the call is answered. Keys are
released in ``on_finish``, which runs for every call whose ``on_start`` began: success,
plugin error, reject, deadline and client cancellation alike.

Ordering: last stage before the forwarder. Validation runs earlier so a call it rejects
never queues; the call log runs earlier so ``request_id`` can name the holder; metrics
and tracing run earlier so the wait is part of the latency they measure. Fails closed.

Recorded per call: ``call.stage_state["serialize.wait_seconds"]`` (0.0 when the keys were
free) for every keyed call, and a ``serialization.wait`` event only when the call queued.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from plugproxy.api import Call, MethodInfo, Reject, Runtime, Stage, StatusCode
from plugproxy.core.locks import LockTable
from plugproxy.core.options import Option, duration, options_of, setting
from plugproxy.spec.keys import extractor, keys_of


@dataclass(frozen=True)
class SerializeSettings:
    serialize: str = setting(
        "--serialize",
        "one call in flight per volume/snapshot/bucket/machine: wait (queue FIFO), "
        "abort (ABORTED at once when busy) or off",
        default="wait",
        choices=("wait", "abort", "off"),
    )
    serialize_timeout: float = setting(
        "--serialize-timeout",
        "longest a call queues for a busy key before ABORTED (also bounded by its deadline)",
        default=60.0,
        type=duration,
        metavar="DURATION",
    )
    serialize_key: tuple[str, ...] = setting(
        "--serialize-key",
        "also serialize a method's calls by a field of its request (dotted path; a repeated "
        "field gives one key per value); applies to bundled specs and descriptor sets alike",
        default=[],
        repeatable=True,
        metavar="/PKG.SERVICE/METHOD=FIELD_PATH",
    )


OPTIONS: list[Option] = options_of(SerializeSettings)

HELD = "serialize.held"
WAIT_SECONDS = "serialize.wait_seconds"

# Give up this much before the caller's deadline (at most), so the CO receives the
# ABORTED that names the holder rather than a bare DEADLINE_EXCEEDED.
DEADLINE_MARGIN = 0.05

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def describe_key(key: str) -> str:
    """'volume:pvc-1' -> 'volume pvc-1'."""
    kind, _, value = key.partition(":")
    return f"{kind} {value}"


def describe_holder(holder: object) -> str:
    if not isinstance(holder, Call):
        return "another call"
    request_id = holder.stage_state.get("request_id")
    if request_id is None:
        return holder.method.path
    return f"{holder.method.path} (request id {request_id})"


class _Metrics:
    def __init__(self, registry: Any, table: LockTable) -> None:
        self.wait = Histogram(
            "plugproxy_serialization_wait_seconds",
            "Time keyed calls spent taking their keys (0 when free), by method",
            ["method"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.aborted = Counter(
            "plugproxy_serialization_aborted",
            "Calls answered ABORTED because a key stayed busy (busy: abort mode; timeout: "
            "waited too long)",
            ["method", "reason"],
            registry=registry,
        )
        depth = Gauge(
            "plugproxy_serialization_queue_depth",
            "Calls queued behind a busy key, over all keys",
            registry=registry,
        )
        depth.set_function(lambda: float(table.waiting))


class _PerMethod:
    """Metric children of one method, labelled once at startup."""

    __slots__ = ("busy", "timeout", "wait")

    def __init__(self, metrics: _Metrics, method: MethodInfo) -> None:
        self.wait = metrics.wait.labels(method=method.path)
        self.busy = metrics.aborted.labels(method=method.path, reason="busy")
        self.timeout = metrics.aborted.labels(method=method.path, reason="timeout")


class SerializeStage(Stage):
    name = "serialize"
    fail_open = False

    def __init__(self, mode: str, timeout: float, metrics_registry: Any = None) -> None:
        if mode not in ("wait", "abort"):
            raise ValueError(f"serialize mode must be wait or abort, not {mode!r}")
        self.wait_mode = mode == "wait"
        self.timeout = timeout
        self.table = LockTable()
        self._metrics = (
            _Metrics(metrics_registry, self.table) if metrics_registry is not None else None
        )
        self._per_method: dict[str, _PerMethod] = {}

    def wants(self, method: MethodInfo) -> bool:
        if extractor(method) is None:
            return False
        if self._metrics is not None and method.path not in self._per_method:
            self._per_method[method.path] = _PerMethod(self._metrics, method)
        return True

    def _wait_limit(self, call: Call) -> float:
        remaining = call.remaining_timeout()
        if remaining is None:
            return self.timeout
        return min(self.timeout, remaining - min(DEADLINE_MARGIN, 0.1 * remaining))

    def on_start(self, call: Call) -> Awaitable[None] | None:
        keys = keys_of(call)
        if not keys:
            return None
        if len(keys) > 1:
            keys = tuple(sorted(keys))
        table = self.table
        per_method = self._per_method.get(call.method.path)
        held: list[str] = []
        call.stage_state[HELD] = held
        for index, key in enumerate(keys):
            if table.try_acquire(key, call):
                held.append(key)
                continue
            if not self.wait_mode:
                self._release(call, held)
                if per_method is not None:
                    per_method.busy.inc()
                raise Reject(
                    StatusCode.ABORTED,
                    f"operation pending for {describe_key(key)}: "
                    f"{describe_holder(table.holder(key))} is in progress",
                )
            return self._queue(call, keys, index, held, per_method)
        self._record_wait(call, per_method, keys, 0.0, queued=False)
        return None

    async def _queue(
        self,
        call: Call,
        keys: tuple[str, ...],
        index: int,
        held: list[str],
        per_method: _PerMethod | None,
    ) -> None:
        """Wait (in key order) for ``keys[index:]``; the ones before are already held."""
        table = self.table
        started = time.monotonic()
        deadline = started + self._wait_limit(call)
        for key in keys[index:]:
            if table.try_acquire(key, call):
                held.append(key)
                continue
            try:
                await table.acquire(key, call, deadline - time.monotonic())
            except TimeoutError:
                waited = time.monotonic() - started
                holder = table.holder(key)
                self._release(call, held)
                self._record_wait(call, per_method, keys, waited, queued=True)
                if per_method is not None:
                    per_method.timeout.inc()
                raise Reject(
                    StatusCode.ABORTED,
                    f"operation pending for {describe_key(key)}: waited {waited:.3f}s "
                    f"behind {describe_holder(holder)}",
                ) from None
            except BaseException:  # cancelled while queued: give back what was taken
                self._release(call, held)
                raise
            held.append(key)
        self._record_wait(call, per_method, keys, time.monotonic() - started, queued=True)

    def _record_wait(
        self,
        call: Call,
        per_method: _PerMethod | None,
        keys: tuple[str, ...],
        waited: float,
        queued: bool,
    ) -> None:
        call.stage_state[WAIT_SECONDS] = waited
        if queued:
            call.add_event("serialization.wait", seconds=waited, keys=",".join(keys))
        if per_method is not None:
            per_method.wait.observe(waited)

    def _release(self, call: Call, held: list[str]) -> None:
        release = self.table.release
        for key in held:
            release(key, call)
        held.clear()

    def on_finish(self, call: Call) -> None:
        held: list[str] | None = call.stage_state.get(HELD)
        if held:
            self._release(call, held)


def build(settings: SerializeSettings, runtime: Runtime) -> SerializeStage | None:
    if settings.serialize == "off":
        return None
    return SerializeStage(settings.serialize, settings.serialize_timeout, runtime.metrics)
