"""The command line as a user meets it: one-line errors, env twins, SIGTERM drain (subprocesses)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys

import grpc
import pytest

from plugproxy.cli import main as cli
from plugproxy.cli.flags import action_default
from tests.support import ECHO, channel, start_recorder, wait_until

CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("PLUGPROXY_")}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plugproxy", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**CLEAN_ENV, **(env or {})},
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["serve", "--listen", "bogus://x", "--upstream", "unix:///tmp/p.sock"], {}, "unsupported scheme"),
        (["serve", "--listen", "unix:///no/such/dir/csi.sock", "--upstream", "unix:///tmp/p.sock"], {}, "does not exist"),
        (["serve", "--listen", "unix:///tmp/a.sock", "--upstream", "tcp://host"], {}, "missing port"),
        (["serve", "--listen", "unix:///tmp/a.sock", "--upstream", "unix:///tmp/p.sock", "--spec", "csi.v9"], {}, "invalid choice"),
        (["serve", "--upstream", "unix:///tmp/p.sock"], {}, "--listen is required"),
        (["serve", "--listen", "unix:///tmp/a.sock", "--upstream", "unix:///tmp/p.sock", "--max-message-bytes", "lots"], {}, "not a size"),
        (["serve"], {"PLUGPROXY_LISTEN": "unix:///tmp/a.sock", "PLUGPROXY_UPSTREAM": "unix:///tmp/p.sock", "PLUGPROXY_SHUTDOWN_GRACE": "soon"}, "PLUGPROXY_SHUTDOWN_GRACE"),
        (["serve", "--listen", "unix:///tmp/same.sock", "--upstream", "unix:///tmp/same.sock"], {}, "same socket"),
        (["serve", "--listen", "unix:///tmp/a.sock", "--upstream", "unix:///tmp/p.sock"], {"PLUGPROXY_INSECURE_TCP": "maybe"}, "expected true or false (or 1/0, yes/no, on/off)"),
        (["prepare-dir", "relative/dir"], {}, "expected an absolute path"),
    ],
)  # fmt: skip
def test_misconfiguration_fails_fast_with_one_line(args, env, expected):
    result = run_cli(*args, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert lines[0].startswith("plugproxy: error:")


def test_help_lists_env_twins():
    result = run_cli("serve", "--help")
    assert result.returncode == 0
    assert "PLUGPROXY_LISTEN" in result.stdout
    assert "PLUGPROXY_MAX_MESSAGE_BYTES" in result.stdout


def test_help_shows_each_default_as_it_would_be_written():
    result = run_cli("serve", "--help")
    text = " ".join(result.stdout.split())  # argparse wraps lines
    for shown in (
        "(default: 16MiB)",  # --max-message-bytes
        "(default: 0660)",  # --socket-mode
        "(default: 30s)",  # --shutdown-grace
        "(default: 1m)",  # --plugin-wait
        "(default: 127.0.0.1:9808)",  # --admin-listen
        "(default: audit)",  # --validation
        "/metrics and /violations",  # what the admin server serves
    ):
        assert shown in text, shown


@pytest.mark.parametrize(
    ("argv", "environ", "named"),
    [
        (["--rule", "csi.size-limit=loud"], {}, "--rule 'csi.size-limit=loud'"),
        ([], {"PLUGPROXY_RULE": "csi.size-limit=loud"}, "PLUGPROXY_RULE 'csi.size-limit=loud'"),
        (["--admin-listen", "nowhere"], {}, "--admin-listen 'nowhere'"),
        ([], {"PLUGPROXY_ADMIN_LISTEN": "nowhere"}, "PLUGPROXY_ADMIN_LISTEN 'nowhere'"),
        ([], {"PLUGPROXY_LISTEN": "unix://relative"}, "PLUGPROXY_LISTEN 'unix://relative'"),
        (["--listen", "unix://relative"], {}, "--listen 'unix://relative'"),
    ],
)
def test_a_bad_value_is_named_by_where_it_came_from(argv, environ, named):
    """The flag when it was given on the command line, the variable when it came from there."""
    env = {"PLUGPROXY_LISTEN": "unix:///tmp/l.sock", "PLUGPROXY_UPSTREAM": "unix:///tmp/u.sock"}
    result = run_cli("serve", *argv, env={**env, **environ})
    assert result.returncode == 2
    assert named in result.stderr, result.stderr


def test_every_duration_option_takes_units():
    from plugproxy.cli import serve
    from plugproxy.core.options import duration

    durations = [o for o in serve.all_options() if o.metavar == "DURATION"]
    assert {o.flag for o in durations} >= {"--capability-query-timeout", "--plugin-wait"}
    assert all(o.type is duration for o in durations)
    assert not [o.flag for o in serve.all_options() if o.metavar == "SECONDS"]
    ns = serve.parse_args(
        ["--listen", "unix:///l", "--upstream", "unix:///u", "--capability-query-timeout", "1s"],
        environ={},
    )
    assert ns.capability_query_timeout == 1.0


async def start_serve(listen: str, upstream: str, **env: str) -> asyncio.subprocess.Process:
    """`plugproxy serve` in a subprocess, configured through its environment (``env`` on
    top of the endpoints and no admin server), its output piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "plugproxy",
        "serve",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={
            **CLEAN_ENV,
            "PLUGPROXY_LISTEN": f"unix://{listen}",
            "PLUGPROXY_UPSTREAM": f"unix://{upstream}",
            "PLUGPROXY_ADMIN_LISTEN": "off",
            **env,
        },
    )


