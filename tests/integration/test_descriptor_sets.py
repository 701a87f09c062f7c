"""Bring your own descriptors, end to end: a descriptor set compiled in the test from an
annotated .proto, a real gRPC server built from it (generic handlers, no generated code) on a
temporary UNIX socket, and a real proxy in front."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from plugproxy.api import MethodInfo
from plugproxy.cli import main as cli
from plugproxy.cli.serve import ProxyServer
from plugproxy.spec import redact
from tests.integration.test_canary import Generator
from tests.support import (
    VAULT,
    VAULT_PROTO,
    build_descriptor_set,
    channel,
    generic_servicer,
    relay,  # noqa: F401  # the fixture, found by name
    start_proxy,
    vault_descriptor_set,
    wait_until,
)

PUT = f"/{VAULT}.Vault/PutSecret"
GET = f"/{VAULT}.Vault/GetSecret"
LIST = f"/{VAULT}.Vault/ListSecrets"
REQUIRED = f"{VAULT}.required-field"


async def _serve(path: str, handlers: dict[str, Any]) -> grpc.aio.Server:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([generic_servicer(vault_descriptor_set(), handlers)])
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server


def _http(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read().decode("utf-8", "replace")


def _method(proxy: ProxyServer, path: str) -> MethodInfo:
    method = proxy.registry.lookup(path)
    assert method.known and method.request_class and method.response_class
    return method


async def test_calls_are_decoded_judged_and_never_leak_a_secret(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    answers: dict[str, Any] = {}  # path -> response bytes (a list for the stream)

    async def put(request: Any, context: Any) -> bytes:
        if request.vault == "refuse":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"token {request.token} denied")
        return bytes(answers[PUT])

    async def get(request: Any, context: Any) -> bytes:
        return bytes(answers[GET])

    async def list_secrets(request: Any, context: Any) -> AsyncIterator[bytes]:
        for item in answers[LIST]:
            yield item

    server = await _serve(upstream, {PUT: put, GET: get, LIST: list_secrets})
    proxy = await start_proxy(
        listen,
        upstream,
        "--descriptor-set",
        vault_descriptor_set(),
        "--admin-listen",
        "127.0.0.1:0",
        "--log-payloads",
        "--validation",
        "audit",
        "--redact",
        f"{VAULT}.Secret.labels",
    )
    memory = InMemorySpanExporter()
    for stage in proxy.stages:
        if stage.name == "tracing":
            stage.provider.add_span_processor(SimpleSpanProcessor(memory))  # type: ignore[attr-defined]
    red = redact.from_settings(
        proxy.settings.stages.call_log.redaction, proxy.registry.specs.values()
    )
    canaries: set[str] = set()
    plain: set[str] = set()
    put_m, get_m, list_m = (_method(proxy, p) for p in (PUT, GET, LIST))
    assert put_m.request_class and get_m.response_class and list_m.response_class
    try:
        async with channel(listen) as ch:
            for variant in range(2):  # both alternatives of the oneof
                gen = Generator(red, f"p{variant}")
                request = put_m.request_class()
                gen.fill(request, variant)
                answers[PUT] = b""
                await ch.unary_unary(PUT)(request.SerializeToString(), timeout=5)
                canaries |= gen.out.canaries
                plain |= gen.out.plain
            # The CO leaves out a REQUIRED field; the plugin answers without one.
            gen = Generator(red, "g")
            secret = get_m.response_class()
            gen.fill(secret, 0)
            secret.name = ""
            answers[GET] = secret.SerializeToString()
            request = get_m.request_class(vault="plainvault")  # type: ignore[misc]
            got = await ch.unary_unary(GET)(request.SerializeToString(), timeout=5)
            assert got == answers[GET]  # relayed untouched, canaries and all
            canaries |= gen.out.canaries
            gen = Generator(red, "l")
            items = []
            for variant in range(2):
                item = list_m.response_class()
                gen.fill(item, variant)
                items.append(item.SerializeToString())
            answers[LIST] = items
            request = list_m.request_class(vault="plainvault")  # type: ignore[misc]
            streamed = [m async for m in ch.unary_stream(LIST)(request.SerializeToString())]
            assert streamed == items
            canaries |= gen.out.canaries
            # An error message echoing a secret of the request.
            token = "CANARYtokenQ"
            request = put_m.request_class(vault="refuse", token=token)  # type: ignore[misc]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ch.unary_unary(PUT)(request.SerializeToString(), timeout=5)
            assert err.value.details() == f"token {token} denied"
            canaries.add(token)
        assert proxy.admin is not None
        metrics = _http(proxy.admin.port, "/metrics")
        violations_text = _http(proxy.admin.port, "/violations")
    finally:
        await proxy.stop(0)
        await server.stop(0)
    captured = capfd.readouterr()
    spans = list(memory.get_finished_spans())
    spans_text = "\n".join(s.to_json() for s in spans)

    # Redacted fields: debug_redact (token, payload) and --redact (labels' values).
    assert {f"{VAULT}.PutSecretRequest.token", f"{VAULT}.Secret.payload"} <= {
        f"{plan.full_name}.{name}"
        for plan in red.plans.values()
        for name, action in plan.fields.items()
        if action is redact.MASK
    }
    assert len(canaries) > 8
    outputs = {
        "stdout": captured.out,
        "stderr": captured.err,
        "/metrics": metrics,
        "/violations": violations_text,
        "spans": spans_text,
    }
    for where, text in outputs.items():
        leaked = sorted(c for c in canaries if c in text)
        assert not leaked, f"{where} leaks {leaked[:3]}"

    # Decoded: the call log shows the fields, secrets masked.
    calls = [
        json.loads(line)
        for line in captured.out.splitlines()
        if line.startswith("{") and '"event":"call"' in line
    ]
    assert [c["method"] for c in calls] == [PUT, PUT, GET, LIST, PUT]
    assert {c["spec"] for c in calls} == {VAULT}
    assert calls[0]["request"]["token"] == "***"
    assert calls[0]["request"]["secret"]["payload"] == "***"
    assert calls[2]["request"] == {"vault": "plainvault"}
    assert calls[-1]["message"] == "token *** denied"
    logged = json.dumps(calls)
    missing = sorted(p for p in plain if p not in logged)
    assert not missing, missing[:5]

    # Judged from field_behavior: the CO's missing name, the plugin's nameless Secret, and
    # the plugin's OK to a request missing a REQUIRED field; nothing on complete requests.
    report = json.loads(violations_text)["violations"]
    seen = {(v["rule"], v["method"], v["party"], v["last_field"]) for v in report}
    assert (REQUIRED, GET, "co", "name") in seen
    assert (REQUIRED, GET, "plugin", "name") in seen
    assert (f"{VAULT}.bad-request-accepted", GET, "plugin", "name") in seen
    put_fields = {v["last_field"] for v in report if v["method"] == PUT}
    assert put_fields <= {"secret", "ttl_days", "secret.name"}, put_fields  # the refused one
    assert all(v["section"].startswith("acme/vault/v1/vault.proto §") for v in report)

    # Measured and traced by their real service and method.
    duration = f'plugproxy_rpc_duration_seconds_count{{code="OK",method="{PUT}",spec="{VAULT}"}}'
    assert f"{duration} 2.0" in metrics
    assert f'{{direction="response",method="{LIST}"}} 2.0' in metrics
    assert f'party="co",rule="{REQUIRED}",spec="{VAULT}"}} 1.0' in metrics
    names = {s.name for s in spans}
    assert {PUT.lstrip("/"), GET.lstrip("/"), LIST.lstrip("/")} <= names
    get_span = next(s for s in spans if s.name == GET.lstrip("/") and s.kind is SpanKind.SERVER)
    assert get_span.attributes is not None
    assert get_span.attributes["rpc.service"] == f"{VAULT}.Vault"
    assert get_span.attributes["plugproxy.spec"] == VAULT
    assert any(e.name == "violation" for e in get_span.events)


@pytest.mark.usefixtures("relay")  # the frame relay and the gRPC one decode alike
async def test_enforce_rejects_a_request_missing_a_required_field(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    reached: list[Any] = []

    async def put(request: Any, context: Any) -> bytes:
        reached.append(request)
        return b""

    server = await _serve(upstream, {PUT: put})
    proxy = await start_proxy(
        listen, upstream, "--descriptor-set", vault_descriptor_set(), "--validation", "enforce"
    )
    put_m = _method(proxy, PUT)
    assert put_m.request_class is not None
    complete = put_m.request_class(vault="v", secret={"name": "n"}, ttl_days=0)  # type: ignore[misc]
    nameless = put_m.request_class(vault="v", secret={}, ttl_days=3)  # type: ignore[misc]
    try:
        async with channel(listen) as ch:
            await ch.unary_unary(PUT)(complete.SerializeToString(), timeout=5)
            assert len(reached) == 1  # ttl_days 0 is set (optional): not missing
            for request, field in ((put_m.request_class(), "vault"), (nameless, "secret.name")):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await ch.unary_unary(PUT)(request.SerializeToString(), timeout=5)
                assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert f"{REQUIRED}: {field} is REQUIRED" in (err.value.details() or "")
            assert len(reached) == 1  # the plugin never saw them
    finally:
        await proxy.stop(0)
        await server.stop(0)


async def test_serialize_key_serializes_same_keys_only(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    inside: list[str] = []
    release = asyncio.Event()

    async def put(request: Any, context: Any) -> bytes:
        inside.append(request.secret.name)
        if request.secret.name == "first":
            await release.wait()
        return b""

    server = await _serve(upstream, {PUT: put})
    proxy = await start_proxy(
        listen,
        upstream,
        "--descriptor-set",
        vault_descriptor_set(),
        "--serialize-key",
        f"{PUT}=vault",
    )
    stage: Any = next(s for s in proxy.stages if s.name == "serialize")
    put_m = _method(proxy, PUT)
    assert put_m.request_class is not None

    def put_request(vault: str, name: str) -> bytes:
        message = put_m.request_class(vault=vault, secret={"name": name})  # type: ignore[misc]
        return bytes(message.SerializeToString())

    try:
        async with channel(listen) as ch:
            call = ch.unary_unary(PUT)
            first = asyncio.ensure_future(call(put_request("a", "first"), timeout=10))
            await wait_until(lambda: inside == ["first"])
            same = asyncio.ensure_future(call(put_request("a", "same"), timeout=10))
            await wait_until(lambda: stage.table.waiting == 1)
            await call(put_request("b", "other"), timeout=10)  # another key: not held up
            assert inside == ["first", "other"]
            release.set()
            await asyncio.gather(first, same)
            assert inside == ["first", "other", "same"]
    finally:
        await proxy.stop(0)
        await server.stop(0)


NO_SERVICE = 'syntax = "proto3";\npackage acme.empty.v1;\nmessage Nothing {}\n'
CLASH = (
    'syntax = "proto3";\npackage csi.v1;\nservice Identity { rpc Probe(P) returns (P); }\n'
    "message P {}\n"
)


def _broken_set(tmp_path: Any, case: str) -> list[str]:
    if case == "unreadable":
        return [str(tmp_path / "missing.binpb")]
    if case == "not-a-set":
        junk = tmp_path / "junk.binpb"
        junk.write_text("this is no descriptor set\n")
        return [str(junk)]
    if case == "missing-import":
        files = {"acme/vault/v1/vault.proto": VAULT_PROTO}
        return [build_descriptor_set(tmp_path, files, include_imports=False)]
    if case == "no-service":
        return [build_descriptor_set(tmp_path, {"empty.proto": NO_SERVICE})]
    if case == "bundled-clash":
        return [build_descriptor_set(tmp_path, {"clash.proto": CLASH})]
    assert case == "set-clash"
    return [vault_descriptor_set(), vault_descriptor_set()]


BROKEN = {
    "unreadable": "missing.binpb: cannot read it: No such file or directory",
    "not-a-set": "junk.binpb: not a binary FileDescriptorSet",
    "missing-import": "vault.proto imports google/api/field_behavior.proto, which the set"
    " does not contain (build it with protoc --include_imports)",
    "no-service": "api.binpb: defines no service",
    "bundled-clash": "/csi.v1.Identity/Probe is already defined by the bundled spec csi.v1",
    "set-clash": f"/{VAULT}.Vault/PutSecret is already defined by --descriptor-set",
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_descriptor_set_fails_startup_in_one_line(case, tmp_path, capsys):
    sets = _broken_set(tmp_path, case)
    argv = ["serve", "--listen", f"unix://{tmp_path}/p.sock", "--upstream", "unix:///x.sock"]
    for path in sets:
        argv += ["--descriptor-set", path]
    assert cli.main([*argv, "--admin-listen", "off"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("plugproxy: error: --descriptor-set ")
    assert BROKEN[case] in err


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (f"{VAULT}.Vault/PutSecret=vault", "expected /package.Service/Method=FIELD_PATH"),
        (f"/{VAULT}.Vault/Nope=vault", f"unknown method /{VAULT}.Vault/Nope"),
        (f"{PUT}=secret.nope", f"{VAULT}.Secret has no field 'nope'"),
        (f"{PUT}=tags", f"{VAULT}.PutSecretRequest.tags is a map"),
        (f"{PUT}=secret", "does not end in a string or integer field"),
    ],
)
def test_a_bad_serialize_key_fails_startup_naming_it(item, expected, tmp_path, capsys):
    argv = ["serve", "--listen", f"unix://{tmp_path}/p.sock", "--upstream", "unix:///x.sock"]
    argv += ["--descriptor-set", vault_descriptor_set(), "--serialize-key", item]
    assert cli.main([*argv, "--admin-listen", "off"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"plugproxy: error: --serialize-key {item}")
    assert expected in err


def test_the_serve_process_exits_2_from_the_environment(tmp_path):
    env = {
        "PLUGPROXY_DESCRIPTOR_SET": str(tmp_path / "gone.binpb"),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ":".join(sys.path),
    }
    argv = ["serve", "--listen", f"unix://{tmp_path}/p.sock", "--upstream", "unix:///x.sock"]
    done = subprocess.run(
        [sys.executable, "-m", "plugproxy", *argv, "--admin-listen", "off"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"plugproxy: error: PLUGPROXY_DESCRIPTOR_SET {tmp_path}/gone.binpb: cannot read it:"
        " No such file or directory\n"
    )
