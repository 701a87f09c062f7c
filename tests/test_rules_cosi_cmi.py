"""COSI and CMI idempotency and consistency rules (family K), driven through the real
validate stage in-process, and legitimate retries through a real proxy and fake plugin."""

from __future__ import annotations

import io
import json
from typing import Any

import grpc
import pytest

from plugproxy.api import Call, LazyMessage, Reject, Runtime, StatusCode
from plugproxy.core.log import Logger
from plugproxy.rules.state import LIFECYCLE_TTL
from plugproxy.spec.registry import Registry
from plugproxy.stages.validate import ValidateStage
from tests.integration.test_validation_lifecycle import stage_of, through_proxy

OK = grpc.StatusCode.OK
NOT_FOUND = grpc.StatusCode.NOT_FOUND


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """One validate stage for one spec; each :meth:`call` is one RPC seen by the proxy."""

    def __init__(self, spec: str, mode: str = "audit", clock: FakeClock | None = None) -> None:
        self.registry = Registry([spec])
        runtime = Runtime(
            registry=self.registry, upstream=None, logger=Logger(io.StringIO()), metrics=None
        )
        self.clock = clock or FakeClock()
        self.stage = ValidateStage(runtime, mode, {}, clock=self.clock)
        self.paths = {m.name: m.path for m in self.registry.methods(spec)}
        self.messages: list[str] = []

    async def call(
        self,
        rpc: str,
        request: dict[str, Any],
        response: dict[str, Any] | None = None,
        code: grpc.StatusCode = OK,
    ) -> set[tuple[str, str]]:
        """(rule, party) of the violations the call drew; ``response`` when it succeeds."""
        method = self.registry.lookup(self.paths[rpc])
        assert method.request_class is not None and method.response_class is not None
        call = Call(method, (), [], 5.0)
        raw = method.request_class(**request).SerializeToString()
        call.request = LazyMessage(raw, method.request_class)
        pending = self.stage.on_start(call)
        if pending is not None:
            await pending
        if code is OK:
            resp = method.response_class(**(response or {})).SerializeToString()
            lazy = LazyMessage(resp, method.response_class)
            call.response = lazy
            self.stage.on_response(call, lazy)
        else:
            call.details = f"{code.name} from the plugin"
        call.code = StatusCode.of(code)
        self.stage.on_finish(call)
        found = [e.attributes for e in call.events if e.name == "violation"]
        self.messages.extend(str(v["message"]) for v in found)
        return {(str(v["rule"]), str(v["party"])) for v in found}


# -- COSI ------------------------------------------------------------------------------------


async def cosi_create(h: Harness, name: str, bucket_id: str, **params: str) -> set[Any]:
    return await h.call(
        "DriverCreateBucket", {"name": name, "parameters": params}, {"bucket_id": bucket_id}
    )


async def test_cosi_create_repeated_with_another_bucket_id():
    h = Harness("cosi.v1alpha1")
    flagged = ("cosi.create-not-idempotent", "plugin")
    assert flagged not in await cosi_create(h, "bucket-1", "id-1", a="b")
    assert flagged not in await cosi_create(h, "bucket-1", "id-1", a="b")  # same answer
    h.clock.now += 12
    assert flagged in await cosi_create(h, "bucket-1", "id-2", a="b")
    assert "12s ago" in h.messages[-1]
    # another name is another bucket
    assert flagged not in await cosi_create(h, "bucket-2", "id-3", a="b")


async def test_cosi_create_repeated_with_another_bucket_info_within_the_lease():
    h = Harness("cosi.v1alpha1")
    flagged = ("cosi.create-not-idempotent", "plugin")

    def create(endpoint: str) -> Any:
        answer = {"bucket_id": "id-1", "bucket_info": {"s3": {"region": endpoint}}}
        return h.call("DriverCreateBucket", {"name": "bucket-1"}, answer)

    assert flagged not in await create("eu-1")
    assert flagged not in await create("eu-1")
    assert flagged in await create("eu-2")
    assert "bucket_info" in h.messages[-1] and "eu-" not in h.messages[-1]
    # past a leader-election lease another replica may have deleted and re-created it
    h.clock.now += 16
    assert flagged not in await create("eu-3")
    h.clock.now += 16
    assert flagged not in await cosi_create(h, "bucket-1", "id-9")


