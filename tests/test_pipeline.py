"""The stage seam: order, shared lazy decoding, rejects, failure modes, zero-cost disabled stages."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable

import grpc
import pytest

from plugproxy.api import Call, LazyMessage, MethodInfo, Reject, Stage, StatusCode
from plugproxy.core.log import Logger
from plugproxy.pipeline import compile_chain
from plugproxy.spec.registry import Registry, load_spec
from tests.support import channel, start_proxy, start_recorder

INFO = "/csi.v1.Identity/GetPluginInfo"
CSI = load_spec("csi.v1")


class Recording(Stage):
    def __init__(self, name: str, journal: list[str]) -> None:
        self.name = name  # type: ignore[misc]
        self.journal = journal
        self.decoded: list[object] = []

    async def on_start(self, call: Call) -> None:
        self.journal.append(f"{self.name}.start")
        assert call.request is not None
        self.decoded.append(call.request.message)

    def on_response(self, call: Call, message: LazyMessage) -> None:
        self.journal.append(f"{self.name}.response")
        self.decoded.append(message.message)

    def on_finish(self, call: Call) -> None:
        self.journal.append(f"{self.name}.finish:{call.code.name}")


class Rejecting(Stage):
    name = "rejecting"

    def on_start(self, call: Call) -> None:
        raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "rule x: field name is required")


class Broken(Stage):
    name = "broken"

    def __init__(self, fail_open: bool) -> None:
        self.fail_open = fail_open  # type: ignore[misc]

    def on_start(self, call: Call) -> None:
        raise RuntimeError("secret-value-in-message")


class NotInterested(Stage):
    name = "uninterested"

    def wants(self, method: MethodInfo) -> bool:
        return False

    def on_start(self, call: Call) -> None:
        raise AssertionError("never called")


@pytest.fixture
async def plugin_and_paths(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    server, plugin = await start_recorder(upstream)
    response = CSI.message_class("csi.v1.GetPluginInfoResponse")(
        name="fake.example.com", vendor_version="1"
    ).SerializeToString()
    plugin.raw[INFO] = lambda req: response
    yield plugin, upstream, str(tmp_path / "proxy.sock"), response
    await server.stop(0)


async def call_info(listen: str) -> tuple[bytes | None, grpc.aio.AioRpcError | None]:
    async with channel(listen) as ch:
        try:
            return await ch.unary_unary(INFO)(b"", timeout=5), None
        except grpc.aio.AioRpcError as err:
            return None, err


async def test_hooks_run_in_order_and_finish_in_reverse(plugin_and_paths):
    _, upstream, listen, response = plugin_and_paths
    journal: list[str] = []
    first, second = Recording("first", journal), Recording("second", journal)
    proxy = await start_proxy(listen, upstream, stages=[first, second])
    try:
        got, err = await call_info(listen)
    finally:
        await proxy.stop(0)
    assert err is None and got == response
    assert journal == [
        "first.start",
        "second.start",
        "first.response",
        "second.response",
        "second.finish:OK",
        "first.finish:OK",
    ]
    # Both stages saw the very same decoded objects: one decode per message, shared.
    assert first.decoded[0] is second.decoded[0]
    assert first.decoded[1] is second.decoded[1]
    assert first.decoded[1].name == "fake.example.com"


async def test_reject_answers_without_reaching_the_plugin(plugin_and_paths):
    plugin, upstream, listen, _ = plugin_and_paths
    journal: list[str] = []
    proxy = await start_proxy(
        listen,
        upstream,
        stages=[Recording("outer", journal), Rejecting(), Recording("inner", journal)],
    )
    try:
        _, err = await call_info(listen)
    finally:
        await proxy.stop(0)
    assert err is not None
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "rule x: field name is required"
    assert plugin.seen == []
    # The inner stage never started, so it never finishes; the outer one sees the reject.
    assert journal == ["outer.start", "outer.finish:INVALID_ARGUMENT"]


async def test_fail_closed_stage_blocks_fail_open_stage_does_not(plugin_and_paths):
    plugin, upstream, listen, response = plugin_and_paths
    proxy = await start_proxy(listen, upstream, stages=[Broken(fail_open=True)])
    try:
        got, err = await call_info(listen)
    finally:
        await proxy.stop(0)
    assert err is None and got == response

    proxy = await start_proxy(listen, upstream, stages=[Broken(fail_open=False)])
    try:
        _, err = await call_info(listen)
    finally:
        await proxy.stop(0)
    assert err is not None and err.code() is grpc.StatusCode.INTERNAL
    assert "broken stage failed" in err.details()
    assert "secret-value-in-message" not in err.details()
    assert len(plugin.seen) == 1  # only the fail-open run reached the plugin


class BrokenObserver(Stage):
    name = "observer"
    fail_open = False  # observers fail open whatever the stage says

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_start(self, call: Call) -> None:
        self.seen.append("start")

    def on_response(self, call: Call, message: LazyMessage) -> None:
        raise RuntimeError("secret-in-response")

    def on_finish(self, call: Call) -> None:
        self.seen.append("finish")
        raise KeyError("secret-in-finish")


class Watching(Stage):
    name = "watching"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_response(self, call: Call, message: LazyMessage) -> None:
        self.seen.append("response")

    def on_finish(self, call: Call) -> None:
        self.seen.append("finish")


def test_response_and_finish_hooks_that_raise_are_logged_and_the_call_goes_on():
    out = io.StringIO()
    method = Registry(["csi.v1"]).lookup(INFO)
    first, broken, last = Watching(), BrokenObserver(), Watching()
    chain = compile_chain([first, broken, last], method, Logger(out))
    assert chain is not None
    call = Call(method, (), [], None)
    assert chain.begin(call) is None
    chain.run_response(call, LazyMessage(b"", method.response_class))
    chain.run_finish(call)  # in reverse: last, broken, first
    assert broken.seen == ["start", "finish"]
    assert first.seen == last.seen == ["response", "finish"]
    lines = out.getvalue()
    assert '"hook":"on_response"' in lines and '"hook":"on_finish"' in lines
    assert '"error":"RuntimeError"' in lines and '"error":"KeyError"' in lines
    assert "secret-in" not in lines


def test_stage_that_wants_nothing_is_not_compiled_in():
    method = Registry(["csi.v1"]).lookup(INFO)
    assert compile_chain([NotInterested()], method, Logger(io.StringIO())) is None
    chain = compile_chain([NotInterested(), Rejecting()], method, Logger(io.StringIO()))
    assert chain is not None and chain.names == ("rejecting",)


def test_unknown_methods_get_no_chain_and_are_bidi():
    method = Registry().lookup("/vendor.X/Y")
    assert not method.known
    assert method.kind.name == "STREAM_STREAM"


class Waiting(Stage):
    """on_start as a plain function that returns an awaitable only when told to wait."""

    def __init__(self, name: str, journal: list[str], gate: asyncio.Event | None) -> None:
        self.name = name  # type: ignore[misc]
        self.journal = journal
        self.gate = gate
        self.fail_open = False  # type: ignore[misc]
        self.fail_after_wait = False

    def on_start(self, call: Call) -> Awaitable[None] | None:
        self.journal.append(f"{self.name}.start")
        return None if self.gate is None else self._wait()

    async def _wait(self) -> None:
        assert self.gate is not None
        await self.gate.wait()
        if self.fail_after_wait:
            raise RuntimeError("secret-value-in-message")
        self.journal.append(f"{self.name}.waited")

    def on_finish(self, call: Call) -> None:
        self.journal.append(f"{self.name}.finish")


def _call(method: MethodInfo) -> Call:
    call = Call(method, (), [], None)
    call.request = LazyMessage(b"", method.request_class)
    return call


async def test_begin_runs_hooks_inline_until_one_has_to_wait():
    method = Registry(["csi.v1"]).lookup(INFO)
    journal: list[str] = []
    gate = asyncio.Event()
    stages = [Waiting("a", journal, None), Waiting("b", journal, gate), Waiting("c", journal, None)]
    chain = compile_chain(stages, method, Logger(io.StringIO()))
    assert chain is not None
    # Nobody waits: everything ran before begin() returned, and there is nothing to await.
    quick = compile_chain([stages[0], stages[2]], method, Logger(io.StringIO()))
    assert quick is not None and quick.begin(_call(method)) is None
    assert journal == ["a.start", "c.start"]
    journal.clear()
    call = _call(method)
    pending = chain.begin(call)
    assert pending is not None
    assert journal == ["a.start", "b.start"] and call.started_stages == 2
    task = asyncio.ensure_future(pending)
    await asyncio.sleep(0)
    assert not task.done()
    gate.set()
    await task
    assert journal == ["a.start", "b.start", "b.waited", "c.start"]
    assert call.started_stages == 3
    chain.run_finish(call)
    assert journal[-3:] == ["c.finish", "b.finish", "a.finish"]


async def test_a_hook_failing_while_it_waits_keeps_its_failure_mode():
    method = Registry(["csi.v1"]).lookup(INFO)
    out = io.StringIO()
    gate = asyncio.Event()
    gate.set()
    stage = Waiting("w", [], gate)
    stage.fail_after_wait = True
    chain = compile_chain([stage], method, Logger(out))
    assert chain is not None
    pending = chain.begin(_call(method))
    assert pending is not None
    with pytest.raises(Reject) as caught:
        await pending
    assert caught.value.code is StatusCode.INTERNAL
    assert "secret-value-in-message" not in caught.value.message + out.getvalue()
    stage.fail_open = True  # type: ignore[misc]
    chain = compile_chain([stage], method, Logger(io.StringIO()))
    assert chain is not None
    pending = chain.begin(_call(method))
    assert pending is not None
    await pending  # logged and waved through
