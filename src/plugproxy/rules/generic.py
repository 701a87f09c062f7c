"""The generic rules of every spec (docs/rules.md, family 8): how the plugin answers and how
the caller retries, judged from table data (``SpecTable.services``, ``fix_first``,
``fix_first_rpc``, ``backoff``, ``backoff_rpc``, ``pending_code``, ``state_changes``,
``error_codes``) and a memory per spec (:class:`GenericMemory`, bounded and forgotten after
ten minutes; a request is hashed only when that memory could match it).

The validate stage makes one :class:`GenericRules` per method before its first call
(:func:`generic_rules`) and tells it the steps of each call, in this order:

1. :meth:`~GenericRules.arrived` when the request comes, before any wait (only for methods
   whose requests have an object or fields, :attr:`~GenericRules.judges_arrival`);
2. :meth:`~GenericRules.retried` with the request's checks (a unary request only, and
   only while :attr:`GenericMemory.refused_until` says a refusal may be remembered);
3. :meth:`~GenericRules.ended` when the call ends, even one the proxy answered itself,
   before the table's own success or error hooks run;
4. :meth:`~GenericRules.error_status` after the table's error hooks, for an error the
   plugin gave (:func:`answered_by_plugin`).

Each returns the violations to record: the caller's for the first two, the plugin's for the
others. The stage alone decides what is enforced, and which audited request violations the
plugin's answer is judged against (``accepted``).
"""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.message import DecodeError, Message
from google.rpc import status_pb2

# Imported at run time, not only for the type checker: a compiled build refers to these
# compiled classes when this module loads, and they must be loaded first.
from plugproxy.api import Call, MethodInfo, StatusCode
from plugproxy.core.memory import ExpiringMap, ago, digest, parts_digest
from plugproxy.rules.engine import CompiledSpec, FixFirst, ServiceNeeds, StateChange, Violation
from plugproxy.rules.state import CAPABILITY_TTL, SpecState
from plugproxy.spec.keys import KEY_TABLES, keys_of

# How long a refused request and a successful state change are remembered: retries and
# repeats come within minutes; older memory is more likely stale than useful.
RETRY_TTL: Final = 600.0
REPEAT_TTL: Final = 600.0
# retry-without-backoff: this many waits in a row, each shorter than BACKOFF_SHORT, are not
# a back off unless they grow: the last at least BACKOFF_GROWTH times the first, or each one
# longer than the one before by at least BACKOFF_GROWTH times the step before (a doubling
# wait plus a steady overhead of the caller's own: client-go's 5 ms limiter behind a slow
# sidecar). kubelet waits 0.5 s and doubles (cap ~2 min), the CSI sidecars 1 s and double
# (cap 5 min), with or without added jitter: they always grow. A burst with jitter does not.
BACKOFF_WAITS: Final = 3
BACKOFF_SHORT: Final = 10.0
BACKOFF_GROWTH: Final = 1.5
# The first step of a growing series is at least this long and this share of the first
# wait: a steady pace's timing noise (a millisecond or two) makes no growing steps.
BACKOFF_STEP: Final = 0.002
BACKOFF_STEP_SHARE: Final = 0.05
# RPCs a caller polls: a steady pace is a poll, not a retry, unless it is faster than any
# poll (kubelet's volume stats every minute or so, its agg period never sub-second).
BACKOFF_SHORT_RPC: Final = {"NodeGetVolumeStats": 1.0}

# Our own statuses and the caller's cancellations are not the plugin's answers.
_NOT_JUDGED: Final = frozenset({StatusCode.CANCELLED, StatusCode.DEADLINE_EXCEEDED})
DETAILS_KEY: Final = "grpc-status-details-bin"
CANONICAL_STATUSES: Final = frozenset(str(code.value[0]) for code in StatusCode)  # "0".."16"
# Codes a plugin may answer before it reads a request's fields: a bad request refused with
# one of them is not judged for its code (bad-request-wrong-code).
_ANSWERED_FIRST: Final = frozenset(
    {
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
        "ABORTED",
        "UNIMPLEMENTED",
    }
)
# call.stage_state keys of this family.
_DIGEST: Final = "validate.digest"  # the request's digest, computed at most once per call
_FLIGHT: Final = "validate.flight"  # the object keys this call counts in GenericMemory.in_flight


