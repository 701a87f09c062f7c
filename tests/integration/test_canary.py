"""Canaries: no secret leaves the proxy, whatever output it goes to, for every spec.

For each spec, every method whose request or response type has something sensitive
reachable gets messages generated from the descriptors: every field populated recursively
with distinct recognizable values (each oneof alternative in turn), canaries in every
sensitive field. They cross a real proxy built with the configured pipeline (and payload
logging, tracing and validation when those exist) to a plugin that answers with canaries of
its own, once with an error message repeating a request secret. Then no canary may appear in
stdout, stderr, /metrics, /violations, the violations file or any exported span, while the
non-secret strings of the same messages do appear in the payload log.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from plugproxy.api import CallKind, MethodInfo
from plugproxy.cli import serve
from plugproxy.spec import redact
from plugproxy.spec.registry import SPEC_NAMES, Registry, spec_package
from tests.support import RecorderPlugin, channel, start_proxy

MAX_DEPTH = 6

# One configured path per spec, so `--redact` is exercised end to end (and COSI, whose
# requests carry no tagged secret, gets a request secret for the error case too).
EXTRA_PATHS = {
    "csi.v1": "csi.v1.NodeStageVolumeRequest.publish_context",
    "csi.v0": "csi.v0.NodeStageVolumeRequest.publish_info",
    "cosi.v1alpha1": "cosi.v1alpha1.DriverGrantBucketAccessRequest.parameters",
    "cosi.v1alpha2": "sigs.k8s.io.cosi.v1alpha2.DriverGrantBucketAccessRequest.parameters",
    "cmi.v1": "cmi.v1.CreateMachineRequest.ProviderSpec",
    "kms.v2": "v2.DecryptRequest.key_id",
    "deviceplugin.v1beta1": "v1beta1.ContainerAllocateRequest.devices_ids",
    # DRA and plugin registration carry nothing sensitive: only what an operator names.
    "dra.v1beta1": "k8s.io.kubelet.pkg.apis.dra.v1beta1.Claim.namespace",
    "dra.v1": "k8s.io.kubelet.pkg.apis.dra.v1.Claim.name",
    "drahealth.v1alpha1": "v1alpha1.DeviceHealth.message",
    "drahealth.v1": "v1.DeviceIdentifier.device_name",
    "pluginregistration.v1": "pluginregistration.RegistrationStatus.error",
}


@dataclass
class Generated:
    canaries: set[str] = field(default_factory=set)
    plain: set[str] = field(default_factory=set)
    covered: set[tuple[str, str]] = field(default_factory=set)  # (message, field) filled


class Generator:
    """Fills messages from their descriptors; canaries wherever the redactor masks."""

    def __init__(self, redactor: redact.Redactor, tag: str) -> None:
        self.redactor = redactor
        self.tag = tag
        self.counter = itertools.count(1)
        self.out = Generated()

    def _text(self, secret: bool) -> str:
        n = next(self.counter)
        if secret:
            value = f"CANARY{self.tag}x{n:05d}Q"
            self.out.canaries.add(value)
        else:
            value = f"plain{self.tag}n{n:05d}v"
            self.out.plain.add(value)
        return value

    def _scalar(self, fd: FieldDescriptor, secret: bool) -> Any:
        t = fd.type
        if t == FieldDescriptor.TYPE_STRING:
            return self._text(secret)
        if t == FieldDescriptor.TYPE_BYTES:
            if secret:
                return self._text(True).encode()
            return b"\x01\x02" + str(next(self.counter)).encode()
        if t == FieldDescriptor.TYPE_BOOL:
            return True
        if t == FieldDescriptor.TYPE_ENUM:
            return fd.enum_type.values[-1].number
        if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
            return 0.5 + next(self.counter)
        return 1000 + next(self.counter)

    def fill(self, message: Message, variant: int, depth: int = 0, secret: bool = False) -> None:
        desc: Descriptor = message.DESCRIPTOR
        if depth > MAX_DEPTH:
            return
        skip: set[str] = set()
        for oneof in desc.oneofs:
            if len(oneof.fields) > 1:
                keep = oneof.fields[variant % len(oneof.fields)].name
                skip.update(f.name for f in oneof.fields if f.name != keep)
        for fd in desc.fields:
            if fd.name in skip:
                continue
            masked = self.redactor.is_masked(fd)
            if masked or secret:
                self.out.covered.add((desc.full_name, fd.name))
            self._field(message, fd, variant, depth, secret or masked)

    def _field(
        self, message: Message, fd: FieldDescriptor, variant: int, depth: int, secret: bool
    ) -> None:
        container = getattr(message, fd.name)
        entry = fd.message_type
        if entry is not None and entry.GetOptions().map_entry:
            key_fd, value_fd = entry.fields_by_name["key"], entry.fields_by_name["value"]
            for _ in range(2):
                key = self._map_key(key_fd)
                if value_fd.message_type is not None:
                    self.fill(container[key], variant + 1, depth + 1, secret)
                else:
                    container[key] = self._scalar(value_fd, secret)
            return
        if fd.is_repeated:
            for i in range(2):
                if fd.message_type is not None:
                    self.fill(container.add(), variant + i, depth + 1, secret)
                else:
                    container.append(self._scalar(fd, secret))
            return
        if fd.message_type is not None:
            name = fd.message_type.full_name
            if name == "google.protobuf.Timestamp":
                container.seconds = 1_700_000_000 + next(self.counter)
            elif name.startswith("google.protobuf."):
                container.value = self._scalar(fd.message_type.fields_by_name["value"], secret)
            else:
                self.fill(container, variant, depth + 1, secret)
                if not container.ListFields():
                    container.SetInParent()
            return
        setattr(message, fd.name, self._scalar(fd, secret))

    def _map_key(self, fd: FieldDescriptor) -> Any:
        if fd.type == FieldDescriptor.TYPE_STRING:
            return f"key{self.tag}k{next(self.counter):05d}"  # map keys are shown by design
        if fd.type == FieldDescriptor.TYPE_BOOL:
            return next(self.counter) % 2 == 0
        return next(self.counter)


def variants_of(desc: Descriptor, seen: frozenset[str] = frozenset()) -> int:
    """How many variants cover every oneof alternative reachable from ``desc``."""
    if desc.full_name in seen:
        return 1
    seen = seen | {desc.full_name}
    count = max((len(o.fields) for o in desc.oneofs), default=1)
    for fd in desc.fields:
        if fd.message_type is not None:
            target = fd.message_type
            if target.GetOptions().map_entry:
                target = target.fields_by_name["value"].message_type
            if target is not None:
                count = max(count, variants_of(target, seen))
    return count


class Plugin(RecorderPlugin):
    """Answers unary paths from `raw`, streams from `stream`, and fails paths in `fail`."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: dict[str, str] = {}
        self.stream: dict[str, Callable[[bytes], Iterable[bytes]]] = {}

    def service(self, details: Any) -> grpc.RpcMethodHandler | None:
        path = details.method
        if path in self.fail:
            text = self.fail[path]

            async def failing(request: bytes, context: Any) -> bytes:
                self._record(path, context).requests.append(request)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, text)
                return b""

            return grpc.unary_unary_rpc_method_handler(failing)
        if path in self.stream:
            fn = self.stream[path]

            async def streaming(request: bytes, context: Any):
                self._record(path, context).requests.append(request)
                for item in fn(request):
                    yield item

            return grpc.unary_stream_rpc_method_handler(streaming)
        return super().service(details)


