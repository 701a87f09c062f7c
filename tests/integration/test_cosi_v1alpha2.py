"""COSI v1alpha2 (COSI v0.2) through a real proxy in front of the fake driver: a bucket
lifecycle whose credentials reach the COSI system and nothing else, and the driver's
planted breaches reported.

The lifecycle: DriverGetInfo, a bucket created, a statically provisioned one got, one
access granted to both (S3, KEY), one more per other protocol (Azure, GCS), the accesses
revoked, the created bucket deleted. The credentials the fake makes are random: each is a
canary, looked for raw, in base64 and in hex in stdout, stderr, /metrics, /violations, the
violations file and every span the tracing stage exported (in-memory exporter, and the
console exporter on stdout).
"""

from __future__ import annotations

import base64
import json
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from plugproxy.cli import inject
from plugproxy.fakes import SpecClient, start_fake_plugin
from plugproxy.stages.validate import ValidateStage
from tests.support import start_proxy

SPEC = "cosi.v1alpha2"
S3, AZURE, GCS = ({"type": name} for name in ("S3", "AZURE", "GCS"))
KEY = {"type": "KEY"}
STATIC = "static-photo-archive"
CREDENTIAL_FIELDS = {
    "s3": ("access_key_id", "access_secret_key"),
    "azure": ("access_token",),
    "gcs": ("access_id", "access_secret", "private_key_name", "service_account"),
}
# Planted: what the fake gets wrong in the second round, and the rule that must say so.
PLANTED = {
    "cosi-grant-bucket-left-out": ("cosi.grant-bucket-not-answered", "DriverGrantBucketAccess"),
    "cosi-delete-not-found": ("cosi.deleted-bucket-not-ok", "DriverDeleteBucket"),
    "cosi-revoke-not-found": ("cosi.revoked-access-not-ok", "DriverRevokeBucketAccess"),
    "cosi-protocol-dropped": ("cosi.requested-protocol-missing", "DriverCreateBucket"),
}


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # UNIX socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="cosi", dir="/tmp") as tmp:
        yield Path(tmp)


