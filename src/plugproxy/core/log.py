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

import orjson

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


# The last whole second formatted, and its text: a busy proxy writes many lines a second.
_second: list[tuple[int, str]] = [(-1, "")]


# ".000Z" … ".999Z": the millisecond part of a timestamp, looked up instead of formatted.
_MILLIS = tuple(f".{ms:03d}Z" for ms in range(1000))


def _iso(ts: float) -> str:
    whole = int(ts)
    second = _second[0]  # one read: another thread may swap in a newer second meanwhile
    if second[0] != whole:
        second = _second[0] = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return second[1] + _MILLIS[min(int((ts - whole) * 1000), 999)]


def _json_line(record: dict[str, Any]) -> str:
    try:
        return orjson.dumps(record, default=str).decode()
    except TypeError:  # what orjson declines (integers over 64 bits, non-string keys)
        return json.dumps(record, separators=(",", ":"), default=str, ensure_ascii=False)


def _text_value(value: Any) -> str:
    """A value of a text line: as is when it is one word, else quoted as JSON. Non-ASCII
    text is shown as it is (`§`, not `\\u00a7`); a line break or other control character
    is escaped, so a value never splits the line."""
    if isinstance(value, str):
        if value and value.isprintable() and " " not in value and '"' not in value:
            return value
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, separators=(",", ":"), default=str, ensure_ascii=False)


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
        self._holds = 0
        self._held: list[str] = []

    def enabled(self, level: str) -> bool:
        return LEVELS[level] >= self.threshold

    def log(self, level: str, event: str, **fields: Any) -> None:
        self.record(level, event, fields)

    def record(self, level: str, event: str, fields: dict[str, Any]) -> None:
        """:meth:`log` with the fields as a dict (not copied): the call log's path."""
        if LEVELS[level] < self.threshold:
            return
        now = time.time()
        if self.fmt == "json":
            line = _json_line({"time": _iso(now), "level": level, "event": event, **fields})
        else:
            pairs = " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
            line = f"{_iso(now)} {level.upper():7} {event} {pairs}".rstrip()
        with self._lock:
            if self._holds:
                self._held.append(line + "\n")
                return
            self._write(line + "\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed stdout must not take calls down with it

    def hold(self) -> None:
        """Keep lines until the matching :meth:`release`, then write them at once: the
        frame relay holds the lines of calls ending in one read, one write for all."""
        with self._lock:
            self._holds += 1

    def release(self) -> None:
        with self._lock:
            self._holds -= 1
            if not self._holds and self._held:
                text = "".join(self._held)
                self._held.clear()
                self._write(text)

    def debug(self, event: str, **fields: Any) -> None:
        self.record("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self.record("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.record("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self.record("error", event, fields)
