"""Helpers for tests that use the fake plugins."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

import grpc

from plugproxy.fakes.client import SpecClient
from plugproxy.fakes.knobs import FakeKnobs
from plugproxy.fakes.server import FakePluginHandle, start_fake_plugin

STATUS_DETAILS_KEY = "grpc-status-details-bin"


@asynccontextmanager
async def running_fake(
    spec: str, directory: str | os.PathLike[str], knobs: FakeKnobs | None = None
) -> AsyncIterator[tuple[FakePluginHandle, SpecClient]]:
    """A fake plugin on ``<directory>/plugin.sock`` and a client connected to it."""
    handle = await start_fake_plugin(spec, f"unix://{os.fspath(directory)}/plugin.sock", knobs)
    client = SpecClient(handle.target, spec)
    try:
        yield handle, client
    finally:
        await client.close()
        await handle.stop(0)


async def expect_status(
    call: Awaitable[Any], code: grpc.StatusCode, *, contains: str = ""
) -> grpc.aio.AioRpcError:
    """Await ``call``; it must fail with ``code``, a non-empty message and no status details."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        assert err.code() == code, f"expected {code.name}, got {err.code().name}: {err.details()}"
        assert err.details(), "error status without a message"
        assert contains in (err.details() or ""), f"{contains!r} not in {err.details()!r}"
        keys = [k for k, _ in (err.trailing_metadata() or ())]
        assert STATUS_DETAILS_KEY not in keys, "error status carries status details"
        return err
    raise AssertionError(f"call succeeded, expected {code.name}")
