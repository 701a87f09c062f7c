"""COSI v1alpha1 (cosi.v1alpha1): further breaches of covered statements, each the obvious
variant of a simpler one (another field, code, order or timing), with its legitimate twin.

Bucket idempotency (the Provisioner service's create, delete and grant, §DriverCreateBucket),
ids a driver makes (§DriverCreateBucket's bucket_id, §Size Limits), the driver name
(§DriverGetInfo), status codes and their recovery (§Error Scheme) and the services served
at the endpoint (§Connectivity).
"""

from __future__ import annotations

from typing import Any

from tests.integration.planted.harness import Case, Step

SPEC = "cosi.v1alpha1"
CASES: list[Case] = []

DRIVER = "cosi.example.com"
BUCKET = "bucket-000001"
ACCOUNT = "account-000001"
S3_INFO = {"s3": {"region": "us-east-1", "signature_version": "S3V4"}}
PARAMS = {"protocol": "s3", "region": "us-east-1"}
CREDENTIALS = {"s3": {"secrets": {"accessKeyID": "AKIAEXAMPLE", "accessSecretKey": "c2VjcmV0"}}}


def create(name: str = "photos", **params: str) -> dict[str, Any]:
    return {"name": name, "parameters": params or dict(PARAMS)}


def created(bucket_id: str = BUCKET, info: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"bucket_id": bucket_id, "bucket_info": S3_INFO if info is None else info}


def grant(bucket_id: str = BUCKET, name: str = "ba-photos") -> dict[str, Any]:
    return {"bucket_id": bucket_id, "name": name, "authentication_type": "Key"}


def granted(account_id: str = ACCOUNT) -> dict[str, Any]:
    return {"account_id": account_id, "credentials": CREDENTIALS}


def delete(**context: str) -> dict[str, Any]:
    return {"bucket_id": BUCKET, "delete_context": context}


def add(
    statements: tuple[str, ...],
    rule: str,
    breach: tuple[Step, ...],
    twin: tuple[Step, ...],
    variant: str,
    party: str = "",
    why: str = "",
) -> None:
    CASES.append(Case(SPEC, statements, rule, breach, twin, {}, party, why, variant))


CREATE = Step("DriverCreateBucket", create(), answer=created())
INFO = Step("DriverGetInfo", answer={"name": DRIVER})

# -- DriverCreateBucket: idempotent, and ALREADY_EXISTS for other parameters ------------------
IDEMPOTENT = ("RPC-Interface.lc1", "DriverCreateBucket.2", "DriverCreateBucket.3")
add(
    IDEMPOTENT,
    "cosi.create-not-idempotent",
    (CREATE, Step("DriverCreateBucket", create(), answer=created(info={"s3": {"region": "eu"}}))),
    (CREATE, CREATE),
    "bucket-info",
    party="plugin",
    why="a repeat answered with the same bucket_id but another bucket_info",
)
add(
    IDEMPOTENT,
    "cosi.not-idempotent",
    (
        CREATE,
        Step("DriverCreateBucket", create(), error=("INVALID_ARGUMENT", "name is taken")),
    ),
    (CREATE, CREATE),
    "refused-repeat",
    party="plugin",
    why="a create that succeeded, repeated unchanged, refused as an invalid request",
)
add(
    IDEMPOTENT,
    "cosi.not-idempotent",
    (
        CREATE,
        Step("DriverCreateBucket", create(), error=("OUT_OF_RANGE", "region is full")),
    ),
    (
        CREATE,
        Step("DriverCreateBucket", create(), error=("UNAVAILABLE", "backend restarting")),
    ),
    "out-of-range-repeat",
    party="plugin",
    why="a create that succeeded, repeated unchanged, refused as out of range; the twin's"
    " repeat meets a transient failure",
)
add(
    ("RPC-Interface.lc2", "Error-Scheme.4", "CreateBucket-Errors.2"),
    "cosi.create-conflict-accepted",
    (
        CREATE,
        Step("DriverCreateBucket", create(**PARAMS, quotaGiB="10"), answer=created()),
    ),
    (
        CREATE,
        Step(
            "DriverCreateBucket",
            create(**PARAMS, quotaGiB="10"),
            error=("ALREADY_EXISTS", "photos exists without a quota"),
        ),
    ),
    "parameter-added",
    party="plugin",
    why="the second create adds a parameter, answered OK with the first bucket",
)
add(
    ("RPC-Interface.lc2", "Error-Scheme.4", "CreateBucket-Errors.2"),
    "cosi.create-conflict-accepted",
    (
        CREATE,
        Step("DriverDeleteBucket", {"bucket_id": "bucket-000009"}),
        Step("DriverCreateBucket", create(region="eu-west-1"), answer=created("bucket-000002")),
    ),
    (
        CREATE,
        Step("DriverDeleteBucket", {"bucket_id": BUCKET}),
        Step("DriverCreateBucket", create(region="eu-west-1"), answer=created("bucket-000002")),
    ),
    "other-bucket-deleted",
    party="plugin",
    why="a delete of another bucket between does not free the name; the twin deletes the"
    " bucket itself, after which the name may be created anew",
)

