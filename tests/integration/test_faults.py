"""Faults: malformed and oversized messages, a plugin killed, hung or restarted, overload,
SIGTERM under load, and the security defaults. Real gRPC peers; plugins and the proxy run as
real processes where a signal is part of the story."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from plugproxy.admin import server as admin
from plugproxy.api import Call, LazyMessage, Stage
from plugproxy.cli import serve
from plugproxy.cli.serve import ProxyServer
from plugproxy.core.endpoints import ConfigError
from plugproxy.fakes import FakeKnobs, SpecClient, start_fake_plugin
from plugproxy.net import sockets
from plugproxy.net.sockets import socket_answers
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

REPO = Path(__file__).resolve().parents[2]
CREATE = "/csi.v1.Controller/CreateVolume"
PLUGIN_INFO = "/csi.v1.Identity/GetPluginInfo"
# Field 1 (name) claims 127 bytes of content that are not there: no decoder accepts it.
MALFORMED = b"\x0a\x7fpvc-1"
SECRET = "s3cr3t-t0ken-value-9f8e7d"
GRACE = 6


def violations(proxy: ProxyServer, rule_suffix: str, party: str) -> float:
    total = 0.0
    for family in proxy.metrics.collect():
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "plugproxy_violations_total"
                and labels.get("rule", "").endswith(rule_suffix)
                and labels.get("party") == party
            ):
                total += sample.value
    return total


async def outcome(call: Awaitable[Any]) -> tuple[grpc.StatusCode, Any]:
    """(code, response or details) of one call; never raises for a gRPC status."""
    try:
        return grpc.StatusCode.OK, await call
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or ""


# -- processes ----------------------------------------------------------------------------


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "plugproxy", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
    finally:
        out.close()


def spawn_fake(sock: Path, log: Path, *knobs: str) -> subprocess.Popen[bytes]:
    return spawn(["fake-plugin", "--spec", "csi.v1", "--listen", f"unix://{sock}", *knobs], log)


async def wait_socket(sock: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not socket_answers(str(sock), 0.2):
        if proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before listening")
        if time.monotonic() > deadline:
            raise AssertionError(f"{sock} did not start listening in time")
        await asyncio.sleep(0.02)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()  # SIGKILL ends a stopped process too
    proc.wait(10)


def create_request(client: SpecClient, name: str) -> Any:
    cap = client.new("VolumeCapability", mount={}, access_mode={"mode": "SINGLE_NODE_WRITER"})
    return client.new("CreateVolumeRequest", name=name, volume_capabilities=[cap])


@asynccontextmanager
async def fake_behind_proxy(
    tmp_path: Path, *knobs: str, proxy_args: tuple[str, ...] = ()
) -> AsyncIterator[tuple[subprocess.Popen[bytes], ProxyServer, SpecClient]]:
    plugin_sock, listen = tmp_path / "plugin.sock", tmp_path / "proxy.sock"
    proc = spawn_fake(plugin_sock, tmp_path / "plugin.log", *knobs)
    procs = [proc]
    proxy: ProxyServer | None = None
    client: SpecClient | None = None
    try:
        await wait_socket(plugin_sock, proc)
        proxy = await start_proxy(str(listen), str(plugin_sock), *proxy_args)
        assert await proxy.upstream.wait_ready(10)
        client = SpecClient(f"unix:{listen}", "csi.v1")
        yield proc, proxy, client
    finally:
        if client is not None:
            await client.close()
        if proxy is not None:
            await proxy.stop(0)
        for p in procs:
            stop_process(p)


async def first_success(client: SpecClient, limit: float) -> float:
    """Seconds until GetPluginInfo through the proxy succeeds (AssertionError past limit)."""
    start = time.monotonic()
    while True:
        code, _ = await outcome(client.call("GetPluginInfo", timeout=1.0))
        elapsed = time.monotonic() - start
        if code is grpc.StatusCode.OK:
            return elapsed
        assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), code
        assert elapsed < limit, f"no successful call {elapsed:.2f}s after the plugin came back"
        await asyncio.sleep(0.02)


# -- malformed messages ---------------------------------------------------------------------


async def test_malformed_request_audit_is_forwarded_unchanged_and_counted(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    plugin.raw[CREATE] = lambda req: b"plugin-answer"
    proxy = await start_proxy(listen, upstream, "--validation", "audit")
    try:
        async with channel(listen) as ch:
            answer = await ch.unary_unary(CREATE)(MALFORMED, timeout=5)
        assert answer == b"plugin-answer"
        assert plugin.last().requests == [MALFORMED]
        assert violations(proxy, "malformed-message", "co") == 1
    finally:
        await proxy.stop(0)
        await server.stop(0)


async def test_malformed_request_enforce_is_answered_invalid_argument(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    plugin.raw[CREATE] = lambda req: b""
    proxy = await start_proxy(listen, upstream, "--validation", "enforce")
    try:
        async with channel(listen) as ch:
            code, details = await outcome(ch.unary_unary(CREATE)(MALFORMED, timeout=5))
            assert code is grpc.StatusCode.INVALID_ARGUMENT
            assert "cannot decode csi.v1.CreateVolumeRequest" in details
            assert not any(s.method == CREATE for s in plugin.seen)
            assert violations(proxy, "malformed-message", "co") == 1
            # The proxy carries on with well-formed calls.
            plugin.raw[PLUGIN_INFO] = lambda req: b"\x0a\x03abc"
            assert await ch.unary_unary(PLUGIN_INFO)(b"", timeout=5) == b"\x0a\x03abc"
    finally:
        await proxy.stop(0)
        await server.stop(0)


@pytest.mark.parametrize("mode", ["audit", "enforce"])
async def test_malformed_response_is_relayed_unchanged_and_counted(tmp_path, mode):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    plugin.raw[PLUGIN_INFO] = lambda req: MALFORMED
    proxy = await start_proxy(listen, upstream, "--validation", mode)
    try:
        async with channel(listen) as ch:
            assert await ch.unary_unary(PLUGIN_INFO)(b"", timeout=5) == MALFORMED
        assert violations(proxy, "malformed-message", "plugin") == 1
    finally:
        await proxy.stop(0)
        await server.stop(0)


# -- oversized messages ---------------------------------------------------------------------


async def test_oversized_both_directions_leave_concurrent_calls_unaffected(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    limit = 64 * 1024
    big = b"\x0a" + b"\x80\x80\x04" + b"n" * 65536  # GetPluginInfoResponse.name of 64 KiB
    plugin.raw[PLUGIN_INFO] = lambda req: big
    proxy = await start_proxy(listen, upstream, "--max-message-bytes", "64KiB")
    try:
        async with channel(listen) as ch:
            echo = ch.unary_unary(ECHO + "Unary")
            normal = [echo(b"n%d" % i * 100, timeout=10) for i in range(40)]
            big_requests = [
                ch.unary_unary(CREATE)(b"\x0a\x80\x80\x08" + b"v" * 131072, timeout=10)
                for _ in range(5)
            ]
            big_responses = [ch.unary_unary(PLUGIN_INFO)(b"", timeout=10) for _ in range(5)]
            results = await asyncio.gather(
                *(outcome(c) for c in [*normal, *big_requests, *big_responses])
            )
        for i, (code, answer) in enumerate(results[:40]):
            assert code is grpc.StatusCode.OK
            assert answer == b"echo:" + b"n%d" % i * 100
        for code, details in results[40:45]:
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert str(limit) in details, details  # names the limit it broke
        for code, details in results[45:]:
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-message-bytes" in details, details
        assert len(big) > limit
        # Nothing of the oversized requests reached the plugin.
        assert not any(s.method == CREATE for s in plugin.seen)
    finally:
        await proxy.stop(0)
        await server.stop(0)


# -- plugin killed, restarted, hung -----------------------------------------------------------


async def test_plugin_killed_mid_call_then_restarted_without_proxy_restart(tmp_path):
    async with fake_behind_proxy(tmp_path, "--delay", "CreateVolume=30") as (proc, _proxy, client):
        calls = [
            asyncio.ensure_future(
                outcome(client.call("CreateVolume", create_request(client, f"pvc-{i}"), timeout=60))
            )
            for i in range(8)
        ]
        await asyncio.sleep(1.0)  # the calls are with the plugin, which sleeps on them
        assert not any(c.done() for c in calls)
        killed = time.monotonic()
        proc.kill()
        results = await asyncio.wait_for(asyncio.gather(*calls), 10)
        ended_after = time.monotonic() - killed
        for code, details in results:
            assert code is grpc.StatusCode.UNAVAILABLE, (code, details)
            assert details
        assert ended_after < 2.0, f"calls in flight took {ended_after:.2f}s to end"
        proc.wait(5)

        # The plugin comes back on the same socket; the same proxy serves it again.
        restarted = spawn_fake(tmp_path / "plugin.sock", tmp_path / "plugin2.log")
        try:
            await wait_socket(tmp_path / "plugin.sock", restarted)
            recovered = await first_success(client, limit=3.0)
            assert recovered < 1.5, f"calls failed for {recovered:.2f}s after the restart"
            response = await client.call("CreateVolume", create_request(client, "pvc-after"))
            assert response.volume.volume_id
        finally:
            stop_process(restarted)


async def test_hung_plugin_deadline_is_honoured_and_proxy_recovers(tmp_path):
    async with fake_behind_proxy(tmp_path) as (proc, _proxy, client):
        assert (await client.call("GetPluginInfo")).name
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            calls = [client.call("GetPluginInfo", timeout=1.0) for _ in range(5)]
            results = await asyncio.wait_for(asyncio.gather(*(outcome(c) for c in calls)), 10)
            took = time.monotonic() - start
            assert all(code is grpc.StatusCode.DEADLINE_EXCEEDED for code, _ in results), results
            assert took < 2.5, f"a 1 s deadline took {took:.2f}s to be honoured"
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        recovered = await first_success(client, limit=3.0)
        assert recovered < 2.0


# -- a plugin that is down: what a call and the log say ---------------------------------------


class Printed:
    """The proxy's log lines so far (an in-process proxy writes them to stdout)."""

    def __init__(self, capfd: pytest.CaptureFixture[str]) -> None:
        self.capfd = capfd
        self.text = ""

    def events(self, event: str) -> list[dict[str, Any]]:
        self.text += self.capfd.readouterr().out
        lines = [json.loads(x) for x in self.text.splitlines() if x.startswith("{")]
        return [line for line in lines if line.get("event") == event]

    async def calls(self, count: int = 1) -> list[dict[str, Any]]:
        """The first ``count`` call lines, once the proxy has written them."""
        await wait_until(lambda: len(self.events("call")) >= count)
        return self.events("call")[:count]


