"""tools/gen_docs.py: the generated docs are fresh, complete, and leave authored text alone."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
from types import ModuleType

import pytest

from plugproxy.cli import serve

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "gen_docs.py"


@pytest.fixture(scope="module")
def gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", TOOL)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def configuration(gen_docs: ModuleType) -> str:
    text: str = gen_docs.render_configuration()
    return text


def test_committed_docs_are_fresh() -> None:
    """What CI runs: fails when an option, metric or rule changed without `make docs`."""
    result = subprocess.run(
        [sys.executable, str(TOOL), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_mode_reports_stale_files_and_write_mode_fixes_them(
    gen_docs: ModuleType, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "configuration.md").write_text("# outdated\n", encoding="utf-8")
    assert gen_docs.main(["--check", "--root", str(tmp_path)]) == 1
    assert "docs/configuration.md" in capsys.readouterr().out
    assert (docs / "configuration.md").read_text(encoding="utf-8") == "# outdated\n"
    assert gen_docs.main(["--root", str(tmp_path)]) == 0
    assert gen_docs.main(["--check", "--root", str(tmp_path)]) == 0


def test_every_option_is_documented_with_env_default_and_help(configuration: str) -> None:
    for opt in serve.all_options():
        row = next((line for line in configuration.splitlines() if f"`{opt.env}`" in line), None)
        assert row is not None, f"{opt.flag} is missing"
        assert row.startswith(f"| `{opt.flag}")
        assert opt.help.split(";")[0].replace("|", "\\|") in row


def test_defaults_are_shown_as_an_operator_would_write_them(configuration: str) -> None:
    def row(env: str) -> str:
        return next(line for line in configuration.splitlines() if f"| `{env}` |" in line)

    rows = {opt.env: row(opt.env) for opt in serve.all_options()}
    assert "`16MiB`" in rows["PLUGPROXY_MAX_MESSAGE_BYTES"]
    assert "`0660`" in rows["PLUGPROXY_SOCKET_MODE"]
    assert "`30s`" in rows["PLUGPROXY_SHUTDOWN_GRACE"]
    assert "`127.0.0.1:9808`" in rows["PLUGPROXY_ADMIN_LISTEN"]
    # Choices are spelled out in the flag column.
    assert "json\\|text" in rows["PLUGPROXY_LOG_FORMAT"]


def test_option_tables_follow_the_cli_order(gen_docs: ModuleType, configuration: str) -> None:
    flags = [opt.flag for _, _, group in gen_docs.option_groups() for opt in group]
    assert flags == [opt.flag for opt in serve.all_options()]
    positions = [configuration.index(f"| `{flag}") for flag in flags]
    assert positions == sorted(positions)


def test_metrics_table_lists_what_the_proxy_registers(
    gen_docs: ModuleType, configuration: str
) -> None:
    rows = gen_docs.metric_definitions()
    names = [name for name, _, _, _ in rows]
    assert len(names) == len(set(names))
    for name, kind, _, labels in rows:
        assert f"| `{name}` | {kind} |" in configuration
        for label in labels:
            assert f"`{label}`" in configuration
    if names:
        # Counters are listed under the name their samples carry.
        counters = [name for name, kind, _, _ in rows if kind == "counter"]
        assert all(name.endswith("_total") for name in counters)


def test_marked_sections_are_regenerated_and_authored_text_is_kept(
    gen_docs: ModuleType, tmp_path: pathlib.Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    authored = (
        "# Page\n\nWritten by hand.\n\n"
        "<!-- BEGIN GENERATED: options -->\nold table\n<!-- END GENERATED: options -->\n\n"
        "<!-- BEGIN GENERATED: no-such-generator -->\nkept\n"
        "<!-- END GENERATED: no-such-generator -->\n\nThe end.\n"
    )
    page = docs / "page.md"
    page.write_text(authored, encoding="utf-8")
    assert gen_docs.main(["--root", str(tmp_path)]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Page\n\nWritten by hand.\n\n<!-- BEGIN GENERATED: options -->\n")
    assert text.endswith("<!-- END GENERATED: no-such-generator -->\n\nThe end.\n")
    assert "old table" not in text
    assert "`PLUGPROXY_LISTEN`" in text
    assert "\nkept\n" in text
    assert gen_docs.main(["--check", "--root", str(tmp_path)]) == 0
    page.write_text(text.replace("`PLUGPROXY_LISTEN`", "`PLUGPROXY_LISTENER`"), encoding="utf-8")
    assert gen_docs.main(["--check", "--root", str(tmp_path)]) == 1


def test_rule_catalogue_lists_every_rule_of_every_table(gen_docs: ModuleType) -> None:
    rules = pytest.importorskip("plugproxy.rules")
    text = gen_docs.render_rule_catalogue()
    for spec, table in rules.TABLES.items():
        assert f"(`{spec}`)" in text
        for rule in table.rules:
            assert f"| `{rule.id}` | {rule.level} |" in text
    assert "{rpc}" not in text
