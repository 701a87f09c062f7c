"""Messages and case builders the COSI v1alpha2 tables share (no cases here).

The scripted driver lists S3 and GCS in DriverGetInfo (its background answer): the proxy
asks for it itself before judging the protocols of a create, get or grant.
"""

from __future__ import annotations

from tests.integration.planted.cosi_cmi_builders import Builders

SPEC = "cosi.v1alpha2"
DRIVER = "cosi.example.com"
S3 = {"type": "S3"}
GCS = {"type": "GCS"}
AZURE = {"type": "AZURE"}
INFO = {"name": DRIVER, "supported_protocols": [S3, GCS]}
BACKGROUND = {"DriverGetInfo": INFO}

S3_INFO = {
    "s3": {
        "bucket_id": "photos-1",
        "endpoint": "https://s3.example.com",
        "region": "us-east-1",
        "addressing_style": {"style": "PATH"},
    }
}
GCS_INFO = {"gcs": {"project_id": "example-project", "bucket_name": "photos-1"}}
AZURE_INFO = {"azure": {"storage_account": "examplestorage"}}

CREATE = {"name": "bc-photos-1", "protocols": [S3], "parameters": {"tier": "standard"}}
CREATED = {"bucket_id": "bucket-1", "protocols": S3_INFO}
EXISTING = {"existing_bucket_id": "legacy-bucket-7", "protocols": [S3]}
GOT = {"bucket_id": "legacy-bucket-7", "protocols": S3_INFO}
DELETE = {"bucket_id": "bucket-1"}
KEY = {"type": "KEY"}
SERVICE_ACCOUNT = {"type": "SERVICE_ACCOUNT"}
READ_WRITE = {"mode": "READ_WRITE"}
GRANT = {
    "account_name": "ba-photos-1",
    "protocol": S3,
    "authentication_type": KEY,
    "buckets": [
        {"bucket_id": "bucket-1", "access_mode": READ_WRITE},
        {"bucket_id": "legacy-bucket-7", "access_mode": {"mode": "READ_ONLY"}},
    ],
}
S3_KEYS = {"s3": {"access_key_id": "AKIA0001", "access_secret_key": "c2VjcmV0"}}
GRANTED = {
    "account_id": "account-1",
    "buckets": [
        {"bucket_id": "bucket-1", "bucket_info": S3_INFO},
        {"bucket_id": "legacy-bucket-7", "bucket_info": S3_INFO},
    ],
    "credentials": S3_KEYS,
}
REVOKE = {
    "account_id": "account-1",
    "protocol": S3,
    "authentication_type": KEY,
    "buckets": [{"bucket_id": "bucket-1"}, {"bucket_id": "legacy-bucket-7"}],
}
# One bucket, for the cases about a bucket's id or info.
GRANT_ONE = {**GRANT, "buckets": [{"bucket_id": "bucket-1", "access_mode": READ_WRITE}]}
GRANTED_ONE = {**GRANTED, "buckets": [{"bucket_id": "bucket-1", "bucket_info": S3_INFO}]}
SA_GRANT = {**GRANT_ONE, "authentication_type": SERVICE_ACCOUNT, "service_account_name": "app"}
SA_GRANTED = {**GRANTED_ONE, "credentials": {}}


_BUILDERS = Builders(SPEC, BACKGROUND)
one, steps = _BUILDERS.one, _BUILDERS.steps