async def test_sigterm_drains_calls_in_flight_and_exits_zero(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "csi.sock")
    server, plugin = await start_recorder(upstream)
    proc = await start_serve(listen, upstream, PLUGPROXY_SHUTDOWN_GRACE="10s")
    try:
        await wait_until(lambda: os.path.exists(listen), timeout=15)
        async with channel(listen) as ch:
            calls = [
                asyncio.ensure_future(ch.unary_unary(ECHO + "Slow")(b"1.5", timeout=20))
                for _ in range(3)
            ]
            await wait_until(lambda: len(plugin.seen) == 3, timeout=10)
            proc.send_signal(signal.SIGTERM)
            results = await asyncio.gather(*calls, return_exceptions=True)
        assert results == [b"slow-done"] * 3
        code = await asyncio.wait_for(proc.wait(), 15)
        out = (await proc.stdout.read()).decode()
        assert code == 0
        assert "shutting down" in out and "SIGTERM" in out
        assert not os.path.exists(listen)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.stop(0)


async def test_new_calls_are_refused_while_draining(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    listen = str(tmp_path / "csi.sock")
    server, plugin = await start_recorder(upstream)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "plugproxy", "serve",
        "--listen", f"unix://{listen}", "--upstream", f"unix://{upstream}",
        "--admin-listen", "off", "--shutdown-grace", "5s",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=CLEAN_ENV,
    )  # fmt: skip
    try:
        await wait_until(lambda: os.path.exists(listen), timeout=15)
        async with channel(listen) as ch:
            slow = asyncio.ensure_future(ch.unary_unary(ECHO + "Slow")(b"1.5", timeout=20))
            await wait_until(lambda: len(plugin.seen) == 1, timeout=10)
            proc.send_signal(signal.SIGTERM)
            # The signal is handled when the proxy's loop gets to it (later on a busy
            # machine): call until a call is refused, which must happen while the slow
            # call is still draining.
            refused = None
            for _ in range(40):
                try:
                    await ch.unary_unary(ECHO + "Unary")(b"late", timeout=3)
                except grpc.aio.AioRpcError as exc:
                    refused = exc
                    break
                await asyncio.sleep(0.025)
            assert refused is not None and refused.code() is grpc.StatusCode.UNAVAILABLE
            assert not slow.done()
            assert await slow == b"slow-done"
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.stop(0)


