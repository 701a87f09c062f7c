"""Start order and overlapping instances, with real processes.

A sidecar started before its driver must behave through the proxy as it does direct: the
fake registrar (node-driver-registrar's start: wait for the socket, one GetPluginInfo
with a 1 s deadline, exit on failure) is started before the fake plugin, direct, through
the proxy as shipped, and through a proxy that listens at once (the behaviour it
replaces, which must fail the same test). Then the rolling-update shape: two proxies on
one path, the new one waiting while the old one serves, the old one draining — the path
is never without a listener for longer than the handover, each /readyz tells the truth,
and a refused start leaves the live socket alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from plugproxy.net.sockets import socket_answers, socket_identity
from tests.support import admin_get, free_port

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DELAY = 3.0  # seconds the plugin starts after everything else
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("PLUGPROXY_", "OTEL_"))}


def spawn(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "plugproxy", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=CLEAN_ENV,
        )


def fake_plugin(sock: Path, log: Path, *knobs: str) -> subprocess.Popen[bytes]:
    return spawn("fake-plugin", "--spec", "csi.v1", "--listen", f"unix://{sock}", *knobs, log=log)


def serve(
    listen: Path, upstream: Path, admin: int, log: Path, *args: str
) -> subprocess.Popen[bytes]:
    return spawn(
        "serve",
        f"--listen=unix://{listen}",
        f"--upstream=unix://{upstream}",
        f"--admin-listen=127.0.0.1:{admin}",
        "--log-format=text",
        *args,
        log=log,
    )


def wait_for(predicate, timeout: float, what: str, interval: float = 0.02) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not in {timeout} s: {what}")
        time.sleep(interval)


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def registrar_result(
    proc: subprocess.Popen[bytes], log: Path, timeout: float = 30
) -> dict[str, object]:
    proc.wait(timeout)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert lines, log.read_text()
    return {"exit": proc.returncode, **lines[-1]}


def run_registrar_before_plugin(
    tmp_path: Path, through_proxy: tuple[str, ...] | None
) -> dict[str, object]:
    """Start the registrar (and the proxy, if any) now and the plugin PLUGIN_DELAY s later;
    what the registrar did."""
    plugin_sock = tmp_path / "plugin.sock"
    dial = plugin_sock if through_proxy is None else tmp_path / "csi.sock"
    procs = []
    try:
        if through_proxy is not None:
            procs.append(
                serve(dial, plugin_sock, free_port(), tmp_path / "proxy.log", *through_proxy)
            )
        registrar = spawn(
            "fake-registrar", "--csi-address", str(dial), log=tmp_path / "registrar.log"
        )
        procs.append(registrar)
        time.sleep(PLUGIN_DELAY)
        procs.append(fake_plugin(plugin_sock, tmp_path / "plugin.log"))
        return registrar_result(registrar, tmp_path / "registrar.log")
    finally:
        stop(*procs)


def test_registrar_started_before_its_driver_registers_direct(tmp_path: Path) -> None:
    result = run_registrar_before_plugin(tmp_path, None)
    assert result["exit"] == 0 and result["driver"] == "csi.fake.plugproxy.io", result


def test_registrar_started_before_its_driver_registers_through_the_proxy(tmp_path: Path) -> None:
    result = run_registrar_before_plugin(tmp_path, ())
    assert result["exit"] == 0 and result["driver"] == "csi.fake.plugproxy.io", result
    # It connected only once the plugin was there, as it does direct.
    assert float(result["connected_after_s"]) >= PLUGIN_DELAY - 0.5  # type: ignore[arg-type]


def test_a_proxy_listening_at_once_makes_the_early_registrar_exit(tmp_path: Path) -> None:
    """What --listen-when start does to node-driver-registrar: the reason it is not the
    default, and proof that the test above can fail."""
    result = run_registrar_before_plugin(tmp_path, ("--listen-when=start",))
    # It exits all the same; the proxy answered just before its 1 s deadline, with the cause.
    assert result["exit"] == 1 and result["code"] == "UNAVAILABLE", result
    assert "plugin unreachable: upstream unix://" in str(result["details"]), result


def test_the_socket_appears_when_the_plugin_answers_and_stays(tmp_path: Path) -> None:
    plugin_sock, listen, admin = tmp_path / "plugin.sock", tmp_path / "csi.sock", free_port()
    proxy = serve(listen, plugin_sock, admin, tmp_path / "proxy.log")
    plugin = None
    try:
        wait_for(lambda: admin_get(admin, "/healthz")[0] == 200, 20, "the admin server answers")
        code, body = admin_get(admin, "/readyz")
        assert code == 503 and "waiting for the plugin to answer" in body, body
        assert not listen.exists(), "no CO-side socket before the plugin answered"
        plugin = fake_plugin(plugin_sock, tmp_path / "plugin.log")
        wait_for(lambda: socket_answers(str(listen)), 20, "the proxy listens")
        wait_for(lambda: admin_get(admin, "/readyz")[0] == 200, 10, "ready")
        inode = socket_identity(str(listen))
        stop(plugin)  # the plugin goes away: the socket is kept, readiness says why
        wait_for(lambda: admin_get(admin, "/readyz")[0] == 503, 10, "not ready without the plugin")
        assert "upstream" in admin_get(admin, "/readyz")[1]
        assert socket_identity(str(listen)) == inode and socket_answers(str(listen))
        assert admin_get(admin, "/healthz")[0] == 200
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(20) == 0
        assert not listen.exists()
    finally:
        stop(proxy, *([plugin] if plugin else []))


def test_sigterm_while_waiting_for_the_plugin_exits_zero_and_leaves_nothing(tmp_path: Path) -> None:
    listen, admin = tmp_path / "csi.sock", free_port()
    proxy = serve(listen, tmp_path / "plugin.sock", admin, tmp_path / "proxy.log")
    try:
        wait_for(lambda: admin_get(admin, "/healthz")[0] == 200, 20, "the admin server answers")
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(20) == 0
        assert not listen.exists()
    finally:
        stop(proxy)


@contextmanager
def path_prober(path: Path) -> Iterator[list[tuple[float, bool]]]:
    """Connect to the path every 2 ms in a thread: (time, accepted) of each attempt."""
    samples: list[tuple[float, bool]] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            samples.append((time.monotonic(), socket_answers(str(path), 0.2)))
            time.sleep(0.002)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join(5)


def longest_refusal(samples: list[tuple[float, bool]]) -> float:
    longest, since = 0.0, None
    for at, ok in samples:
        if not ok and since is None:
            since = at
        elif ok and since is not None:
            longest, since = max(longest, at - since), None
    assert since is None, "the path had no listener when probing ended"
    return longest


@pytest.mark.parametrize("relay", ["frames", "grpc"])
def test_rolling_update_hands_the_path_over_without_a_gap(tmp_path: Path, relay: str) -> None:
    plugin_sock, listen = tmp_path / "plugin.sock", tmp_path / "csi.sock"
    old_admin, new_admin = free_port(), free_port()
    plugin = fake_plugin(plugin_sock, tmp_path / "plugin.log", "--delay", "GetCapacity=2")
    old = new = None
    try:
        wait_for(lambda: socket_answers(str(plugin_sock)), 20, "the plugin listens")
        old = serve(
            listen, plugin_sock, old_admin, tmp_path / "old.log", "--shutdown-grace=10s",
            f"--relay={relay}",
        )  # fmt: skip
        wait_for(lambda: admin_get(old_admin, "/readyz")[0] == 200, 20, "the old proxy is ready")
        old_socket = socket_identity(str(listen))
        new = serve(
            listen, plugin_sock, new_admin, tmp_path / "new.log", "--listen-wait=60s",
            f"--relay={relay}",
        )  # fmt: skip
        wait_for(
            lambda: "another process listens" in admin_get(new_admin, "/readyz")[1], 20,
            "the new proxy reports it is waiting for the path",
        )  # fmt: skip
        assert admin_get(new_admin, "/readyz")[0] == 503
        assert admin_get(new_admin, "/healthz")[0] == 200
        assert socket_identity(str(listen)) == old_socket, "the waiting proxy touched the path"
        assert admin_get(old_admin, "/readyz")[0] == 200

        slow = subprocess.Popen(  # a call in flight on the old proxy when it is told to stop
            [sys.executable, "-c", SLOW_CALL, str(listen)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, env=CLEAN_ENV,
        )  # fmt: skip
        time.sleep(1.0)
        with path_prober(listen) as samples:
            time.sleep(0.2)
            old.send_signal(signal.SIGTERM)
            wait_for(
                lambda: admin_get(new_admin, "/readyz")[0] == 200, 20, "the new proxy is ready"
            )
            code, body = admin_get(old_admin, "/readyz")
            assert (code, "shutting down" in body) in ((503, True), (0, False)), body
            assert old.wait(20) == 0
            time.sleep(0.2)
        slow_out = slow.communicate(timeout=20)[0].decode()
        assert slow.returncode == 0 and "OK" in slow_out, slow_out
        gap = longest_refusal(samples)
        print(f"handover: longest time the path refused a connection: {gap * 1000:.1f} ms")
        assert gap < 1.0, f"the path had no listener for {gap:.3f} s"
        new_socket = socket_identity(str(listen))
        assert new_socket is not None and new_socket != old_socket
        assert socket_answers(str(listen)), "the old proxy removed its successor's socket"
    finally:
        stop(plugin, *[p for p in (old, new) if p is not None])


SLOW_CALL = """
import asyncio, sys
from plugproxy.fakes import SpecClient

