"""The rule engine: spec tables compiled into checker functions at startup.

A spec table (one module per spec in this package) is data: rule ids with their level,
party and spec section, and per message type the fields each rule family applies to.
Whatever the descriptors state (types, oneofs, repeated and map fields, nesting) is read
from the descriptors. :func:`compile_table` turns a table into one checker per message
type: a function made at startup that calls small closures in turn, and tests a submessage
field's presence before calling its own checker; message types without any check get no
checker and are never walked. Nothing is interpreted per call.

proto3 cannot tell an unset scalar from its zero value: a REQUIRED string, bytes, map or
repeated field is "missing" when empty, a REQUIRED enum when it holds 0 (UNKNOWN), a
REQUIRED message when absent; REQUIRED bool and number fields are not checked unless the
table says zero is impossible (``required_nonzero``) or the field has explicit presence
(proto3 ``optional``), where unset is missing.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

# Imported at run time, not only for the type checker: a compiled build refers to these
# compiled classes when this module loads, and they must be loaded first.
from plugproxy.api import Call, SpecInfo
from plugproxy.rules.state import SpecState

if TYPE_CHECKING:
    from google.protobuf.message import Message

MUST = "MUST"
SHOULD = "SHOULD"
CO = "co"
PLUGIN = "plugin"


@dataclass(frozen=True, slots=True)
class Rule:
    """One checkable statement of a spec. ``section`` may contain ``{rpc}``."""

    id: str
    level: str  # MUST or SHOULD
    parties: tuple[str, ...]  # who it judges: "co" (requests, call order), "plugin"
    section: str
    summary: str
    # The answer the spec prescribes for a request breaking this rule, which enforce gives;
    # None: the spec prescribes none, so the rule is reported and never enforced.
    reject_code: str | None = "INVALID_ARGUMENT"
    note: str = ""  # why the rule reads the spec the way it does, shown in the catalogue

    def section_for(self, rpc: str) -> str:
        return self.section.replace("{rpc}", rpc)


def malformed_message_rule(family: str, section: str, reject_code: str | None) -> Rule:
    """``<family>.malformed-message``, which every table has: the bytes do not decode as
    the RPC's message type (``section`` may contain ``{rpc}``)."""
    return Rule(
        f"{family}.malformed-message",
        MUST,
        (CO, PLUGIN),
        section,
        "The message bytes do not decode as the RPC's message type.",
        reject_code=reject_code,
    )


@dataclass(slots=True)
class Violation:
    """One broken rule in one message or call. Messages never quote string values."""

    rule: Rule
    field: str
    message: str
    party: str = ""  # empty: taken from the direction (request -> co, response -> plugin)
    # False for a case of the rule the spec prescribes no answer for: reported, not enforced.
    enforceable: bool = True


# (message name relative to the spec package, field name)
FieldRef = tuple[str, str]

# A method-level check: (table, state, call, request, response-or-None) -> violations.
RequestCheck = Callable[["CompiledSpec", "SpecState", "Call", Any], Iterable[Violation]]
ResponseCheck = Callable[["CompiledSpec", "SpecState", "Call", Any, Any], Iterable[Violation]]
# After the plugin answered an error: (table, state, call, request, status code name).
ErrorCheck = Callable[["CompiledSpec", "SpecState", "Call", Any, str], Iterable[Violation]]
# After a successful call: (state, call, request, response-or-None).
SuccessHook = Callable[["SpecState", "Call", Any, Any], None]


@dataclass(frozen=True)
class Hooks:
    """One family of method-level checks: its rules and what it hooks per RPC.

    A table is assembled from several families (:func:`merged`), each in its own module,
    so that a family's checks, rules and state live together.
    """

    rules: tuple[Rule, ...] = ()
    request_checks: Mapping[str, tuple[RequestCheck, ...]] = field(default_factory=dict)
    response_checks: Mapping[str, tuple[ResponseCheck, ...]] = field(default_factory=dict)
    on_success: Mapping[str, tuple[SuccessHook, ...]] = field(default_factory=dict)
    on_error: Mapping[str, tuple[ErrorCheck, ...]] = field(default_factory=dict)
    capability_needs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def merged(*families: Hooks) -> dict[str, Any]:
    """SpecTable keyword arguments joining ``families`` in order (checks run in that order)."""
    rules: list[Rule] = []
    out: dict[str, dict[str, tuple[Any, ...]]] = {
        "request_checks": {},
        "response_checks": {},
        "on_success": {},
        "on_error": {},
        "capability_needs": {},
    }
    for family in families:
        rules.extend(family.rules)
        for name, per_rpc in out.items():
            for rpc, items in getattr(family, name).items():
                joined = per_rpc.get(rpc, ()) + tuple(items)
                # capability kinds are a set in order; checks may repeat on purpose
                if name == "capability_needs":
                    joined = tuple(dict.fromkeys(joined))
                per_rpc[rpc] = joined
    ids = [r.id for r in rules]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"rules defined twice: {', '.join(dup)}")
    return {"rules": tuple(rules), **out}


@dataclass(frozen=True)
class FixFirst:
    """An error row whose recovery forbids re-sending the request unchanged ("Caller MUST
    fix ... before retrying", "Caller MUST NOT retry")."""

    recovery: str  # the row's recovery, for messages ("MUST fix the capacity range ...")
    # The row's condition as the proxy sees it, (state, request) -> applies; None: always.
    when: Callable[[SpecState, Any], bool] | None = None
    # Request fields the recovery names to change before a retry for the same object: a
    # retry keeping them all is retry-unfixed; () when no retry is allowed at all; None
    # when the row names none (any change may be the fix: only identical re-sends judged).
    must_change: tuple[str, ...] | None = None
    # The rule an identical re-send breaks (suffix of the spec's family): a row that only
    # advises the change (SHOULD) names a rule of that level instead.
    rule: str = "retry-without-change"


