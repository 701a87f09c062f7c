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


async def test_report_prints_a_table_of_what_the_proxy_saw(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "proxy.sock")
    server, plugin = await start_recorder(upstream)
    plugin.raw[DELETE] = lambda req: b""
    # The recorder's OK to the bad request (csi.bad-request-accepted) is not what is counted.
    proxy = await start_proxy(
        listen, upstream, "--admin-listen", "127.0.0.1:0", "--rule", "csi.bad-request-accepted=off"
    )
    try:
        async with channel(listen) as ch:
            await ch.unary_unary(DELETE)(b"", timeout=5)
            await ch.unary_unary(DELETE)(b"", timeout=5)
        admin = f"http://127.0.0.1:{proxy.admin.port}"
        data = await asyncio.to_thread(report.fetch, admin)
        # the CLI entry point, as an operator runs it
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "plugproxy", "report", "--admin", admin],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        await proxy.stop(0)
        await server.stop(0)
    out = io.StringIO()
    report.render(data, out)
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:5] == ["COUNT", "LEVEL", "PARTY", "RULE", "METHOD"]
    assert lines[1].split()[:5] == ["2", "MUST", "co", "csi.required-field", DELETE]
    assert lines[-1] == "2 violation(s)"
    assert result.returncode == 0, result.stderr
    assert "csi.required-field" in result.stdout


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