async def test_cosi_grant_of_one_account_name_returns_one_account():
    h = Harness("cosi.v1alpha1")
    flagged = ("cosi.grant-account-changed", "plugin")

    def grant(name: str, account: str, bucket: str = "id-1") -> Any:
        return h.call(
            "DriverGrantBucketAccess",
            {"bucket_id": bucket, "name": name, "authentication_type": 1},
            {"account_id": account},
        )

    assert flagged not in await grant("ba-1", "acc-1")
    assert flagged not in await grant("ba-1", "acc-1")
    assert flagged in await grant("ba-1", "acc-2")
    assert "acc-" not in h.messages[-1] and "ba-" not in h.messages[-1]
    assert flagged not in await grant("ba-1", "acc-3", bucket="id-2")  # another bucket
    # a revoke sent, or a lease gone by (another replica may have revoked): a new account
    await h.call("DriverRevokeBucketAccess", {"bucket_id": "id-1", "account_id": "acc-2"})
    assert flagged not in await grant("ba-1", "acc-4")
    h.clock.now += 16
    assert flagged not in await grant("ba-1", "acc-5")


async def test_cosi_create_after_a_delete_may_make_a_new_bucket():
    h = Harness("cosi.v1alpha1")
    await cosi_create(h, "bucket-1", "id-1", a="b")
    # a delete that never answered (deadline) still lets the name make a new bucket
    await h.call("DriverDeleteBucket", {"bucket_id": "id-1"}, code=grpc.StatusCode.UNAVAILABLE)
    assert not {r for r, _ in await cosi_create(h, "bucket-1", "id-2", a="c")} & {
        "cosi.create-not-idempotent",
        "cosi.create-conflict-accepted",
    }


async def test_cosi_create_with_other_parameters_answered_ok():
    h = Harness("cosi.v1alpha1")
    flagged = ("cosi.create-conflict-accepted", "plugin")
    await cosi_create(h, "bucket-1", "id-1", a="b")
    # the spec's answer: ALREADY_EXISTS, nothing to report
    assert flagged not in await h.call(
        "DriverCreateBucket",
        {"name": "bucket-1", "parameters": {"a": "c"}},
        code=grpc.StatusCode.ALREADY_EXISTS,
    )
    assert flagged in await cosi_create(h, "bucket-1", "id-1", a="c")
    assert flagged in await cosi_create(h, "bucket-1", "id-9")  # no parameters: differ too
    # the first create's parameters still hold
    assert not await cosi_create(h, "bucket-1", "id-1", a="b")
    # parameter order does not matter
    await cosi_create(h, "bucket-2", "id-2", x="1", y="2")
    assert not await cosi_create(h, "bucket-2", "id-2", y="2", x="1")


async def test_cosi_create_resent_unchanged_after_already_exists():
    # COSI v1alpha1 §DriverCreateBucket errors: ALREADY_EXISTS, the caller MUST fix the
    # arguments or the name; judged only when the name was seen created with other parameters.
    h = Harness("cosi.v1alpha1")
    flagged = ("cosi.retry-without-change", "co")
    cold = {"name": "bucket-1", "parameters": {"tier": "cold"}}
    exists = grpc.StatusCode.ALREADY_EXISTS
    # never seen created: may be §Concurrency's repeat of a create that succeeded
    assert flagged not in await h.call("DriverCreateBucket", cold, code=exists)
    assert flagged not in await h.call("DriverCreateBucket", cold, code=exists)
    await cosi_create(h, "bucket-1", "id-1", tier="hot")
    assert flagged not in await h.call("DriverCreateBucket", cold, code=exists)
    h.clock.now += 5
    assert flagged in await h.call("DriverCreateBucket", cold, code=exists)
    assert "5s ago" in h.messages[-1] and "bucket-1" not in h.messages[-1]
    # fixed: another name, or the parameters of the bucket
    assert flagged not in await cosi_create(h, "bucket-2", "id-2", tier="cold")
    assert flagged not in await cosi_create(h, "bucket-1", "id-1", tier="hot")
    h.clock.now += 601  # the last refusal forgotten
    # a delete sent since the refusal: the name may be free again
    assert flagged not in await h.call("DriverCreateBucket", cold, code=exists)  # (refused)
    await h.call("DriverDeleteBucket", {"bucket_id": "id-1"}, {})
    assert flagged not in await h.call("DriverCreateBucket", cold, code=exists)
    # long after the refusal: not judged
    await cosi_create(h, "bucket-3", "id-3", tier="hot")
    other = {"name": "bucket-3", "parameters": {"tier": "cold"}}
    assert flagged not in await h.call("DriverCreateBucket", other, code=exists)
    h.clock.now += 601
    assert flagged not in await h.call("DriverCreateBucket", other, code=exists)