def backs_off(waits: list[float]) -> bool:
    """Whether a series of waits grows as an exponential back off does (see BACKOFF_*)."""
    if waits[-1] >= waits[0] * BACKOFF_GROWTH:
        return True
    steps = [b - a for a, b in itertools.pairwise(waits)]
    if steps[0] < max(BACKOFF_STEP, waits[0] * BACKOFF_STEP_SHARE):
        return False  # no step at all, or one the timing noise of a steady pace explains
    return all(b >= a * BACKOFF_GROWTH for a, b in itertools.pairwise(steps))


@dataclass(slots=True)
class BackoffSeries:
    """Identical requests answered with a back-off row's code, one after the other."""

    code: str
    ended: float | None  # when the last one was answered; None while one is in flight
    waits: list[float]  # the last waits from an answer to the next identical request


class GenericMemory:
    """What the generic rules remember of one spec's calls (SpecState.part), bounded and
    expiring: requests the plugin refused with a fix-first code, the last successful state
    change per object, and which services answered OK lately."""

    def __init__(self, st: SpecState) -> None:
        self.clock = st.clock
        # (rpc, request digest) -> (code, when): answers whose recovery forbids an unchanged
        # retry. ``refused_until`` lets a call skip hashing while nothing can match.
        self.refused: ExpiringMap[tuple[str, bytes], tuple[str, float]] = ExpiringMap(
            st.max_volumes, RETRY_TTL, st.clock
        )
        self.refused_until = 0.0
        # object key -> (rpc, request digest, when) of the last successful state change.
        self.changed: ExpiringMap[str, tuple[str, bytes, float]] = ExpiringMap(
            st.max_volumes, REPEAT_TTL, st.clock
        )
        # (rpc, object key) -> (code, when, digest of the fields the row names): answers
        # whose recovery forbids any retry for the object, or one keeping those fields.
        self.unfixed: ExpiringMap[tuple[str, str], tuple[str, float, bytes]] = ExpiringMap(
            st.max_volumes, RETRY_TTL, st.clock
        )
        # service -> (rpc, when) of its last OK answer; a handful of services.
        self.served: dict[str, tuple[str, float]] = {}
        # service -> (the method's rules, when): an RPC the service's plugin MUST implement
        # answered UNIMPLEMENTED before anything showed the service served; judged when
        # something does, however much later (kubelet registers a plugin hours before it
        # stages).
        self.unimplemented: dict[str, tuple[GenericRules, float]] = {}
        # object key -> calls naming it received and not yet answered; only keys in flight
        # are held, so the calls in flight bound it.
        self.in_flight: dict[str, int] = {}
        # (rpc, object key) -> when the plugin answered it ABORTED (an operation pending).
        self.aborted: ExpiringMap[tuple[str, str], float] = ExpiringMap(
            st.max_volumes, RETRY_TTL, st.clock
        )
        self.aborted_until = 0.0
        # (rpc, request digest) -> identical requests answered with a back-off code.
        self.backoff: ExpiringMap[tuple[str, bytes], BackoffSeries] = ExpiringMap(
            st.max_volumes, RETRY_TTL, st.clock
        )
        # rpc -> until when a series of it may be remembered: only its calls are hashed.
        self.backoff_until: dict[str, float] = {}

    def may_have_refused(self) -> bool:
        if not self.refused_until:
            return False
        if self.clock() < self.refused_until:
            return True
        self.refused.clear()
        self.unfixed.clear()
        self.refused_until = 0.0
        return False

    def may_have_aborted(self) -> bool:
        if not self.aborted_until:
            return False
        if self.clock() < self.aborted_until:
            return True
        self.aborted.clear()
        self.aborted_until = 0.0
        return False

    def may_be_backing_off(self, rpc: str) -> bool:
        until = self.backoff_until.get(rpc)
        if until is None:
            return False
        if self.clock() < until:
            return True
        del self.backoff_until[rpc]  # its series expired with it (same TTL)
        return False

    def refuse(self, key: tuple[str, bytes], code: str) -> None:
        now = self.clock()
        self.refused[key] = (code, now)
        self.refused_until = now + RETRY_TTL

    def serving(self, service: str) -> tuple[str, float] | None:
        entry = self.served.get(service)
        if entry is not None and self.clock() - entry[1] > CAPABILITY_TTL:
            del self.served[service]
            return None
        return entry


