"""`plugproxy report`: fetch GET /violations from a running proxy's admin server and print it.

One row per (rule, method, party): how often, the rule's level, the field and spec section,
the request id of the last call (to find it in the call log), when it was last seen and its
last message; then the time window and how many calls were judged in it. Messages name
fields and rules, never field values. ``--fail-on`` makes the exit code gate a pipeline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any, TextIO

from plugproxy.endpoints import ConfigError

COLUMNS = (
    "count",
    "level",
    "party",
    "rule",
    "method",
    "last_field",
    "section",
    "last_request_id",
    "last_seen",
    "last_message",
)
HEADINGS = {"last_field": "field", "last_request_id": "request_id"}
# --fail-on LEVEL: exit 1 when a violation of that level or a stronger one was seen.
FAIL_ON = {"never": (), "must": ("MUST",), "should": ("MUST", "SHOULD")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin",
        default="http://127.0.0.1:9808",
        help="base URL of the proxy's admin server (its --admin-listen)",
    )
    parser.add_argument(
        "--format",
        choices=("table", "markdown", "json"),
        default="table",
        help="output format (markdown: a table to paste into an audit record)",
    )
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the admin server"
    )
    parser.add_argument(
        "--fail-on",
        choices=tuple(FAIL_ON),
        default="never",
        help="exit 1 when a violation of this level (must: MUST; should: MUST or SHOULD) was"
        " seen (default: never)",
    )


def fetch(admin: str, timeout: float = 5.0) -> dict[str, Any]:
    """GET <admin>/violations; ConfigError (one line) when unreachable or not a report."""
    base = admin if "://" in admin else f"http://{admin}"
    url = base.rstrip("/") + "/violations"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        raise ConfigError(f"{url}: HTTP {exc.code} (is validation enabled?)") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ConfigError(f"cannot reach the admin server at {url}: {reason}") from None
    try:
        data = json.loads(body)
    except ValueError:
        raise ConfigError(f"{url}: the answer is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("violations"), list):
        raise ConfigError(f"{url}: the answer is not a violations report")
    return data


def _cell(value: Any, width: int) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def render(data: dict[str, Any], out: TextIO, max_message: int = 80) -> None:
    rows = data["violations"]
    if not rows:
        out.write("no violations\n")
        return
    table = [
        [_cell(row.get(c, ""), max_message if c == "last_message" else 60) for c in COLUMNS]
        for row in rows
    ]
    names = [HEADINGS.get(c, c).upper() for c in COLUMNS]
    widths = [max(len(n), *(len(r[i]) for r in table)) for i, n in enumerate(names)]
    out.write("  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip())
    out.write("\n")
    for r in table:
        out.write("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")
    total = data.get("total", sum(int(r.get("count", 0)) for r in rows))
    out.write(f"{total} violation(s)")
    if "calls_judged" in data:
        out.write(f" in {data['calls_judged']} call(s) judged")
    if "since" in data:
        out.write(f", {data['since']} to {data.get('until', 'now')}")
    out.write("\n")


def _md(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_markdown(data: dict[str, Any], out: TextIO) -> None:
    """The report as a Markdown table, every message whole, with its window and denominator."""
    names = [HEADINGS.get(c, c) for c in COLUMNS]
    out.write(f"| {' | '.join(names)} |\n|{'---|' * len(names)}\n")
    for row in data["violations"]:
        out.write(f"| {' | '.join(_md(row.get(c, '')) for c in COLUMNS)} |\n")
    total = data.get("total", sum(int(r.get("count", 0)) for r in data["violations"]))
    out.write(f"\n{total} violation(s) in {data.get('calls_judged', '?')} call(s) judged")
    out.write(f", {data.get('since', '?')} to {data.get('until', '?')}\n")


def failing(data: dict[str, Any], fail_on: str) -> int:
    """Violations at the ``fail_on`` level or stronger."""
    levels = FAIL_ON[fail_on]
    return sum(int(r.get("count", 0)) for r in data["violations"] if r.get("level") in levels)


async def run(ns: argparse.Namespace) -> int:
    data = fetch(ns.admin, ns.timeout)
    try:
        if ns.format == "json":
            json.dump(data, sys.stdout, indent=1)
            sys.stdout.write("\n")
        elif ns.format == "markdown":
            render_markdown(data, sys.stdout)
        else:
            render(data, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (`| head`): what it wanted was written. Point stdout at
        # /dev/null so the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1 if failing(data, ns.fail_on) else 0
