"""The forwarder: every call type, metadata, trailers, status, deadlines and cancellation."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from plugproxy.spec.registry import load_spec
from tests.support import (
    ECHO,
    channel,
    relay,  # noqa: F401  # the fixture, found by name
    start_proxy,
    start_recorder,
    wait_until,
)

# Every test here runs on both relays: the frame relay and the gRPC one (TLS endpoints).
pytestmark = pytest.mark.usefixtures("relay")


@pytest.fixture
async def env(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    proxy = await start_proxy(listen, upstream)
    await proxy.upstream.wait_ready(5)
    async with channel(listen) as ch:
        yield ch, plugin, proxy
    await proxy.stop(0)
    await server.stop(0)


MD = (("x-custom", "v1"), ("x-custom-bin", b"\x00\xfe\x01"), ("csi.requestid", "42"))


async def test_unary_passes_bytes_metadata_and_trailers(env):
    ch, plugin, _ = env
    call = ch.unary_unary(ECHO + "Unary")(b"\x00payload\xff", metadata=MD, timeout=5)
    assert await call == b"echo:\x00payload\xff"
    assert plugin.last().requests == [b"\x00payload\xff"]
    seen = plugin.last().metadata
    assert seen["x-custom"] == "v1"
    assert seen["x-custom-bin"] == b"\x00\xfe\x01"
    assert seen["csi.requestid"] == "42"
    initial = dict(await call.initial_metadata())
    assert initial["x-initial"] == "hello"
    assert initial["x-initial-bin"] == b"\x00\x01"
    trailing = dict(await call.trailing_metadata())
    assert trailing["x-trailer"] == "bye"
    assert trailing["x-trailer-bin"] == b"\xff\x00"


async def test_server_streaming(env):
    ch, _, _ = env
    call = ch.unary_stream(ECHO + "ServerStream")(b"5", timeout=5)
    items = [m async for m in call]
    assert items == [b"item-%d" % i for i in range(5)]
    assert dict(await call.trailing_metadata())["x-trailer"] == "bye"
    assert dict(await call.initial_metadata())["x-initial"] == "hello"


async def test_client_streaming(env):
    ch, plugin, _ = env

    async def gen():
        for part in (b"a", b"bb", b"ccc"):
            yield part

    call = ch.stream_unary(ECHO + "ClientStream")(gen(), metadata=MD, timeout=5)
    assert await call == b"a|bb|ccc"
    assert plugin.last().metadata["x-custom"] == "v1"
    assert dict(await call.trailing_metadata())["x-trailer"] == "bye"


async def test_bidi_streaming(env):
    ch, _, _ = env
    call = ch.stream_stream(ECHO + "Bidi")(metadata=MD, timeout=5)
    for word in (b"one", b"two", b"three"):
        await call.write(word)
        assert await call.read() == b"re:" + word
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() is grpc.StatusCode.OK
    assert dict(await call.trailing_metadata())["x-trailer"] == "bye"


@pytest.mark.parametrize("method", ["Unary", "ServerStream", "ClientStream"])
async def test_error_status_message_details_and_metadata_pass(env, method):
    ch, _, _ = env
    details = b"\x08\x05\x12\x04gone"  # a google.rpc.Status, as bytes
    md = (
        ("x-fail-code", "NOT_FOUND"),
        ("x-fail-message", "volume vol-1 not found"),
        ("x-fail-details-bin", details),
    )
    if method == "Unary":
        call = ch.unary_unary(ECHO + method)(b"x", metadata=md, timeout=5)
    elif method == "ServerStream":
        call = ch.unary_stream(ECHO + method)(b"2", metadata=md, timeout=5)
    else:

        async def gen():
            yield b"x"

        call = ch.stream_unary(ECHO + method)(gen(), metadata=md, timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if method == "ServerStream":
            assert [m async for m in call] == [b"item-0", b"item-1"]
        else:
            await call
    err = info.value
    assert err.code() is grpc.StatusCode.NOT_FOUND
    assert err.details() == "volume vol-1 not found"
    trailing = dict(err.trailing_metadata())
    assert trailing["x-trailer"] == "error-trailer"
    assert trailing["grpc-status-details-bin"] == details
    assert dict(err.initial_metadata())["x-initial"] == "hello"


async def test_bidi_upstream_abort_while_client_keeps_writing(env):
    """The upstream's status reaches the CO, never a stray INTERNAL (lesson from the field).

    The CO here is grpc's synchronous client: its request iterator keeps producing after
    the plugin aborted, without corrupting its own view of the status (the asyncio client
    reports its own failed write as INTERNAL, with or without a proxy in between).
    """
    _, _, proxy = env
    target = f"unix:{proxy.resolved.listen.path}"
    md = (("x-fail-code", "ABORTED"), ("x-fail-message", "pending"))

    def run_calls() -> dict:
        outcomes: dict = {}
        with grpc.insecure_channel(target) as ch:
            for _ in range(60):

                def requests():
                    yield b"fail"
                    for _ in range(300):
                        yield b"more"

                try:
                    for _ in ch.stream_stream(ECHO + "Bidi")(requests(), metadata=md, timeout=5):
                        pass
                    key = ("OK", "")
                except grpc.RpcError as err:
                    key = (err.code().name, err.details())
                outcomes[key] = outcomes.get(key, 0) + 1
        return outcomes

    assert await asyncio.to_thread(run_calls) == {("ABORTED", "pending"): 60}


async def test_unknown_service_passes_through(env):
    ch, plugin, _ = env
    plugin.raw["/vendor.Private/Thing"] = lambda req: req[::-1]
    call = ch.unary_unary("/vendor.Private/Thing")(b"abc", metadata=MD, timeout=5)
    assert await call == b"cba"
    assert dict(await call.trailing_metadata())["x-trailer"] == "bye"
    assert plugin.last().metadata["x-custom"] == "v1"


async def test_known_method_bytes_identical_including_unknown_fields(env):
    ch, plugin, _ = env
    cls = load_spec("csi.v1").message_class("csi.v1.GetPluginInfoResponse")
    # field 99 is unknown to CSI: it must survive both ways untouched.
    unknown = b"\x9a\x06\x05hello"
    response = cls(name="fake.csi.example.com", vendor_version="1.0").SerializeToString() + unknown
    request = b"" + unknown
    plugin.raw["/csi.v1.Identity/GetPluginInfo"] = lambda req: response
    got = await ch.unary_unary("/csi.v1.Identity/GetPluginInfo")(request, timeout=5)
    assert got == response
    assert plugin.last().requests == [request]


async def test_deadline_propagates(env):
    ch, plugin, _ = env
    await ch.unary_unary(ECHO + "Unary")(b"x", timeout=3)
    remaining = plugin.last().time_remaining
    assert remaining is not None
    assert 2.0 < remaining <= 3.1  # grpc-timeout is rounded up to its unit


async def test_deadline_is_honoured_upstream(env):
    ch, plugin, _ = env
    start = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ch.unary_unary(ECHO + "Hang")(b"x", timeout=0.5)
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - start < 3
    await asyncio.wait_for(plugin.last().cancelled.wait(), 3)


async def test_cancel_propagates_promptly(env):
    ch, plugin, _ = env
    call = ch.unary_unary(ECHO + "Hang")(b"x", timeout=30)
    await wait_until(lambda: bool(plugin.seen) and plugin.last().method.endswith("Hang"))
    call.cancel()
    start = time.monotonic()
    await asyncio.wait_for(plugin.last().cancelled.wait(), 3)
    assert time.monotonic() - start < 1.0


async def test_large_messages_and_limit(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    proxy = await start_proxy(listen, upstream, "--max-message-bytes", "1MiB")
    plugin.raw["/test.Big/Response"] = lambda req: b"r" * (2 * 1024 * 1024)
    try:
        async with channel(listen) as ch:
            ok = b"x" * (1024 * 1024 - 64)
            assert await ch.unary_unary(ECHO + "Unary")(ok, timeout=5) == b"echo:" + ok
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ch.unary_unary(ECHO + "Unary")(b"x" * (1024 * 1024 + 10), timeout=5)
            assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ch.unary_unary("/test.Big/Response")(b"", timeout=5)
            assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max-message-bytes" in info.value.details()
            # The proxy carries on.
            assert await ch.unary_unary(ECHO + "Unary")(b"after", timeout=5) == b"echo:after"
    finally:
        await proxy.stop(0)
        await server.stop(0)


async def test_upstream_absent_then_present_then_restarted(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    # --plugin-wait 0: a call that finds no plugin fails at once (waiting is tested in
    # tests/test_relay_framerelay.py).
    proxy = await start_proxy(listen, upstream, "--plugin-wait", "0")
    try:
        async with channel(listen) as ch:
            start = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ch.unary_unary(ECHO + "Unary")(b"x", timeout=10)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE
            assert f"unix://{upstream}" in info.value.details()
            assert time.monotonic() - start < 3  # fails fast, not at the deadline
            assert proxy._upstream_ready()[0] is False

            server, _ = await start_recorder(upstream)
            assert await proxy.upstream.wait_ready(5)
            assert await ch.unary_unary(ECHO + "Unary")(b"x", timeout=5) == b"echo:x"

            await server.stop(0)
            server, _ = await start_recorder(upstream)
            deadline = time.monotonic() + 5
            while True:
                try:
                    assert await ch.unary_unary(ECHO + "Unary")(b"y", timeout=2) == b"echo:y"
                    break
                except grpc.aio.AioRpcError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            await server.stop(0)
    finally:
        await proxy.stop(0)


async def test_a_call_made_before_the_plugin_exists_waits_for_it(tmp_path):
    """Start order (sidecars first): the call waits within its deadline, /readyz says not
    ready meanwhile, and the call succeeds once the plugin listens."""
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    proxy = await start_proxy(listen, upstream)  # --plugin-wait defaults to 60 s
    server = None
    try:
        async with channel(listen) as ch:
            call = asyncio.ensure_future(ch.unary_unary(ECHO + "Unary")(b"early", timeout=20))
            await asyncio.sleep(1.5)
            assert not call.done()
            assert proxy._upstream_ready()[0] is False
            server, plugin = await start_recorder(upstream)
            assert await asyncio.wait_for(call, 15) == b"echo:early"
            assert plugin.last().requests == [b"early"]
    finally:
        await proxy.stop(0)
        if server is not None:
            await server.stop(0)


async def test_plugin_wait_bounds_how_long_a_call_waits(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    proxy = await start_proxy(listen, upstream, "--plugin-wait", "700ms")
    try:
        async with channel(listen) as ch:
            start = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ch.unary_unary(ECHO + "Unary")(b"x", timeout=10)
            waited = time.monotonic() - start
    finally:
        await proxy.stop(0)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert f"unix://{upstream}" in info.value.details()
    assert 0.6 < waited < 4


async def test_authority_is_localhost_toward_unix_upstream(tmp_path):
    """A raw HTTP/2 peer reads the :authority header the proxy sends."""
    h2_connection = pytest.importorskip("h2.connection")
    h2_config = pytest.importorskip("h2.config")
    h2_events = pytest.importorskip("h2.events")
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    seen: dict[str, str] = {}
    got = asyncio.Event()

    async def serve_h2(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2_connection.H2Connection(h2_config.H2Configuration(client_side=False))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        while not got.is_set():
            data = await reader.read(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2_events.RequestReceived):
                    for k, v in event.headers:
                        key = k.decode() if isinstance(k, bytes) else k
                        seen[key] = v.decode() if isinstance(v, bytes) else v
                    got.set()
            writer.write(conn.data_to_send())
        writer.close()

    h2_server = await asyncio.start_unix_server(serve_h2, upstream)
    proxy = await start_proxy(listen, upstream)
    try:
        async with channel(listen) as ch:
            call = ch.unary_unary(ECHO + "Unary")(b"x", timeout=2)
            await asyncio.wait_for(got.wait(), 5)
            call.cancel()
        assert seen[":authority"] == "localhost"
        assert seen[":path"] == ECHO + "Unary"
    finally:
        await proxy.stop(0)
        h2_server.close()


async def test_answers_larger_than_the_windows_keep_flowing_call_after_call(tmp_path):
    """Each answer is larger than the CO's stream window, so its end waits for credit and
    goes out later; together they pass the plugin connection's window several times, which
    only works if every byte that reaches the CO is credited back to the plugin."""
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    proxy = await start_proxy(listen, upstream, "--max-message-bytes", "4MiB")
    answer = b"r" * (1024 * 1024)
    plugin.raw["/test.Big/Response"] = lambda req: answer
    try:
        # No bandwidth probing: the CO's windows stay at 64 KiB, so every answer waits.
        options = [("grpc.http2.bdp_probe", 0)]
        async with grpc.aio.insecure_channel(f"unix:{listen}", options=options) as ch:
            for _ in range(24):  # 24 MiB: six times the 4 MiB connection window
                assert await ch.unary_unary("/test.Big/Response")(b"", timeout=5) == answer
    finally:
        await proxy.stop(0)
        await server.stop(0)