async def test_ids_passed_back_over_the_size_limit_are_the_plugins():
    # COSI v1alpha1 and CMI v1 §Size Limits: ids the plugin made, judged where they come back.
    cosi = Harness("cosi.v1alpha1", mode="enforce")
    flagged = ("cosi.size-limit-echoed", "plugin")
    assert flagged in await cosi.call("DriverDeleteBucket", {"bucket_id": "b" * 129}, {})
    assert flagged in await cosi.call(
        "DriverRevokeBucketAccess", {"bucket_id": "b", "account_id": "a" * 129}, {}
    )
    assert flagged not in await cosi.call("DriverDeleteBucket", {"bucket_id": "b" * 128}, {})
    cmi = Harness("cmi.v1", mode="enforce")
    req = {"MachineName": "m-1", "ProviderSpec": b"spec", "ProviderID": "p" * 129}
    assert ("cmi.size-limit-echoed", "plugin") in await cmi.call("DeleteMachine", req, {})
    assert not await cmi.call("DeleteMachine", {**req, "ProviderID": "p" * 128}, {})


async def test_cosi_messages_never_quote_names_ids_or_parameters():
    h = Harness("cosi.v1alpha1")
    await cosi_create(h, "secret-bucket-name", "secret-id-1", token="hunter2")
    await cosi_create(h, "secret-bucket-name", "secret-id-2", token="hunter2")
    await cosi_create(h, "secret-bucket-name", "secret-id-1", token="hunter3")
    assert len(h.messages) == 2
    for text in h.messages:
        assert "secret" not in text and "hunter" not in text


async def test_cosi_delete_of_a_bucket_already_deleted():
    h = Harness("cosi.v1alpha1")
    flagged = ("cosi.delete-not-idempotent", "plugin")
    # a bucket this proxy never saw: NOT_FOUND may mean a wrong id, unknown history
    assert flagged not in await h.call("DriverDeleteBucket", {"bucket_id": "x"}, code=NOT_FOUND)
    await cosi_create(h, "bucket-1", "id-1")
    assert flagged not in await h.call("DriverDeleteBucket", {"bucket_id": "id-1"})
    assert flagged not in await h.call("DriverDeleteBucket", {"bucket_id": "id-1"})  # OK again
    h.clock.now += 5
    assert flagged in await h.call("DriverDeleteBucket", {"bucket_id": "id-1"}, code=NOT_FOUND)
    assert "deleted it 5s ago" in h.messages[-1]
    # transient errors say nothing about the bucket
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL):
        assert flagged not in await h.call("DriverDeleteBucket", {"bucket_id": "id-1"}, code=code)


async def test_cosi_delete_not_found_of_a_bucket_seen_created():
    h = Harness("cosi.v1alpha1")
    flagged = ("cosi.delete-not-idempotent", "plugin")
    await cosi_create(h, "bucket-1", "id-1")
    assert flagged in await h.call("DriverDeleteBucket", {"bucket_id": "id-1"}, code=NOT_FOUND)
    assert "DriverCreateBucket returned it" in h.messages[-1]


async def test_cosi_definite_error_for_a_repeated_delete():
    h = Harness("cosi.v1alpha1")
    flagged = ("cosi.delete-not-idempotent", "plugin")
    failed = grpc.StatusCode.FAILED_PRECONDITION
    await cosi_create(h, "bucket-1", "id-1")
    # before any successful delete, FAILED_PRECONDITION is the plugin's to give (in use)
    assert flagged not in await h.call("DriverDeleteBucket", {"bucket_id": "id-1"}, code=failed)
    await h.call("DriverDeleteBucket", {"bucket_id": "id-1", "delete_context": {"k": "v"}})
    other = {"bucket_id": "id-1", "delete_context": {"k": "w"}}
    assert flagged not in await h.call("DriverDeleteBucket", other, code=failed)
    same = {"bucket_id": "id-1", "delete_context": {"k": "v"}}
    assert flagged in await h.call("DriverDeleteBucket", same, code=failed)


