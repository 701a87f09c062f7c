"""The package layout as a newcomer reads it: each package's ``__init__`` (and the two
top-level modules, api and pipeline) says what it may import, and the code keeps to it;
imports point one way, and no module imports another that imports it back, not even for
the type checker."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "plugproxy"
# The units of the layout: every folder of the package, and the two top-level modules
# every stage author reads first. The package's own __init__ (the version) and __main__
# (the entry point) are not units.
UNITS = sorted(
    [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()] + ["api", "pipeline"]
)


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def unit_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in UNITS else None


def imports(path: pathlib.Path, *, at_run_time: bool) -> set[str]:
    """plugproxy modules ``path`` imports, anywhere in it (functions included); with
    ``at_run_time``, not those only the type checker reads (``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    if at_run_time:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "plugproxy":
                continue
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "plugproxy")
    return found


def may_import(unit: str) -> set[str] | None:
    """The units ``unit``'s docstring allows, or None for "any package"."""
    path = PACKAGE / unit / "__init__.py" if (PACKAGE / unit).is_dir() else PACKAGE / f"{unit}.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    match = re.search(r"May import:(.*?)(?:\n\n|$)", doc, re.S)
    assert match, f"{path.relative_to(SRC)}: its docstring does not say what it may import"
    said = match.group(1)
    if "any package" in said:
        return None
    named = set(re.findall(r":mod:`plugproxy\.(\w+)`", said))
    assert named <= set(UNITS), f"{unit}: names no such package: {named - set(UNITS)}"
    return named


@pytest.mark.parametrize("unit", UNITS)
def test_each_unit_imports_only_what_its_docstring_allows(unit: str) -> None:
    allowed = may_import(unit)
    broken = []
    for name, path in MODULES.items():
        if unit_of(name) != unit:
            continue
        for target in imports(path, at_run_time=False):
            other = unit_of(target)
            if other is None or other == unit:
                continue
            if allowed is not None and other not in allowed:
                broken.append(f"{name} imports {target}")
    assert not broken, f"{unit} may import only {sorted(allowed or [])}:\n" + "\n".join(broken)


def test_the_units_import_one_way() -> None:
    """No two units import each other, directly or around a loop: they form layers."""
    graph = {u: set() for u in UNITS}
    for name, path in MODULES.items():
        source = unit_of(name)
        for target in imports(path, at_run_time=False):
            other = unit_of(target)
            if source and other and other != source:
                graph[source].add(other)
    assert find_cycle(graph) is None, find_cycle(graph)


def test_no_module_imports_one_that_imports_it_back() -> None:
    """Not at run time, and not for the type checker either."""
    graph = {}
    for name, path in MODULES.items():
        found = imports(path, at_run_time=False) & MODULES.keys()
        # A module importing its own package's __init__ (which imports the package's
        # modules) is how a package is used, not a loop.
        graph[name] = {t for t in found if not name.startswith(t + ".")}
    assert find_cycle(graph) is None, find_cycle(graph)


def command_modules() -> set[str]:
    """The command line's modules: the cli package and the modules cli.main runs as
    subcommands (a fake plugin's command lives with the fakes)."""
    tree = ast.parse((PACKAGE / "cli" / "main.py").read_text())
    table = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "SUBCOMMANDS"
    )
    named = {ast.literal_eval(entry)[0] for entry in table.values}  # type: ignore[attr-defined]
    return named | {name for name in MODULES if unit_of(name) == "cli"}


def reads_a_command_line(path: pathlib.Path) -> bool:
    """Whether the module names argparse's Namespace (a parsed command line) anywhere in
    its code, quoted annotations included."""
    tree = ast.parse(path.read_text())
    return any(
        (isinstance(node, ast.Attribute) and node.attr == "Namespace")
        or (isinstance(node, ast.Name) and node.id == "Namespace")
        or (isinstance(node, ast.alias) and node.name == "Namespace")
        or (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"[\w.\[\], |]*\bNamespace\b[\w.\[\], |]*", node.value) is not None
        )
        for node in ast.walk(tree)
    )


def test_no_parsed_command_line_below_the_cli() -> None:
    """Flags and environment become typed settings objects in the command modules; the
    stages, the relay, the upstream and the admin server are built from those."""
    commands = command_modules()
    assert {"plugproxy.cli.serve", "plugproxy.fakes.cli"} <= commands
    readers = {name for name, path in MODULES.items() if reads_a_command_line(path)}
    assert "plugproxy.cli.serve" in readers  # the check sees what it looks for
    assert readers - commands == set()


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the path around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_checks_find_what_they_look_for(tmp_path: pathlib.Path) -> None:
    """The cycle finder and the import reader on small cases, so a silent pass means a clean
    tree, not a blind check."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    module = tmp_path / "sample.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "from plugproxy.core import log\n"
        "if TYPE_CHECKING:\n"
        "    from plugproxy.api import Call\n"
        "def late():\n"
        "    import plugproxy.spec.registry\n"
    )
    assert imports(module, at_run_time=True) == {"plugproxy.core.log", "plugproxy.spec.registry"}
    assert imports(module, at_run_time=False) == {
        "plugproxy.core.log",
        "plugproxy.spec.registry",
        "plugproxy.api",
    }
