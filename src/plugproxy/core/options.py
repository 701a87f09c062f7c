"""Command-line options with environment twins, declared by the module that uses them.

Every ``--some-flag`` can also be set as ``PLUGPROXY_SOME_FLAG``; a flag on the command
line wins over its environment twin. Repeatable flags take a comma-separated list in the
environment. The CLI and the generated configuration reference both read these tables.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from plugproxy.core.endpoints import ConfigError

ENV_PREFIX = "PLUGPROXY_"
ENV_VALUES = "_values_from_env"  # namespace attribute: {flag: (variable, value it gave)}


class OneLineParser(argparse.ArgumentParser):
    """Misconfiguration is reported in one line, with a non-zero exit."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"plugproxy: error: {message}\n")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help that states every option's default: "(default: 30s)" after the help of an
    option that has one (not None, false, empty) and does not say it already, written as
    one would write it on the command line."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if not text or text == argparse.SUPPRESS or "default" in text.lower():
            return text
        shown = action_default(action)
        return f"{text} (default: {shown.replace('%', '%%')})" if shown else text


def action_default(action: argparse.Action) -> str:
    """An option's default as one would write it on the command line; "" when it has none
    worth saying (a switch, None, an empty value)."""
    if not action.option_strings or action.nargs == 0:  # positionals; switches, --help
        return ""
    return _default_text(action.default, action.type)


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


def _parse_bool(raw: str, env: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{env}={raw!r}: expected true or false (or 1/0, yes/no, on/off)")


def _convert(opt: Option, raw: str) -> Any:
    try:
        value = opt.type(raw)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise ConfigError(f"{opt.env}={raw!r}: {exc}") from None
    if opt.choices is not None and value not in opt.choices:
        raise ConfigError(f"{opt.env}={raw!r}: expected one of {', '.join(opt.choices)}")
    return value


def env_default(opt: Option, environ: Mapping[str, str]) -> Any:
    """The option's default, taken from its environment twin when that is set."""
    raw = environ.get(opt.env)
    if raw is None:
        return list(opt.default or []) if opt.repeatable else opt.default
    if opt.is_switch:
        return _parse_bool(raw, opt.env)
    if opt.repeatable:
        return [_convert(opt, item.strip()) for item in raw.split(",") if item.strip()]
    return _convert(opt, raw)


def add_options(
    parser: argparse.ArgumentParser,
    options: Sequence[Option],
    environ: Mapping[str, str] | None = None,
) -> None:
    env = os.environ if environ is None else environ
    # Values the environment supplied, so errors found later can name where a value came
    # from (see value_source).
    from_env: dict[str, tuple[str, Any]] = {}
    for opt in options:
        default = env_default(opt, env)
        if opt.env in env:
            from_env[opt.flag] = (opt.env, default)
        shown = shown_default(opt)
        help_text = f"{opt.help}{f' (default: {shown})' if shown else ''} [env {opt.env}]"
        if opt.is_switch:
            parser.add_argument(opt.flag, action="store_true", default=default, help=help_text)
        elif opt.repeatable:
            # Values from the command line replace the environment's list rather than extend it.
            parser.add_argument(
                opt.flag,
                action=_ReplaceThenAppend,
                type=opt.type,
                choices=opt.choices,
                default=default,
                metavar=opt.metavar,
                help=help_text + " (repeatable)",
            )
        else:
            parser.add_argument(
                opt.flag,
                type=opt.type,
                choices=opt.choices,
                default=default,
                metavar=opt.metavar,
                help=help_text,
            )
    parser.set_defaults(**{ENV_VALUES: from_env})


def value_source(ns: argparse.Namespace, flag: str) -> str:
    """What to call a setting in an error: its environment variable when the value in
    ``ns`` came from there, else the flag."""
    known: dict[str, tuple[str, Any]] = getattr(ns, ENV_VALUES, {})
    env_name, value = known.get(flag, ("", None))
    if env_name and getattr(ns, flag.lstrip("-").replace("-", "_"), None) == value:
        return env_name
    return flag


class _ReplaceThenAppend(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen = f"_{self.dest}_from_cli"
        current = getattr(namespace, self.dest) if getattr(namespace, seen, False) else []
        setattr(namespace, seen, True)
        setattr(namespace, self.dest, [*current, values])


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
    return "" if opt.is_switch else _default_text(opt.default, opt.type)


def _default_text(value: Any, kind: Any) -> str:
    if value is None or value is False or value == argparse.SUPPRESS:
        return ""
    if isinstance(value, list | tuple):
        return ",".join(_default_text(item, kind) for item in value)
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
