"""Prometheus metrics of every call: latency by method and status, calls in flight, stream
messages, and the ``csi_sidecar_operations_seconds`` histogram csi-lib-utils' sidecars export.

Ordering: second, right after tracing. Its clock starts when the call arrives and stops when
the CO gets its status, so validation rejects and serialization waits are part of what it
measures, as the CO experiences them.

Cost per call: label children are resolved once per (method, status code) and cached; a call
does one gauge increment and decrement and one or two histogram observations. Stream message
counts are added once, when the stream ends, from the counts the forwarder keeps.

Process-wide series that belong to no call (``plugproxy_build_info``,
``plugproxy_upstream_up``) are registered by :func:`register_process_metrics`, which the
server calls whether or not this stage is enabled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from plugproxy import __version__
from plugproxy.api import Call, MethodInfo, Runtime, Stage, StatusCode, UpstreamError, UpstreamState
from plugproxy.core.options import Option, options_of, setting
from plugproxy.spec.registry import load_spec


@dataclass(frozen=True)
class MetricsSettings:
    disable_metrics: bool = setting(
        "--disable-metrics",
        "do not record per-call metrics (the /metrics endpoint still serves process metrics)",
        is_switch=True,
    )


OPTIONS: list[Option] = options_of(MetricsSettings)

# 1 ms … 600 s: fast identity calls and the slowest attach or snapshot both land in a bucket.
RPC_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
# csi-lib-utils' operationsLatencyBuckets, so dashboards built for the sidecars work unchanged.
CSI_SIDECAR_BUCKETS: tuple[float, ...] = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    15.0,
    25.0,
    50.0,
    120.0,
    300.0,
    600.0,
)
# csi-lib-utils labels a driver it has not learned yet like this.
UNKNOWN_DRIVER = "unknown-driver"
# Label for method paths beyond the cardinality cap.
UNKNOWN_METHOD = "unknown"
MAX_UNKNOWN_METHODS = 50

# Every metric name this module registers (the dashboard and alert tests read this).
METRIC_NAMES: tuple[str, ...] = (
    "plugproxy_rpc_duration_seconds",
    "plugproxy_rpc_in_flight",
    "plugproxy_rpc_stream_messages_total",
    "csi_sidecar_operations_seconds",
    "plugproxy_upstream_up",
    "plugproxy_build_info",
)


def go_code_name(code: StatusCode) -> str:
    """The status code as grpc-go's ``codes.Code.String()`` spells it (csi-lib-utils' label).

    CamelCase, with Go's single-L "Canceled": ``DEADLINE_EXCEEDED`` -> ``DeadlineExceeded``.
    """
    if code is StatusCode.OK:
        return "OK"
    if code is StatusCode.CANCELLED:
        return "Canceled"
    return "".join(part.capitalize() for part in code.name.split("_"))


GO_CODE_NAMES: dict[StatusCode, str] = {code: go_code_name(code) for code in StatusCode}


def register_process_metrics(registry: CollectorRegistry, upstream: Any) -> None:
    """``plugproxy_build_info{version}`` and ``plugproxy_upstream_up`` (1 up, 0 down).

    ``upstream`` is the concrete :class:`plugproxy.relay.upstream.Upstream`: its state listener
    keeps the gauge current without any work at scrape time.
    """
    info = Gauge(
        "plugproxy_build_info", "plugproxy build; always 1", ["version"], registry=registry
    )
    info.labels(version=__version__).set(1)
    up = Gauge(
        "plugproxy_upstream_up",
        "1 when the connection to the plugin is ready, 0 when it is down",
        registry=registry,
    )

    def on_state(state: UpstreamState) -> None:
        up.set(1 if state is UpstreamState.UP else 0)

    add_listener: Callable[[Callable[[UpstreamState], None]], None] | None = getattr(
        upstream, "add_listener", None
    )
    if add_listener is not None:
        add_listener(on_state)
    else:
        on_state(upstream.state)


class _Histogram:
    """One histogram series: per-bucket counts (not cumulative) and the sum.

    Plain integers, no lock: every call ends on the event loop's thread. A scrape from the
    admin thread may read a count one call ahead of the sum, as Prometheus' Go client can.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        total = 0
        for le, count in zip(_le_labels(self.bounds), self.counts, strict=True):
            total += count
            out.append((le, total))
        return out


