"""DRA kubelet plugin (v1beta1, v1) and DRA device health (v1alpha1, v1) rules through a real
proxy: a scripted plugin on a temporary UNIX socket answers each case once as a breach,
which the audit report must name under the case's rule and party, and once as its nearest
legitimate variant, which an enforcing proxy must pass untouched and unreported.

Every case runs in both versions of its API: the versions state the same, and a socket
serves both."""

from __future__ import annotations

import time

import pytest

from tests.integration.planted.harness import Case, Step, describe, expected_code, run_steps

DRA_SPECS = ("dra.v1", "dra.v1beta1")
HEALTH_SPECS = ("drahealth.v1", "drahealth.v1alpha1")

CLAIM = {"namespace": "default", "uid": "7c1e-0001", "name": "gpu-claim"}
OTHER = {"namespace": "default", "uid": "7c1e-0002", "name": "gpu-claim-2"}
DEVICE = {"pool_name": "node-a", "device_name": "gpu-0", "cdi_device_ids": ["vendor.com/gpu=gpu-0"]}
NOW = int(time.time())


def _prepare(request: dict, answer: dict | bytes) -> tuple[Step, ...]:
    return (Step("NodePrepareResources", {"claims": request["claims"]}, answer),)


def _prepared(*claims: dict) -> dict:
    return {"claims": {c["uid"]: {"devices": [DEVICE]} for c in claims}}


def dra_cases(spec: str) -> list[Case]:
    one = {"claims": [CLAIM]}
    two = {"claims": [CLAIM, OTHER]}
    return [
        Case(
            spec,
            ("Claim",),
            "dra.required-field",
            _prepare({"claims": [{**CLAIM, "namespace": ""}]}, _prepared(CLAIM)),
            _prepare(one, _prepared(CLAIM)),
            party="co",
            why="kubelet sends a claim without its namespace",
        ),
        Case(
            spec,
            ("Device",),
            "dra.required-field",
            _prepare(one, {"claims": {CLAIM["uid"]: {"devices": [{**DEVICE, "device_name": ""}]}}}),
            # A device without CDI ids and request names is legitimate: both are optional.
            _prepare(
                one,
                {"claims": {CLAIM["uid"]: {"devices": [{"pool_name": "p", "device_name": "d"}]}}},
            ),
            party="plugin",
        ),
        Case(
            spec,
            ("NodePrepareResourcesResponse",),
            "dra.claim-not-answered",
            _prepare(two, _prepared(CLAIM)),
            # A claim that failed is answered: its entry carries the error.
            _prepare(
                two, {"claims": {**_prepared(CLAIM)["claims"], OTHER["uid"]: {"error": "busy"}}}
            ),
            party="plugin",
        ),
        Case(
            spec,
            ("NodeUnprepareResourcesResponse",),
            "dra.claim-not-answered",
            (Step("NodeUnprepareResources", two, {"claims": {OTHER["uid"]: {}}}),),
            # "even if that entry is nil"
            (
                Step(
                    "NodeUnprepareResources", two, {"claims": {CLAIM["uid"]: {}, OTHER["uid"]: {}}}
                ),
            ),
            party="plugin",
        ),
        Case(
            spec,
            ("NodeUnprepareResourcesResponse",),
            "dra.claim-not-requested",
            (
                Step(
                    "NodeUnprepareResources", one, {"claims": {CLAIM["uid"]: {}, OTHER["uid"]: {}}}
                ),
            ),
            (Step("NodeUnprepareResources", one, {"claims": {CLAIM["uid"]: {}}}),),
            party="plugin",
        ),
        Case(
            spec,
            ("NodePrepareResourcesResponse",),
            "dra.claim-not-requested",
            _prepare(one, _prepared(CLAIM, OTHER)),
            _prepare(one, _prepared(CLAIM)),
            party="plugin",
            variant="prepare",
        ),
        Case(
            spec,
            ("NodePrepareResources",),
            "dra.malformed-message",
            _prepare(one, b"\x0a\xff"),
            _prepare(one, _prepared(CLAIM)),
            party="plugin",
        ),
    ]


def _health(**fields: object) -> dict:
    entry: dict = {
        "device": {"pool_name": "node-a", "device_name": "gpu-0"},
        "health": "HEALTHY",
        "last_updated_time": NOW,
        "health_check_timeout_seconds": 30,
    }
    entry.update(fields)
    return entry


def _watch(*updates: dict | bytes) -> tuple[Step, ...]:
    return (Step("NodeWatchResources", {}, list(updates)),)


