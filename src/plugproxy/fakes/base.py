"""Base class of the fake plugins: everything around the RPC methods themselves.

For each call the base records what arrived (method, resource key, times, status,
metadata), counts calls in flight per resource key, applies the knobs (delay, injected
status) and the enabled misbehaviours, then runs the plugin method named like the RPC.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import grpc
from google.protobuf.message import Message

from plugproxy.api import MethodInfo
from plugproxy.core.endpoints import ConfigError
from plugproxy.fakes.common import (
    DynMessage,
    FakeError,
    MetadataPairs,
    ServicerContext,
    enum_number,
    first_nonempty,
)
from plugproxy.fakes.knobs import FakeKnobs
from plugproxy.fakes.misbehave import (
    MISBEHAVIOURS,
    HookContext,
    Misbehaviour,
    check_misbehaviours,
    drop_capabilities,
    status_bytes,
)
from plugproxy.spec.registry import SPECS, load_spec

log = logging.getLogger(__name__)

STATUS_KEY = "grpc-status-details-bin"

UnaryHandler = Callable[[DynMessage, ServicerContext], Awaitable[DynMessage]]
StreamHandler = Callable[[DynMessage, ServicerContext], AsyncIterator[DynMessage]]


def _answer_late(late: FakeError | None) -> None:
    """The call ends with the error an ``after_call`` failure keeps for after the method."""
    if late is not None:
        raise late


@dataclass
class CallRecord:
    """One call as the plugin saw it. Times are time.monotonic() values."""

    method: str
    path: str
    key: str | None
    start: float
    end: float | None = None
    code: grpc.StatusCode | None = None
    metadata: MetadataPairs = ()

    @property
    def done(self) -> bool:
        return self.end is not None


class FakePlugin:
    """In-memory plugin of one spec. Subclasses define one method per RPC they implement:
    ``async def Name(self, request, context)`` returning the response, or an async generator
    for server-streaming RPCs. Methods raise :class:`FakeError` to answer with a status.
    """

    spec_name: ClassVar[str]
    default_plugin_name: ClassVar[str]
    # Request fields naming the resource a call acts on, most specific first.
    key_fields: ClassVar[tuple[str, ...]] = ()
    record_limit: ClassVar[int] = 100_000

    def __init__(self, knobs: FakeKnobs | None = None) -> None:
        self.spec = load_spec(self.spec_name)
        self.package = SPECS[self.spec_name][1]
        self.knobs = (knobs or FakeKnobs()).checked(self.spec_name)
        self.calls: list[CallRecord] = []
        self.last_metadata: MetadataPairs = ()
        self.max_inflight = 0
        self._inflight_total = 0
        self._inflight: Counter[str] = Counter()
        self._max_overlap: dict[str, int] = {}
        self._hook_state: defaultdict[str, dict[str, Any]] = defaultdict(dict)
        self._checked_misbehave = sorted(self.knobs.misbehave)

    # -- helpers for subclasses ---------------------------------------------------------

    @property
    def plugin_name(self) -> str:
        return self.knobs.plugin_name or self.default_plugin_name

    def new(self, short_name: str, **fields: Any) -> DynMessage:
        """A message of this spec by short name, e.g. ``new("Volume", volume_id="x")``."""
        cls = self.spec.message_class(f"{self.package}.{short_name}")
        return cls(**fields)

    def enum_value(self, message: str, field: str, value: str) -> int:
        """Number of enum ``value`` of ``field`` in message type ``message`` (short name)."""
        cls = self.spec.message_class(f"{self.package}.{message}")
        return enum_number(cls, field, value)

    def resource_key(self, method: MethodInfo, request: Message) -> str | None:
        return first_nonempty(request, self.key_fields)

    # -- observability ------------------------------------------------------------------

    def max_overlap_per_key(self) -> dict[str, int]:
        """Highest number of calls that were in flight at once, per resource key."""
        return dict(self._max_overlap)

    def calls_to(self, method: str) -> list[CallRecord]:
        return [c for c in self.calls if c.method == method]

    def reset_records(self) -> None:
        self.calls.clear()
        self._max_overlap.clear()
        self.max_inflight = 0
        self.last_metadata = ()

    def _begin(self, method: MethodInfo, request: Message, context: ServicerContext) -> CallRecord:
        metadata: MetadataPairs = ()
        if context is not None:
            metadata = tuple((str(k), v) for k, v in (context.invocation_metadata() or ()))
        self.last_metadata = metadata
        key = self.resource_key(method, request)
        record = CallRecord(method.name, method.path, key, time.monotonic(), metadata=metadata)
        self.calls.append(record)
        if len(self.calls) > self.record_limit:  # a long-running fake keeps the newest half
            del self.calls[: len(self.calls) // 2]
        self._inflight_total += 1
        self.max_inflight = max(self.max_inflight, self._inflight_total)
        if key is not None:
            self._inflight[key] += 1
            self._max_overlap[key] = max(self._max_overlap.get(key, 0), self._inflight[key])
        return record

    def _end(self, record: CallRecord, code: grpc.StatusCode) -> None:
        record.end = time.monotonic()
        record.code = code
        self._inflight_total -= 1
        if record.key is not None:
            self._inflight[record.key] -= 1
            if not self._inflight[record.key]:
                del self._inflight[record.key]

    # -- knobs and misbehaviours ----------------------------------------------------------

    def _active(self) -> list[Misbehaviour]:
        names = sorted(self.knobs.misbehave)
        if names != self._checked_misbehave:  # the set may be edited while running
            try:
                check_misbehaviours(self.spec_name, names)
            except ConfigError as exc:
                raise FakeError(grpc.StatusCode.INTERNAL, f"fake plugin knobs: {exc}") from None
            self._checked_misbehave = names
        return [MISBEHAVIOURS[name] for name in names]

    def _ctx(self, mb: Misbehaviour, method: MethodInfo) -> HookContext:
        return HookContext(self, method, self._hook_state[mb.name])

    async def _prelude(self, method: MethodInfo, request: DynMessage) -> FakeError | None:
        """Apply delays, injected failures and request hooks; the error to answer once the
        method has run (an ``after_call`` failure), if any."""
        delay = self.knobs.delay_for(method.name)
        if delay > 0:
            await asyncio.sleep(delay)
        late = None
        rule = self.knobs.take_failure(method.name)
        if rule is not None:
            message = rule.message or f"injected {rule.code.name} for {method.name} (test knob)"
            if not rule.after_call:
                raise FakeError(rule.code, message)
            late = FakeError(rule.code, message)
        for mb in self._active():
            hook = mb.requests.get(method.name)
            if hook is not None:
                hook(self._ctx(mb, method), request)
        return late

    def _after(self, method: MethodInfo, request: DynMessage, response: DynMessage) -> None:
        hidden = self.knobs.hide_capabilities
        if hidden and method.name.endswith(("GetCapabilities", "GetPluginCapabilities")):
            drop_capabilities(response, hidden)
        for mb in self._active():
            hook = mb.responses.get(method.name)
            if hook is not None:
                hook(self._ctx(mb, method), request, response)

    def _shape_error(self, method: MethodInfo, err: FakeError) -> FakeError:
        if self.knobs.status_in_trailer and not any(k == STATUS_KEY for k, _ in err.trailing):
            status = status_bytes(err.code, err.message)
            err = FakeError(err.code, err.message, (*err.trailing, (STATUS_KEY, status)))
        try:
            active = self._active()
        except FakeError:
            return err
        for mb in active:
            if mb.error is not None:
                err = mb.error(self._ctx(mb, method), err)
        return err

    @staticmethod
    def _internal(method: MethodInfo, exc: Exception) -> FakeError:
        log.exception("fake plugin method %s failed", method.name)
        return FakeError(grpc.StatusCode.INTERNAL, f"fake plugin bug in {method.name}: {exc!r}")

    # -- dispatch (called by the server) --------------------------------------------------

    async def call_unary(
        self, method: MethodInfo, request: Message, context: ServicerContext
    ) -> Message:
        handler: UnaryHandler = getattr(self, method.name)
        record = self._begin(method, request, context)
        code = grpc.StatusCode.UNKNOWN
        try:
            late = await self._prelude(method, request)
            response: Message = await handler(request, context)
            _answer_late(late)
            self._after(method, request, response)
        except FakeError as err:
            code = err.code
            raise self._shape_error(method, err) from None
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            code = grpc.StatusCode.INTERNAL
            raise self._shape_error(method, self._internal(method, exc)) from exc
        else:
            code = grpc.StatusCode.OK
            return response
        finally:
            self._end(record, code)

    async def call_stream(
        self, method: MethodInfo, request: Message, context: ServicerContext
    ) -> AsyncIterator[Message]:
        handler: StreamHandler = getattr(self, method.name)
        record = self._begin(method, request, context)
        code = grpc.StatusCode.UNKNOWN
        try:
            late = await self._prelude(method, request)
            async for response in handler(request, context):
                self._after(method, request, response)
                yield response
            _answer_late(late)
            code = grpc.StatusCode.OK
        except FakeError as err:
            code = err.code
            raise self._shape_error(method, err) from None
        except (asyncio.CancelledError, GeneratorExit):
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            code = grpc.StatusCode.INTERNAL
            raise self._shape_error(method, self._internal(method, exc)) from exc
        finally:
            self._end(record, code)
