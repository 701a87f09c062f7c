"""How the proxy listens and dials: UNIX sockets and plain TCP.

The listen side and the upstream side each go through one function here, so transport
security lives in one place.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import grpc

from plugproxy.endpoints import ConfigError, Endpoint, Scheme
from plugproxy.options import Option

OPTIONS: list[Option] = []


def check(ns: argparse.Namespace, listen: Endpoint, upstream: Endpoint) -> None:
    """Refuse transport settings that cannot work, before anything starts."""
    for what, ep in (("--listen", listen), ("--upstream", upstream)):
        if ep.scheme is Scheme.TLS:
            raise ConfigError(f"{what} {ep}: tls:// is not supported by this build")


def channel_credentials(
    ns: argparse.Namespace, upstream: Endpoint
) -> grpc.ChannelCredentials | None:
    return None


def channel_options(ns: argparse.Namespace, upstream: Endpoint) -> list[tuple[str, Any]]:
    return []


def add_listen_port(server: grpc.aio.Server, ns: argparse.Namespace, listen: Endpoint) -> int:
    """Bind the listen endpoint; UNIX sockets are created with --socket-mode."""
    if listen.is_unix:
        old = os.umask(0o777 & ~ns.socket_mode)
        try:
            port = int(server.add_insecure_port(listen.grpc_target))
        finally:
            os.umask(old)
        return port
    port = int(server.add_insecure_port(listen.grpc_target))
    if port == 0:
        raise ConfigError(f"--listen {listen}: cannot bind (address in use or not permitted)")
    return port
