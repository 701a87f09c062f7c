"""Rule table of COSI v1alpha1 (package cosi.v1alpha1).

REQUIRED fields: the 11 "This field is REQUIRED" of the spec's messages; one of them names
``DriverCreateBucketRequest.bucket_name``, a field the spec's own proto calls ``name`` (also
marked REQUIRED), so 10 distinct fields are checked. ``authentication_type`` is an enum:
0 (UnknownAuthenticationType) counts as missing. The credential detail maps are plugin
secrets: their keys follow COSI §Secrets Requirements.

Bucket idempotency (family K) is judged on what this proxy saw, in bounded expiring memory
(:class:`BucketMemory`): a repeated DriverCreateBucket against the create it repeats, and a
DriverDeleteBucket error against the bucket it was seen to exist or to be deleted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import HANDOVER, ExpiringMap, ago, map_digest, message_digest
from plugproxy.rules.cosi_common import (
    BOTH,
    BucketBook,
    forget_create,
    judge_created,
    judge_delete_refused,
    remember_deleted,
    shared_rules,
)
from plugproxy.rules.csi_common import TRANSPORT_CODES
from plugproxy.rules.engine import (
    MUST,
    PLUGIN,
    SHOULD,
    CompiledSpec,
    FixFirst,
    Rule,
    SpecTable,
    StateChange,
    Violation,
)

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.state import SpecState

TITLE = "COSI v1alpha1"

RULES = (
    *shared_rules(
        TITLE,
        size_summary="A string exceeds 128 bytes or a map<string,string> 4 KiB.",
        size_note="bucket_id and account_id are judged where the driver returns them; where"
        " the COSI system passes them back, cosi.size-limit-echoed judges them.",
        required_rpcs="DriverGetInfo, DriverCreateBucket",
        echoed_summary="A bucket_id or account_id the driver makes is over 128 bytes where the"
        " COSI system passes it back.",
        create_summary="A repeated DriverCreateBucket with the same name and parameters returns"
        " another bucket_id or bucket_info.",
        create_note='§DriverCreateBucket: "This operation MUST be idempotent" and the'
        " Provisioner service comment: a bucket matching name and parameters gets OK"
        ' "with the corresponding DriverCreateBucketResponse". Judged against the last'
        f" successful create of that name this proxy saw within {HANDOVER:.0f} s (a"
        " leader-election lease: no other replica can have deleted and re-created the bucket"
        " meanwhile), forgotten once a DriverDeleteBucket of its bucket_id is sent."
        " bucket_info is compared as a digest.",
        conflict_note='The Provisioner service comment: a bucket "by same name, but different'
        ' parameters" MUST get ALREADY_EXISTS (the prose\'s "compatible with the specified'
        ' attributes" is read through it: parameters are the only attributes a'
        " DriverCreateBucketRequest carries). Judged against the last successful create of"
        " that name this proxy saw within the hour, forgotten once a DriverDeleteBucket of"
        " its bucket_id is sent; a delete through another socket is not seen.",
        repeat_note="Only DriverCreateBucket is idempotent by a MUST; ALREADY_EXISTS is not"
        " judged: §Concurrency says repeated calls 'may result in error ALREADY_EXISTS if the"
        " call succeeded early'.",
    ),
    Rule(
        "cosi.secret-key-format",
        MUST,
        BOTH,
        f"{TITLE} §Secrets Requirements",
        "A secrets map key is not made of alphanumerics, '-', '_' and '.'.",
    ),
    Rule(
        "cosi.unimplemented-recommended",
        SHOULD,
        (PLUGIN,),
        f"{TITLE} §Bucket Lifecycle",
        "The driver answers UNIMPLEMENTED for an RPC drivers SHOULD implement (advisory).",
        note="Only DriverCreateBucket and the REQUIRED Identity RPC must be implemented;"
        " the spec asks for the other Provisioner RPCs with a SHOULD.",
    ),
    Rule(
        "cosi.error-code-unexpected",
        SHOULD,
        (PLUGIN,),
        f"{TITLE} §{{rpc}}",
        "A status code neither in the RPC's error table nor a general one (advisory).",
    ),
    Rule(
        "cosi.bucket-id-empty",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverCreateBucket",
        "DriverCreateBucket succeeds without the bucket_id every later call REQUIRES.",
    ),
    Rule(
        "cosi.grant-account-changed",
        MUST,
        (PLUGIN,),
        f"{TITLE} §RPC Interface",
        "DriverGrantBucketAccess for a bucket and account name answered another account_id"
        " than a grant of the same name for that bucket did within the last 15 s, with no"
        " DriverRevokeBucketAccess of it sent since.",
        reject_code=None,
        note='Provisioner service: "The account_name in the request shall be used as a'
        ' unique identifier to create credentials" (lower case): one name, one account.'
        f" Judged only within a leader-election lease ({HANDOVER:.0f} s): later another"
        " replica may have revoked the account and granted a new one. Compared per bucket.",
    ),
    Rule(
        "cosi.delete-not-idempotent",
        SHOULD,
        (PLUGIN,),
        f"{TITLE} §DriverDeleteBucket",
        "DriverDeleteBucket of a bucket already deleted is answered with an error.",
        reject_code=None,
        note='The Provisioner service comment: "If the bucket has already been deleted,'
        ' then no error should be returned." Judged only for bucket ids this proxy saw'
        " exist (returned by DriverCreateBucket) or deleted within the hour: NOT_FOUND for"
        " such a bucket means it is gone; a definite error (INVALID_ARGUMENT,"
        " FAILED_PRECONDITION, ALREADY_EXISTS, OUT_OF_RANGE) counts after a successful"
        " delete repeated with the same delete_context. Transient errors are not judged.",
    ),
)

# §Error Scheme recovery: "Caller MUST fix the request/field before retrying" (code 3, the
# table's "MISSING_ARGUMENT" and INVALID_ARGUMENT), "Caller MUST NOT retry" (UNIMPLEMENTED).
FIX_FIRST = {
    "INVALID_ARGUMENT": FixFirst("MUST fix the request before retrying"),
    "UNIMPLEMENTED": FixFirst("MUST NOT retry", must_change=()),
}
FIX_FIRST_RPC: dict[str, dict[str, FixFirst | None]] = {
    # The COSI system asks DriverGetInfo once, at its start, and polls nothing: a re-send
    # on the connection that got UNIMPLEMENTED is the same caller's retry.
    "DriverGetInfo": {"UNIMPLEMENTED": FixFirst("MUST NOT retry", must_change=())},
    "DriverCreateBucket": {
        # "Caller should retry call with corrected parameter values" (lower case), and the
        # row covers a parameter check on the backend.
        "INVALID_ARGUMENT": None,
        "OUT_OF_RANGE": FixFirst("MUST fix the attributes before retrying"),
        # ALREADY_EXISTS "MUST fix the arguments", but §Concurrency lets a repeat of a call
        # that succeeded get it too: an unchanged retry is judged only by _create_sent.
    },
}

# §DriverCreateBucket: "This operation MUST be idempotent"; the other Provisioner RPCs
# change buckets and accesses but carry no MUST (deleting a deleted bucket "should" not
# fail: cosi.delete-not-idempotent).
_REQUEST = frozenset({"INVALID_ARGUMENT", "UNIMPLEMENTED"})
STATE_CHANGES = {
    "DriverCreateBucket": StateChange(_REQUEST | {"OUT_OF_RANGE"}),
    "DriverDeleteBucket": StateChange(),
    "DriverGrantBucketAccess": StateChange(),
    "DriverRevokeBucketAccess": StateChange(),
}

REQUIRED: dict[str, tuple[str, ...]] = {
    "DriverGetInfoResponse": ("name",),
    "DriverCreateBucketRequest": ("name",),
    "DriverDeleteBucketRequest": ("bucket_id",),
    "DriverGrantBucketAccessRequest": ("bucket_id", "name", "authentication_type"),
    "DriverGrantBucketAccessResponse": ("account_id", "credentials"),
    "DriverRevokeBucketAccessRequest": ("bucket_id", "account_id"),
}


def _bucket_id(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if not resp.bucket_id:
        yield Violation(
            cs.rule("bucket-id-empty"),
            "bucket_id",
            "bucket_id is empty; DriverDeleteBucket and DriverGrantBucketAccess REQUIRE it",
        )


# -- family K: bucket idempotency ------------------------------------------------------------

CONFLICT_TTL = 600.0  # an unchanged re-send after ALREADY_EXISTS is judged this long


class BucketMemory(BucketBook):
    """What this proxy saw of buckets and their grants, bounded and forgotten after an hour
    untouched (grants after a lease)."""

    def __init__(self, st: SpecState) -> None:
        super().__init__(st)
        # (bucket_id, account name) -> (account_id, when) of its last successful grant, and
        # (bucket_id, account_id) -> account name; for a lease only (another replica may
        # revoke and grant again).
        self.grants: ExpiringMap[tuple[str, str], tuple[str, float]] = ExpiringMap(
            st.max_volumes, HANDOVER, st.clock
        )
        self.accounts: ExpiringMap[tuple[str, str], str] = ExpiringMap(
            st.max_volumes, HANDOVER, st.clock
        )
        # (bucket name, parameters digest) -> when DriverCreateBucket answered ALREADY_EXISTS
        # while the name was seen created with other parameters
        self.conflicts: ExpiringMap[tuple[str, bytes], float] = ExpiringMap(
            st.max_volumes, CONFLICT_TTL, st.clock
        )


def _create_idempotent(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    params = map_digest(req.parameters)
    info = message_digest(resp.bucket_info)
    return judge_created(
        cs,
        st.part(BucketMemory),
        req.name,
        params,
        params,
        resp.bucket_id,
        info,
        "bucket_info",
        "name and parameters",
    )


def _granted(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if not req.bucket_id or not req.name or not resp.account_id:
        return
    mem = st.part(BucketMemory)
    now = mem.clock()
    key = (req.bucket_id, req.name)
    prev = mem.grants.get(key)
    if prev is not None and prev[0] != resp.account_id:
        yield Violation(
            cs.rule("grant-account-changed"),
            "account_id",
            "DriverGrantBucketAccess for the same bucket and account name returned another"
            f" account_id than it did {ago(now - prev[1])}, and no revoke of that one was sent"
            " since; the name identifies the account's credentials",
        )
        mem.accounts.pop((req.bucket_id, prev[0]), None)
    mem.grants[key] = (resp.account_id, now)
    mem.accounts[(req.bucket_id, resp.account_id)] = req.name


def _revoke_sent(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    # Once a revoke is on its way, a later grant of the name may make a new account.
    mem = st.part(BucketMemory)
    name = mem.accounts.pop((req.bucket_id, req.account_id), None)
    if name is not None:
        mem.grants.pop((req.bucket_id, name), None)
    return ()


def _conflicting(mem: BucketMemory, req: Any) -> tuple[str, bytes] | None:
    """The key of a create whose name this proxy saw created with other parameters."""
    params = map_digest(req.parameters)
    prev = mem.created.get(req.name) if req.name else None
    if prev is None or prev.parameters == params:
        return None
    return (req.name, params)


def _create_refused(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    if code == "ALREADY_EXISTS":
        mem = st.part(BucketMemory)
        key = _conflicting(mem, req)
        if key is not None:
            mem.conflicts[key] = mem.clock()
    return ()


def _create_sent(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    # §DriverCreateBucket errors: after ALREADY_EXISTS the caller MUST fix the arguments or
    # the name. An unchanged re-send is judged only when the refusal was the answer the
    # name's bucket called for (created here with other parameters, no delete sent since),
    # so it cannot be §Concurrency's repeat of a create that succeeded.
    mem = st.part(BucketMemory)
    key = _conflicting(mem, req)
    when = mem.conflicts.pop(key, None) if key is not None else None
    if when is not None:
        yield Violation(
            cs.rule("retry-without-change"),
            "",
            "DriverCreateBucket re-sent unchanged after it was answered ALREADY_EXISTS"
            f" {ago(mem.clock() - when)} for a name created with other parameters; the"
            " caller MUST fix the arguments or the name first",
        )


def _delete_sent(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    # Once a delete is on its way, a later create of the name may make a new bucket, and a
    # driver deriving bucket ids from names hands the new one the same id: its grants start
    # afresh (another account_id for an access name is then no change).
    mem = st.part(BucketMemory)
    for key in [k for k in mem.grants if k[0] == req.bucket_id]:
        account = mem.grants.pop(key, None)
        if account is not None:
            mem.accounts.pop((req.bucket_id, account[0]), None)
    forget_create(mem, req.bucket_id)
    return ()


def _deleted(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    remember_deleted(st.part(BucketMemory), req.bucket_id, map_digest(req.delete_context))


def _delete_error(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    return judge_delete_refused(
        cs,
        st.part(BucketMemory),
        "delete-not-idempotent",
        req.bucket_id,
        map_digest(req.delete_context),
        code,
        "delete_context",
        "no error should be returned",
    )


TABLE = SpecTable(
    spec="cosi.v1alpha1",
    family="cosi",
    title=TITLE,
    package="cosi.v1alpha1",
    rules=RULES,
    required=REQUIRED,
    plugin_name_fields=(("DriverGetInfoResponse", "name"),),
    secret_maps=(("CredentialDetails", "secrets"),),
    error_codes={
        "DriverCreateBucket": frozenset({"ALREADY_EXISTS", "INVALID_ARGUMENT", "OUT_OF_RANGE"})
    },
    general_codes=frozenset(
        {"ABORTED", "INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED", "UNIMPLEMENTED"}
    )
    | TRANSPORT_CODES,
    # §DriverCreateBucket: MUST implement; §Connectivity: the REQUIRED Identity RPCs.
    required_rpcs=frozenset({"DriverGetInfo", "DriverCreateBucket"}),
    # §Bucket Lifecycle: plugins SHOULD implement all RPCs of the service.
    recommended_rpcs=frozenset(
        {"DriverDeleteBucket", "DriverGrantBucketAccess", "DriverRevokeBucketAccess"}
    ),
    # The COSI system passes back the ids the driver made (blamed where they were made).
    echoes={
        ("DriverDeleteBucketRequest", "bucket_id"): ("DriverCreateBucketResponse", "bucket_id"),
        ("DriverGrantBucketAccessRequest", "bucket_id"): (
            "DriverCreateBucketResponse",
            "bucket_id",
        ),
        ("DriverRevokeBucketAccessRequest", "bucket_id"): (
            "DriverCreateBucketResponse",
            "bucket_id",
        ),
        ("DriverRevokeBucketAccessRequest", "account_id"): (
            "DriverGrantBucketAccessResponse",
            "account_id",
        ),
    },
    response_checks={
        "DriverCreateBucket": (_bucket_id, _create_idempotent),
        "DriverGrantBucketAccess": (_granted,),
    },
    request_checks={
        "DriverCreateBucket": (_create_sent,),
        "DriverDeleteBucket": (_delete_sent,),
        "DriverRevokeBucketAccess": (_revoke_sent,),
    },
    on_success={"DriverDeleteBucket": (_deleted,)},
    on_error={"DriverCreateBucket": (_create_refused,), "DriverDeleteBucket": (_delete_error,)},
    fix_first=FIX_FIRST,
    fix_first_rpc=FIX_FIRST_RPC,
    backoff=frozenset({"ABORTED"}),  # §Error Scheme: "retry with exponential back off"
    state_changes=STATE_CHANGES,
)