def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _optional_flags() -> list[str]:
    """Flags of stages being built alongside, passed only when they exist."""
    known = {opt.flag for opt in serve.all_options()}
    flags = ["--log-payloads", "--log-payload-max-bytes", "4MiB"]
    if "--validation" in known:
        flags += ["--validation", "audit"]  # audit: calls reach the plugin, reports are made
    return flags


def _record_flags(path: str) -> list[str]:
    """--violations-file when the validation stage has it: every violation appended."""
    known = {opt.flag for opt in serve.all_options()}
    return ["--violations-file", path] if "--violations-file" in known else []


def _sensitive_methods(registry: Registry, red: redact.Redactor, spec: str) -> list[MethodInfo]:
    methods = []
    for method in registry.methods(spec):
        assert method.request_class is not None and method.response_class is not None
        if red.plan_for(method.request_class.DESCRIPTOR) or red.plan_for(
            method.response_class.DESCRIPTOR
        ):
            methods.append(method)
    return methods


def _http(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read().decode("utf-8", "replace")


@pytest.mark.parametrize("spec", SPEC_NAMES)
async def test_no_canary_escapes(spec, tmp_path, capfd, monkeypatch):
    tracing = _has_module("plugproxy.stages.tracing")
    if tracing:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    record = str(tmp_path / "violations.jsonl")
    plugin = Plugin()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([plugin])
    server.add_insecure_port(f"unix:{upstream}")
    await server.start()
    proxy = await start_proxy(
        listen,
        upstream,
        "--admin-listen",
        "127.0.0.1:0",
        "--spec",
        spec,
        "--redact",
        EXTRA_PATHS[spec],
        *_optional_flags(),
        *_record_flags(record),
    )
    memory: Any = None
    if tracing:
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        memory = InMemorySpanExporter()
        for stage in proxy.stages:
            if stage.name == "tracing":
                stage.provider.add_span_processor(SimpleSpanProcessor(memory))  # type: ignore[attr-defined]

    red = redact.from_settings(proxy.settings.stages.call_log.redaction, [spec])
    generated = Generated()
    error_messages: list[str] = []
    sent = 0
    try:
        methods = _sensitive_methods(proxy.registry, red, spec)
        assert methods, f"{spec} has sensitive methods"
        async with channel(listen) as ch:
            for m_index, method in enumerate(methods):
                assert method.request_class and method.response_class
                req_desc = method.request_class.DESCRIPTOR
                resp_desc = method.response_class.DESCRIPTOR
                count = max(variants_of(req_desc), variants_of(resp_desc))
                for variant in range(count):
                    gen = Generator(red, f"{m_index}v{variant}")
                    request = method.request_class()
                    gen.fill(request, variant)
                    response = method.response_class()
                    gen.fill(response, variant)
                    request_raw = request.SerializeToString()
                    response_raw = response.SerializeToString()
                    if method.kind is CallKind.UNARY_UNARY:
                        plugin.raw[method.path] = lambda _req, r=response_raw: r
                        got = await ch.unary_unary(method.path)(request_raw, timeout=5)
                        assert got == response_raw  # canaries crossed, bytes untouched
                    else:
                        assert method.kind is CallKind.UNARY_STREAM
                        plugin.stream[method.path] = lambda _req, r=response_raw: [r, r]
                        got_all = [m async for m in ch.unary_stream(method.path)(request_raw)]
                        assert got_all == [response_raw, response_raw]
                    assert plugin.last().requests[-1] == request_raw
                    sent += 1
                    generated.canaries |= gen.out.canaries
                    generated.plain |= gen.out.plain
                    generated.covered |= gen.out.covered

            # An error whose message repeats a secret of the same request (DRA health has
            # no request to take one from: a stream whose request is empty).
            refusable = [
                m
                for m in methods
                if m.kind is CallKind.UNARY_UNARY
                and m.request_class is not None
                and red.plan_for(m.request_class.DESCRIPTOR)
            ]
            assert refusable or spec.startswith("drahealth.")
            for method in refusable[:1]:
                assert method.request_class is not None
                gen = Generator(red, "err")
                request = method.request_class()
                gen.fill(request, 0)
                echoed = sorted(gen.out.canaries)[0]
                text = f"backend refused credential {echoed} (and that is all)"
                plugin.fail[method.path] = text
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await ch.unary_unary(method.path)(request.SerializeToString(), timeout=5)
                assert err.value.details() == text  # the CO gets the plugin's message unchanged
                error_messages.append(text)
                generated.canaries |= gen.out.canaries
                del plugin.fail[method.path]

        assert proxy.admin is not None
        port = proxy.admin.port
        metrics = _http(port, "/metrics")
        violations = (
            _http(port, "/violations") if "/violations" in proxy.runtime.admin_routes else ""
        )
    finally:
        await proxy.stop(0)
        await server.stop(0)
    captured = capfd.readouterr()
    written = ""
    if _record_flags(record):  # the violations file, read once the proxy has stopped
        with open(record, encoding="utf-8") as f:
            written = f.read()
        assert '"event":"stop"' in written
    spans = ""
    if memory is not None:
        spans = "\n".join(s.to_json() for s in memory.get_finished_spans())
        assert spans, "the tracing stage exported spans"

    # Every field the redactor masks in this spec got a canary at least once.
    expected = {
        (plan.full_name, name)
        for plan in red.plans.values()
        if plan.full_name.startswith(spec_package(spec) + ".")
        for name, action in plan.fields.items()
        if action is redact.MASK
    }
    assert expected and expected <= generated.covered, expected - generated.covered
    assert sent >= len(methods)

    outputs = {
        "stdout": captured.out,
        "stderr": captured.err,
        "/metrics": metrics,
        "/violations": violations,
        "the violations file": written,
        "spans": spans,
    }
    for where, text in outputs.items():
        leaked = sorted(c for c in generated.canaries if c in text)
        assert not leaked, f"{where} leaks {len(leaked)} canaries, e.g. {leaked[:3]}"
    call_lines = [
        json.loads(line)
        for line in captured.out.splitlines()
        if line.startswith("{") and '"event":"call"' in line
    ]
    assert len(call_lines) == sent + len(error_messages)
    # The secrets are masked, not the messages dropped: the plain values are all there.
    payload_text = "\n".join(json.dumps(line, ensure_ascii=False) for line in call_lines)
    missing = sorted(p for p in generated.plain if p not in payload_text)
    assert not missing, f"{len(missing)} plain values missing from the payload log: {missing[:5]}"
    assert "***" in payload_text
    assert not error_messages or any(
        line.get("message", "").startswith("backend refused credential ***") for line in call_lines
    )