def request_digest(call: Call) -> bytes | None:
    """A digest of the call's request: its fields serialized deterministically (a Go CO
    writes maps in random order), or its bytes when they do not decode. Once per call."""
    cached: bytes | None = call.stage_state.get(_DIGEST)
    if cached is not None:
        return cached
    lazy = call.request
    if lazy is None:
        return None
    message = lazy.message
    data = message.SerializeToString(deterministic=True) if message is not None else lazy.raw
    if not data and call.connection:
        # No fields: every caller sends the same bytes, so the connection tells them apart.
        data = b"\x00connection:%d" % call.connection
    found = digest(data)
    call.stage_state[_DIGEST] = found
    return found


def fields_digest(message: Any, names: tuple[str, ...]) -> bytes:
    """A digest of some fields of a request, to tell whether a retry changed them."""
    if not names:
        return b""
    values = (getattr(message, name) for name in names)
    return parts_digest(
        *(
            v.SerializeToString(deterministic=True) if isinstance(v, Message) else repr(v).encode()
            for v in values
        )
    )


def answered_by_plugin(call: Call) -> bool:
    """Whether the call's status is the plugin's answer: not the proxy's own, nor the
    caller's cancellation or deadline."""
    return call.code not in _NOT_JUDGED and not call.details.startswith("plugproxy: ")


def status_problem(raw: str) -> str:
    """Why a grpc-status value is not canonical, without quoting anything long."""
    if not raw:
        return "the plugin's trailers carry no grpc-status"
    if raw.isdigit() and len(raw) <= 10:
        return f"grpc-status {int(raw)} is outside the canonical codes 0-16"
    return "grpc-status is not a canonical code number (0-16)"


def status_details_count(value: bytes | str) -> int | None:
    """Entries in ``details`` of a grpc-status-details-bin value (a google.rpc.Status), or
    None when the bytes are not one. Servers often send the Status with zero details
    (grpcio-status, grpc-java's StatusProto); only entries count."""
    data = value.encode("latin-1") if isinstance(value, str) else bytes(value)
    try:
        return len(status_pb2.Status.FromString(data).details)
    except DecodeError:
        return None


def unreadable_text(text: str) -> str | None:
    """What makes ``text`` no readable text (control characters other than tab and line
    breaks, U+FFFD where bytes were not UTF-8), or None. Never quotes it."""
    controls = sum(1 for c in text if c not in "\t\n\r" and unicodedata.category(c) == "Cc")
    replaced = text.count("\ufffd")
    found = []
    if controls:
        found.append(f"{controls} control character(s)")
    if replaced:
        found.append(f"{replaced} byte sequence(s) that are not UTF-8 (read as U+FFFD)")
    return " and ".join(found) or None


def named(spec: CompiledSpec, capabilities: Sequence[str]) -> str:
    """Capability names for a message, with the table's note on any of them."""
    notes = spec.table.capability_notes
    text = " or ".join(capabilities)
    extra = [f"{n}: {notes[n]}" for n in capabilities if n in notes]
    return f"{text} ({'; '.join(extra)})" if extra else text


