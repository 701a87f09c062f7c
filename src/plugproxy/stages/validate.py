"""Validation: judge CO requests and plugin responses against the spec's rules at runtime.

Ordering: fourth, after calllog (violations carry the call's request id) and before
serialize (a rejected request never waits for a volume lock).

Modes (``--validation``, per rule ``--rule ID=MODE``):

- ``audit`` (default): calls pass untouched; each violation is logged, counted
  (``plugproxy_violations_total`` and ``GET /violations``; with ``--violations-file`` also
  appended to a file that outlives a restart, :mod:`plugproxy.rules.violationlog`) and added as a
  call event.
- ``enforce``: a request breaking a MUST rule whose spec prescribes the answer is answered
  by the proxy itself, with that answer, and never reaches the plugin (INVALID_ARGUMENT;
  FAILED_PRECONDITION for NodePublishVolume before NodeStageVolume); the report counts the
  violations of such calls as rejected. SHOULD rules and MUST rules without a prescribed
  answer are reported only. Responses are never altered or blocked, only audited.
- ``off``: the stage is not built at all.

The rules are data (:mod:`plugproxy.rules`), compiled per message type for each spec before
its first call (a spec the registry lists on a first call is compiled then). The stage
is fail-closed: an exception in a request check ends the call with INTERNAL. Requests are
judged whole; a large response is judged on the sample :mod:`plugproxy.core.sampling` takes of
its long lists, violations naming entries by their real index.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from google.protobuf.message import DecodeError, Message
from google.rpc import status_pb2
from prometheus_client import Counter

from plugproxy import __version__
from plugproxy.api import (
    Call,
    LazyMessage,
    MethodInfo,
    Reject,
    Runtime,
    SpecInfo,
    Stage,
    StatusCode,
)
from plugproxy.core.endpoints import ConfigError
from plugproxy.core.memory import ExpiringMap, ago, digest, parts_digest, remember
from plugproxy.core.options import (
    SIZE_HELP,
    Option,
    Origins,
    byte_size,
    duration,
    options_of,
    setting,
)
from plugproxy.core.sampling import Sample
from plugproxy.rules import TABLES, all_rules, annotated, find_rule
from plugproxy.rules.csi_common import capability_names
from plugproxy.rules.engine import (
    CO,
    JUDGED_RESPONSE,
    JUDGED_WHOLE,
    MUST,
    PLUGIN,
    CompiledSpec,
    FixFirst,
    Rule,
    ServiceNeeds,
    StateChange,
    Violation,
    checked_positions,
    compile_table,
)
from plugproxy.rules.state import CAPABILITY_TTL, MAX_OBJECTS, SpecState
from plugproxy.rules.violationlog import (
    DEFAULT_MAX_BYTES,
    MIN_MAX_BYTES,
    Tally,
    ViolationFile,
    utc,
)
from plugproxy.spec.keys import KEY_TABLES, keys_of

OFF, AUDIT, ENFORCE = "off", "audit", "enforce"
MODES = (OFF, AUDIT, ENFORCE)


@dataclass(frozen=True)
class ValidateSettings:
    validation: str = setting(
        "--validation",
        "judge calls against the spec: off, audit (log and count) or enforce (also reject"
        " bad requests)",
        default=AUDIT,
        choices=MODES,
    )
    rule: tuple[str, ...] = setting(
        "--rule",
        "mode of one rule, overriding --validation (e.g. csi.size-limit=off)",
        repeatable=True,
        metavar="ID=MODE",
    )
    capability_query_timeout: float = setting(
        "--capability-query-timeout",
        "longest wait when the proxy asks the plugin for its capabilities itself",
        default=1.0,
        type=duration,
        metavar="DURATION",
    )
    max_remembered_objects: int = setting(
        "--max-remembered-objects",
        "the stateful rules remember at most this many objects (volumes, snapshots, nodes,"
        " paths, requests) in each of their memories, per spec, forgetting the one set"
        " longest ago first; a forgotten object may cost a missed violation, never a false"
        " one. About 2.5 KB per volume a controller publishes (docs/performance.md)",
        default=MAX_OBJECTS,
        type=int,
        metavar="N",
    )
    violations_file: str | None = setting(
        "--violations-file",
        "append each violation to this file (JSON lines) and count what it holds at start,"
        " so the record outlives a restart; `plugproxy report --file PATH` reads it. Put it"
        " on a volume that outlives what it must (docs/observability.md)",
        metavar="PATH",
    )
    violations_file_max_bytes: int = setting(
        "--violations-file-max-bytes",
        "the violations file and the one it was rotated to (PATH.1) hold at most this"
        f" together; the latest records are kept ({SIZE_HELP})",
        default=DEFAULT_MAX_BYTES,
        type=byte_size,
        metavar="SIZE",
    )
    origins: Origins = field(default_factory=Origins)  # what an error calls a setting


OPTIONS: list[Option] = options_of(ValidateSettings)

# Our own statuses and the caller's cancellations are not the plugin's answers.
_NOT_JUDGED = frozenset({StatusCode.CANCELLED, StatusCode.DEADLINE_EXCEEDED})
DETAILS_KEY = "grpc-status-details-bin"
CANONICAL_STATUSES = frozenset(str(code.value[0]) for code in StatusCode)  # "0".."16"

# How long a refused request and a successful state change are remembered: retries and
# repeats come within minutes; older memory is more likely stale than useful.
RETRY_TTL = 600.0
REPEAT_TTL = 600.0
# retry-without-backoff: this many waits in a row, each shorter than BACKOFF_SHORT, are not
# a back off unless they grow: the last at least BACKOFF_GROWTH times the first, or each one
# longer than the one before by at least BACKOFF_GROWTH times the step before (a doubling
# wait plus a steady overhead of the caller's own: client-go's 5 ms limiter behind a slow
# sidecar). kubelet waits 0.5 s and doubles (cap ~2 min), the CSI sidecars 1 s and double
# (cap 5 min), with or without added jitter: they always grow. A burst with jitter does not.
BACKOFF_WAITS = 3
BACKOFF_SHORT = 10.0
BACKOFF_GROWTH = 1.5
# The first step of a growing series is at least this long and this share of the first
# wait: a steady pace's timing noise (a millisecond or two) makes no growing steps.
BACKOFF_STEP = 0.002
BACKOFF_STEP_SHARE = 0.05
# RPCs a caller polls: a steady pace is a poll, not a retry, unless it is faster than any
# poll (kubelet's volume stats every minute or so, its agg period never sub-second).
BACKOFF_SHORT_RPC = {"NodeGetVolumeStats": 1.0}
# call.stage_state keys of this stage.
_DIGEST = "validate.digest"  # the request's digest, computed at most once per call
_ACCEPTED = "validate.accepted"  # audited request violations the spec prescribes an answer for
# Codes a plugin may answer before it reads a request's fields: a bad request refused with
# one of them is not judged for its code (bad-request-wrong-code).
_ANSWERED_FIRST = frozenset(
    {
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
        "ABORTED",
        "UNIMPLEMENTED",
    }
)
_FLIGHT = "validate.flight"  # the object keys this call counts in GenericMemory.in_flight


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
        # service -> (rpc, when): an RPC the service's plugin MUST implement answered
        # UNIMPLEMENTED before anything showed the service served; judged when something
        # does, however much later (kubelet registers a plugin hours before it stages).
        self.unimplemented: dict[str, tuple[str, float]] = {}
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


def status_problem(raw: str) -> str:
    """Why a grpc-status value is not canonical, without quoting anything long."""
    if not raw:
        return "the plugin's trailers carry no grpc-status"
    if raw.isdigit() and len(raw) <= 10:
        return f"grpc-status {int(raw)} is outside the canonical codes 0-16"
    return "grpc-status is not a canonical code number (0-16)"


def parse_rule_modes(
    items: Iterable[str], known: Container[str], source: str = "--rule"
) -> dict[str, str]:
    """'ID=MODE' items -> {rule id: mode}; ConfigError naming the first bad item and where it
    came from (``source``: the flag or its environment variable)."""
    out: dict[str, str] = {}
    for item in items:
        rule_id, sep, mode = item.partition("=")
        rule_id, mode = rule_id.strip(), mode.strip().lower()
        if not sep or not rule_id:
            raise ConfigError(f"{source} {item!r}: expected ID=off|audit|enforce")
        if mode not in MODES:
            raise ConfigError(f"{source} {item!r}: mode must be off, audit or enforce")
        if rule_id not in known:
            raise ConfigError(
                f"{source} {item!r}: unknown rule id {rule_id!r} (see docs/rules.md for the list)"
            )
        out[rule_id] = mode
    return out


class ViolationReport:
    """Counts per (rule, method, party) for GET /violations, and the calls judged, by spec;
    read from the admin thread. With a violations file it starts from what the file holds
    (earlier runs) and appends each violation to it."""

    def __init__(
        self,
        mode: str = AUDIT,
        rule_modes: Mapping[str, str] | None = None,
        earlier: Tally | None = None,
        file: ViolationFile | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.run = os.urandom(4).hex()  # this run's id in the file's records
        self.mode = mode
        self.rule_modes = dict(rule_modes or {})
        self.tally = earlier if earlier is not None else Tally()
        self.tally.mark_earlier()
        self.tally.seen(self.started)
        self.tally.run(self.run).update(started=self.started, mode=mode, rule_modes=self.rule_modes)
        self.file = file
        # Calls the stage judged in this run (their answer included), by spec: the report's
        # denominator. Written on the event loop; the admin thread and the file's writer
        # read copies (dict.copy is atomic).
        self.judged: dict[str, int] = {}

    @property
    def calls_judged(self) -> int:
        return sum(self.tally.calls_judged(self.judged.copy()).values())

    def run_record(self) -> dict[str, Any]:
        """This run's ``run`` record for the violations file."""
        return {
            "time": self.started,
            "run": self.run,
            "started": self.started,
            "mode": self.mode,
            "rule_modes": self.rule_modes,
            "version": __version__,
            "host": socket.gethostname(),
        }

    def add(
        self,
        spec: str,
        rule: Rule,
        method: str,
        party: str,
        section: str,
        message: str,
        field: str = "",
        request_id: str = "",
        rejected: bool = False,
    ) -> None:
        now = time.time()
        with self._lock:
            self.tally.violation(
                now,
                spec,
                rule.id,
                rule.level,
                method,
                party,
                section,
                message,
                field,
                request_id,
                rejected,
                self.run,
            )
        if self.file is not None:
            self.file.add(
                {
                    "event": "violation",
                    "time": now,
                    "run": self.run,
                    "spec": spec,
                    "rule": rule.id,
                    "level": rule.level,
                    "party": party,
                    "method": method,
                    "field": field,
                    "section": section,
                    "request_id": request_id,
                    "rejected": rejected,
                    "message": message,
                }
            )

    def body(self) -> dict[str, Any]:
        with self._lock:
            data = self.tally.report(time.time(), self.run, self.judged.copy())
        data["started"] = utc(self.started)
        if self.file is not None:
            data["violations_file"] = {
                "path": self.file.path,
                "max_bytes": self.file.max_bytes,
                "write_errors": self.file.write_errors,
                "lost": self.file.lost,
            }
        return data

    def snapshot(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self.body()["violations"]
        return entries

    def handler(self) -> tuple[int, str, bytes]:
        return 200, "application/json", json.dumps(self.body(), indent=1).encode() + b"\n"


@dataclass(frozen=True, slots=True)
class _Plan:
    """Everything one method's calls need, resolved before its first call."""

    spec: CompiledSpec
    spec_name: str  # the spec's name, "csi.v1": reports count calls judged by it
    state: SpecState
    rpc: str
    request_checker: Any
    response_checker: Any
    request_checks: tuple[Any, ...]
    response_checks: tuple[Any, ...]
    on_success: tuple[Any, ...]
    on_error: tuple[Any, ...]
    gate: tuple[str, tuple[str, ...]] | None
    needs: tuple[str, ...]  # capability kinds to know before the request checks
    capability_kind: str | None  # this RPC's response lists capabilities of that kind
    error_codes: frozenset[str] | None
    required_rpc: bool
    recommended_rpc: bool
    malformed: Rule
    memory: GenericMemory
    service: str  # short name, "Controller"
    needs_service: ServiceNeeds | None  # this RPC's service, when a plugin serving it has musts
    # the service requires this RPC: always, or while one of (kind, capabilities) is known
    service_requires: bool | tuple[str, tuple[str, ...]]
    state_change: StateChange | None
    fix_first: dict[str, FixFirst]  # code -> row, general and this RPC's own merged
    # The request has fields: identical bytes are one caller's retry. A request without
    # any is judged for fix-first rows only where the connection tells its caller
    # (Call.connection), and never for back-off (a liveness probe polls Probe on one).
    judge_retries: bool
    primary: str  # "<kind>:" of the object the call is about (plugproxy.spec.keys); "": none
    pending_code: str | None  # the "operation pending" row's code
    backoff_codes: frozenset[str]  # codes whose row for this RPC says back off
    # Hashes of the wire bytes of sampled list entries the response checker found clean.
    # Its checks read nothing but the entry, so the same bytes listed again are not judged
    # again: a CO polling an unchanged listing pays only for what changed.
    clean_entries: OrderedDict[int, None]


def _named(plan: _Plan, capabilities: Iterable[str]) -> str:
    """Capability names for a message, with the table's note on any of them."""
    names = list(capabilities)
    notes = plan.spec.table.capability_notes
    text = " or ".join(names)
    extra = [f"{n}: {notes[n]}" for n in names if n in notes]
    return f"{text} ({'; '.join(extra)})" if extra else text


def status_details_count(value: bytes | str) -> int | None:
    """Entries in ``details`` of a grpc-status-details-bin value (a google.rpc.Status), or
    None when the bytes are not one. Servers often send the Status with zero details
    (grpcio-status, grpc-java's StatusProto); only entries count."""
    data = value.encode("latin-1") if isinstance(value, str) else bytes(value)
    try:
        return len(status_pb2.Status.FromString(data).details)
    except DecodeError:
        return None


# Entries remembered clean per method: a few pages' samples, a few hundred KB at most.
CLEAN_ENTRIES_MAX = 4_096


def _check_sample(plan: _Plan, sample: Sample) -> list[Violation]:
    """The response checker over a sampled message, skipping entries of its cut lists whose
    bytes were found clean before; what it finds names entries by their real index."""
    clean = plan.clean_entries
    # A list keeps one entry at least, known or not: a check of the list itself (a REQUIRED
    # list must not be empty) sees what the sample showed it.
    fresh = {
        name: [p for p, raw in enumerate(raws) if hash(raw) not in clean] or [0]
        for name, raws in sample.raw.items()
    }
    whole = all(len(fresh[name]) == len(raws) for name, raws in sample.raw.items())
    found: list[Violation] = []
    plan.response_checker(sample.message if whole else sample.subset(fresh), "", found)
    for name, positions in fresh.items():
        flagged = {_entry_position(v.field, name) for v in found}
        raws = sample.raw[name]
        for j in checked_positions(len(positions)):
            if j not in flagged:
                remember(clean, hash(raws[positions[j]]), None, CLEAN_ENTRIES_MAX)
    real = {name: [sample.indices[name][p] for p in positions] for name, positions in fresh.items()}
    return [_real_index(v, real) for v in found]


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


def _entry_position(field: str, name: str) -> int | None:
    """The index in ``name[<index>]...``, the path of a violation in an entry of list ``name``."""
    if field.startswith(name + "["):
        position = field[len(name) + 1 :].partition("]")[0]
        if position.isdigit():
            return int(position)
    return None


def _real_index(violation: Violation, indices_of: Mapping[str, Sequence[int]]) -> Violation:
    """Name the entry a violation found in a sampled list by its index in the real list
    (``indices_of``: each cut list's real index of each entry of the judged message)."""
    for name, indices in indices_of.items():
        prefix = name + "["
        if violation.field.startswith(prefix):
            position, bracket, rest = violation.field[len(prefix) :].partition("]")
            if bracket and position.isdigit() and int(position) < len(indices):
                old = f"{prefix}{position}]"
                new = f"{prefix}{indices[int(position)]}]"
                return replace(
                    violation,
                    field=new + rest,
                    message=violation.message.replace(old, new, 1),
                )
    return violation


class ValidateStage(Stage):
    name = "validate"
    fail_open = False

    def __init__(
        self,
        runtime: Runtime,
        mode: str,
        rule_modes: dict[str, str],
        query_timeout: float = 1.0,
        file: ViolationFile | None = None,
        max_objects: int = MAX_OBJECTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runtime = runtime
        self.max_objects = max_objects  # the bound of each memory of a spec's rules
        self.clock = clock  # what the rules' memories age by (tests give their own)
        self.logger = runtime.logger
        self.upstream = runtime.upstream
        self.query_timeout = query_timeout
        self.mode = mode
        self.rule_modes = rule_modes  # --rule overrides, by rule id
        self.counter: Any = None
        if runtime.metrics is not None:
            self.counter = Counter(
                "plugproxy_violations",
                "Spec rule violations seen, by spec, rule, level, party and method",
                ["spec", "rule", "level", "party", "method"],
                registry=runtime.metrics,
            )
        earlier = None
        if file is not None:
            earlier = file.load()
            if runtime.metrics is not None:
                file.errors = Counter(
                    "plugproxy_violations_file_write_errors",
                    "Appends to the violations file that failed (their violations stay"
                    " counted in memory)",
                    registry=runtime.metrics,
                )
        self.report = ViolationReport(mode, rule_modes, earlier, file)
        if file is not None:
            file.open(self.report.run_record(), self.report.judged.copy)
            assert earlier is not None
            self.logger.info(
                "violations file",
                path=file.path,
                earlier_runs=len(earlier.runs) - 1,
                earlier_violations=sum(e["count"] for e in earlier.entries.values()),
                since=utc(earlier.first) if earlier.first is not None else None,
                unreadable_lines=earlier.unreadable,
            )
        runtime.admin_routes["/violations"] = self.report.handler
        self._queries: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._plans: dict[str, _Plan] = {}
        # Specs whose table is compiled and methods planned: those the registry has listed
        # now, and each one it lists later when its first method comes by (wants).
        self._prepared: set[str] = set()
        for method in runtime.registry.methods():
            if method.spec is not None:
                self._prepare(method.spec)

    def _prepare(self, spec: SpecInfo) -> None:
        if spec.name in self._prepared:
            return
        self._prepared.add(spec.name)
        table = TABLES.get(spec.name) if spec.bundled else annotated.table_for(spec)
        if table is None:
            return
        compiled = compile_table(table, spec)
        state = SpecState(self.max_objects, clock=self.clock)
        for method in self.runtime.registry.methods(spec.name):
            self._plans[method.path] = self._plan(compiled, state, method)

    def _mode(self, rule_id: str) -> str:
        return self.rule_modes.get(rule_id, self.mode)

    async def startup(self) -> None:
        if self.report.file is not None:
            self.report.file.start()

    async def shutdown(self) -> None:
        if self.report.file is not None:
            await asyncio.to_thread(self.report.file.close)

    def _plan(self, cs: CompiledSpec, state: SpecState, method: MethodInfo) -> _Plan:
        t = cs.table
        rpc = method.name
        assert method.request_class is not None and method.response_class is not None
        gate = t.rpc_gates.get(rpc)
        needs = list(t.capability_needs.get(rpc, ()))
        if gate is not None and gate[0] not in needs:
            needs.insert(0, gate[0])
        service = method.service.rsplit(".", 1)[-1]
        needs_service = t.services.get(service)
        requires: bool | tuple[str, tuple[str, ...]] = False
        if needs_service is not None:
            requires = rpc in needs_service.rpcs or needs_service.when.get(rpc, False)
            # An UNIMPLEMENTED answer is judged by what the plugin advertises, so a fresh
            # proxy learns that before the first such call, as it does for gated RPCs.
            kinds = [requires[0]] if isinstance(requires, tuple) else []
            if requires and needs_service.advertised_by is not None:
                kinds.append(needs_service.advertised_by[0])
            needs += [k for k in kinds if k not in needs]
        backoff = set(t.backoff)
        for code, says in t.backoff_rpc.get(rpc, {}).items():
            (backoff.add if says else backoff.discard)(code)
        key_spec = KEY_TABLES.get(t.spec, {}).get(rpc)
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
        return _Plan(
            spec=cs,
            spec_name=t.spec,
            state=state,
            rpc=rpc,
            request_checker=cs.checkers.get(method.request_class.DESCRIPTOR.full_name),
            response_checker=cs.response_checkers.get(method.response_class.DESCRIPTOR.full_name),
            request_checks=t.request_checks.get(rpc, ()),
            response_checks=t.response_checks.get(rpc, ()),
            on_success=t.on_success.get(rpc, ()),
            on_error=t.on_error.get(rpc, ()),
            gate=gate,
            needs=tuple(k for k in needs if k in t.capability_queries),
            capability_kind=t.capability_responses.get(rpc),
            error_codes=t.error_codes.get(rpc),
            required_rpc=rpc in t.required_rpcs,
            recommended_rpc=rpc in t.recommended_rpcs,
            malformed=cs.rule("malformed-message"),
            memory=state.part(GenericMemory),
            service=service,
            needs_service=needs_service,
            service_requires=requires,
            state_change=t.state_changes.get(rpc),
            fix_first=fix_first,
            judge_retries=bool(method.request_class.DESCRIPTOR.fields),
            primary=f"{key_spec[0][0]}:" if key_spec else "",
            pending_code=t.pending_code
            if t.pending_rpcs is None or rpc in t.pending_rpcs
            else None,
            backoff_codes=frozenset(backoff),
            clean_entries=OrderedDict(),
        )

    def wants(self, method: MethodInfo) -> bool:
        if method.path not in self._plans and method.spec is not None:
            self._prepare(method.spec)
        return method.path in self._plans

    # -- requests -------------------------------------------------------------------------

    def on_start(self, call: Call) -> Awaitable[None] | None:
        plan = self._plans[call.method.path]
        request = call.request
        if request is None:
            return None  # client-streaming: judged message by message in on_request
        # Arrival, before any wait: the serialize stage after this one may queue the call.
        if plan.primary:
            self._arrived(plan, call)
        if plan.judge_retries and plan.memory.may_be_backing_off(plan.rpc):
            self._resent(plan, call)
        if plan.needs and self._must_learn(plan):
            return self._learn_then_judge(plan, call, request)
        self._judge_request(plan, call, request)
        return None

    @staticmethod
    def _must_learn(plan: _Plan) -> bool:
        st = plan.state
        return any(
            st.known_capabilities(kind) is None and st.may_query(kind) for kind in plan.needs
        )

    async def _learn_then_judge(self, plan: _Plan, call: Call, request: LazyMessage) -> None:
        await self._learn_capabilities(plan, call)
        self._judge_request(plan, call, request)

    def on_request(self, call: Call, message: LazyMessage) -> None:
        self._judge_request(self._plans[call.method.path], call, message)

    def _judge_request(self, plan: _Plan, call: Call, lazy: LazyMessage) -> None:
        req = lazy.message
        if req is None:
            error = lazy.decode_error or "cannot decode the request"
            v = Violation(plan.malformed, "", error, CO)
            enforce = self._mode(plan.malformed.id) == ENFORCE
            self._record(plan, call, (v,), CO, rejected=enforce)
            if enforce:
                raise Reject(StatusCode.INVALID_ARGUMENT, f"plugproxy: {error}")
            return
        out: list[Violation] = []
        if plan.request_checker is not None:
            plan.request_checker(req, "", out)
        st = plan.state
        if plan.gate is not None:
            kind, wanted = plan.gate
            caps = st.known_capabilities(kind)
            if caps is not None and caps.isdisjoint(wanted):
                out.append(
                    Violation(
                        plan.spec.rule("capability-not-advertised"),
                        "",
                        f"{plan.rpc} called but the plugin does not advertise the {kind}"
                        f" capability {_named(plan, wanted)}",
                    )
                )
        for check in plan.request_checks:
            out.extend(check(plan.spec, st, call, req))
        retries = plan.judge_retries or call.connection
        if call.request is lazy and retries and plan.memory.may_have_refused():
            retried = self._retried(plan, call)
            if retried is not None:
                out.append(retried)
        if out:
            enforced = self._enforced(out)
            self._record(plan, call, out, CO, rejected=bool(enforced))
            self._remember_accepted(plan, call, out)
            if enforced:
                self._reject(enforced)

    def _retried(self, plan: _Plan, call: Call) -> Violation | None:
        """The CO re-sends a request the plugin refused with a fix-first code."""
        lazy = call.request
        if lazy is None or (not lazy.raw and not call.connection):
            return None  # no fields and no connection known: other callers send the same
        digest = request_digest(call)
        assert digest is not None
        mem = plan.memory
        entry = mem.refused.get((plan.rpc, digest))
        if entry is None:
            return self._unfixed(plan, call) if mem.unfixed else None
        code, when = entry
        row = plan.fix_first.get(code)
        recovery = row.recovery if row is not None else "MUST change the request first"
        return Violation(
            plan.spec.rule(row.rule if row is not None else "retry-without-change"),
            "",
            f"{plan.rpc} re-sent unchanged; the plugin answered the same request {code}"
            f" {ago(mem.clock() - when)}, and then the caller {recovery}",
        )

    @staticmethod
    def _unfixed(plan: _Plan, call: Call) -> Violation | None:
        """The CO calls again for an object after an answer whose recovery forbids any retry
        for it, or one keeping the fields the recovery names; not an identical re-send."""
        rule = plan.spec.find("retry-unfixed")
        req = call.request.message if call.request is not None else None
        if rule is None or req is None or not plan.primary:
            return None
        mem = plan.memory
        for key in keys_of(call):
            entry = mem.unfixed.get((plan.rpc, key)) if key.startswith(plan.primary) else None
            if entry is None:
                continue
            code, when, kept = entry
            row = plan.fix_first.get(code)
            if row is None or row.must_change is None:
                continue
            if fields_digest(req, row.must_change) != kept:
                continue
            names = ", ".join(row.must_change)
            unchanged = f" ({names} unchanged)" if names else ""
            return Violation(
                rule,
                names,
                f"{plan.rpc} called again for the same {plan.primary[:-1]}{unchanged}; the"
                f" plugin answered {code} for it {ago(mem.clock() - when)}, and then the"
                f" caller {row.recovery}",
            )
        return None

    def _remember_accepted(self, plan: _Plan, call: Call, found: list[Violation]) -> None:
        """Audited request violations whose spec prescribes the plugin's answer: an OK to
        them is judged when the call ends (bad-request-accepted)."""
        judged = [
            v
            for v in found
            if v.rule.level == MUST
            and v.rule.reject_code is not None
            and v.enforceable
            and (v.party or CO) == CO
            and self._mode(v.rule.id) == AUDIT
            and v.rule.id not in plan.spec.table.accepted_not_judged
        ]
        if judged:
            call.stage_state.setdefault(_ACCEPTED, []).extend(judged)

    def _enforced(self, violations: list[Violation]) -> list[Violation]:
        """The violations the proxy rejects the request for: only a MUST whose spec
        prescribes the answer is enforced, and with that answer."""
        return [
            v
            for v in violations
            if v.rule.level == MUST
            and v.rule.reject_code is not None
            and v.enforceable
            and self._mode(v.rule.id) == ENFORCE
        ]

    @staticmethod
    def _reject(enforced: list[Violation]) -> None:
        first = enforced[0]
        more = f" (and {len(enforced) - 1} more)" if len(enforced) > 1 else ""
        code = StatusCode[first.rule.reject_code or "INVALID_ARGUMENT"]
        raise Reject(code, f"plugproxy: {first.rule.id}: {first.message}{more}")

    async def _learn_capabilities(self, plan: _Plan, call: Call) -> None:
        """Ask the plugin once for capabilities never seen; bounded wait, fail open."""
        st = plan.state
        for kind in plan.needs:
            if st.known_capabilities(kind) is not None or not st.may_query(kind):
                continue
            path = plan.spec.table.capability_queries[kind]
            key = (plan.spec.table.spec, kind)
            task = self._queries.get(key)
            if task is None or task.done():
                task = asyncio.ensure_future(self._query(plan, kind, path))
                self._queries[key] = task
            remaining = call.remaining_timeout()
            wait = (
                self.query_timeout if remaining is None else min(self.query_timeout, remaining / 2)
            )
            try:
                await asyncio.wait_for(asyncio.shield(task), max(wait, 0.0))
            except TimeoutError:
                continue

    async def _query(self, plan: _Plan, kind: str, path: str) -> None:
        st = plan.state
        try:
            raw = await self.upstream.unary(path, b"", self.query_timeout * 5)
            cls = plan.spec.spec.message_class(
                self.runtime.registry.lookup(path).response_class.DESCRIPTOR.full_name
            )
            st.set_capabilities(kind, capability_names(cls.FromString(raw)))
        except Exception as exc:  # the plugin may not serve that service at all
            st.query_failed(kind)
            self.logger.debug("capability query failed", method=path, error=type(exc).__name__)

    # -- responses ------------------------------------------------------------------------

    def on_response(self, call: Call, message: LazyMessage) -> None:
        plan = self._plans[call.method.path]
        # A large response is judged on a sample of its long lists (plugproxy.core.sampling),
        # like the response checkers' own limit; list lengths still count every entry.
        resp = message.sampled
        if resp is None:
            error = message.decode_error or "cannot decode the response"
            self._record(plan, call, (Violation(plan.malformed, "", error, PLUGIN),), PLUGIN)
            return
        out: list[Violation] = []
        sample = message.sample
        if plan.response_checker is not None and sample is None:
            plan.response_checker(resp, "", out)
        if plan.capability_kind is not None:
            plan.state.set_capabilities(plan.capability_kind, capability_names(resp))
        if plan.response_checks:
            req = call.request.message if call.request is not None else None
            if req is not None:
                call.stage_state[JUDGED_RESPONSE] = message
                try:
                    for check in plan.response_checks:
                        out.extend(check(plan.spec, plan.state, call, req, resp))
                finally:
                    del call.stage_state[JUDGED_RESPONSE]
        if sample is not None:
            whole = call.stage_state.pop(JUDGED_WHOLE, ())
            indices = {k: v for k, v in sample.indices.items() if k not in whole}
            out = [_real_index(v, indices) for v in out]
            if plan.response_checker is not None:
                out[:0] = _check_sample(plan, sample)
        if out:
            self._record(plan, call, out, PLUGIN)

    def on_finish(self, call: Call) -> None:
        plan = self._plans[call.method.path]
        judged = self.report.judged
        spec = plan.spec_name
        judged[spec] = judged.get(spec, 0) + 1
        flying = call.stage_state.get(_FLIGHT)
        if flying is not None:
            self._landed(plan, flying)
        if call.rejected:
            return
        code = call.code
        backoff = code.name in plan.backoff_codes and not call.details.startswith("plugproxy: ")
        if backoff or plan.rpc in plan.memory.backoff_until:
            self._backoff_answer(plan, call, backoff)
        raw = call.raw_status
        if raw is not None and raw not in CANONICAL_STATUSES:
            # Specs without an error scheme (Kubernetes' own plugin APIs) define no such rule.
            rule = plan.spec.find("status-code-not-canonical")
            if rule is not None:
                why = status_problem(raw)
                violation = Violation(rule, "", f"{why} (read as {code.name})")
                self._record(plan, call, (violation,), PLUGIN)
        if code is StatusCode.OK:
            if plan.on_success and call.request is not None:
                req = call.request.message
                if req is not None:
                    # The sample on_response decoded: never a second, whole decode of a
                    # long listing for bookkeeping that reads ids, not every entry.
                    resp = call.response.sampled if call.response is not None else None
                    for hook in plan.on_success:
                        hook(plan.state, call, req, resp)
            if plan.needs_service is not None:
                plan.memory.served[plan.service] = (plan.rpc, plan.memory.clock())
                if plan.memory.unimplemented:
                    self._unimplemented_before(plan, call)
            accepted = call.stage_state.get(_ACCEPTED)
            if accepted:
                self._record(plan, call, (self._accepted(plan, accepted),), PLUGIN)
            if plan.state_change is not None:
                self._changed(plan, call)
            if plan.memory.refused_until:
                self._forget_refusal(plan, call)
            return
        by_plugin = code not in _NOT_JUDGED and not call.details.startswith("plugproxy: ")
        if plan.state_change is not None:
            repeat = self._not_changed(plan, call, code.name, by_plugin)
            if repeat is not None:
                self._record(plan, call, (repeat,), PLUGIN)
        if not by_plugin:
            return
        accepted = call.stage_state.get(_ACCEPTED)
        if accepted and code.name not in _ANSWERED_FIRST:
            wrong = self._wrong_code(plan, code.name, accepted)
            if wrong is not None:
                self._record(plan, call, (wrong,), PLUGIN)
        if code.name == plan.pending_code and plan.primary:
            self._pending(plan, call)
        self._refused(plan, call, code.name)
        if plan.on_error and call.request is not None:
            req = call.request.message
            if req is not None:
                found = [
                    v
                    for check in plan.on_error
                    for v in check(plan.spec, plan.state, call, req, code.name)
                ]
                if found:
                    self._record(plan, call, found, CO)
        self._judge_error(plan, call)

    def _judge_error(self, plan: _Plan, call: Call) -> None:
        cs = plan.spec
        code = call.code
        out: list[Violation] = []
        # Specs without an error scheme (Kubernetes' own plugin APIs) define neither rule.
        empty, details = cs.find("error-message-empty"), cs.find("status-details-nonempty")
        if not call.details and empty is not None:
            out.append(Violation(empty, "", f"{code.name} status with an empty message"))
        elif empty is not None and (not call.details.isprintable() or "\ufffd" in call.details):
            problem = unreadable_text(call.details)
            if problem is not None:
                rule = plan.spec.rule("error-message-unreadable")
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
            if plan.required_rpc:
                why = "an RPC every plugin implements"
            elif plan.gate is not None:
                caps = plan.state.known_capabilities(plan.gate[0])
                advertised = [c for c in plan.gate[1] if caps is not None and c in caps]
                if advertised:
                    why = f"required while the plugin advertises {_named(plan, advertised)}"
            if why is None and plan.service_requires:
                why = self._served_why(plan)
                if why is None and plan.needs_service is not None:
                    path = call.method.path
                    plan.memory.unimplemented[plan.service] = (path, plan.memory.clock())
            if why is not None:
                out.append(
                    Violation(
                        cs.rule("unimplemented-advertised"),
                        "",
                        f"{plan.rpc} answered UNIMPLEMENTED but it is {why}",
                    )
                )
            elif plan.recommended_rpc:
                out.append(
                    Violation(
                        cs.rule("unimplemented-recommended"),
                        "",
                        f"{plan.rpc} answered UNIMPLEMENTED; the spec asks plugins to"
                        " implement every RPC of the service",
                    )
                )
        elif plan.error_codes is not None:
            name = code.name
            if name not in plan.error_codes and name not in cs.table.general_codes:
                out.append(
                    Violation(
                        cs.rule("error-code-unexpected"),
                        "",
                        f"{plan.rpc} answered {name}, which is not in its error table nor a"
                        " general error code",
                    )
                )
        if out:
            self._record(plan, call, out, PLUGIN)

    def _unimplemented_before(self, plan: _Plan, call: Call) -> None:
        """An RPC of this service answered UNIMPLEMENTED before anything showed the
        service served (kubelet asks NodeGetInfo first); this OK shows it now."""
        path, when = plan.memory.unimplemented.pop(plan.service, ("", 0.0))
        earlier = self._plans.get(path)
        if earlier is None or earlier is plan:
            return
        why = self._served_why(earlier)  # with this answer as the evidence
        if why is None:
            return
        elapsed = plan.memory.clock() - when
        message = f"{earlier.rpc} answered UNIMPLEMENTED {ago(elapsed)}, but it is {why}"
        violation = Violation(plan.spec.rule("unimplemented-advertised"), "", message)
        self._record(plan, call, (violation,), PLUGIN)

    def _served_why(self, plan: _Plan) -> str | None:
        """Why the plugin MUST implement ``plan``'s RPC as part of a service it serves."""
        needs = plan.needs_service
        assert needs is not None
        st = plan.state
        condition = plan.service_requires
        because = ""
        if isinstance(condition, tuple):
            kind, wanted = condition
            caps = st.known_capabilities(kind)
            advertised = [c for c in wanted if caps is not None and c in caps]
            if not advertised:
                return None
            because = f" while the plugin advertises {_named(plan, advertised)}"
        evidence = None
        if needs.advertised_by is not None:
            kind, name = needs.advertised_by
            caps = st.known_capabilities(kind)
            if caps is not None and name in caps:
                evidence = f"it advertises {name}"
        if evidence is None:
            seen = plan.memory.serving(plan.service)
            if seen is None:
                return None
            rpc, when = seen
            evidence = f"{rpc} answered OK {ago(plan.memory.clock() - when)}"
        return (
            f"required of a plugin serving the {plan.service} service{because}, which this"
            f" plugin does ({evidence})"
        )

    @staticmethod
    def _wrong_code(plan: _Plan, code: str, found: list[Violation]) -> Violation | None:
        """A refusal of a bad request with none of the codes its breaches prescribe."""
        prescribed = sorted({v.rule.reject_code for v in found if v.rule.reject_code})
        rule = plan.spec.find("bad-request-wrong-code")
        if rule is None or not prescribed or code in prescribed:
            return None
        first = found[0]
        where = f" at {first.field}" if first.field else ""
        return Violation(
            rule,
            first.field,
            f"{plan.rpc} answered {code} to a request breaking {first.rule.id}{where}; the"
            f" spec prescribes {' or '.join(prescribed)}",
        )

    def _accepted(self, plan: _Plan, found: list[Violation]) -> Violation:
        first = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        where = f" at {first.field}" if first.field else ""
        return Violation(
            plan.spec.rule("bad-request-accepted"),
            first.field,
            f"{plan.rpc} answered OK to a request breaking {first.rule.id}{where}{more}; the"
            f" spec prescribes {first.rule.reject_code}",
        )

    # -- retries and repeats --------------------------------------------------------------

    def _refused(self, plan: _Plan, call: Call, code: str) -> None:
        """Remember a request the plugin refused with a code whose recovery forbids an
        unchanged retry; any other answer forgets an earlier refusal of it."""
        row = plan.fix_first.get(code)
        judged = plan.judge_retries or call.connection
        if row is not None and judged and call.request is not None:
            req = call.request.message
            if row.when is None or (req is not None and row.when(plan.state, req)):
                digest = request_digest(call)
                assert digest is not None
                plan.memory.refuse((plan.rpc, digest), code)
                if row.must_change is not None and req is not None and plan.primary:
                    kept = fields_digest(req, row.must_change)
                    now = plan.memory.clock()
                    for key in keys_of(call):
                        if key.startswith(plan.primary):
                            plan.memory.unfixed[(plan.rpc, key)] = (code, now, kept)
                return
        if plan.memory.refused_until:
            self._forget_refusal(plan, call)

    @staticmethod
    def _forget_refusal(plan: _Plan, call: Call) -> None:
        mem = plan.memory
        digest = call.stage_state.get(_DIGEST)  # hashed at request time if it could match
        if digest is not None:
            mem.refused.pop((plan.rpc, digest), None)
        if mem.unfixed and plan.primary:  # another answer for the object ends its refusal
            for key in keys_of(call):
                if key.startswith(plan.primary):
                    mem.unfixed.pop((plan.rpc, key), None)

    @staticmethod
    def _objects(plan: _Plan, call: Call) -> tuple[str, ...]:
        change = plan.state_change
        assert change is not None
        keys = keys_of(call)
        if not change.paths or call.request is None:
            return keys
        req = call.request.message
        if req is None:
            return keys
        paths = tuple(f"{name}:{getattr(req, name)}" for name in change.paths if getattr(req, name))
        return keys + paths

    def _changed(self, plan: _Plan, call: Call) -> None:
        """A successful state change: the last one on its objects, unless not final."""
        change = plan.state_change
        assert change is not None
        objects = self._objects(plan, call)
        if not objects:
            return
        mem = plan.memory
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
            mem.changed[key] = (plan.rpc, digest, now)

    def _not_changed(self, plan: _Plan, call: Call, code: str, by_plugin: bool) -> Violation | None:
        """A state change failed: a violation when it repeats the last successful one on
        the same objects with an answer idempotency rules out; otherwise the objects'
        state is unknown again."""
        change = plan.state_change
        assert change is not None
        objects = self._objects(plan, call)
        if not objects:
            return None
        mem = plan.memory
        entries = [mem.changed.get(key) for key in objects]
        if all(e is None for e in entries):
            return None
        digest = request_digest(call)
        repeat = all(e is not None and e[0] == plan.rpc and e[1] == digest for e in entries)
        if not repeat:
            for key in objects:
                mem.changed.pop(key, None)
            return None
        # The same operation failed: what it did before still stands; memory stays.
        if not by_plugin or code not in change.broken_by:
            return None
        when = min(e[2] for e in entries if e is not None)
        return Violation(
            plan.spec.rule("not-idempotent"),
            "",
            f"{plan.rpc} repeated unchanged answered {code}; the same request succeeded"
            f" {ago(mem.clock() - when)} and no other change of its objects was seen since"
            " (the operation MUST be idempotent)",
        )

    # -- calls in flight and back off -----------------------------------------------------

    def _arrived(self, plan: _Plan, call: Call) -> None:
        """Count the call in flight for its object; the retry of a call the plugin answered
        ABORTED while another call for the object is in flight is retry-while-pending."""
        keys = [k for k in keys_of(call) if k.startswith(plan.primary)]
        if not keys:
            return
        mem = plan.memory
        flight = mem.in_flight
        if mem.may_have_aborted():
            for key in keys:
                when = mem.aborted.pop((plan.rpc, key), None)
                others = flight.get(key, 0)
                if when is not None and others:
                    kind = plan.primary[:-1]
                    v = Violation(
                        plan.spec.rule("retry-while-pending"),
                        "",
                        f"{plan.rpc} retried while {others} other call(s) for the same {kind}"
                        f" are in flight; the plugin answered it ABORTED {ago(mem.clock() - when)}"
                        " and the caller SHOULD ensure no other call for it is pending first",
                    )
                    self._record(plan, call, (v,), CO)
        for key in keys:
            flight[key] = flight.get(key, 0) + 1
        call.stage_state[_FLIGHT] = keys

    @staticmethod
    def _landed(plan: _Plan, keys: list[str]) -> None:
        flight = plan.memory.in_flight
        for key in keys:
            left = flight.get(key, 0) - 1
            if left > 0:
                flight[key] = left
            else:
                flight.pop(key, None)

    @staticmethod
    def _pending(plan: _Plan, call: Call) -> None:
        """The plugin answered "operation pending": the next call is a retry to judge."""
        mem = plan.memory
        now = mem.clock()
        for key in keys_of(call):
            if key.startswith(plan.primary):
                mem.aborted[(plan.rpc, key)] = now
                mem.aborted_until = now + RETRY_TTL

    def _resent(self, plan: _Plan, call: Call) -> None:
        """An identical request after back-off answers: one more wait of the series."""
        lazy = call.request
        if lazy is None or not lazy.raw:
            return
        digest = request_digest(call)
        assert digest is not None
        mem = plan.memory
        series = mem.backoff.get((plan.rpc, digest))
        if series is None or series.ended is None:
            return  # none, or an identical one is still in flight: not a retry after it
        waits = series.waits
        waits.append(mem.clock() - series.ended)
        series.ended = None
        if len(waits) > BACKOFF_WAITS:
            del waits[0]
        short = BACKOFF_SHORT_RPC.get(plan.rpc, BACKOFF_SHORT)
        if len(waits) < BACKOFF_WAITS or max(waits) >= short or backs_off(waits):
            return
        shown = ", ".join(f"{w:.1f}s" for w in waits)
        v = Violation(
            plan.spec.rule("retry-without-backoff"),
            "",
            f"{plan.rpc} re-sent unchanged after {len(waits)} {series.code} answers in a row,"
            f" waiting {shown} after each: the waits do not grow, and the recovery for"
            f" {series.code} says retry with exponential back off",
        )
        waits.clear()  # the next report needs a new series of waits
        self._record(plan, call, (v,), CO)

    @staticmethod
    def _backoff_answer(plan: _Plan, call: Call, backoff: bool) -> None:
        """A back-off answer ends one request of a series; any other answer ends the series."""
        mem = plan.memory
        if not backoff or not plan.judge_retries:
            digest = call.stage_state.get(_DIGEST)  # hashed on arrival if a series could match
            if digest is not None:
                mem.backoff.pop((plan.rpc, digest), None)
            return
        lazy = call.request
        if lazy is None or not lazy.raw:
            return
        digest = request_digest(call)
        assert digest is not None
        now = mem.clock()
        key = (plan.rpc, digest)
        series = mem.backoff.get(key)
        if series is None or series.code != call.code.name:
            mem.backoff[key] = BackoffSeries(call.code.name, now, [])
        else:
            series.ended = now
            mem.backoff[key] = series  # touch: it lives while the retries go on
        mem.backoff_until[plan.rpc] = now + RETRY_TTL

    # -- recording ------------------------------------------------------------------------

    def _record(
        self,
        plan: _Plan,
        call: Call,
        violations: Iterable[Violation],
        party: str,
        rejected: bool = False,
    ) -> None:
        """Log, count and report ``violations``; ``rejected``: the proxy answers the call
        itself (enforce mode), so it never reaches the plugin."""
        spec = plan.spec_name
        method = call.method.path
        request_id = call.stage_state.get("request_id")
        for v in violations:
            rule = v.rule
            if self._mode(rule.id) == OFF:
                continue
            who = v.party or party
            section = rule.section_for(plan.rpc)
            call.add_event(
                "violation",
                rule=rule.id,
                level=rule.level,
                party=who,
                field=v.field,
                section=section,
                message=v.message,
            )
            # "level" is the log line's own severity; the rule's level is "rule_level".
            fields: dict[str, Any] = {
                "rule": rule.id,
                "rule_level": rule.level,
                "party": who,
                "method": method,
                "field": v.field,
                "section": section,
                "message": v.message,
            }
            if request_id:
                fields["request_id"] = request_id
            if rejected:
                fields["rejected"] = True
            self.logger.warning("violation", **fields)
            self.report.add(
                spec,
                rule,
                method,
                who,
                section,
                v.message,
                v.field,
                str(request_id or ""),
                rejected,
            )
            if self.counter is not None:
                self.counter.labels(spec, rule.id, rule.level, who, method).inc()


def known_rules(registry: Any) -> dict[str, Rule]:
    """Every bundled rule, and the rules of the registry's descriptor-set specs (the whole
    catalogue: imports every table)."""
    known = all_rules()
    for spec in getattr(registry, "specs", {}).values():
        if not spec.bundled:
            known.update((r.id, r) for r in annotated.rules_for(spec))
    return known


class _RuleIds(Container[str]):
    """The rule ids :func:`known_rules` lists, checked one by one: a bundled id imports only
    the tables of its family (a --rule item may load a spec no call has used yet)."""

    def __init__(self, registry: Any) -> None:
        self.sets = [s for s in getattr(registry, "specs", {}).values() if not s.bundled]

    def __contains__(self, rule_id: object) -> bool:
        if not isinstance(rule_id, str):
            return False
        if find_rule(rule_id) is not None:
            return True
        return any(r.id == rule_id for s in self.sets for r in annotated.rules_for(s))


def build(settings: ValidateSettings, runtime: Runtime) -> Stage | None:
    names = settings.origins
    rule_modes = parse_rule_modes(
        settings.rule, _RuleIds(getattr(runtime, "registry", None)), names.name("--rule")
    )
    if settings.validation == OFF and all(m == OFF for m in rule_modes.values()):
        if settings.violations_file:
            runtime.logger.warning(
                "validation is off: the violations file is not written",
                path=settings.violations_file,
            )
        return None
    if settings.capability_query_timeout <= 0:
        raise ConfigError("--capability-query-timeout must be positive")
    if settings.max_remembered_objects < 1:
        raise ConfigError(f"{names.name('--max-remembered-objects')} must be at least 1")
    return ValidateStage(
        runtime,
        settings.validation,
        rule_modes,
        settings.capability_query_timeout,
        violation_file(settings, runtime),
        settings.max_remembered_objects,
    )


def violation_file(settings: ValidateSettings, runtime: Any) -> ViolationFile | None:
    """The --violations-file writer, or None; ConfigError for a bound too small to hold
    a few records."""
    path = settings.violations_file
    if not path:
        return None
    max_bytes = settings.violations_file_max_bytes
    names = settings.origins
    if max_bytes < MIN_MAX_BYTES:
        source = names.name("--violations-file-max-bytes")
        raise ConfigError(f"{source} must be at least {MIN_MAX_BYTES // 1024}KiB")
    return ViolationFile(path, max_bytes, runtime.logger, names.name("--violations-file"))
