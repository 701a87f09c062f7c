"""Rule table of CMI v1 (package cmi.v1).

REQUIRED fields: the spec's 18 "This field is REQUIRED". Two of them are judged as the
advisory ``cmi.required-field-caveat``, since their literal reading would flag every empty
listing (``ListMachinesResponse.MachineList`` and ``GetVolumeIDsResponse.VolumeIDs``: a
provider with no machines, or PV specs with no volumes of the provider, have nothing to
list). ``ProviderSpec`` is bytes: empty is missing.
CMI's error tables list every gRPC code for each Machine RPC, so no code is unexpected.

Capability enum numbers: the spec text's listing of ``Capability.RPC.Type`` swaps two
values against the spec's own proto (text: SHUTDOWN_MACHINE = 4, LIST_MACHINE = 5; proto:
LIST_MACHINES = 4, SHUTDOWN_MACHINE = 5). Plugins are built from the proto and the wire
carries numbers, so the proxy reads them as the proto does; messages naming either value
say so.

Machine idempotency and capability stability (family K) are judged on what this proxy saw,
in bounded expiring memory (:class:`MachineMemory`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import ExpiringMap, ago, message_digest, parts_digest
from plugproxy.rules.csi_common import capability_names, generic_rules
from plugproxy.rules.engine import (
    CO,
    MUST,
    PLUGIN,
    SHOULD,
    CompiledSpec,
    FixFirst,
    Rule,
    SpecTable,
    StateChange,
    Violation,
    malformed_message_rule,
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
        note="ProviderID is judged where the plugin returns it; where the client passes it"
        " back, cmi.size-limit-echoed judges it. ListMachines' MachineList is a listing"
        " (§ListMachines: return all machines), not a 4 KiB attribute map: each ProviderID"
        " key is judged as a string.",
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
    malformed_message_rule("cmi", f"{TITLE} §{{rpc}}", "INVALID_ARGUMENT"),
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
    Rule(
        "cmi.required-field-caveat",
        SHOULD,
        (PLUGIN,),
        f"{TITLE} §{{rpc}}",
        "A REQUIRED listing is empty: ListMachines' MachineList or GetVolumeIDs' VolumeIDs"
        " (advisory).",
        reject_code=None,
        note='Both are marked REQUIRED and a REQUIRED map or repeated field "MUST contain'
        ' at least 1 element" (§Field Requirements), but an empty inventory is a real'
        " answer: a provider without machines of the ProviderSpec's cluster, PV specs without"
        " a volume of this provider (§GetVolumeIDs lets the plugin skip PVs whose id it cannot"
        " find). Reported as advice, never as a MUST.",
    ),
    Rule(
        "cmi.secret-value-format",
        MUST,
        (CO,),
        f"{TITLE} §Secrets Requirements",
        "A Secrets map value is not a valid (UTF-8) string.",
        reject_code=None,
        note='§Secrets Requirements: "Each value MUST contain a valid string"; binary data'
        " is to be carried in a binary-to-text encoding such as base64. The proto types the"
        " values as bytes, so a raw binary value reaches the wire; it is read as UTF-8 like a"
        " proto3 string. Reported only: the client passes Kubernetes Secret data through"
        " unchanged, and the plugin may accept it.",
    ),
    Rule(
        "cmi.create-not-idempotent",
        MUST,
        (PLUGIN,),
        f"{TITLE} §CreateMachine",
        "A repeated CreateMachine with the same MachineName and ProviderSpec returns another"
        " ProviderID or NodeName.",
        reject_code=None,
        note='§CreateMachine: "This operation MUST be idempotent"; an existing compatible'
        ' VM gets OK "with the corresponding CreateMachineResponse". Judged against the'
        " last successful create of that MachineName this proxy saw within the hour;"
        " Secrets (rotated) and LastKnownState (the plugin's own state, passed back) do not"
        " make another request. Forgotten once a DeleteMachine of the name is sent or"
        " GetMachineStatus answers NOT_FOUND (the VM is gone, a new one is legitimate);"
        " GetMachineStatus' answer replaces the ids remembered.",
    ),
    Rule(
        "cmi.volume-ids-changed",
        MUST,
        (PLUGIN,),
        f"{TITLE} §GetVolumeIDs",
        "An identical repeat of a successful GetVolumeIDs within 10 minutes answers other"
        " VolumeIDs.",
        reject_code=None,
        note='"This operation MUST be idempotent": the ids are read from the PV specs the'
        " request carries, so the same specs give the same ids. Compared as digests with the"
        " last answer to the same request; older answers are not compared (the plugin may"
        " have been upgraded).",
    ),
    Rule(
        "cmi.delete-not-idempotent",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DeleteMachine",
        "DeleteMachine is answered NOT_FOUND; a VM that does not exist MUST get 0 OK.",
        reject_code=None,
        note="§DeleteMachine: a VM that does not exist, or whose artifacts are gone, MUST get"
        " 0 OK; the NOT_FOUND row of its error table is empty. Judged on the answer alone:"
        " NOT_FOUND can only mean something is absent.",
    ),
    Rule(
        "cmi.capabilities-changed",
        MUST,
        (PLUGIN,),
        f"{TITLE} §GetPluginCapabilities",
        "GetPluginCapabilities answers another set of capabilities while GetPluginInfo's name"
        " and version stayed the same.",
        reject_code=None,
        note='"All CMI-Plugins of the same version [...] SHALL return the same set of'
        ' capabilities." A capabilities answer counts for a version only when GetPluginInfo'
        " answered that name and version both before and after it, so a plugin upgraded"
        " between two calls is never flagged; judged when the second GetPluginInfo answers.",
    ),
    Rule(
        "cmi.size-limit-echoed",
        MUST,
        (PLUGIN,),
        f"{TITLE} §Size Limits",
        "A ProviderID the plugin makes is over 128 bytes where the CMI-Client passes it back.",
        reject_code=None,
        note="Judged in every request that carries it, wherever it was made (another"
        " replica, before the proxy started); blamed on the plugin, which made it, and"
        " never rejected, since the CMI-Client only passes it back.",
    ),
    *generic_rules(
        "cmi",
        TITLE,
        "CMI-Client",
        "CMI adds OUT_OF_RANGE for CreateMachine (the ProviderSpec asked for resources"
        " outside the valid range a moment ago valid); not ALREADY_EXISTS, as a VM can be"
        " changed at the provider. GetMachineStatus (a read that MUST be idempotent too)"
        " is judged when it answers INVALID_ARGUMENT or UNIMPLEMENTED to a request identical"
        " to one it"
        " answered OK within 10 minutes.",
        backoff=False,  # §Error Scheme: "after configured back off", any strategy
    ),
)

# §Error Scheme recovery: "Caller MUST fix the request by adding the missing required field"
# / "MUST either replace the field ... or remove" (INVALID_ARGUMENT), "Caller MUST NOT
# retry" (UNIMPLEMENTED). The per-RPC tables agree (no automatic retry) and carry no MUST.
FIX_FIRST = {
    "INVALID_ARGUMENT": FixFirst("MUST fix or remove the invalid field before retrying"),
    "UNIMPLEMENTED": FixFirst("MUST NOT retry", must_change=()),
}

# §CreateMachine errors: the client MUST follow the recovery rows; ALREADY_EXISTS asks for
# another machine name, OUT_OF_RANGE for other resource requests (in the ProviderSpec).
FIX_FIRST_RPC: dict[str, dict[str, FixFirst | None]] = {
    "CreateMachine": {
        # A ProviderSpec made to match the existing VM may be a fix too: only identical
        # re-sends are judged.
        "ALREADY_EXISTS": FixFirst("MUST create the machine under another name"),
        "OUT_OF_RANGE": FixFirst(
            "MUST update the resource requests before retrying", must_change=("ProviderSpec",)
        ),
    },
}

# "This operation MUST be idempotent" (CreateMachine, DeleteMachine, ShutDownMachine).
_REQUEST = frozenset({"INVALID_ARGUMENT", "UNIMPLEMENTED"})
STATE_CHANGES = {
    "CreateMachine": StateChange(_REQUEST | {"OUT_OF_RANGE"}),
    "DeleteMachine": StateChange(_REQUEST),
    "ShutDownMachine": StateChange(_REQUEST),
}

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


# -- family K: machines and capabilities ------------------------------------------------------

VOLUME_IDS_TTL = 600.0  # GetVolumeIDs answers compared this long (a plugin may be upgraded)
_PENDING_MAX = 8  # distinct capability answers kept between two GetPluginInfo answers


@dataclass(slots=True)
class _Machine:
    spec: bytes  # digest of the ProviderSpec
    provider_id: bytes  # digests: the ids are compared, never kept or quoted
    node_name: bytes
    when: float
    by: str  # the RPC that answered these ids


@dataclass(slots=True)
class _Pinned:
    capabilities: frozenset[str]
    when: float


class MachineMemory:
    """What this proxy saw of machines and of the plugin's identity, bounded and expiring."""

    def __init__(self, st: SpecState) -> None:
        # MachineName -> the VM ids last answered for it (CreateMachine, GetMachineStatus)
        self.machines: ExpiringMap[str, _Machine] = ExpiringMap(
            st.max_volumes, st.lifecycle_ttl, st.clock
        )
        # GetVolumeIDs request digest -> (digest of its VolumeIDs answer, when)
        self.volume_ids: ExpiringMap[bytes, tuple[bytes, float]] = ExpiringMap(
            st.max_volumes, VOLUME_IDS_TTL, st.clock
        )
        # GetMachineStatus request digest -> when an identical request was last answered OK
        self.statuses: ExpiringMap[bytes, float] = ExpiringMap(
            st.max_volumes, VOLUME_IDS_TTL, st.clock
        )
        # the last GetPluginInfo answer: (digest of name and version, when)
        self.info: tuple[bytes, float] | None = None
        # capability answers since that GetPluginInfo answer, not yet confirmed by the next
        self.pending: list[tuple[frozenset[str], float]] = []
        # name and version digest -> the capabilities answered while at that version
        self.pinned: ExpiringMap[bytes, _Pinned] = ExpiringMap(16, st.lifecycle_ttl, st.clock)
        self.ttl = st.lifecycle_ttl


