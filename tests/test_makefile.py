"""The Makefile's set-up steps say what they are doing: pip runs quietly, and a first
`make demo` or `make test` takes minutes, so a line before each long step says what it is
and how long it takes."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def make_n(target: str, venv: pathlib.Path) -> list[str]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    out = subprocess.run(
        [make, "--no-print-directory", "-n", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.splitlines()


@pytest.mark.parametrize("target", ["demo", "test", "install"])
def test_each_long_set_up_step_is_announced_first(target: str, tmp_path: pathlib.Path) -> None:
    lines = make_n(target, tmp_path / "venv")  # a venv that does not exist: every step runs
    long_steps = [
        i
        for i, line in enumerate(lines)
        if " -m venv " in line or ("pip install" in line and "--upgrade pip" not in line)
    ]
    # the venv, then plugproxy (compiled once), then for `make test` the dev tools
    assert len(long_steps) == (3 if target == "test" else 2), lines
    announced = []
    for i in long_steps:
        # The echo comes first; a step may take two lines (the dev tools' list, then pip).
        echo = next((lines[j] for j in (i - 1, i - 2) if lines[j].startswith("echo ")), None)
        assert echo is not None, (lines[i], lines)
        assert str(tmp_path / "venv") in echo
        announced.append(echo)
    assert "installing plugproxy" in announced[1] and "the first time" in announced[1]
    if target == "test":
        assert "installing the dev tools" in announced[2] and "the first time" in announced[2]


def test_the_announcements_are_not_echoed_twice() -> None:
    """`@echo`: make shows the message, not the echo command and then the message."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    echoes = [line for line in makefile.splitlines() if 'echo "' in line and "\t" in line]
    assert len(echoes) >= 3
    assert all(line.lstrip("\t").startswith("@echo ") for line in echoes), echoes
