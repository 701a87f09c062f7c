"""The plugin connection of the proxy's own: state and unary calls, over both upstreams.

``Upstream`` speaks HTTP/2 itself (the frame relay's); ``GrpcUpstream`` uses a grpc channel
(the gRPC relay's). Both face a real grpc plugin on a UNIX socket and must agree.
"""

from __future__ import annotations

import asyncio
import gc
import io
import json
import socket
from typing import Any

import grpc
import pytest

from plugproxy.api import StatusCode, UpstreamError, UpstreamState
from plugproxy.core.endpoints import parse_endpoint
from plugproxy.core.log import Logger
from plugproxy.relay.grpcrelay import GrpcUpstream
from plugproxy.relay.upstream import Upstream, answer_margin, deadline_ran_out
from tests.support import wait_until
from tests.test_stages_metrics import ScriptedPlugin, start_plugin

INFO = "/csi.v1.Identity/GetPluginInfo"
PROBE = "/csi.v1.Identity/Probe"


@pytest.fixture(params=["frames", "grpc"])
def make_upstream(request: pytest.FixtureRequest) -> Any:
    def make(path: str, out: io.StringIO) -> Upstream:
        endpoint = parse_endpoint(f"unix://{path}")
        if request.param == "frames":
            return Upstream(endpoint, Logger(out), 1 << 20)
        return GrpcUpstream(endpoint, Logger(out), 1 << 20)

    return make


async def test_state_and_calls_follow_the_plugin(tmp_path, make_upstream):
    path = str(tmp_path / "plugin.sock")
    out = io.StringIO()
    upstream = make_upstream(path, out)
    seen: list[UpstreamState] = []
    upstream.add_listener(seen.append)
    upstream.start()
    try:
        await wait_until(lambda: "upstream not reachable yet" in out.getvalue())
        assert upstream.state is UpstreamState.DOWN
        with pytest.raises(UpstreamError) as down:
            await upstream.unary(INFO, b"", 1.0)
        assert down.value.code is StatusCode.UNAVAILABLE

        plugin = ScriptedPlugin()
        plugin.answer(INFO, b"\x0a\x03abc")
        plugin.fail(PROBE, grpc.StatusCode.FAILED_PRECONDITION, "not ready: disk")
        server = await start_plugin(path, plugin)
        assert await upstream.wait_ready(5)
        assert upstream.channel_is_ready()
        answer = await upstream.unary(INFO, b"", 2.0, [("x-request-id", "r1")])
        assert answer == b"\x0a\x03abc"
        assert plugin.seen[-1][0] == INFO
        assert plugin.seen[-1][1]["x-request-id"] == "r1"
        with pytest.raises(UpstreamError) as failed:
            await upstream.unary(PROBE, b"", 2.0)
        assert failed.value.code is StatusCode.FAILED_PRECONDITION
        assert failed.value.details == "not ready: disk"
        with pytest.raises(UpstreamError) as unknown:
            await upstream.unary("/csi.v1.Identity/Nothing", b"", 2.0)
        assert unknown.value.code is StatusCode.UNIMPLEMENTED

        plugin.answer(INFO, b"", delay=2.0)
        with pytest.raises(UpstreamError) as slow:
            await upstream.unary(INFO, b"", 0.2)
        assert slow.value.code is StatusCode.DEADLINE_EXCEEDED

        await server.stop(0)
        await wait_until(lambda: upstream.state is UpstreamState.DOWN)
        server = await start_plugin(path, plugin)
        plugin.answer(INFO, b"\x0a\x01x")
        await wait_until(lambda: upstream.state is UpstreamState.UP)
        assert await upstream.unary(INFO, b"", 2.0) == b"\x0a\x01x"
        assert seen == [
            UpstreamState.DOWN,
            UpstreamState.DOWN,
            UpstreamState.UP,
            UpstreamState.DOWN,
            UpstreamState.UP,
        ]
        await server.stop(0)
    finally:
        await upstream.close()


async def test_calls_in_flight_fail_unavailable_when_the_plugin_goes(tmp_path, make_upstream):
    path = str(tmp_path / "plugin.sock")
    upstream = make_upstream(path, io.StringIO())
    plugin = ScriptedPlugin()
    plugin.answer(INFO, b"", delay=5.0)
    server = await start_plugin(path, plugin)
    upstream.start()
    try:
        assert await upstream.wait_ready(5)
        pending = asyncio.ensure_future(upstream.unary(INFO, b"", 10.0))
        await wait_until(lambda: bool(plugin.seen))
        await server.stop(0)
        with pytest.raises(UpstreamError) as gone:
            await pending
        assert gone.value.code is StatusCode.UNAVAILABLE
    finally:
        await upstream.close()


