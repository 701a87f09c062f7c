"""The command line's side of settings: options as argparse arguments with their
environment twins, and a parsed command line turned into the frozen settings objects the
modules below declare (:mod:`plugproxy.core.options`). Nothing below this layer reads a
parsed command line."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, NoReturn, TypeVar

from plugproxy.core.endpoints import ConfigError
from plugproxy.core.options import (
    GROUP_KEY,
    OPTION_KEY,
    Option,
    Origins,
    default_text,
    shown_default,
)

ENV_VALUES = "_values_from_env"  # namespace attribute: {flag: (variable, value it gave)}

SettingsT = TypeVar("SettingsT")


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
    return default_text(action.default, action.type)


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
    # from (see origins).
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


def settings_from(cls: type[SettingsT], ns: argparse.Namespace) -> SettingsT:
    """The settings ``cls`` declares, with their groups', as ``ns`` parsed them; a field
    named ``origins`` gets which values came from the environment."""
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        opt: Option | None = f.metadata.get(OPTION_KEY)
        held: type | None = f.metadata.get(GROUP_KEY)
        if opt is not None:
            value = getattr(ns, opt.dest)
            if opt.repeatable:
                value = tuple(value)
            elif opt.is_switch:
                value = bool(value)  # a switch declared without a default parses as None
            values[f.name] = value
        elif held is not None:
            values[f.name] = settings_from(held, ns)
        elif f.name == "origins":
            values[f.name] = origins(ns)
    return cls(**values)


def origins(ns: argparse.Namespace) -> Origins:
    """The flags whose value in ``ns`` is the one their environment variable gave."""
    known: dict[str, tuple[str, Any]] = getattr(ns, ENV_VALUES, {})
    return Origins(
        tuple(
            (flag, variable)
            for flag, (variable, value) in known.items()
            if getattr(ns, flag.lstrip("-").replace("-", "_"), None) == value
        )
    )