async def test_a_call_waiting_for_a_down_plugin_hears_why_before_its_deadline(tmp_path, capfd):
    """--plugin-wait (60 s) is longer than any CO's deadline: the call is answered just
    before its own, with the cause, instead of a bare DEADLINE_EXCEEDED at it."""
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    printed = Printed(capfd)
    proxy = await start_proxy(listen, upstream)
    try:
        async with channel(listen) as ch:
            await ch.channel_ready()
            start = time.monotonic()
            code, details = await outcome(ch.unary_unary(PLUGIN_INFO)(b"", timeout=1))
            took = time.monotonic() - start
            (line,) = await printed.calls()
    finally:
        await proxy.stop(0)
    assert code is grpc.StatusCode.UNAVAILABLE, (code, details)
    assert details.startswith(
        f"plugproxy: plugin unreachable: upstream unix://{upstream}: "
        "no socket file (the plugin is not listening); waited 0."
    ), details
    assert details.endswith("answered just before the call's deadline"), details
    assert 0.75 < took < 1.0
    # The log, the metrics and the trace have the outcome the CO got.
    assert line["code"] == "UNAVAILABLE"
    assert line["message"] == details
    assert line["duration_ms"] < 1000


async def test_a_caller_that_cancels_a_waiting_call_is_logged_as_cancelled(tmp_path, capfd):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    printed = Printed(capfd)
    proxy = await start_proxy(listen, upstream)
    try:
        async with channel(listen) as ch:
            call = ch.unary_unary(PLUGIN_INFO)(b"", timeout=10)
            await asyncio.sleep(0.5)
            call.cancel()
            (line,) = await printed.calls()
    finally:
        await proxy.stop(0)
    assert line["code"] == "CANCELLED"
    assert line["message"] == "cancelled by the caller"
    assert line["duration_ms"] < 2000


