"""Fake COSI v1alpha2 driver (COSI v0.2): Identity and Provisioner with in-memory buckets
and accesses, for S3, Azure and GCS.

Buckets: names follow S3 naming as in the v1alpha1 fake; ``quotaGiB`` (1-1024) is checked,
other parameters are stored as given. Every bucket supports all three protocols, and each
answer gives the info of all three. The backend also holds statically provisioned buckets:
any id starting with ``static-`` exists for DriverGetExistingBucket (the administrator made
it); other ids exist only when the fake created them.

Accesses: one per account_name (same request again: the same account; other parameters:
ALREADY_EXISTS), for one protocol and any number of buckets. KEY accesses get fresh random
credentials for the protocol; SERVICE_ACCOUNT ones get none (the pod's service account is
trusted instead) and need ``service_account_name``.
"""

from __future__ import annotations

import datetime
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
from plugproxy.fakes.cosi import BUCKET_NAME
from plugproxy.fakes.knobs import FakeKnobs

PROTOCOLS = ("S3", "AZURE", "GCS")
MEMBER = {"S3": "s3", "AZURE": "azure", "GCS": "gcs"}
STATIC_PREFIX = "static-"
ID = re.compile(r"[A-Za-z0-9.-]{1,2048}")
ACCESS_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
S3_ENDPOINT = "https://s3.fake.plugproxy.io"
REGION = "us-fake-1"
STORAGE_ACCOUNT = "fakestorage"
PROJECT = "fake-project"


@dataclass
class Bucket:
    id: str
    name: str  # the create's name; for a static bucket, its id
    parameters: dict[str, str]
    accounts: set[str] = field(default_factory=set)


@dataclass
class Access:
    account_id: str
    name: str
    protocol: str
    authentication: str
    request: bytes  # the grant's fields besides the name, to tell a repeat from a conflict
    parameters: dict[str, str]
    bucket_ids: tuple[str, ...]
    credentials: dict[str, str]


