"""Readiness from the plugin's own Probe (CSI v1.12 §Probe, CMI §Probe).

/readyz is ready when the upstream connection is up (checked by the server) and this check
passes: the plugin's Probe answers OK and does not say ``ready: false``. The ``ready`` field
is a BoolValue wrapper; when it is absent the caller assumes the plugin is ready (CSI v1.12
§Probe), so only an explicit false means "still initialising".

How it runs: the admin server answers from its own thread. On a cache miss that thread
schedules the Probe on the proxy's event loop (``asyncio.run_coroutine_threadsafe``) and
waits at most ``--readiness-probe-timeout``. Results are kept for ``--readiness-cache-ttl``
in a bounded, expiring map, so kubelet probing every few seconds, or several probers at once,
cause at most one Probe per TTL; there is no background polling.

Which Probe: the Identity Probe of each spec the proxy serves, in the order csi.v1, cmi.v1,
csi.v0. The first one the plugin does not answer UNIMPLEMENTED is remembered and used from
then on. A plugin answering none of them (COSI has no Probe) is ready when reachable.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from plugproxy.api import StatusCode, UpstreamError, UpstreamState, UpstreamView
from plugproxy.core.memory import ExpiringMap
from plugproxy.core.options import Option, duration, options_of, setting
from plugproxy.spec.registry import load_spec


@dataclass(frozen=True)
class ReadinessSettings:
    readiness_probe: str = setting(
        "--readiness-probe",
        "also call the plugin's Probe for /readyz (auto) or only check the connection (off)",
        default="auto",
        choices=("auto", "off"),
    )
    readiness_probe_timeout: float = setting(
        "--readiness-probe-timeout",
        "how long /readyz waits for the plugin's Probe",
        default=3.0,
        type=duration,
        metavar="DURATION",
    )
    readiness_cache_ttl: float = setting(
        "--readiness-cache-ttl",
        "how long a Probe result answers /readyz before the plugin is asked again",
        default=2.0,
        type=duration,
        metavar="DURATION",
    )


OPTIONS: list[Option] = options_of(ReadinessSettings)

PROBE_ORDER: tuple[str, ...] = ("csi.v1", "cmi.v1", "csi.v0")
_NO_PROBE = ""  # remembered when the plugin answers no Probe at all


def probe_paths(specs: Iterable[str]) -> list[tuple[str, str]]:
    """(spec, Probe path) for the served specs that define an Identity Probe, in try order."""
    served = set(specs)
    return [(s, f"/{s}.Identity/Probe") for s in PROBE_ORDER if s in served]


class ProbeReadiness:
    """A readiness check (``check() -> (ok, reason)``) backed by the plugin's Probe."""

    def __init__(
        self,
        upstream: UpstreamView,
        specs: Iterable[str],
        loop: asyncio.AbstractEventLoop,
        timeout: float = 3.0,
        ttl: float = 2.0,
    ) -> None:
        self._upstream = upstream
        self._candidates = probe_paths(specs)
        self._loop = loop
        self._timeout = timeout
        self._cache: ExpiringMap[str, tuple[bool, str]] = ExpiringMap(1, max(ttl, 1e-6))
        self._lock = threading.Lock()
        self._chosen: tuple[str, str] | None = None  # (spec, path); path "" = none answers
        self.probes_sent = 0

    # Runs in the admin server's thread.
    def check(self) -> tuple[bool, str]:
        if not self._candidates:
            return True, "no Probe in the served specs"
        if self._upstream.state is not UpstreamState.UP:
            return False, "plugin Probe not sent: upstream down"
        with self._lock:
            cached = self._cache.get("probe")
            if cached is not None:
                return cached
            if _on_loop_thread(self._loop):  # waiting here would block the Probe itself
                return False, "plugin Probe not answered yet"
            result = self._probe_from_thread()
            self._cache["probe"] = result
            return result

    def _probe_from_thread(self) -> tuple[bool, str]:
        future = asyncio.run_coroutine_threadsafe(self.probe(), self._loop)
        try:
            return future.result(self._timeout + 0.5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return False, f"plugin Probe did not answer within {self._timeout:g}s"

    # Runs on the proxy's event loop.
    async def probe(self) -> tuple[bool, str]:
        """Ask the plugin once (trying each candidate Probe until one is implemented)."""
        candidates = [self._chosen] if self._chosen is not None else self._candidates
        for spec, path in candidates:
            if not path:
                return True, "plugin answers no Probe; connection is up"
            self.probes_sent += 1
            try:
                raw = await self._upstream.unary(path, b"", self._timeout)
            except UpstreamError as err:
                code = err.code
                if code is StatusCode.UNIMPLEMENTED and self._chosen is None:
                    continue
                if code is StatusCode.DEADLINE_EXCEEDED:
                    return False, f"plugin Probe did not answer within {self._timeout:g}s"
                return False, f"plugin Probe failed: {code.name} {err.details or ''}".rstrip()
            except (TimeoutError, OSError) as exc:
                return False, f"plugin Probe failed: {type(exc).__name__}"
            self._chosen = (spec, path)
            return _judge(spec, raw)
        self._chosen = ("", _NO_PROBE)
        return True, "plugin answers no Probe; connection is up"


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _judge(spec: str, raw: bytes) -> tuple[bool, str]:
    response_class: Any = load_spec(spec).message_class(f"{spec}.ProbeResponse")
    try:
        response = response_class.FromString(raw)
    except Exception:
        return False, f"plugin Probe answer is not a {spec}.ProbeResponse"
    # ready is a BoolValue: unset means ready (CSI v1.12 §Probe).
    if response.HasField("ready") and not response.ready.value:
        return False, "plugin Probe says not ready (ready: false)"
    return True, "plugin Probe ready"


def from_settings(
    settings: ReadinessSettings,
    upstream: UpstreamView,
    specs: Iterable[str],
    loop: asyncio.AbstractEventLoop,
) -> ProbeReadiness | None:
    """The configured readiness check, or None with ``--readiness-probe off``."""
    if settings.readiness_probe == "off":
        return None
    return ProbeReadiness(
        upstream,
        specs,
        loop,
        timeout=settings.readiness_probe_timeout,
        ttl=settings.readiness_cache_ttl,
    )