# -- DriverDeleteBucket of a deleted bucket ----------------------------------------------------
add(
    ("RPC-Interface.lc3",),
    "cosi.delete-not-idempotent",
    (
        Step("DriverDeleteBucket", delete(region="us-east-1")),
        Step(
            "DriverDeleteBucket",
            delete(region="us-east-1"),
            error=("FAILED_PRECONDITION", "bucket is gone"),
        ),
    ),
    (
        Step("DriverDeleteBucket", delete(region="us-east-1")),
        Step("DriverDeleteBucket", delete(region="us-east-1")),
    ),
    "repeat-refused",
    party="plugin",
    why="a delete that succeeded, repeated with the same delete_context, refused",
)
add(
    ("RPC-Interface.lc3",),
    "cosi.delete-not-idempotent",
    (
        Step("DriverDeleteBucket", delete()),
        Step("DriverDeleteBucket", delete(), error=("NOT_FOUND", "no such bucket"), wait=0.2),
    ),
    (
        Step("DriverDeleteBucket", delete()),
        Step("DriverDeleteBucket", delete(), error=("UNAVAILABLE", "backend restarting")),
    ),
    "not-found-after-delete",
    party="plugin",
    why="NOT_FOUND for a bucket this socket saw deleted",
)

# -- DriverGrantBucketAccess: the access name identifies the account ---------------------------
REVOKE = Step("DriverRevokeBucketAccess", {"bucket_id": BUCKET, "account_id": ACCOUNT})
GRANT = Step("DriverGrantBucketAccess", grant(), answer=granted())
add(
    ("RPC-Interface.lc4",),
    "cosi.grant-account-changed",
    (
        GRANT,
        Step("DriverRevokeBucketAccess", {"bucket_id": BUCKET, "account_id": "account-000009"}),
        Step("DriverGrantBucketAccess", grant(), answer=granted("account-000002")),
    ),
    (GRANT, REVOKE, Step("DriverGrantBucketAccess", grant(), answer=granted("account-000002"))),
    "other-account-revoked",
    party="plugin",
    why="a revoke of another account between does not let the name change account; the"
    " twin revokes the account itself first",
)

# -- ids the driver makes --------------------------------------------------------------------
add(
    ("RPC-Interface.8", "RPC-Interface.9", "RPC-Interface.14"),
    "cosi.bucket-id-empty",
    (Step("DriverCreateBucket", create(), answer=created(bucket_id="")),),
    (CREATE,),
    "created-without-id",
    party="plugin",
    why="DriverCreateBucket succeeded without a bucket_id, which the delete, grant and revoke"
    " of that bucket must carry",
)
add(
    ("Size-Limits.1",),
    "cosi.size-limit",
    (Step("DriverCreateBucket", create(), answer=created(bucket_id="b" * 129)),),
    (Step("DriverCreateBucket", create(), answer=created(bucket_id="b" * 128)),),
    "bucket-id",
    party="plugin",
    why="a bucket_id of 129 bytes; the twin's has 128",
)
_BIG = {f"k{i:03d}": "v" * 40 for i in range(100)}  # 100 * (4 + 40) bytes: over 4 KiB
_FITS = {f"k{i:03d}": "v" * 40 for i in range(90)}  # 90 * 44 = 3960 bytes
add(
    ("Size-Limits.1",),
    "cosi.size-limit",
    (Step("DriverCreateBucket", {"name": "photos", "parameters": _BIG}, answer=created()),),
    (Step("DriverCreateBucket", {"name": "photos", "parameters": _FITS}, answer=created()),),
    "parameters-map",
    party="co",
    why="parameters over 4 KiB",
)
add(
    ("Size-Limits.1",),
    "cosi.size-limit",
    (
        Step(
            "DriverGrantBucketAccess",
            grant(),
            answer={"account_id": "a" * 129, "credentials": CREDENTIALS},
        ),
    ),
    (
        Step(
            "DriverGrantBucketAccess",
            grant(),
            answer={"account_id": "a" * 128, "credentials": CREDENTIALS},
        ),
    ),
    "account-id",
    party="plugin",
    why="an account_id of 129 bytes",
)