def health_cases(spec: str) -> list[Case]:
    fine = {"devices": [_health()]}
    return [
        Case(
            spec,
            ("DeviceHealth",),
            "drahealth.required-field",
            _watch({"devices": [{"health": "HEALTHY", "last_updated_time": NOW}]}),
            _watch(fine),
            party="plugin",
        ),
        Case(
            spec,
            ("DeviceIdentifier",),
            "drahealth.required-field",
            _watch({"devices": [_health(device={"device_name": "gpu-0"})]}),
            _watch(fine),
            party="plugin",
            variant="pool",
        ),
        Case(
            spec,
            ("HealthStatus",),
            "drahealth.health-value",
            _watch({"devices": [_health(health=3)]}),
            # UNKNOWN is a value of the enum: "cannot be determined" is a legitimate answer.
            _watch(
                {
                    "devices": [
                        _health(health="UNKNOWN"),
                        _health(
                            device={"pool_name": "node-a", "device_name": "gpu-1"},
                            health="UNHEALTHY",
                        ),
                    ]
                }
            ),
            party="plugin",
        ),
        Case(
            spec,
            ("DeviceHealth",),
            "drahealth.size-limit",
            _watch({"devices": [_health(health="UNHEALTHY", message="x" * 1025)]}),
            # 1024 characters, 2048 bytes: the limit counts characters.
            _watch({"devices": [_health(health="UNHEALTHY", message="é" * 1024)]}),
            party="plugin",
        ),
        Case(
            spec,
            ("DeviceHealth",),
            "drahealth.time-not-seconds",
            _watch({"devices": [_health(last_updated_time=NOW * 1000)]}),
            # Zero is not judged: the API does not say whether it may be left out.
            _watch(
                {
                    "devices": [
                        _health(),
                        _health(
                            device={"pool_name": "node-a", "device_name": "gpu-1"},
                            last_updated_time=0,
                        ),
                    ]
                }
            ),
            party="plugin",
        ),
        Case(
            spec,
            ("DeviceHealth",),
            "drahealth.time-not-seconds",
            _watch({"devices": [_health(last_updated_time=-1)]}),
            _watch(fine),
            party="plugin",
            variant="negative",
        ),
        Case(
            spec,
            ("DeviceHealth",),
            "drahealth.negative-value",
            _watch({"devices": [_health(health_check_timeout_seconds=-5)]}),
            _watch({"devices": [_health(health_check_timeout_seconds=0)]}),
            party="plugin",
        ),
        Case(
            spec,
            ("NodeWatchResourcesResponse",),
            "drahealth.device-duplicate",
            _watch({"devices": [_health(), _health(health="UNHEALTHY")]}),
            # The same device name in two pools is two devices.
            _watch(
                {
                    "devices": [
                        _health(),
                        _health(device={"pool_name": "node-b", "device_name": "gpu-0"}),
                    ]
                }
            ),
            party="plugin",
        ),
        Case(
            spec,
            ("NodeWatchResources",),
            "drahealth.malformed-message",
            _watch(fine, b"\x0a\xff"),
            _watch(fine, fine),
            party="plugin",
        ),
        Case(
            spec,
            ("NodeWatchResources",),
            "drahealth.health-value",
            # Every update of the stream is judged, not only the first.
            _watch(fine, fine, fine, fine, {"devices": [_health(health=7)]}, fine),
            _watch(fine, fine, fine, fine, fine, fine),
            party="plugin",
            variant="late",
        ),
    ]


CASES = [c for s in DRA_SPECS for c in dra_cases(s)] + [
    c for s in HEALTH_SPECS for c in health_cases(s)
]


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_breach_is_reported_and_twin_is_silent(case: Case):
    breach = await run_steps(case, case.breach, "audit")
    found = [v for v in breach.violations if v["rule"] == case.rule]
    assert found, f"breach not reported as {case.rule}:\n{describe(breach)}"
    assert {v["party"] for v in found} == {case.party}
    # Judged by the version the call was made in, cited in that version's file.
    assert {v["spec"] for v in found} == {case.spec}
    title = {"dra": "DRA", "drahealth": "DRA health"}[case.spec.partition(".")[0]]
    version = case.spec.partition(".")[2]
    assert all(v["section"].startswith(f"{title} {version} api.proto §") for v in found), found
    twin = await run_steps(case, case.twin, "enforce")
    assert not twin.violations, f"twin of {case.id} reported:\n{describe(twin)}"
    assert twin.codes == [expected_code(s) for s in case.twin]


def test_every_rule_of_the_tables_has_a_case_in_each_version():
    from plugproxy.rules import TABLES

    for spec in (*DRA_SPECS, *HEALTH_SPECS):
        ruled = {c.rule for c in CASES if c.spec == spec}
        assert {r.id for r in TABLES[spec].rules} == ruled, spec
