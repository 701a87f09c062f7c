"""Whether tracing is on, from the OTEL_* environment; the environment helper the demo and
the benchmarks build traced stages with."""

from __future__ import annotations

import os

import pytest

from plugproxy.stages.tracing_env import environment, wanted


def test_tracing_is_wanted_for_any_exporter_but_none_unless_the_sdk_is_disabled():
    assert not wanted({})
    assert not wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert not wanted({"OTEL_TRACES_EXPORTER": " none , "})
    assert wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert wanted({"OTEL_TRACES_EXPORTER": "none,console"})
    assert wanted({"OTEL_TRACES_EXPORTER": "bogus"})  # the stage's own parsing rejects it
    assert not wanted({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "TRUE"})


def test_the_environment_is_set_for_the_block_and_restored_even_on_error(monkeypatch):
    monkeypatch.setenv("PLUGPROXY_T_KEPT", "before")
    monkeypatch.setenv("PLUGPROXY_T_DROPPED", "present")
    monkeypatch.delenv("PLUGPROXY_T_NEW", raising=False)
    with (
        pytest.raises(RuntimeError),
        environment(
            {"PLUGPROXY_T_KEPT": "during", "PLUGPROXY_T_NEW": "added"}, ["PLUGPROXY_T_DROPPED"]
        ),
    ):
        assert os.environ["PLUGPROXY_T_KEPT"] == "during"
        assert os.environ["PLUGPROXY_T_NEW"] == "added"
        assert "PLUGPROXY_T_DROPPED" not in os.environ
        raise RuntimeError("the block fails")
    assert os.environ["PLUGPROXY_T_KEPT"] == "before"
    assert os.environ["PLUGPROXY_T_DROPPED"] == "present"
    assert "PLUGPROXY_T_NEW" not in os.environ