@dataclass(frozen=True)
class StateChange:
    """An RPC that changes the objects its request names (plugproxy.spec.keys and ``paths``)."""

    # Answers to an identical repeat of the last successful call on the same objects that
    # break "This operation MUST be idempotent"; empty: not judged, its calls only end a
    # repeat. Only codes no unseen change (another replica, the backend) could explain.
    broken_by: frozenset[str] = frozenset()
    # Whether a successful answer is final (response -> bool); after one that is not (a
    # snapshot still being processed) a repeat may legitimately fail.
    final: Callable[[Any], bool] | None = None
    paths: tuple[str, ...] = ()  # request fields naming objects besides plugproxy.spec.keys'


@dataclass(frozen=True)
class ServiceNeeds:
    """A service whose plugin MUST implement some of its RPCs once it serves it."""

    rpcs: frozenset[str]  # MUST implement
    # (kind, capability) the plugin advertises when it serves the service; None: known
    # served only from another of its RPCs answering OK.
    advertised_by: tuple[str, str] | None = None
    # RPC -> (kind, capabilities): MUST implement while one of them is known advertised.
    when: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)


# call.stage_state key: the response message being judged (a LazyMessage), set by the
# validate stage so response checks can count a list that was sampled (plugproxy.core.sampling).
JUDGED_RESPONSE = "validate.response"
# call.stage_state key: names of sampled lists a response check decoded and judged whole,
# whose violations already name entries by their index on the wire.
JUDGED_WHOLE = "validate.whole"


def list_length(call: Call, resp: Any, field_name: str) -> int:
    """How many entries ``resp``'s top-level list holds on the wire, even when sampled."""
    judged = call.stage_state.get(JUDGED_RESPONSE)
    if judged is not None:
        return int(judged.count(field_name))
    return len(getattr(resp, field_name))


def listed_entries(call: Call, resp: Any, field_name: str) -> Sequence[bytes] | None:
    """The wire bytes of each entry of ``resp``'s top-level list, in its order, when the
    list was sampled (``resp`` is the sample); None when the message was decoded whole."""
    judged = call.stage_state.get(JUDGED_RESPONSE)
    sample = judged.sample if judged is not None else None
    if sample is None:
        return None
    raws: Sequence[bytes] | None = sample.raw.get(field_name)
    if raws is None or len(raws) != len(getattr(resp, field_name)):
        return None
    return raws


@dataclass(frozen=True)
class SpecTable:
    """The rules of one spec version, as data."""

    spec: str  # "csi.v1"
    family: str  # "csi" (rule id prefix)
    title: str  # "CSI v1.12" (how sections are cited)
    package: str  # "csi.v1"; "": every package of the spec's descriptors (names are full)
    rules: tuple[Rule, ...]
    # Family 1: REQUIRED fields. Message -> field names; "oneof:<name>" for a oneof.
    required: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # REQUIRED fields whose per-RPC caveat lets a plugin do without them: advisory only.
    required_caveat: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    required_nonzero: frozenset[FieldRef] = frozenset()
    # Family 2: size limits. None = no limit (the spec overrides the general one).
    string_limit: int | None = 128  # None: the spec sets no general limit
    map_limit: int | None = 4096
    size_overrides: Mapping[FieldRef, int | None] = field(default_factory=dict)
    size_recommended: Mapping[FieldRef, int] = field(default_factory=dict)
    repeated_total_limits: Mapping[FieldRef, int] = field(default_factory=dict)
    # Where the CO passes back a value the plugin made (an id, a token, a context map) ->
    # the field the plugin returned it in. The size rules blame whoever made a value, so an
    # echo is not judged: its maker was, where it was made.
    echoes: Mapping[FieldRef, FieldRef] = field(default_factory=dict)
    # map<string,string> fields judged key by key instead of in total (a listing as a map).
    map_key_limits: Mapping[FieldRef, int] = field(default_factory=dict)
    # Family 3: formats.
    plugin_name_fields: tuple[FieldRef, ...] = ()
    plugin_name_underscores: bool = False  # CSI v0.3 allows '_' in plugin names
    name_fields: tuple[FieldRef, ...] = ()  # banned control characters
    secret_maps: tuple[FieldRef, ...] = ()  # besides fields tagged with the secret option
    non_negative: tuple[FieldRef, ...] = ()
    # Paths the spec says MUST be absolute; an empty (unset) path is not judged here.
    absolute_paths: tuple[FieldRef, ...] = ()
    # Topology: the Topology and TopologyRequirement message names. Every field of these
    # types, at any depth and in either direction, is found by walking the descriptors.
    topology_message: str | None = None
    topology_requirement_message: str | None = None
    # Key prefix format: True for lower-case domain name notation (CSI v1), False for the
    # characters of a key name (CSI v0.3).
    topology_prefix_lower: bool = True
    # Family 4: error scheme. RPC name -> codes its error table lists.
    error_codes: Mapping[str, frozenset[str]] = field(default_factory=dict)
    general_codes: frozenset[str] = frozenset()
    required_rpcs: frozenset[str] = frozenset()  # RPCs every plugin implements
    recommended_rpcs: frozenset[str] = frozenset()  # RPCs plugins SHOULD implement
    # Family 5: capabilities. kind -> method path the proxy may ask itself.
    capability_queries: Mapping[str, str] = field(default_factory=dict)
    capability_responses: Mapping[str, str] = field(default_factory=dict)  # rpc -> kind
    # rpc -> (kind, capabilities): the plugin advertises any one of them when it serves rpc.
    rpc_gates: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # Capability name -> a note added to messages naming it (e.g. spec text vs. proto).
    capability_notes: Mapping[str, str] = field(default_factory=dict)
    # RPC -> capability kinds the proxy should know (asking itself if need be) first.
    capability_needs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Families 5-7: method-level checks (functions of the table module).
    request_checks: Mapping[str, tuple[RequestCheck, ...]] = field(default_factory=dict)
    response_checks: Mapping[str, tuple[ResponseCheck, ...]] = field(default_factory=dict)
    # Method-level bookkeeping after a successful call (call order state).
    on_success: Mapping[str, tuple[SuccessHook, ...]] = field(default_factory=dict)
    # Method-level bookkeeping and checks after the plugin answered with an error.
    on_error: Mapping[str, tuple[ErrorCheck, ...]] = field(default_factory=dict)
    # Family 8, generic rules of every spec (the validate stage runs them):
    # service (short name, "Controller") -> RPCs a plugin serving it MUST implement;
    services: Mapping[str, ServiceNeeds] = field(default_factory=dict)
    # code -> the Error Scheme's recovery when it forbids an unchanged retry, for every RPC;
    fix_first: Mapping[str, FixFirst] = field(default_factory=dict)
    # RPC -> code -> its own error row: one more FixFirst, or None where the row's recovery
    # lets the caller retry unchanged (or only advises), overriding the general one;
    fix_first_rpc: Mapping[str, Mapping[str, FixFirst | None]] = field(default_factory=dict)
    # code -> the Error Scheme's row says "retry with exponential back off", every RPC;
    backoff: frozenset[str] = frozenset()
    # RPC -> code -> its own error row: True where it says back off, False where its row
    # for a general code does not (ABORTED of a listing: restart it), overriding ``backoff``;
    backoff_rpc: Mapping[str, Mapping[str, bool]] = field(default_factory=dict)
    # The code of the Error Scheme's "operation pending" row, whose recovery asks the caller
    # to see no other call for the object pending before retrying; None: no such row.
    pending_code: str | None = "ABORTED"
    # The RPCs whose own table has that row, when the Error Scheme has none; None: every RPC.
    pending_rpcs: frozenset[str] | None = None
    # RPC -> how it changes objects (idempotency); RPCs not listed change nothing;
    state_changes: Mapping[str, StateChange] = field(default_factory=dict)
    # request rules whose breach the plugin is not bound to answer with their reject code
    # (bad-request-accepted does not judge the plugin's OK to them).
    accepted_not_judged: frozenset[str] = frozenset()


