"""Preparing and cleaning up the UNIX socket plugproxy listens on."""

from __future__ import annotations

import contextlib
import os
import socket
import stat

from plugproxy.endpoints import ConfigError


def socket_answers(path: str, timeout: float = 0.5) -> bool:
    """True when some process accepts connections on the UNIX socket at ``path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        return False
    else:
        return True
    finally:
        sock.close()


def prepare_listen_path(path: str) -> None:
    """Make ``path`` free for a new listener, or explain in one line why it is not.

    A stale socket (nothing answers) is removed; a live one, a symlink or any other file is
    left alone and refused, so two proxies never fight over one socket.
    """
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise ConfigError(f"listen directory {directory} does not exist")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"listen path {path} is a symlink; refusing to follow it")
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"listen path {path} exists and is not a socket; refusing to replace it")
    if socket_answers(path):
        raise ConfigError(f"another process is already listening on {path}; refusing to start")
    os.unlink(path)


def restrict_socket(path: str, mode: int) -> None:
    """chmod our socket without following a symlink that replaced it since it was bound."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ConfigError(f"listen socket {path} vanished before its mode was set") from None
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise ConfigError(f"listen path {path} is no longer our socket; refusing to chmod it")
        try:
            os.chmod(f"/proc/self/fd/{fd}", mode)
        except FileNotFoundError:  # no /proc: the check above still ruled out a symlink
            os.chmod(path, mode)
    finally:
        os.close(fd)


def socket_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the socket file at ``path``; None when there is no socket there."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


def remove_socket(path: str) -> None:
    """Remove our socket file on shutdown; tolerate it being gone already."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if stat.S_ISSOCK(st.st_mode):
            os.unlink(path)


def describe_connect_error(path: str) -> str:
    """Why a UNIX socket cannot be reached, in a few words (for logs and readiness)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.5)
    try:
        sock.connect(path)
    except OSError as exc:
        return os.strerror(exc.errno) if exc.errno else str(exc)
    else:
        return "accepts connections but gRPC is not serving"
    finally:
        sock.close()


__all__ = [
    "describe_connect_error",
    "prepare_listen_path",
    "remove_socket",
    "restrict_socket",
    "socket_answers",
]
