"""`plugproxy demo --spec cosi.v1alpha2`: a COSI v0.2 bucket lifecycle through the proxy.

The bundled fake COSI v1alpha2 driver, the proxy in front of it (payload logging on, audit
mode), and a COSI system's calls: the driver's info, a bucket created, a statically
provisioned one got, one access granted to both, revoked, the bucket deleted. Then one
breach the fake is told to commit, as the proxy reports it, a metrics excerpt, and the call
log, where the credentials the COSI system received are masked. The demo fails if they
appear in the log in any form (raw, base64 or hex).
"""

from __future__ import annotations

import argparse
import base64
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable
from typing import Any, TextIO

import grpc

from plugproxy.cli import report
from plugproxy.cli.tee import start_demo_proxy
from plugproxy.fakes import SpecClient, start_fake_plugin
from plugproxy.spec.registry import spec_package

SPEC = "cosi.v1alpha2"
S3 = {"type": "S3"}
KEY = {"type": "KEY"}
STATIC = "static-photo-archive"  # the fake holds every bucket id starting with "static-"
BREACH = "cosi-grant-bucket-left-out"  # the fake answers a grant for its first bucket only


class _Calls:
    """The COSI system's side: each call shown with its code, time and a note."""

    def __init__(self, client: SpecClient, out: TextIO) -> None:
        self.client = client
        self.out = out
        self.made = 0
        self.failed = 0

    async def call(self, rpc: str, describe: Any, **fields: Any) -> Any:
        start = time.perf_counter()
        self.made += 1
        try:
            response = await self.client.call(rpc, **fields)
        except grpc.aio.AioRpcError as err:
            self.failed += 1
            self._show(rpc, err.code().name, start, err.details() or "")
            return None
        self._show(rpc, "OK", start, describe(response))
        return response

    def _show(self, rpc: str, code: str, start: float, note: str) -> None:
        ms = (time.perf_counter() - start) * 1000
        self.out.write(f"  {rpc:26} {code:16} {ms:7.1f} ms  {note}\n")


def _protocols(info: Any) -> str:
    return ", ".join(m.upper() for m in ("s3", "azure", "gcs") if info.HasField(m)) or "none"


def _credential_values(access: Any) -> list[str]:
    found = []
    for member in ("s3", "azure", "gcs"):
        if access.credentials.HasField(member):
            found += [v for _, v in getattr(access.credentials, member).ListFields()]
    return [v for v in found if isinstance(v, str) and v]


def _grant_fields(name: str, bucket_ids: list[str]) -> dict[str, Any]:
    return {
        "account_name": name,
        "protocol": S3,
        "authentication_type": KEY,
        "buckets": [{"bucket_id": b, "access_mode": {"mode": "READ_WRITE"}} for b in bucket_ids],
    }


async def _lifecycle(calls: _Calls) -> list[str]:
    """The bucket lifecycle; the credential values the COSI system received."""
    await calls.call(
        "DriverGetInfo",
        lambda r: f"name={r.name}, {len(r.supported_protocols)} protocols supported",
    )
    made = await calls.call(
        "DriverCreateBucket",
        lambda r: f"bucket_id={r.bucket_id}, info for {_protocols(r.protocols)}",
        name="bc-photos-0001",
        protocols=[S3],
        parameters={"tier": "standard"},
    )
    static = await calls.call(
        "DriverGetExistingBucket",
        lambda r: f"bucket_id={r.bucket_id} (statically provisioned)",
        existing_bucket_id=STATIC,
        protocols=[S3],
    )
    if made is None or static is None:
        return []
    ids = [made.bucket_id, static.bucket_id]
    secrets: list[str] = []

    def granted(r: Any) -> str:
        secrets.extend(_credential_values(r))
        return (
            f"account_id={r.account_id}, {len(r.buckets)} buckets, S3 credentials with"
            f" {len(secrets)} values (the COSI system has them)"
        )

    access = await calls.call("DriverGrantBucketAccess", granted, **_grant_fields("ba-0001", ids))
    if access is not None:
        await calls.call(
            "DriverRevokeBucketAccess",
            lambda r: "access removed from both buckets",
            account_id=access.account_id,
            protocol=S3,
            authentication_type=KEY,
            buckets=[{"bucket_id": i} for i in ids],
        )
    await calls.call("DriverDeleteBucket", lambda r: "deleted", bucket_id=made.bucket_id)
    return secrets


