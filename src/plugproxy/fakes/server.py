"""Serving a fake plugin: one generic handler for every method of the spec.

The handler is built from the spec's descriptors: each method path maps to the plugin
method named like the RPC, with the registry's request and response classes doing the
(de)serialization. Paths the plugin has no method for are left to gRPC, which answers
UNIMPLEMENTED.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from plugproxy.api import CallKind, MethodInfo
from plugproxy.core.endpoints import ConfigError, Endpoint, Scheme, parse_endpoint
from plugproxy.fakes import otel
from plugproxy.fakes.base import FakePlugin
from plugproxy.fakes.cmi import FakeCmiV1
from plugproxy.fakes.common import FakeError, ServicerContext
from plugproxy.fakes.cosi import FakeCosiV1Alpha1
from plugproxy.fakes.cosi_v1alpha2 import FakeCosiV1Alpha2
from plugproxy.fakes.csi_v0 import FakeCsiV0
from plugproxy.fakes.csi_v1 import FakeCsiV1
from plugproxy.fakes.deviceplugin import FakeDevicePluginV1Beta1
from plugproxy.fakes.dra import FakeDraV1
from plugproxy.fakes.kms import FakeKmsV2
from plugproxy.fakes.knobs import FakeKnobs, served_specs
from plugproxy.spec.registry import Registry

FAKE_SPECS: dict[str, type[FakePlugin]] = {
    "csi.v1": FakeCsiV1,
    "csi.v0": FakeCsiV0,
    "cosi.v1alpha1": FakeCosiV1Alpha1,
    "cosi.v1alpha2": FakeCosiV1Alpha2,
    "cmi.v1": FakeCmiV1,
    "kms.v2": FakeKmsV2,
    "deviceplugin.v1beta1": FakeDevicePluginV1Beta1,
    "dra.v1": FakeDraV1,  # and dra.v1beta1, drahealth.v1 and v1alpha1 on the same socket
}


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


async def _abort(context: ServicerContext, err: FakeError) -> None:
    await context.abort(err.code, err.message, err.trailing)


def _unary_handler(plugin: FakePlugin, info: MethodInfo) -> Any:
    async def behavior(request: Message, context: ServicerContext) -> Message | None:
        try:
            return await plugin.call_unary(info, request, context)
        except FakeError as err:
            await _abort(context, err)
            return None  # not reached: abort raises

    return grpc.unary_unary_rpc_method_handler(
        behavior, request_deserializer=_deserializer(info), response_serializer=_serialize
    )


def _stream_handler(plugin: FakePlugin, info: MethodInfo) -> Any:
    async def behavior(request: Message, context: ServicerContext) -> AsyncIterator[Message]:
        try:
            async for response in plugin.call_stream(info, request, context):
                yield response
        except FakeError as err:
            await _abort(context, err)

    return grpc.unary_stream_rpc_method_handler(
        behavior, request_deserializer=_deserializer(info), response_serializer=_serialize
    )


def _deserializer(info: MethodInfo) -> Callable[[bytes], Message]:
    assert info.request_class is not None
    return info.request_class.FromString


_KINDS: dict[CallKind, Callable[[FakePlugin, MethodInfo], Any]] = {
    CallKind.UNARY_UNARY: _unary_handler,
    CallKind.UNARY_STREAM: _stream_handler,
}


class FakeRpcHandler(grpc.GenericRpcHandler):  # type: ignore[misc, unused-ignore]
    """Routes every method of the plugin's spec to the plugin method of the same name."""

    def __init__(self, plugin: FakePlugin) -> None:
        self.plugin = plugin
        self.handlers: dict[str, Any] = {}
        served = served_specs(plugin.spec_name)
        registry = Registry(served)
        for info in (m for spec in served for m in registry.methods(spec)):
            factory = _KINDS.get(info.kind)
            if factory is not None and callable(getattr(plugin, info.name, None)):
                self.handlers[info.path] = factory(plugin, info)

    def service(self, handler_call_details: Any) -> Any:
        return self.handlers.get(handler_call_details.method)


@dataclass
class FakePluginHandle:
    """A running fake plugin: its grpc.aio server, the plugin object and where it listens."""

    server: Any  # grpc.aio.Server
    plugin: FakePlugin
    endpoint: Endpoint
    url: str  # listen URL with the real port for tcp://host:0
    target: str  # what a grpc channel dials

    async def stop(self, grace: float | None = None) -> None:
        await self.server.stop(grace)
        if self.endpoint.is_unix:
            _remove_socket(self.endpoint.path)


def _remove_socket(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


def _prepare_unix_path(path: str) -> None:
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise ConfigError(f"cannot listen on {path}: directory {directory} does not exist")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"cannot listen on {path}: a file that is not a socket is in the way")
    os.unlink(path)  # a stale socket from an earlier run


async def start_fake_plugin(
    spec: str, listen: str, knobs: FakeKnobs | None = None, *, tracer_provider: Any = None
) -> FakePluginHandle:
    """Start a fake plugin of ``spec`` on ``listen`` (unix:///path or tcp://host:port).

    With an OpenTelemetry ``tracer_provider`` every call gets a server span from
    opentelemetry-instrumentation-grpc (see :mod:`plugproxy.fakes.otel`); the caller owns
    the provider (flushing, shutdown).
    """
    plugin_class = FAKE_SPECS.get(spec)
    if plugin_class is None:
        raise ConfigError(f"no fake plugin for spec {spec!r}; choose from {', '.join(FAKE_SPECS)}")
    endpoint = parse_endpoint(listen, "fake plugin listen address")
    if endpoint.scheme is Scheme.TLS:
        raise ConfigError("the fake plugin serves plain unix:// or tcp:// only, not tls://")
    plugin = plugin_class(knobs)
    if endpoint.is_unix:
        _prepare_unix_path(endpoint.path)
    interceptors = None if tracer_provider is None else [otel.server_interceptor(tracer_provider)]
    server = grpc.aio.server(interceptors=interceptors)
    server.add_generic_rpc_handlers((FakeRpcHandler(plugin),))
    try:
        port = server.add_insecure_port(endpoint.grpc_target)
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen on {listen}: {exc}") from None
    if not endpoint.is_unix and port == 0:
        raise ConfigError(f"cannot listen on {listen}: the port is not available")
    await server.start()
    if endpoint.is_unix:
        url, target = f"unix://{endpoint.path}", endpoint.grpc_target
    else:
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        url, target = f"tcp://{host}:{port}", f"{host}:{port}"
    return FakePluginHandle(server, plugin, endpoint, url, target)
