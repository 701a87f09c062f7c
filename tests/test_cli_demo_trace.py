"""The check behind `plugproxy demo --trace`'s verdict: one chain of four linked spans."""

from __future__ import annotations

from plugproxy.cli.demo_trace import _is_chain
from plugproxy.fakes.collector import TraceSpan

PLUGIN = "fake-csi-plugin"


def chain(trace_ids=(1, 1, 1, 1), plugin_parent: int = 3) -> list[TraceSpan]:
    steps = [("co", "CLIENT", None), ("plugproxy", "SERVER", 1), ("plugproxy", "CLIENT", 2)]
    spans = [
        TraceSpan(service, kind, kind, trace_ids[i], i + 1, parent, 0, 1)
        for i, (service, kind, parent) in enumerate(steps)
    ]
    spans.append(TraceSpan(PLUGIN, "x", "SERVER", trace_ids[3], 4, plugin_parent, 0, 1))
    return spans


def test_whole_chain_is_recognised():
    assert _is_chain(chain(), PLUGIN)


def test_plugin_span_under_the_proxy_server_span_is_not_a_chain():
    # What a plugin shows when the proxy forwards the CO's traceparent instead of its own.
    assert not _is_chain(chain(plugin_parent=2), PLUGIN)


def test_missing_party_or_second_trace_is_not_a_chain():
    assert not _is_chain(chain()[:3], PLUGIN)
    assert not _is_chain(chain(trace_ids=(1, 1, 1, 2)), PLUGIN)
