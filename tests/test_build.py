"""The build: the hot path compiled by mypyc where a C compiler is present (setup.py), pure
Python where not, and the test run knowing which one it tests."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from importlib.util import find_spec
from pathlib import Path

import pytest

import plugproxy

ROOT = Path(__file__).resolve().parents[1]


def compiled_modules() -> list[str]:
    """setup.py's COMPILED list, as module names (read, not run: running it builds)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMPILED":
            paths = ast.literal_eval(node.value)
            return [p.removeprefix("src/").removesuffix(".py").replace("/", ".") for p in paths]
    raise AssertionError("setup.py has no COMPILED list")


def expected_build() -> str | None:
    # `make test` says what each of its runs tests; CI's main run is the compiled build.
    expected = os.environ.get("PLUGPROXY_EXPECT_BUILD")
    if expected is None and os.environ.get("CI") == "true":
        expected = "compiled"
    return expected


def test_the_build_under_test_is_the_one_expected() -> None:
    expected = expected_build()
    if expected is None:
        pytest.skip("outside make test and CI nothing says which build to expect")
    assert plugproxy.build() == expected


def test_a_compiled_build_compiles_every_module_setup_names_and_no_other() -> None:
    origins = {}
    for name in compiled_modules():
        spec = find_spec(name)
        assert spec is not None and spec.origin is not None, name
        origins[name] = spec.origin
    suffix = ".py" if plugproxy.build() == "interpreted" else ".so"
    assert all(origin.endswith(suffix) for origin in origins.values()), origins
    # A module left out of the list stays Python in either build.
    spec = find_spec("plugproxy.cli.serve")
    assert spec is not None and spec.origin is not None and spec.origin.endswith(".py")


@pytest.mark.parametrize("name", compiled_modules())
def test_each_compiled_module_loads_first_in_a_fresh_interpreter(name: str) -> None:
    """A compiled module refers to the compiled classes it names when it loads; whatever
    imports it first, they must be loaded by then (a module that imported them only for the
    type checker crashed the interpreter when nothing had loaded them yet)."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {name}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"import {name}: exit {done.returncode}\n{done.stderr[-2000:]}"


def test_version_says_which_build_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "plugproxy", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == f"plugproxy {plugproxy.__version__} ({plugproxy.build()})"


@pytest.mark.timeout(600)
def test_without_a_c_compiler_the_build_is_pure_python_and_says_so(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CC")}
    environ["CC"] = "/nonexistent/cc"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        env=environ,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = [
        line.strip()
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip().startswith("plugproxy: ")
    ]
    assert said == [
        "plugproxy: building interpreted (pure Python): no C compiler (/nonexistent/cc)"
    ]
    (wheel,) = tmp_path.glob("plugproxy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "plugproxy/relay/pairing.py" in names
    assert not [n for n in names if n.endswith(".so")]
    assert "-py3-none-any.whl" in wheel.name
