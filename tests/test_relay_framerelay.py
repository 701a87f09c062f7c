"""The frame relay: what a frame-level forwarder must get right beyond tests/test_proxy.py.

Real peers only: grpc servers and clients on temporary UNIX sockets, and an h2 client for
frames a gRPC client never sends on its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from plugproxy.api import Call, CallKind, LazyMessage, MethodInfo, Reject, Stage
from plugproxy.core.endpoints import parse_endpoint
from plugproxy.core.log import Logger
from plugproxy.relay.framerelay import FrameRelay
from plugproxy.relay.frames import DATA, frame
from plugproxy.relay.grpcwire import format_timeout, parse_timeout
from plugproxy.relay.upstream import Upstream
from plugproxy.spec.registry import load_spec
from tests.support import ECHO, channel, start_proxy, start_recorder

INFO = "/csi.v1.Identity/GetPluginInfo"
CREATE = "/csi.v1.Controller/CreateVolume"
CSI = load_spec("csi.v1")


class HoldingStage(Stage):
    """Holds calls that carry x-hold until released: the way serialization waits."""

    name = "holding"

    def __init__(self) -> None:
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def on_start(self, call: Call) -> None:
        if call.metadata_value("x-hold"):
            self.holding.set()
            await self.release.wait()


@pytest.fixture
async def recorder(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    yield plugin, upstream, listen
    await server.stop(0)


async def test_a_held_call_is_overtaken_then_sent_with_what_is_left_of_its_deadline(recorder):
    plugin, upstream, listen = recorder
    plugin.raw[INFO] = lambda request: b"info:" + request
    stage = HoldingStage()
    proxy = await start_proxy(listen, upstream, "--relay", "frames", stages=[stage])
    try:
        async with channel(listen) as ch:
            info = ch.unary_unary(INFO)
            held = asyncio.ensure_future(info(b"first", metadata=(("x-hold", "1"),), timeout=10))
            await asyncio.wait_for(stage.holding.wait(), 5)
            # Later calls on the same connection overtake the held one.
            assert await info(b"second", timeout=5) == b"info:second"
            assert await info(b"third", timeout=5) == b"info:third"
            await asyncio.sleep(0.3)
            stage.release.set()
            assert await held == b"info:first"
    finally:
        await proxy.stop(0)
    seen = [s for s in plugin.seen if s.method == INFO]
    assert [s.requests for s in seen] == [[b"second"], [b"third"], [b"first"]]
    remaining = seen[2].time_remaining
    assert remaining is not None and 5 < remaining < 9.7  # it waited at least 0.3 s of 10 s


# A plugin that keeps HTTP/2's default 64 KiB stream window (no window growth).
SMALL_WINDOW = (("grpc.http2.lookahead_bytes", 65535), ("grpc.http2.bdp_probe", 0))


async def test_a_request_larger_than_the_plugins_window_is_held_whole(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream, SMALL_WINDOW)
    plugin.raw[CREATE] = lambda request: hashlib.sha256(request).digest()
    proxy = await start_proxy(listen, upstream, "--relay", "frames", "--validation", "audit")
    request = CSI.message_class("csi.v1.CreateVolumeRequest")(name="big")
    for i in range(300):
        request.parameters[f"key-{i}"] = "v" * 1000
    raw = request.SerializeToString()
    assert len(raw) > 4 * 65535  # far beyond HTTP/2's default stream window
    try:
        async with channel(listen) as ch:
            got = await ch.unary_unary(CREATE)(raw, timeout=5)
    finally:
        await proxy.stop(0)
        await server.stop(0)
    assert got == hashlib.sha256(raw).digest()
    assert plugin.last().requests == [raw]


async def test_padding_priority_ping_and_unknown_frames_from_a_raw_http2_client(recorder):
    plugin, upstream, listen = recorder
    proxy = await start_proxy(listen, upstream, "--relay", "frames")
    reader, writer = await asyncio.open_unix_connection(listen)
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    conn.initiate_connection()
    conn.ping(b"pingpong")
    sid = conn.get_next_available_stream_id()
    conn.send_headers(
        sid,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", ECHO + "Unary"),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("x-custom", "kept"),
        ],
    )
    conn.prioritize(sid, weight=200)
    conn.send_data(sid, b"\x00\x00\x00\x00\x06padded", end_stream=True, pad_length=17)
    writer.write(conn.data_to_send() + frame(0xFA, 0, 0, b"unknown frame type"))
    pong, body, trailers = b"", b"", None
    try:
        while trailers is None:
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            assert chunk, "the relay closed the connection"
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.PingAckReceived):
                    pong = event.ping_data
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, sid)
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers = dict(event.headers)
            writer.write(conn.data_to_send())
    finally:
        writer.close()
        await proxy.stop(0)
    assert pong == b"pingpong"
    assert body == b"\x00\x00\x00\x00\x0becho:padded"
    assert trailers[b"grpc-status"] == b"0"
    assert plugin.last().requests == [b"padded"]
    assert plugin.last().metadata["x-custom"] == "kept"


def _grpc_headers(path: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


def _unary_request_bytes(path: str, payload: bytes) -> tuple[h2.connection.H2Connection, bytes]:
    """A whole unary call as a client writes it: preface, SETTINGS, HEADERS, DATA."""
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    conn.initiate_connection()
    conn.send_headers(1, _grpc_headers(path))
    conn.send_data(1, b"\x00" + len(payload).to_bytes(4, "big") + payload, end_stream=True)
    return conn, conn.data_to_send()


async def test_clients_that_send_their_call_before_reading_our_preface_are_served(recorder):
    """Old gRPC clients (grpc-go before ~1.20, and others until ~2023) write their whole first
    call before reading anything. Our SETTINGS must come first (RFC 9113 §3.4), whatever
    the plugin is doing, on every connection."""
    plugin, upstream, listen = recorder
    proxy = await start_proxy(listen, upstream, "--relay", "frames")
    try:
        for attempt in range(20):
            conn, request = _unary_request_bytes(ECHO + "Unary", b"old-%d" % attempt)
            reader, writer = await asyncio.open_unix_connection(listen)
            writer.write(request)
            head = await asyncio.wait_for(reader.readexactly(9), 5)
            assert head[3] == 0x4 and not head[4] & 0x1, "first frame is our SETTINGS"
            rest = await asyncio.wait_for(reader.readexactly(int.from_bytes(head[:3], "big")), 5)
            body, trailers = b"", None
            chunk = head + rest
            while trailers is None:
                for event in conn.receive_data(chunk):
                    if isinstance(event, h2.events.DataReceived):
                        body += event.data
                    elif isinstance(event, h2.events.TrailersReceived):
                        trailers = dict(event.headers)
                writer.write(conn.data_to_send())
                if trailers is None:
                    chunk = await asyncio.wait_for(reader.read(65536), 5)
                    assert chunk, "the relay closed the connection"
            writer.close()
            assert trailers[b"grpc-status"] == b"0"
            assert body[5:] == b"echo:old-%d" % attempt
    finally:
        await proxy.stop(0)
    assert len([s for s in plugin.seen if s.method == ECHO + "Unary"]) == 20


@pytest.mark.parametrize("path", [CREATE, ECHO + "Unary"], ids=["staged", "passthrough"])
async def test_a_request_cut_inside_its_message_fails_and_never_reaches_the_plugin(recorder, path):
    """A prefix that claims 200 bytes, 100 sent, then END_STREAM: INTERNAL, as gRPC servers
    answer, and the plugin never handles a request (it used to get an empty one)."""
    plugin, upstream, listen = recorder
    plugin.raw[CREATE] = lambda request: b""
    proxy = await start_proxy(listen, upstream, "--relay", "frames")
    try:
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        conn.initiate_connection()
        conn.send_headers(1, _grpc_headers(path))
        conn.send_data(1, b"\x00\x00\x00\x00\xc8" + b"x" * 50)
        reader, writer = await asyncio.open_unix_connection(listen)
        writer.write(conn.data_to_send())
        await asyncio.sleep(0.2)  # the first half arrives in a read of its own
        conn.send_data(1, b"y" * 50, end_stream=True)
        writer.write(conn.data_to_send())
        trailers = None
        while trailers is None:
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            assert chunk, "the relay closed the connection"
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    headers = dict(event.headers)
                    if b"grpc-status" in headers:
                        trailers = headers
            writer.write(conn.data_to_send())
        writer.close()
        await asyncio.sleep(0.2)
    finally:
        await proxy.stop(0)
    assert trailers[b"grpc-status"] == b"13"
    assert b"ended inside a message" in trailers[b"grpc-message"]
    assert [s for s in plugin.seen if s.method == path] == []


async def test_a_client_that_does_not_speak_http2_is_dropped_and_others_go_on(recorder):
    _, upstream, listen = recorder
    proxy = await start_proxy(listen, upstream, "--relay", "frames")
    try:
        reader, writer = await asyncio.open_unix_connection(listen)
        writer.write(b"GET / HTTP/1.1\r\nHost: plugin\r\n\r\n")
        # Read to the end: the relay closes the connection (the plugin's HTTP/2 SETTINGS
        # may come first, as any HTTP/2 server sends them at once).
        got = await asyncio.wait_for(reader.read(), 5)
        assert b"HTTP/1.1" not in got
        writer.close()
        async with channel(listen) as ch:
            assert await ch.unary_unary(ECHO + "Unary")(b"x", timeout=5) == b"echo:x"
    finally:
        await proxy.stop(0)


class StreamJudge(Stage):
    """Rejects a streamed request message that says b"stop"; records the sizes it judged."""

    name = "judge"

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def on_request(self, call: Call, message: LazyMessage) -> None:
        self.sizes.append(len(message.raw))
        if message.raw == b"stop":
            raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "plugproxy: judge: stop")


class EchoRegistry:
    """A registry that knows the recorder's client-streaming method (the specs have none)."""

    def __init__(self) -> None:
        path = ECHO + "ClientStream"
        self.known = MethodInfo(path, "test.Echo", "ClientStream", CallKind.STREAM_UNARY)

    def methods(self) -> list[MethodInfo]:
        return [self.known]

    def lookup(self, path: str) -> MethodInfo:
        service, _, name = path.strip("/").rpartition("/")
        return MethodInfo(path, service, name, CallKind.STREAM_STREAM)


