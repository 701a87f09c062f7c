"""Fake COSI v1alpha1 driver: Identity and Provisioner with in-memory buckets.

Bucket parameters understood: ``protocol`` (s3, azureBlob or gcs; default s3), ``region``
(s3 only) and ``quotaGiB`` (1-1024; out of range -> OUT_OF_RANGE per COSI §DriverCreateBucket
errors). Other parameters are stored as given. Bucket names follow S3 naming (3-63
characters of a-z, 0-9, '.', '-', alphanumeric at both ends); others are INVALID_ARGUMENT.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

from plugproxy.fakes.base import FakePlugin
from plugproxy.fakes.common import (
    DynMessage,
    ServicerContext,
    already_exists,
    enum_name,
    invalid,
    not_found,
    out_of_range,
    require,
)
from plugproxy.fakes.knobs import FakeKnobs

BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
PROTOCOLS = ("s3", "azureBlob", "gcs")
DEFAULT_REGION = "us-fake-1"
ENDPOINTS = {
    "s3": "https://s3.fake.plugproxy.io",
    "azureBlob": "https://fakeaccount.blob.fake.plugproxy.io",
    "gcs": "https://storage.fake.plugproxy.io",
}


@dataclass
class Bucket:
    id: str
    name: str
    parameters: dict[str, str]
    protocol: str
    region: str
    accounts: set[str] = field(default_factory=set)


@dataclass
class Access:
    account_id: str
    bucket_id: str
    name: str
    authentication: str
    parameters: dict[str, str]
    credentials: dict[str, dict[str, str]]


class FakeCosiV1Alpha1(FakePlugin):
    spec_name = "cosi.v1alpha1"
    default_plugin_name = "cosi.fake.plugproxy.io"
    key_fields = ("bucket_id", "name")

    def __init__(self, knobs: FakeKnobs | None = None) -> None:
        super().__init__(knobs)
        self.buckets: dict[str, Bucket] = {}
        self.bucket_names: dict[str, str] = {}
        self.accesses: dict[str, Access] = {}  # account id -> access
        self._seq = 0

    def _next(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}-{self._seq:06d}"

    @staticmethod
    def _bucket_settings(params: dict[str, str]) -> tuple[str, str]:
        protocol = params.get("protocol", "s3")
        if protocol not in PROTOCOLS:
            raise invalid(f"protocol {protocol!r} is not supported; use one of {PROTOCOLS}")
        quota = params.get("quotaGiB")
        if quota is not None:
            if not quota.isdigit():
                raise invalid(f"quotaGiB {quota!r} is not a whole number")
            if not 1 <= int(quota) <= 1024:
                raise out_of_range(f"quotaGiB {quota} is outside 1-1024")
        return protocol, params.get("region", DEFAULT_REGION)

    def _fill_protocol(self, msg: DynMessage, bucket: Bucket) -> None:
        if bucket.protocol == "s3":
            msg.s3.region = bucket.region
            msg.s3.signature_version = self.enum_value("S3", "signature_version", "S3V4")
        elif bucket.protocol == "azureBlob":
            msg.azureBlob.storage_account = "fakeaccount"
        else:
            msg.gcs.project_id = "fake-project"
            msg.gcs.private_key_name = "fake-key"
            msg.gcs.service_account = "fake-sa@fake-project.iam.fake"

    @staticmethod
    def _credentials(bucket: Bucket, authentication: str) -> dict[str, dict[str, str]]:
        details = {"endpoint": ENDPOINTS[bucket.protocol], "bucketName": bucket.name}
        if bucket.protocol == "s3":
            details["region"] = bucket.region
        if authentication == "Key":
            details["accessKeyID"] = "FAKE" + secrets.token_hex(8).upper()
            details["accessSecretKey"] = secrets.token_urlsafe(30)
        return {bucket.protocol: details}

    # -- Identity -------------------------------------------------------------------------

    async def DriverGetInfo(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        return self.new("DriverGetInfoResponse", name=self.plugin_name)

    # -- Provisioner ----------------------------------------------------------------------

    async def DriverCreateBucket(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        require(request.name, "name")
        if not BUCKET_NAME.match(request.name) or ".." in request.name:
            raise invalid(
                f"bucket name {request.name!r} is invalid: 3-63 characters of a-z, 0-9, '.'"
                " and '-', starting and ending with a letter or digit"
            )
        params = dict(request.parameters)
        existing = self.bucket_names.get(request.name)
        if existing is not None:
            bucket = self.buckets[existing]
            if bucket.parameters != params:
                raise already_exists(
                    f"bucket {request.name!r} already exists as {bucket.id} with other parameters"
                )
        else:
            protocol, region = self._bucket_settings(params)
            bucket = Bucket(self._next("bucket"), request.name, params, protocol, region)
            self.buckets[bucket.id] = bucket
            self.bucket_names[bucket.name] = bucket.id
        resp = self.new("DriverCreateBucketResponse", bucket_id=bucket.id)
        self._fill_protocol(resp.bucket_info, bucket)
        return resp

    async def DriverDeleteBucket(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        require(request.bucket_id, "bucket_id")
        bucket = self.buckets.pop(request.bucket_id, None)
        if bucket is not None:
            del self.bucket_names[bucket.name]
            for account in bucket.accounts:
                self.accesses.pop(account, None)
        return self.new("DriverDeleteBucketResponse")

    async def DriverGrantBucketAccess(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        require(request.bucket_id, "bucket_id")
        require(request.name, "name")
        authentication = enum_name(request, "authentication_type")
        if authentication not in ("Key", "IAM"):
            raise invalid("authentication_type is required: Key or IAM")
        bucket = self.buckets.get(request.bucket_id)
        if bucket is None:
            raise not_found(f"bucket {request.bucket_id!r} does not exist")
        params = dict(request.parameters)
        access = next(
            (self.accesses[a] for a in bucket.accounts if self.accesses[a].name == request.name),
            None,
        )
        if access is not None:
            if access.authentication != authentication or access.parameters != params:
                raise already_exists(
                    f"access {request.name!r} to bucket {bucket.id} already exists with another"
                    " authentication type or parameters"
                )
        else:
            access = Access(
                self._next("account"),
                bucket.id,
                request.name,
                authentication,
                params,
                self._credentials(bucket, authentication),
            )
            self.accesses[access.account_id] = access
            bucket.accounts.add(access.account_id)
        resp = self.new("DriverGrantBucketAccessResponse", account_id=access.account_id)
        for protocol, details in access.credentials.items():
            resp.credentials[protocol].secrets.update(details)
        return resp

    async def DriverRevokeBucketAccess(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        require(request.bucket_id, "bucket_id")
        require(request.account_id, "account_id")
        access = self.accesses.get(request.account_id)
        if access is not None and access.bucket_id == request.bucket_id:
            del self.accesses[access.account_id]
            self.buckets[access.bucket_id].accounts.discard(access.account_id)
        return self.new("DriverRevokeBucketAccessResponse")
