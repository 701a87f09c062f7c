"""`plugproxy report`: fetch GET /violations from a running proxy's admin server and print it.

One row per (rule, method, party): how often, the rule's level and spec section, when it was
last seen and its last message. Messages name fields and rules, never field values.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any, TextIO

from plugproxy.endpoints import ConfigError

COLUMNS = ("count", "level", "party", "rule", "method", "section", "last_seen", "last_message")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin",
        default="http://127.0.0.1:9808",
        help="base URL of the proxy's admin server (its --admin-listen)",
    )
    parser.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format"
    )
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the admin server"
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
    widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(COLUMNS)]
    out.write("  ".join(c.upper().ljust(w) for c, w in zip(COLUMNS, widths, strict=True)).rstrip())
    out.write("\n")
    for r in table:
        out.write("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")
    out.write(f"{data.get('total', sum(int(r.get('count', 0)) for r in rows))} violation(s)\n")


async def run(ns: argparse.Namespace) -> int:
    data = fetch(ns.admin, ns.timeout)
    if ns.format == "json":
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        render(data, sys.stdout)
    return 0