async def test_cosi_memory_expires_and_a_new_create_resets_a_deleted_bucket():
    clock = FakeClock()
    h = Harness("cosi.v1alpha1", clock=clock)
    await cosi_create(h, "bucket-1", "id-1")
    clock.now += LIFECYCLE_TTL + 1
    assert not await cosi_create(h, "bucket-1", "id-2")  # the first create is forgotten
    assert not await h.call("DriverDeleteBucket", {"bucket_id": "id-1"}, code=NOT_FOUND)
    await h.call("DriverDeleteBucket", {"bucket_id": "id-2"})
    clock.now += LIFECYCLE_TTL + 1
    assert not await h.call("DriverDeleteBucket", {"bucket_id": "id-2"}, code=NOT_FOUND)


async def test_cosi_rules_are_never_enforced():
    h = Harness("cosi.v1alpha1", mode="enforce")
    await cosi_create(h, "bucket-1", "id-1")
    await h.call("DriverDeleteBucket", {"bucket_id": "id-1"})
    assert ("cosi.delete-not-idempotent", "plugin") in await h.call(
        "DriverDeleteBucket", {"bucket_id": "id-1"}, code=NOT_FOUND
    )
    rules = h.stage._plans[h.paths["DriverCreateBucket"]].spec.rules
    for rid in ("create-not-idempotent", "create-conflict-accepted", "delete-not-idempotent"):
        assert rules[f"cosi.{rid}"].reject_code is None


# -- CMI -------------------------------------------------------------------------------------

SPEC = b'{"vmPool": "p", "size": "small", "tags": {}}'
OTHER_SPEC = b'{"vmPool": "p", "size": "large", "tags": {}}'


async def cmi_create(
    h: Harness, name: str, provider_id: str, node: str = "", spec: bytes = SPEC, **extra: Any
) -> set[Any]:
    return await h.call(
        "CreateMachine",
        {"MachineName": name, "ProviderSpec": spec, **extra},
        {"ProviderID": provider_id, "NodeName": node or name},
    )


async def test_cmi_create_repeated_with_other_ids():
    h = Harness("cmi.v1")
    flagged = ("cmi.create-not-idempotent", "plugin")
    assert flagged not in await cmi_create(h, "m1", "p://vm-1")
    assert flagged not in await cmi_create(h, "m1", "p://vm-1")
    # Secrets rotate and LastKnownState is the plugin's own: still the same request
    assert flagged not in await cmi_create(
        h, "m1", "p://vm-1", Secrets={"k": b"v2"}, LastKnownState=b"{}"
    )
    h.clock.now += 7
    assert flagged in await cmi_create(h, "m1", "p://vm-2", LastKnownState=b"x")
    assert "ProviderID" in h.messages[-1] and "CreateMachine answered 7s ago" in h.messages[-1]
    assert flagged in await cmi_create(h, "m1", "p://vm-2", node="n-other")
    assert "another NodeName" in h.messages[-1]
    # another ProviderSpec: compatibility is the plugin's to judge (it may adopt the VM)
    assert flagged not in await cmi_create(h, "m1", "p://vm-3", spec=OTHER_SPEC)


async def test_cmi_create_after_the_vm_is_gone_may_make_a_new_vm():
    h = Harness("cmi.v1")
    flagged = ("cmi.create-not-idempotent", "plugin")
    await cmi_create(h, "m1", "p://vm-1")
    await h.call(
        "DeleteMachine",
        {"MachineName": "m1", "ProviderSpec": SPEC},
        code=grpc.StatusCode.UNAVAILABLE,
    )
    assert flagged not in await cmi_create(h, "m1", "p://vm-2")
    # GetMachineStatus NOT_FOUND: the VM vanished, a new one is legitimate
    status = {"MachineName": "m1", "ProviderSpec": SPEC}
    assert await h.call("GetMachineStatus", status, code=NOT_FOUND) == set()
    assert flagged not in await cmi_create(h, "m1", "p://vm-3")
    # GetMachineStatus names the VM backing the machine: a create answers the same one
    await h.call("GetMachineStatus", status, {"ProviderID": "p://vm-4", "NodeName": "m1"})
    assert flagged not in await cmi_create(h, "m1", "p://vm-4")
    assert flagged in await cmi_create(h, "m1", "p://vm-5")


