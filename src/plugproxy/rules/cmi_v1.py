"""Rule table of CMI v1 (package cmi.v1).

REQUIRED fields: the spec's 18 "This field is REQUIRED" less two whose literal reading
would flag every empty listing (``ListMachinesResponse.MachineList`` and
``GetVolumeIDsResponse.VolumeIDs``: a provider with no machines, or PV specs with no
volumes of the provider, have nothing to list). ``ProviderSpec`` is bytes: empty is missing.
CMI's error tables list every gRPC code for each Machine RPC, so no code is unexpected.

Capability enum numbers: the spec text's listing of ``Capability.RPC.Type`` swaps two
values against the spec's own proto (text: SHUTDOWN_MACHINE = 4, LIST_MACHINE = 5; proto:
LIST_MACHINES = 4, SHUTDOWN_MACHINE = 5). Plugins are built from the proto and the wire
carries numbers, so the proxy reads them as the proto does; messages naming either value
say so.
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
_NUMBERING = (
    "Capabilities are read by number as the proto defines them (LIST_MACHINES = 4,"
    " SHUTDOWN_MACHINE = 5); the spec text's listing swaps the two."
)
_SWAPPED = (
    "read as the proto numbers it; the spec text's listing swaps LIST_MACHINES and SHUTDOWN_MACHINE"
)

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
        note="ProviderID is judged where the plugin returns it, not where the client passes"
        " it back. ListMachines' MachineList is a listing (§ListMachines: return all"
        " machines), not a 4 KiB attribute map: each ProviderID key is judged as a string.",
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
        "A non-OK status carries a google.rpc.Status with details (grpc-status-details-bin).",
    ),
    Rule(
        "cmi.unimplemented-advertised",
        MUST,
        (PLUGIN,),
        f"{TITLE} §{{rpc}}",
        "The plugin answers UNIMPLEMENTED for an RPC it must implement or advertised.",
        note=_NUMBERING,
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
        reject_code=None,
        note=_NUMBERING,
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
        "GetMachineStatus": ("plugin", ("GET_MACHINE_STATUS",)),
        "ShutDownMachine": ("plugin", ("SHUTDOWN_MACHINE",)),
        "ListMachines": ("plugin", ("LIST_MACHINES",)),
        "GetVolumeIDs": ("plugin", ("GET_VOLUME_IDS",)),
    },
    capability_notes={"LIST_MACHINES": _SWAPPED, "SHUTDOWN_MACHINE": _SWAPPED},
    # The client passes back the ProviderID the plugin made (blamed where it was made).
    echoes={
        ("DeleteMachineRequest", "ProviderID"): ("CreateMachineResponse", "ProviderID"),
        ("GetMachineStatusRequest", "ProviderID"): ("CreateMachineResponse", "ProviderID"),
        ("ShutDownMachineRequest", "ProviderID"): ("CreateMachineResponse", "ProviderID"),
    },
    # Volume ids the plugin read from the client's PV specs: made by the volumes' drivers.
    size_overrides={("GetVolumeIDsResponse", "VolumeIDs"): None},
    # A listing of every machine (§ListMachines) as map<ProviderID, MachineName>: each
    # ProviderID is judged as the string the plugin made; MachineName came from the client.
    map_key_limits={("ListMachinesResponse", "MachineList"): 128},
    response_checks={"GetPluginCapabilities": (_required_capabilities,)},
)