def test_serve_imports_only_what_serve_needs():
    # Every node runs `serve`: the manifest editor of `inject`/`webhook` and the fake
    # plugins of `demo` must not be loaded (or resident) there.
    probe = (
        "import sys; from plugproxy.cli import main as cli;"
        " cli.build_parser(['serve', '--listen', 'x']);"
        "print(sorted(m for m in sys.modules if m.startswith(('ruamel', 'plugproxy.cli.inject',"
        " 'plugproxy.cli.webhook', 'plugproxy.cli.demo', 'plugproxy.fakes'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.strip() == "[]"


def test_every_subcommand_has_its_arguments_when_chosen():
    for name in ("serve", "fake-plugin", "demo", "report", "inject", "webhook"):
        result = run_cli(name, "--help")
        assert result.returncode == 0, result.stderr
        assert f"usage: plugproxy {name}" in result.stdout
        assert "options:" in result.stdout and "--" in result.stdout.split("options:", 1)[1]


@pytest.mark.parametrize(("choice", "loop"), [("auto", "uvloop"), ("asyncio", "asyncio")])
async def test_serve_runs_on_the_event_loop_chosen(tmp_path, choice, loop):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "csi.sock")
    server, _ = await start_recorder(upstream)
    proc = await start_serve(listen, upstream, PLUGPROXY_EVENT_LOOP=choice)
    try:
        await wait_until(lambda: os.path.exists(listen), timeout=15)
        async with channel(listen) as ch:
            assert await ch.unary_unary(ECHO + "Unary")(b"hi", timeout=10) == b"echo:hi"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        out = (await proc.stdout.read()).decode()
        assert f'"event_loop":"{loop}"' in out
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.stop(0)


def test_an_event_loop_that_is_not_installed_is_a_one_line_error():
    # uvloop made unimportable, as on a platform it does not install on.
    probe = (
        "import sys; sys.modules['uvloop'] = None; from plugproxy.cli import main as cli;"
        "sys.exit(cli.main(['serve', '--listen', 'unix:///tmp/a.sock',"
        " '--upstream', 'unix:///tmp/p.sock', '--event-loop', 'uvloop']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "plugproxy: error: --event-loop uvloop: uvloop is not installed (pip install uvloop); "
        "--event-loop asyncio uses the standard library's loop"
    )


def test_the_top_level_help_says_what_plugproxy_is_for():
    text = " ".join(run_cli("--help").stdout.split())
    for said in ("CSI", "COSI", "CMI", "KMS v2", "device plugins", "DRA", "plugin registration"):
        assert said in text, said
    assert "any gRPC API from its descriptors" in text


def _help_entries(help_text: str) -> dict[str, str]:
    """Option strings -> their help, from --help's text (an entry starts with "  -")."""
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in help_text.splitlines():
        if line.startswith("  -"):
            current = [line]
            entries[line.split()[0].rstrip(",")] = ""
        elif current and line.startswith("   "):
            current.append(line)
        else:
            current = []
        if current:
            entries[current[0].split()[0].rstrip(",")] = " ".join(" ".join(current).split())
    return entries


def test_every_subcommand_has_a_description_and_every_option_its_default(monkeypatch):
    """Walks every subcommand's parser: an option with a default (not None, false or empty)
    says it in its help, as one would write it."""
    monkeypatch.setenv("COLUMNS", "100")
    parser = cli.build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    for name, sub in subparsers.choices.items():
        assert sub.description and len(sub.description) > 20, name
        entries = _help_entries(sub.format_help())
        for action in sub._actions:
            shown = action_default(action)
            if not shown:
                continue
            entry = entries[action.option_strings[0]]
            if "default" not in entry.lower() or shown.split(",")[0] not in entry:
                missing.append(f"{name} {action.option_strings[0]} (default {shown}): {entry}")
    assert not missing, "\n".join(missing)


def test_fake_plugin_help_names_the_short_spec_names_it_takes():
    from plugproxy.fakes.server import FAKE_SPECS
    from plugproxy.spec.registry import SPEC_ALIASES

    text = " ".join(run_cli("fake-plugin", "--help").stdout.split())
    served = [alias for alias, spec in SPEC_ALIASES.items() if spec in FAKE_SPECS]
    assert served, "no short name for a spec the fakes serve"
    for alias in served:
        assert f"{alias} ({SPEC_ALIASES[alias]})" in text