Op = Callable[[Any, str, list[Violation]], None]
Checker = Callable[[Any, str, list[Violation]], None]


@dataclass(frozen=True)
class CompiledSpec:
    """A table bound to its descriptors: rules by id and one checker per message type."""

    table: SpecTable
    spec: SpecInfo
    rules: Mapping[str, Rule]
    checkers: Mapping[str, Checker]  # full message name -> checker (requests: everything)
    response_checkers: Mapping[str, Checker]  # the same, sampling long lists of messages

    def rule(self, suffix: str) -> Rule:
        return self.rules[f"{self.table.family}.{suffix}"]

    def has_rule(self, suffix: str) -> bool:
        """Whether the table defines this rule (a descriptor set's table has only a few)."""
        return f"{self.table.family}.{suffix}" in self.rules

    def find(self, suffix: str) -> Rule | None:
        """The rule, or None when the spec states nothing of the kind (it is not judged)."""
        return self.rules.get(f"{self.table.family}.{suffix}")

    def check_message(self, message: Message) -> list[Violation]:
        out: list[Violation] = []
        checker = self.checkers.get(message.DESCRIPTOR.full_name)
        if checker is not None:
            checker(message, "", out)
        return out


# -- formats ----------------------------------------------------------------------------------

# Plugin name: 63 characters or less, alphanumeric at both ends, dashes, dots and
# alphanumerics between; domain name notation (no empty label, labels not starting or
# ending with a dash).
_NAME_CHARS = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
# CSI v0.3 also allows underscores between (reverse domain name notation).
_NAME_CHARS_UNDERSCORE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_BANNED = re.compile("[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]")
_SECRET_KEY = re.compile(r"[A-Za-z0-9_.-]+")
NAME_MAX = 63


def plugin_name_problem(name: str, underscores: bool = False) -> str | None:
    """Why ``name`` is not a valid plugin name, or None. Never quotes the name."""
    if not name:
        return None  # missing: the required-field rule reports it
    if len(name) > NAME_MAX:
        return f"is {len(name)} characters long; at most {NAME_MAX} allowed"
    chars = _NAME_CHARS_UNDERSCORE if underscores else _NAME_CHARS
    if not chars.fullmatch(name):
        between = "'-', '_' and '.'" if underscores else "'-' and '.'"
        return (
            "must begin and end with an alphanumeric character and contain only"
            f" alphanumerics, {between} between"
        )
    for label in name.split("."):
        if not label:
            return "has an empty label ('..'); domain name notation needs labels"
        if label[0] == "-" or label[-1] == "-":
            return "has a label beginning or ending with '-'; domain name notation forbids it"
    return None


# A path absolute in the root filesystem: "/..." or, for plugins on Windows nodes, where
# kubelet passes "c:\\var\\lib\\kubelet\\...", a drive letter or UNC root.
_WINDOWS_ABSOLUTE = re.compile(r"[A-Za-z]:[\\/]|\\\\")


def is_absolute_path(path: str) -> bool:
    return path[:1] == "/" or _WINDOWS_ABSOLUTE.match(path) is not None


