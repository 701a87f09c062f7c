"""`plugproxy report`: fetches /violations over HTTP and prints a table; errors in one line."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys

from plugproxy import report
from plugproxy.endpoints import ConfigError
from tests.support import channel, start_proxy, start_recorder

DELETE = "/csi.v1.Controller/DeleteVolume"
PROBE = "/csi.v1.Identity/Probe"


async def test_report_prints_a_table_of_what_the_proxy_saw(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    plugin.raw[DELETE] = lambda req: b""
    plugin.raw[PROBE] = lambda req: b""
    # The recorder's OK to the bad request (csi.bad-request-accepted) is not what is counted.
    proxy = await start_proxy(
        listen, upstream, "--admin-listen", "127.0.0.1:0", "--rule", "csi.bad-request-accepted=off"
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        """The CLI entry point, as an operator runs it."""
        return subprocess.run(
            [sys.executable, "-m", "plugproxy", "report", "--admin", admin, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    try:
        async with channel(listen) as ch:
            await ch.unary_unary(DELETE)(b"", timeout=5)
            await ch.unary_unary(DELETE)(b"", timeout=5)
            await ch.unary_unary(PROBE)(b"", timeout=5)
        admin = f"http://127.0.0.1:{proxy.admin.port}"
        data = await asyncio.to_thread(report.fetch, admin)
        plain, gate, relaxed, markdown = await asyncio.gather(
            asyncio.to_thread(cli),
            asyncio.to_thread(cli, "--fail-on", "must"),
            asyncio.to_thread(cli, "--fail-on", "never"),
            asyncio.to_thread(cli, "--format", "markdown"),
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
    report.render(data, out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == [
        "COUNT",
        "LEVEL",
        "PARTY",
        "RULE",
        "METHOD",
        "FIELD",
        "SECTION",
        "REQUEST_ID",
        "LAST_SEEN",
        "LAST_MESSAGE",
    ]
    assert lines[1].split()[:6] == ["2", "MUST", "co", "csi.required-field", DELETE, "volume_id"]
    # the last call's request id, as the call log and the violation log line carry it
    last_id = data["violations"][0]["last_request_id"]
    assert last_id and last_id in lines[1]
    # the denominator and the window: three calls judged (the probe had nothing wrong)
    assert data["calls_judged"] == 3 and data["since"] <= data["until"]
    assert lines[-1].startswith("2 violation(s) in 3 call(s) judged, ")
    assert plain.returncode == 0 and relaxed.returncode == 0, plain.stderr
    assert gate.returncode == 1 and "csi.required-field" in gate.stdout
    assert [p.stdout.split()[:2] for p in piped] == [["COUNT", "LEVEL"], ["|", "count"], ["{"]]
    assert all(p.returncode == 0 and "Traceback" not in p.stderr for p in piped)
    md = markdown.stdout.splitlines()
    assert md[0].startswith("| count | level | party | rule | method | field |")
    assert md[2].startswith(f"| 2 | MUST | co | csi.required-field | {DELETE} | volume_id |")
    assert md[-1].startswith("2 violation(s) in 3 call(s) judged, ")


def test_fail_on_counts_the_level_asked_for_and_stronger():
    data = {"violations": [{"level": "SHOULD", "count": 3}]}
    assert report.failing(data, "must") == 0
    assert report.failing(data, "should") == 3
    assert report.failing(data, "never") == 0


def test_empty_report():
    out = io.StringIO()
    report.render({"total": 0, "violations": []}, out)
    assert out.getvalue() == "no violations\n"


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
