"""COSI v1alpha1: a planted breach of every covered statement, each with its legitimate twin."""

from __future__ import annotations

from tests.integration.planted.cosi_cmi_builders import (
    STATUS_DETAILS,
    Builders,
    grant_answer_bytes,
    without,
)
from tests.integration.planted.harness import Case, Step

SPEC = "cosi.v1alpha1"
DRIVER = "cosi.example.com"
CREATE = {"name": "bucket-claim-1", "parameters": {"tier": "standard"}}
BUCKET = {"bucket_id": "bucket-1", "bucket_info": {"s3": {"region": "us-east-1"}}}
DELETE = {"bucket_id": "bucket-1"}
GRANT = {"bucket_id": "bucket-1", "name": "access-1", "authentication_type": "Key"}
SECRETS = {"accessKeyID": "AKIA0001", "accessSecretKey": "c2VjcmV0"}
GRANTED = {"account_id": "account-1", "credentials": {"s3": {"secrets": SECRETS}}}
REVOKE = {"bucket_id": "bucket-1", "account_id": "account-1"}


_BUILDERS = Builders(SPEC)
one, retry = _BUILDERS.one, _BUILDERS.retry

BAD_PARAMS = {**CREATE, "parameters": {"tier": "standrad"}}

CASES = [
    # -- implemented RPCs ------------------------------------------------------------------
    one(
        ("Bucket-Lifecycle.1",),
        "cosi.unimplemented-recommended",
        "DriverDeleteBucket",
        (DELETE, ("UNIMPLEMENTED", "deleting buckets is not supported")),
        (DELETE, {}),
        party="plugin",
    ),
    one(
        ("DriverCreateBucket.1",),
        "cosi.unimplemented-advertised",
        "DriverCreateBucket",
        (CREATE, ("UNIMPLEMENTED", "not supported")),
        (CREATE, BUCKET),
        party="plugin",
    ),
    one(
        ("Connectivity.3",),
        "cosi.unimplemented-advertised",
        "DriverGetInfo",
        ({}, ("UNIMPLEMENTED", "not supported")),
        ({}, {"name": DRIVER}),
        party="plugin",
    ),
    Case(
        SPEC,
        ("Connectivity.6",),
        "cosi.unimplemented-advertised",
        breach=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step("DriverGetInfo", error=("UNIMPLEMENTED", "identity served elsewhere")),
        ),
        twin=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step("DriverGetInfo", answer={"name": DRIVER}),
        ),
        party="plugin",
        why="the endpoint serves the Provisioner service but not the Identity one",
    ),
    # -- bucket idempotency ----------------------------------------------------------------
    Case(
        SPEC,
        ("RPC-Interface.lc1", "DriverCreateBucket.2", "DriverCreateBucket.3"),
        "cosi.create-not-idempotent",
        breach=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step("DriverCreateBucket", CREATE, answer={**BUCKET, "bucket_id": "bucket-2"}),
        ),
        twin=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
        ),
        party="plugin",
        why="the same name and parameters answered with another bucket than before",
    ),
    Case(
        SPEC,
        ("RPC-Interface.lc2", "Error-Scheme.4", "CreateBucket-Errors.2"),
        "cosi.create-conflict-accepted",
        breach=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step("DriverCreateBucket", {**CREATE, "parameters": {"tier": "cold"}}, answer=BUCKET),
        ),
        twin=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step(
                "DriverCreateBucket",
                {**CREATE, "parameters": {"tier": "cold"}},
                error=("ALREADY_EXISTS", "bucket-claim-1 exists with tier standard"),
            ),
        ),
        party="plugin",
        why="a bucket of that name exists with other parameters, answered OK",
    ),
    Case(
        SPEC,
        ("RPC-Interface.lc3",),
        "cosi.delete-not-idempotent",
        breach=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step("DriverDeleteBucket", DELETE),
            Step("DriverDeleteBucket", DELETE, error=("NOT_FOUND", "no bucket bucket-1")),
        ),
        twin=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step("DriverDeleteBucket", DELETE),
            Step("DriverDeleteBucket", DELETE),
        ),
        party="plugin",
    ),
    Case(
        SPEC,
        ("RPC-Interface.lc4",),
        "cosi.grant-account-changed",
        breach=(
            Step("DriverGrantBucketAccess", GRANT, answer=GRANTED),
            Step("DriverGrantBucketAccess", GRANT, answer={**GRANTED, "account_id": "account-2"}),
        ),
        twin=(
            Step("DriverGrantBucketAccess", GRANT, answer=GRANTED),
            Step("DriverGrantBucketAccess", GRANT, answer=GRANTED),
        ),
        party="plugin",
        why="one access name answered with two accounts, no revoke between",
    ),
    # -- fields ----------------------------------------------------------------------------
    one(
        ("RPC-Interface.4", "REQUIRED-vs-OPTIONAL.1"),
        "cosi.required-field",
        "DriverGetInfo",
        ({}, {}),
        ({}, {"name": DRIVER}),
        party="plugin",
    ),
    one(
        ("RPC-Interface.4", "RPC-Interface.6"),
        "cosi.plugin-name-format",
        "DriverGetInfo",
        ({}, {"name": "cosi.example.com/driver"}),
        ({}, {"name": DRIVER}),
        party="plugin",
        why="a '/' is no part of a domain name",
    ),
    one(
        ("RPC-Interface.6",),
        "cosi.plugin-name-format",
        "DriverGetInfo",
        ({}, {"name": "a" * 60 + ".example.com"}),
        ({}, {"name": "a" * 50 + ".example.com"}),
        party="plugin",
        why="72 characters, more than 63",
        variant="length",
    ),
    one(
        ("RPC-Interface.7", "DriverCreateBucket.4"),
        "cosi.required-field",
        "DriverCreateBucket",
        (without(CREATE, "name"), ("INVALID_ARGUMENT", "name missing")),
        (CREATE, BUCKET),
        party="co",
    ),
    one(
        ("RPC-Interface.8",),
        "cosi.required-field",
        "DriverDeleteBucket",
        ({}, ("INVALID_ARGUMENT", "bucket_id missing")),
        (DELETE, {}),
        party="co",
    ),
    one(
        ("RPC-Interface.9",),
        "cosi.required-field",
        "DriverGrantBucketAccess",
        (without(GRANT, "bucket_id"), ("INVALID_ARGUMENT", "bucket_id missing")),
        (GRANT, GRANTED),
        party="co",
    ),
    one(
        ("RPC-Interface.10",),
        "cosi.required-field",
        "DriverGrantBucketAccess",
        (without(GRANT, "name"), ("INVALID_ARGUMENT", "name missing")),
        (GRANT, GRANTED),
        party="co",
    ),
    one(
        ("RPC-Interface.11",),
        "cosi.required-field",
        "DriverGrantBucketAccess",
        (
            {**GRANT, "authentication_type": "UnknownAuthenticationType"},
            ("INVALID_ARGUMENT", "authentication type missing"),
        ),
        (GRANT, GRANTED),
        party="co",
        why="authentication_type left at its zero value, the unknown type",
    ),
    one(
        ("RPC-Interface.12",),
        "cosi.required-field",
        "DriverGrantBucketAccess",
        (GRANT, without(GRANTED, "account_id")),
        (GRANT, GRANTED),
        party="plugin",
    ),
    one(
        ("RPC-Interface.13", "REQUIRED-vs-OPTIONAL.2"),
        "cosi.required-field",
        "DriverGrantBucketAccess",
        (GRANT, without(GRANTED, "credentials")),
        (GRANT, GRANTED),
        party="plugin",
        why="a REQUIRED map left empty",
    ),
    one(
        ("RPC-Interface.14",),
        "cosi.required-field",
        "DriverRevokeBucketAccess",
        (without(REVOKE, "bucket_id"), ("INVALID_ARGUMENT", "bucket_id missing")),
        (REVOKE, {}),
        party="co",
    ),
    one(
        ("RPC-Interface.15",),
        "cosi.required-field",
        "DriverRevokeBucketAccess",
        (without(REVOKE, "account_id"), ("INVALID_ARGUMENT", "account_id missing")),
        (REVOKE, {}),
        party="co",
    ),
    one(
        ("Size-Limits.1",),
        "cosi.size-limit",
        "DriverCreateBucket",
        ({**CREATE, "name": "b" * 129}, ("INVALID_ARGUMENT", "name too long")),
        ({**CREATE, "name": "b" * 128}, BUCKET),
        party="co",
        why="a 129-byte string",
    ),
    one(
        ("Size-Limits.1",),
        "cosi.size-limit-echoed",
        "DriverDeleteBucket",
        ({"bucket_id": "b" * 129}, {}),
        ({"bucket_id": "b" * 128}, {}),
        party="plugin",
        why="a 129-byte bucket_id the driver made before this proxy saw it, passed back",
    ),
    one(
        ("Secrets-Requirements-where-applicable.1",),
        "cosi.secret-key-format",
        "DriverGrantBucketAccess",
        (GRANT, {**GRANTED, "credentials": {"s3": {"secrets": {"access key": "AKIA0001"}}}}),
        (GRANT, GRANTED),
        party="plugin",
        why="a space in a secrets key",
    ),
    one(
        ("Secrets-Requirements-where-applicable.2",),
        "cosi.malformed-message",
        "DriverGrantBucketAccess",
        (GRANT, grant_answer_bytes(b"\xff\xfe\xfd")),
        (GRANT, grant_answer_bytes(b"c2VjcmV0")),
        party="plugin",
        why="a secret value of bytes that are not UTF-8",
    ),
    # -- error scheme ----------------------------------------------------------------------
    one(
        ("Error-Scheme.1", "Error-Scheme.2"),
        "cosi.status-code-not-canonical",
        "DriverDeleteBucket",
        (DELETE, ("42", "backend failure")),
        (DELETE, ("INTERNAL", "backend failure")),
        party="plugin",
        why="a grpc-status of 42 is none of gRPC's codes",
    ),
    Case(
        SPEC,
        ("Error-Scheme.14",),
        "cosi.status-details-nonempty",
        breach=(
            Step(
                "DriverDeleteBucket",
                DELETE,
                error=("INTERNAL", "backend failure"),
                trailers=(("grpc-status-details-bin", STATUS_DETAILS),),
            ),
        ),
        twin=(Step("DriverDeleteBucket", DELETE, error=("INTERNAL", "backend failure")),),
        party="plugin",
    ),
    one(
        ("CreateBucket-Errors.5",),
        "cosi.error-message-empty",
        "DriverCreateBucket",
        (BAD_PARAMS, ("INVALID_ARGUMENT", "")),
        (BAD_PARAMS, ("INVALID_ARGUMENT", "parameter tier: unknown value standrad")),
        party="plugin",
    ),
    retry(
        ("Error-Scheme.6",),
        "DriverGrantBucketAccess",
        without(GRANT, "name"),
        "INVALID_ARGUMENT",
        GRANT,
        GRANTED,
        first={**GRANT, "parameters": {"role": "readwrite-typo"}},
        why="a request missing its REQUIRED name, refused, sent again as it was",
    ),
    retry(
        ("Error-Scheme.7",),
        "DriverGrantBucketAccess",
        {**GRANT, "parameters": {"role": "readwrite-typo"}},
        "INVALID_ARGUMENT",
        {**GRANT, "parameters": {"role": "readwrite"}},
        GRANTED,
    ),
    retry(
        ("CreateBucket-Errors.3", "CreateBucket-Errors.7"),
        "DriverCreateBucket",
        {**CREATE, "parameters": {"quota": "1000PiB"}},
        "OUT_OF_RANGE",
        {**CREATE, "parameters": {"quota": "1TiB"}},
        BUCKET,
    ),
    Case(
        SPEC,
        ("CreateBucket-Errors.6",),
        "cosi.retry-without-change",
        breach=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step(
                "DriverCreateBucket",
                {**CREATE, "parameters": {"tier": "cold"}},
                error=("ALREADY_EXISTS", "tier differs"),
            ),
            Step(
                "DriverCreateBucket",
                {**CREATE, "parameters": {"tier": "cold"}},
                error=("ALREADY_EXISTS", "tier differs"),
            ),
        ),
        twin=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step(
                "DriverCreateBucket",
                {**CREATE, "parameters": {"tier": "cold"}},
                error=("ALREADY_EXISTS", "tier differs"),
            ),
            Step(
                "DriverCreateBucket",
                {**CREATE, "name": "bucket-claim-2", "parameters": {"tier": "cold"}},
                answer={**BUCKET, "bucket_id": "bucket-2"},
            ),
        ),
        party="co",
        why="refused for a name created with other parameters, sent again unchanged",
    ),
    Case(
        SPEC,
        ("Error-Scheme.11",),
        "cosi.retry-without-change",
        breach=(
            Step("DriverGetInfo", error=("UNIMPLEMENTED", "not served")),
            Step("DriverGetInfo", error=("UNIMPLEMENTED", "not served")),
        ),
        twin=(
            Step("DriverGetInfo", error=("UNIMPLEMENTED", "not served")),
            Step("DriverGetInfo", answer={"name": DRIVER}, new_connection=True),
        ),
        party="co",
        why="asked again on the connection that got UNIMPLEMENTED; the twin's second ask is"
        " another caller's (a restarted COSI system)",
        twin_allows=("cosi.unimplemented-advertised",),
        variant="no-fields",
    ),
    Case(
        SPEC,
        ("Error-Scheme.10",),
        "cosi.retry-while-pending",
        breach=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET, hold=0.6, pending=True),
            Step("DriverCreateBucket", CREATE, error=("ABORTED", "pending"), pending=True),
            Step("DriverCreateBucket", CREATE, answer=BUCKET, hold=0.6, pending=True),
            Step("DriverCreateBucket", CREATE, answer=BUCKET, wait=0.7),
        ),
        twin=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET, hold=0.2, pending=True),
            Step("DriverCreateBucket", CREATE, error=("ABORTED", "pending"), pending=True),
            Step("DriverCreateBucket", CREATE, answer=BUCKET, wait=0.7),
        ),
        party="co",
        why="retried after ABORTED while the call it collided with was still pending",
    ),
]

# A driver deriving bucket ids from names: the bucket deleted and made again under the same
# id starts its grants afresh, so another account for the access name is no change.
CASES.append(
    Case(
        SPEC,
        ("RPC-Interface.lc4",),
        "cosi.grant-account-changed",
        breach=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step("DriverGrantBucketAccess", GRANT, answer=GRANTED),
            Step("DriverGrantBucketAccess", GRANT, answer={**GRANTED, "account_id": "account-2"}),
        ),
        twin=(
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step("DriverGrantBucketAccess", GRANT, answer=GRANTED),
            Step("DriverDeleteBucket", DELETE),
            Step("DriverCreateBucket", CREATE, answer=BUCKET),
            Step("DriverGrantBucketAccess", GRANT, answer={**GRANTED, "account_id": "account-2"}),
        ),
        party="plugin",
        variant="bucket-made-again",
    )
)
