"""What the COSI v1alpha1 and v1alpha2 tables share: the rules both spec texts state alike
(worded per version where the versions differ) and the memory of buckets a driver created
and deleted, with the checks reading it.

Both versions give DriverCreateBucket the same contract (same name and parameters: OK with
the same answer; same name, other parameters: ALREADY_EXISTS) and ask that deleting a
deleted bucket be no error, v1alpha1 with a SHOULD, v1alpha2 with a MUST; the two tables
call the same checks with their own rule and wording.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from plugproxy.core.memory import HANDOVER, ExpiringMap, ago
from plugproxy.rules.csi_common import generic_rules
from plugproxy.rules.engine import (
    CO,
    MUST,
    PLUGIN,
    Rule,
    Violation,
    malformed_message_rule,
)

if TYPE_CHECKING:
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState

BOTH = (CO, PLUGIN)
CALLER = "COSI system"

# Errors that say something about the bucket rather than about the moment (transient
# errors, permissions and credentials, which a plugin may answer before it can look).
DEFINITE = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION", "ALREADY_EXISTS", "OUT_OF_RANGE"})


def shared_rules(
    title: str,
    *,
    size_summary: str,
    size_note: str,
    required_rpcs: str,
    echoed_summary: str,
    create_summary: str,
    create_note: str,
    conflict_note: str,
    repeat_note: str,
    generic: frozenset[str] | None = None,
) -> tuple[Rule, ...]:
    """The rules of both COSI tables, cited in ``title``; ``generic`` keeps only those of
    :func:`generic_rules` with these suffixes (None: all of them)."""
    rules = [
        Rule(
            "cosi.required-field",
            MUST,
            BOTH,
            f"{title} §{{rpc}}",
            "A field the spec marks REQUIRED is missing.",
        ),
        Rule("cosi.size-limit", MUST, BOTH, f"{title} §Size Limits", size_summary, note=size_note),
        Rule(
            "cosi.plugin-name-format",
            MUST,
            (PLUGIN,),
            f"{title} §DriverGetInfo",
            "The driver name is not 63 characters or less in domain name notation.",
        ),
        malformed_message_rule("cosi", f"{title} §{{rpc}}", "INVALID_ARGUMENT"),
        Rule(
            "cosi.error-message-empty",
            MUST,
            (PLUGIN,),
            f"{title} §Error Scheme",
            "A non-OK status carries an empty message.",
        ),
        Rule(
            "cosi.status-details-nonempty",
            MUST,
            (PLUGIN,),
            f"{title} §Error Scheme",
            "A non-OK status carries a google.rpc.Status with details (grpc-status-details-bin).",
        ),
        Rule(
            "cosi.unimplemented-advertised",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "The driver answers UNIMPLEMENTED for an RPC every driver must implement"
            f" ({required_rpcs}).",
        ),
        Rule(
            "cosi.size-limit-echoed",
            MUST,
            (PLUGIN,),
            f"{title} §Size Limits",
            echoed_summary,
            reject_code=None,
            note="Judged in every request that carries it, wherever it was made (another"
            " replica, before the proxy started); blamed on the plugin, which made it, and"
            " never rejected, since the COSI system only passes it back.",
        ),
        Rule(
            "cosi.create-not-idempotent",
            MUST,
            (PLUGIN,),
            f"{title} §DriverCreateBucket",
            create_summary,
            reject_code=None,
            note=create_note,
        ),
        Rule(
            "cosi.create-conflict-accepted",
            MUST,
            (PLUGIN,),
            f"{title} §DriverCreateBucket",
            "DriverCreateBucket of a name created with other parameters is answered OK instead"
            " of ALREADY_EXISTS.",
            reject_code=None,
            note=conflict_note,
        ),
    ]
    for rule in generic_rules("cosi", title, CALLER, repeat_note):
        if generic is None or rule.id.partition(".")[2] in generic:
            rules.append(rule)
    return tuple(rules)


# -- what this proxy saw of buckets ----------------------------------------------------------


@dataclass(slots=True)
class Created:
    parameters: bytes  # digest of the request's parameters (what ALREADY_EXISTS compares)
    arguments: bytes  # digest of everything a repeat must match to be the same create
    bucket_id: str
    when: float
    info: bytes = b""  # digest of what the answer says of the bucket besides its id


@dataclass(slots=True)
class Seen:
    name: str  # the DriverCreateBucket name that returned this id ("" when unknown)
    deleted: bool  # False: seen existing (returned by the driver); True: deleted successfully
    when: float
    context: bytes = b""  # digest of the successful delete's request besides the id
    by: str = "DriverCreateBucket"  # the RPC whose answer showed it existing


class BucketBook:
    """Buckets a driver created and deleted on this socket, bounded and forgotten after an
    hour untouched; each table's memory class extends it."""

    def __init__(self, st: SpecState) -> None:
        # bucket name -> its last successful DriverCreateBucket
        self.created: ExpiringMap[str, Created] = ExpiringMap(
            st.max_volumes, st.lifecycle_ttl, st.clock
        )
        # bucket_id -> seen existing or deleted
        self.seen: ExpiringMap[str, Seen] = ExpiringMap(st.max_volumes, st.lifecycle_ttl, st.clock)
        self.clock = st.clock


