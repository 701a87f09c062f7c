"""What the authored pages state about the code, held against the code: the admin server's
paths in docs/observability.md, and every rule id the pages name."""

from __future__ import annotations

import re
from pathlib import Path

from plugproxy.cli import serve
from plugproxy.rules import all_rules, annotated

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_admin_paths() -> list[str]:
    text = (ROOT / "docs" / "observability.md").read_text()
    table = text[: text.index("## Readiness")]
    return re.findall(r"^\| `(/[^`]*)` \|", table, re.MULTILINE)


async def test_observability_lists_exactly_the_admin_servers_paths(tmp_path: Path) -> None:
    argv = ["--listen", f"unix://{tmp_path}/csi.sock", "--upstream", f"unix://{tmp_path}/p.sock"]
    served = sorted(serve.ProxyServer(serve.parse_settings(argv, environ={})).admin_routes())
    assert sorted(documented_admin_paths()) == served
    # With validation off the stage, and its /violations, are not there (the page says so).
    settings = serve.parse_settings([*argv, "--validation", "off"], environ={})
    assert "/violations" not in serve.ProxyServer(settings).admin_routes()


def _hyphenated(prefix: str) -> re.Pattern[str]:
    """Rule-id-shaped words after ``prefix``: dotted, the last part with a hyphen."""
    return re.compile(rf"(?<![\w.-])({prefix}(?:\.\w+)*\.[a-z0-9]+(?:-[a-z0-9]+)+)(?![\w-])")


def test_every_rule_id_the_pages_name_exists() -> None:
    """A bundled rule id (`csi.size-limit`, not `csi.v1.size-limit`), a descriptor set's
    (`acme.vault.v1.required-field`, any spec name and one of the generated rules) or a
    placeholder (`<spec>.required-field`) naming a rule some table has."""
    bundled = all_rules()
    families = sorted({rule_id.partition(".")[0] for rule_id in bundled})
    suffixes = {rule_id.partition(".")[2] for rule_id in bundled} | set(annotated.RULE_SUFFIXES)
    bundled_ids = _hyphenated("(?:" + "|".join(families) + ")")
    placeholders = re.compile(r"<\w+>\.([a-z0-9]+(?:-[a-z0-9]+)+)")
    set_ids = _hyphenated(r"acme\.vault\.v1")  # docs/any-plugin.md's example set
    wrong: list[str] = []
    seen = 0
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            where = f"{page.relative_to(ROOT)}:{number}"
            for rule_id in bundled_ids.findall(line):
                seen += 1
                if rule_id not in bundled:
                    wrong.append(f"{where}: {rule_id}")
            for suffix in placeholders.findall(line):
                seen += 1
                if suffix not in suffixes:
                    wrong.append(f"{where}: <…>.{suffix}")
            for rule_id in set_ids.findall(line):
                seen += 1
                if rule_id.removeprefix("acme.vault.v1.") not in annotated.RULE_SUFFIXES:
                    wrong.append(f"{where}: {rule_id}")
    assert seen > 150  # the catalogue in docs/rules.md alone names every bundled rule
    assert not wrong, "rule ids no table has:\n" + "\n".join(wrong)