def _leaks(secrets: list[str], text: str) -> list[str]:
    forms = []
    for value in secrets:
        raw = value.encode()
        forms += [value, base64.b64encode(raw).decode(), raw.hex()]
    return [f for f in forms if f in text]


def _show_metrics(admin: str, out: TextIO) -> None:
    with urllib.request.urlopen(f"{admin}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    wanted = (
        f'plugproxy_rpc_duration_seconds_count{{code="OK",method="/{spec_package(SPEC)}.',
        "plugproxy_violations_total{",
    )
    for line in text.splitlines():
        if line.startswith(wanted):
            out.write(f"  {line}\n")


def _show_grant_log(log: str, out: TextIO) -> None:
    for line in log.splitlines():
        if " call " in line and "DriverGrantBucketAccess" in line and "response=" in line:
            out.write(f"  {line[:1200]}{'…' if len(line) > 1200 else ''}\n")
            return


async def run(ns: argparse.Namespace) -> int:
    out = sys.stdout
    with tempfile.TemporaryDirectory(prefix="plugproxy-demo-") as tmp:
        plugin_sock, proxy_sock = f"{tmp}/driver.sock", f"{tmp}/cosi.sock"
        fake = await start_fake_plugin(SPEC, f"unix://{plugin_sock}")
        proxy, log, admin = await start_demo_proxy(
            plugin_sock, proxy_sock, echo=ns.proxy_log == "stderr"
        )
        out.write(f"plugproxy demo: COSI system -> plugproxy -> fake COSI driver ({SPEC})\n")
        out.write(f"  COSI socket   unix://{proxy_sock}\n  driver socket unix://{plugin_sock}\n")
        out.write(f"  admin         {admin}  (/metrics /healthz /readyz /violations)\n\n")
        out.write(
            "1. A bucket lifecycle through the proxy (--spec auto knows it by its package):\n"
        )
        reported = False
        try:
            async with SpecClient(f"unix://{proxy_sock}", SPEC) as client:
                calls = _Calls(client, out)
                secrets = await _lifecycle(calls)
                out.write(f"\n  {calls.made - calls.failed}/{calls.made} calls succeeded\n\n")
                out.write(
                    f"2. A driver's breach (the fake told to misbehave: {BREACH}), reported in"
                    " audit mode:\n"
                )
                fake.plugin.knobs.misbehave = {BREACH}
                made = await client.call("DriverCreateBucket", name="bc-photos-0002")
                breach = await _answer(
                    client.call(
                        "DriverGrantBucketAccess",
                        **_grant_fields("ba-0002", [made.bucket_id, STATIC]),
                    )
                )
                if breach is not None:
                    secrets += _credential_values(breach)
                fake.plugin.knobs.misbehave = set()
                data = report.fetch(admin)
                report.render(data, out)
                reported = any(
                    v.get("rule") == "cosi.grant-bucket-not-answered" for v in data["violations"]
                )
            out.write("\n3. Metrics scraped from /metrics (excerpt):\n")
            _show_metrics(admin, out)
        finally:
            await proxy.stop(1)
            await fake.stop(0)
        out.write("\n4. The call log, credentials masked (the grant, with payloads):\n")
        text = log.getvalue()
        _show_grant_log(text, out)
        leaked = _leaks(secrets, text)
        out.write(
            "\n  the credentials the COSI system received appear in the proxy's log (raw,"
            f" base64 or hex): {'YES' if leaked else 'no'}\n"
        )
        ok = calls.failed == 0 and bool(secrets) and reported and not leaked
        return 0 if ok else 1


async def _answer(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except grpc.aio.AioRpcError:
        return None