def _machine_ids(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if not req.MachineName or not resp.ProviderID:
        return
    mem = st.part(MachineMemory)
    now = st.clock()
    spec = parts_digest(req.ProviderSpec)
    provider_id, node_name = (
        parts_digest(resp.ProviderID.encode()),
        parts_digest(resp.NodeName.encode()),
    )
    prev = mem.machines.get(req.MachineName)
    if call.method.name == "CreateMachine" and prev is not None and prev.spec == spec:
        differ = [
            name
            for name, now_id, before in (
                ("ProviderID", provider_id, prev.provider_id),
                ("NodeName", node_name, prev.node_name),
            )
            if now_id != before
        ]
        if differ:
            yield Violation(
                cs.rule("create-not-idempotent"),
                differ[0],
                f"CreateMachine repeated with the same MachineName and ProviderSpec returned"
                f" another {' and '.join(differ)} than {prev.by} answered"
                f" {ago(now - prev.when)}",
            )
    if call.method.name == "GetMachineStatus" and prev is not None:
        spec = prev.spec  # a status names the VM; the ProviderSpec of its create still holds
    mem.machines[req.MachineName] = _Machine(spec, provider_id, node_name, now, call.method.name)


def _volume_ids(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    mem = st.part(MachineMemory)
    key = message_digest(req)
    answer = parts_digest(*(v.encode() for v in resp.VolumeIDs))
    now = st.clock()
    prev = mem.volume_ids.get(key)
    if prev is not None and prev[0] != answer:
        yield Violation(
            cs.rule("volume-ids-changed"),
            "VolumeIDs",
            f"GetVolumeIDs repeated with the same PVSpecList answered other VolumeIDs"
            f" ({len(resp.VolumeIDs)} entries) than it did {ago(now - prev[1])}",
        )
    mem.volume_ids[key] = (answer, now)


def _forget_machine(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    # Once a delete is on its way, a later create of the name may make a new VM.
    if req.MachineName:
        st.part(MachineMemory).machines.pop(req.MachineName, None)
    return ()


def _status_answered(st: SpecState, call: Call, req: Any, resp: Any) -> None:
    st.part(MachineMemory).statuses[message_digest(req)] = st.clock()


def _status_error(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    mem = st.part(MachineMemory)
    if code == "NOT_FOUND" and req.MachineName:  # the VM is gone: a new one is legitimate
        mem.machines.pop(req.MachineName, None)
    if code not in ("INVALID_ARGUMENT", "UNIMPLEMENTED"):
        return
    # An identical request answered OK a moment ago was no invalid request, and the RPC was
    # implemented: a read that MUST be idempotent does not turn either around. Other codes
    # may say the VM changed.
    when = mem.statuses.get(message_digest(req))
    if when is not None:
        yield Violation(
            cs.rule("not-idempotent"),
            "",
            f"GetMachineStatus answered {code} to a request identical to one it"
            f" answered OK {ago(st.clock() - when)}",
            party=PLUGIN,
        )


def _delete_error(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    if code == "NOT_FOUND":
        yield Violation(
            cs.rule("delete-not-idempotent"),
            "",
            "DeleteMachine answered NOT_FOUND; a VM that does not exist (anymore) MUST get 0 OK",
            party=PLUGIN,
        )


def _secret_values(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    secrets = req.Secrets
    if not secrets:
        return
    bad = 0
    for value in secrets.values():
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
    if bad:
        yield Violation(
            cs.rule("secret-value-format"),
            "Secrets",
            f"Secrets: {bad} of {len(secrets)} values are not valid UTF-8 strings (binary"
            " data is to be sent in a binary-to-text encoding such as base64)",
        )


def _plugin_info(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    mem = st.part(MachineMemory)
    now = st.clock()
    key = parts_digest(resp.name.encode(), resp.version.encode())
    pending, mem.pending = mem.pending, []
    last, mem.info = mem.info, (key, now)
    if last is None or last[0] != key or now - last[1] > mem.ttl:
        return  # first answer, another version, or too long ago: nothing to compare yet
    # Every pending answer came between two answers of this name and version.
    for caps, when in pending:
        pinned = mem.pinned.get(key)
        if pinned is None:
            mem.pinned[key] = _Pinned(caps, when)
            continue
        if caps != pinned.capabilities:
            added = sorted(caps - pinned.capabilities)
            lacks = sorted(pinned.capabilities - caps)
            change = "; ".join(
                part
                for part in (
                    f"adds {', '.join(added)}" if added else "",
                    f"lacks {', '.join(lacks)}" if lacks else "",
                )
                if part
            )
            yield Violation(
                cs.rule("capabilities-changed"),
                "capabilities",
                f"GetPluginCapabilities answered {ago(now - when)} another set than"
                f" {ago(now - pinned.when)} ({change}) while GetPluginInfo's name and version"
                " stayed the same",
            )
        mem.pinned[key] = _Pinned(caps, when)  # compare the next answer with the latest


def _plugin_capabilities(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    mem = st.part(MachineMemory)
    if mem.info is None:
        return ()
    caps = capability_names(resp)
    if all(caps != c for c, _ in mem.pending) and len(mem.pending) < _PENDING_MAX:
        mem.pending.append((caps, st.clock()))
    return ()


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
    required_caveat={
        "ListMachinesResponse": ("MachineList",),
        "GetVolumeIDsResponse": ("VolumeIDs",),
    },
    response_checks={
        "GetPluginCapabilities": (_required_capabilities, _plugin_capabilities),
        "GetPluginInfo": (_plugin_info,),
        "CreateMachine": (_machine_ids,),
        "GetMachineStatus": (_machine_ids,),
        "GetVolumeIDs": (_volume_ids,),
    },
    request_checks={
        "CreateMachine": (_secret_values,),
        "DeleteMachine": (_forget_machine, _secret_values),
        "GetMachineStatus": (_secret_values,),
        "ShutDownMachine": (_secret_values,),
        "ListMachines": (_secret_values,),
    },
    on_error={"GetMachineStatus": (_status_error,), "DeleteMachine": (_delete_error,)},
    on_success={"GetMachineStatus": (_status_answered,)},
    fix_first=FIX_FIRST,
    fix_first_rpc=FIX_FIRST_RPC,
    state_changes=STATE_CHANGES,
)
