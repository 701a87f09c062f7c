"""Property-based fuzzing of every known method's request and response bytes through a live
proxy with every stage that reads messages switched on.

Messages are derived from the descriptors: random valid messages built field by field,
random byte strings, and mutated valid encodings. A recorder plugin answers each call with
the fuzzed response bytes. In audit mode the proxy must relay both directions byte for byte;
in enforce mode every call must still end with a definite status. The proxy must stay up.

The in-suite run is bounded (a few hundred examples); ``bench/fuzz_long.py --minutes N``
runs the same properties for as long as asked.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugproxy.api import CallKind, MethodInfo
from plugproxy.cli.serve import ProxyServer
from plugproxy.rules import all_rules
from plugproxy.spec.registry import SPEC_NAMES, Registry
from tests.support import RecorderPlugin, Seen, start_proxy

MAX_DEPTH = 3
FUZZ_ID = "x-fuzz-id"
METHODS: tuple[MethodInfo, ...] = tuple(
    sorted(Registry(SPEC_NAMES).methods(), key=lambda m: m.path)
)

# -- messages from descriptors -------------------------------------------------------------

_F = FieldDescriptor
_INT32 = st.integers(-(2**31), 2**31 - 1)
_INT64 = st.integers(-(2**63), 2**63 - 1)
_UINT32 = st.integers(0, 2**32 - 1)
_UINT64 = st.integers(0, 2**64 - 1)
SCALARS: dict[int, st.SearchStrategy[Any]] = {
    _F.TYPE_DOUBLE: st.floats(),
    _F.TYPE_FLOAT: st.floats(width=32),
    _F.TYPE_INT32: _INT32,
    _F.TYPE_SINT32: _INT32,
    _F.TYPE_SFIXED32: _INT32,
    _F.TYPE_INT64: _INT64,
    _F.TYPE_SINT64: _INT64,
    _F.TYPE_SFIXED64: _INT64,
    _F.TYPE_UINT32: _UINT32,
    _F.TYPE_FIXED32: _UINT32,
    _F.TYPE_UINT64: _UINT64,
    _F.TYPE_FIXED64: _UINT64,
    _F.TYPE_BOOL: st.booleans(),
    _F.TYPE_STRING: st.text(max_size=40),
    _F.TYPE_BYTES: st.binary(max_size=40),
}


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _is_repeated(fd: FieldDescriptor) -> bool:
    return bool(fd.is_repeated)


def _scalar(draw: st.DrawFn, fd: FieldDescriptor) -> Any:
    if fd.type == _F.TYPE_ENUM:
        # Known values mostly; an unknown number now and then (open enums keep it).
        known = [v.number for v in fd.enum_type.values]
        return draw(st.one_of(st.sampled_from(known), st.integers(-3, 1000)))
    return draw(SCALARS[fd.type])


def _fill(draw: st.DrawFn, msg: Message, depth: int) -> None:
    desc: Descriptor = msg.DESCRIPTOR
    chosen = {o.name: draw(st.sampled_from([None, *o.fields])) for o in desc.oneofs}
    for fd in desc.fields:
        oneof = fd.containing_oneof
        if oneof is not None:
            if chosen[oneof.name] is not fd:
                continue
        elif not draw(st.booleans()):
            continue
        if _is_map(fd):
            key_fd = fd.message_type.fields_by_name["key"]
            value_fd = fd.message_type.fields_by_name["value"]
            target = getattr(msg, fd.name)
            for _ in range(draw(st.integers(0, 3))):
                key = _scalar(draw, key_fd)
                if value_fd.message_type is not None:
                    if depth < MAX_DEPTH:
                        _fill(draw, target[key], depth + 1)
                else:
                    target[key] = _scalar(draw, value_fd)
        elif _is_repeated(fd):
            target = getattr(msg, fd.name)
            for _ in range(draw(st.integers(0, 3))):
                if fd.message_type is not None:
                    if depth < MAX_DEPTH:
                        _fill(draw, target.add(), depth + 1)
                else:
                    target.append(_scalar(draw, fd))
        elif fd.message_type is not None:
            if depth < MAX_DEPTH:
                sub = getattr(msg, fd.name)
                sub.SetInParent()
                _fill(draw, sub, depth + 1)
        else:
            setattr(msg, fd.name, _scalar(draw, fd))


@st.composite
def valid_message(draw: st.DrawFn, cls: type[Message]) -> bytes:
    """A random message of ``cls``, built field by field from its descriptor, encoded."""
    msg = cls()
    _fill(draw, msg, 0)
    return bytes(msg.SerializeToString())


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """A valid encoding with one byte-level mutation: flip, cut, insert, splice or repeat."""
    data = bytearray(draw(base))
    kind = draw(st.sampled_from(["flip", "cut", "insert", "splice", "repeat"]))
    at = draw(st.integers(0, len(data)))
    if kind == "flip" and data:
        i = min(at, len(data) - 1)
        data[i] ^= draw(st.integers(1, 255))
    elif kind == "cut":
        del data[at:]
    elif kind == "insert":
        data[at:at] = draw(st.binary(min_size=1, max_size=8))
    elif kind == "splice":
        data[at:] = draw(st.binary(max_size=16))
    else:
        data.extend(bytes(data))  # concatenated encodings merge: still valid protobuf
    return bytes(data)


def message_bytes(cls: type[Message] | None) -> st.SearchStrategy[bytes]:
    random_bytes = st.binary(max_size=128)
    if cls is None:
        return random_bytes
    valid = valid_message(cls)
    return st.one_of(valid, random_bytes, mutated(valid))


@dataclass(frozen=True)
class Case:
    method: MethodInfo
    request: bytes
    responses: tuple[bytes, ...]

    def __repr__(self) -> str:  # shrunk examples print readably
        return f"Case({self.method.path}, request={self.request!r}, responses={self.responses!r})"


def _case_for(method: MethodInfo) -> st.SearchStrategy[Case]:
    responses = message_bytes(method.response_class)
    if method.kind.unary_response:
        many = responses.map(lambda r: (r,))
    else:
        many = st.lists(responses, max_size=3).map(tuple)
    return st.builds(Case, st.just(method), message_bytes(method.request_class), many)


BY_PATH = {m.path: m for m in METHODS}


def cases() -> st.SearchStrategy[Case]:
    return st.sampled_from(sorted(BY_PATH)).flatmap(lambda path: _case_for(BY_PATH[path]))


# -- the live proxy ---------------------------------------------------------------------------


class FuzzPlugin(RecorderPlugin):
    """The recorder plugin, also answering server-streaming paths with raw byte lists."""

    def __init__(self) -> None:
        super().__init__()
        self.raw_stream: dict[str, Callable[[bytes], tuple[bytes, ...]]] = {}

    def service(self, details: Any) -> grpc.RpcMethodHandler | None:
        path = details.method
        if path not in self.raw_stream:
            return super().service(details)
        fn = self.raw_stream[path]

        async def raw_stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
            seen = self._record(path, context)
            seen.requests.append(request)
            for item in fn(request):
                yield item

        return grpc.unary_stream_rpc_method_handler(raw_stream)

    def serve(self, case: Case) -> None:
        path = case.method.path
        if case.method.kind is CallKind.UNARY_STREAM:
            self.raw_stream[path] = lambda req: case.responses
        else:
            self.raw[path] = lambda req: case.responses[0]

    def seen_for(self, fuzz_id: str) -> Seen | None:
        for seen in reversed(self.seen):
            if seen.metadata.get(FUZZ_ID) == fuzz_id:
                return seen
        return None


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str
    responses: tuple[bytes, ...]


class FuzzTarget:
    """A FuzzPlugin behind a proxy; ``run(case)`` sends one fuzzed call through it."""

    def __init__(self, server: Any, plugin: FuzzPlugin, proxy: ProxyServer, ch: Any) -> None:
        self.server, self.plugin, self.proxy, self.ch = server, plugin, proxy, ch
        self._ids = itertools.count(1)

    async def run(self, case: Case) -> tuple[str, Outcome]:
        self.plugin.serve(case)
        fuzz_id = str(next(self._ids))
        md = ((FUZZ_ID, fuzz_id),)
        path = case.method.path
        try:
            if case.method.kind is CallKind.UNARY_STREAM:
                call = self.ch.unary_stream(path)(case.request, timeout=10, metadata=md)
                got = tuple([item async for item in call])
            else:
                got = (await self.ch.unary_unary(path)(case.request, timeout=10, metadata=md),)
        except grpc.aio.AioRpcError as err:
            return fuzz_id, Outcome(err.code(), err.details() or "", ())
        return fuzz_id, Outcome(grpc.StatusCode.OK, "", got)

    async def alive(self) -> bool:
        probe = "/csi.v1.Identity/Probe"
        self.plugin.raw[probe] = lambda req: b""
        return bool(await self.ch.unary_unary(probe)(b"", timeout=10) == b"")


async def start_target(tmp: str, *proxy_args: str) -> FuzzTarget:
    upstream, listen = f"{tmp}/plugin.sock", f"{tmp}/proxy.sock"
    plugin = FuzzPlugin()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([plugin])
    server.add_insecure_port(f"unix:{upstream}")
    await server.start()
    proxy = await start_proxy(listen, upstream, *proxy_args)
    ch = grpc.aio.insecure_channel(f"unix:{listen}")
    return FuzzTarget(server, plugin, proxy, ch)


async def stop_target(target: FuzzTarget) -> None:
    await target.ch.close()
    await target.proxy.stop(0)
    await target.server.stop(0)


# Everything that reads messages: audit/enforce validation, payload logging with redaction,
# serialization (keys from every message), metrics; tracing needs OTEL_* (set below).
STAGE_ARGS = ("--log-payloads", "--call-log", "all", "--serialize", "wait")
REJECT_CODES = {
    grpc.StatusCode[rule.reject_code] for rule in all_rules().values() if rule.reject_code
}


def check_audit(target: FuzzTarget, case: Case, fuzz_id: str, out: Outcome) -> None:
    """Audit mode: the plugin saw the request bytes, the CO got the response bytes."""
    assert out.code is grpc.StatusCode.OK, (out.code, out.details)
    assert out.responses == case.responses
    seen = target.plugin.seen_for(fuzz_id)
    assert seen is not None and seen.requests == [case.request]


def check_enforce(target: FuzzTarget, case: Case, fuzz_id: str, out: Outcome) -> None:
    """Enforce mode: forwarded byte for byte, or answered by the proxy with a reject code."""
    seen = target.plugin.seen_for(fuzz_id)
    if out.code is grpc.StatusCode.OK:
        assert out.responses == case.responses
        assert seen is not None and seen.requests == [case.request]
        return
    assert seen is None, "a rejected request reached the plugin"
    assert out.code in REJECT_CODES, (out.code, out.details)
    assert out.details.startswith("plugproxy: "), out.details
    cls = case.method.request_class
    assert cls is not None
    try:
        cls.FromString(case.request)
    except Exception:
        assert out.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "cannot decode" in out.details


@pytest.fixture
async def audit_target(tmp_path, monkeypatch) -> AsyncIterator[FuzzTarget]:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    target = await start_target(str(tmp_path), "--validation", "audit", *STAGE_ARGS)
    assert [s.name for s in target.proxy.stages] == [
        "tracing",
        "metrics",
        "calllog",
        "validate",
        "serialize",
    ]
    yield target
    assert await target.alive()
    # The fuzz reached the decoders both ways, not only the happy path.
    assert malformed_count(target.proxy, "co") > 0
    assert malformed_count(target.proxy, "plugin") > 0
    await stop_target(target)


def malformed_count(proxy: ProxyServer, party: str) -> float:
    return sum(
        sample.value
        for family in proxy.metrics.collect()
        for sample in family.samples
        if sample.name == "plugproxy_violations_total"
        and sample.labels.get("rule", "").endswith(".malformed-message")
        and sample.labels.get("party") == party
    )


@pytest.fixture
async def enforce_target(tmp_path) -> AsyncIterator[FuzzTarget]:
    target = await start_target(str(tmp_path), "--validation", "enforce", *STAGE_ARGS)
    yield target
    assert await target.alive()
    await stop_target(target)


FUZZ_SETTINGS = settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


@FUZZ_SETTINGS
@given(case=cases())
async def test_audit_relays_every_fuzzed_call_byte_for_byte(audit_target, case):
    fuzz_id, out = await audit_target.run(case)
    check_audit(audit_target, case, fuzz_id, out)


@settings(FUZZ_SETTINGS, max_examples=400)
@given(case=cases())
async def test_enforce_ends_every_fuzzed_call_with_a_definite_status(enforce_target, case):
    fuzz_id, out = await enforce_target.run(case)
    check_enforce(enforce_target, case, fuzz_id, out)


def test_strategies_cover_every_method_and_build_decodable_messages():
    assert len(METHODS) == len({m.path for m in METHODS}) >= 60
    assert any(m.kind is CallKind.UNARY_STREAM for m in METHODS)

    @settings(max_examples=100, deadline=None, database=None)
    @given(data=st.data())
    def decodes(data: st.DataObject) -> None:
        method = data.draw(st.sampled_from(METHODS))
        assert method.request_class is not None
        raw = data.draw(valid_message(method.request_class))
        assert method.request_class.FromString(raw).SerializeToString() is not None

    decodes()