@pytest.mark.parametrize("abandon", ["timeout", "cancel"])
async def test_a_call_given_up_on_leaves_no_unretrieved_error_at_close(
    tmp_path, make_upstream, abandon
):
    # A call of the proxy's own that timed out, or whose task shutdown cancelled, is failed
    # by close(); nothing awaits it any more, so asyncio must not print "Future exception
    # was never retrieved" on stderr as the proxy stops.
    gc.collect()  # what earlier tests left is not this test's
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    path = str(tmp_path / "plugin.sock")
    upstream = make_upstream(path, io.StringIO())
    plugin = ScriptedPlugin()
    plugin.answer(INFO, b"", delay=5.0)
    server = await start_plugin(path, plugin)
    upstream.start()
    try:
        assert await upstream.wait_ready(5)
        if abandon == "timeout":
            with pytest.raises(UpstreamError):
                await upstream.unary(INFO, b"", 0.2)
        else:
            pending = asyncio.ensure_future(upstream.unary(INFO, b"", 10.0))
            await wait_until(lambda: bool(plugin.seen))
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
        await upstream.close()
        await asyncio.sleep(0)
        gc.collect()
        await asyncio.sleep(0)
        assert [c["message"] for c in unhandled] == []
    finally:
        loop.set_exception_handler(None)
        await upstream.close()
        await server.stop(0)


async def test_a_socket_that_is_not_an_http2_server_is_never_up(tmp_path, make_upstream):
    path = str(tmp_path / "plugin.sock")
    accepted = 0

    def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_unix_server(hang_up, path)
    upstream = make_upstream(path, io.StringIO())
    seen: list[UpstreamState] = []
    upstream.add_listener(seen.append)
    upstream.start()
    try:
        await wait_until(lambda: accepted >= 2)
        await asyncio.sleep(1.0)
        assert UpstreamState.UP not in seen
        # Redialled with backoff, not in a tight loop (0.1 s doubling to 0.8 s).
        assert accepted <= 10
    finally:
        await upstream.close()
        server.close()


def _stale_socket(path: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()  # the file stays; nothing listens


# What is at the upstream path -> how the log, /readyz and a waiting call's UNAVAILABLE say
# why the plugin cannot be reached (and whether the log adds the typo hint).
WHY_DOWN = {
    "missing directory": ("directory {dir}/plugn does not exist", True),
    "regular file": ("not a socket (a regular file)", True),
    "directory": ("not a socket (a directory)", True),
    "nothing yet": ("no socket file (the plugin is not listening)", False),
    "stale socket": ("connection refused (a socket file, but nothing listens on it)", False),
}


@pytest.mark.parametrize("case", list(WHY_DOWN))
async def test_why_the_plugin_is_unreachable_is_said_in_one_set_of_words(
    tmp_path, make_upstream, case
):
    path = str(tmp_path / "plugin.sock")
    if case == "missing directory":
        path = str(tmp_path / "plugn" / "plugin.sock")
    elif case == "regular file":
        (tmp_path / "plugin.sock").write_text("")
    elif case == "directory":
        (tmp_path / "plugin.sock").mkdir()
    elif case == "stale socket":
        _stale_socket(path)
    words, hinted = WHY_DOWN[case]
    expected = words.format(dir=tmp_path)
    out = io.StringIO()
    upstream = make_upstream(path, out)
    upstream.start()
    try:
        await wait_until(lambda: "upstream not reachable yet" in out.getvalue())
        assert upstream.reason == expected
        assert upstream.is_down()
        await asyncio.sleep(0.5)  # redials say nothing more while the reason stays
        (line,) = [json.loads(x) for x in out.getvalue().splitlines()]
        assert line["event"] == "upstream not reachable yet"
        assert line["reason"] == expected
        assert ("typo" in line.get("hint", "")) is (case == "missing directory")
        assert ("hint" in line) is hinted
        assert upstream.unreachable_details(upstream.reason, 0.5, True) == (
            f"plugproxy: plugin unreachable: upstream unix://{path}: {expected}; "
            "waited 0.5 s, answered just before the call's deadline"
        )
    finally:
        await upstream.close()


async def test_the_reason_follows_the_path_while_the_state_stays_down(tmp_path, make_upstream):
    directory = tmp_path / "plugins"
    path = str(directory / "plugin.sock")
    upstream = make_upstream(path, io.StringIO())
    upstream.start()
    try:
        await wait_until(upstream.is_down)
        assert upstream.reason == f"directory {directory} does not exist"
        directory.mkdir()  # the driver made its directory; it does not listen yet
        assert upstream.reason == "no socket file (the plugin is not listening)"
        server = await start_plugin(path, ScriptedPlugin())
        assert await upstream.wait_ready(5)
        assert upstream.reason == "ready"
        await server.stop(0)
    finally:
        await upstream.close()


def test_a_waiting_call_is_answered_a_little_before_its_deadline():
    assert answer_margin(30.0) == pytest.approx(0.1)
    assert answer_margin(1.0) == pytest.approx(0.1)
    assert answer_margin(0.2) == pytest.approx(0.02)  # a tenth of a short deadline
    assert answer_margin(0.0) == 0.0
    # A CO's reset within that margin of its deadline is the deadline, not a cancellation.
    assert deadline_ran_out(0.05, 1.0)
    assert deadline_ran_out(-0.01, 1.0)
    assert not deadline_ran_out(0.5, 1.0)
    assert not deadline_ran_out(None, None)
