"""Rule table of kubelet plugin registration v1 (package pluginregistration).

Every node plugin (CSI, device, DRA) serves ``Registration`` on a socket in kubelet's
plugin directory; kubelet calls GetInfo, then NotifyRegistrationStatus. The API calls
``endpoint`` optional and no field REQUIRED; judged as required are the other fields of
PluginInfo, without which kubelet refuses the registration: ``type`` (which handler takes
the plugin), ``name`` (what identifies it) and ``supported_versions`` (kubelet "returns an
error if none of the listed versions is supported"). ``type`` is advised to be one kubelet
knows (CSIPlugin, DevicePlugin, DRAPlugin); the API's comment names the first two.
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

TITLE = "Plugin registration v1"
FILE = "api.proto"
PLUGIN_TYPES = ("CSIPlugin", "DevicePlugin", "DRAPlugin")

RULES = (
    Rule(
        "pluginregistration.required-field",
        MUST,
        (PLUGIN,),
        f"{TITLE} {FILE} §PluginInfo",
        "GetInfo answers a PluginInfo without type, name or supported_versions.",
        reject_code=None,
        note="endpoint is the one field the API calls optional.",
    ),
    Rule(
        "pluginregistration.plugin-type-unknown",
        SHOULD,
        (PLUGIN,),
        f"{TITLE} {FILE} §PluginInfo",
        "PluginInfo.type is none of CSIPlugin, DevicePlugin, DRAPlugin (advisory).",
        reject_code=None,
    ),
    malformed_message_rule("pluginregistration", f"{TITLE} {FILE} §{{rpc}}", None),
)

REQUIRED: dict[str, tuple[str, ...]] = {
    "PluginInfo": ("type", "name", "supported_versions"),
}


def _plugin_type(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if resp.type and resp.type not in PLUGIN_TYPES:
        yield Violation(
            cs.rule("plugin-type-unknown"),
            "type",
            f"type is none of {', '.join(PLUGIN_TYPES)}; kubelet has no handler for it",
        )


TABLE = SpecTable(
    spec="pluginregistration.v1",
    family="pluginregistration",
    title=TITLE,
    package="pluginregistration",
    rules=RULES,
    required=REQUIRED,
    string_limit=None,
    map_limit=None,
    response_checks={"GetInfo": (_plugin_type,)},
)