async def test_a_deadline_that_runs_out_at_the_plugin_is_not_a_cancellation(tmp_path, capfd):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    printed = Printed(capfd)
    fake = await start_fake_plugin(
        "csi.v1", f"unix://{upstream}", FakeKnobs(delays={"GetPluginInfo": 5.0})
    )
    proxy = await start_proxy(listen, upstream)
    try:
        assert await proxy.upstream.wait_ready(5)
        async with channel(listen) as ch:
            code, _ = await outcome(ch.unary_unary(PLUGIN_INFO)(b"", timeout=0.5))
            (line,) = await printed.calls()
    finally:
        await proxy.stop(0)
        await fake.stop(0)
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED
    # Whichever came first, the plugin's DEADLINE_EXCEEDED or the CO's reset at its
    # deadline, the log has what the CO saw.
    assert line["code"] == "DEADLINE_EXCEEDED", line
    assert "cancelled" not in line.get("message", ""), line


@pytest.mark.parametrize("problem", ["missing directory", "regular file"])
async def test_an_upstream_path_that_can_never_answer_is_named(tmp_path, capfd, problem):
    if problem == "missing directory":  # a typo in --upstream
        upstream = tmp_path / "plugn" / "csi.sock"
        said = f"directory {tmp_path / 'plugn'} does not exist"
    else:
        upstream = tmp_path / "csi.sock"
        upstream.write_text("")
        said = "not a socket (a regular file)"
    listen = str(tmp_path / "proxy.sock")
    printed = Printed(capfd)
    proxy = await start_proxy(listen, str(upstream), "--plugin-wait", "300ms")
    try:
        await wait_until(lambda: bool(printed.events("upstream not reachable yet")))
        ready, readiness = proxy._upstream_ready()
        async with channel(listen) as ch:
            code, details = await outcome(ch.unary_unary(PLUGIN_INFO)(b"", timeout=10))
        await asyncio.sleep(0.5)  # the proxy keeps redialling: no more lines about it
    finally:
        await proxy.stop(0)
    # One line at start-up says why, and what to check.
    (warning,) = printed.events("upstream not reachable yet")
    assert warning["level"] == "warning"
    assert warning["upstream"] == f"unix://{upstream}"
    assert warning["reason"] == said
    assert "check --upstream" in warning["hint"]
    assert not printed.events("upstream unavailable")
    # /readyz and the call say it in the same words.
    assert not ready
    assert readiness == f"upstream unix://{upstream}: {said}"
    assert code is grpc.StatusCode.UNAVAILABLE
    assert details.startswith(
        f"plugproxy: plugin unreachable: upstream unix://{upstream}: {said}; waited 0."
    ), details
    assert details.endswith(" s (--plugin-wait)"), details


