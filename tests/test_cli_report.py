"""`plugproxy report`: fetches /violations over HTTP and prints a table; errors in one line."""

from __future__ import annotations

import asyncio
import functools
import http.server
import io
import json
import os
import subprocess
import sys
import threading

import pytest

from plugproxy.cli import report
from plugproxy.core.endpoints import ConfigError
from tests.support import channel, start_proxy, start_recorder

DELETE = "/csi.v1.Controller/DeleteVolume"
PROBE = "/csi.v1.Identity/Probe"


async def test_report_prints_what_the_proxy_saw(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    plugin.raw[DELETE] = lambda req: b""
    plugin.raw[PROBE] = lambda req: b""
    # The recorder's OK to the bad request (csi.bad-request-accepted) is not what is counted.
    proxy = await start_proxy(
        listen, upstream, "--admin-listen", "127.0.0.1:0", "--rule", "csi.bad-request-accepted=off"
    )

    def cli(*args: str, at: str = "", columns: str = "") -> subprocess.CompletedProcess[str]:
        """The CLI entry point, as an operator runs it (into a pipe, or a terminal of
        ``columns``)."""
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        if columns:
            env["COLUMNS"] = columns
        return subprocess.run(
            [sys.executable, "-m", "plugproxy", "report", "--admin", at or admin, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )

    try:
        async with channel(listen) as ch:
            await ch.unary_unary(DELETE)(b"", timeout=5)
            await ch.unary_unary(DELETE)(b"", timeout=5)
            await ch.unary_unary(PROBE)(b"", timeout=5)
        admin = f"http://127.0.0.1:{proxy.admin.port}"
        data = await asyncio.to_thread(report.fetch, admin)
        plain, gate, relaxed, markdown, narrow, given_path = await asyncio.gather(
            asyncio.to_thread(cli),
            asyncio.to_thread(cli, "--fail-on", "must"),
            asyncio.to_thread(cli, "--fail-on", "never"),
            asyncio.to_thread(cli, "--format", "markdown"),
            asyncio.to_thread(cli, columns="80"),
            # the URL of the report itself, as a browser shows it, is taken as it is
            asyncio.to_thread(cli, "--format", "json", at=admin + "/violations/"),
        )
        # Piped into a reader that stops at the first line: no traceback, in any format.
        piped = [
            await asyncio.to_thread(
                subprocess.run,
                f"{sys.executable} -m plugproxy report --admin {admin} {fmt} | head -n 1",
                shell=True,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            for fmt in ("", "--format markdown", "--format json")
        ]
    finally:
        await proxy.stop(0)
        await server.stop(0)
    out = io.StringIO()
    report.render(data, out, width=100)
    text = out.getvalue()
    lines = text.splitlines()
    # what was judged first: three calls (the probe had nothing wrong), window, mode, spec
    assert data["calls_judged"] == 3 and data["since"] <= data["until"]
    assert (
        lines[0] == f"2 violations in 3 calls judged since {data['since']} (validation mode: audit)"
    )
    assert lines[1].split() == ["window", data["since"], "to", data["until"]]
    assert lines[2].split() == ["specs", "csi.v1", "(3", "calls)"]
    assert lines[3].split() == [
        "rejected",
        "none:",
        "every",
        "violation",
        "was",
        "reported",
        "only",
    ]
    # then one block per violation, every field labelled, the message whole
    last_id = data["violations"][0]["last_request_id"]
    block = text.split("\n\n")[1].splitlines()
    assert [line.split(None, 1)[0] for line in block] == [
        "1.",
        "level",
        "method",
        "count",
        "rejected",
        "field",
        "section",
        "first",
        "last",
        "message",
    ]
    assert block[0] == "1. csi.required-field"
    assert block[1].split() == ["level", "MUST,", "party", "co"]
    assert block[2].split() == ["method", DELETE]
    assert block[3].split() == ["count", "2"]
    assert block[4].split() == ["rejected", "0:", "reported", "only"]
    assert block[5].split() == ["field", "volume_id"]
    assert block[6].split() == ["section", "CSI", "v1.12", "§DeleteVolume"]
    # the last call's request id, as the call log and the violation log line carry it
    assert block[8].split()[-2:] == ["request", last_id]
    assert block[9].split(None, 1)[1] == "volume_id is REQUIRED but empty"
    assert all(len(line) <= 100 for line in lines)
    assert plain.returncode == 0 and relaxed.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[0] == lines[0]  # into a pipe: 100 columns
    assert all(len(line) <= 100 for line in plain.stdout.splitlines())
    assert all(len(line) <= 80 for line in narrow.stdout.splitlines()), narrow.stdout
    assert "volume_id is REQUIRED but empty" in narrow.stdout
    assert given_path.returncode == 0, given_path.stderr
    assert json.loads(given_path.stdout)["violations"][0]["count"] == 2
    assert gate.returncode == 1 and "csi.required-field" in gate.stdout
    assert [p.stdout.split()[:2] for p in piped] == [
        ["2", "violations"],
        ["**2", "violations"],
        ["{"],
    ]
    assert all(p.returncode == 0 and "Traceback" not in p.stderr for p in piped)
    md = markdown.stdout.splitlines()
    assert md[0] == f"**{lines[0]}**"
    assert "- specs: csi.v1 (3 calls)" in md
    header = md.index(
        "| rule | level | party | method | count | rejected | field | section"
        " | last request id | first seen | last seen | message |"
    )
    assert md[header + 2].startswith(
        f"| csi.required-field | MUST | co | {DELETE} | 2 | 0 | volume_id |"
    )
    assert md[header + 2].endswith(" | volume_id is REQUIRED but empty |")


def test_fail_on_counts_the_level_asked_for_and_stronger():
    data = {"violations": [{"level": "SHOULD", "count": 3}]}
    assert report.failing(data, "must") == 0
    assert report.failing(data, "should") == 3
    assert report.failing(data, "never") == 0


def test_nothing_found_still_says_what_was_judged():
    out = io.StringIO()
    data = {
        "since": "2027-01-15T08:00:00Z",
        "until": "2027-01-15T09:00:00Z",
        "mode": "audit",
        "calls_judged": 1234,
        "calls_judged_by_spec": {"csi.v1": 1200, "cosi.v1alpha1": 34},
        "total": 0,
        "violations": [],
    }
    report.render(data, out, width=100)
    assert out.getvalue().splitlines() == [
        "0 violations in 1,234 calls judged since 2027-01-15T08:00:00Z (validation mode: audit)",
        "  window      2027-01-15T08:00:00Z to 2027-01-15T09:00:00Z",
        "  specs       csi.v1 (1,200 calls), cosi.v1alpha1 (34 calls)",
    ]
    md = io.StringIO()
    report.render_markdown(data, md)
    assert "|" not in md.getvalue()  # no table without a row


async def test_a_proxy_that_found_nothing_says_how_much_it_judged(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    plugin.raw[PROBE] = lambda req: b""
    proxy = await start_proxy(listen, upstream, "--admin-listen", "127.0.0.1:0")
    try:
        async with channel(listen) as ch:
            for _ in range(2):
                await ch.unary_unary(PROBE)(b"", timeout=5)
        assert proxy.admin is not None
        data = await asyncio.to_thread(report.fetch, f"127.0.0.1:{proxy.admin.port}")
    finally:
        await proxy.stop(0)
        await server.stop(0)
    out = io.StringIO()
    report.render(data, out, width=100)
    assert out.getvalue().splitlines()[:3] == [
        f"0 violations in 2 calls judged since {data['since']} (validation mode: audit)",
        f"  window      {data['since']} to {data['until']}",
        "  specs       csi.v1 (2 calls)",
    ]


def test_long_messages_are_wrapped_whole_within_the_width():
    words = [f"word{i}" for i in range(120)]
    message = " ".join(words) + " (§Error Scheme)"
    row = {
        "rule": "csi.topology-requirement-without-capability",
        "level": "MUST",
        "party": "co",
        "method": "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
        "count": 3,
        "rejected": 2,
        "last_field": "accessibility_requirements.requisite[12].segments[key 3]",
        "section": "CSI v1.12 §CreateVolume, §GetCapacity",
        "first_seen": "2027-01-15T08:00:00Z",
        "last_seen": "2027-01-15T08:30:00Z",
        "last_request_id": "0123456789abcdef0123456789abcdef",
        "last_message": message,
    }
    data = {"since": "2027-01-15T08:00:00Z", "calls_judged": 9, "violations": [row]}
    for width in (80, 100):
        out = io.StringIO()
        report.render(data, out, width=width)
        lines = out.getvalue().splitlines()
        assert all(len(line) <= width for line in lines), width
        start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["message"])
        shown = " ".join(lines[start:]).split(None, 1)[1]
        assert " ".join(shown.split()) == message
        assert any("2 of 3: the proxy answered those calls itself" in line for line in lines)


def test_unreachable_admin_is_one_line_and_exit_2():
    try:
        report.fetch("http://127.0.0.1:1", timeout=2)
    except ConfigError as exc:
        assert "cannot reach the admin server" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("expected ConfigError")
    result = subprocess.run(
        [sys.executable, "-m", "plugproxy", "report", "--admin", "http://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "cannot reach" in result.stderr


async def test_a_404_says_whether_validation_is_off_or_the_path_is_wrong(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    server, _ = await start_recorder(upstream)
    off = await start_proxy(
        str(tmp_path / "off.sock"), upstream, "--admin-listen", "127.0.0.1:0", "--validation", "off"
    )
    on = await start_proxy(str(tmp_path / "on.sock"), upstream, "--admin-listen", "127.0.0.1:0")
    # another web server on the port given: a file server, which has no /violations
    files = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), files)
    threading.Thread(target=other.serve_forever, daemon=True).start()

    def error(admin: str) -> str:
        with pytest.raises(ConfigError) as exc:
            report.fetch(admin, timeout=5)
        assert "\n" not in str(exc.value)
        return str(exc.value)

    try:
        assert off.admin is not None and on.admin is not None
        off_url = f"http://127.0.0.1:{off.admin.port}"
        on_root = f"http://127.0.0.1:{on.admin.port}"
        validation_off, wrong_path, not_ours = await asyncio.gather(
            asyncio.to_thread(error, off_url + "/violations"),
            asyncio.to_thread(error, on_root + "/plugproxy"),
            asyncio.to_thread(error, f"127.0.0.1:{other.server_address[1]}"),
        )
        cli = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "plugproxy", "report", "--admin", off_url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        other.shutdown()
        other.server_close()
        await off.stop(0)
        await on.stop(0)
        await server.stop(0)
    assert validation_off == (
        f"{off_url}/violations: HTTP 404: validation is off in this proxy (--validation off and"
        " no --rule turning a rule on), so it keeps no violations"
    )
    assert wrong_path == (
        f"{on_root}/plugproxy/violations: HTTP 404: wrong path; this admin server serves its"
        f" report at {on_root}/violations (--admin {on_root})"
    )
    assert "not a plugproxy admin server" in not_ours
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1
    assert "validation is off in this proxy" in cli.stderr
