"""Rule table of COSI v1alpha2 (package sigs.k8s.io.cosi.v1alpha2), the API of COSI v0.2.

REQUIRED fields: every "REQUIRED" of the spec's messages; the wrapped enums
(``AuthenticationType``, ``AccessMode``, the ``ObjectProtocol`` of a grant or revoke) count
as missing at UNKNOWN, ``service_account_name`` is REQUIRED with SERVICE_ACCOUNT, and a
bucket info needs at least one protocol's info (exactly one in a grant). Bucket and account
ids may be 2048 characters of alphanumerics, '-' and '.' (lower case in the spec's field
comments); the general 128-byte limit holds elsewhere.

Protocols: what a driver supports is what its DriverGetInfo lists; the proxy asks for it
itself when it has not seen an answer (a capability query). Idempotency, conflicts and
"already gone" answers are judged on what this proxy saw, in bounded expiring memory
(:class:`Buckets`), as for v1alpha1 (:mod:`plugproxy.rules.cosi_common`).

Not judged, unlike v1alpha1: the error rows' recoveries say "SHOULD" (INVALID_ARGUMENT) or
say nothing normative ("Not retryable", "Retryable with exponential backoff"), so an
unchanged retry is a SHOULD at most (cosi.retry-advised-unchanged), and the v1alpha2 spec
has no error table per RPC to hold a code against. The messages carry no secrets map, so
no key format is judged; the credential fields are masked by plugproxy.spec.redact.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import (
    HANDOVER,
    ExpiringMap,
    ago,
    digest,
    map_digest,
    message_digest,
    parts_digest,
    remember,
)
from plugproxy.rules.cosi_common import (
    BOTH,
    DEFINITE,
    BucketBook,
    Seen,
    forget_create,
    judge_created,
    judge_delete_refused,
    remember_deleted,
    shared_rules,
)
from plugproxy.rules.engine import (
    CO,
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

TITLE = "COSI v1alpha2"
PACKAGE = "sigs.k8s.io.cosi.v1alpha2"
ID_LIMIT = 2048
# The protocol members of ObjectProtocolAndBucketInfo and CredentialInfo, by the name of
# their ObjectProtocol.Type value.
PROTOCOL_FIELDS = {"S3": "s3", "AZURE": "azure", "GCS": "gcs"}
PROTOCOLS = "protocols"  # the capability kind DriverGetInfo's supported_protocols fills

RULES = (
    *shared_rules(
        TITLE,
        size_summary="A string exceeds 128 bytes (a bucket or account id 2048) or a"
        " map<string,string> 4 KiB.",
        size_note="Bucket and account ids may be 2048 characters (the field comments, in"
        " lower case); they are judged where they are made: bucket_id where the driver"
        " returns it, existing_bucket_id in the request (the administrator's), and where"
        " the COSI system passes a driver's id back, cosi.size-limit-echoed judges it."
        " AzureCredentialInfo.access_token is not judged: the field holds the resource URI"
        " with its SAS token, which no storage account fits in 128 bytes.",
        required_rpcs="DriverGetInfo and every Provisioner RPC",
        echoed_summary="A bucket_id or account_id the driver makes is over 2048 bytes where"
        " the COSI system passes it back.",
        create_summary="A repeated DriverCreateBucket with the same name, protocols and"
        " parameters returns another bucket_id or protocols info.",
        create_note='§DriverCreateBucket: "This operation MUST be idempotent", and a bucket'
        " of matching identity and parameters MUST get OK. Judged against the last"
        f" successful create of that name this proxy saw within {HANDOVER:.0f} s (a"
        " leader-election lease: no other replica can have deleted and re-created the bucket"
        " meanwhile), forgotten once a DriverDeleteBucket of its bucket_id is sent. The"
        " protocols info is compared as a digest.",
        conflict_note="Provisioner service: a bucket of matching identity but incompatible"
        " parameters MUST get ALREADY_EXISTS. Judged against the last successful create of"
        " that name this proxy saw within the hour, forgotten once a DriverDeleteBucket of"
        " its bucket_id is sent; a delete through another socket is not seen. Only the"
        " parameters map is compared: another protocol list may be compatible.",
        repeat_note="Every Provisioner RPC MUST be idempotent.",
        generic=frozenset(
            {
                "error-message-unreadable",
                "status-code-not-canonical",
                "bad-request-accepted",
                "bad-request-wrong-code",
                "retry-while-pending",
                "not-idempotent",
            }
        ),
    ),
    Rule(
        "cosi.id-format",
        MUST,
        BOTH,
        f"{TITLE} §{{rpc}}",
        "A bucket or account id holds characters other than alphanumerics, '-' and '.'.",
        note="The field comments (lower case): ids are at most 2048 characters of"
        " [a-z0-9A-Z], '-' and '.', their length judged by cosi.size-limit. An id is judged"
        " where it is made: existing_bucket_id in the request (the administrator's, so"
        " enforced), bucket_id and account_id in the driver's answers; where the COSI system"
        " passes a driver's id back the driver is blamed and nothing is enforced, unless"
        " this proxy saw the driver return it (reported there).",
    ),
    Rule(
        "cosi.requested-protocol-missing",
        MUST,
        (PLUGIN,),
        f"{TITLE} §{{rpc}}",
        "DriverCreateBucket or DriverGetExistingBucket answered OK without bucket info for a"
        " protocol the request lists.",
        reject_code=None,
        note="A non-nil bucket info is how the driver indicates support for a protocol; it"
        " MUST indicate the requested ones, and a protocol it cannot support MUST get"
        " INVALID_ARGUMENT instead of OK.",
    ),
    Rule(
        "cosi.protocol-not-supported",
        MUST,
        (PLUGIN,),
        f"{TITLE} §Protocol Definitions",
        "A bucket info or credential info is set for a protocol the driver's DriverGetInfo"
        " does not list in supported_protocols.",
        reject_code=None,
        note="What the driver supports is what DriverGetInfo lists; the proxy asks for it"
        " itself when it saw no answer within five minutes, and judges nothing when that"
        " fails. Whether a listed protocol is possible for a given bucket is the backend's"
        " business.",
    ),
    Rule(
        "cosi.grant-protocol-mismatch",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverGrantBucketAccess",
        "DriverGrantBucketAccess answered a bucket info or credentials for another protocol"
        " than the one requested, or more than one protocol's info for a bucket.",
        reject_code=None,
    ),
    Rule(
        "cosi.grant-bucket-not-answered",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverGrantBucketAccess",
        "DriverGrantBucketAccess answered OK without a BucketInfo for a bucket of the request.",
        reject_code=None,
    ),
    Rule(
        "cosi.key-credentials-missing",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverGrantBucketAccess",
        "A grant of authentication type KEY answered OK without credential info for the"
        " requested protocol.",
        reject_code=None,
        note="KEY asks the driver to make an access key for the protocol; an answer"
        " without one (no info for the protocol, or every field of it empty) did not"
        " provision it. Whether the keys work is the backend's business.",
    ),
    Rule(
        "cosi.grant-not-idempotent",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverGrantBucketAccess",
        "A repeated DriverGrantBucketAccess with the same account_name and arguments"
        " answered another account_id.",
        reject_code=None,
        note=f"Judged within {HANDOVER:.0f} s (a leader-election lease) of the earlier"
        " answer, with no DriverRevokeBucketAccess of its account sent since: later another"
        " replica may have revoked it and granted anew.",
    ),
    Rule(
        "cosi.grant-conflict-accepted",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverGrantBucketAccess",
        "DriverGrantBucketAccess of an account_name granted with other parameters is"
        " answered OK instead of ALREADY_EXISTS.",
        reject_code=None,
        note="Judged against the last successful grant of that name this proxy saw within"
        " the hour, forgotten once a DriverRevokeBucketAccess of its account is sent. Only"
        " the parameters map is compared.",
    ),
    Rule(
        "cosi.multi-bucket-out-of-range",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverGrantBucketAccess",
        "DriverGrantBucketAccess answered OUT_OF_RANGE, which is only for a driver that"
        " cannot grant several buckets at once, to a grant of one bucket, or after a grant"
        " of several buckets for the same protocol was answered OK.",
        reject_code=None,
        note=f"The second case is judged within {HANDOVER:.0f} s of that OK (a"
        " leader-election lease), in case the driver was replaced meanwhile.",
    ),
    Rule(
        "cosi.bucket-not-found",
        MUST,
        (PLUGIN,),
        f"{TITLE} §{{rpc}}",
        "DriverGetExistingBucket or DriverGrantBucketAccess answered NOT_FOUND for a bucket"
        " the driver returned shortly before, with no delete of it sent since.",
        reject_code=None,
        note=f"Judged within {HANDOVER:.0f} s of the answer that showed the bucket (a"
        " create, a get, a grant): the driver MUST correlate the bucket_id it returned to"
        " its bucket; later an administrator may have removed a bucket at the backend.",
    ),
    Rule(
        "cosi.deleted-bucket-not-ok",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverDeleteBucket",
        "DriverDeleteBucket answered NOT_FOUND, or a definite error for a bucket whose"
        " delete this proxy saw answered OK with the same parameters.",
        reject_code=None,
        note="A bucket that does not exist MUST get OK. Definite errors are"
        " INVALID_ARGUMENT, FAILED_PRECONDITION, ALREADY_EXISTS and OUT_OF_RANGE, judged"
        " within the hour of the earlier delete; transient errors are not judged.",
    ),
    Rule(
        "cosi.revoked-access-not-ok",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverRevokeBucketAccess",
        "DriverRevokeBucketAccess answered NOT_FOUND, or a definite error to a revoke this"
        " proxy saw answered OK with the same request.",
        reject_code=None,
        note="An access that does not exist (any more) MUST get OK. Definite errors are"
        " INVALID_ARGUMENT, FAILED_PRECONDITION, ALREADY_EXISTS and OUT_OF_RANGE, judged"
        " within the hour of the earlier revoke; transient errors are not judged.",
    ),
    Rule(
        "cosi.get-existing-changed",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverGetExistingBucket",
        "A repeated DriverGetExistingBucket with the same existing_bucket_id, protocols and"
        " parameters answered another bucket_id or protocols info.",
        reject_code=None,
        note=f"Judged within {HANDOVER:.0f} s (a leader-election lease) of the earlier"
        " answer; later the bucket may have been changed at the backend.",
    ),
    Rule(
        "cosi.retry-advised-unchanged",
        SHOULD,
        (CO,),
        f"{TITLE} §Error Scheme",
        "The COSI system re-sent an identical request within 10 minutes of the plugin"
        " answering it INVALID_ARGUMENT, whose recovery says the caller SHOULD fix the"
        " field(s) before retrying.",
        reject_code=None,
        note="Reported, never enforced. Requests without fields (DriverGetInfo) are not"
        " judged: independent callers send the same bytes.",
    ),
)

# §Error Scheme: INVALID_ARGUMENT "Caller SHOULD fix the field(s) before retrying". The
# other rows' recoveries advise nothing in the request (permissions, the backend, the
# secrets) or say only "Not retryable".
FIX_FIRST = {
    "INVALID_ARGUMENT": FixFirst(
        "SHOULD fix the field(s) before retrying", rule="retry-advised-unchanged"
    ),
}

# Every RPC "MUST be idempotent": an identical repeat of an OK call answered as a bad
# request is a breach (another replica or the backend cannot make a request invalid).
_REQUEST = frozenset({"INVALID_ARGUMENT", "UNIMPLEMENTED"})
PROVISIONER_RPCS = (
    "DriverCreateBucket",
    "DriverGetExistingBucket",
    "DriverDeleteBucket",
    "DriverGrantBucketAccess",
    "DriverRevokeBucketAccess",
)
STATE_CHANGES = {rpc: StateChange(_REQUEST) for rpc in PROVISIONER_RPCS}

REQUIRED: dict[str, tuple[str, ...]] = {
    "DriverGetInfoResponse": ("name", "supported_protocols"),
    "DriverCreateBucketRequest": ("name",),
    "DriverCreateBucketResponse": ("bucket_id", "protocols"),
    "DriverGetExistingBucketRequest": ("existing_bucket_id",),
    "DriverGetExistingBucketResponse": ("bucket_id", "protocols"),
    "DriverDeleteBucketRequest": ("bucket_id",),
    "DriverGrantBucketAccessRequest": (
        "account_name",
        "protocol",
        "authentication_type",
        "buckets",
    ),
    "DriverGrantBucketAccessRequest.AccessedBucket": ("bucket_id", "access_mode"),
    "DriverGrantBucketAccessResponse": ("account_id", "buckets", "credentials"),
    "DriverGrantBucketAccessResponse.BucketInfo": ("bucket_id", "bucket_info"),
    "DriverRevokeBucketAccessRequest": (
        "account_id",
        "protocol",
        "authentication_type",
        "buckets",
    ),
    "DriverRevokeBucketAccessRequest.AccessedBucket": ("bucket_id",),
    # Only ever in REQUIRED fields: UNKNOWN is no authentication type, no access mode.
    "AuthenticationType": ("type",),
    "AccessMode": ("mode",),
}

_CREATED_ID = ("DriverCreateBucketResponse", "bucket_id")
_GRANTED_ID = ("DriverGrantBucketAccessResponse", "account_id")
ECHOES = {
    ("DriverDeleteBucketRequest", "bucket_id"): _CREATED_ID,
    ("DriverGrantBucketAccessRequest.AccessedBucket", "bucket_id"): _CREATED_ID,
    ("DriverRevokeBucketAccessRequest.AccessedBucket", "bucket_id"): _CREATED_ID,
    ("DriverRevokeBucketAccessRequest", "account_id"): _GRANTED_ID,
}
SIZE_OVERRIDES: dict[tuple[str, str], int | None] = {
    _CREATED_ID: ID_LIMIT,
    _GRANTED_ID: ID_LIMIT,
    ("DriverGetExistingBucketRequest", "existing_bucket_id"): ID_LIMIT,
    ("DriverGetExistingBucketResponse", "bucket_id"): ID_LIMIT,
    ("DriverGrantBucketAccessResponse.BucketInfo", "bucket_id"): ID_LIMIT,
    ("AzureCredentialInfo", "access_token"): None,
}


# -- helpers ----------------------------------------------------------------------------------

_ID = re.compile(r"[A-Za-z0-9.-]*")


def id_ok(value: str) -> bool:
    return _ID.fullmatch(value) is not None


def protocol_name(protocol: Any) -> str:
    """S3, AZURE or GCS for an ObjectProtocol; "" for UNKNOWN or a number no name has."""
    fd = protocol.DESCRIPTOR.fields_by_name["type"]
    value = fd.enum_type.values_by_number.get(protocol.type)
    return value.name if value is not None and value.number else ""


def _enum_name(message: Any, field_name: str) -> str:
    fd = message.DESCRIPTOR.fields_by_name[field_name]
    value = fd.enum_type.values_by_number.get(getattr(message, field_name))
    return value.name if value is not None else ""


def info_protocols(info: Any) -> list[str]:
    """The protocols (S3, AZURE, GCS) whose member an ObjectProtocolAndBucketInfo or a
    CredentialInfo sets."""
    return [name for name, member in PROTOCOL_FIELDS.items() if info.HasField(member)]


def _requested(protocols: Iterable[Any]) -> list[str]:
    return list(dict.fromkeys(n for p in protocols if (n := protocol_name(p))))


@dataclass(slots=True)
class _Granted:
    parameters: bytes  # what ALREADY_EXISTS compares
    arguments: bytes  # everything a repeat must match to be the same grant
    account_id: str
    when: float


@dataclass(slots=True)
class _Got:
    arguments: bytes
    bucket_id: str
    info: bytes
    when: float


BAD_IDS_KEPT = 4096


class Buckets(BucketBook):
    """What this proxy saw of buckets and accesses, bounded and forgotten after an hour
    untouched (answers compared for idempotency after a lease)."""

    def __init__(self, st: SpecState) -> None:
        super().__init__(st)
        # account_name -> its last successful grant; account_id -> account_name
        self.grants: ExpiringMap[str, _Granted] = ExpiringMap(
            st.max_volumes, st.lifecycle_ttl, st.clock
        )
        self.accounts: ExpiringMap[str, str] = ExpiringMap(
            st.max_volumes, st.lifecycle_ttl, st.clock
        )
        # account_id -> (when, request digest) of a revoke answered OK
        self.revoked: ExpiringMap[str, tuple[float, bytes]] = ExpiringMap(
            st.max_volumes, st.lifecycle_ttl, st.clock
        )
        # existing_bucket_id -> the last successful DriverGetExistingBucket of it
        self.existing: ExpiringMap[str, _Got] = ExpiringMap(st.max_volumes, HANDOVER, st.clock)
        # protocol -> when a grant of several buckets for it was answered OK
        self.multi: ExpiringMap[str, float] = ExpiringMap(8, HANDOVER, st.clock)
        # digests of ids of a bad format the driver returned here (reported there); ordered,
        # as memory.remember drops the oldest of thousands cheaply only from one
        self.bad_ids: OrderedDict[bytes, None] = OrderedDict()


def _bad_id(cs: CompiledSpec, mem: Buckets, where: str, value: str) -> Violation | None:
    """An id the driver returns: reported when its format is wrong, and remembered."""
    if not value or id_ok(value):
        return None
    remember(mem.bad_ids, digest(value.encode("utf-8", "surrogatepass")), None, BAD_IDS_KEPT)
    return Violation(
        cs.rule("id-format"),
        where,
        f"{where} holds characters other than alphanumerics, '-' and '.'",
    )


def _bad_echo(cs: CompiledSpec, mem: Buckets, where: str, value: str) -> Violation | None:
    """An id of the driver's the COSI system passes back: blamed on the driver, never
    enforced, and not reported again when this proxy saw the driver return it."""
    if not value or id_ok(value):
        return None
    if digest(value.encode("utf-8", "surrogatepass")) in mem.bad_ids:
        return None
    return Violation(
        cs.rule("id-format"),
        where,
        f"{where} holds characters other than alphanumerics, '-' and '.'. The driver returns"
        " this id and the COSI system passes it back; this proxy did not see it returned",
        PLUGIN,
        enforceable=False,
    )


def _supported(st: SpecState) -> frozenset[str] | None:
    known = st.known_capabilities(PROTOCOLS)
    return known if known else None  # an empty list is required-field's, not a support list


def _unsupported(where: str, found: Iterable[str], supported: frozenset[str] | None) -> str:
    if supported is None:
        return ""
    extra = [p for p in found if p not in supported]
    if not extra:
        return ""
    return (
        f"{where} holds info for {', '.join(extra)}, which DriverGetInfo does not list as"
        f" supported ({', '.join(sorted(supported))}); the info of an unsupported protocol"
        " MUST be nil"
    )


# -- requests ---------------------------------------------------------------------------------


def _access_request(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    """Grant and revoke: the protocol's UNKNOWN is no protocol; a service account access
    names its service account."""
    out: list[Violation] = []
    if req.HasField("protocol") and not protocol_name(req.protocol):
        out.append(
            Violation(
                cs.rule("required-field"),
                "protocol.type",
                "protocol.type is REQUIRED but holds 0 (UNKNOWN)",
            )
        )
    kind = _enum_name(req.authentication_type, "type")
    if kind == "SERVICE_ACCOUNT" and not req.service_account_name:
        out.append(
            Violation(
                cs.rule("required-field"),
                "service_account_name",
                "service_account_name is REQUIRED when authentication_type is SERVICE_ACCOUNT,"
                " but empty",
            )
        )
    return out


def _existing_sent(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    value = req.existing_bucket_id
    if value and not id_ok(value):
        yield Violation(
            cs.rule("id-format"),
            "existing_bucket_id",
            "existing_bucket_id holds characters other than alphanumerics, '-' and '.'",
        )


def _delete_sent(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    mem = st.part(Buckets)
    out = [v for v in (_bad_echo(cs, mem, "bucket_id", req.bucket_id),) if v is not None]
    # Once a delete is on its way the bucket may be gone: a later create of its name may
    # make a new one, and NOT_FOUND for it is no longer wrong.
    forget_create(mem, req.bucket_id)
    seen = mem.seen.get(req.bucket_id)
    if seen is not None and not seen.deleted:
        del mem.seen[req.bucket_id]
    mem.existing.pop(req.bucket_id, None)
    return out


def _grant_sent(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    mem = st.part(Buckets)
    out = []
    for i, bucket in enumerate(req.buckets):
        v = _bad_echo(cs, mem, f"buckets[{i}].bucket_id", bucket.bucket_id)
        if v is not None:
            out.append(v)
    return out


def _revoke_sent(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    mem = st.part(Buckets)
    out = [v for v in (_bad_echo(cs, mem, "account_id", req.account_id),) if v is not None]
    for i, bucket in enumerate(req.buckets):
        v = _bad_echo(cs, mem, f"buckets[{i}].bucket_id", bucket.bucket_id)
        if v is not None:
            out.append(v)
    # Once a revoke is on its way, a later grant of the name may make a new account.
    name = mem.accounts.pop(req.account_id, None)
    if name is not None:
        granted = mem.grants.get(name)
        if granted is not None and granted.account_id == req.account_id:
            del mem.grants[name]
    return out


# -- responses --------------------------------------------------------------------------------


def _info_answered(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    """DriverGetInfo: supported_protocols lists at least one protocol, UNKNOWN being none."""
    if resp.supported_protocols and not _requested(resp.supported_protocols):
        yield Violation(
            cs.rule("required-field"),
            "supported_protocols",
            "supported_protocols is REQUIRED to list at least one protocol, but every entry"
            " holds 0 (UNKNOWN)",
        )


def _bucket_answer(
    cs: CompiledSpec, st: SpecState, req: Any, resp: Any, rpc: str
) -> list[Violation]:
    """Create and get-existing: the id, at least one protocol's info, the requested ones
    indicated, none the driver does not support."""
    mem = st.part(Buckets)
    out = [v for v in (_bad_id(cs, mem, "bucket_id", resp.bucket_id),) if v is not None]
    if not resp.HasField("protocols"):
        return out  # REQUIRED: the engine's required-field reports it
    given = info_protocols(resp.protocols)
    if not given:
        out.append(
            Violation(
                cs.rule("required-field"),
                "protocols",
                "protocols is REQUIRED to hold at least one protocol's bucket info, but holds none",
            )
        )
    missing = [p for p in _requested(req.protocols) if p not in given]
    if missing:
        out.append(
            Violation(
                cs.rule("requested-protocol-missing"),
                "protocols",
                f"{rpc} answered OK without bucket info for {', '.join(missing)}, which the"
                " request lists; the driver MUST indicate support for every requested"
                " protocol, or answer INVALID_ARGUMENT",
            )
        )
    problem = _unsupported("protocols", given, _supported(st))
    if problem:
        out.append(Violation(cs.rule("protocol-not-supported"), "protocols", problem))
    return out


def _created(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    out = _bucket_answer(cs, st, req, resp, "DriverCreateBucket")
    params = map_digest(req.parameters)
    arguments = parts_digest(params, *(p.SerializeToString() for p in req.protocols))
    out += judge_created(
        cs,
        st.part(Buckets),
        req.name,
        params,
        arguments,
        resp.bucket_id,
        message_digest(resp.protocols),
        "protocols",
        "name, protocols and parameters",
    )
    return out


def _got_existing(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    out = _bucket_answer(cs, st, req, resp, "DriverGetExistingBucket")
    mem = st.part(Buckets)
    now = mem.clock()
    key = req.existing_bucket_id
    if not key or not resp.bucket_id:
        return out
    arguments = parts_digest(
        map_digest(req.parameters), *(p.SerializeToString() for p in req.protocols)
    )
    info = message_digest(resp.protocols)
    prev = mem.existing.get(key)
    if prev is not None and prev.arguments == arguments:
        differ = [
            f
            for f, same in (
                ("bucket_id", prev.bucket_id == resp.bucket_id),
                ("protocols", prev.info == info),
            )
            if not same
        ]
        if differ:
            out.append(
                Violation(
                    cs.rule("get-existing-changed"),
                    differ[0],
                    "DriverGetExistingBucket repeated with the same existing_bucket_id,"
                    f" protocols and parameters returned another {' and '.join(differ)} than"
                    f" it returned {ago(now - prev.when)}",
                )
            )
    mem.existing[key] = _Got(arguments, resp.bucket_id, info, now)
    seen = mem.seen.get(resp.bucket_id)
    name = seen.name if seen is not None and not seen.deleted else ""
    mem.seen[resp.bucket_id] = Seen(name, False, now, by="DriverGetExistingBucket")
    return out


def _granted(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    mem = st.part(Buckets)
    out: list[Violation] = []
    v = _bad_id(cs, mem, "account_id", resp.account_id)
    if v is not None:
        out.append(v)
    wanted = protocol_name(req.protocol) if req.HasField("protocol") else ""
    supported = _supported(st)
    answered: set[str] = set()
    for i, bucket in enumerate(resp.buckets):
        where = f"buckets[{i}]"
        answered.add(bucket.bucket_id)
        v = _bad_id(cs, mem, f"{where}.bucket_id", bucket.bucket_id)
        if v is not None:
            out.append(v)
        if not bucket.HasField("bucket_info"):
            continue  # REQUIRED: the engine's required-field reports it
        given = info_protocols(bucket.bucket_info)
        if not given:
            out.append(
                Violation(
                    cs.rule("required-field"),
                    f"{where}.bucket_info",
                    f"{where}.bucket_info is REQUIRED to hold exactly one protocol's info, but"
                    " holds none",
                )
            )
        elif len(given) > 1 or (wanted and given != [wanted]):
            out.append(
                Violation(
                    cs.rule("grant-protocol-mismatch"),
                    f"{where}.bucket_info",
                    f"{where}.bucket_info holds info for {', '.join(given)}; the grant asked"
                    f" for {wanted or 'one protocol'}, and exactly that one MUST be set",
                )
            )
        problem = _unsupported(f"{where}.bucket_info", given, supported)
        if problem:
            out.append(
                Violation(cs.rule("protocol-not-supported"), f"{where}.bucket_info", problem)
            )
    missing = [i for i, b in enumerate(req.buckets) if b.bucket_id and b.bucket_id not in answered]
    if missing:
        shown = ", ".join(f"buckets[{i}]" for i in missing)
        out.append(
            Violation(
                cs.rule("grant-bucket-not-answered"),
                "buckets",
                f"DriverGrantBucketAccess answered OK without a BucketInfo for {shown} of the"
                " request; the driver MUST return info for every requested bucket",
            )
        )
    if resp.HasField("credentials"):
        given = info_protocols(resp.credentials)
        other = [p for p in given if wanted and p != wanted]
        if other:
            out.append(
                Violation(
                    cs.rule("grant-protocol-mismatch"),
                    "credentials",
                    f"credentials hold info for {', '.join(other)}; the grant asked for {wanted}",
                )
            )
        problem = _unsupported("credentials", given, supported)
        if problem:
            out.append(Violation(cs.rule("protocol-not-supported"), "credentials", problem))
        if wanted and _enum_name(req.authentication_type, "type") == "KEY":
            member = getattr(resp.credentials, PROTOCOL_FIELDS[wanted])
            if wanted not in given or not member.ListFields():
                out.append(
                    Violation(
                        cs.rule("key-credentials-missing"),
                        f"credentials.{PROTOCOL_FIELDS[wanted]}",
                        f"a KEY grant for {wanted} answered OK without {wanted} credentials;"
                        " the driver MUST provision the authentication type requested",
                    )
                )
    out += _remember_grant(cs, mem, req, resp, wanted)
    return out


def _remember_grant(
    cs: CompiledSpec, mem: Buckets, req: Any, resp: Any, wanted: str
) -> list[Violation]:
    out: list[Violation] = []
    now = mem.clock()
    for bucket in resp.buckets:
        seen = mem.seen.get(bucket.bucket_id)
        if bucket.bucket_id and (seen is None or not seen.deleted):
            name = seen.name if seen is not None else ""
            mem.seen[bucket.bucket_id] = Seen(name, False, now, by="DriverGrantBucketAccess")
    if wanted and len(req.buckets) > 1:
        mem.multi[wanted] = now
    name, account_id = req.account_name, resp.account_id
    if not name or not account_id:
        return out
    params = map_digest(req.parameters)
    arguments = parts_digest(
        params,
        req.protocol.SerializeToString(),
        req.authentication_type.SerializeToString(),
        req.service_account_name.encode(),
        *(b.SerializeToString() for b in req.buckets),
    )
    prev = mem.grants.get(name)
    if prev is not None and prev.parameters != params:
        out.append(
            Violation(
                cs.rule("grant-conflict-accepted"),
                "parameters",
                "DriverGrantBucketAccess answered OK for an account_name granted"
                f" {ago(now - prev.when)} with other parameters (parameters differ); a"
                " principal of the same name with incompatible parameters MUST get"
                " ALREADY_EXISTS",
            )
        )
        return out  # the access stays the one granted first
    if (
        prev is not None
        and prev.arguments == arguments
        and prev.account_id != account_id
        and now - prev.when <= HANDOVER
    ):
        out.append(
            Violation(
                cs.rule("grant-not-idempotent"),
                "account_id",
                "DriverGrantBucketAccess repeated with the same account_name and arguments"
                f" returned another account_id than it returned {ago(now - prev.when)}, and no"
                " revoke of that one was sent since",
            )
        )
    mem.grants[name] = _Granted(params, arguments, account_id, now)
    mem.accounts[account_id] = name
    return out


# -- after the call ---------------------------------------------------------------------------


def _deleted(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    remember_deleted(st.part(Buckets), req.bucket_id, map_digest(req.parameters))


def _revoked(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    mem = st.part(Buckets)
    if req.account_id:
        mem.revoked[req.account_id] = (mem.clock(), message_digest(req))


def _delete_refused(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    if code == "NOT_FOUND":
        return [
            Violation(
                cs.rule("deleted-bucket-not-ok"),
                "bucket_id",
                "DriverDeleteBucket answered NOT_FOUND; a bucket that does not exist MUST get OK",
                party=PLUGIN,
            )
        ]
    return judge_delete_refused(
        cs,
        st.part(Buckets),
        "deleted-bucket-not-ok",
        req.bucket_id,
        map_digest(req.parameters),
        code,
        "parameters",
        "it MUST get OK",
    )


def _revoke_refused(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    if code == "NOT_FOUND":
        return [
            Violation(
                cs.rule("revoked-access-not-ok"),
                "account_id",
                "DriverRevokeBucketAccess answered NOT_FOUND; an access that does not exist"
                " MUST get OK",
                party=PLUGIN,
            )
        ]
    if code not in DEFINITE:
        return []
    mem = st.part(Buckets)
    earlier = mem.revoked.get(req.account_id)
    if earlier is None or earlier[1] != message_digest(req):
        return []
    return [
        Violation(
            cs.rule("revoked-access-not-ok"),
            "account_id",
            f"DriverRevokeBucketAccess answered {code} to a revoke answered OK"
            f" {ago(mem.clock() - earlier[0])} with the same request; an access already"
            " removed MUST get OK",
            party=PLUGIN,
        )
    ]


def _lost(mem: Buckets, bucket_id: str) -> Seen | None:
    seen = mem.seen.get(bucket_id) if bucket_id else None
    if seen is None or seen.deleted or mem.clock() - seen.when > HANDOVER:
        return None
    return seen


def _bucket_not_found(
    cs: CompiledSpec, mem: Buckets, rpc: str, where: str, seen: Seen
) -> Violation:
    return Violation(
        cs.rule("bucket-not-found"),
        where,
        f"{rpc} answered NOT_FOUND for a bucket {seen.by} returned"
        f" {ago(mem.clock() - seen.when)}, with no delete of it sent since; the driver MUST"
        " correlate the bucket_id it returned to its bucket",
        party=PLUGIN,
    )


def _get_existing_refused(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    if code != "NOT_FOUND":
        return []
    mem = st.part(Buckets)
    seen = _lost(mem, req.existing_bucket_id)
    if seen is None:
        return []
    return [_bucket_not_found(cs, mem, "DriverGetExistingBucket", "existing_bucket_id", seen)]


def _grant_refused(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    mem = st.part(Buckets)
    if code == "NOT_FOUND":
        for i, bucket in enumerate(req.buckets):
            seen = _lost(mem, bucket.bucket_id)
            if seen is not None:
                where = f"buckets[{i}].bucket_id"
                return [_bucket_not_found(cs, mem, "DriverGrantBucketAccess", where, seen)]
        return []
    if code != "OUT_OF_RANGE":
        return []
    if len(req.buckets) <= 1:
        why = f"this grant names {len(req.buckets)} bucket(s)"
    else:
        wanted = protocol_name(req.protocol) if req.HasField("protocol") else ""
        when = mem.multi.get(wanted) if wanted else None
        if when is None:
            return []
        why = f"a grant of several buckets for {wanted} was answered OK {ago(mem.clock() - when)}"
    return [
        Violation(
            cs.rule("multi-bucket-out-of-range"),
            "buckets",
            "DriverGrantBucketAccess answered OUT_OF_RANGE, which is only for a driver that"
            f" cannot grant several buckets at once, but {why}",
            party=PLUGIN,
        )
    ]


_DRIVER_INFO = f"/{PACKAGE}.Identity/DriverGetInfo"

TABLE = SpecTable(
    spec="cosi.v1alpha2",
    family="cosi",
    title=TITLE,
    package=PACKAGE,
    rules=RULES,
    required=REQUIRED,
    size_overrides=SIZE_OVERRIDES,
    echoes=ECHOES,
    plugin_name_fields=(("DriverGetInfoResponse", "name"),),
    # §RPC Interface: Identity and Provisioner, every RPC "MUST implement".
    required_rpcs=frozenset({"DriverGetInfo", *PROVISIONER_RPCS}),
    capability_queries={PROTOCOLS: _DRIVER_INFO},
    capability_responses={"DriverGetInfo": PROTOCOLS},
    capability_needs={
        rpc: (PROTOCOLS,)
        for rpc in ("DriverCreateBucket", "DriverGetExistingBucket", "DriverGrantBucketAccess")
    },
    request_checks={
        "DriverGetExistingBucket": (_existing_sent,),
        "DriverDeleteBucket": (_delete_sent,),
        "DriverGrantBucketAccess": (_access_request, _grant_sent),
        "DriverRevokeBucketAccess": (_access_request, _revoke_sent),
    },
    response_checks={
        "DriverGetInfo": (_info_answered,),
        "DriverCreateBucket": (_created,),
        "DriverGetExistingBucket": (_got_existing,),
        "DriverGrantBucketAccess": (_granted,),
    },
    on_success={"DriverDeleteBucket": (_deleted,), "DriverRevokeBucketAccess": (_revoked,)},
    on_error={
        "DriverGetExistingBucket": (_get_existing_refused,),
        "DriverDeleteBucket": (_delete_refused,),
        "DriverGrantBucketAccess": (_grant_refused,),
        "DriverRevokeBucketAccess": (_revoke_refused,),
    },
    fix_first=FIX_FIRST,
    state_changes=STATE_CHANGES,
)