class FakeCosiV1Alpha2(FakePlugin):
    spec_name = "cosi.v1alpha2"
    default_plugin_name = "cosi.fake.plugproxy.io"
    key_fields = ("bucket_id", "existing_bucket_id", "account_id", "name", "account_name")

    def __init__(self, knobs: FakeKnobs | None = None) -> None:
        super().__init__(knobs)
        self.buckets: dict[str, Bucket] = {}
        self.bucket_names: dict[str, str] = {}
        self.accesses: dict[str, Access] = {}  # account id -> access
        self.access_names: dict[str, str] = {}  # account name -> account id
        self._seq = 0

    def _next(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}-{self._seq:06d}"

    @staticmethod
    def _protocols(request: DynMessage) -> list[str]:
        names = [enum_name(p, "type") for p in request.protocols]
        for name in names:
            if name not in PROTOCOLS:
                raise invalid(f"protocol {name} is not supported; use one of {PROTOCOLS}")
        return names

    @staticmethod
    def _check_quota(params: dict[str, str]) -> None:
        quota = params.get("quotaGiB")
        if quota is not None:
            if not quota.isdigit():
                raise invalid(f"quotaGiB {quota!r} is not a whole number")
            if not 1 <= int(quota) <= 1024:
                raise out_of_range(f"quotaGiB {quota} is outside 1-1024")

    @staticmethod
    def _fill_info(info: DynMessage, bucket: Bucket, protocols: tuple[str, ...]) -> None:
        if "S3" in protocols:
            info.s3.bucket_id = bucket.name
            info.s3.endpoint = S3_ENDPOINT
            info.s3.region = REGION
            info.s3.addressing_style.style = 1  # PATH
        if "AZURE" in protocols:
            info.azure.storage_account = STORAGE_ACCOUNT
        if "GCS" in protocols:
            info.gcs.project_id = PROJECT
            info.gcs.bucket_name = bucket.name

    @staticmethod
    def _credentials(protocol: str, authentication: str, account_id: str) -> dict[str, str]:
        if authentication != "KEY":
            return {}
        if protocol == "S3":
            return {
                "access_key_id": "FAKE" + secrets.token_hex(8).upper(),
                "access_secret_key": secrets.token_urlsafe(30),
            }
        if protocol == "AZURE":
            expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
            return {
                "access_token": f"sv=2024-08-04&sp=rwdl&sr=c&sig={secrets.token_urlsafe(32)}",
                "expiry_timestamp": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        return {
            "access_id": "GOOG" + secrets.token_hex(10).upper(),
            "access_secret": secrets.token_urlsafe(30),
            "private_key_name": f"{account_id}-key",
            "service_account": f"{account_id}@{PROJECT}.iam.fake",
        }

    # -- Identity -------------------------------------------------------------------------

    async def DriverGetInfo(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        resp = self.new("DriverGetInfoResponse", name=self.plugin_name)
        for name in PROTOCOLS:
            resp.supported_protocols.add().type = self.enum_value("ObjectProtocol", "type", name)
        return resp

    # -- Provisioner ----------------------------------------------------------------------

    async def DriverCreateBucket(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        require(request.name, "name")
        if not BUCKET_NAME.match(request.name) or ".." in request.name:
            raise invalid(
                f"bucket name {request.name!r} is invalid: 3-63 characters of a-z, 0-9, '.'"
                " and '-', starting and ending with a letter or digit"
            )
        self._protocols(request)
        params = dict(request.parameters)
        existing = self.bucket_names.get(request.name)
        if existing is not None:
            bucket = self.buckets[existing]
            if bucket.parameters != params:
                raise already_exists(
                    f"bucket {request.name!r} already exists as {bucket.id} with other parameters"
                )
        else:
            self._check_quota(params)
            bucket = Bucket(self._next("bucket"), request.name, params)
            self.buckets[bucket.id] = bucket
            self.bucket_names[bucket.name] = bucket.id
        resp = self.new("DriverCreateBucketResponse", bucket_id=bucket.id)
        self._fill_info(resp.protocols, bucket, PROTOCOLS)
        return resp

    async def DriverGetExistingBucket(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        bucket_id = request.existing_bucket_id
        require(bucket_id, "existing_bucket_id")
        if not ID.fullmatch(bucket_id):
            raise invalid("existing_bucket_id must be 1-2048 characters of a-z, A-Z, 0-9, '-', '.'")
        self._protocols(request)
        bucket = self.buckets.get(bucket_id)
        if bucket is None:
            if not bucket_id.startswith(STATIC_PREFIX):
                raise not_found(f"no bucket {bucket_id!r} in the backend")
            bucket = Bucket(bucket_id, bucket_id, dict(request.parameters))
            self.buckets[bucket.id] = bucket
        resp = self.new("DriverGetExistingBucketResponse", bucket_id=bucket.id)
        self._fill_info(resp.protocols, bucket, PROTOCOLS)
        return resp

    async def DriverDeleteBucket(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        require(request.bucket_id, "bucket_id")
        bucket = self.buckets.pop(request.bucket_id, None)
        if bucket is not None:
            self.bucket_names.pop(bucket.name, None)
            for account in bucket.accounts:
                self._drop_access(account)
        return self.new("DriverDeleteBucketResponse")

    def _drop_access(self, account_id: str) -> None:
        access = self.accesses.pop(account_id, None)
        if access is None:
            return
        self.access_names.pop(access.name, None)
        for bucket_id in access.bucket_ids:
            bucket = self.buckets.get(bucket_id)
            if bucket is not None:
                bucket.accounts.discard(account_id)

    async def DriverGrantBucketAccess(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        require(request.account_name, "account_name")
        if not ACCESS_NAME.fullmatch(request.account_name):
            raise invalid("account_name must be a DNS subdomain name")
        protocol = enum_name(request.protocol, "type")
        if protocol not in PROTOCOLS:
            raise invalid(f"protocol {protocol} is not supported; use one of {PROTOCOLS}")
        authentication = enum_name(request.authentication_type, "type")
        if authentication not in ("KEY", "SERVICE_ACCOUNT"):
            raise invalid("authentication_type is required: KEY or SERVICE_ACCOUNT")
        if authentication == "SERVICE_ACCOUNT":
            require(request.service_account_name, "service_account_name")
        require(request.buckets, "buckets")
        for i, accessed in enumerate(request.buckets):
            require(accessed.bucket_id, f"buckets[{i}].bucket_id")
            if enum_name(accessed.access_mode, "mode") == "UNKNOWN":
                raise invalid(f"buckets[{i}].access_mode is required")
            if accessed.bucket_id not in self.buckets:
                raise not_found(f"bucket {accessed.bucket_id!r} does not exist")
        params = dict(request.parameters)
        rest = self.new("DriverGrantBucketAccessRequest")
        rest.CopyFrom(request)
        rest.ClearField("parameters")
        fields = rest.SerializeToString(deterministic=True)
        account_id = self.access_names.get(request.account_name)
        access = self.accesses.get(account_id) if account_id is not None else None
        if access is not None:
            if access.parameters != params or access.request != fields:
                raise already_exists(
                    f"access {request.account_name!r} already exists with other arguments"
                )
        else:
            account_id = self._next("account")
            access = Access(
                account_id,
                request.account_name,
                protocol,
                authentication,
                fields,
                params,
                tuple(dict.fromkeys(b.bucket_id for b in request.buckets)),
                self._credentials(protocol, authentication, account_id),
            )
            self.accesses[account_id] = access
            self.access_names[access.name] = account_id
            for bucket_id in access.bucket_ids:
                self.buckets[bucket_id].accounts.add(account_id)
        resp = self.new("DriverGrantBucketAccessResponse", account_id=access.account_id)
        for bucket_id in access.bucket_ids:
            info = resp.buckets.add(bucket_id=bucket_id)
            self._fill_info(info.bucket_info, self.buckets[bucket_id], (access.protocol,))
        member = getattr(resp.credentials, MEMBER[access.protocol])
        if access.credentials:
            for name, value in access.credentials.items():
                setattr(member, name, value)
        else:
            resp.credentials.SetInParent()
        return resp

    async def DriverRevokeBucketAccess(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        require(request.account_id, "account_id")
        require(request.buckets, "buckets")
        self._drop_access(request.account_id)
        return self.new("DriverRevokeBucketAccessResponse")