async def test_streamed_requests_are_judged_whole_and_paced_by_the_plugins_window(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream, SMALL_WINDOW)
    logger = Logger(io.StringIO())
    up = Upstream(parse_endpoint(f"unix://{upstream}"), logger, 1 << 24)
    judge = StreamJudge()
    registry: Any = EchoRegistry()
    relay = FrameRelay(
        registry, up, [judge], logger, max_message_bytes=1 << 24, max_concurrent_calls=100
    )
    await relay.listen(parse_endpoint(f"unix://{listen}"))
    messages = [bytes([65 + i]) * 150_000 for i in range(5)]  # 750 kB: many windows' worth

    async def requests(items: list[bytes], pause_before_last: float = 0.0) -> Any:
        for index, item in enumerate(items):
            if index == len(items) - 1:
                await asyncio.sleep(pause_before_last)
            yield item

    try:
        async with channel(listen) as ch:
            stream = ch.stream_unary(ECHO + "ClientStream")
            assert await stream(requests(messages), timeout=20) == b"|".join(messages)
            assert judge.sizes == [150_000] * 5
            with pytest.raises(grpc.aio.AioRpcError) as err:
                # "never" follows the rejection: written at once, grpc's client can fail its
                # own write on the reset stream and report INTERNAL instead of the status.
                await stream(requests([b"go", b"stop", b"never"], 0.3), timeout=10)
    finally:
        await relay.stop(0)
        await up.close()
        await server.stop(0)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "plugproxy: judge: stop"
    assert plugin.seen[0].requests == messages
    assert b"stop" not in plugin.seen[-1].requests
    assert b"never" not in plugin.seen[-1].requests


def test_grpc_timeout_round_trips_in_the_finest_unit_that_fits():
    assert parse_timeout(b"250m") == pytest.approx(0.25)
    assert parse_timeout(b"3S") == 3.0
    assert parse_timeout(b"2H") == 7200.0
    assert parse_timeout(b"oops") is None
    assert parse_timeout(b"12x") is None
    assert format_timeout(0.25) == b"250000u"
    assert format_timeout(30.0) == b"30000000u"
    assert format_timeout(3600.0) == b"3600000m"
    assert len(format_timeout(10**9)) <= 9  # 8 digits and a unit, whatever the value
    for seconds in (0.000001, 0.5, 29.9, 86400.0):
        back = parse_timeout(format_timeout(seconds))
        assert back is not None and back <= seconds and back > seconds * 0.99


def test_frames_carry_their_length_type_flags_and_stream():
    raw = frame(DATA, 0x1, 7, b"abc")
    assert raw[:3] == b"\x00\x00\x03" and raw[3] == DATA and raw[4] == 0x1
    assert int.from_bytes(raw[5:9], "big") == 7 and raw[9:] == b"abc"
