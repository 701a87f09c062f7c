"""Rule table of the device plugin API v1beta1 (package v1beta1).

Two services with the roles swapped: kubelet serves ``Registration`` and a device plugin
calls it, so there the "CO" side judged is the plugin registering; every plugin serves
``DevicePlugin`` and kubelet calls it.

The API calls no field REQUIRED in so many words. Judged: a RegisterRequest without
``version``, ``endpoint`` or ``resource_name`` (kubelet refuses such a registration; the API
names the version check and the resource name's uniqueness as its reasons to refuse), a
Device ``ID`` over 63 characters ("Max length of this field is 63 characters"), a device
``health`` other than "Healthy" or "Unhealthy" (the two values of the API's constants),
and a preferred allocation that does not do what the request asks (advisory: the answer
is only a preference).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.rules.engine import (
    CO,
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

TITLE = "Device plugin v1beta1"
FILE = "api.proto"
HEALTH_VALUES = ("Healthy", "Unhealthy")
DEVICE_ID_MAX = 63

RULES = (
    Rule(
        "deviceplugin.required-field",
        MUST,
        (CO,),
        f"{TITLE} {FILE} §RegisterRequest",
        "A RegisterRequest lacks version, endpoint or resource_name.",
        reject_code=None,
        note="The caller of Registration is the device plugin, kubelet the server.",
    ),
    Rule(
        "deviceplugin.size-limit",
        MUST,
        (PLUGIN,),
        f"{TITLE} {FILE} §Device",
        "A Device ID is longer than 63 characters.",
        reject_code=None,
    ),
    Rule(
        "deviceplugin.device-health-value",
        MUST,
        (PLUGIN,),
        f"{TITLE} {FILE} §Device",
        'A device health other than "Healthy" or "Unhealthy".',
        reject_code=None,
    ),
    Rule(
        "deviceplugin.preferred-allocation-mismatch",
        SHOULD,
        (PLUGIN,),
        f"{TITLE} {FILE} §PreferredAllocationRequest",
        "A preferred allocation that is not allocation_size devices out of the available ones"
        " including every must-include one, or not one per container request (advisory).",
        reject_code=None,
    ),
    malformed_message_rule("deviceplugin", f"{TITLE} {FILE} §{{rpc}}", None),
)

REQUIRED: dict[str, tuple[str, ...]] = {
    "RegisterRequest": ("version", "endpoint", "resource_name"),
}


def _health(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    for i, device in enumerate(resp.devices):
        if device.health not in HEALTH_VALUES:
            what = "empty" if not device.health else "another string"
            yield Violation(
                cs.rule("device-health-value"),
                f"devices[{i}].health",
                f"devices[{i}].health is {what}; the API knows {' and '.join(HEALTH_VALUES)}",
            )


def _preferred(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    rule = cs.rule("preferred-allocation-mismatch")
    asked, got = req.container_requests, resp.container_responses
    if len(asked) != len(got):
        yield Violation(
            rule,
            "container_responses",
            f"{len(got)} container response(s) for {len(asked)} container request(s)",
        )
        return
    for i, (a, g) in enumerate(zip(asked, got, strict=True)):
        where = f"container_responses[{i}].deviceIDs"
        chosen = list(g.deviceIDs)
        problems = []
        if len(chosen) != a.allocation_size:
            problems.append(f"{len(chosen)} device(s) where allocation_size is {a.allocation_size}")
        if not set(chosen) <= set(a.available_deviceIDs):
            problems.append("a device not among available_deviceIDs")
        if not set(a.must_include_deviceIDs) <= set(chosen):
            problems.append("not every one of must_include_deviceIDs")
        if problems:
            yield Violation(rule, where, f"{where} holds {'; '.join(problems)}")


TABLE = SpecTable(
    spec="deviceplugin.v1beta1",
    family="deviceplugin",
    title=TITLE,
    package="v1beta1",
    rules=RULES,
    required=REQUIRED,
    string_limit=None,
    map_limit=None,
    size_overrides={("Device", "ID"): DEVICE_ID_MAX},
    response_checks={"ListAndWatch": (_health,), "GetPreferredAllocation": (_preferred,)},
)
