"""`plugproxy report`: print the spec violations a proxy has seen, from its admin server's
GET /violations or, with ``--file``, from its violations file (no running proxy needed).

First what was judged: how many violations in how many calls, the window, the specs, the
validation mode and how many of the calls the proxy rejected; then one block per (rule,
method, party): level, party, method, count, how many of those calls the proxy rejected
(enforce mode), the field and spec section, the request id of the last call (to find it in
the call log), when it was first and last seen, and its last message, whole, wrapped to the
terminal (at most 100 columns). Messages name fields and rules, never string values.
``--format markdown`` is the same for an audit record, ``--format json`` the raw report.
``--fail-on`` makes the exit code gate a pipeline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, TextIO

from plugproxy.core.endpoints import ConfigError

# --fail-on LEVEL: exit 1 when a violation of that level or a stronger one was seen.
FAIL_ON = {"never": (), "must": ("MUST",), "should": ("MUST", "SHOULD")}
# The admin server's answer to a path it does not serve names the paths it does.
SERVED = "this plugproxy admin server answers "
MIN_WIDTH, MAX_WIDTH = 60, 100
LABEL = 12  # the label column of a block


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--admin",
        default="http://127.0.0.1:9808",
        help="URL of the proxy's admin server (its --admin-listen), or of its /violations",
    )
    source.add_argument(
        "--file",
        metavar="PATH",
        help="read a violations file (serve --violations-file; PATH.1 too) instead of asking"
        " a running proxy",
    )
    parser.add_argument(
        "--format",
        choices=("text", "table", "markdown", "json"),
        default="text",
        help="output format: text (one block per violation), markdown (to paste into an audit"
        " record) or json (the raw report); table is text's old name",
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


def admin_base(admin: str) -> str:
    """The admin server's base URL: a scheme added, a trailing /violations taken off."""
    base = admin if "://" in admin else f"http://{admin}"
    base = base.rstrip("/")
    return base.removesuffix("/violations").rstrip("/")


def fetch(admin: str, timeout: float = 5.0) -> dict[str, Any]:
    """GET <admin>/violations; ConfigError (one line) when unreachable or not a report."""
    base = admin_base(admin)
    url = base + "/violations"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise ConfigError(not_found(url, exc.read().decode("utf-8", "replace"))) from None
        raise ConfigError(f"{url}: HTTP {exc.code}") from None
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


def not_found(url: str, body: str) -> str:
    """Why ``url`` answered 404, from what the server said."""
    if SERVED not in body:
        base = url.removesuffix("/violations")
        return (
            f"{url}: HTTP 404 from a server that is not a plugproxy admin server: is {base}"
            " the proxy's --admin-listen address?"
        )
    paths = body.split(SERVED, 1)[1].strip().split(", ")
    if "/violations" not in paths:
        return (
            f"{url}: HTTP 404: validation is off in this proxy (--validation off and no --rule"
            " turning a rule on), so it keeps no violations"
        )
    parts = urllib.parse.urlsplit(url)
    root = f"{parts.scheme}://{parts.netloc}"
    return (
        f"{url}: HTTP 404: wrong path; this admin server serves its report at"
        f" {root}/violations (--admin {root})"
    )


# -- text -------------------------------------------------------------------------------------


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def _total(data: dict[str, Any]) -> int:
    return int(data.get("total", sum(int(r.get("count", 0)) for r in data["violations"])))


def mode_text(data: dict[str, Any]) -> str:
    """The validation mode: the latest run's, and earlier runs' when they differ."""
    mode = data.get("mode")
    if not mode:
        return ""
    earlier = []
    for run in data.get("runs", [])[:-1]:
        other = run.get("mode")
        if other and other != mode and other not in earlier:
            earlier.append(other)
    return f"{mode}; earlier runs: {', '.join(earlier)}" if earlier else str(mode)


def headline(data: dict[str, Any]) -> str:
    """ "0 violations in 1,234 calls judged since <time> (validation mode: audit)"."""
    text = _count(_total(data), "violation")
    calls = data.get("calls_judged")
    if isinstance(calls, int):
        text += f" in {_count(calls, 'call')} judged"
    if data.get("since"):
        text += f" since {data['since']}"
    mode = mode_text(data)
    if mode:
        text += f" (validation mode: {mode})"
    return text


def _run_text(run: dict[str, Any]) -> str:
    text = f"{run.get('started') or 'start unknown'}"
    if run.get("mode"):
        text += f", {run['mode']}"
    text += f": {_count(int(run.get('calls_judged', 0)), 'call')} judged,"
    text += f" {_count(int(run.get('violations', 0)), 'violation')}"
    if run.get("rejected"):
        text += f", {run['rejected']:,} rejected"
    if run.get("current"):
        text += " (this run)"
    elif run.get("stopped"):
        text += f", stopped {run['stopped']}"
    else:
        text += ", ended without a stop record"
    return text