# -- overload ---------------------------------------------------------------------------------


async def test_max_concurrent_calls_answers_resource_exhausted_past_the_limit(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    proxy = await start_proxy(listen, upstream, "--max-concurrent-calls", "4")
    try:
        async with channel(listen) as ch:
            slow = ch.unary_unary(ECHO + "Slow")
            ended: list[float] = []
            start = time.monotonic()

            async def one() -> tuple[grpc.StatusCode, Any]:
                result = await outcome(slow(b"2", timeout=20))
                ended.append(time.monotonic() - start)
                return result

            results = await asyncio.gather(*(one() for _ in range(16)))
            codes = [code for code, _ in results]
            assert codes.count(grpc.StatusCode.OK) == 4, codes
            assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 12, codes
            assert all(d for code, d in results if code is not grpc.StatusCode.OK)
            assert sum(1 for s in plugin.seen if s.method == ECHO + "Slow") == 4
            assert sorted(ended)[11] < 1.5  # refused at once, not queued behind the slow ones
            # Every slot was given back.
            again = await asyncio.gather(*(outcome(slow(b"0.01", timeout=10)) for _ in range(4)))
            assert [code for code, _ in again] == [grpc.StatusCode.OK] * 4
    finally:
        await proxy.stop(0)
        await server.stop(0)


# -- SIGTERM under load -----------------------------------------------------------------------


async def test_sigterm_under_load_every_call_ends_and_in_flight_ones_complete(tmp_path):
    upstream, listen = tmp_path / "plugin.sock", tmp_path / "proxy.sock"
    server, plugin = await start_recorder(str(upstream))
    log = tmp_path / "proxy.log"
    proxy = spawn(
        [
            "serve",
            "--listen",
            f"unix://{listen}",
            "--upstream",
            f"unix://{upstream}",
            "--admin-listen",
            "off",
            "--shutdown-grace",
            f"{GRACE}s",
        ],
        log,
    )
    try:
        await wait_socket(listen, proxy)
        async with channel(str(listen)) as ch:
            slow = ch.unary_unary(ECHO + "Slow")
            assert await slow(b"0", timeout=10) == b"slow-done"
            sigterm_at: list[float] = []
            in_flight: set[str] = set()
            records: dict[str, tuple[float, float, grpc.StatusCode, str]] = {}

            async def one(i: int) -> None:
                await asyncio.sleep(0.02 * i)  # staggered over 1.6 s
                duration = 0.1 + (i * 37 % 23) / 10  # 0.1 .. 2.3 s
                started = time.monotonic()
                md = (("x-call", str(i)),)
                code, answer = await outcome(slow(b"%.2f" % duration, timeout=15, metadata=md))
                records[str(i)] = (started, time.monotonic(), code, str(answer))

            async def terminate() -> None:
                await asyncio.sleep(0.8)
                # The plugin runs on this loop: what it has seen now is exactly what is in
                # flight (or done) when the proxy gets the signal.
                in_flight.update(
                    s.metadata["x-call"] for s in plugin.seen if "x-call" in s.metadata
                )
                in_flight.difference_update(records)
                sigterm_at.append(time.monotonic())
                proxy.send_signal(signal.SIGTERM)

            await asyncio.wait_for(asyncio.gather(terminate(), *(one(i) for i in range(80))), 20)
        exit_code = await asyncio.to_thread(proxy.wait, 15)
        assert exit_code == 0
        term = sigterm_at[0]
        assert len(records) == 80  # every call the client started ended
        forwarded = {s.metadata["x-call"] for s in plugin.seen if "x-call" in s.metadata}
        ok = {i for i, r in records.items() if r[2] is grpc.StatusCode.OK}
        # Everything the proxy forwarded completed, and only those: nothing vanished.
        assert ok == forwarded
        # The calls in flight at SIGTERM, long ones included, completed within the grace.
        assert len(in_flight) >= 10 and in_flight <= ok
        assert max(records[i][1] for i in in_flight) > term + 1.0
        refused = [r for i, r in records.items() if i not in ok]
        assert refused  # calls kept coming after the signal
        for started, ended, code, details in refused:
            # Never handed to the proxy: refused by the closed listener (UNAVAILABLE), or
            # cancelled by gRPC if still queued inside it at the signal. A call racing the
            # signal itself may be held by gRPC until the grace ends ("Cancelling all
            # calls"); none outlives the grace or its deadline.
            when = (round(started - term, 3), round(ended - term, 3))
            assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), (
                code,
                details,
                when,
            )
            assert ended - started < 2.0 or ended - term < GRACE + 1.0, (code, details, when)
        assert sum(1 for r in refused if r[1] - r[0] < 2.0) >= len(refused) - 2
        text = log.read_text()
        assert '"event":"shutting down"' in text and '"event":"stopped"' in text
        assert not listen.exists()
    finally:
        stop_process(proxy)
        await server.stop(0)


