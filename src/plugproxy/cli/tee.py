"""What the demos share: a proxy in front of their fake plugin, whose log they keep for the
excerpt they show and copy to stderr when asked (``--proxy-log stderr``)."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager

from plugproxy.cli import serve
from plugproxy.core.log import Logger


class Tee(io.StringIO):
    """Keeps the proxy's log for the excerpt, and copies it to stderr when asked."""

    def __init__(self, echo: bool) -> None:
        super().__init__()
        self.echo = echo

    def write(self, text: str) -> int:
        if self.echo:
            sys.stderr.write(text)
        return super().write(text)


async def start_demo_proxy(
    plugin_sock: str,
    proxy_sock: str,
    *args: str,
    echo: bool,
    environment: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
) -> tuple[serve.ProxyServer, Tee, str]:
    """A proxy on ``proxy_sock`` in front of the plugin on ``plugin_sock``, logging payloads
    as text, its admin server on a free port; started, the plugin answering. Returns the
    proxy, its log and the admin server's URL. ``environment`` is entered while the
    stages are built (the traced demo's OTEL_* variables)."""
    settings = serve.parse_settings(
        [
            *("--listen", f"unix://{proxy_sock}", "--upstream", f"unix://{plugin_sock}"),
            *("--admin-listen", "127.0.0.1:0", "--log-payloads", "--log-format", "text"),
            *args,
        ],
        environ={},
    )
    log = Tee(echo=echo)
    with environment():
        proxy = serve.ProxyServer(settings, logger=Logger(log, fmt="text"))
    await proxy.start()
    await proxy.upstream.wait_ready(5)
    assert proxy.admin is not None
    return proxy, log, f"http://127.0.0.1:{proxy.admin.port}"