def details(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) lines under the headline: window, specs, rejections, runs, file."""
    out: list[tuple[str, str]] = []
    if data.get("since"):
        out.append(("window", f"{data['since']} to {data.get('until', 'now')}"))
    by_spec = data.get("calls_judged_by_spec")
    if isinstance(by_spec, dict):
        specs = ", ".join(f"{spec} ({_count(n, 'call')})" for spec, n in by_spec.items())
        out.append(("specs", specs or "none judged yet"))
    total = _total(data)
    if total:
        rejected = int(data.get("rejected", 0))
        if rejected:
            out.append(
                (
                    "rejected",
                    f"{rejected:,} of {_count(total, 'violation')}: in calls the proxy answered"
                    " itself (enforce), which never reached the plugin; the rest were reported"
                    " only",
                )
            )
        else:
            out.append(("rejected", "none: every violation was reported only"))
    if data.get("rule_modes"):
        modes = ", ".join(f"{r}={m}" for r, m in sorted(data["rule_modes"].items()))
        out.append(("rule modes", modes))
    runs = data.get("runs") or []
    if len(runs) > 1:
        for i, run in enumerate(runs):
            out.append(("runs" if i == 0 else "", _run_text(run)))
    info = data.get("violations_file")
    if isinstance(info, dict):
        text = str(info.get("path", ""))
        notes = []
        if info.get("lost"):
            notes.append(f"{_count(info['lost'], 'violation')} could not be written to it")
        if info.get("write_errors"):
            notes.append(f"{_count(info['write_errors'], 'write error')}")
        if info.get("unreadable_lines"):
            notes.append(f"{_count(info['unreadable_lines'], 'unreadable line')} skipped")
        out.append(("file", text + (f" ({'; '.join(notes)})" if notes else "")))
    return out


def block(row: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) lines of one violation entry, the message last and whole."""
    count = int(row.get("count", 0))
    rejected = int(row.get("rejected", 0))
    earlier = int(row.get("earlier_runs", 0))
    counted = f"{count:,}"
    if earlier:
        counted += f" ({earlier:,} from earlier runs)"
    if rejected:
        refused = f"{rejected:,} of {count:,}: the proxy answered those calls itself"
    else:
        refused = "0: reported only"
    last = str(row.get("last_seen", ""))
    if row.get("last_request_id"):
        last += f", request {row['last_request_id']}"
    return [
        ("level", f"{row.get('level', '')}, party {row.get('party', '')}"),
        ("method", str(row.get("method", ""))),
        ("count", counted),
        ("rejected", refused),
        ("field", str(row.get("last_field") or "-")),
        ("section", str(row.get("section", ""))),
        ("first seen", str(row.get("first_seen", ""))),
        ("last seen", last),
        ("message", str(row.get("last_message", ""))),
    ]


def terminal_width() -> int:
    """The terminal's width within 60-100 columns; 100 when the output is not a terminal."""
    columns = shutil.get_terminal_size((MAX_WIDTH, 24)).columns
    return max(MIN_WIDTH, min(MAX_WIDTH, columns))


def _labelled(lines: list[tuple[str, str]], indent: str, width: int) -> list[str]:
    """``label  text`` lines, the text wrapped under itself; a text with a word too long
    for that column (a long method path) starts on a line of its own, below the label."""
    out = []
    for label, text in lines:
        prefix = f"{indent}{label:<{LABEL}}"
        hanging = " " * len(prefix)
        if label and max(map(len, text.split()), default=0) > width - len(prefix):
            out.append(f"{indent}{label}")
            prefix = hanging = indent + "  "
        out += textwrap.wrap(
            text,
            width,
            initial_indent=prefix,
            subsequent_indent=hanging,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return out


def render(data: dict[str, Any], out: TextIO, width: int | None = None) -> None:
    """The report as text: nothing cut, lines within ``width`` (the terminal's, 60-100),
    save a single word longer than that."""
    width = width or terminal_width()
    wrap = textwrap.TextWrapper(width, break_long_words=False, break_on_hyphens=False)
    lines = wrap.wrap(headline(data))
    lines += _labelled(details(data), "  ", width)
    for i, row in enumerate(data["violations"], 1):
        lines.append("")
        lines += wrap.wrap(f"{i}. {row.get('rule', '')}")
        lines += _labelled(block(row), " " * 3, width)
    out.write("\n".join(lines) + "\n")


# -- markdown ---------------------------------------------------------------------------------

MD_COLUMNS = (
    ("rule", "rule"),
    ("level", "level"),
    ("party", "party"),
    ("method", "method"),
    ("count", "count"),
    ("rejected", "rejected"),
    ("earlier_runs", "earlier runs"),
    ("last_field", "field"),
    ("section", "section"),
    ("last_request_id", "last request id"),
    ("first_seen", "first seen"),
    ("last_seen", "last seen"),
    ("last_message", "message"),
)


def _md(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_markdown(data: dict[str, Any], out: TextIO) -> None:
    """The report for an audit record: what was judged, then a table, every message whole."""
    out.write(f"**{_md(headline(data))}**\n\n")
    for label, text in details(data):
        if label == "runs":
            out.write("- runs:\n")
        out.write(f"  - {_md(text)}\n" if label in ("runs", "") else f"- {label}: {_md(text)}\n")
    rows = data["violations"]
    if not rows:
        return
    earlier = any(row.get("earlier_runs") for row in rows)
    columns = [c for c in MD_COLUMNS if c[0] != "earlier_runs" or earlier]
    out.write(f"\n| {' | '.join(name for _, name in columns)} |\n|{'---|' * len(columns)}\n")
    for row in rows:
        cells = (_md(row.get(key, "")) for key, _ in columns)
        out.write(f"| {' | '.join(cells)} |\n")


# -- the command ------------------------------------------------------------------------------


def failing(data: dict[str, Any], fail_on: str) -> int:
    """Violations at the ``fail_on`` level or stronger."""
    levels = FAIL_ON[fail_on]
    return sum(int(r.get("count", 0)) for r in data["violations"] if r.get("level") in levels)


def load(ns: argparse.Namespace) -> dict[str, Any]:
    if getattr(ns, "file", None):
        from plugproxy.rules.violationlog import file_report  # noqa: PLC0415

        return file_report(ns.file)
    return fetch(ns.admin, ns.timeout)


async def run(ns: argparse.Namespace) -> int:
    data = load(ns)
    try:
        if ns.format == "json":
            json.dump(data, sys.stdout, indent=1, ensure_ascii=False)
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
