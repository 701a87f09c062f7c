"""The violation record outlives the proxy: --violations-file across a restart, a proxy
killed outright, a mode change and rotation, read back over /violations and by
`plugproxy report --file` with no proxy running."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any

from plugproxy.fakes import FakeKnobs, SpecClient, start_fake_plugin
from tests.support import admin_get, start_proxy, wait_until

INFO = "/csi.v1.Identity/GetPluginInfo"
DELETE = "/csi.v1.Controller/DeleteVolume"


async def violations(proxy: Any) -> dict[str, Any]:
    status, body = await asyncio.to_thread(admin_get, proxy.admin.port, "/violations")
    assert status == 200, body
    return dict(json.loads(body))


def counts(data: dict[str, Any]) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    """(rule, method, party) -> (count, rejected, from earlier runs)."""
    return {
        (e["rule"], e["method"], e["party"]): (e["count"], e["rejected"], e["earlier_runs"])
        for e in data["violations"]
    }


def report_file(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "plugproxy", "report", "--file", path, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


async def calls(sock: str, infos: int, bad_deletes: int) -> None:
    """GetPluginInfo answered with a bad plugin name (the plugin's violation) and
    DeleteVolume without a volume_id (the CO's)."""
    client = SpecClient(f"unix://{sock}", "csi.v1")
    try:
        for _ in range(infos):
            await client.call("GetPluginInfo")
        for _ in range(bad_deletes):
            try:
                await client.call("DeleteVolume", volume_id="")
            except Exception as exc:  # INVALID_ARGUMENT from the plugin or the proxy
                assert "INVALID_ARGUMENT" in str(exc)
    finally:
        await client.close()


async def test_a_restart_keeps_the_record_and_the_counts_add_up(tmp_path):
    plugin_sock, sock = str(tmp_path / "plugin.sock"), str(tmp_path / "csi.sock")
    record = str(tmp_path / "violations.jsonl")
    knobs = FakeKnobs(misbehave={"plugin-name-invalid"})
    plugin = await start_fake_plugin("csi.v1", f"unix://{plugin_sock}", knobs)
    flags = ("--admin-listen", "127.0.0.1:0", "--violations-file", record)
    name_rule = ("csi.plugin-name-format", INFO, "plugin")
    delete_rule = ("csi.required-field", DELETE, "co")
    try:
        first = await start_proxy(sock, plugin_sock, *flags)
        try:
            await calls(sock, infos=2, bad_deletes=1)
            before = await violations(first)
        finally:
            await first.stop(0)
        assert counts(before) == {name_rule: (2, 0, 0), delete_rule: (1, 0, 0)}
        assert before["calls_judged"] == 3

        second = await start_proxy(sock, plugin_sock, *flags, "--validation", "enforce")
        try:
            restarted = await violations(second)  # before any call: what the file held
            await calls(sock, infos=1, bad_deletes=2)
            after = await violations(second)
        finally:
            await second.stop(0)
    finally:
        await plugin.stop(0)

    assert counts(restarted) == {name_rule: (2, 0, 2), delete_rule: (1, 0, 1)}
    assert restarted["since"] == before["since"] and restarted["calls_judged"] == 3
    # the counts add up; enforce rejected the two bad deletes of the second run only
    assert counts(after) == {name_rule: (3, 0, 2), delete_rule: (3, 2, 1)}
    assert after["calls_judged"] == 6 and after["total"] == 6 and after["rejected"] == 2
    runs = [
        (r["mode"], r["calls_judged"], r["violations"], r.get("current")) for r in after["runs"]
    ]
    assert runs == [("audit", 3, 3, None), ("enforce", 3, 3, True)]
    assert after["runs"][0]["stopped"] is not None

    # Nothing running: the file gives the same report.
    text, as_json = await asyncio.gather(
        asyncio.to_thread(report_file, record),
        asyncio.to_thread(report_file, record, "--format", "json"),
    )
    assert text.returncode == 0, text.stderr
    from_file = json.loads(as_json.stdout)
    assert {k: v[:2] for k, v in counts(from_file).items()} == {
        k: v[:2] for k, v in counts(after).items()
    }
    assert from_file["calls_judged"] == 6 and from_file["since"] == before["since"]
    lines = text.stdout.splitlines()
    headline = " ".join(lines[: next(i for i, ln in enumerate(lines) if ln.startswith("  "))])
    assert headline == (
        f"6 violations in 6 calls judged since {before['since']}"
        " (validation mode: enforce; earlier runs: audit)"
    )
    assert all(len(line) <= 100 for line in lines)
    messages = {e["last_message"] for e in after["violations"]}
    flat = " ".join(text.stdout.split())
    assert all(" ".join(m.split()) in flat for m in messages)
    assert "rejected    2 of 3: the proxy answered those calls itself" in text.stdout


async def test_a_proxy_killed_outright_leaves_what_it_saw(tmp_path):
    """SIGKILL (the OOM killer, a node lost): violations older than a second are on disk,
    and the next proxy on the file counts them."""
    plugin_sock, sock = str(tmp_path / "plugin.sock"), str(tmp_path / "csi.sock")
    record = str(tmp_path / "violations.jsonl")
    knobs = FakeKnobs(misbehave={"plugin-name-invalid"})
    plugin = await start_fake_plugin("csi.v1", f"unix://{plugin_sock}", knobs)
    serve = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "plugproxy",
        "serve",
        "--listen",
        f"unix://{sock}",
        "--upstream",
        f"unix://{plugin_sock}",
        "--admin-listen",
        "off",
        "--violations-file",
        record,
        stdout=asyncio.subprocess.DEVNULL,
    )
    try:
        await wait_until(lambda: os.path.exists(sock), timeout=30)
        await calls(sock, infos=2, bad_deletes=0)
        await wait_until(lambda: written(record).count('"event":"violation"') == 2)
        serve.send_signal(signal.SIGKILL)
        await serve.wait()
        proxy = await start_proxy(
            sock, plugin_sock, "--admin-listen", "127.0.0.1:0", "--violations-file", record
        )
        try:
            data = await violations(proxy)
        finally:
            await proxy.stop(0)
    finally:
        if serve.returncode is None:
            serve.kill()
            await serve.wait()
        await plugin.stop(0)
    assert counts(data) == {("csi.plugin-name-format", INFO, "plugin"): (2, 0, 2)}
    killed, current = data["runs"]
    assert killed["stopped"] is None and killed["violations"] == 2 and current["current"]
    out = await asyncio.to_thread(report_file, record)
    assert "ended without a stop record" in out.stdout


async def test_rotation_bounds_the_file_and_keeps_the_latest(tmp_path):
    plugin_sock, sock = str(tmp_path / "plugin.sock"), str(tmp_path / "csi.sock")
    record = str(tmp_path / "violations.jsonl")
    plugin = await start_fake_plugin("csi.v1", f"unix://{plugin_sock}")
    proxy = await start_proxy(
        sock, plugin_sock, "--violations-file", record, "--violations-file-max-bytes", "64KiB"
    )
    try:
        await calls(sock, infos=0, bad_deletes=600)
    finally:
        await proxy.stop(0)
        await plugin.stop(0)
    sizes = os.path.getsize(record) + os.path.getsize(record + ".1")
    assert 32 * 1024 < sizes <= 64 * 1024  # PATH.1 full, PATH filling
    out = await asyncio.to_thread(report_file, record, "--format", "json")
    data = json.loads(out.stdout)
    # the missing volume_id, and its re-sends on one connection after INVALID_ARGUMENT
    by_rule = {e["rule"]: e for e in data["violations"]}
    assert set(by_rule) == {"csi.required-field", "csi.retry-without-change"}
    entry = by_rule["csi.required-field"]
    # the oldest went with the first PATH.1: of 600 + 599 violations, the latest fill 64 KiB
    assert 30 < entry["count"] < 600
    assert sum(e["count"] for e in by_rule.values()) < 1199
    last = request_ids(record)[-1]
    assert entry["last_request_id"] == last


def written(record: str) -> str:
    with open(record, encoding="utf-8") as f:
        return f.read()


def request_ids(record: str) -> list[str]:
    with open(record) as f:
        return [json.loads(line).get("request_id") for line in f if '"violation"' in line]
