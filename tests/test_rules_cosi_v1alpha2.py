"""COSI v1alpha2's table beside v1alpha1's, and its checks that read earlier calls, driven
through the real validate stage in-process (the planted breaches in
tests/integration/planted/ cover each statement through a real proxy)."""

from __future__ import annotations

import io
from typing import Any

import grpc

from plugproxy.api import Call, LazyMessage, Reject, Runtime, StatusCode
from plugproxy.core.log import Logger
from plugproxy.rules import TABLES
from plugproxy.spec.registry import Registry
from plugproxy.stages.validate import ValidateStage

SPEC = "cosi.v1alpha2"
OK = grpc.StatusCode.OK
S3, GCS = {"type": "S3"}, {"type": "GCS"}


class Stage:
    """One validate stage for COSI v1alpha2; each :meth:`call` is one RPC the proxy saw."""

    def __init__(self, mode: str = "audit") -> None:
        self.registry = Registry([SPEC])
        runtime = Runtime(
            registry=self.registry, upstream=None, logger=Logger(io.StringIO()), metrics=None
        )
        self.stage = ValidateStage(runtime, mode, {})
        self.paths = {m.name: m.path for m in self.registry.methods(SPEC)}
        self.messages: list[str] = []

    async def call(
        self,
        rpc: str,
        request: dict[str, Any],
        response: dict[str, Any] | None = None,
        code: grpc.StatusCode = OK,
    ) -> set[tuple[str, str]]:
        """(rule, party) of the violations the call drew."""
        method = self.registry.lookup(self.paths[rpc])
        assert method.request_class is not None and method.response_class is not None
        call = Call(method, (), [], 5.0)
        call.request = LazyMessage(
            method.request_class(**request).SerializeToString(), method.request_class
        )
        pending = self.stage.on_start(call)
        if pending is not None:
            await pending
        if code is OK:
            lazy = LazyMessage(
                method.response_class(**(response or {})).SerializeToString(),
                method.response_class,
            )
            call.response = lazy
            self.stage.on_response(call, lazy)
        else:
            call.details = f"{code.name} from the driver"
        call.code = StatusCode.of(code)
        self.stage.on_finish(call)
        found = [e.attributes for e in call.events if e.name == "violation"]
        self.messages.extend(str(v["message"]) for v in found)
        return {(str(v["rule"]), str(v["party"])) for v in found}


def grant(*bucket_ids: str, protocol: dict[str, str] = S3) -> dict[str, Any]:
    return {
        "account_name": "ba-1",
        "protocol": protocol,
        "authentication_type": {"type": "KEY"},
        "buckets": [{"bucket_id": b, "access_mode": {"mode": "READ_WRITE"}} for b in bucket_ids],
    }


def test_rules_both_cosi_versions_have_mean_the_same_in_both():
    v1 = {r.id: r for r in TABLES["cosi.v1alpha1"].rules}
    v2 = {r.id: r for r in TABLES[SPEC].rules}
    shared = v1.keys() & v2.keys()
    assert {"cosi.required-field", "cosi.create-not-idempotent", "cosi.not-idempotent"} <= shared
    for rule_id in shared:
        a, b = v1[rule_id], v2[rule_id]
        assert (a.level, a.parties, a.reject_code) == (b.level, b.parties, b.reject_code), rule_id
        assert a.section.startswith("COSI v1alpha1 §") and b.section.startswith("COSI v1alpha2 §")
    # Where v1alpha2 says MUST what v1alpha1 said SHOULD, the rule has another id.
    assert v1["cosi.delete-not-idempotent"].level == "SHOULD"
    assert v2["cosi.deleted-bucket-not-ok"].level == "MUST"
    assert "cosi.delete-not-idempotent" not in v2 and "cosi.retry-without-change" not in v2


async def test_a_bad_id_the_driver_returned_is_not_reported_again_where_passed_back():
    s = Stage("enforce")
    flagged = ("cosi.id-format", "plugin")
    create = {"name": "bc-1", "protocols": [S3]}
    made = {"bucket_id": "bucket_1", "protocols": {"s3": {"bucket_id": "bc-1"}}}
    assert flagged in await s.call("DriverCreateBucket", create, made)
    assert not await s.call("DriverDeleteBucket", {"bucket_id": "bucket_1"})
    # One this proxy never saw returned is blamed on the driver, and never rejected.
    assert await s.call("DriverDeleteBucket", {"bucket_id": "other_1"}) == {flagged}
    assert "did not see it returned" in s.messages[-1] and "other_1" not in s.messages[-1]
    # The administrator's id is the COSI system's, and rejected in enforce mode.
    try:
        await s.call("DriverGetExistingBucket", {"existing_bucket_id": "legacy/7"})
    except Reject as rejected:
        assert rejected.code is StatusCode.INVALID_ARGUMENT
        assert "cosi.id-format" in rejected.message
    else:
        raise AssertionError("an existing_bucket_id of a bad format passed an enforcing proxy")


async def test_protocols_are_judged_against_what_driver_info_lists():
    s = Stage()
    flagged = ("cosi.protocol-not-supported", "plugin")
    create = {"name": "bc-1", "protocols": [GCS]}
    made = {"bucket_id": "bucket-1", "protocols": {"gcs": {"bucket_name": "bc-1"}}}
    # Nothing known yet (the stage cannot ask: it has no upstream): nothing judged.
    assert flagged not in await s.call("DriverCreateBucket", create, made)
    info = {"name": "cosi.example.com", "supported_protocols": [S3]}
    assert not await s.call("DriverGetInfo", {}, info)
    assert flagged in await s.call("DriverCreateBucket", {**create, "name": "bc-2"}, made)
    assert "GCS" in s.messages[-1] and "(S3)" in s.messages[-1]


async def test_out_of_range_is_for_several_buckets_a_driver_cannot_grant_at_once():
    s = Stage()
    flagged = ("cosi.multi-bucket-out-of-range", "plugin")
    refused = grpc.StatusCode.OUT_OF_RANGE
    assert flagged in await s.call("DriverGrantBucketAccess", grant("b-1"), code=refused)
    assert flagged not in await s.call("DriverGrantBucketAccess", grant("b-1", "b-2"), code=refused)
    answer = {
        "account_id": "acc-1",
        "buckets": [
            {"bucket_id": b, "bucket_info": {"s3": {"bucket_id": b}}} for b in ("b-1", "b-2")
        ],
        "credentials": {"s3": {"access_key_id": "AKIA1", "access_secret_key": "c2VjcmV0"}},
    }
    assert not await s.call("DriverGrantBucketAccess", grant("b-1", "b-2"), answer)
    # Several buckets were granted for S3 just before; GCS may be another matter.
    assert flagged in await s.call("DriverGrantBucketAccess", grant("b-3", "b-4"), code=refused)
    other = grant("b-3", "b-4", protocol=GCS)
    assert flagged not in await s.call("DriverGrantBucketAccess", other, code=refused)
