"""`plugproxy demo` as a new user runs it: the lifecycle, violations, metrics, redacted log."""

from __future__ import annotations

import re
import subprocess
import sys

from plugproxy.cli.demo import LIFECYCLE, SECRET


def test_demo_runs_the_lifecycle_and_shows_each_capability():
    result = subprocess.run(
        [sys.executable, "-m", "plugproxy", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"{len(LIFECYCLE)}/{len(LIFECYCLE)} calls succeeded" in out
    for path, _ in LIFECYCLE:
        assert path in out
    # a CO-side and a plugin-side breach, each under its rule
    assert "csi.name-banned-characters" in out
    assert "csi.capacity-out-of-range" in out
    # whose answer each outcome is: audit mode lets the bad request reach the plugin
    assert "the proxy lets it through, the fake plugin answers INVALID_ARGUMENT" in out
    assert 'driver_name="unknown-driver"' not in out  # the first call already has the name
    assert "plugproxy_rpc_duration_seconds_count" in out
    assert '"password":"***"' in out
    assert "appears in the proxy's log: no" in out
    assert SECRET not in out + result.stderr


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plugproxy", "demo", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_kms_demo_round_trips_without_showing_the_plaintext():
    result = _demo("--spec", "kms.v2", "--proxy-log", "stderr")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for rpc in ("Status", "Encrypt", "Decrypt"):
        assert f"/v2.KeyManagementService/{rpc}" in out
    assert "round trip: Decrypt returned the same 32 bytes that went into Encrypt" in out
    assert '"plaintext":"***"' in out and 'spec="kms.v2"' in out
    assert "appears in the proxy's log (raw, base64 or hex): no" in out
    # The whole proxy log went to stderr: the plaintext is masked there as well.
    assert result.stderr.count('"plaintext":"***"') == 2


def test_device_plugin_demo_reads_the_health_stream():
    result = _demo("--spec", "device-plugin")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "/v1beta1.DevicePlugin/ListAndWatch" in out and "5 updates" in out
    assert "plugproxy_rpc_stream_messages_total{" in out
    assert '"envs":{"FAKE_VISIBLE_DEVICES":"***"}' in out


def test_dra_demo_prepares_in_both_versions_and_reads_the_health_stream():
    result = _demo("--spec", "dra")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for version in ("v1", "v1beta1"):
        for rpc in ("NodePrepareResources", "NodeUnprepareResources"):
            assert f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/{rpc}" in out
        assert f'spec="dra.{version}"' in out  # each call judged by its own version
    assert "/v1.DRAResourceHealth/NodeWatchResources" in out and "5 updates" in out
    assert 'spec="drahealth.v1"' in out and "drahealth.v1 1; violations: 0" in out


def test_demo_trace_prints_one_trace_from_the_co_through_the_proxy_into_the_plugin():
    result = _demo("--trace")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"{len(LIFECYCLE)}/{len(LIFECYCLE)} calls succeeded" in out
    section = out.split("5. One call traced end to end (OpenTelemetry):\n", 1)[1]
    trace_id = re.search(r"trace ([0-9a-f]{32}), 4 spans:", section)
    assert trace_id is not None and int(trace_id.group(1), 16) != 0
    rows = re.findall(r"^ {4}( *(?:└─ )?\S.*?) +span ([0-9a-f]{16}) +([0-9.]+) ms$", section, re.M)
    path = "csi.v1.Controller/CreateVolume"
    assert [label for label, _, _ in rows] == [
        f"co CLIENT /{path}",
        f"└─ plugproxy SERVER {path}",
        f"   └─ plugproxy CLIENT {path}",
        f"      └─ fake-csi-plugin SERVER /{path}",
    ]
    assert len({span_id for _, span_id, _ in rows}) == 4
    durations = [float(ms) for _, _, ms in rows]
    assert durations[1] >= durations[2] >= durations[3] > 0  # each within its parent
    assert "NOT one chain" not in section
    assert "has the proxy's client span as parent" in section


def test_cosi_v1alpha2_demo_runs_a_bucket_lifecycle_with_the_credentials_masked():
    result = _demo("--spec", "cosi.v1alpha2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for rpc in (
        "DriverGetInfo",
        "DriverCreateBucket",
        "DriverGetExistingBucket",
        "DriverGrantBucketAccess",
        "DriverRevokeBucketAccess",
        "DriverDeleteBucket",
    ):
        assert f"  {rpc} " in out
    assert "6/6 calls succeeded" in out and "2 buckets" in out
    assert "cosi.grant-bucket-not-answered" in out  # the fake's breach, reported
    assert '"credentials":{"s3":{"access_key_id":"***","access_secret_key":"***"}}' in out
    assert 'spec="cosi.v1alpha2"' in out
    assert "appear in the proxy's log (raw, base64 or hex): no" in out
