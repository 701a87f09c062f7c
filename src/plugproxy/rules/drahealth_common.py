"""What DRA device health v1alpha1 and v1 state alike: one set of rules, each version's
table citing its own file.

A DRA kubelet plugin serves ``DRAResourceHealth`` beside ``DRAPlugin``; kubelet calls
NodeWatchResources once and reads the plugin's updates from the stream for as long as both
live, like a device plugin's ListAndWatch. Every update is judged as it passes. All the
rules judge the plugin (the request is empty, "reserved for future use"):

- A DeviceHealth names its device: a DeviceIdentifier, which "uniquely identifies a device
  within the scope of a driver", with the pool and the device name (the same pair DRAPlugin's
  Device calls Required). An update without them says nothing kubelet can attach.
- ``health`` is a value of HealthStatus (UNKNOWN, HEALTHY, UNHEALTHY); proto3 lets any other
  number through the wire, which no reader knows.
- ``message`` is at most 1024 characters (kubelet cuts a longer one to 1021 and "...").
- ``last_updated_time`` is in Unix seconds: a negative one, or one after the year 3000, is
  in another unit (milliseconds, nanoseconds) or no time at all.
- ``health_check_timeout_seconds`` negative is logged by kubelet and ignored (SHOULD: zero
  asks for kubelet's default).
- One update lists each device once (SHOULD: two entries give one device two healths).

Not judged: that an update lists every device of the driver ("should be a complete list"):
a proxy does not know the driver's devices, and a device may leave the list legitimately.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.rules.engine import (
    MUST,
    PLUGIN,
    SHOULD,
    CompiledSpec,
    Rule,
    SpecTable,
    Violation,
    malformed_message_rule,
)

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.state import SpecState

FILE = "api.proto"
FAMILY = "drahealth"
HEALTH_VALUES = {0: "UNKNOWN", 1: "HEALTHY", 2: "UNHEALTHY"}
MESSAGE_MAX = 1024  # characters
# 3000-01-01T00:00:00Z in Unix seconds; milliseconds of any time since 1971 lie beyond it.
LATEST_SECONDS = 32_503_680_000

REQUIRED: dict[str, tuple[str, ...]] = {
    "DeviceHealth": ("device",),
    "DeviceIdentifier": ("pool_name", "device_name"),
}


def rules(title: str) -> tuple[Rule, ...]:
    """The rules of the version called ``title`` ("DRA health v1"), cited in its file."""
    return (
        Rule(
            "drahealth.required-field",
            MUST,
            (PLUGIN,),
            f"{title} {FILE} §DeviceIdentifier",
            "A DeviceHealth without its device, or a DeviceIdentifier without pool_name or"
            " device_name.",
            reject_code=None,
            note="The identifier uniquely identifies a device of the driver: the pool and the"
            " name, the pair DRAPlugin's Device calls Required.",
        ),
        Rule(
            "drahealth.health-value",
            MUST,
            (PLUGIN,),
            f"{title} {FILE} §HealthStatus",
            "A health that is no value of HealthStatus (UNKNOWN, HEALTHY, UNHEALTHY).",
            reject_code=None,
        ),
        Rule(
            "drahealth.size-limit",
            MUST,
            (PLUGIN,),
            f"{title} {FILE} §DeviceHealth",
            "A DeviceHealth message longer than 1024 characters.",
            reject_code=None,
            note='kubelet cuts a longer one to 1021 characters and "...".',
        ),
        Rule(
            "drahealth.time-not-seconds",
            MUST,
            (PLUGIN,),
            f"{title} {FILE} §DeviceHealth",
            "A last_updated_time that is no Unix time in seconds: negative, or after the year"
            " 3000 (milliseconds or nanoseconds).",
            reject_code=None,
            note="Zero is not judged: the API does not say the field may be left out, nor that"
            " it may not.",
        ),
        Rule(
            "drahealth.negative-value",
            SHOULD,
            (PLUGIN,),
            f"{title} {FILE} §DeviceHealth",
            "A negative health_check_timeout_seconds (advisory).",
            reject_code=None,
            note="kubelet logs it and uses its default timeout, as for zero, the value that"
            " asks for the default.",
        ),
        Rule(
            "drahealth.device-duplicate",
            SHOULD,
            (PLUGIN,),
            f"{title} {FILE} §NodeWatchResourcesResponse",
            "One update lists a device (pool and name) more than once (advisory).",
            reject_code=None,
            note="An update is the list of the driver's devices and their current health;"
            " two entries give one device two.",
        ),
        malformed_message_rule(FAMILY, f"{title} {FILE} §{{rpc}}", None),
    )


def judge_update(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    """The checks of one update that read values, not presence; violations never quote a
    device's names or message."""
    first: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(resp.devices):
        where = f"devices[{i}]"
        health = int(entry.health)
        if health not in HEALTH_VALUES:
            yield Violation(
                cs.rule("health-value"),
                f"{where}.health",
                f"{where}.health is {health}; HealthStatus knows"
                f" {', '.join(f'{n} ({v})' for v, n in HEALTH_VALUES.items())}",
            )
        if len(entry.message) > MESSAGE_MAX:
            yield Violation(
                cs.rule("size-limit"),
                f"{where}.message",
                f"{where}.message is {len(entry.message)} characters; at most {MESSAGE_MAX}",
            )
        when = entry.last_updated_time
        if when < 0 or when > LATEST_SECONDS:
            unit = "negative" if when < 0 else "after the year 3000 as seconds"
            yield Violation(
                cs.rule("time-not-seconds"),
                f"{where}.last_updated_time",
                f"{where}.last_updated_time is {unit}; the API counts Unix seconds",
            )
        if entry.HasField("device"):
            ident = (entry.device.pool_name, entry.device.device_name)
            if all(ident):
                earlier = first.setdefault(ident, i)
                if earlier != i:
                    yield Violation(
                        cs.rule("device-duplicate"),
                        f"{where}.device",
                        f"{where}.device names the device devices[{earlier}] names",
                    )


def table(spec: str, title: str, package: str) -> SpecTable:
    """The table of DRA health version ``spec`` (package ``package``)."""
    return SpecTable(
        spec=spec,
        family=FAMILY,
        title=title,
        package=package,
        rules=rules(title),
        required=REQUIRED,
        string_limit=None,
        map_limit=None,
        non_negative=(("DeviceHealth", "health_check_timeout_seconds"),),
        response_checks={"NodeWatchResources": (judge_update,)},
    )
