"""Settings, and the command-line options that set them, declared by the module they configure.

A configurable module declares a frozen dataclass of its settings. Each field made by
:func:`setting` is also a ``--some-flag`` with an environment twin ``PLUGPROXY_SOME_FLAG``:
a flag on the command line wins over its twin, and repeatable flags take a comma-separated
list in the environment. The CLI layer (:mod:`plugproxy.cli.flags`) turns flags and
environment into these objects once; what runs below it is built from them, and tests build
them directly. The generated configuration reference reads the same declarations.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

ENV_PREFIX = "PLUGPROXY_"
# Field metadata: the option a settings field is set by, or the settings class it holds.
OPTION_KEY = "plugproxy.option"
GROUP_KEY = "plugproxy.group"


@dataclass(frozen=True)
class Option:
    flag: str
    help: str
    default: Any = None
    type: Callable[[str], Any] = str
    choices: Sequence[str] | None = None
    repeatable: bool = False
    metavar: str | None = None
    is_switch: bool = False  # a flag without a value (store_true)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


def setting(
    flag: str,
    help: str,
    default: Any = None,
    *,
    type: Callable[[str], Any] = str,
    choices: Sequence[str] | None = None,
    repeatable: bool = False,
    metavar: str | None = None,
    is_switch: bool = False,
) -> Any:
    """A settings field that is also the option ``flag``; the field is named as the flag
    (``--max-objects`` sets ``max_objects``). A repeatable option's value is a tuple, a
    switch's a bool."""
    opt = Option(flag, help, default, type, choices, repeatable, metavar, is_switch)
    value = tuple(default or ()) if repeatable else bool(default) if is_switch else default
    return field(default=value, metadata={OPTION_KEY: opt})


def group(cls: type) -> Any:
    """A settings field holding another settings class, whose options it declares itself."""
    return field(default_factory=cls, metadata={GROUP_KEY: cls})


@dataclass(frozen=True)
class Origins:
    """Which values the environment gave, so an error can name what the user wrote."""

    variables: tuple[tuple[str, str], ...] = ()  # (flag, environment variable)

    def name(self, flag: str) -> str:
        """The variable that set ``flag``'s value, else the flag itself."""
        for known, variable in self.variables:
            if known == flag:
                return variable
        return flag


def options_of(cls: type) -> list[Option]:
    """The options a settings class declares, in field order (its groups declare theirs)."""
    found: list[Option] = []
    for f in fields(cls):
        opt = f.metadata.get(OPTION_KEY)
        if opt is None:
            continue
        if opt.dest != f.name:
            raise TypeError(f"{cls.__name__}.{f.name} is set by {opt.flag}: name it {opt.dest}")
        found.append(opt)
    return found


# Size units with their true meanings, as Kubernetes quantities have them: SI multiples of
# 1000 and IEC multiples of 1024. Case does not matter (a size has no milli-bytes).
_SIZE_UNITS = {"": 1, "b": 1}
for _power, _prefix in enumerate("kmg", 1):
    _SIZE_UNITS |= {_prefix: 1000**_power, _prefix + "b": 1000**_power}
    _SIZE_UNITS |= {_prefix + "i": 1024**_power, _prefix + "ib": 1024**_power}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)
# What a SIZE option's help says about its units.
SIZE_HELP = "SIZE: bytes, 16MiB = 16*2^20 or 16MB = 16*10^6; also KiB, GiB, kB, GB"


def byte_size(raw: str) -> int:
    """'4096' -> 4096, '16MiB' (or '16Mi') -> 16*2^20, '16MB' (or '16M') -> 16*10^6."""
    match = _SIZE.fullmatch(raw)
    factor = _SIZE_UNITS.get(match.group(2).lower()) if match else None
    if match is None or factor is None:
        raise argparse.ArgumentTypeError(
            f"not a size: {raw!r} (bytes, or with a unit: 16MiB = 16*2^20, 16MB = 16*10^6)"
        )
    value = int(float(match.group(1)) * factor)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {raw!r}")
    return value


def duration(raw: str) -> float:
    """'30', '30s', '500ms', '2m', '1h' -> seconds."""
    text = raw.strip().lower()
    for suffix, mult in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(suffix):
            text, factor = text[: -len(suffix)], mult
            break
    else:
        factor = 1.0
    try:
        value = float(text) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {raw!r} (e.g. 30s, 500ms, 1h)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"duration must not be negative: {raw!r}")
    return value


def shown_default(opt: Option) -> str:
    """The declared default as one would write it on the command line; "" when none."""
    return "" if opt.is_switch else default_text(opt.default, opt.type)


def default_text(value: Any, kind: Any) -> str:
    if value is None or value is False or value == argparse.SUPPRESS:
        return ""
    if isinstance(value, list | tuple):
        return ",".join(default_text(item, kind) for item in value)
    if kind is duration:
        return _duration_text(float(value))
    if kind is byte_size:
        return _size_text(int(value))
    if kind is octal_mode:
        return f"0{int(value):o}"
    return str(value)


def _duration_text(seconds: float) -> str:
    if seconds == 0:
        return "0s"
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    return f"{seconds * 1000:g}ms"


def _size_text(size: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def octal_mode(raw: str) -> int:
    try:
        value = int(raw, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an octal file mode: {raw!r} (e.g. 0660)") from None
    if not 0 <= value <= 0o777:
        raise argparse.ArgumentTypeError(f"file mode out of range: {raw!r}")
    return value
