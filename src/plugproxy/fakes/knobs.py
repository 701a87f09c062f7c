"""Test knobs of the fake plugins: delays, injected status codes and deliberate breaches.

Method keys are RPC names as the spec's descriptors spell them ("CreateVolume"); the CLI
also accepts "Service/Method", a full path "/csi.v1.Controller/CreateVolume", or "*" for
every method of the spec. Keys are normalised to the RPC name by :meth:`FakeKnobs.checked`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import grpc

from plugproxy.core.endpoints import ConfigError
from plugproxy.fakes.misbehave import check_misbehaviours
from plugproxy.spec.registry import SPEC_NAMES, Registry

ANY_METHOD = "*"


@dataclass
class FailureRule:
    """Answer calls of one method with ``code``; ``remaining`` None means every call.

    ``after_call``: the method runs first and its effects stay, then the call is answered
    with ``code`` (e.g. NOT_FOUND from an unpublish whose volume vanished meanwhile).
    """

    code: grpc.StatusCode
    remaining: int | None = None
    message: str = ""
    after_call: bool = False

    def describe(self) -> str:
        times = "every call" if self.remaining is None else f"next {self.remaining} call(s)"
        return f"{self.code.name} ({times})"


@dataclass
class FakeKnobs:
    """What a fake plugin does besides behaving: all fields may also be changed live."""

    delays: dict[str, float] = field(default_factory=dict)
    failures: dict[str, FailureRule] = field(default_factory=dict)
    misbehave: set[str] = field(default_factory=set)
    plugin_name: str | None = None
    # Legitimate behaviours real plugins show (none breaks a spec rule by itself):
    # capability names left out of every *GetCapabilities answer;
    hide_capabilities: set[str] = field(default_factory=set)
    # CSI ids the plugin mints (volumes, snapshots, group snapshots) padded to this length,
    # and ListVolumes/ListSnapshots next_token padded to this length (read at start);
    id_bytes: int = 0
    token_bytes: int = 0
    # every error carries grpc-status-details-bin: a google.rpc.Status without details, as
    # grpcio-status' abort_with_status and grpc-java's StatusProto send;
    status_in_trailer: bool = False
    # built against a CSI release before v1.5: ValidateVolumeCapabilities confirms the
    # capabilities without MountVolume.volume_mount_group, a field it does not know.
    older_csi: bool = False
    # seconds between the updates a streaming method sends (device plugin ListAndWatch,
    # DRA health NodeWatchResources).
    stream_period: float = 1.0

    def checked(self, spec: str) -> FakeKnobs:
        """A validated deep copy with method keys normalised; ConfigError when invalid."""
        out = copy.deepcopy(self)
        out.delays = {}
        for key, seconds in self.delays.items():
            if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
                raise ConfigError(f"delay for {key}: {seconds!r} is not a number of seconds >= 0")
            out.delays[normalize_method(spec, key)] = float(seconds)
        out.failures = {}
        for key, rule in self.failures.items():
            if rule.code is grpc.StatusCode.OK:
                raise ConfigError(f"failure for {key}: OK is not an error code")
            if rule.remaining is not None and rule.remaining < 1:
                raise ConfigError(f"failure for {key}: count must be >= 1")
            out.failures[normalize_method(spec, key)] = copy.copy(rule)
        check_misbehaviours(spec, self.misbehave)
        if self.plugin_name is not None and not self.plugin_name:
            raise ConfigError("plugin name must not be empty")
        period = self.stream_period
        if not isinstance(period, int | float) or not math.isfinite(period) or period < 0:
            raise ConfigError(f"stream period: {period!r} is not a number of seconds >= 0")
        for name in ("id_bytes", "token_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name}: {value!r} is not a whole number >= 0")
        return out

    def delay_for(self, method: str) -> float:
        return self.delays.get(method, self.delays.get(ANY_METHOD, 0.0))

    def take_failure(self, method: str) -> FailureRule | None:
        """The injected failure for this call, consuming one use of a counted rule."""
        for key in (method, ANY_METHOD):
            rule = self.failures.get(key)
            if rule is None:
                continue
            if rule.remaining is not None:
                rule.remaining -= 1
                if rule.remaining <= 0:
                    del self.failures[key]
            return rule
        return None


# Specs a fake serves on its socket besides its own: a DRA kubelet plugin serves both
# DRAPlugin versions and both device health versions, kubelet picking what it speaks.
SERVED_WITH: dict[str, tuple[str, ...]] = {
    "dra.v1": ("dra.v1beta1", "drahealth.v1", "drahealth.v1alpha1"),
}


def served_specs(spec: str) -> tuple[str, ...]:
    """The specs whose methods the fake of ``spec`` serves, its own first."""
    return (spec, *SERVED_WITH.get(spec, ()))


def spec_method_names(spec: str) -> dict[str, str]:
    """Every accepted spelling of a method the fake of ``spec`` serves -> its RPC name."""
    if spec not in SPEC_NAMES:
        raise ConfigError(f"unknown spec {spec!r}; known: {', '.join(SPEC_NAMES)}")
    names: dict[str, str] = {}
    served = served_specs(spec)
    registry = Registry(served)
    for info in (m for s in served for m in registry.methods(s)):
        short_service = info.service.rsplit(".", 1)[-1]
        for spelling in (info.name, f"{short_service}/{info.name}", info.path):
            names[spelling] = info.name
    return names


def normalize_method(spec: str, key: str) -> str:
    if key == ANY_METHOD:
        return key
    names = spec_method_names(spec)
    if key in names:
        return names[key]
    known = sorted({v for v in names.values()})
    raise ConfigError(f"{key!r} is not a method of {spec}; known: {', '.join(known)}")


def parse_status_code(text: str) -> grpc.StatusCode:
    """'UNAVAILABLE', 'unavailable', 'not-found' or a number 1-16."""
    raw = text.strip()
    if raw.isdigit():
        for code in grpc.StatusCode:
            if code.value[0] == int(raw):
                if code is grpc.StatusCode.OK:
                    break
                return code
        raise ConfigError(f"{text!r} is not a gRPC error code number (1-16)")
    name = raw.upper().replace("-", "_")
    try:
        code = grpc.StatusCode[name]
    except KeyError:
        names = ", ".join(c.name for c in grpc.StatusCode if c is not grpc.StatusCode.OK)
        raise ConfigError(f"{text!r} is not a gRPC status code; use one of {names}") from None
    if code is grpc.StatusCode.OK:
        raise ConfigError("OK is not an error code")
    return code


def parse_delay(spec: str, text: str) -> tuple[str, float]:
    """'METHOD=SECONDS' -> (rpc name, seconds)."""
    method, sep, value = text.partition("=")
    if not sep or not method:
        raise ConfigError(f"--delay {text!r}: expected METHOD=SECONDS")
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"--delay {text!r}: {value!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"--delay {text!r}: seconds must be a finite number >= 0")
    return normalize_method(spec, method), seconds


def parse_failure(spec: str, text: str) -> tuple[str, FailureRule]:
    """'METHOD=CODE[:COUNT]' -> (rpc name, rule)."""
    method, sep, value = text.partition("=")
    if not sep or not method or not value:
        raise ConfigError(f"--fail {text!r}: expected METHOD=CODE[:COUNT]")
    code_text, _, count_text = value.partition(":")
    try:
        code = parse_status_code(code_text)
    except ConfigError as exc:
        raise ConfigError(f"--fail {text!r}: {exc}") from None
    remaining: int | None = None
    if count_text:
        if not count_text.isdigit() or int(count_text) < 1:
            raise ConfigError(f"--fail {text!r}: COUNT must be a whole number >= 1")
        remaining = int(count_text)
    return normalize_method(spec, method), FailureRule(code, remaining)


def knobs_from_flags(
    spec: str,
    delays: list[str] | None = None,
    failures: list[str] | None = None,
    misbehave: list[str] | None = None,
    plugin_name: str | None = None,
    stream_period: float | None = None,
) -> FakeKnobs:
    """Build validated knobs from CLI flag values; ConfigError on the first bad one."""
    knobs = FakeKnobs(plugin_name=plugin_name)
    if stream_period is not None:
        knobs.stream_period = stream_period
    for text in delays or ():
        method, seconds = parse_delay(spec, text)
        knobs.delays[method] = seconds
    for text in failures or ():
        method, rule = parse_failure(spec, text)
        knobs.failures[method] = rule
    for item in misbehave or ():
        for name in item.split(","):
            if name.strip():
                knobs.misbehave.add(name.strip())
    return knobs.checked(spec)
