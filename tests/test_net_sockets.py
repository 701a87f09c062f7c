"""The listen socket: stale replaced, live refused and left alone, symlinks refused, mode,
removal of only the socket a proxy bound itself, and waiting for a holder to leave."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import urllib.error
import urllib.request

import pytest

from plugproxy.core.endpoints import ConfigError
from plugproxy.net.sockets import (
    ListenPathBusy,
    ListenSocket,
    prepare_listen_path,
    socket_answers,
    socket_identity,
)
from tests.support import start_proxy


def _stale_socket(path: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()  # file stays, nobody listens


def test_stale_socket_is_replaced(tmp_path):
    path = str(tmp_path / "csi.sock")
    _stale_socket(path)
    assert os.path.exists(path) and not socket_answers(path)
    prepare_listen_path(path)
    assert not os.path.exists(path)


def test_live_socket_is_refused(tmp_path):
    path = str(tmp_path / "csi.sock")
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(path)
    live.listen(1)
    try:
        with pytest.raises(ConfigError, match="already listening"):
            prepare_listen_path(path)
        assert os.path.exists(path)
    finally:
        live.close()


def test_symlink_and_regular_file_are_refused(tmp_path):
    target = tmp_path / "elsewhere.sock"
    _stale_socket(str(target))
    link = tmp_path / "csi.sock"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="symlink"):
        prepare_listen_path(str(link))
    plain = tmp_path / "file"
    plain.write_text("data")
    with pytest.raises(ConfigError, match="not a socket"):
        prepare_listen_path(str(plain))
    assert plain.read_text() == "data"


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        prepare_listen_path(str(tmp_path / "nope" / "csi.sock"))


async def test_socket_mode_and_removal_on_shutdown(tmp_path):
    listen = str(tmp_path / "proxy.sock")
    proxy = await start_proxy(listen, str(tmp_path / "plugin.sock"))
    assert stat.S_IMODE(os.stat(listen).st_mode) == 0o660
    await proxy.stop(0)
    assert not os.path.exists(listen)
    proxy = await start_proxy(listen, str(tmp_path / "plugin.sock"), "--socket-mode", "0600")
    assert stat.S_IMODE(os.stat(listen).st_mode) == 0o600
    await proxy.stop(0)


async def test_second_proxy_on_a_live_socket_refuses(tmp_path):
    listen = str(tmp_path / "proxy.sock")
    first = await start_proxy(listen, str(tmp_path / "plugin.sock"))
    try:
        with pytest.raises(ConfigError, match="already listening"):
            await start_proxy(listen, str(tmp_path / "plugin.sock"))
        assert socket_answers(listen)
    finally:
        await first.stop(0)


async def test_healthz_fails_once_the_listen_socket_is_removed_or_replaced(tmp_path):
    """kubelet empties /var/lib/kubelet/device-plugins when it restarts: liveness must fail
    so the proxy is restarted and listens again."""
    listen = str(tmp_path / "proxy.sock")
    proxy = await start_proxy(
        listen, str(tmp_path / "plugin.sock"), "--admin-listen", "127.0.0.1:0"
    )
    assert proxy.admin is not None
    url = f"http://127.0.0.1:{proxy.admin.port}/healthz"

    def status() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    try:
        assert status() == (200, "ok")
        os.unlink(listen)
        code, body = status()
        assert code == 503 and "was removed or replaced" in body and listen in body
        _stale_socket(listen)  # another socket file under the same name is not ours
        assert status()[0] == 503
    finally:
        await proxy.stop(0)


def _listening(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(16)  # never accepts: room for every connection a check makes
    return sock


def test_release_removes_only_the_socket_it_bound(tmp_path):
    path = str(tmp_path / "csi.sock")
    ours = ListenSocket(path)
    first = _listening(path)
    ours.bound()
    os.unlink(path)  # a successor took the path over
    successor = _listening(path)
    try:
        taken_over = socket_identity(path)
        ours.release()
        assert socket_identity(path) == taken_over and socket_answers(path)
    finally:
        first.close()
        successor.close()
    mine = ListenSocket(path)
    os.unlink(path)
    _listening(path).close()
    mine.bound()
    mine.release()
    assert not os.path.exists(path)


def test_a_socket_never_bound_is_never_removed(tmp_path):
    path = str(tmp_path / "csi.sock")
    _stale_socket(path)
    ListenSocket(path).release()
    assert os.path.exists(path)


async def test_claim_refuses_a_live_path_at_once_and_touches_nothing(tmp_path):
    path = str(tmp_path / "csi.sock")
    live = _listening(path)
    try:
        before = socket_identity(path)
        with pytest.raises(ListenPathBusy, match="already listening"):
            await ListenSocket(path).claim(0)
        assert socket_identity(path) == before
    finally:
        live.close()


async def test_claim_waits_for_the_holder_to_leave(tmp_path):
    path = str(tmp_path / "csi.sock")
    live = _listening(path)
    told: list[bool] = []
    claim = ListenSocket(path)
    waiting = asyncio.ensure_future(claim.claim(30, on_busy=lambda: told.append(True)))
    await asyncio.sleep(0.2)
    assert not waiting.done() and claim.waiting_for_holder and told == [True]
    live.close()
    os.unlink(path)
    await asyncio.wait_for(waiting, 5)
    assert not claim.waiting_for_holder and not os.path.exists(path)


async def test_claim_gives_up_after_its_wait(tmp_path):
    path = str(tmp_path / "csi.sock")
    live = _listening(path)
    try:
        claim = ListenSocket(path)
        with pytest.raises(ListenPathBusy):
            await claim.claim(0.2)
        assert not claim.waiting_for_holder and socket_answers(path)
    finally:
        live.close()
