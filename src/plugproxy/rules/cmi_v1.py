"""Rule table of CMI v1 (package cmi.v1).

REQUIRED fields: the spec's 18 "This field is REQUIRED" less two whose literal reading
would flag every empty listing (``ListMachinesResponse.MachineList`` and
``GetVolumeIDsResponse.VolumeIDs``: a provider with no machines, or PV specs with no
volumes of the provider, have nothing to list). ``ProviderSpec`` is bytes: empty is missing.
CMI's error tables list every gRPC code for each Machine RPC, so no code is unexpected.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.rules.csi_common import capability_names
from plugproxy.rules.engine import (
    CO,
    MUST,
    PLUGIN,
    SHOULD,
    CompiledSpec,
    Rule,
    SpecTable,
    Violation,
)

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.state import SpecState

TITLE = "CMI v1"
BOTH = (CO, PLUGIN)

RULES = (
    Rule(
        "cmi.required-field",
        MUST,
        BOTH,
        f"{TITLE} §{{rpc}}",
        "A field the spec marks REQUIRED is missing.",
    ),
    Rule(
        "cmi.size-limit",
        MUST,
        BOTH,
        f"{TITLE} §Size Limits",
        "A string exceeds 128 bytes or a map<string,string> 4 KiB.",
    ),
    Rule(
        "cmi.plugin-name-format",
        MUST,
        (PLUGIN,),
        f"{TITLE} §GetPluginInfo",
        "The plugin name is not 63 characters or less in domain name notation.",
    ),
    Rule(
        "cmi.secret-key-format",
        MUST,
        (CO,),
        f"{TITLE} §Secrets Requirements",
        "A Secrets map key is not made of alphanumerics, '-', '_' and '.'.",
    ),
    Rule(
        "cmi.malformed-message",
        MUST,
        BOTH,
        f"{TITLE} §{{rpc}}",
        "The message bytes do not decode as the RPC's message type.",
    ),
    Rule(
        "cmi.error-message-empty",
        MUST,
        (PLUGIN,),
        f"{TITLE} §Error Scheme",
        "A non-OK status carries an empty message.",
    ),
    Rule(
        "cmi.status-details-nonempty",
        MUST,
        (PLUGIN,),
        f"{TITLE} §Error Scheme",
        "A non-OK status carries status details (grpc-status-details-bin).",
    ),
    Rule(
        "cmi.unimplemented-advertised",
        MUST,
        (PLUGIN,),
        f"{TITLE} §{{rpc}}",
        "The plugin answers UNIMPLEMENTED for an RPC it must implement or advertised.",
    ),
    Rule(
        "cmi.error-code-unexpected",
        SHOULD,
        (PLUGIN,),
        f"{TITLE} §{{rpc}}",
        "A status code outside the RPC's error table (advisory).",
    ),
    Rule(
        "cmi.capability-not-advertised",
        SHOULD,
        (CO,),
        f"{TITLE} §{{rpc}}",
        "The client calls an optional RPC whose capability the plugin did not advertise.",
        reject_code="FAILED_PRECONDITION",
    ),
    Rule(
        "cmi.required-capability-missing",
        MUST,
        (PLUGIN,),
        f"{TITLE} §GetPluginCapabilities",
        "GetPluginCapabilities omits CREATE_MACHINE or DELETE_MACHINE.",
    ),
)

REQUIRED: dict[str, tuple[str, ...]] = {
    "GetPluginInfoResponse": ("name", "version"),
    "CreateMachineRequest": ("MachineName", "ProviderSpec"),
    "CreateMachineResponse": ("ProviderID", "NodeName"),
    "DeleteMachineRequest": ("MachineName", "ProviderSpec"),
    "GetMachineStatusRequest": ("MachineName", "ProviderSpec"),
    "GetMachineStatusResponse": ("ProviderID", "NodeName"),
    "ShutDownMachineRequest": ("MachineName", "ProviderSpec"),
    "ListMachinesRequest": ("ProviderSpec",),
    "GetVolumeIDsRequest": ("PVSpecList",),
}


def _required_capabilities(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    names = capability_names(resp)
    missing = [c for c in ("CREATE_MACHINE", "DELETE_MACHINE") if c not in names]
    if missing:
        yield Violation(
            cs.rule("required-capability-missing"),
            "capabilities",
            f"capabilities lacks {' and '.join(missing)}, which every plugin provides",
        )


TABLE = SpecTable(
    spec="cmi.v1",
    family="cmi",
    title=TITLE,
    package="cmi.v1",
    rules=RULES,
    required=REQUIRED,
    plugin_name_fields=(("GetPluginInfoResponse", "name"),),
    general_codes=frozenset(),
    required_rpcs=frozenset(
        {"GetPluginInfo", "GetPluginCapabilities", "Probe", "CreateMachine", "DeleteMachine"}
    ),
    capability_queries={"plugin": "/cmi.v1.Identity/GetPluginCapabilities"},
    capability_responses={"GetPluginCapabilities": "plugin"},
    rpc_gates={
        "GetMachineStatus": ("plugin", "GET_MACHINE_STATUS"),
        "ShutDownMachine": ("plugin", "SHUTDOWN_MACHINE"),
        "ListMachines": ("plugin", "LIST_MACHINES"),
        "GetVolumeIDs": ("plugin", "GET_VOLUME_IDS"),
    },
    response_checks={"GetPluginCapabilities": (_required_capabilities,)},
)
