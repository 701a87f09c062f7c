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

import argparse
import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from plugproxy import __version__
from plugproxy.api import Call, MethodInfo, Runtime, Stage, StatusCode, UpstreamError, UpstreamState
from plugproxy.options import Option
from plugproxy.registry import load_spec

OPTIONS: list[Option] = [
    Option(
        "--disable-metrics",
        "do not record per-call metrics (the /metrics endpoint still serves process metrics)",
        is_switch=True,
    ),
]

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

    ``upstream`` is the concrete :class:`plugproxy.upstream.Upstream`: its state listener
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


class _MethodMetrics:
    """Label children of one method, resolved once; per-code children on first use."""

    __slots__ = (
        "by_code",
        "csi",
        "driver_info",
        "inflight",
        "label",
        "requests",
        "responses",
        "spec",
    )

    def __init__(self, stage: MetricsStage, info: MethodInfo, label: str) -> None:
        self.label = label
        self.spec = info.spec_name
        self.csi = info.spec is not None and info.spec.family == "csi"
        # GetPluginInfo answers teach the stage the CSI driver name.
        self.driver_info = self.csi and info.name == "GetPluginInfo"
        self.inflight = stage.inflight.labels(method=label)
        self.by_code: dict[StatusCode, tuple[Any, Any]] = {}
        self.requests: Any = None
        self.responses: Any = None
        if not info.kind.unary_request:
            self.requests = stage.stream_messages.labels(method=label, direction="request")
        if not info.kind.unary_response:
            self.responses = stage.stream_messages.labels(method=label, direction="response")

    def children(self, stage: MetricsStage, code: StatusCode) -> tuple[Any, Any]:
        pair = self.by_code.get(code)
        if pair is None:
            duration = stage.duration.labels(spec=self.spec, method=self.label, code=code.name)
            csi = None
            if self.csi:
                csi = stage.csi_operations.labels(
                    driver_name=stage.driver_name,
                    method_name=self.label,
                    grpc_status_code=GO_CODE_NAMES[code],
                )
            pair = (duration, csi)
            self.by_code[code] = pair
        return pair


class MetricsStage(Stage):
    """Records latency, in-flight calls and stream messages into ``registry``."""

    name = "metrics"
    fail_open = True

    def __init__(
        self,
        registry: CollectorRegistry,
        upstream: Any = None,
        csi_info_path: str | None = None,
        max_unknown_methods: int = MAX_UNKNOWN_METHODS,
    ) -> None:
        self.duration = Histogram(
            "plugproxy_rpc_duration_seconds",
            "Time from a call's arrival to the status the CO received",
            ["spec", "method", "code"],
            buckets=RPC_BUCKETS,
            registry=registry,
        )
        self.inflight = Gauge(
            "plugproxy_rpc_in_flight",
            "Calls between arrival and status",
            ["method"],
            registry=registry,
        )
        self.stream_messages = Counter(
            "plugproxy_rpc_stream_messages",
            "Messages of streaming calls, by direction (request: CO to plugin)",
            ["method", "direction"],
            registry=registry,
        )
        self.csi_operations = Histogram(
            "csi_sidecar_operations_seconds",
            "Container Storage Interface operation duration with gRPC error code status total",
            ["driver_name", "method_name", "grpc_status_code"],
            buckets=CSI_SIDECAR_BUCKETS,
            registry=registry,
        )
        self.driver_name = UNKNOWN_DRIVER
        self._upstream = upstream
        self._csi_info_path = csi_info_path
        self._max_unknown = max_unknown_methods
        self._methods: dict[str, _MethodMetrics] = {}
        self._unknown_paths = 0
        self._asker: asyncio.Task[None] | None = None

    # -- per-method state, resolved at startup (wants) or on first sight --------------------

    def _method(self, info: MethodInfo) -> _MethodMetrics:
        state = self._methods.get(info.path)
        if state is not None:
            return state
        label = info.path
        if not info.known:
            if self._unknown_paths >= self._max_unknown:
                label = UNKNOWN_METHOD
                state = self._methods.get(UNKNOWN_METHOD)
                if state is not None:
                    return state
            else:
                self._unknown_paths += 1
        state = _MethodMetrics(self, info, label)
        self._methods[label if label == UNKNOWN_METHOD else info.path] = state
        return state

    def wants(self, method: MethodInfo) -> bool:
        self._method(method)
        return True

    # -- hooks --------------------------------------------------------------------------------

    def on_start(self, call: Call) -> None:
        self._method(call.method).inflight.inc()

    def on_finish(self, call: Call) -> None:
        state = self._method(call.method)
        state.inflight.dec()
        # GetPluginInfo names the driver: learnt before its own call is counted, so the
        # first call is not the one series left with driver_name="unknown-driver".
        if state.driver_info and call.code is StatusCode.OK and call.response is not None:
            message = call.response.message
            name = getattr(message, "name", "") if message is not None else ""
            if name:
                self.set_driver_name(name)
        elapsed = call.elapsed
        duration, csi = state.children(self, call.code)
        duration.observe(elapsed)
        if csi is not None:
            csi.observe(elapsed)
        if state.requests is not None and call.request_count:
            state.requests.inc(call.request_count)
        if state.responses is not None and call.response_count:
            state.responses.inc(call.response_count)

    # -- driver name --------------------------------------------------------------------------

    def set_driver_name(self, name: str) -> None:
        """Use ``name`` as driver_name from now on (children are re-resolved lazily)."""
        if name == self.driver_name:
            return
        self.driver_name = name
        for state in self._methods.values():
            if state.csi:
                state.by_code.clear()

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


def build(ns: argparse.Namespace, runtime: Runtime) -> Stage | None:
    if getattr(ns, "disable_metrics", False):
        return None
    return MetricsStage(
        runtime.metrics,
        upstream=runtime.upstream,
        csi_info_path=csi_info_path(runtime.registry),
    )
