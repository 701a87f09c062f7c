"""TLS material on disk: the CA bundle, certificate chain and key, loaded, checked and watched.

Files are re-read when they change, including the Kubernetes Secret volume layout where
``tls.crt`` is a symlink through ``..data`` into a timestamped directory that is swapped
atomically. The watcher polls: each tick it stats the *resolved* paths (a symlink swap
changes the real path, a rewrite in place changes size, mtime or inode) and only when that
signature moved does it read and hash the contents. New material is used only once it
checks out as a whole (the key matches the certificate, the CA bundle parses), so a
half-finished, non-atomic update keeps the previous material until it is complete.

Checks use the standard library's ssl module; grpc does the TLS itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from plugproxy.core.endpoints import ConfigError
from plugproxy.core.log import Logger

_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


class MaterialError(Exception):
    """TLS files that cannot be used; the message names the file and never quotes a key."""


@dataclass(frozen=True)
class TLSPaths:
    ca: str
    cert: str
    key: str

    def items(self) -> tuple[tuple[str, str], ...]:
        return (("--tls-ca", self.ca), ("--tls-cert", self.cert), ("--tls-key", self.key))


@dataclass(frozen=True, eq=False)
class Material:
    """One consistent set of PEM bytes, as grpc's credential builders take them."""

    ca: bytes
    cert: bytes
    key: bytes
    digest: str  # over all three files: tells one generation from the next

    @property
    def cert_fingerprint(self) -> str:
        """SHA-256 of the leaf certificate (DER), as `openssl x509 -fingerprint` shows it."""
        return fingerprint(self.cert)

    @property
    def ca_count(self) -> int:
        return len(_PEM_CERT.findall(self.ca))


def fingerprint(pem: bytes) -> str:
    """SHA-256 fingerprint of the first certificate in a PEM blob ("" when there is none)."""
    match = _PEM_CERT.search(pem)
    if match is None:
        return ""
    der = ssl.PEM_cert_to_DER_cert(match.group(0).decode("ascii"))
    return hashlib.sha256(der).hexdigest()


Signature = tuple[tuple[str, int, int, int], ...]


def signature(paths: TLSPaths) -> Signature:
    """What one stat of each resolved path says; it changes whenever a file may have."""
    out = []
    for _, path in paths.items():
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError:
            out.append((real, -1, -1, -1))
            continue
        out.append((real, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise MaterialError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise MaterialError(f"{flag} {path}: is a directory, expected a PEM file") from None
    except OSError as exc:
        raise MaterialError(f"{flag} {path}: cannot read ({exc.strerror})") from None


def _check(paths: TLSPaths, ca: bytes, cert: bytes, key: bytes) -> None:
    if not _PEM_CERT.search(ca):
        raise MaterialError(f"--tls-ca {paths.ca}: no PEM certificate in the file")
    if not _PEM_CERT.search(cert):
        raise MaterialError(f"--tls-cert {paths.cert}: no PEM certificate in the file")
    if b"PRIVATE KEY-----" not in key:
        raise MaterialError(f"--tls-key {paths.key}: no PEM private key in the file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_verify_locations(cadata=ca.decode("ascii", errors="replace"))
    except (ssl.SSLError, ValueError) as exc:
        raise MaterialError(
            f"--tls-ca {paths.ca}: not a usable CA bundle ({_reason(exc)})"
        ) from None
    try:
        # Only takes paths; the caller compares contents before and after to rule out a race.
        ctx.load_cert_chain(paths.cert, paths.key)
    except ssl.SSLError as exc:
        reason = _reason(exc)
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise MaterialError(
                f"--tls-key {paths.key} does not match the certificate in --tls-cert {paths.cert}"
            ) from None
        raise MaterialError(
            f"--tls-cert {paths.cert} / --tls-key {paths.key}: not usable ({reason})"
        ) from None
    except OSError as exc:
        raise MaterialError(f"--tls-cert/--tls-key: cannot read ({exc.strerror})") from None


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason) if reason else type(exc).__name__


def load(paths: TLSPaths) -> Material:
    """Read and check the three files; raises MaterialError naming the file at fault."""
    for _ in range(3):
        ca, cert, key = (_read(flag, path) for flag, path in paths.items())
        _check(paths, ca, cert, key)
        # The key/cert check read the files again by path: retry if they moved meanwhile.
        if (_read("--tls-cert", paths.cert), _read("--tls-key", paths.key)) == (cert, key):
            digest = hashlib.sha256(b"\0".join((ca, cert, key))).hexdigest()
            return Material(ca, cert, key, digest)
    raise MaterialError(f"--tls-cert {paths.cert}: kept changing while being read")


def load_or_config_error(paths: TLSPaths) -> Material:
    try:
        return load(paths)
    except MaterialError as exc:
        raise ConfigError(str(exc)) from None


class Watcher:
    """Polls the files and hands complete new material to the listeners."""

    def __init__(
        self,
        paths: TLSPaths,
        material: Material,
        logger: Logger,
        interval: float = 1.0,
    ) -> None:
        self.paths = paths
        self.material = material
        self.interval = interval
        self.reloads = 0
        self._logger = logger
        self._signature = signature(paths)
        self._listeners: list[Callable[[Material], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._last_error = ""

    def add_listener(self, listener: Callable[[Material], None]) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        if self._task is None and self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.poll()
            except Exception as exc:  # a watcher bug must not stop reloads for good
                self._logger.error("tls reload failed", error=f"{type(exc).__name__}: {exc}")

    def poll(self) -> bool:
        """One check; True when new material was taken into use."""
        sig = signature(self.paths)
        if sig == self._signature:
            return False
        try:
            material = load(self.paths)
        except MaterialError as exc:
            # Keep serving with what works; say so once per distinct problem, retry next tick.
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                self._logger.warning(
                    "tls files changed but are not usable yet; keeping the current ones",
                    reason=str(exc),
                )
            return False
        self._signature = sig
        self._last_error = ""
        if material.digest == self.material.digest:
            return False  # touched or re-linked, same contents
        old = self.material
        self.material = material
        self.reloads += 1
        self._logger.info(
            "tls files reloaded",
            cert=self.paths.cert,
            cert_sha256=material.cert_fingerprint,
            previous_cert_sha256=old.cert_fingerprint,
            ca_certificates=material.ca_count,
        )
        for listener in self._listeners:
            listener(material)
        return True