def generic_rules(cs: CompiledSpec, state: SpecState, method: MethodInfo) -> GenericRules:
    """The generic rules of ``method``, resolved from its spec's table."""
    t = cs.table
    rpc = method.name
    assert method.request_class is not None
    service = method.service.rsplit(".", 1)[-1]
    needs_service = t.services.get(service)
    requires: bool | tuple[str, tuple[str, ...]] = False
    if needs_service is not None:
        requires = rpc in needs_service.rpcs or needs_service.when.get(rpc, False)
    backoff = set(t.backoff)
    for code, says in t.backoff_rpc.get(rpc, {}).items():
        (backoff.add if says else backoff.discard)(code)
    key_spec = KEY_TABLES.get(t.spec, {}).get(rpc)
    primary = f"{key_spec[0][0]}:" if key_spec else ""
    judge_retries = bool(method.request_class.DESCRIPTOR.fields)
    fix_first = dict(t.fix_first)
    for code, row in t.fix_first_rpc.get(rpc, {}).items():
        if row is None:
            fix_first.pop(code, None)
        else:
            fix_first[code] = row
    own_row = "UNIMPLEMENTED" in t.fix_first_rpc.get(rpc, {})
    if t.state_changes and rpc not in t.state_changes and not own_row:
        # A read-only call the CO makes on a schedule (kubelet's NodeGetVolumeStats every
        # minute, a health monitor's ControllerGetVolume) is polled again, not retried:
        # "MUST NOT retry" after UNIMPLEMENTED is not judged for it, unless the table
        # names the RPC's own row.
        fix_first.pop("UNIMPLEMENTED", None)
    return GenericRules(
        spec=cs,
        state=state,
        memory=state.part(GenericMemory),
        rpc=rpc,
        service=service,
        needs_service=needs_service,
        service_requires=requires,
        gate=t.rpc_gates.get(rpc),
        error_codes=t.error_codes.get(rpc),
        required_rpc=rpc in t.required_rpcs,
        recommended_rpc=rpc in t.recommended_rpcs,
        state_change=t.state_changes.get(rpc),
        fix_first=fix_first,
        judge_retries=judge_retries,
        primary=primary,
        pending_code=t.pending_code if t.pending_rpcs is None or rpc in t.pending_rpcs else None,
        backoff_codes=frozenset(backoff),
        judges_arrival=bool(primary) or judge_retries,
    )


