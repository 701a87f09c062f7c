"""Real gRPC peers for the tests: a raw-bytes recorder plugin and an in-process proxy."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import importlib.resources
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.api import field_behavior_pb2
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_tools import protoc

from plugproxy.cli import serve

ECHO = "/test.Echo/"
RELAYS = ("frames", "grpc")


@pytest.fixture(params=RELAYS)
def relay(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test once per relay; proxies started in-process or as processes follow it."""
    monkeypatch.setenv("PLUGPROXY_RELAY", request.param)
    return str(request.param)


@dataclass
class Seen:
    method: str
    metadata: dict[str, Any]
    time_remaining: float | None
    requests: list[bytes] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


class RecorderPlugin(grpc.GenericRpcHandler):
    """Answers /test.Echo/* (and any path in `raw`) with raw bytes and records what it saw.

    Request metadata steers it: x-fail-code / x-fail-message / x-fail-details-bin make it
    fail; it always sends initial metadata x-initial and trailer x-trailer.
    """

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.raw: dict[str, Callable[[bytes], bytes]] = {}

    def last(self) -> Seen:
        return self.seen[-1]

    def _record(self, method: str, context: Any) -> Seen:
        md = dict(context.invocation_metadata() or ())
        seen = Seen(method, md, context.time_remaining())
        self.seen.append(seen)
        return seen

    async def _headers(self, context: Any) -> None:
        await context.send_initial_metadata(
            (("x-initial", "hello"), ("x-initial-bin", b"\x00\x01"))
        )

    async def _maybe_fail(self, seen: Seen, context: Any) -> None:
        code = seen.metadata.get("x-fail-code")
        if code:
            trailing: list[tuple[str, Any]] = [("x-trailer", "error-trailer")]
            details = seen.metadata.get("x-fail-details-bin")
            if details:
                trailing.append(("grpc-status-details-bin", details))
            await context.abort(
                getattr(grpc.StatusCode, code),
                seen.metadata.get("x-fail-message", ""),
                tuple(trailing),
            )

    def service(self, details: Any) -> grpc.RpcMethodHandler | None:
        path = details.method
        if path in self.raw:
            fn = self.raw[path]

            async def raw_unary(request: bytes, context: Any) -> bytes:
                seen = self._record(path, context)
                seen.requests.append(request)
                await self._headers(context)
                context.set_trailing_metadata((("x-trailer", "bye"),))
                return fn(request)

            return grpc.unary_unary_rpc_method_handler(raw_unary)
        name = path.removeprefix(ECHO)
        if name == "Unary":
            return grpc.unary_unary_rpc_method_handler(self._unary)
        if name == "ServerStream":
            return grpc.unary_stream_rpc_method_handler(self._server_stream)
        if name == "ClientStream":
            return grpc.stream_unary_rpc_method_handler(self._client_stream)
        if name == "Bidi":
            return grpc.stream_stream_rpc_method_handler(self._bidi)
        if name == "Hang":
            return grpc.unary_unary_rpc_method_handler(self._hang)
        if name == "Slow":
            return grpc.unary_unary_rpc_method_handler(self._slow)
        return None

    async def _unary(self, request: bytes, context: Any) -> bytes:
        seen = self._record(ECHO + "Unary", context)
        seen.requests.append(request)
        await self._headers(context)
        await self._maybe_fail(seen, context)
        context.set_trailing_metadata((("x-trailer", "bye"), ("x-trailer-bin", b"\xff\x00")))
        return b"echo:" + request

    async def _server_stream(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        seen = self._record(ECHO + "ServerStream", context)
        await self._headers(context)
        for i in range(int(request or b"3")):
            yield b"item-%d" % i
        await self._maybe_fail(seen, context)
        context.set_trailing_metadata((("x-trailer", "bye"),))

    async def _client_stream(self, requests: AsyncIterator[bytes], context: Any) -> bytes:
        seen = self._record(ECHO + "ClientStream", context)
        await self._headers(context)
        async for req in requests:
            seen.requests.append(req)
        await self._maybe_fail(seen, context)
        context.set_trailing_metadata((("x-trailer", "bye"),))
        return b"|".join(seen.requests)

    async def _bidi(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        seen = self._record(ECHO + "Bidi", context)
        await self._headers(context)
        async for req in requests:
            seen.requests.append(req)
            if req == b"fail":
                await self._maybe_fail(seen, context)
            yield b"re:" + req
        context.set_trailing_metadata((("x-trailer", "bye"),))

    async def _slow(self, request: bytes, context: Any) -> bytes:
        self._record(ECHO + "Slow", context)
        await asyncio.sleep(float(request or b"1"))
        return b"slow-done"

    async def _hang(self, request: bytes, context: Any) -> bytes:
        seen = self._record(ECHO + "Hang", context)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.cancelled.set()
            raise
        return b""


async def start_recorder(
    path: str, options: tuple[tuple[str, Any], ...] = ()
) -> tuple[grpc.aio.Server, RecorderPlugin]:
    plugin = RecorderPlugin()
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers([plugin])
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server, plugin


async def start_proxy(
    listen: str, upstream: str, *args: str, stages: list[Any] | None = None
) -> serve.ProxyServer:
    argv = ["--listen", f"unix://{listen}", "--upstream", f"unix://{upstream}"]
    if "--admin-listen" not in args:
        argv += ["--admin-listen", "off"]
    if not any(a.startswith("--listen-when") for a in args):
        # Listening at once lets a test start the proxy before its plugin; the start-order
        # tests (integration/test_start_order.py) choose --listen-when themselves.
        argv += ["--listen-when", "start"]
    # Modules that test both relays set PLUGPROXY_RELAY (see the `relay` fixture).
    environ = {"PLUGPROXY_RELAY": os.environ.get("PLUGPROXY_RELAY", "auto")}
    settings = serve.parse_settings([*argv, *args], environ=environ)
    proxy = serve.ProxyServer(settings, stages=stages)
    await proxy.start()
    return proxy


@contextlib.asynccontextmanager
async def channel(path: str) -> AsyncIterator[grpc.aio.Channel]:
    # A pool of its own: grpc's global pool can hand a new channel the connection of one
    # just closed, to a proxy just stopped on the same path (a first call then fails).
    ch = grpc.aio.insecure_channel(f"unix:{path}", options=[("grpc.use_local_subchannel_pool", 1)])
    try:
        yield ch
    finally:
        await ch.close()


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def require(present: bool, message: str) -> None:
    """Skip the test unless ``present``, or fail where the environment sets CI: CI installs
    everything the suite uses (.ci/run), so a skip there would be a test CI does not have."""
    if present:
        return
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{message}; CI must install it", pytrace=False)
    pytest.skip(message)


def require_tool(name: str, install: str) -> str:
    """The path of the command ``name`` (see :func:`require`)."""
    path = shutil.which(name)
    require(path is not None, f"{name} is not installed ({install})")
    assert path is not None
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def admin_get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET http://127.0.0.1:PORT/PATH; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as exc:
        return 0, str(exc)


@functools.cache
def built_image() -> str:
    """`make image` as a user runs it, once per test session (cached layers and bases make
    it quick when nothing changed); the image's name. Building the bases needs root."""
    require_tool("podman", "Debian: apt-get install podman runc")
    require_tool("debootstrap", "Debian: apt-get install debootstrap")
    require(os.geteuid() == 0, "building the image's bases with debootstrap needs root")
    # One build at a time on the machine: test processes (make test's workers) would
    # otherwise debootstrap the same bases and tag the same image at once.
    lock_path = pathlib.Path(tempfile.gettempdir()) / "plugproxy-make-image.lock"
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = subprocess.run(
            ["make", "--no-print-directory", "image", "ENGINE=podman"],
            cwd=pathlib.Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            timeout=840,
            check=False,
        )
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    from plugproxy.cli.inject import DEFAULT_IMAGE

    return DEFAULT_IMAGE


# -- descriptor sets built from .proto text (grpc_tools' protoc, no generated code) -------------

# An API annotated the standard way: REQUIRED fields (AIP-203) and debug_redact secrets.
VAULT_PROTO = """
syntax = "proto3";
package acme.vault.v1;

import "google/api/field_behavior.proto";
import "google/protobuf/timestamp.proto";

service Vault {
  rpc PutSecret(PutSecretRequest) returns (PutSecretResponse);
  rpc GetSecret(GetSecretRequest) returns (Secret);
  rpc ListSecrets(ListSecretsRequest) returns (stream Secret);
}

message Secret {
  string name = 1 [(google.api.field_behavior) = REQUIRED];
  bytes payload = 2 [debug_redact = true];
  map<string, string> labels = 3;
  google.protobuf.Timestamp created = 4;
  repeated string readers = 5;
}

message PutSecretRequest {
  string vault = 1 [(google.api.field_behavior) = REQUIRED];
  Secret secret = 2 [(google.api.field_behavior) = REQUIRED];
  string token = 3 [debug_redact = true];
  optional int32 ttl_days = 4 [(google.api.field_behavior) = REQUIRED];
  int32 replicas = 5 [(google.api.field_behavior) = REQUIRED];
  oneof placement {
    string zone = 6 [(google.api.field_behavior) = REQUIRED];
    string region = 7;
  }
  map<string, string> tags = 8;
}

message PutSecretResponse {
  string version = 1 [(google.api.field_behavior) = OUTPUT_ONLY];
}

message GetSecretRequest {
  string vault = 1;
  string name = 2 [(google.api.field_behavior) = REQUIRED];
  uint64 generation = 3;
}

message ListSecretsRequest {
  string vault = 1 [(google.api.field_behavior) = REQUIRED];
}
"""
VAULT = "acme.vault.v1"


def _protoc_includes() -> list[str]:
    return [
        str(importlib.resources.files("grpc_tools") / "_proto"),  # google/protobuf/*.proto
        str(pathlib.Path(field_behavior_pb2.__file__).parents[2]),  # google/api/*.proto
    ]


def build_descriptor_set(
    directory: Any, files: dict[str, str], out: str = "api.binpb", include_imports: bool = True
) -> str:
    """Compile ``files`` (name -> .proto text) into a descriptor set in ``directory``."""
    root = pathlib.Path(directory)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    target = root / out
    args = ["protoc", *(f"-I{p}" for p in _protoc_includes()), f"-I{root}"]
    if include_imports:
        args.append("--include_imports")
    args += [f"--descriptor_set_out={target}", *files]
    if protoc.main(args) != 0:
        raise AssertionError(f"protoc failed on {', '.join(files)}")
    return str(target)


_VAULT_SET: list[str] = []


def vault_descriptor_set() -> str:
    """The VAULT_PROTO descriptor set, built once per test process."""
    if not _VAULT_SET:
        directory = tempfile.mkdtemp(prefix="plugproxy-vault-")
        _VAULT_SET.append(
            build_descriptor_set(directory, {"acme/vault/v1/vault.proto": VAULT_PROTO})
        )
    return _VAULT_SET[0]


def _serializer(response_class: Any) -> Callable[[Any], bytes]:
    def serialize(response: Any) -> bytes:
        if isinstance(response, bytes):
            return response
        assert isinstance(response, response_class)
        return bytes(response.SerializeToString())

    return serialize


def generic_servicer(
    descriptor_set: str, handlers: dict[str, Callable[..., Any]]
) -> grpc.GenericRpcHandler:
    """A gRPC servicer built from a descriptor set: ``handlers`` maps '/pkg.Service/Method'
    to ``async fn(request message, context) -> response`` (an async generator for
    server-streaming methods), a response being a message or its bytes; message classes
    come from the set's own pool."""
    pool = descriptor_pool.DescriptorPool()
    with open(descriptor_set, "rb") as f:
        fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    for fdp in fds.file:
        pool.Add(fdp)
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for path, fn in handlers.items():
        service_name, _, method_name = path.lstrip("/").rpartition("/")
        method = pool.FindServiceByName(service_name).methods_by_name[method_name]
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        by_service.setdefault(service_name, {})[method_name] = make(
            fn,
            request_deserializer=request_class.FromString,
            response_serializer=_serializer(response_class),
        )
    handlers_list = [grpc.method_handlers_generic_handler(s, m) for s, m in by_service.items()]

    class Servicer(grpc.GenericRpcHandler):
        def service(self, details: Any) -> grpc.RpcMethodHandler | None:
            for handler in handlers_list:
                found = handler.service(details)
                if found is not None:
                    return found
            return None

    return Servicer()