# -- security defaults --------------------------------------------------------------------------


async def test_listen_socket_is_0660_and_never_wider_while_created(tmp_path, monkeypatch):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    at_bind: list[int] = []
    restrict = serve.restrict_socket

    def spy(path: str, mode: int) -> None:
        at_bind.append(stat.S_IMODE(os.lstat(path).st_mode))
        restrict(path, mode)

    monkeypatch.setattr(serve, "restrict_socket", spy)
    old = os.umask(0)  # the most permissive environment a container could give us
    try:
        proxy = await start_proxy(listen, upstream)
    finally:
        os.umask(old)
    try:
        assert at_bind == [0o660]  # created with its mode: never wider, not even briefly
        assert stat.S_ISSOCK(os.lstat(listen).st_mode)
        assert stat.S_IMODE(os.lstat(listen).st_mode) == 0o660
    finally:
        await proxy.stop(0)


def test_socket_chmod_does_not_follow_a_swapped_in_symlink(tmp_path):
    target = tmp_path / "victim"
    target.write_text("")
    target.chmod(0o600)
    link = tmp_path / "proxy.sock"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="no longer our socket"):
        sockets.restrict_socket(str(link), 0o666)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


async def test_listen_path_symlink_is_refused(tmp_path):
    target = tmp_path / "elsewhere.sock"
    target.write_text("keep")
    target.chmod(0o600)
    link = tmp_path / "proxy.sock"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="symlink"):
        await start_proxy(str(link), str(tmp_path / "plugin.sock"))
    # Neither the link nor what it points to was replaced or re-moded.
    assert link.is_symlink() and target.read_text() == "keep"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_admin_server_binds_localhost_by_default():
    ns = serve.parse_args(["--listen", "unix:///x.sock", "--upstream", "unix:///y.sock"], {})
    assert admin.parse_admin_listen(ns.admin_listen) == ("127.0.0.1", 9808)
    assert admin.parse_admin_listen(":9000") == ("127.0.0.1", 9000)  # no host: still local


