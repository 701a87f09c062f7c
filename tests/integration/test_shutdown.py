"""Shutdown as an operator meets it, with real processes: the first SIGINT says how many
calls are in flight and what a second one does, the drain reports calls as they finish,
and a second SIGINT ends the calls still in flight at once, removes the socket and exits
130 — on both relays. The fake plugin's per-method delay keeps calls in flight."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from plugproxy.net.sockets import socket_answers
from tests.support import admin_get, channel, free_port

GRACE = 60.0  # far longer than the test: only the second signal can end it in time
SHORT = "/csi.v1.Identity/GetPluginInfo"  # answered after 2 s, during the drain
LONG = "/csi.v1.Identity/GetPluginCapabilities"  # answered after 60 s: ended by the signal
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("PLUGPROXY_", "OTEL_"))}


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "plugproxy", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=CLEAN_ENV,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


async def wait_for(what: str, predicate, timeout: float, log: Path) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not in {timeout} s; the proxy said:\n{log.read_text()}")
        await asyncio.sleep(0.05)


def in_flight(admin: int) -> float:
    _, metrics = admin_get(admin, "/metrics")
    found = re.findall(r"^plugproxy_rpc_in_flight\{[^}]*\} (\S+)$", metrics, re.MULTILINE)
    return sum(float(v) for v in found)


@pytest.mark.parametrize("relay", ["frames", "grpc"])
async def test_a_second_sigint_stops_at_once_and_the_first_says_what_is_in_flight(
    tmp_path: Path, relay: str
) -> None:
    plugin_sock, listen = tmp_path / "plugin.sock", tmp_path / "csi.sock"
    log, admin = tmp_path / "proxy.log", free_port()
    plugin = spawn(
        [
            "fake-plugin",
            "--spec=csi.v1",
            f"--listen=unix://{plugin_sock}",
            "--delay=GetPluginInfo=2",
            "--delay=GetPluginCapabilities=60",
        ],
        tmp_path / "plugin.log",
    )
    proxy = spawn(
        [
            "serve",
            f"--listen=unix://{listen}",
            f"--upstream=unix://{plugin_sock}",
            f"--admin-listen=127.0.0.1:{admin}",
            f"--relay={relay}",
            f"--shutdown-grace={GRACE:g}s",
            "--log-format=text",
        ],
        log,
    )
    try:
        await wait_for("listening", lambda: socket_answers(str(listen), 0.2), 30, log)
        async with channel(str(listen)) as ch:
            calls = [
                asyncio.ensure_future(ch.unary_unary(path)(b"", timeout=120))
                for path in (SHORT, LONG, LONG)
            ]
            await wait_for("3 calls in flight", lambda: in_flight(admin) == 3, 10, log)

            proxy.send_signal(signal.SIGINT)
            await wait_for("the shutdown line", lambda: "shutting down" in log.read_text(), 5, log)
            (line,) = [ln for ln in log.read_text().splitlines() if "shutting down" in ln]
            assert "signal=SIGINT" in line and "calls_in_flight=3" in line, line
            assert f"grace_seconds={GRACE}" in line and "Ctrl-C" in line, line
            # The drain goes on, and says so as calls finish.
            await wait_for(
                "the drain's progress", lambda: "calls_in_flight=2" in log.read_text(), 5, log
            )
            assert (await calls[0]) is not None  # the short call finished normally
            assert proxy.poll() is None  # still draining the long ones

            second = time.monotonic()
            proxy.send_signal(signal.SIGINT)
            code = await asyncio.to_thread(proxy.wait, 10)
            took = time.monotonic() - second
            assert code == 130, log.read_text()
            assert took < 5, took
            for call in calls[1:]:  # ended at once, not after their 60 s
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    await call
                assert ended.value.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.CANCELLED,
                ), ended.value
            assert time.monotonic() - second < 5
        assert not listen.exists()
        text = log.read_text()
        assert "stopping now" in text and "calls_ended=2" in text, text
        assert "stopped" in text.splitlines()[-1]
        # The plugin goes on: only the proxy stopped.
        assert plugin.poll() is None
    finally:
        stop(proxy)
        stop(plugin)