def _http(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read().decode("utf-8", "replace")


def _forms(secret: str) -> dict[str, str]:
    raw = secret.encode()
    return {
        "raw": secret,
        "base64": base64.b64encode(raw).decode(),
        "base64url": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "hex": raw.hex(),
        "HEX": raw.hex().upper(),
    }


async def _lifecycle(c: SpecClient, round_: int) -> list[tuple[str, str, str]]:
    """One round through the proxy; the credentials the COSI system received, as
    (protocol, field, value)."""
    info = await c.call("DriverGetInfo")
    assert len(info.supported_protocols) == 3
    made = await c.call(
        "DriverCreateBucket",
        name=f"bc-photos-{round_}",
        protocols=[S3, AZURE, GCS],
        parameters={"tier": "standard"},
    )
    static = await c.call("DriverGetExistingBucket", existing_bucket_id=STATIC, protocols=[S3])
    both = [made.bucket_id, static.bucket_id]
    grants = [
        ("s3", S3, both),
        ("azure", AZURE, both[:1]),
        ("gcs", GCS, both[:1]),
    ]
    received: list[tuple[str, str, str]] = []
    accounts: list[tuple[str, dict[str, Any], list[str]]] = []
    for member, protocol, ids in grants:
        access = await c.call(
            "DriverGrantBucketAccess",
            account_name=f"ba-{member}-{round_}",
            protocol=protocol,
            authentication_type=KEY,
            buckets=[{"bucket_id": i, "access_mode": {"mode": "READ_WRITE"}} for i in ids],
        )
        credential = getattr(access.credentials, member)
        for name in CREDENTIAL_FIELDS[member]:
            received.append((member, name, getattr(credential, name)))
        accounts.append((access.account_id, protocol, ids))
    # Revokes and the delete are sent twice, as a COSI sidecar retrying them does: the
    # second one finds nothing left, which a driver MUST answer OK.
    for account_id, protocol, ids in [*accounts, accounts[0]]:
        await _answered(
            c.call(
                "DriverRevokeBucketAccess",
                account_id=account_id,
                protocol=protocol,
                authentication_type=KEY,
                buckets=[{"bucket_id": i} for i in ids],
            )
        )
    for _ in range(2):
        await _answered(c.call("DriverDeleteBucket", bucket_id=made.bucket_id))
    return received


async def _answered(call: Any) -> None:
    """The call's answer, or its status when it fails (the planted round's NOT_FOUNDs)."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        assert err.code() is grpc.StatusCode.NOT_FOUND, err


async def test_credentials_reach_the_cosi_system_and_nothing_else(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    plugin_sock, listen = tmp_path / "driver.sock", tmp_path / "cosi.sock"
    record = tmp_path / "violations.jsonl"
    fake = await start_fake_plugin(SPEC, f"unix://{plugin_sock}")
    proxy = await start_proxy(
        str(listen),
        str(plugin_sock),
        *("--admin-listen", "127.0.0.1:0", "--log-payloads", "--log-level", "debug"),
        *("--validation", "audit", "--violations-file", str(record)),
    )
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    tracing = [s for s in proxy.stages if s.name == "tracing"]
    assert tracing, "OTEL_TRACES_EXPORTER builds the tracing stage"
    tracing[0].provider.add_span_processor(SimpleSpanProcessor(memory))  # type: ignore[attr-defined]
    validate = next(s for s in proxy.stages if isinstance(s, ValidateStage))
    try:
        async with SpecClient(f"unix://{listen}", SPEC) as c:
            clean = await _lifecycle(c, 1)
            clean_report = validate.report.snapshot()
            fake.plugin.knobs.misbehave = set(PLANTED)
            planted = await _lifecycle(c, 2)
        assert proxy.admin is not None
        metrics = _http(proxy.admin.port, "/metrics")
        violations = _http(proxy.admin.port, "/violations")
    finally:
        await proxy.stop(0)
        await fake.stop(0)
    captured = capfd.readouterr()
    spans = "\n".join(s.to_json() for s in memory.get_finished_spans())
    written = record.read_text(encoding="utf-8")

    # The COSI system got every credential, whole: 7 of the clean round, and the second
    # round's, which the fake's planted breaches leave alone.
    assert len(clean) == len(planted) == 7
    for member, name, value in [*clean, *planted]:
        assert len(value) >= 12, (member, name)
    assert clean_report == []  # the clean round drew no violation

    # ... and nothing else did, in any form.
    outputs = {
        "stdout": captured.out,
        "stderr": captured.err,
        "/metrics": metrics,
        "/violations": violations,
        "the violations file": written,
        "spans": spans,
    }
    assert spans and '"plugproxy.request_id"' in spans
    for member, name, value in [*clean, *planted]:
        for form, text in _forms(value).items():
            for where, output in outputs.items():
                assert text not in output, f"{member}.{name} leaks as {form} in {where}"

    # Masked, not dropped: the call log shows each grant's answer with the secrets masked.
    calls = [
        json.loads(line)
        for line in captured.out.splitlines()
        if line.startswith("{") and '"event":"call"' in line
    ]
    grants = [c for c in calls if c["method"].endswith("/DriverGrantBucketAccess")]
    assert len(grants) == 6 and all(c["code"] == "OK" for c in grants)
    s3 = next(c for c in grants if c["request"]["account_name"] == "ba-s3-1")
    assert s3["response"]["credentials"] == {
        "s3": {"access_key_id": "***", "access_secret_key": "***"}
    }
    assert [b["bucket_info"] for b in s3["response"]["buckets"]] == ["***", "***"]
    assert s3["keys"][1:] == ["bucket:bucket-000001", f"bucket:{STATIC}"]
    azure = next(c for c in grants if c["request"]["account_name"] == "ba-azure-1")
    assert azure["response"]["credentials"]["azure"]["access_token"] == "***"
    assert azure["response"]["credentials"]["azure"]["expiry_timestamp"].endswith("Z")

    # The planted breaches are reported, under the right rule, method and party.
    report = json.loads(violations)
    found = {
        (v["rule"], v["method"].rsplit("/", 1)[-1], v["party"], v["spec"])
        for v in report["violations"]
    }
    for rule, rpc in PLANTED.values():
        assert (rule, rpc, "plugin", SPEC) in found, sorted(found)
    for rule, _ in PLANTED.values():
        assert f'rule="{rule}"' in metrics


# -- an injected COSI v0.2 pod -------------------------------------------------------------

HPE = Path(__file__).resolve().parents[1] / "fixtures" / "inject" / "drivers" / "hpe-cosi"
DEFAULT_SOCKET = "unix:///var/lib/cosi/cosi.sock"


def _on_disk(container: dict[str, Any], address: str, volumes: Path) -> Path:
    """Where a container's path lies when each volume of the pod is a directory."""
    path = address.removeprefix("unix://")
    mount = max(
        (m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")),
        key=lambda m: len(m["mountPath"]),
    )
    return volumes / mount["name"] / path[len(mount["mountPath"]) :].lstrip("/")


async def test_an_injected_cosi_v02_pod_carries_a_v1alpha2_lifecycle(short_tmp: Path) -> None:
    """HPE's COSI v0.2 Deployment names no socket: plugproxy takes the default path the
    sidecar dials, the driver (started as before, on its default path) ends up behind it in
    the private volume, and --spec=auto judges the calls as v1alpha2."""
    text, warnings = inject.transform_text(
        (HPE / "deployment.yaml").read_text(encoding="utf-8"), "hpe", inject.InjectOptions()
    )
    assert warnings == []
    (doc,) = [d for d in yaml.safe_load_all(text) if d]
    spec = doc["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    proxy, driver = containers["plugproxy"], containers["hpe-cosi-driver"]
    sidecar = containers["hpe-cosi-provisioner-sidecar"]
    args = dict(a.split("=", 1) for a in proxy["args"][1:])
    assert args["--listen"] == DEFAULT_SOCKET and args["--spec"] == "auto"
    for volume in spec["volumes"]:
        (short_tmp / volume["name"]).mkdir()
    # Each address as its container sees it: the driver and the sidecar at the default.
    driver_sock = _on_disk(driver, DEFAULT_SOCKET, short_tmp)
    sidecar_sock = _on_disk(sidecar, DEFAULT_SOCKET, short_tmp)
    assert driver_sock.parent.name == inject.INNER_VOLUME and sidecar_sock.parent.name == "socket"
    assert _on_disk(proxy, args["--upstream"], short_tmp) == driver_sock
    assert _on_disk(proxy, args["--listen"], short_tmp) == sidecar_sock
    fake = await start_fake_plugin(SPEC, f"unix://{driver_sock}")
    served = await start_proxy(
        str(sidecar_sock), str(driver_sock), "--spec", args["--spec"], "--validation", "audit"
    )
    try:
        async with SpecClient(f"unix://{sidecar_sock}", SPEC) as c:
            received = await _lifecycle(c, 1)
        validate = next(s for s in served.stages if isinstance(s, ValidateStage))
        judged = validate.report.body()["calls_judged_by_spec"]
    finally:
        await served.stop(0)
        await fake.stop(0)
    assert len(received) == 7
    assert judged.get(SPEC, 0) >= 10 and validate.report.snapshot() == []