# -- the driver name -------------------------------------------------------------------------
add(
    ("RPC-Interface.6",),
    "cosi.plugin-name-format",
    (Step("DriverGetInfo", answer={"name": "cosi.example.com-"}),),
    (Step("DriverGetInfo", answer={"name": "cosi.example.com-1"}),),
    "ends-with-dash",
    party="plugin",
    why="a name ending with a dash",
)
add(
    ("RPC-Interface.6",),
    "cosi.plugin-name-format",
    (Step("DriverGetInfo", answer={"name": "a" * 52 + ".example.com"}),),
    (Step("DriverGetInfo", answer={"name": "a" * 51 + ".example.com"}),),
    "64-characters",
    party="plugin",
    why="a name of 64 characters; the twin's has 63",
)

# -- status codes (§Error Scheme) ------------------------------------------------------------
add(
    ("Error-Scheme.2",),
    "cosi.status-code-not-canonical",
    (Step("DriverGrantBucketAccess", grant(), error=("17", "backend failure")),),
    (Step("DriverGrantBucketAccess", grant(), error=("UNAUTHENTICATED", "backend failure")),),
    "one-past-last",
    party="plugin",
    why="grpc-status 17, one past the canonical codes; the twin's 16 is the last",
)
add(
    ("Error-Scheme.4", "CreateBucket-Errors.2"),
    "cosi.error-code-unexpected",
    (Step("DriverCreateBucket", create(quotaGiB="4096"), error=("FAILED_PRECONDITION", "quota")),),
    (Step("DriverCreateBucket", create(quotaGiB="4096"), error=("OUT_OF_RANGE", "quota")),),
    "unsupported-value",
    party="plugin",
    why="an unsupported parameter value refused with a code neither the RPC's table nor the"
    " general one has",
)

# -- recovery (§Error Scheme) ----------------------------------------------------------------
_ABORTED = ("ABORTED", "an operation is pending for the bucket")
_GRANT_REFUSED = Step("DriverGrantBucketAccess", grant(), error=_ABORTED)
add(
    ("Error-Scheme.10",),
    "cosi.retry-without-backoff",
    (
        _GRANT_REFUSED,
        Step("DriverGrantBucketAccess", grant(), error=_ABORTED, wait=0.1),
        Step("DriverGrantBucketAccess", grant(), error=_ABORTED, wait=0.1),
        Step("DriverGrantBucketAccess", grant(), answer=granted(), wait=0.1),
    ),
    (
        _GRANT_REFUSED,
        Step("DriverGrantBucketAccess", grant(), error=_ABORTED, wait=0.1),
        Step("DriverGrantBucketAccess", grant(), error=_ABORTED, wait=0.2),
        Step("DriverGrantBucketAccess", grant(), answer=granted(), wait=0.4),
    ),
    "steady-waits",
    party="co",
    why="retried after ABORTED three times, each after the same short wait",
)
add(
    ("Error-Scheme.10",),
    "cosi.retry-while-pending",
    (
        Step("DriverDeleteBucket", delete(), hold=0.6, pending=True),
        Step("DriverDeleteBucket", delete(), error=_ABORTED, pending=True),
        Step("DriverDeleteBucket", delete(), hold=0.6, pending=True),
        Step("DriverDeleteBucket", delete(), wait=0.7),
    ),
    (
        Step("DriverDeleteBucket", delete(), hold=0.2, pending=True),
        Step("DriverDeleteBucket", delete(), error=_ABORTED, pending=True),
        Step("DriverDeleteBucket", delete(), wait=0.7),
    ),
    "delete-in-flight",
    party="co",
    why="a delete retried after ABORTED while another delete of the bucket is in flight"
    " (the proxy queues deletes of one bucket); the twin retries once none is",
)

