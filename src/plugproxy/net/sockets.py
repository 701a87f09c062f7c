"""Preparing and cleaning up the UNIX socket plugproxy listens on."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat
import time
from collections.abc import Callable

from plugproxy.core.endpoints import ConfigError

# How often a proxy waiting for a live listener to leave its path looks again: the gap a
# CO can see during a handover is at most about this long.
HANDOVER_POLL_SECONDS = 0.02


class ListenPathBusy(ConfigError):
    """Another process listens on the path: refused, and nothing on disk was touched."""


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
        raise ListenPathBusy(f"another process is already listening on {path}; refusing to start")
    os.unlink(path)


class ListenSocket:
    """The UNIX socket file a proxy listens on, known by its inode once bound.

    A proxy removes only the file it created itself: a start that was refused, or a proxy
    whose path was taken over by its successor, leaves whatever is at the path alone.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.identity: tuple[int, int] | None = None  # (device, inode) once bound
        self.waiting_for_holder = False

    async def claim(self, wait: float, on_busy: Callable[[], None] | None = None) -> None:
        """Make the path free to bind; while another process listens there, look again for
        up to ``wait`` seconds (its drain in a rolling update) before refusing."""
        deadline = time.monotonic() + wait
        while True:
            try:
                prepare_listen_path(self.path)
            except ListenPathBusy:
                if time.monotonic() >= deadline:
                    self.waiting_for_holder = False
                    raise
                if not self.waiting_for_holder and on_busy is not None:
                    on_busy()
                self.waiting_for_holder = True
                await self._holder_gone(deadline)
            else:
                self.waiting_for_holder = False
                return

    async def _holder_gone(self, deadline: float) -> None:
        """Until the holder's socket file is removed or replaced (cheap lstat polls, no
        connections to it), or the deadline."""
        held = socket_identity(self.path)
        # No event tells when another process removes a file: poll the path.
        while socket_identity(self.path) == held and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(HANDOVER_POLL_SECONDS)

    def bound(self) -> None:
        self.identity = socket_identity(self.path)

    def is_ours(self) -> bool:
        return self.identity is not None and socket_identity(self.path) == self.identity

    def release(self) -> None:
        """Remove the socket file if it is still the one we created."""
        if self.is_ours():
            with contextlib.suppress(FileNotFoundError):  # removed by hand meanwhile
                os.unlink(self.path)
        self.identity = None


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


def path_problem(path: str) -> str | None:
    """What keeps a UNIX socket path from ever answering, seen in the file system alone: a
    missing directory (most often a typo) or something other than a socket at the path.
    None when a socket, or nothing yet, is there."""
    directory = os.path.dirname(path) or "."
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not os.path.isdir(directory):
            if os.path.exists(directory):
                return f"{directory} is not a directory"
            return f"directory {directory} does not exist"
        if os.path.islink(path):
            return f"not a socket (a symlink to {os.readlink(path)}, which does not exist)"
        return None
    except NotADirectoryError:
        return f"{directory} is not a directory"
    except OSError:
        return None  # e.g. no permission to look: connecting says more
    if stat.S_ISSOCK(st.st_mode):
        return None
    return f"not a socket ({_file_kind(st.st_mode)})"


def _file_kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "a device or special file"


# Connect errors in the words the state log, /readyz and UNAVAILABLE messages share.
_CONNECT_ERRORS = {
    errno.ENOENT: "no socket file (the plugin is not listening)",
    errno.ECONNREFUSED: "connection refused (a socket file, but nothing listens on it)",
    errno.EACCES: "permission denied (the proxy may not connect to the socket)",
    errno.EPERM: "permission denied (the proxy may not connect to the socket)",
}


def describe_connect_error(path: str, error: int | None = None) -> str:
    """Why the UNIX socket at ``path`` cannot be reached, in a few words (for the state log,
    readiness and the UNAVAILABLE a call gets). ``error`` is the errno a connect attempt
    failed with; without it, a non-blocking connect finds out."""
    problem = path_problem(path)
    if problem is not None:
        return problem
    if error is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)  # never waits: read on the event loop and the admin thread
        try:
            sock.connect(path)
        except BlockingIOError:
            return "the plugin does not accept connections (its socket's backlog is full)"
        except OSError as exc:
            error = exc.errno or 0
            if not error:
                return str(exc)
        else:
            return "accepts connections but gRPC is not serving"
        finally:
            sock.close()
    return _CONNECT_ERRORS.get(error) or os.strerror(error)


__all__ = [
    "ListenPathBusy",
    "ListenSocket",
    "describe_connect_error",
    "path_problem",
    "prepare_listen_path",
    "restrict_socket",
    "socket_answers",
]