async def test_cmi_delete_answered_not_found():
    h = Harness("cmi.v1")
    flagged = ("cmi.delete-not-idempotent", "plugin")
    req = {"MachineName": "m1", "ProviderSpec": SPEC}
    assert flagged in await h.call("DeleteMachine", req, code=NOT_FOUND)
    assert flagged not in await h.call("DeleteMachine", req)
    assert flagged not in await h.call("DeleteMachine", req, code=grpc.StatusCode.UNAVAILABLE)
    assert h.stage._plans[h.paths["DeleteMachine"]].spec.rules[
        "cmi.delete-not-idempotent"
    ].parties == ("plugin",)


def caps(*names: str) -> dict[str, Any]:
    numbers = {
        "CREATE_MACHINE": 1,
        "DELETE_MACHINE": 2,
        "GET_MACHINE_STATUS": 3,
        "LIST_MACHINES": 4,
        "SHUTDOWN_MACHINE": 5,
    }
    return {"capabilities": [{"rpc": {"type": numbers[n]}} for n in names]}


BASE = ("CREATE_MACHINE", "DELETE_MACHINE")


async def info(h: Harness, version: str) -> set[Any]:
    return await h.call("GetPluginInfo", {}, {"name": "cmi.example.com", "version": version})


async def test_cmi_capabilities_changed_within_one_version():
    h = Harness("cmi.v1")
    flagged = ("cmi.capabilities-changed", "plugin")
    await info(h, "v1")
    await h.call("GetPluginCapabilities", {}, caps(*BASE, "LIST_MACHINES"))
    assert flagged not in await info(h, "v1")
    await h.call("GetPluginCapabilities", {}, caps(*BASE, "LIST_MACHINES"))
    assert flagged not in await info(h, "v1")  # the same set
    await h.call("GetPluginCapabilities", {}, caps(*BASE, "GET_MACHINE_STATUS"))
    assert flagged in await info(h, "v1")
    assert "adds GET_MACHINE_STATUS" in h.messages[-1] and "lacks LIST_MACHINES" in h.messages[-1]


async def test_cmi_capabilities_changed_between_two_answers_of_one_window():
    h = Harness("cmi.v1")
    await info(h, "v1")
    await h.call("GetPluginCapabilities", {}, caps(*BASE))
    await h.call("GetPluginCapabilities", {}, caps(*BASE, "SHUTDOWN_MACHINE"))
    assert ("cmi.capabilities-changed", "plugin") in await info(h, "v1")


async def test_cmi_capabilities_of_an_upgraded_plugin_are_not_compared():
    h = Harness("cmi.v1")
    flagged = ("cmi.capabilities-changed", "plugin")
    await info(h, "v1")
    await h.call("GetPluginCapabilities", {}, caps(*BASE))
    await info(h, "v1")
    # upgraded between the info and the capabilities: only the next info tells
    await h.call("GetPluginCapabilities", {}, caps(*BASE, "LIST_MACHINES"))
    assert flagged not in await info(h, "v2")
    await h.call("GetPluginCapabilities", {}, caps(*BASE, "LIST_MACHINES"))
    assert flagged not in await info(h, "v2")
    # capabilities with no GetPluginInfo before them are not attributed to any version
    fresh = Harness("cmi.v1")
    await fresh.call("GetPluginCapabilities", {}, caps(*BASE))
    await info(fresh, "v1")
    await fresh.call("GetPluginCapabilities", {}, caps(*BASE, "LIST_MACHINES"))
    assert flagged not in await info(fresh, "v1")


async def test_cmi_empty_listings_are_advisory():
    h = Harness("cmi.v1")
    await h.call("GetPluginCapabilities", {}, caps(*BASE, "LIST_MACHINES"))
    empty = await h.call("ListMachines", {"ProviderSpec": SPEC}, {"MachineList": {}})
    assert ("cmi.required-field-caveat", "plugin") in empty
    assert ("cmi.required-field", "plugin") not in empty
    listing = {"MachineList": {"p://vm-1": "m1"}}
    assert ("cmi.required-field-caveat", "plugin") not in await h.call(
        "ListMachines", {"ProviderSpec": SPEC}, listing
    )
    rule = h.stage._plans[h.paths["ListMachines"]].spec.rules["cmi.required-field-caveat"]
    assert rule.level == "SHOULD" and rule.reject_code is None


