"""COSI v1alpha2: planted breaches of what a driver's answers must say of protocols and
buckets (§Protocol Definitions, the bucket info of §DriverCreateBucket, §DriverGetExisting
Bucket and §DriverGrantBucketAccess), and of answers held against earlier calls on the
socket (idempotency, conflicts, buckets and accesses already gone), each with its twin."""

from __future__ import annotations

from tests.integration.planted.cosi_v1alpha2_builders import (
    AZURE,
    AZURE_INFO,
    CREATE,
    CREATED,
    DELETE,
    EXISTING,
    GCS,
    GCS_INFO,
    GOT,
    GRANT,
    GRANT_ONE,
    GRANTED,
    GRANTED_ONE,
    REVOKE,
    S3,
    S3_INFO,
    S3_KEYS,
    one,
    steps,
)
from tests.integration.planted.harness import Case, Step

BOTH_INFO = {**S3_INFO, **GCS_INFO}
GCS_KEYS = {"gcs": {"access_id": "GOOG0001", "access_secret": "c2VjcmV0"}}

CASES: list[Case] = [
    # -- protocols -------------------------------------------------------------------------
    one(
        ("DriverCreateBucket.6", "DriverCreateBucket.12"),
        "cosi.requested-protocol-missing",
        "DriverCreateBucket",
        ({**CREATE, "protocols": [S3, GCS]}, CREATED),
        ({**CREATE, "protocols": [S3, GCS]}, {**CREATED, "protocols": BOTH_INFO}),
        party="plugin",
        why="S3 and GCS asked for, only S3's bucket info answered",
    ),
    one(
        ("DriverGetExistingBucket.7", "DriverGetExistingBucket.13"),
        "cosi.requested-protocol-missing",
        "DriverGetExistingBucket",
        ({**EXISTING, "protocols": [GCS]}, GOT),
        ({**EXISTING, "protocols": [GCS]}, {**GOT, "protocols": GCS_INFO}),
        party="plugin",
    ),
    one(
        ("DriverCreateBucket.7", "DriverCreateBucket.14", "Protocol-Definitions.1"),
        "cosi.protocol-not-supported",
        "DriverCreateBucket",
        ({**CREATE, "protocols": [AZURE]}, {**CREATED, "protocols": AZURE_INFO}),
        ({**CREATE, "protocols": [AZURE]}, ("INVALID_ARGUMENT", "AZURE is not supported")),
        party="plugin",
        why="Azure asked for and answered, though DriverGetInfo lists S3 and GCS only",
    ),
    one(
        ("DriverGetExistingBucket.8", "DriverGetExistingBucket.15"),
        "cosi.protocol-not-supported",
        "DriverGetExistingBucket",
        (EXISTING, {**GOT, "protocols": {**S3_INFO, **AZURE_INFO}}),
        (EXISTING, GOT),
        party="plugin",
        why="Azure's bucket info answered besides S3's; the driver lists no Azure",
    ),
    one(
        ("DriverGrantBucketAccess.8", "Protocol-Definitions.2"),
        "cosi.protocol-not-supported",
        "DriverGrantBucketAccess",
        (
            {**GRANT_ONE, "protocol": AZURE},
            {
                **GRANTED_ONE,
                "buckets": [{"bucket_id": "bucket-1", "bucket_info": AZURE_INFO}],
                "credentials": {"azure": {"access_token": "sv=2024&sig=c2lnbmF0dXJl"}},
            },
        ),
        ({**GRANT_ONE, "protocol": AZURE}, ("INVALID_ARGUMENT", "AZURE is not supported")),
        party="plugin",
    ),
    one(
        ("DriverGrantBucketAccess.7", "DriverGrantBucketAccess.24"),
        "cosi.grant-protocol-mismatch",
        "DriverGrantBucketAccess",
        (
            GRANT_ONE,
            {**GRANTED_ONE, "buckets": [{"bucket_id": "bucket-1", "bucket_info": GCS_INFO}]},
        ),
        (GRANT_ONE, GRANTED_ONE),
        party="plugin",
        why="an S3 grant answered with GCS bucket info",
    ),
    one(
        ("DriverGrantBucketAccess.21", "DriverGrantBucketAccess.24"),
        "cosi.grant-protocol-mismatch",
        "DriverGrantBucketAccess",
        (
            GRANT_ONE,
            {**GRANTED_ONE, "buckets": [{"bucket_id": "bucket-1", "bucket_info": BOTH_INFO}]},
        ),
        (GRANT_ONE, GRANTED_ONE),
        party="plugin",
        why="two protocols' info for one bucket; exactly one is allowed",
        variant="two",
    ),
    one(
        ("Protocol-Definitions.2",),
        "cosi.grant-protocol-mismatch",
        "DriverGrantBucketAccess",
        (GRANT_ONE, {**GRANTED_ONE, "credentials": {**S3_KEYS, **GCS_KEYS}}),
        (GRANT_ONE, GRANTED_ONE),
        party="plugin",
        why="GCS credentials in an S3 grant",
    ),
    one(
        ("DriverGrantBucketAccess.26",),
        "cosi.grant-bucket-not-answered",
        "DriverGrantBucketAccess",
        (GRANT, GRANTED_ONE),
        (GRANT, GRANTED),
        party="plugin",
        why="two buckets asked for, one answered",
    ),
    one(
        ("DriverGrantBucketAccess.10",),
        "cosi.key-credentials-missing",
        "DriverGrantBucketAccess",
        (GRANT_ONE, {**GRANTED_ONE, "credentials": {"s3": {}}}),
        (GRANT_ONE, GRANTED_ONE),
        party="plugin",
        why="a KEY grant answered with an empty S3 credential",
    ),
    # -- against earlier answers -----------------------------------------------------------
    steps(
        ("RPC-Interface.5", "DriverCreateBucket.2", "DriverCreateBucket.3", "DriverCreateBucket.5"),
        "cosi.create-not-idempotent",
        breach=(
            Step("DriverCreateBucket", CREATE, answer=CREATED),
            Step("DriverCreateBucket", CREATE, answer={**CREATED, "bucket_id": "bucket-2"}),
        ),
        twin=(
            Step("DriverCreateBucket", CREATE, answer=CREATED),
            Step("DriverCreateBucket", CREATE, answer=CREATED),
        ),
        party="plugin",
        why="the same name, protocols and parameters answered with another bucket",
    ),
    steps(
        ("RPC-Interface.5", "Error-Scheme.4"),
        "cosi.create-conflict-accepted",
        breach=(
            Step("DriverCreateBucket", CREATE, answer=CREATED),
            Step("DriverCreateBucket", {**CREATE, "parameters": {"tier": "cold"}}, answer=CREATED),
        ),
        twin=(
            Step("DriverCreateBucket", CREATE, answer=CREATED),
            Step(
                "DriverCreateBucket",
                {**CREATE, "parameters": {"tier": "cold"}},
                error=("ALREADY_EXISTS", "bc-photos-1 exists with tier standard"),
            ),
        ),
        party="plugin",
    ),
    steps(
        ("DriverCreateBucket.2",),
        "cosi.not-idempotent",
        breach=(
            Step("DriverCreateBucket", CREATE, answer=CREATED),
            Step("DriverCreateBucket", CREATE, error=("INVALID_ARGUMENT", "bad request")),
        ),
        twin=(
            Step("DriverCreateBucket", CREATE, answer=CREATED),
            Step("DriverCreateBucket", CREATE, answer=CREATED),
        ),
        party="plugin",
        why="the same request answered OK, then refused as invalid",
    ),
    steps(
        ("RPC-Interface.6", "DriverGetExistingBucket.2"),
        "cosi.get-existing-changed",
        breach=(
            Step("DriverGetExistingBucket", EXISTING, answer=GOT),
            Step("DriverGetExistingBucket", EXISTING, answer={**GOT, "bucket_id": "legacy-8"}),
        ),
        twin=(
            Step("DriverGetExistingBucket", EXISTING, answer=GOT),
            Step("DriverGetExistingBucket", EXISTING, answer=GOT),
        ),
        party="plugin",
    ),
    steps(
        ("RPC-Interface.6", "DriverCreateBucket.9", "DriverGetExistingBucket.5"),
        "cosi.bucket-not-found",
        breach=(
            Step("DriverCreateBucket", CREATE, answer=CREATED),
            Step(
                "DriverGetExistingBucket",
                {**EXISTING, "existing_bucket_id": "bucket-1"},
                error=("NOT_FOUND", "no bucket bucket-1"),
            ),
        ),
        twin=(
            Step("DriverCreateBucket", CREATE, answer=CREATED),
            Step("DriverDeleteBucket", DELETE),
            Step(
                "DriverGetExistingBucket",
                {**EXISTING, "existing_bucket_id": "bucket-1"},
                error=("NOT_FOUND", "no bucket bucket-1"),
            ),
        ),
        party="plugin",
        why="a bucket the driver returned, not deleted since, said not to exist",
    ),
    steps(
        ("DriverGetExistingBucket.10",),
        "cosi.bucket-not-found",
        breach=(
            Step("DriverGetExistingBucket", EXISTING, answer=GOT),
            Step(
                "DriverGrantBucketAccess",
                {
                    **GRANT_ONE,
                    "buckets": [
                        {"bucket_id": "legacy-bucket-7", "access_mode": {"mode": "READ_ONLY"}}
                    ],
                },
                error=("NOT_FOUND", "no bucket legacy-bucket-7"),
            ),
        ),
        twin=(
            Step("DriverGetExistingBucket", EXISTING, answer=GOT),
            Step(
                "DriverGrantBucketAccess",
                {
                    **GRANT_ONE,
                    "buckets": [
                        {"bucket_id": "legacy-bucket-7", "access_mode": {"mode": "READ_ONLY"}}
                    ],
                },
                answer={
                    **GRANTED_ONE,
                    "buckets": [{"bucket_id": "legacy-bucket-7", "bucket_info": S3_INFO}],
                },
            ),
        ),
        party="plugin",
        variant="grant",
    ),
    one(
        ("RPC-Interface.7", "DriverDeleteBucket.3"),
        "cosi.deleted-bucket-not-ok",
        "DriverDeleteBucket",
        (DELETE, ("NOT_FOUND", "no bucket bucket-1")),
        (DELETE, {}),
        party="plugin",
    ),
    steps(
        ("DriverDeleteBucket.2",),
        "cosi.deleted-bucket-not-ok",
        breach=(
            Step("DriverDeleteBucket", DELETE),
            Step("DriverDeleteBucket", DELETE, error=("FAILED_PRECONDITION", "bucket is gone")),
        ),
        twin=(
            Step("DriverDeleteBucket", DELETE),
            Step("DriverDeleteBucket", DELETE),
        ),
        party="plugin",
        variant="repeat",
    ),
    one(
        ("RPC-Interface.9", "DriverRevokeBucketAccess.3"),
        "cosi.revoked-access-not-ok",
        "DriverRevokeBucketAccess",
        (REVOKE, ("NOT_FOUND", "no account account-1")),
        (REVOKE, {}),
        party="plugin",
    ),
    steps(
        ("DriverRevokeBucketAccess.2",),
        "cosi.revoked-access-not-ok",
        breach=(
            Step("DriverRevokeBucketAccess", REVOKE),
            Step("DriverRevokeBucketAccess", REVOKE, error=("FAILED_PRECONDITION", "gone")),
        ),
        twin=(
            Step("DriverRevokeBucketAccess", REVOKE),
            Step("DriverRevokeBucketAccess", REVOKE),
        ),
        party="plugin",
        variant="repeat",
    ),
    steps(
        (
            "RPC-Interface.8",
            "DriverGrantBucketAccess.2",
            "DriverGrantBucketAccess.3",
            "DriverGrantBucketAccess.5",
        ),
        "cosi.grant-not-idempotent",
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
    steps(
        ("RPC-Interface.8",),
        "cosi.grant-not-idempotent",
        breach=(
            Step("DriverGrantBucketAccess", GRANT, answer=GRANTED),
            Step("DriverGrantBucketAccess", GRANT, answer={**GRANTED, "account_id": "account-2"}),
        ),
        twin=(
            Step("DriverGrantBucketAccess", GRANT, answer=GRANTED),
            Step("DriverRevokeBucketAccess", REVOKE),
            Step("DriverGrantBucketAccess", GRANT, answer={**GRANTED, "account_id": "account-2"}),
        ),
        party="plugin",
        why="after a revoke of its account, the name may get a new one",
        variant="revoked-between",
    ),
    steps(
        ("RPC-Interface.8", "Error-Scheme.4"),
        "cosi.grant-conflict-accepted",
        breach=(
            Step("DriverGrantBucketAccess", GRANT, answer=GRANTED),
            Step(
                "DriverGrantBucketAccess",
                {**GRANT, "parameters": {"role": "admin"}},
                answer=GRANTED,
            ),
        ),
        twin=(
            Step("DriverGrantBucketAccess", GRANT, answer=GRANTED),
            Step(
                "DriverGrantBucketAccess",
                {**GRANT, "parameters": {"role": "admin"}},
                error=("ALREADY_EXISTS", "ba-photos-1 exists with other parameters"),
            ),
        ),
        party="plugin",
    ),
    one(
        ("RPC-Interface.8", "Error-Scheme.4"),
        "cosi.multi-bucket-out-of-range",
        "DriverGrantBucketAccess",
        (GRANT_ONE, ("OUT_OF_RANGE", "multi-bucket access is not supported")),
        (GRANT, ("OUT_OF_RANGE", "multi-bucket access is not supported")),
        party="plugin",
        why="OUT_OF_RANGE is for several buckets, and this grant names one",
    ),
    steps(
        ("RPC-Interface.8",),
        "cosi.multi-bucket-out-of-range",
        breach=(
            Step("DriverGrantBucketAccess", GRANT, answer=GRANTED),
            Step(
                "DriverGrantBucketAccess",
                {**GRANT, "account_name": "ba-photos-2"},
                error=("OUT_OF_RANGE", "multi-bucket access is not supported"),
            ),
        ),
        twin=(
            Step("DriverGrantBucketAccess", GRANT, answer=GRANTED),
            Step(
                "DriverGrantBucketAccess",
                {**GRANT, "account_name": "ba-photos-2", "protocol": GCS},
                error=("OUT_OF_RANGE", "multi-bucket access is not supported for GCS"),
            ),
        ),
        party="plugin",
        why="the driver granted two buckets for S3 at once just before",
        variant="after-ok",
    ),
]