# -- the services served at the endpoint (§Connectivity) -------------------------------------
add(
    ("Connectivity.6",),
    "cosi.unimplemented-advertised",
    (INFO, Step("DriverCreateBucket", create(), error=("UNIMPLEMENTED", "served elsewhere"))),
    (INFO, CREATE),
    "provisioner-missing",
    party="plugin",
    why="the Identity service answers at the endpoint, the Provisioner service does not",
)

# -- more idempotency variants: which objects a call names, and map order --------------------
add(
    IDEMPOTENT,
    "cosi.create-not-idempotent",
    (
        CREATE,
        Step("DriverDeleteBucket", {"bucket_id": "bucket-000009"}),
        Step("DriverCreateBucket", create(), answer=created("bucket-000002")),
    ),
    (
        CREATE,
        Step("DriverDeleteBucket", {"bucket_id": BUCKET}),
        Step("DriverCreateBucket", create(), answer=created("bucket-000002")),
    ),
    "other-bucket-deleted",
    party="plugin",
    why="a delete of another bucket between does not explain a new bucket_id for the name;"
    " the twin deletes the bucket itself, after which the name is a new bucket",
)
_AB = {"name": "photos", "parameters": {"protocol": "s3", "region": "us-east-1"}}
_BA = {"name": "photos", "parameters": {"region": "us-east-1", "protocol": "s3"}}
_OTHER = {"name": "photos", "parameters": {"region": "eu-west-1", "protocol": "s3"}}
add(
    ("RPC-Interface.lc2", "Error-Scheme.4", "CreateBucket-Errors.2"),
    "cosi.create-conflict-accepted",
    (
        Step("DriverCreateBucket", _AB, answer=created()),
        Step("DriverCreateBucket", _OTHER, answer=created()),
    ),
    (
        Step("DriverCreateBucket", _AB, answer=created()),
        Step("DriverCreateBucket", _BA, answer=created()),
    ),
    "map-order",
    party="plugin",
    why="another region answered OK; the twin repeats the same parameters in another order",
)
add(
    ("RPC-Interface.lc4",),
    "cosi.grant-account-changed",
    (GRANT, Step("DriverGrantBucketAccess", grant(), answer=granted("account-000002"))),
    (
        GRANT,
        Step(
            "DriverGrantBucketAccess",
            grant(bucket_id="bucket-000002"),
            answer=granted("account-000002"),
        ),
    ),
    "per-bucket",
    party="plugin",
    why="the same access name for the same bucket gets another account; the twin's second"
    " grant is for another bucket, whose access of that name is another account",
)
add(
    ("Size-Limits.1",),
    "cosi.size-limit",
    (Step("DriverCreateBucket", create("é" * 65), error=("INVALID_ARGUMENT", "bad name")),),
    (Step("DriverCreateBucket", create("é" * 64), error=("INVALID_ARGUMENT", "bad name")),),
    "multibyte-name",
    party="co",
    why="a name of 65 characters that is 130 bytes of UTF-8; the twin's is 128 bytes",
)
_TYPO = {**grant(), "parameters": {"role": "readwrite-typo", "prefix": "photos/"}}
_TYPO_REORDERED = {**grant(), "parameters": {"prefix": "photos/", "role": "readwrite-typo"}}
_FIXED = {**grant(), "parameters": {"prefix": "photos/", "role": "readwrite"}}
_INVALID = ("INVALID_ARGUMENT", "role readwrite-typo is not supported")
add(
    ("Error-Scheme.7",),
    "cosi.retry-without-change",
    (
        Step("DriverGrantBucketAccess", _TYPO, error=_INVALID),
        Step("DriverGrantBucketAccess", _TYPO_REORDERED, error=_INVALID),
    ),
    (
        Step("DriverGrantBucketAccess", _TYPO, error=_INVALID),
        Step("DriverGrantBucketAccess", _FIXED, answer=granted()),
    ),
    "map-reordered",
    party="co",
    why="the refused request re-sent with its parameters in another order, the invalid value kept",
)
for _rpc, _request in (
    ("DriverGrantBucketAccess", grant()),
    ("DriverRevokeBucketAccess", {"bucket_id": BUCKET, "account_id": ACCOUNT}),
):
    add(
        ("Bucket-Lifecycle.1",),
        "cosi.unimplemented-recommended",
        (Step(_rpc, _request, error=("UNIMPLEMENTED", "not supported")),),
        (Step(_rpc, _request, answer=granted() if _rpc == "DriverGrantBucketAccess" else {}),),
        _rpc,
        party="plugin",
    )

