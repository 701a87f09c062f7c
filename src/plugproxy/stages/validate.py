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
its first call (a spec the registry lists on a first call is compiled then); the generic
rules of every spec (:mod:`plugproxy.rules.generic`: the plugin's statuses, the caller's
retries) are told each step of a call and give back what they find. This stage decides
what is enforced, rejects, and records. It is fail-closed: an exception in a request check
ends the call with INTERNAL. Requests are judged whole; a large response is judged on the
sample :mod:`plugproxy.core.sampling` takes of its long lists, violations naming entries by
their real index.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

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
from plugproxy.core.memory import remember
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
    Rule,
    Violation,
    checked_positions,
    compile_table,
)
from plugproxy.rules.generic import GenericRules, answered_by_plugin, generic_rules, named
from plugproxy.rules.state import MAX_OBJECTS, SpecState
from plugproxy.rules.violationlog import (
    DEFAULT_MAX_BYTES,
    MIN_MAX_BYTES,
    Tally,
    ViolationFile,
    utc,
)

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

# call.stage_state key of this stage: audited request violations the spec prescribes an
# answer for (the generic rules judge the plugin's answer to them).
_ACCEPTED = "validate.accepted"


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
    malformed: Rule
    generic: GenericRules  # the generic rules (family 8), told each step of a call
    # Hashes of the wire bytes of sampled list entries the response checker found clean.
    # Its checks read nothing but the entry, so the same bytes listed again are not judged
    # again: a CO polling an unchanged listing pays only for what changed.
    clean_entries: OrderedDict[int, None]


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
        generic = generic_rules(cs, state, method)
        gate = t.rpc_gates.get(rpc)
        needs = list(t.capability_needs.get(rpc, ()))
        if gate is not None and gate[0] not in needs:
            needs.insert(0, gate[0])
        needs += [k for k in generic.capability_kinds() if k not in needs]
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
            malformed=cs.rule("malformed-message"),
            generic=generic,
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
        if plan.generic.judges_arrival:
            found = plan.generic.arrived(call)
            if found:
                self._record(plan, call, found, CO)
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
                        f" capability {named(plan.spec, wanted)}",
                    )
                )
        for check in plan.request_checks:
            out.extend(check(plan.spec, st, call, req))
        # Nothing refused lately (the memory's common state): no retry to judge, no call.
        if call.request is lazy and plan.generic.memory.refused_until:
            retried = plan.generic.retried(call)
            if retried is not None:
                out.append(retried)
        if out:
            enforced = self._enforced(out)
            self._record(plan, call, out, CO, rejected=bool(enforced))
            self._remember_accepted(plan, call, out)
            if enforced:
                self._reject(enforced)

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
        # The generic rules first: the table's hooks read none of their memory.
        found = plan.generic.ended(call, call.stage_state.get(_ACCEPTED))
        if found:
            self._record(plan, call, found, PLUGIN)
        if call.rejected:
            return
        if call.code is StatusCode.OK:
            if plan.on_success and call.request is not None:
                req = call.request.message
                if req is not None:
                    # The sample on_response decoded: never a second, whole decode of a
                    # long listing for bookkeeping that reads ids, not every entry.
                    resp = call.response.sampled if call.response is not None else None
                    for hook in plan.on_success:
                        hook(plan.state, call, req, resp)
            return
        if not answered_by_plugin(call):
            return
        if plan.on_error and call.request is not None:
            req = call.request.message
            if req is not None:
                errors = [
                    v
                    for check in plan.on_error
                    for v in check(plan.spec, plan.state, call, req, call.code.name)
                ]
                if errors:
                    self._record(plan, call, errors, CO)
        found = plan.generic.error_status(call)
        if found:
            self._record(plan, call, found, PLUGIN)

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
