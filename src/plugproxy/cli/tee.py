"""What the demos do with the proxy's log: keep it for the excerpt they show, and copy it
to stderr when asked (``--proxy-log stderr``)."""

from __future__ import annotations

import io
import sys


class Tee(io.StringIO):
    """Keeps the proxy's log for the excerpt, and copies it to stderr when asked."""

    def __init__(self, echo: bool) -> None:
        super().__init__()
        self.echo = echo

    def write(self, text: str) -> int:
        if self.echo:
            sys.stderr.write(text)
        return super().write(text)
