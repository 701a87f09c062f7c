"""From a command line and its environment to the settings objects the proxy is built from."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

import pytest

from plugproxy.cli import serve
from plugproxy.cli.flags import OneLineParser, add_options, settings_from
from plugproxy.core.options import GROUP_KEY, OPTION_KEY, Option, Origins
from plugproxy.pipeline import StageSettings
from plugproxy.spec.redact import RedactSettings
from plugproxy.stages.validate import ValidateSettings


def option_fields(cls: type, where: str = "") -> list[tuple[str, Option]]:
    """(path, option) of every field ``cls`` and its groups set from an option."""
    found: list[tuple[str, Option]] = []
    for f in fields(cls):  # type: ignore[arg-type]
        if OPTION_KEY in f.metadata:
            found.append((where + f.name, f.metadata[OPTION_KEY]))
        elif GROUP_KEY in f.metadata:
            found += option_fields(f.metadata[GROUP_KEY], f"{where}{f.name}.")
    return found


def value_at(settings: Any, path: str) -> Any:
    for name in path.split("."):
        settings = getattr(settings, name)
    return settings


def test_every_serve_option_sets_a_field_and_every_field_has_its_option() -> None:
    declared = {opt.flag: opt for opt in serve.all_options()}
    fields_by_flag: dict[str, list[str]] = {}
    for path, opt in option_fields(serve.ServeSettings):
        assert declared.get(opt.flag) is opt, f"{path}: {opt.flag} is not a serve option"
        fields_by_flag.setdefault(opt.flag, []).append(path)
    assert set(fields_by_flag) == set(declared)
    # The redaction options set what the call log and the spans show, the same for both.
    shared = {flag: paths for flag, paths in fields_by_flag.items() if len(paths) > 1}
    assert shared == {
        "--redact": ["stages.tracing.redaction.redact", "stages.call_log.redaction.redact"],
        "--redact-defaults": [
            "stages.tracing.redaction.redact_defaults",
            "stages.call_log.redaction.redact_defaults",
        ],
    }


def test_settings_built_directly_have_the_command_lines_defaults() -> None:
    parsed = serve.parse_settings([], environ={})
    assert parsed == serve.ServeSettings()
    assert parsed.stages == StageSettings()
    # and not by accident: a flag changes what it names, and only that
    changed = serve.parse_settings(["--max-remembered-objects", "7"], environ={})
    assert changed != serve.ServeSettings()
    assert changed.stages.validation == ValidateSettings(max_remembered_objects=7)


def test_values_arrive_typed_from_flags_and_environment() -> None:
    settings = serve.parse_settings(
        ["--rule", "csi.size-limit=off", "--rule", "csi.call-order=enforce", "--log-payloads"],
        environ={
            "PLUGPROXY_SERIALIZE_TIMEOUT": "500ms",
            "PLUGPROXY_REDACT": "csi.v1.A.b, csi.v1.C.d",
            "PLUGPROXY_MAX_MESSAGE_BYTES": "4MiB",
            "PLUGPROXY_INSECURE_TCP": "yes",
        },
    )
    assert settings.stages.validation.rule == ("csi.size-limit=off", "csi.call-order=enforce")
    assert settings.stages.call_log.log_payloads is True
    assert settings.stages.serialization.serialize_timeout == 0.5
    assert settings.stages.call_log.redaction == RedactSettings(redact=("csi.v1.A.b", "csi.v1.C.d"))
    assert settings.stages.tracing.redaction == settings.stages.call_log.redaction
    assert settings.max_message_bytes == 4 * 2**20
    assert settings.transport.insecure_tcp is True
    with pytest.raises(AttributeError):
        settings.max_message_bytes = 1  # type: ignore[misc]  # frozen


def test_origins_name_the_variable_that_gave_a_value_and_the_flag_that_overrode_it() -> None:
    environ = {"PLUGPROXY_LISTEN": "unix:///a", "PLUGPROXY_UPSTREAM": "unix:///b"}
    settings = serve.parse_settings(["--upstream", "unix:///c"], environ=environ)
    assert settings.origins.name("--listen") == "PLUGPROXY_LISTEN"
    assert settings.origins.name("--upstream") == "--upstream"  # the command line won
    assert settings.origins.name("--rule") == "--rule"  # neither gave it
    assert settings.stages.validation.origins == settings.origins
    assert Origins().name("--listen") == "--listen"


def test_a_class_whose_field_is_misnamed_for_its_flag_is_refused() -> None:
    from dataclasses import dataclass

    from plugproxy.core.options import options_of, setting

    @dataclass(frozen=True)
    class Misnamed:
        timeout: float = setting("--call-timeout", "help", default=1.0)

    with pytest.raises(TypeError, match=r"Misnamed\.timeout is set by --call-timeout"):
        options_of(Misnamed)


def test_settings_from_any_parser_built_from_the_same_options() -> None:
    parser = OneLineParser(prog="t")
    add_options(parser, serve.all_options(), {"PLUGPROXY_SERIALIZE": "abort"})
    ns: argparse.Namespace = parser.parse_args(["--validation", "enforce"])
    settings = settings_from(StageSettings, ns)
    assert settings.serialization.serialize == "abort"
    assert settings.validation.validation == "enforce"
    assert settings.validation.origins.name("--serialize") == "PLUGPROXY_SERIALIZE"