# -- more limits and name forms: other fields, other messages ---------------------------------
add(
    ("Size-Limits.1",),
    "cosi.size-limit",
    (Step("DriverCreateBucket", create(), answer=created(info={"s3": {"region": "r" * 129}})),),
    (Step("DriverCreateBucket", create(), answer=created(info={"s3": {"region": "r" * 128}})),),
    "bucket-info-region",
    party="plugin",
    why="a string nested in the bucket_info of 129 bytes",
)
add(
    ("Size-Limits.1",),
    "cosi.size-limit",
    (
        Step(
            "DriverGrantBucketAccess",
            grant(),
            answer={"account_id": ACCOUNT, "credentials": {"s3": {"secrets": _BIG}}},
        ),
    ),
    (
        Step(
            "DriverGrantBucketAccess",
            grant(),
            answer={"account_id": ACCOUNT, "credentials": {"s3": {"secrets": _FITS}}},
        ),
    ),
    "secrets-map",
    party="plugin",
    why="a credentials secrets map over 4 KiB",
)
add(
    ("Size-Limits.1",),
    "cosi.size-limit",
    (Step("DriverDeleteBucket", {"bucket_id": BUCKET, "delete_context": _BIG}),),
    (Step("DriverDeleteBucket", {"bucket_id": BUCKET, "delete_context": _FITS}),),
    "delete-context",
    party="co",
    why="a delete_context over 4 KiB",
)
add(
    ("Size-Limits.1",),
    "cosi.size-limit",
    (
        Step(
            "DriverGrantBucketAccess",
            grant(name="a" * 129),
            error=("INVALID_ARGUMENT", "access name too long"),
        ),
    ),
    (Step("DriverGrantBucketAccess", grant(name="a" * 128), answer=granted()),),
    "access-name",
    party="co",
    why="an access name of 129 bytes",
)
for _variant, _bad, _good in (
    ("empty-label", "cosi..example.com", "cosi.x.example.com"),
    ("label-dash", "cosi.-example.com", "cosi.x-example.com"),
):
    add(
        ("RPC-Interface.4",),
        "cosi.plugin-name-format",
        (Step("DriverGetInfo", answer={"name": _bad}),),
        (Step("DriverGetInfo", answer={"name": _good}),),
        _variant,
        party="plugin",
        why="a name whose characters statement 6 allows but whose labels domain name notation"
        " does not",
    )

_REVOKE_REQUEST = {"bucket_id": BUCKET, "account_id": "account-000007"}
add(
    ("Error-Scheme.10",),
    "cosi.retry-while-pending",
    (
        Step("DriverRevokeBucketAccess", _REVOKE_REQUEST, hold=0.6, pending=True),
        Step("DriverGrantBucketAccess", grant(), error=_ABORTED, pending=True),
        Step("DriverRevokeBucketAccess", _REVOKE_REQUEST, hold=0.6, pending=True),
        Step("DriverGrantBucketAccess", grant(), answer=granted(), wait=0.7),
    ),
    (
        Step("DriverRevokeBucketAccess", _REVOKE_REQUEST, hold=0.2, pending=True),
        Step("DriverGrantBucketAccess", grant(), error=_ABORTED, pending=True),
        Step("DriverGrantBucketAccess", grant(), answer=granted(), wait=0.7),
    ),
    "other-rpc-in-flight",
    party="co",
    why="a grant retried after ABORTED while a revoke on the same bucket is in flight",
)