async def test_admin_server_listens_on_loopback_only(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    proxy = await start_proxy(listen, upstream, "--admin-listen", "127.0.0.1:0")
    try:
        assert proxy.admin is not None
        host = proxy.admin._server.server_address[0]
        assert host == "127.0.0.1"
        url = f"http://127.0.0.1:{proxy.admin.port}/healthz"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        assert body == b"ok"
    finally:
        await proxy.stop(0)


def get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        body: bytes = response.read()
    return body


async def test_failing_calls_leave_no_tasks_behind(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    plugin.raw[PLUGIN_INFO] = lambda req: b"\x0a\x03abc"
    proxy = await start_proxy(
        listen, upstream, "--admin-listen", "127.0.0.1:0", "--max-message-bytes", "1KiB"
    )
    assert proxy.admin is not None
    port = proxy.admin.port
    try:
        async with channel(listen) as ch:
            await ch.unary_unary(PLUGIN_INFO)(b"", timeout=5)
            baseline = int(await asyncio.to_thread(get, port, "/debug/tasks"))
            assert baseline > 0
            fail = (("x-fail-code", "NOT_FOUND"), ("x-fail-message", "no such volume"))
            for _ in range(3):
                calls = [
                    ch.unary_unary(PLUGIN_INFO)(b"", timeout=5),
                    ch.unary_unary(CREATE)(MALFORMED, timeout=5),
                    ch.unary_unary(CREATE)(b"x" * 4096, timeout=5),
                    ch.unary_unary(ECHO + "Unary")(b"x", timeout=5, metadata=fail),
                    ch.unary_unary(ECHO + "Hang")(b"", timeout=0.2),
                    ch.unary_stream(ECHO + "ServerStream")(b"5", timeout=5),
                ]
                cancelled = ch.unary_unary(ECHO + "Hang")(b"", timeout=30)
                await asyncio.sleep(0.1)
                cancelled.cancel()
                for call in calls[:-1]:
                    await outcome(call)
                assert len([m async for m in calls[-1]]) == 5
            deadline = time.monotonic() + 5
            while (now := int(await asyncio.to_thread(get, port, "/debug/tasks"))) > baseline:
                assert time.monotonic() < deadline, f"{now} tasks alive, {baseline} before"
                await asyncio.sleep(0.05)
    finally:
        await proxy.stop(0)
        await server.stop(0)


def test_container_image_runs_as_non_root():
    dockerfile = (REPO / "Dockerfile").read_text()
    users = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    assert users, "the image sets no USER"
    uid = users[-1].split(":")[0]
    assert uid not in ("0", "root")


class _Leaky(Stage):
    """Raises with a secret in the exception text from every hook."""

    name = "leaky"
    fail_open = False

    def on_start(self, call: Call) -> None:
        if call.metadata_value("x-leak") == "start":
            raise RuntimeError(f"bad token {SECRET}")

    def on_response(self, call: Call, message: LazyMessage) -> None:
        raise ValueError(f"response had {SECRET}")

    def on_finish(self, call: Call) -> None:
        raise KeyError(SECRET)


class _LeakyAsync(Stage):
    name = "leaky-async"
    fail_open = True

    async def on_start(self, call: Call) -> None:
        raise OSError(f"async {SECRET}")


async def test_stage_exceptions_never_print_their_text(tmp_path, capfd):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    plugin.raw[PLUGIN_INFO] = lambda req: b"\x0a\x03abc"
    proxy = await start_proxy(listen, upstream, stages=[_LeakyAsync(), _Leaky()])
    try:
        async with channel(listen) as ch:
            info = ch.unary_unary(PLUGIN_INFO)
            code, details = await outcome(info(b"", timeout=5, metadata=(("x-leak", "start"),)))
            assert code is grpc.StatusCode.INTERNAL
            assert details == "plugproxy: leaky stage failed"
            # Response and finish hooks fail open: the plugin's answer still arrives.
            assert await info(b"", timeout=5) == b"\x0a\x03abc"
    finally:
        await proxy.stop(0)
        await server.stop(0)
    out, err = capfd.readouterr()
    assert SECRET not in out and SECRET not in err
    for error_type in ("RuntimeError", "ValueError", "KeyError", "OSError"):
        assert f'"error":"{error_type}"' in out
    assert "Traceback" not in out + err