# Topology (CSI §CreateVolume, the Topology message): a key is an optional prefix and a
# name separated by "/"; names and values are 63 characters or less, alphanumeric at both
# ends, "-", "_", "." and alphanumerics between; a v1 prefix is lower-case domain notation.
TOPOLOGY_MAX = 63
_TOPOLOGY_NAME = re.compile(r"[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?")
_TOPOLOGY_PREFIX_LOWER = re.compile(r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?")
_NAME_RULE = "must begin and end with an alphanumeric character and contain only '-', '_', '.'"


def topology_key_problem(key: str, prefix_lower: bool = True) -> str | None:
    """Why ``key`` is not a valid Topology key, or None. Never quotes the key."""
    if len(key) > 2 * TOPOLOGY_MAX + 1:  # invalid anyway: not worth a cache entry
        return _key_problem(key, prefix_lower)
    return _cached_key_problem(key, prefix_lower)


def _key_problem(key: str, prefix_lower: bool) -> str | None:
    prefix, sep, name = key.rpartition("/")
    if not name:
        return "has no name segment (the name is REQUIRED)"
    if len(name) > TOPOLOGY_MAX:
        return f"has a name segment of {len(name)} characters; at most {TOPOLOGY_MAX} allowed"
    if not _TOPOLOGY_NAME.fullmatch(name):
        return f"has a name segment that {_NAME_RULE} and alphanumerics between"
    if not sep:
        return None
    if not prefix:
        return "has an empty prefix before '/'"
    if len(prefix) > TOPOLOGY_MAX:
        return f"has a prefix of {len(prefix)} characters; at most {TOPOLOGY_MAX} allowed"
    if not prefix_lower:
        if not _TOPOLOGY_NAME.fullmatch(prefix):
            return f"has a prefix that {_NAME_RULE} and alphanumerics between"
        # CSI v0.3: reverse domain name notation, so labels joined by dots, two at least.
        if "." not in prefix or "" in prefix.split("."):
            return (
                "has a prefix not in reverse domain name notation (two or more labels joined"
                " by single dots)"
            )
        return None
    if not _TOPOLOGY_PREFIX_LOWER.fullmatch(prefix):
        return (
            "has a prefix that must begin and end with a lower-case alphanumeric character"
            " and contain only '-', '.' and lower-case alphanumerics between"
        )
    for label in prefix.split("."):
        if not label:
            return "has a prefix with an empty label ('..'); domain name notation needs labels"
        if label[0] == "-" or label[-1] == "-":
            return (
                "has a prefix label beginning or ending with '-'; domain name notation forbids it"
            )
    return None


# Real clusters use a handful of keys and values: the checks are memoized, short strings only.
_cached_key_problem = functools.lru_cache(maxsize=1024)(_key_problem)


def topology_value_problem(value: str) -> str | None:
    """Why ``value`` is not a valid Topology value (segment), or None. Never quotes it."""
    if len(value) > TOPOLOGY_MAX:
        return f"is {len(value)} characters long; at most {TOPOLOGY_MAX} allowed"
    return _cached_value_problem(value)


@functools.lru_cache(maxsize=1024)
def _cached_value_problem(value: str) -> str | None:
    if not value:
        return "is empty; at least 1 character is needed"
    if not _TOPOLOGY_NAME.fullmatch(value):
        return f"{_NAME_RULE} and alphanumerics between"
    return None


def banned_character_position(value: str) -> int | None:
    m = _BANNED.search(value)
    return None if m is None else m.start()


def secret_key_ok(key: str) -> bool:
    return _SECRET_KEY.fullmatch(key) is not None


def utf8_len(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


# -- compilation ------------------------------------------------------------------------------


class TableError(ValueError):
    """A table names a field or message its spec's descriptors do not have."""


def _fd(desc: Descriptor, name: str, spec: str) -> FieldDescriptor:
    fd = desc.fields_by_name.get(name)
    if fd is None:
        raise TableError(f"{spec}: {desc.full_name} has no field {name!r}")
    return fd


def _is_map(fd: FieldDescriptor) -> bool:
    mt = fd.message_type
    return bool(fd.is_repeated and mt is not None and mt.GetOptions().map_entry)


def _is_string_map(fd: FieldDescriptor) -> bool:
    if not _is_map(fd):
        return False
    mt = fd.message_type
    assert mt is not None
    return bool(
        mt.fields_by_name["key"].type == FieldDescriptor.TYPE_STRING
        and mt.fields_by_name["value"].type == FieldDescriptor.TYPE_STRING
    )


def _required_op(fd: FieldDescriptor, rule: Rule, nonzero: bool) -> Op | None:
    name = fd.name
    if fd.is_repeated:
        what = "map" if _is_map(fd) else "repeated field"

        def need_elements(msg: Any, prefix: str, out: list[Violation]) -> None:
            if not len(getattr(msg, name)):
                out.append(
                    Violation(
                        rule, prefix + name, f"{prefix}{name} is REQUIRED: the {what} is empty"
                    )
                )

        return need_elements
    t = fd.type
    if t == FieldDescriptor.TYPE_MESSAGE:

        def need_message(msg: Any, prefix: str, out: list[Violation]) -> None:
            if not msg.HasField(name):
                out.append(Violation(rule, prefix + name, f"{prefix}{name} is REQUIRED but absent"))

        return need_message
    if t in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):

        def need_value(msg: Any, prefix: str, out: list[Violation]) -> None:
            if not getattr(msg, name):
                out.append(Violation(rule, prefix + name, f"{prefix}{name} is REQUIRED but empty"))

        return need_value
    if t == FieldDescriptor.TYPE_ENUM or nonzero:
        zero = "holds 0 (UNKNOWN)" if t == FieldDescriptor.TYPE_ENUM else "is 0"

        def need_nonzero(msg: Any, prefix: str, out: list[Violation]) -> None:
            if not getattr(msg, name):
                out.append(Violation(rule, prefix + name, f"{prefix}{name} is REQUIRED but {zero}"))

        return need_nonzero
    if fd.has_presence:  # proto3 `optional` (or proto2): unset is not zero

        def need_present(msg: Any, prefix: str, out: list[Violation]) -> None:
            if not msg.HasField(name):
                out.append(Violation(rule, prefix + name, f"{prefix}{name} is REQUIRED but unset"))

        return need_present
    return None  # bool and numbers: proto3 cannot tell unset from zero


def _oneof_op(desc: Descriptor, oneof: str, rule: Rule, spec: str) -> Op:
    od = desc.oneofs_by_name.get(oneof)
    if od is None:
        raise TableError(f"{spec}: {desc.full_name} has no oneof {oneof!r}")
    choices = " or ".join(f.name for f in od.fields)

    def need_one(msg: Any, prefix: str, out: list[Violation]) -> None:
        if msg.WhichOneof(oneof) is None:
            out.append(
                Violation(
                    rule, prefix + oneof, f"{prefix}{oneof} is REQUIRED: set one of {choices}"
                )
            )

    return need_one


def _string_size_op(name: str, limit: int, rule: Rule, repeated: bool) -> Op:
    # A str of n characters has at most 4n UTF-8 bytes: only a longer one is encoded. The
    # test is inline, as these run for every entry of a listing.
    quick = limit // 4

    if repeated:

        def each(msg: Any, prefix: str, out: list[Violation]) -> None:
            for i, v in enumerate(getattr(msg, name)):
                if len(v) <= quick:
                    continue
                n = utf8_len(v)
                if n > limit:
                    out.append(
                        Violation(
                            rule,
                            f"{prefix}{name}[{i}]",
                            f"{prefix}{name}[{i}] is {n} bytes; the limit is {limit} bytes",
                        )
                    )

        return each

    def one(msg: Any, prefix: str, out: list[Violation]) -> None:
        v = getattr(msg, name)
        if len(v) <= quick:
            return
        n = utf8_len(v)
        if n > limit:
            out.append(
                Violation(
                    rule, prefix + name, f"{prefix}{name} is {n} bytes; the limit is {limit} bytes"
                )
            )

    return one


class MadeOverLimit:
    """Digests of the over-limit ids and tokens the plugin returned on this socket, the
    latest ``size`` of them: where the CO passes one back it was reported already."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    @staticmethod
    def digest(value: str) -> bytes:
        return hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def add(self, value: str) -> None:
        key = self.digest(value)
        self._seen[key] = None
        self._seen.move_to_end(key)
        if len(self._seen) > self.size:
            self._seen.popitem(last=False)

    def __contains__(self, value: str) -> bool:
        return self.digest(value) in self._seen


def _made_op(name: str, limit: int, repeated: bool, made: MadeOverLimit) -> Op:
    """Remembers the values over ``limit`` of a field the CO passes back elsewhere."""
    quick = limit // 4

    def remember(msg: Any, prefix: str, out: list[Violation]) -> None:
        values = getattr(msg, name)
        for v in values if repeated else (values,):
            if len(v) > quick and utf8_len(v) > limit:
                made.add(v)

    return remember


def _echo_size_op(name: str, limit: int, rule: Rule, repeated: bool, made: MadeOverLimit) -> Op:
    """An id or token over its maker's limit where the CO passes it back, unless this
    socket saw the plugin return it (reported there): blamed on the plugin, never enforced."""
    quick = limit // 4

    def check(msg: Any, prefix: str, out: list[Violation]) -> None:
        values = getattr(msg, name)
        for i, v in enumerate(values if repeated else (values,)):
            if len(v) <= quick or v in made:
                continue
            n = utf8_len(v)
            if n > limit:
                where = f"{prefix}{name}[{i}]" if repeated else f"{prefix}{name}"
                out.append(
                    Violation(
                        rule,
                        where,
                        f"{where} is {n} bytes; the limit is {limit} bytes. The plugin returns"
                        " this value (an id or token) and the CO passes it back; this proxy"
                        " did not see it returned",
                        PLUGIN,
                        enforceable=False,
                    )
                )

    return check


def _map_size_op(name: str, limit: int, rule: Rule) -> Op:
    def total(msg: Any, prefix: str, out: list[Violation]) -> None:
        m = getattr(msg, name)
        if not m:
            return
        size = 0
        for k in m:  # keys, then m[k]: a protobuf map's items() is a slow Python view
            size += len(k) + len(m[k])
        if size * 4 <= limit:
            return
        size = sum(utf8_len(k) + utf8_len(m[k]) for k in m)
        if size > limit:
            out.append(
                Violation(
                    rule,
                    prefix + name,
                    f"{prefix}{name} holds {size} bytes in {len(m)} entries; the limit is"
                    f" {limit} bytes",
                )
            )

    return total


def _map_keys_op(name: str, limit: int, rule: Rule) -> Op:
    def each_key(msg: Any, prefix: str, out: list[Violation]) -> None:
        for i, key in enumerate(getattr(msg, name)):
            if len(key) * 4 <= limit:
                continue
            n = utf8_len(key)
            if n > limit:
                out.append(
                    Violation(
                        rule,
                        f"{prefix}{name}[key {i}]",
                        f"{prefix}{name}[key {i}] is {n} bytes; the limit is {limit} bytes",
                    )
                )

    return each_key


def _repeated_total_op(name: str, limit: int, rule: Rule) -> Op:
    def total(msg: Any, prefix: str, out: list[Violation]) -> None:
        values = getattr(msg, name)
        if not values:
            return
        size = sum(utf8_len(v) for v in values)
        if size > limit:
            out.append(
                Violation(
                    rule,
                    prefix + name,
                    f"{prefix}{name} holds {size} bytes in {len(values)} entries; the limit is"
                    f" {limit} bytes in total",
                )
            )

    return total


def _plugin_name_op(name: str, rule: Rule, underscores: bool) -> Op:
    def check(msg: Any, prefix: str, out: list[Violation]) -> None:
        problem = plugin_name_problem(getattr(msg, name), underscores)
        if problem is not None:
            out.append(Violation(rule, prefix + name, f"{prefix}{name} {problem}"))

    return check


def _banned_chars_op(name: str, rule: Rule) -> Op:
    def check(msg: Any, prefix: str, out: list[Violation]) -> None:
        pos = banned_character_position(getattr(msg, name))
        if pos is not None:
            out.append(
                Violation(
                    rule,
                    prefix + name,
                    f"{prefix}{name} contains a banned control character at position {pos}",
                )
            )

    return check


def _secret_keys_op(name: str, rule: Rule) -> Op:
    def check(msg: Any, prefix: str, out: list[Violation]) -> None:
        m = getattr(msg, name)
        if not m:
            return
        bad = sum(1 for k in m if not secret_key_ok(k))
        if bad:
            out.append(
                Violation(
                    rule,
                    prefix + name,
                    f"{prefix}{name}: {bad} of {len(m)} keys are not made of alphanumerics,"
                    " '-', '_' and '.'",
                )
            )

    return check


def _non_negative_op(fd: FieldDescriptor, rule: Rule) -> Op:
    name = fd.name
    if fd.type == FieldDescriptor.TYPE_MESSAGE:  # google.protobuf.Int64Value and friends

        def wrapped(msg: Any, prefix: str, out: list[Violation]) -> None:
            if msg.HasField(name) and getattr(msg, name).value < 0:
                out.append(Violation(rule, prefix + name, f"{prefix}{name} is negative"))

        return wrapped

    def plain(msg: Any, prefix: str, out: list[Violation]) -> None:
        if getattr(msg, name) < 0:
            out.append(Violation(rule, prefix + name, f"{prefix}{name} is negative"))

    return plain


def _absolute_path_op(name: str, rule: Rule) -> Op:
    def check(msg: Any, prefix: str, out: list[Violation]) -> None:
        path = getattr(msg, name)
        if path and not is_absolute_path(path):
            out.append(
                Violation(
                    rule,
                    prefix + name,
                    f"{prefix}{name} is not an absolute path (it does not begin with '/')",
                )
            )

    return check


def _topology_op(
    name: str, key_rule: Rule, duplicate_rule: Rule, value_rule: Rule, prefix_lower: bool
) -> Op:
    """Keys and values of a Topology's segments map; entries named by their map position."""

    # Real clusters send a handful of distinct topologies: those found valid are remembered
    # (bounded), so a repeat costs one lookup.
    valid: set[tuple[tuple[str, str], ...]] = set()

    def check(msg: Any, prefix: str, out: list[Violation]) -> None:
        segments = getattr(msg, name)
        if not segments:
            return
        items = tuple([(k, segments[k]) for k in segments])
        if items in valid:
            return
        before = len(out)
        where = prefix + name
        seen: dict[str, int] = {}
        for i, (key, value) in enumerate(items):
            problem = topology_key_problem(key, prefix_lower)
            if problem is not None:
                out.append(Violation(key_rule, f"{where}[key {i}]", f"{where}[key {i}] {problem}"))
            folded = key.lower()
            first = seen.setdefault(folded, i)
            if first != i:
                out.append(
                    Violation(
                        duplicate_rule,
                        f"{where}[key {i}]",
                        f"{where}[key {i}] and [key {first}] differ only in case; keys are"
                        " case-insensitive",
                    )
                )
            problem = topology_value_problem(value)
            if problem is not None:
                out.append(
                    Violation(value_rule, f"{where}[value {i}]", f"{where}[value {i}] {problem}")
                )
        if len(out) == before and sum(len(k) + len(v) for k, v in items) <= 1024:
            if len(valid) >= 256:
                valid.clear()
            valid.add(items)

    return check


def _topology_requirement_op(
    requisite: str, preferred: str, segments: str, empty_rule: Rule, subset_rule: Rule
) -> Op:
    def check(msg: Any, prefix: str, out: list[Violation]) -> None:
        req = getattr(msg, requisite)
        pref = getattr(msg, preferred)
        if not req:
            if not pref:
                where = prefix[:-1]
                out.append(
                    Violation(
                        empty_rule,
                        where,
                        f"{where or 'the TopologyRequirement'} sets neither {requisite} nor"
                        f" {preferred}",
                    )
                )
            return
        if not pref:
            return

        def folded(t: Any) -> frozenset[tuple[str, str]]:  # keys are case-insensitive
            return frozenset((k.lower(), v) for k, v in getattr(t, segments).items())

        allowed = {folded(t) for t in req}
        for i, t in enumerate(pref):
            if folded(t) not in allowed:
                out.append(
                    Violation(
                        subset_rule,
                        f"{prefix}{preferred}[{i}]",
                        f"{prefix}{preferred}[{i}] is not in {prefix}{requisite}",
                    )
                )

    return check


def checked_positions(n: int) -> range | list[int]:
    """Which entries of a list of ``n`` the response checkers judge (RESPONSE_SAMPLE)."""
    return _spread(n, RESPONSE_SAMPLE)


def _spread(n: int, sample: int | None) -> range | list[int]:
    """Indices to check of ``n`` elements: all, or ``sample`` spread evenly incl. the last."""
    if sample is None or n <= sample:
        return range(n)
    step = -(-n // (sample - 1))
    picked = list(range(0, n, step))
    if picked[-1] != n - 1:
        picked.append(n - 1)
    return picked


def _nested_op(fd: FieldDescriptor, checker: Checker, sample: int | None) -> Op:
    """The checks of a repeated or map field's messages (a singular one is a _Submessage)."""
    name = fd.name
    if _is_map(fd):

        def map_values(msg: Any, prefix: str, out: list[Violation]) -> None:
            m = getattr(msg, name)
            if not m:
                return
            values = list(m.values())
            for i in _spread(len(values), sample):
                checker(values[i], f"{prefix}{name}[entry {i}].", out)

        return map_values

    def each(msg: Any, prefix: str, out: list[Violation]) -> None:
        values = getattr(msg, name)
        if sample is None or len(values) <= sample:
            for i, v in enumerate(values):
                checker(v, f"{prefix}{name}[{i}].", out)
            return
        for i in _spread(len(values), sample):
            checker(values[i], f"{prefix}{name}[{i}].", out)

    return each


@dataclass(frozen=True)
class _Submessage:
    """A singular message field with checks: inlined by :func:`_sequence` as a presence
    test and one call of the field's checker (no op of its own to call per message)."""

    name: str
    checker: Checker


def _sequence(ops: tuple[Op | _Submessage, ...]) -> Checker:
    """One checker calling ``ops`` in order, made at startup as one function: no loop, and
    for a submessage field only its presence test when it is unset."""
    if len(ops) == 1 and not isinstance(ops[0], _Submessage):
        return ops[0]
    scope: dict[str, Any] = {}
    lines = ["def run(msg, prefix, out):"]
    for i, op in enumerate(ops):
        if isinstance(op, _Submessage):
            # repr(): a field name is a literal here, never code, whatever it is.
            field, dotted = repr(op.name), repr(op.name + ".")
            scope[f"op{i}"] = op.checker
            lines.append(f"    if msg.HasField({field}):")
            lines.append(f"        op{i}(getattr(msg, {field}), prefix + {dotted}, out)")
        else:
            scope[f"op{i}"] = op
            lines.append(f"    op{i}(msg, prefix, out)")
    made: dict[str, Any] = {}
    exec("\n".join(lines), scope, made)
    run: Checker = made["run"]
    return run


class _Compiler:
    def __init__(
        self,
        table: SpecTable,
        spec: SpecInfo,
        rules: Mapping[str, Rule],
        sample: int | None = None,
        made_over_limit: MadeOverLimit | None = None,
    ) -> None:
        self.sample = sample
        self.table = table
        self.spec = spec
        self.rules = rules
        self.checkers: dict[str, Checker] = {}
        self._done: dict[str, Checker | None] = {}
        self._in_progress: set[str] = set()
        self._plugin_names = self._refs(table.plugin_name_fields)
        self._names = self._refs(table.name_fields)
        self._secrets = self._refs(table.secret_maps)
        self._non_negative = self._refs(table.non_negative)
        self._absolute = self._refs(table.absolute_paths)
        for ref in self._absolute:
            fd = self.spec.descriptor(ref[0]).fields_by_name[ref[1]]
            if fd.type != FieldDescriptor.TYPE_STRING or fd.is_repeated:
                raise TableError(f"{table.spec}: {ref[0]}.{ref[1]} is not a path string")
        self._topology = self._topology_segments(table.topology_message)
        self._requirement: tuple[str, str, str] | None = None
        if table.topology_requirement_message is not None:
            desc = self._desc(table.topology_requirement_message)
            topology = self._topology[0] if self._topology else None
            fds = [_fd(desc, n, table.spec) for n in ("requisite", "preferred")]
            if topology is None or any(
                not f.is_repeated or f.message_type is None or f.message_type.full_name != topology
                for f in fds
            ):
                raise TableError(f"{table.spec}: {desc.full_name} does not list Topology messages")
            self._requirement = (desc.full_name, fds[0].name, fds[1].name)
        self._nonzero = self._refs(table.required_nonzero)
        self._overrides = {self._ref(r): v for r, v in table.size_overrides.items()}
        # An echo is judged against its maker's limit under size-limit-echoed, where the
        # spec family has that rule: the value breaks the limit whoever made it.
        # echo -> (whether its maker's limit is overridden, that override)
        self._echo_limits: dict[tuple[str, str], tuple[bool, int | None]] = {}
        self._echo_makers: set[tuple[str, str]] = set()
        # shared by the request and response checkers of one compiled spec
        self.made_over_limit = made_over_limit or MadeOverLimit()
        self._judges_echoes = f"{table.family}.size-limit-echoed" in self.rules
        for echo, maker in table.echoes.items():
            made = self._ref(maker)
            self._echo_makers.add(made)
            self._echo_limits[self._ref(echo)] = (
                made in self._overrides,
                self._overrides.get(made),
            )
            self._overrides[self._ref(echo)] = None
        self._map_keys = {self._ref(r): v for r, v in table.map_key_limits.items()}
        self._recommended = {self._ref(r): v for r, v in table.size_recommended.items()}
        self._totals = {self._ref(r): v for r, v in table.repeated_total_limits.items()}
        self._required: dict[str, list[tuple[str, str]]] = {}
        for suffix, required in (
            ("required-field", table.required),
            ("required-field-caveat", table.required_caveat),
        ):
            for msg_name, names in required.items():
                desc = self._desc(msg_name)
                for n in names:
                    if not n.startswith("oneof:"):
                        _fd(desc, n, table.spec)
                    self._required.setdefault(desc.full_name, []).append((suffix, n))

    def _echo_op(self, fd: FieldDescriptor, ref: tuple[str, str]) -> Op | None:
        """The size check of an id or token the CO passes back, against its maker's limit.
        Maps passed back are not judged: the CO adds its own entries to some (kubelet's pod
        and token entries in NodePublishVolume's volume_context)."""
        rule = self.rules.get(f"{self.table.family}.size-limit-echoed")
        if rule is None or ref not in self._echo_limits or fd.type != FieldDescriptor.TYPE_STRING:
            return None
        overridden, limit = self._echo_limits[ref]
        limit = limit if overridden else self.table.string_limit
        if limit is None:
            return None
        return _echo_size_op(fd.name, limit, rule, fd.is_repeated, self.made_over_limit)

    def _topology_segments(self, msg_name: str | None) -> tuple[str, str] | None:
        """(full name, name of its map<string,string> field) of the Topology message."""
        if msg_name is None:
            return None
        desc = self._desc(msg_name)
        maps = [f.name for f in desc.fields if _is_string_map(f)]
        if len(maps) != 1:
            raise TableError(f"{self.table.spec}: {desc.full_name} is not a map of segments")
        return desc.full_name, maps[0]

    def _desc(self, msg_name: str) -> Descriptor:
        package = self.table.package
        try:
            return self.spec.descriptor(f"{package}.{msg_name}" if package else msg_name)
        except KeyError:
            raise TableError(f"{self.table.spec}: no message {msg_name!r}") from None

    def _ref(self, ref: FieldRef) -> tuple[str, str]:
        desc = self._desc(ref[0])
        _fd(desc, ref[1], self.table.spec)
        return desc.full_name, ref[1]

    def _refs(self, refs: Iterable[FieldRef]) -> frozenset[tuple[str, str]]:
        return frozenset(self._ref(r) for r in refs)

    def rule(self, suffix: str) -> Rule:
        return self.rules[f"{self.table.family}.{suffix}"]

    def compile(self, desc: Descriptor) -> Checker | None:
        key = desc.full_name
        if key in self._in_progress:
            # A recursive type: call through the table once it is compiled.
            checkers = self.checkers

            def deferred(msg: Any, prefix: str, out: list[Violation]) -> None:
                target = checkers.get(key)
                if target is not None:
                    target(msg, prefix, out)

            return deferred
        if key in self._done:
            return self._done[key]
        self._in_progress.add(key)
        ops = self._ops(desc)
        self._in_progress.discard(key)
        checker = _sequence(tuple(ops)) if ops else None
        self._done[key] = checker
        if checker is not None:
            self.checkers[key] = checker
        return checker

    def _ops(self, desc: Descriptor) -> list[Op | _Submessage]:
        t = self.table
        ops: list[Op | _Submessage] = []
        key = desc.full_name
        for suffix, name in self._required.get(key, ()):
            req_rule = self.rule(suffix)
            if name.startswith("oneof:"):
                ops.append(_oneof_op(desc, name[6:], req_rule, t.spec))
                continue
            fd = desc.fields_by_name[name]
            op = _required_op(fd, req_rule, (key, name) in self._nonzero)
            if op is not None:
                ops.append(op)
        for fd in desc.fields:
            ref = (key, fd.name)
            echoed = self._echo_op(fd, ref)
            if echoed is not None:
                ops.append(echoed)
            if fd.type == FieldDescriptor.TYPE_STRING:
                limit = self._overrides.get(ref, t.string_limit)
                if ref in self._echo_makers and limit is not None and self._judges_echoes:
                    ops.append(_made_op(fd.name, limit, fd.is_repeated, self.made_over_limit))
                # Looked up only where a limit applies: a spec without any has no such rule.
                if ref in self._totals:
                    size_rule = self.rule("size-limit")
                    ops.append(_repeated_total_op(fd.name, self._totals[ref], size_rule))
                elif limit is not None:
                    size_rule = self.rule("size-limit")
                    ops.append(_string_size_op(fd.name, limit, size_rule, fd.is_repeated))
                if ref in self._recommended:
                    ops.append(
                        _string_size_op(
                            fd.name,
                            self._recommended[ref],
                            self.rule("size-limit-recommended"),
                            fd.is_repeated,
                        )
                    )
                if ref in self._plugin_names:
                    ops.append(
                        _plugin_name_op(
                            fd.name,
                            self.rule("plugin-name-format"),
                            self.table.plugin_name_underscores,
                        )
                    )
                if ref in self._names:
                    ops.append(_banned_chars_op(fd.name, self.rule("name-banned-characters")))
            elif _is_string_map(fd):
                limit = self._overrides.get(ref, t.map_limit)
                if ref in self._map_keys:
                    ops.append(_map_keys_op(fd.name, self._map_keys[ref], self.rule("size-limit")))
                elif limit is not None:
                    ops.append(_map_size_op(fd.name, limit, self.rule("size-limit")))
                if ref in self._secrets or self.spec.is_secret_field(fd):
                    ops.append(_secret_keys_op(fd.name, self.rule("secret-key-format")))
            elif _is_map(fd) and (ref in self._secrets or self.spec.is_secret_field(fd)):
                ops.append(_secret_keys_op(fd.name, self.rule("secret-key-format")))
            if ref in self._non_negative:
                ops.append(_non_negative_op(fd, self.rule("negative-value")))
            if ref in self._absolute:
                ops.append(_absolute_path_op(fd.name, self.rule("path-not-absolute")))
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                target = fd.message_type
                if target is not None and _is_map(fd):
                    target = target.fields_by_name["value"].message_type
                if target is None:
                    continue
                if t.package and target.file.package != t.package:
                    continue  # google.protobuf well-known types carry no spec rules
                nested = self.compile(target)
                if nested is None:
                    continue
                if fd.is_repeated:
                    ops.append(_nested_op(fd, nested, self.sample))
                else:
                    ops.append(_Submessage(fd.name, nested))
        if self._topology is not None and key == self._topology[0]:
            ops.append(
                _topology_op(
                    self._topology[1],
                    self.rule("topology-key-format"),
                    self.rule("topology-key-duplicate"),
                    self.rule("topology-value-format"),
                    t.topology_prefix_lower,
                )
            )
        if self._requirement is not None and key == self._requirement[0]:
            assert self._topology is not None
            ops.append(
                _topology_requirement_op(
                    self._requirement[1],
                    self._requirement[2],
                    self._topology[1],
                    self.rule("topology-requirement-empty"),
                    self.rule("topology-preferred-not-requisite"),
                )
            )
        return ops


# Response list entries judged, spread evenly; each costs ~10 µs of rule checks in Python.
RESPONSE_SAMPLE = 128


def compile_table(
    table: SpecTable, spec: SpecInfo, response_sample: int | None = RESPONSE_SAMPLE
) -> CompiledSpec:
    """Bind ``table`` to ``spec``'s descriptors; TableError when they disagree.

    Two checker sets: requests are checked in full (enforce may reject them); responses,
    which are only ever audited, check at most ``response_sample`` elements of a repeated
    or map field of messages, spread evenly over it (first and last included), so a
    10,000-entry page costs a bounded time on the event loop.
    """
    rules = {r.id: r for r in table.rules}
    if len(rules) != len(table.rules):
        raise TableError(f"{table.spec}: duplicate rule ids")
    for r in table.rules:
        if not r.id.startswith(table.family + "."):
            raise TableError(f"{table.spec}: rule {r.id} lacks the {table.family}. prefix")
    enum_values = {
        value.name
        for full_name in spec.message_classes
        for enum in spec.descriptor(full_name).enum_types
        for value in enum.values
    }
    for rpc, (_, caps) in table.rpc_gates.items():
        for cap in caps:
            if cap not in enum_values:
                raise TableError(f"{table.spec}: {rpc} is gated by unknown capability {cap!r}")
    checkers = []
    made_over_limit = MadeOverLimit()
    for sample in (None, response_sample):
        compiler = _Compiler(table, spec, rules, sample, made_over_limit)
        for full_name in spec.message_classes:
            if not table.package or full_name.startswith(table.package + "."):
                compiler.compile(spec.descriptor(full_name))
        checkers.append(dict(compiler.checkers))
    return CompiledSpec(
        table=table, spec=spec, rules=rules, checkers=checkers[0], response_checkers=checkers[1]
    )
