"""Structured log lines (JSON or text) on one stream.

Every line plugproxy writes goes through :class:`Logger`. Callers pass values that are
already safe to print: message payloads reach it only through the redactor.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def _iso(ts: float) -> str:
    t = time.gmtime(ts)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int((ts % 1) * 1000):03d}Z"


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value) if (not value or " " in value or '"' in value) else value
    return json.dumps(value, separators=(",", ":"), default=str)


class Logger:
    """Writes one line per event; thread-safe; drops nothing below its level silently."""

    def __init__(self, stream: TextIO | None = None, fmt: str = "json", level: str = "info"):
        if fmt not in ("json", "text"):
            raise ValueError(f"log format must be json or text, not {fmt!r}")
        if level not in LEVELS:
            raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
        self.stream = stream if stream is not None else sys.stdout
        self.fmt = fmt
        self.threshold = LEVELS[level]
        self._lock = threading.Lock()

    def enabled(self, level: str) -> bool:
        return LEVELS[level] >= self.threshold

    def log(self, level: str, event: str, **fields: Any) -> None:
        if LEVELS[level] < self.threshold:
            return
        now = time.time()
        if self.fmt == "json":
            record = {"time": _iso(now), "level": level, "event": event, **fields}
            line = json.dumps(record, separators=(",", ":"), default=str, ensure_ascii=False)
        else:
            pairs = " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
            line = f"{_iso(now)} {level.upper():7} {event} {pairs}".rstrip()
        with self._lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # a closed stdout must not take calls down with it

    def debug(self, event: str, **fields: Any) -> None:
        self.log("debug", event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self.log("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.log("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self.log("error", event, **fields)