@dataclass(frozen=True, slots=True)
class GenericRules:
    """The generic rules as they apply to one method's calls; its spec's memory is shared
    by all its methods."""

    spec: CompiledSpec
    state: SpecState
    memory: GenericMemory
    rpc: str
    service: str  # short name, "Controller"
    needs_service: ServiceNeeds | None  # this RPC's service, when a plugin serving it has musts
    # the service requires this RPC: always, or while one of (kind, capabilities) is known
    service_requires: bool | tuple[str, tuple[str, ...]]
    gate: tuple[str, tuple[str, ...]] | None  # (kind, capabilities) one of which it needs
    error_codes: frozenset[str] | None
    required_rpc: bool
    recommended_rpc: bool
    state_change: StateChange | None
    fix_first: dict[str, FixFirst]  # code -> row, general and this RPC's own merged
    # The request has fields: identical bytes are one caller's retry. A request without
    # any is judged for fix-first rows only where the connection tells its caller
    # (Call.connection), and never for back-off (a liveness probe polls Probe on one).
    judge_retries: bool
    primary: str  # "<kind>:" of the object the call is about (plugproxy.spec.keys); "": none
    pending_code: str | None  # the "operation pending" row's code
    backoff_codes: frozenset[str]  # codes whose row for this RPC says back off
    judges_arrival: bool  # a request of it has an object (primary) or fields: arrived()

    def capability_kinds(self) -> list[str]:
        """Capability kinds to know before an UNIMPLEMENTED answer is judged: what the
        plugin advertises is learnt before the first such call, as for gated RPCs."""
        requires = self.service_requires
        kinds = [requires[0]] if isinstance(requires, tuple) else []
        needs = self.needs_service
        if requires and needs is not None and needs.advertised_by is not None:
            kinds.append(needs.advertised_by[0])
        return kinds

    # -- the steps of a call ----------------------------------------------------------

    def arrived(self, call: Call) -> Sequence[Violation]:
        """The request came (told only where :attr:`judges_arrival`): counted in flight for
        its object; the caller's, when it retries while an operation is pending or without
        backing off."""
        found: list[Violation] | None = None
        mem = self.memory
        keys = [k for k in keys_of(call) if k.startswith(self.primary)] if self.primary else []
        if keys:
            flight = mem.in_flight
            if mem.may_have_aborted():
                for key in keys:
                    pending = self._retried_while_pending(key)
                    if pending is not None:
                        found = found or []
                        found.append(pending)
            for key in keys:
                flight[key] = flight.get(key, 0) + 1
            call.stage_state[_FLIGHT] = keys
        if self.judge_retries and mem.may_be_backing_off(self.rpc):
            resent = self._resent(call)
            if resent is not None:
                found = found or []
                found.append(resent)
        return found or ()

    def retried(self, call: Call) -> Violation | None:
        """The caller's, when it re-sends a request the plugin refused with a fix-first
        code, or calls again for an object keeping what the refusal said to change."""
        mem = self.memory
        if not mem.refused_until or not (self.judge_retries or call.connection):
            return None
        if not mem.may_have_refused():
            return None
        lazy = call.request
        if lazy is None or (not lazy.raw and not call.connection):
            return None  # no fields and no connection known: other callers send the same
        digest = request_digest(call)
        assert digest is not None
        entry = mem.refused.get((self.rpc, digest))
        if entry is None:
            return self._unfixed(call) if mem.unfixed else None
        code, when = entry
        row = self.fix_first.get(code)
        recovery = row.recovery if row is not None else "MUST change the request first"
        return Violation(
            self.spec.rule(row.rule if row is not None else "retry-without-change"),
            "",
            f"{self.rpc} re-sent unchanged; the plugin answered the same request {code}"
            f" {ago(mem.clock() - when)}, and then the caller {recovery}",
        )

    def ended(self, call: Call, accepted: list[Violation] | None) -> Sequence[Violation]:
        """The call ended, even one the proxy answered itself; told before the table's own
        success or error hooks run. ``accepted``: the audited request violations whose spec
        prescribes the answer. The plugin's, when its status is not canonical; for an OK,
        when an earlier UNIMPLEMENTED of its service shows wrong now or when it accepted a
        bad request; for an error, see :meth:`_failed`."""
        mem = self.memory
        keys = call.stage_state.get(_FLIGHT)
        if keys is not None:  # no longer in flight for its objects
            flight = mem.in_flight
            for key in keys:
                left = flight.get(key, 0) - 1
                if left > 0:
                    flight[key] = left
                else:
                    flight.pop(key, None)
        if call.rejected:
            return ()
        code = call.code
        ok = code is StatusCode.OK
        # Back-off rows are error rows: an OK (most calls) skips reading the code's name.
        backoff = (
            not ok
            and code.name in self.backoff_codes
            and not call.details.startswith("plugproxy: ")
        )
        if backoff or self.rpc in mem.backoff_until:
            self._backoff_answer(call, backoff)
        status = None
        raw = call.raw_status
        if raw is not None and raw not in CANONICAL_STATUSES:
            # Specs without an error scheme (Kubernetes' own plugin APIs) define no such rule.
            rule = self.spec.find("status-code-not-canonical")
            if rule is not None:
                status = Violation(rule, "", f"{status_problem(raw)} (read as {code.name})")
        if not ok:
            return self._failed(call, status, accepted)
        before = None
        if self.needs_service is not None:
            mem.served[self.service] = (self.rpc, mem.clock())
            if mem.unimplemented:
                before = self._unimplemented_before()
        if self.state_change is not None:
            self._changed(call)
        if mem.refused_until:
            self._forget_refusal(call)
        if status is None and before is None and not accepted:
            return ()
        found = [v for v in (status, before) if v is not None]
        if accepted:
            found.append(self._accepted(accepted))
        return found

    def _failed(
        self, call: Call, status: Violation | None, accepted: list[Violation] | None
    ) -> list[Violation]:
        """An error ended the call: the plugin's, when it breaks idempotency or refuses a bad
        request with none of the codes prescribed; what its refusal asks of the caller's
        retries is remembered. ``status``: what :meth:`ended` found of it."""
        found = [] if status is None else [status]
        code = call.code.name
        by_plugin = answered_by_plugin(call)
        if self.state_change is not None:
            repeat = self._not_changed(call, code, by_plugin)
            if repeat is not None:
                found.append(repeat)
        if not by_plugin:
            return found
        if accepted and code not in _ANSWERED_FIRST:
            wrong = self._wrong_code(code, accepted)
            if wrong is not None:
                found.append(wrong)
        if code == self.pending_code and self.primary:
            self._pending(call)
        self._refused(call, code)
        return found

    def error_status(self, call: Call) -> list[Violation]:
        """The plugin's error (told after the table's error hooks ran, for a status
        :func:`answered_by_plugin`): its message, its details, and whether its code is one
        the RPC may answer."""
        cs = self.spec
        code = call.code
        out: list[Violation] = []
        # Specs without an error scheme (Kubernetes' own plugin APIs) define neither rule.
        empty, details = cs.find("error-message-empty"), cs.find("status-details-nonempty")
        if not call.details and empty is not None:
            out.append(Violation(empty, "", f"{code.name} status with an empty message"))
        elif empty is not None and (not call.details.isprintable() or "\ufffd" in call.details):
            problem = unreadable_text(call.details)
            if problem is not None:
                rule = cs.rule("error-message-unreadable")
                out.append(Violation(rule, "", f"{code.name} status message holds {problem}"))
        for key, value in call.trailing_metadata:
            if key != DETAILS_KEY or not value or details is None:
                continue
            count = status_details_count(value)
            if count != 0:
                what = "undecodable status details" if count is None else f"{count} detail(s)"
                out.append(
                    Violation(
                        details,
                        "",
                        f"{code.name} status carries {what} in {DETAILS_KEY}",
                    )
                )
        if code is StatusCode.UNIMPLEMENTED:
            why = None
            if self.required_rpc:
                why = "an RPC every plugin implements"
            elif self.gate is not None:
                caps = self.state.known_capabilities(self.gate[0])
                advertised = [c for c in self.gate[1] if caps is not None and c in caps]
                if advertised:
                    why = f"required while the plugin advertises {named(cs, advertised)}"
            if why is None and self.service_requires:
                why = self._served_why()
                if why is None and self.needs_service is not None:
                    self.memory.unimplemented[self.service] = (self, self.memory.clock())
            if why is not None:
                out.append(
                    Violation(
                        cs.rule("unimplemented-advertised"),
                        "",
                        f"{self.rpc} answered UNIMPLEMENTED but it is {why}",
                    )
                )
            elif self.recommended_rpc:
                out.append(
                    Violation(
                        cs.rule("unimplemented-recommended"),
                        "",
                        f"{self.rpc} answered UNIMPLEMENTED; the spec asks plugins to"
                        " implement every RPC of the service",
                    )
                )
        elif self.error_codes is not None:
            name = code.name
            if name not in self.error_codes and name not in cs.table.general_codes:
                out.append(
                    Violation(
                        cs.rule("error-code-unexpected"),
                        "",
                        f"{self.rpc} answered {name}, which is not in its error table nor a"
                        " general error code",
                    )
                )
        return out

    # -- services --------------------------------------------------------------------

    def _unimplemented_before(self) -> Violation | None:
        """An RPC of this service answered UNIMPLEMENTED before anything showed the
        service served (kubelet asks NodeGetInfo first); this OK shows it now."""
        entry = self.memory.unimplemented.pop(self.service, None)
        if entry is None:
            return None
        earlier, when = entry
        if earlier is self:
            return None
        why = earlier._served_why()  # with this answer as the evidence
        if why is None:
            return None
        elapsed = self.memory.clock() - when
        message = f"{earlier.rpc} answered UNIMPLEMENTED {ago(elapsed)}, but it is {why}"
        return Violation(self.spec.rule("unimplemented-advertised"), "", message)

    def _served_why(self) -> str | None:
        """Why the plugin MUST implement this RPC as part of a service it serves."""
        needs = self.needs_service
        assert needs is not None
        st = self.state
        condition = self.service_requires
        because = ""
        if isinstance(condition, tuple):
            kind, wanted = condition
            caps = st.known_capabilities(kind)
            advertised = [c for c in wanted if caps is not None and c in caps]
            if not advertised:
                return None
            because = f" while the plugin advertises {named(self.spec, advertised)}"
        evidence = None
        if needs.advertised_by is not None:
            kind, name = needs.advertised_by
            caps = st.known_capabilities(kind)
            if caps is not None and name in caps:
                evidence = f"it advertises {name}"
        if evidence is None:
            seen = self.memory.serving(self.service)
            if seen is None:
                return None
            rpc, when = seen
            evidence = f"{rpc} answered OK {ago(self.memory.clock() - when)}"
        return (
            f"required of a plugin serving the {self.service} service{because}, which this"
            f" plugin does ({evidence})"
        )

    # -- bad requests answered ----------------------------------------------------------

    def _wrong_code(self, code: str, found: list[Violation]) -> Violation | None:
        """A refusal of a bad request with none of the codes its breaches prescribe."""
        prescribed = sorted({v.rule.reject_code for v in found if v.rule.reject_code})
        rule = self.spec.find("bad-request-wrong-code")
        if rule is None or not prescribed or code in prescribed:
            return None
        first = found[0]
        where = f" at {first.field}" if first.field else ""
        return Violation(
            rule,
            first.field,
            f"{self.rpc} answered {code} to a request breaking {first.rule.id}{where}; the"
            f" spec prescribes {' or '.join(prescribed)}",
        )

    def _accepted(self, found: list[Violation]) -> Violation:
        first = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        where = f" at {first.field}" if first.field else ""
        return Violation(
            self.spec.rule("bad-request-accepted"),
            first.field,
            f"{self.rpc} answered OK to a request breaking {first.rule.id}{where}{more}; the"
            f" spec prescribes {first.rule.reject_code}",
        )

    # -- retries and repeats ------------------------------------------------------------

    def _unfixed(self, call: Call) -> Violation | None:
        """The CO calls again for an object after an answer whose recovery forbids any retry
        for it, or one keeping the fields the recovery names; not an identical re-send."""
        rule = self.spec.find("retry-unfixed")
        req = call.request.message if call.request is not None else None
        if rule is None or req is None or not self.primary:
            return None
        mem = self.memory
        for key in keys_of(call):
            entry = mem.unfixed.get((self.rpc, key)) if key.startswith(self.primary) else None
            if entry is None:
                continue
            code, when, kept = entry
            row = self.fix_first.get(code)
            if row is None or row.must_change is None:
                continue
            if fields_digest(req, row.must_change) != kept:
                continue
            names = ", ".join(row.must_change)
            unchanged = f" ({names} unchanged)" if names else ""
            return Violation(
                rule,
                names,
                f"{self.rpc} called again for the same {self.primary[:-1]}{unchanged}; the"
                f" plugin answered {code} for it {ago(mem.clock() - when)}, and then the"
                f" caller {row.recovery}",
            )
        return None

    def _refused(self, call: Call, code: str) -> None:
        """Remember a request the plugin refused with a code whose recovery forbids an
        unchanged retry; any other answer forgets an earlier refusal of it."""
        row = self.fix_first.get(code)
        judged = self.judge_retries or call.connection
        if row is not None and judged and call.request is not None:
            req = call.request.message
            if row.when is None or (req is not None and row.when(self.state, req)):
                digest = request_digest(call)
                assert digest is not None
                self.memory.refuse((self.rpc, digest), code)
                if row.must_change is not None and req is not None and self.primary:
                    kept = fields_digest(req, row.must_change)
                    now = self.memory.clock()
                    for key in keys_of(call):
                        if key.startswith(self.primary):
                            self.memory.unfixed[(self.rpc, key)] = (code, now, kept)
                return
        if self.memory.refused_until:
            self._forget_refusal(call)

    def _forget_refusal(self, call: Call) -> None:
        mem = self.memory
        digest = call.stage_state.get(_DIGEST)  # hashed at request time if it could match
        if digest is not None:
            mem.refused.pop((self.rpc, digest), None)
        if mem.unfixed and self.primary:  # another answer for the object ends its refusal
            for key in keys_of(call):
                if key.startswith(self.primary):
                    mem.unfixed.pop((self.rpc, key), None)

    def _objects(self, call: Call) -> tuple[str, ...]:
        change = self.state_change
        assert change is not None
        keys = keys_of(call)
        if not change.paths or call.request is None:
            return keys
        req = call.request.message
        if req is None:
            return keys
        paths = tuple(f"{name}:{getattr(req, name)}" for name in change.paths if getattr(req, name))
        return keys + paths

    def _changed(self, call: Call) -> None:
        """A successful state change: the last one on its objects, unless not final."""
        change = self.state_change
        assert change is not None
        objects = self._objects(call)
        if not objects:
            return
        mem = self.memory
        final = True
        if change.final is not None:
            resp = call.response.message if call.response is not None else None
            final = resp is not None and change.final(resp)
        if not change.broken_by or not final:
            for key in objects:
                mem.changed.pop(key, None)
            return
        digest = request_digest(call)
        assert digest is not None
        now = mem.clock()
        for key in objects:
            mem.changed[key] = (self.rpc, digest, now)

    def _not_changed(self, call: Call, code: str, by_plugin: bool) -> Violation | None:
        """A state change failed: a violation when it repeats the last successful one on
        the same objects with an answer idempotency rules out; otherwise the objects'
        state is unknown again."""
        change = self.state_change
        assert change is not None
        objects = self._objects(call)
        if not objects:
            return None
        mem = self.memory
        entries = [mem.changed.get(key) for key in objects]
        if all(e is None for e in entries):
            return None
        digest = request_digest(call)
        repeat = all(e is not None and e[0] == self.rpc and e[1] == digest for e in entries)
        if not repeat:
            for key in objects:
                mem.changed.pop(key, None)
            return None
        # The same operation failed: what it did before still stands; memory stays.
        if not by_plugin or code not in change.broken_by:
            return None
        when = min(e[2] for e in entries if e is not None)
        return Violation(
            self.spec.rule("not-idempotent"),
            "",
            f"{self.rpc} repeated unchanged answered {code}; the same request succeeded"
            f" {ago(mem.clock() - when)} and no other change of its objects was seen since"
            " (the operation MUST be idempotent)",
        )

    # -- calls in flight and back off ---------------------------------------------------

    def _retried_while_pending(self, key: str) -> Violation | None:
        """A call for ``key`` after the plugin answered ABORTED for it, while another call
        for it is still in flight: retry-while-pending."""
        mem = self.memory
        when = mem.aborted.pop((self.rpc, key), None)
        others = mem.in_flight.get(key, 0)
        if when is None or not others:
            return None
        return Violation(
            self.spec.rule("retry-while-pending"),
            "",
            f"{self.rpc} retried while {others} other call(s) for the same {self.primary[:-1]}"
            f" are in flight; the plugin answered it ABORTED {ago(mem.clock() - when)} and"
            " the caller SHOULD ensure no other call for it is pending first",
        )

    def _pending(self, call: Call) -> None:
        """The plugin answered "operation pending": the next call is a retry to judge."""
        mem = self.memory
        now = mem.clock()
        for key in keys_of(call):
            if key.startswith(self.primary):
                mem.aborted[(self.rpc, key)] = now
                mem.aborted_until = now + RETRY_TTL

    def _resent(self, call: Call) -> Violation | None:
        """An identical request after back-off answers: one more wait of the series."""
        lazy = call.request
        if lazy is None or not lazy.raw:
            return None
        digest = request_digest(call)
        assert digest is not None
        mem = self.memory
        series = mem.backoff.get((self.rpc, digest))
        if series is None or series.ended is None:
            return None  # none, or an identical one is still in flight: not a retry after it
        waits = series.waits
        waits.append(mem.clock() - series.ended)
        series.ended = None
        if len(waits) > BACKOFF_WAITS:
            del waits[0]
        short = BACKOFF_SHORT_RPC.get(self.rpc, BACKOFF_SHORT)
        if len(waits) < BACKOFF_WAITS or max(waits) >= short or backs_off(waits):
            return None
        shown = ", ".join(f"{w:.1f}s" for w in waits)
        found = Violation(
            self.spec.rule("retry-without-backoff"),
            "",
            f"{self.rpc} re-sent unchanged after {len(waits)} {series.code} answers in a row,"
            f" waiting {shown} after each: the waits do not grow, and the recovery for"
            f" {series.code} says retry with exponential back off",
        )
        waits.clear()  # the next report needs a new series of waits
        return found

    def _backoff_answer(self, call: Call, backoff: bool) -> None:
        """A back-off answer ends one request of a series; any other answer ends the series."""
        mem = self.memory
        if not backoff or not self.judge_retries:
            digest = call.stage_state.get(_DIGEST)  # hashed on arrival if a series could match
            if digest is not None:
                mem.backoff.pop((self.rpc, digest), None)
            return
        lazy = call.request
        if lazy is None or not lazy.raw:
            return
        digest = request_digest(call)
        assert digest is not None
        now = mem.clock()
        key = (self.rpc, digest)
        series = mem.backoff.get(key)
        if series is None or series.code != call.code.name:
            mem.backoff[key] = BackoffSeries(call.code.name, now, [])
        else:
            series.ended = now
            mem.backoff[key] = series  # touch: it lives while the retries go on
        mem.backoff_until[self.rpc] = now + RETRY_TTL