def judge_created(
    cs: CompiledSpec,
    book: BucketBook,
    name: str,
    parameters: bytes,
    arguments: bytes,
    bucket_id: str,
    info: bytes,
    info_field: str,
    same: str,
) -> list[Violation]:
    """A successful DriverCreateBucket against the last one of the same name: other
    parameters answered OK (create-conflict-accepted); the same arguments (``same`` names
    them) answered with another bucket within a lease (create-not-idempotent). Remembers
    this one."""
    out: list[Violation] = []
    if not name or not bucket_id:
        return out
    now = book.clock()
    prev = book.created.get(name)
    if prev is not None and prev.parameters != parameters:
        out.append(
            Violation(
                cs.rule("create-conflict-accepted"),
                "parameters",
                "DriverCreateBucket answered OK for a name DriverCreateBucket created"
                f" {ago(now - prev.when)} with other parameters (parameters differ); a bucket"
                " of the same name with different parameters MUST get ALREADY_EXISTS",
            )
        )
        return out  # the bucket stays the one created first
    if prev is not None and prev.arguments == arguments and now - prev.when <= HANDOVER:
        differ = [
            f
            for f, same in (
                ("bucket_id", prev.bucket_id == bucket_id),
                (info_field, prev.info == info),
            )
            if not same
        ]
        if differ:
            out.append(
                Violation(
                    cs.rule("create-not-idempotent"),
                    differ[0],
                    f"DriverCreateBucket repeated with the same {same} returned another"
                    f" {' and '.join(differ)} than it returned {ago(now - prev.when)}",
                )
            )
    book.created[name] = Created(parameters, arguments, bucket_id, now, info)
    book.seen[bucket_id] = Seen(name, False, now)
    return out


def forget_create(book: BucketBook, bucket_id: str) -> None:
    """A DriverDeleteBucket of ``bucket_id`` is on its way: a later create of its name may
    make a new bucket."""
    seen = book.seen.get(bucket_id)
    if seen is not None and seen.name:
        created = book.created.get(seen.name)
        if created is not None and created.bucket_id == bucket_id:
            del book.created[seen.name]


def remember_deleted(book: BucketBook, bucket_id: str, context: bytes) -> None:
    if bucket_id:
        book.seen[bucket_id] = Seen("", True, book.clock(), context)


def judge_delete_refused(
    cs: CompiledSpec,
    book: BucketBook,
    rule: str,
    bucket_id: str,
    context: bytes,
    code: str,
    context_name: str,
    expected: str,
) -> list[Violation]:
    """An error to DriverDeleteBucket of a bucket this socket saw exist or deleted: NOT_FOUND
    says it is gone; a definite error counts after a delete answered OK with the same
    ``context`` (the request besides the id, named ``context_name``). ``expected`` ends the
    message: what the spec asks instead."""
    if code != "NOT_FOUND" and code not in DEFINITE:
        return []
    seen = book.seen.get(bucket_id)
    if seen is None:
        return []  # a bucket this proxy never saw: unknown history
    since = ago(book.clock() - seen.when)
    if code == "NOT_FOUND":
        what = (
            f"DriverDeleteBucket deleted it {since}"
            if seen.deleted
            else f"{seen.by} returned it {since}, so it existed"
        )
    elif seen.deleted and seen.context == context:
        what = f"DriverDeleteBucket with the same {context_name} deleted it {since}"
    else:
        return []
    return [
        Violation(
            cs.rule(rule),
            "bucket_id",
            f"DriverDeleteBucket answered {code} for a bucket already deleted ({what}); {expected}",
            party=PLUGIN,
        )
    ]
