"""Rule tables of Kubernetes' own plugin APIs (KMS v2, device plugin, DRA, plugin
registration), driven through the real validate stage: a planted violation per party is
found, legitimate calls draw nothing, errors draw no error-scheme rule the APIs lack."""

from __future__ import annotations

import grpc
import pytest

from plugproxy.api import StatusCode
from plugproxy.rules import TABLES
from plugproxy.rules.kms_v2 import annotation_problems
from tests.test_rules_cosi_cmi import Harness

CO, PLUGIN = "co", "plugin"
CLAIM = {"namespace": "default", "uid": "uid-1", "name": "gpu-claim"}
DEVICE = {"pool_name": "node-a", "device_name": "gpu-0", "cdi_device_ids": ["vendor.com/gpu=0"]}


async def test_kms_legitimate_calls_draw_nothing():
    h = Harness("kms.v2")
    assert await h.call("Status", {}, {"version": "v2", "healthz": "ok", "key_id": "k1"}) == set()
    assert (
        await h.call("Status", {}, {"version": "v2beta1", "healthz": "err", "key_id": "k"}) == set()
    )
    answer = {
        "ciphertext": b"c" * 1024,
        "key_id": "k" * 1024,
        "annotations": {"a.example.io": b"x"},
    }
    assert await h.call("Encrypt", {"plaintext": b"p", "uid": "u"}, answer) == set()
    assert await h.call("Decrypt", {"ciphertext": b"c", "uid": "u"}, {"plaintext": b"p"}) == set()
    # No error scheme: an error with an empty message or status details is no violation.
    assert await h.call("Decrypt", {"ciphertext": b"c"}, code=grpc.StatusCode.INTERNAL) == set()


async def test_kms_plugin_violations():
    h = Harness("kms.v2")
    assert await h.call("Status", {}, {"version": "v1", "healthz": "ok"}) == {
        ("kms.version-unsupported", PLUGIN),
        ("kms.required-field", PLUGIN),
    }
    assert await h.call("Encrypt", {"plaintext": b"p"}, {"key_id": "k" * 1025}) == {
        ("kms.required-field", PLUGIN),  # ciphertext
        ("kms.size-limit", PLUGIN),  # key_id
    }
    big = {"ciphertext": b"c" * 1025, "key_id": "k", "annotations": {"Not_A_Domain": b"x"}}
    assert await h.call("Encrypt", {"plaintext": b"p"}, big) == {
        ("kms.size-limit", PLUGIN),
        ("kms.annotation-key-format", PLUGIN),
    }
    assert all("Not_A_Domain" not in m or "annotations[" in m for m in h.messages)


def test_kms_annotation_limits():
    assert list(annotation_problems({"kms.example.io": b"x" * 100})) == []
    assert [f for f, _ in annotation_problems({"single": b""})] == ["annotations['single']"]
    assert [f for f, _ in annotation_problems({"a.b.io": b"x" * (32 * 1024)})] == ["annotations"]


@pytest.mark.parametrize("spec", ["dra.v1beta1", "dra.v1"])
async def test_dra_planted_violation_per_party(spec):
    h = Harness(spec)
    good = {"claims": {"uid-1": {"devices": [DEVICE]}}}
    assert await h.call("NodePrepareResources", {"claims": [CLAIM]}, good) == set()
    assert (
        await h.call("NodeUnprepareResources", {"claims": [CLAIM]}, {"claims": {"uid-1": {}}})
        == set()
    )
    # kubelet sends a claim without its namespace: REQUIRED.
    no_namespace = {**CLAIM, "namespace": ""}
    assert await h.call("NodePrepareResources", {"claims": [no_namespace]}, good) == {
        ("dra.required-field", CO)
    }
    # The plugin answers a device without its pool, and leaves a claim out.
    two = {"claims": [CLAIM, {**CLAIM, "uid": "uid-2"}]}
    bad = {"claims": {"uid-1": {"devices": [{**DEVICE, "pool_name": ""}]}}}
    assert await h.call("NodePrepareResources", two, bad) == {
        ("dra.required-field", PLUGIN),
        ("dra.claim-not-answered", PLUGIN),
    }
    assert await h.call("NodeUnprepareResources", two, {"claims": {"uid-2": {}}}) == {
        ("dra.claim-not-answered", PLUGIN)
    }
    # An entry for a claim nobody asked to prepare.
    assert await h.call(
        "NodeUnprepareResources", {"claims": [CLAIM]}, {"claims": {"uid-1": {}, "uid-9": {}}}
    ) == {("dra.claim-not-requested", PLUGIN)}
    assert any("claims[0]" in m for m in h.messages) and not any("uid-" in m for m in h.messages)


