"""What the authored pages state about the code, held against the code: the admin server's
paths in docs/observability.md, and every rule id the pages name."""

from __future__ import annotations

import re
from pathlib import Path

from plugproxy import serve

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_admin_paths() -> list[str]:
    text = (ROOT / "docs" / "observability.md").read_text()
    table = text[: text.index("## Readiness")]
    return re.findall(r"^\| `(/[^`]*)` \|", table, re.MULTILINE)


async def test_observability_lists_exactly_the_admin_servers_paths(tmp_path: Path) -> None:
    ns = serve.parse_args(
        ["--listen", f"unix://{tmp_path}/csi.sock", "--upstream", f"unix://{tmp_path}/p.sock"],
        environ={},
    )
    served = sorted(serve.ProxyServer(ns).admin_routes())
    assert sorted(documented_admin_paths()) == served
    # With validation off the stage, and its /violations, are not there (the page says so).
    ns.validation = "off"
    assert "/violations" not in serve.ProxyServer(ns).admin_routes()
