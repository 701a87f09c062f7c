"""Option values: sizes and durations as written on the command line."""

from __future__ import annotations

import argparse

import pytest

from plugproxy.cli import main as cli
from plugproxy.core.options import byte_size, duration


@pytest.mark.parametrize(
    "raw,size",
    [
        ("4096", 4096),
        ("4096B", 4096),
        # IEC units are powers of 1024 ...
        ("16MiB", 16 * 2**20),
        ("16Mi", 16 * 2**20),
        ("4KiB", 4096),
        ("4kib", 4096),
        ("1GiB", 2**30),
        ("1.5MiB", 3 * 2**19),
        # ... SI units powers of 1000, as in Kubernetes quantities; case does not matter.
        ("16MB", 16_000_000),
        ("16M", 16_000_000),
        ("16mb", 16_000_000),
        ("4kB", 4000),
        ("4k", 4000),
        ("1GB", 10**9),
        (" 2 MiB ", 2 * 2**20),
    ],
)
def test_sizes_take_si_and_iec_units_with_their_true_meanings(raw: str, size: int) -> None:
    assert byte_size(raw) == size


@pytest.mark.parametrize("raw", ["lots", "16MBB", "16XB", "-1", "MiB", "1e6", "16 M B"])
def test_what_is_not_a_size_is_refused_naming_both_unit_families(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a size") as refused:
        byte_size(raw)
    assert "16MiB = 16*2^20" in str(refused.value) and "16MB = 16*10^6" in str(refused.value)


def test_a_size_must_be_positive() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="positive"):
        byte_size("0")


def test_serve_help_says_what_size_units_mean(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for flag in ("--max-message-bytes", "--log-payload-max-bytes"):
        said = help_text[help_text.index(f"{flag} SIZE ") :][:300]
        assert "16MiB = 16*2^20" in said and "16MB = 16*10^6" in said, said


@pytest.mark.parametrize(
    "raw,seconds", [("30", 30.0), ("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0)]
)
def test_durations(raw: str, seconds: float) -> None:
    assert duration(raw) == seconds