async def test_cmi_get_volume_ids_repeated_answers_the_same_ids():
    h = Harness("cmi.v1")
    flagged = ("cmi.volume-ids-changed", "plugin")
    pv = {"PVSpecList": b'[{"csi": {"volumeHandle": "v"}}]'}
    assert flagged not in await h.call("GetVolumeIDs", pv, {"VolumeIDs": ["vol-1"]})
    assert flagged not in await h.call("GetVolumeIDs", pv, {"VolumeIDs": ["vol-1"]})
    h.clock.now += 30
    assert flagged in await h.call("GetVolumeIDs", pv, {"VolumeIDs": ["vol-2"]})
    assert "30s ago" in h.messages[-1] and "vol-" not in h.messages[-1]
    # other PV specs, or the same ones long after (a plugin upgrade): not judged
    other = {"PVSpecList": b"[]"}
    assert flagged not in await h.call("GetVolumeIDs", other, {"VolumeIDs": ["vol-3"]})
    h.clock.now += 601
    assert flagged not in await h.call("GetVolumeIDs", pv, {"VolumeIDs": ["vol-4"]})


async def test_cmi_machine_status_refused_as_invalid_after_an_identical_ok():
    # CMI v1 §GetMachineStatus: the read MUST be idempotent.
    h = Harness("cmi.v1")
    flagged = ("cmi.not-idempotent", "plugin")
    req = {"MachineName": "m-1", "ProviderSpec": b"spec", "ProviderID": "p-1"}
    ids = {"ProviderID": "p-1", "NodeName": "node-1"}
    assert flagged not in await h.call(
        "GetMachineStatus", req, code=grpc.StatusCode.INVALID_ARGUMENT
    )
    assert flagged not in await h.call("GetMachineStatus", req, ids)
    h.clock.now += 20
    assert flagged not in await h.call("GetMachineStatus", req, code=grpc.StatusCode.UNAVAILABLE)
    assert flagged not in await h.call("GetMachineStatus", req, code=NOT_FOUND)
    assert flagged in await h.call("GetMachineStatus", req, code=grpc.StatusCode.INVALID_ARGUMENT)
    assert "20s ago" in h.messages[-1] and "m-1" not in h.messages[-1]
    assert flagged in await h.call("GetMachineStatus", req, code=grpc.StatusCode.UNIMPLEMENTED)
    # another request (rotated secrets), or the same one long after: not judged
    other = {**req, "Secrets": {"token": b"new"}}
    assert flagged not in await h.call(
        "GetMachineStatus", other, code=grpc.StatusCode.INVALID_ARGUMENT
    )
    h.clock.now += 601
    assert flagged not in await h.call(
        "GetMachineStatus", req, code=grpc.StatusCode.INVALID_ARGUMENT
    )


async def test_cmi_create_recovery_rows():
    # CMI v1 §CreateMachine errors: ALREADY_EXISTS asks for another name, OUT_OF_RANGE for
    # other resource requests; the client MUST follow the recovery rows.
    h = Harness("cmi.v1")
    req = {"MachineName": "m-1", "ProviderSpec": b"spec"}
    ids = {"ProviderID": "p-1", "NodeName": "node-1"}
    unchanged, unfixed = ("cmi.retry-without-change", "co"), ("cmi.retry-unfixed", "co")
    exists, out = grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE
    await h.call("CreateMachine", req, code=exists)
    assert unchanged in await h.call("CreateMachine", req, code=exists)
    # a ProviderSpec made to match the VM may be the fix
    assert not await h.call("CreateMachine", {**req, "ProviderSpec": b"other"}, ids)
    await h.call("CreateMachine", {**req, "MachineName": "m-2"}, code=out)
    rotated = {**req, "MachineName": "m-2", "Secrets": {"token": b"new"}}
    assert unfixed in await h.call("CreateMachine", rotated, code=out)
    assert not await h.call("CreateMachine", {**rotated, "ProviderSpec": b"small"}, ids)
    # rows whose recovery lies outside the request: not judged
    await h.call("CreateMachine", {**req, "MachineName": "m-3"}, code=grpc.StatusCode.INTERNAL)
    assert not await h.call(
        "CreateMachine", {**req, "MachineName": "m-3"}, code=grpc.StatusCode.INTERNAL
    )