@functools.cache
def _le_labels(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """Bucket bounds as the ``le`` label spells them (``0.001``, ``600.0``, ``+Inf``)."""
    return (*(repr(float(b)) for b in bounds), "+Inf")


class _MethodMetrics:
    """The series of one method label, resolved once: a call touches no label lookup."""

    __slots__ = (
        "by_code",
        "csi",
        "driver_info",
        "inflight",
        "label",
        "requests",
        "responses",
        "spec",
        "streaming",
        "streams",
    )

    def __init__(self, info: MethodInfo, label: str) -> None:
        self.label = label
        self.spec = info.spec_name
        self.csi = info.spec is not None and info.spec.family == "csi"
        # GetPluginInfo answers teach the stage the CSI driver name.
        self.driver_info = self.csi and info.name == "GetPluginInfo"
        self.inflight = 0
        # status code -> (plugproxy_rpc_duration_seconds, csi_sidecar_operations_seconds)
        self.by_code: dict[StatusCode, tuple[_Histogram, _Histogram | None]] = {}
        # Stream message counts of the calls ended, only for the streaming sides (None: a
        # unary side); the calls still streaming are counted at scrape time, from here, so
        # a stream that lasts days (ListAndWatch) is counted while it flows.
        self.requests: int | None = None if info.kind.unary_request else 0
        self.responses: int | None = None if info.kind.unary_response else 0
        self.streaming = self.requests is not None or self.responses is not None
        self.streams: set[Call] = set()

    def request_messages(self) -> int:
        assert self.requests is not None
        return self.requests + sum(call.request_count for call in list(self.streams))

    def response_messages(self) -> int:
        assert self.responses is not None
        return self.responses + sum(call.response_count for call in list(self.streams))


class CallMetrics:
    """What the stage counts, exported at scrape time as the four per-call metric families.

    prometheus_client's own metric objects take a lock and resolve label children on every
    observation; here a call adds to plain numbers held per method, and the families are
    built only when /metrics is read.
    """

    def __init__(self, stage: MetricsStage) -> None:
        self.stage = stage

    def describe(self) -> list[Metric]:
        return []  # families are built at scrape time; nothing to check at registration

    def collect(self) -> list[Metric]:
        stage = self.stage
        duration = HistogramMetricFamily(
            "plugproxy_rpc_duration_seconds",
            "Time from a call's arrival to the status the CO received",
            labels=["spec", "method", "code"],
        )
        inflight = GaugeMetricFamily(
            "plugproxy_rpc_in_flight", "Calls between arrival and status", labels=["method"]
        )
        streamed = CounterMetricFamily(
            "plugproxy_rpc_stream_messages",
            "Messages of streaming calls, by direction (request: CO to plugin)",
            labels=["method", "direction"],
        )
        csi = HistogramMetricFamily(
            "csi_sidecar_operations_seconds",
            "Container Storage Interface operation duration with gRPC error code status total",
            labels=["driver_name", "method_name", "grpc_status_code"],
        )
        for state in list(stage.methods.values()):
            inflight.add_metric([state.label], state.inflight)
            if state.requests is not None:
                streamed.add_metric([state.label, "request"], state.request_messages())
            if state.responses is not None:
                streamed.add_metric([state.label, "response"], state.response_messages())
            for code, (series, _) in list(state.by_code.items()):
                duration.add_metric(
                    [state.spec, state.label, code.name],
                    series.cumulative(),
                    series.sum,
                )
        for (driver, label, code), series in list(stage.csi_series.items()):
            csi.add_metric([driver, label, GO_CODE_NAMES[code]], series.cumulative(), series.sum)
        return [duration, inflight, streamed, csi]


class MetricsStage(Stage):
    """Records latency, in-flight calls and stream messages; exported through ``registry``."""

    name = "metrics"
    fail_open = True

    def __init__(
        self,
        registry: CollectorRegistry,
        upstream: Any = None,
        csi_info_path: str | None = None,
        max_unknown_methods: int = MAX_UNKNOWN_METHODS,
    ) -> None:
        # method path (or UNKNOWN_METHOD) -> its series
        self.methods: dict[str, _MethodMetrics] = {}
        # (driver_name, method label, code) -> csi_sidecar_operations_seconds series; a
        # series made before the driver name was learnt keeps its label, as the sidecars'.
        self.csi_series: dict[tuple[str, str, StatusCode], _Histogram] = {}
        self.driver_name = UNKNOWN_DRIVER
        self._upstream = upstream
        self._csi_info_path = csi_info_path
        self._max_unknown = max_unknown_methods
        self._unknown_paths = 0
        self._asker: asyncio.Task[None] | None = None
        registry.register(CallMetrics(self))

    # -- per-method state, resolved at startup (wants) or on first sight --------------------

    def _method(self, info: MethodInfo) -> _MethodMetrics:
        state = self.methods.get(info.path)
        if state is not None:
            return state
        label = info.path
        if not info.known:
            if self._unknown_paths >= self._max_unknown:
                label = UNKNOWN_METHOD
                state = self.methods.get(UNKNOWN_METHOD)
                if state is not None:
                    return state
            else:
                self._unknown_paths += 1
        state = _MethodMetrics(info, label)
        self.methods[label] = state
        return state

    def wants(self, method: MethodInfo) -> bool:
        self._method(method)
        return True

    def _series(
        self, state: _MethodMetrics, code: StatusCode
    ) -> tuple[_Histogram, _Histogram | None]:
        """The series a call of ``state``'s method ending in ``code`` adds to; made once."""
        pair = state.by_code[code] = (_Histogram(RPC_BUCKETS), self._csi(state, code))
        return pair

    def _csi(self, state: _MethodMetrics, code: StatusCode) -> _Histogram | None:
        if not state.csi:
            return None
        key = (self.driver_name, state.label, code)
        series = self.csi_series.get(key)
        if series is None:
            series = self.csi_series[key] = _Histogram(CSI_SIDECAR_BUCKETS)
        return series

    # -- hooks --------------------------------------------------------------------------------

    def on_start(self, call: Call) -> None:
        state = self._method(call.method)
        state.inflight += 1
        if state.streaming:
            state.streams.add(call)

    def on_finish(self, call: Call) -> None:
        state = self._method(call.method)
        state.inflight -= 1
        if state.streaming:
            state.streams.discard(call)
        code = call.code
        # GetPluginInfo names the driver: learnt before its own call is counted, so the
        # first call is not the one series left with driver_name="unknown-driver".
        if state.driver_info and code is StatusCode.OK and call.response is not None:
            message = call.response.message
            name = getattr(message, "name", "") if message is not None else ""
            if name:
                self.set_driver_name(name)
        elapsed = call.elapsed
        duration, csi = state.by_code.get(code) or self._series(state, code)
        duration.observe(elapsed)
        if csi is not None:
            csi.observe(elapsed)
        if state.requests is not None:
            state.requests += call.request_count
        if state.responses is not None:
            state.responses += call.response_count

    # -- driver name --------------------------------------------------------------------------

    def set_driver_name(self, name: str) -> None:
        """Use ``name`` as driver_name from now on (series are re-resolved lazily)."""
        if name == self.driver_name:
            return
        self.driver_name = name
        for state in self.methods.values():
            if state.csi:
                # The duration series stay; only the csi series switch to the new label.
                state.by_code = {
                    code: (duration, self._csi(state, code))
                    for code, (duration, _) in state.by_code.items()
                }

    async def _ask_driver_name(self) -> None:
        """Ask the plugin's GetPluginInfo once it is reachable, until it answers or refuses."""
        assert self._upstream is not None and self._csi_info_path is not None
        message_class = None
        for attempt in range(60):
            if self.driver_name != UNKNOWN_DRIVER:
                return
            if self._upstream.state is UpstreamState.UP:
                try:
                    raw = await self._upstream.unary(self._csi_info_path, b"", 5.0)
                except UpstreamError as err:
                    if err.code is StatusCode.UNIMPLEMENTED:
                        return  # not a CSI plugin (or no Identity service): stay unknown
                else:
                    if message_class is None:
                        message_class = _info_class(self._csi_info_path)
                    with contextlib.suppress(Exception):
                        name = message_class.FromString(raw).name
                        if name:
                            self.set_driver_name(name)
                    return
            await asyncio.sleep(min(0.2 * (attempt + 1), 2.0))

    async def startup(self) -> None:
        if self._upstream is not None and self._csi_info_path is not None:
            self._asker = asyncio.get_running_loop().create_task(self._ask_driver_name())

    async def shutdown(self) -> None:
        if self._asker is not None:
            self._asker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._asker


def _info_class(path: str) -> Any:
    spec_name = path.split(".Identity/", 1)[0].lstrip("/")
    return load_spec(spec_name).message_class(f"{spec_name}.GetPluginInfoResponse")


def csi_info_path(registry: Any) -> str | None:
    """The GetPluginInfo path of the newest CSI spec the proxy serves, if any."""
    for spec in ("csi.v1", "csi.v0"):
        path = f"/{spec}.Identity/GetPluginInfo"
        if path in registry:
            return path
    return None


def build(settings: MetricsSettings, runtime: Runtime) -> Stage | None:
    if settings.disable_metrics:
        return None
    return MetricsStage(
        runtime.metrics,
        upstream=runtime.upstream,
        csi_info_path=csi_info_path(runtime.registry),
    )
