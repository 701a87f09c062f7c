"""Listen and upstream addresses: unix://, tcp:// and tls:// URLs, checked at startup."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from urllib.parse import urlsplit


class ConfigError(Exception):
    """A setting that cannot work; the CLI prints it as one line and exits non-zero."""


class Scheme(enum.Enum):
    UNIX = "unix"
    TCP = "tcp"
    TLS = "tls"


@dataclass(frozen=True)
class Endpoint:
    scheme: Scheme
    path: str = ""  # UNIX socket path
    host: str = ""
    port: int = 0
    url: str = ""

    @property
    def is_unix(self) -> bool:
        return self.scheme is Scheme.UNIX

    @property
    def grpc_target(self) -> str:
        """The target string grpc understands for this endpoint."""
        if self.is_unix:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.url


def parse_endpoint(url: str, what: str = "address") -> Endpoint:
    """Parse 'unix:///abs/path', 'tcp://host:port' or 'tls://host:port'."""
    if not url:
        raise ConfigError(f"{what} is empty; expected unix:///path, tcp://host:port or tls://…")
    if url.startswith("/"):
        url = "unix://" + url
    parts = urlsplit(url)
    try:
        scheme = Scheme(parts.scheme)
    except ValueError:
        raise ConfigError(
            f"{what} {url!r}: unsupported scheme {parts.scheme!r}; use unix://, tcp:// or tls://"
        ) from None
    if scheme is Scheme.UNIX:
        path = (parts.netloc + parts.path) if parts.netloc else parts.path
        if not path.startswith("/"):
            raise ConfigError(f"{what} {url!r}: a UNIX socket path must be absolute (unix:///…)")
        return Endpoint(scheme, path=os.path.normpath(path), url=url)
    if not parts.hostname:
        raise ConfigError(f"{what} {url!r}: missing host; expected {scheme.value}://host:port")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{what} {url!r}: port is not a number in 0-65535") from None
    if port is None:
        raise ConfigError(f"{what} {url!r}: missing port; expected {scheme.value}://host:port")
    return Endpoint(scheme, host=parts.hostname, port=port, url=url)