async def test_cmi_empty_volume_ids_are_advisory():
    h = Harness("cmi.v1")
    pv = {"PVSpecList": b"[]"}
    assert ("cmi.required-field-caveat", "plugin") in await h.call("GetVolumeIDs", pv, {})
    assert ("cmi.required-field-caveat", "plugin") not in await h.call(
        "GetVolumeIDs", pv, {"VolumeIDs": ["vol-1"]}
    )


async def test_cmi_binary_secret_values_are_reported_not_rejected():
    h = Harness("cmi.v1", mode="enforce")
    flagged = ("cmi.secret-value-format", "co")
    binary = {"userData": b"\x1f\x8b\x08\x00\xff", "password": "pässwörd".encode()}
    try:
        found = await cmi_create(h, "m1", "p://vm-1", Secrets=binary)
    except Reject:  # pragma: no cover - the failure this test guards against
        pytest.fail("a binary secret value was rejected")
    assert flagged in found
    assert "1 of 2 values" in h.messages[-1]
    assert flagged not in await cmi_create(h, "m1", "p://vm-1", Secrets={"password": b"abc"})
    for rpc in ("DeleteMachine", "GetMachineStatus", "ShutDownMachine"):
        req = {"MachineName": "m1", "ProviderSpec": SPEC, "Secrets": binary}
        assert flagged in await h.call(rpc, req, code=grpc.StatusCode.UNAVAILABLE)
    assert flagged in await h.call(
        "ListMachines",
        {"ProviderSpec": SPEC, "Secrets": binary},
        code=grpc.StatusCode.UNAVAILABLE,
    )


# -- legitimate retries through a real proxy, in enforce mode ----------------------------------


async def test_cosi_retries_against_the_fake_driver_are_clean(tmp_path):
    async with through_proxy("cosi.v1alpha1", tmp_path, "--validation", "enforce") as (c, proxy):
        await c.call("DriverGetInfo")
        first = await c.call("DriverCreateBucket", name="bucket-1", parameters={"a": "b"})
        again = await c.call("DriverCreateBucket", name="bucket-1", parameters={"a": "b"})
        assert again.bucket_id == first.bucket_id
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.call("DriverCreateBucket", name="bucket-1", parameters={"a": "c"})
        assert exc.value.code() is grpc.StatusCode.ALREADY_EXISTS
        await c.call("DriverDeleteBucket", bucket_id=first.bucket_id)
        await c.call("DriverDeleteBucket", bucket_id=first.bucket_id)  # already deleted: OK
        recreated = await c.call("DriverCreateBucket", name="bucket-1", parameters={"a": "c"})
        assert recreated.bucket_id != first.bucket_id
        assert stage_of(proxy).report.snapshot() == []


async def test_cmi_retries_against_the_fake_plugin_are_clean(tmp_path):
    spec = json.dumps(
        {"vmPool": "pool-a", "size": "small", "tags": {"kubernetes.io/cluster": "c1"}}
    ).encode()
    async with through_proxy("cmi.v1", tmp_path, "--validation", "enforce") as (c, proxy):
        for _ in range(2):
            await c.call("GetPluginInfo")
            await c.call("GetPluginCapabilities")
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.call("GetMachineStatus", MachineName="m-1", ProviderSpec=spec)
        assert exc.value.code() is NOT_FOUND
        first = await c.call(
            "CreateMachine", MachineName="m-1", ProviderSpec=spec, Secrets={"userData": b"#!"}
        )
        again = await c.call(
            "CreateMachine",
            MachineName="m-1",
            ProviderSpec=spec,
            LastKnownState=first.LastKnownState,
        )
        assert again.ProviderID == first.ProviderID
        await c.call("ShutDownMachine", MachineName="m-1", ProviderSpec=spec)
        await c.call("DeleteMachine", MachineName="m-1", ProviderSpec=spec)
        await c.call("DeleteMachine", MachineName="m-1", ProviderSpec=spec)  # gone: OK
        recreated = await c.call("CreateMachine", MachineName="m-1", ProviderSpec=spec)
        assert recreated.ProviderID != first.ProviderID
        await c.call("GetPluginInfo")
        assert stage_of(proxy).report.snapshot() == []