async def test_device_plugin_planted_violation_per_party():
    h = Harness("deviceplugin.v1beta1")
    register = {"version": "v1beta1", "endpoint": "gpu.sock", "resource_name": "vendor.com/gpu"}
    assert await h.call("Register", register, {}) == set()
    # The caller of Registration is the device plugin: it registers without a version.
    assert await h.call("Register", {**register, "version": ""}, {}) == {
        ("deviceplugin.required-field", CO)
    }
    healthy = {
        "devices": [{"ID": "gpu-0", "health": "Healthy"}, {"ID": "gpu-1", "health": "Unhealthy"}]
    }
    assert await h.call("ListAndWatch", {}, healthy) == set()
    bad = {"devices": [{"ID": "g" * 64, "health": "healthy"}]}
    assert await h.call("ListAndWatch", {}, bad) == {
        ("deviceplugin.size-limit", PLUGIN),
        ("deviceplugin.device-health-value", PLUGIN),
    }
    ask = {
        "container_requests": [
            {
                "available_deviceIDs": ["a", "b", "c"],
                "must_include_deviceIDs": ["c"],
                "allocation_size": 2,
            }
        ]
    }
    fine = {"container_responses": [{"deviceIDs": ["c", "a"]}]}
    assert await h.call("GetPreferredAllocation", ask, fine) == set()
    for wrong in (["a", "b"], ["c", "z"], ["c"]):
        found = await h.call(
            "GetPreferredAllocation", ask, {"container_responses": [{"deviceIDs": wrong}]}
        )
        assert found == {("deviceplugin.preferred-allocation-mismatch", PLUGIN)}, wrong
    assert await h.call("GetPreferredAllocation", ask, {}) == {
        ("deviceplugin.preferred-allocation-mismatch", PLUGIN)
    }


async def test_plugin_registration_rules():
    h = Harness("pluginregistration.v1")
    info = {"type": "DRAPlugin", "name": "gpu.example.com", "supported_versions": ["v1beta1"]}
    assert await h.call("GetInfo", {}, info) == set()
    assert await h.call("GetInfo", {}, {**info, "endpoint": "/var/lib/kubelet/x.sock"}) == set()
    assert await h.call("GetInfo", {}, {**info, "supported_versions": []}) == {
        ("pluginregistration.required-field", PLUGIN)
    }
    assert await h.call("GetInfo", {}, {**info, "type": "GPUPlugin"}) == {
        ("pluginregistration.plugin-type-unknown", PLUGIN)
    }
    assert await h.call("NotifyRegistrationStatus", {"plugin_registered": True}, {}) == set()


@pytest.mark.parametrize(
    "spec",
    [
        "kms.v2",
        "deviceplugin.v1beta1",
        "dra.v1beta1",
        "dra.v1",
        "drahealth.v1alpha1",
        "drahealth.v1",
        "pluginregistration.v1",
    ],
)
def test_rules_cite_the_api_file_and_are_reported_not_enforced(spec):
    table = TABLES[spec]
    for rule in table.rules:
        assert rule.section.startswith(f"{table.title} api.proto §"), rule.id
        # These APIs prescribe no answer to a bad request: enforce never rejects for them.
        assert rule.reject_code is None, rule.id


async def test_malformed_messages_are_judged_for_every_party():
    h = Harness("dra.v1beta1")
    method = h.registry.lookup(h.paths["NodePrepareResources"])
    from plugproxy.api import Call, LazyMessage

    call = Call(method, (), [], 5.0)
    call.request = LazyMessage(b"\xff\xff", method.request_class)
    h.stage.on_start(call)
    lazy = LazyMessage(b"\x0a\xff", method.response_class)
    call.response = lazy
    h.stage.on_response(call, lazy)
    call.code = StatusCode.OK
    h.stage.on_finish(call)
    found = {(str(e.attributes["rule"]), str(e.attributes["party"])) for e in call.events}
    assert found == {("dra.malformed-message", CO), ("dra.malformed-message", PLUGIN)}
