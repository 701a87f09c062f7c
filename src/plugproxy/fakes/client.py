"""A small client for any spec, calling methods by RPC name; meant for tests and tools."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.message import Message

from plugproxy.api import MethodInfo
from plugproxy.fakes.common import DynMessage
from plugproxy.spec.registry import SPECS, Registry, load_spec


class SpecClient:
    """``await client.call("CreateVolume", name="v", ...)`` over one grpc.aio channel.

    Keyword fields build the request (nested messages as dicts, enums by name), or pass a
    ready request message. Errors surface as ``grpc.aio.AioRpcError``.
    """

    def __init__(self, target: str, spec: str, *, timeout: float = 10.0) -> None:
        self.spec = load_spec(spec)
        self.package = SPECS[spec][1]
        self.timeout = timeout
        self.methods: dict[str, MethodInfo] = {m.name: m for m in Registry([spec]).methods(spec)}
        self.channel = grpc.aio.insecure_channel(target)

    def new(self, short_name: str, **fields: Any) -> DynMessage:
        return self.spec.message_class(f"{self.package}.{short_name}")(**fields)

    def _request(self, info: MethodInfo, request: Message | None, fields: dict[str, Any]) -> Any:
        if request is not None:
            return request
        assert info.request_class is not None
        return info.request_class(**fields)

    def method(self, name: str) -> MethodInfo:
        try:
            return self.methods[name]
        except KeyError:
            raise ValueError(f"{name!r} is not a method of {self.spec.name}") from None

    async def call(
        self,
        rpc: str,
        request: Message | None = None,
        /,
        *,
        metadata: Sequence[tuple[str, str | bytes]] = (),
        timeout: float | None = None,
        **fields: Any,
    ) -> DynMessage:
        info = self.method(rpc)
        assert info.response_class is not None
        stub = self.channel.unary_unary(
            info.path,
            request_serializer=_serialize,
            response_deserializer=info.response_class.FromString,
        )
        return await stub(
            self._request(info, request, fields),
            metadata=tuple(metadata) or None,
            timeout=timeout or self.timeout,
        )

    async def stream(
        self,
        rpc: str,
        request: Message | None = None,
        /,
        *,
        metadata: Sequence[tuple[str, str | bytes]] = (),
        timeout: float | None = None,
        **fields: Any,
    ) -> list[DynMessage]:
        info = self.method(rpc)
        assert info.response_class is not None
        stub = self.channel.unary_stream(
            info.path,
            request_serializer=_serialize,
            response_deserializer=info.response_class.FromString,
        )
        call = stub(
            self._request(info, request, fields),
            metadata=tuple(metadata) or None,
            timeout=timeout or self.timeout,
        )
        return [message async for message in call]

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> SpecClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()