async def main():
    client = SpecClient("unix:" + sys.argv[1], "csi.v1", timeout=15)
    try:
        await client.call("GetCapacity")
        print("OK")
    finally:
        await client.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("relay", ["frames", "grpc"])
def test_a_refused_second_proxy_leaves_the_live_socket_alone(tmp_path: Path, relay: str) -> None:
    plugin_sock, listen = tmp_path / "plugin.sock", tmp_path / "csi.sock"
    first_admin = free_port()
    plugin = fake_plugin(plugin_sock, tmp_path / "plugin.log")
    first = None
    try:
        wait_for(lambda: socket_answers(str(plugin_sock)), 20, "the plugin listens")
        first = serve(listen, plugin_sock, first_admin, tmp_path / "first.log", f"--relay={relay}")
        wait_for(
            lambda: admin_get(first_admin, "/readyz")[0] == 200, 20, "the first proxy is ready"
        )
        before = socket_identity(str(listen))
        second = subprocess.run(
            [sys.executable, "-m", "plugproxy", "serve", f"--listen=unix://{listen}",
             f"--upstream=unix://{plugin_sock}", "--admin-listen=off", f"--relay={relay}"],
            check=False, capture_output=True, text=True, cwd=REPO, env=CLEAN_ENV, timeout=30,
        )  # fmt: skip
        assert second.returncode == 2, second.stderr
        assert "already listening" in second.stderr
        assert socket_identity(str(listen)) == before, "the refused proxy removed the socket"
        assert socket_answers(str(listen))
        assert admin_get(first_admin, "/readyz") == (200, "ready")
        assert admin_get(first_admin, "/healthz")[0] == 200
    finally:
        stop(plugin, *([first] if first else []))
