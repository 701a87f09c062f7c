"""CMI v1: a planted breach of every covered statement, each with its legitimate twin."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.cosi_cmi_builders import STATUS_DETAILS, Builders, without
from tests.integration.planted.harness import Case, Step

SPEC = "cmi.v1"
INFO = {"name": "cmi.example.com", "version": "1.0.0"}
SPEC_BYTES = b'{"machineType": "m5.large"}'
MACHINE = {"MachineName": "machine-1", "ProviderSpec": SPEC_BYTES}
CREATED = {"ProviderID": "aws:///eu-west-1/i-0001", "NodeName": "node-1"}
STATUS_REQ = {**MACHINE, "ProviderID": CREATED["ProviderID"]}
LIST_REQ = {"ProviderSpec": SPEC_BYTES}
LISTED = {"MachineList": {CREATED["ProviderID"]: "machine-1"}}
PV_REQ = {"PVSpecList": b'[{"awsElasticBlockStore": {"volumeID": "vol-1"}}]'}
PV_IDS = {"VolumeIDs": ["vol-1"]}


def caps(*rpcs: str) -> dict[str, Any]:
    return {"capabilities": [{"rpc": {"type": r}} for r in rpcs]}


BASE = ("CREATE_MACHINE", "DELETE_MACHINE")
ALL = caps(*BASE, "GET_MACHINE_STATUS", "LIST_MACHINES", "SHUTDOWN_MACHINE", "GET_VOLUME_IDS")
BG = {"GetPluginCapabilities": ALL}


_BUILDERS = Builders(SPEC, BG)
one, retry = _BUILDERS.one, _BUILDERS.retry


def unimplemented(statements: tuple[str, ...], rpc: str, request: Any, answer: Any) -> Case:
    return one(
        statements,
        "cmi.unimplemented-advertised",
        rpc,
        (request, ("UNIMPLEMENTED", "not supported")),
        (request, answer),
        party="plugin",
    )


def empty_message(statements: tuple[str, ...], rpc: str, request: Any) -> Case:
    return one(
        statements,
        "cmi.error-message-empty",
        rpc,
        (request, ("INTERNAL", "")),
        (request, ("INTERNAL", "provider API timed out")),
        party="plugin",
    )


def missing(statements: tuple[str, ...], rpc: str, request: Any, field: str, answer: Any) -> Case:
    """A request without its REQUIRED ``field`` (refused INVALID_ARGUMENT); the twin whole."""
    return one(
        statements,
        "cmi.required-field",
        rpc,
        (without(request, field), ("INVALID_ARGUMENT", f"{field} missing")),
        (request, answer),
        party="co",
    )


def accepted(statements: tuple[str, ...], rpc: str, request: Any, field: str, answer: Any) -> Case:
    """A request without its REQUIRED ``field`` answered OK instead of INVALID_ARGUMENT; the
    twin is the whole request answered OK."""
    return one(
        statements,
        "cmi.bad-request-accepted",
        rpc,
        (without(request, field), answer),
        (request, answer),
        party="plugin",
    )


BAD_SPEC = {**MACHINE, "ProviderSpec": b'{"machineType": "m5.largr"}'}

CASES = [
    # -- implemented RPCs ------------------------------------------------------------------
    unimplemented(
        ("Machine-Lifecycle.1", "CreateMachine.1", "Connectivity.3"),
        "CreateMachine",
        MACHINE,
        CREATED,
    ),
    unimplemented(("DeleteMachine.1",), "DeleteMachine", STATUS_REQ, {}),
    unimplemented(("RPC-Interface.1", "GetPluginInfo.1"), "GetPluginInfo", {}, INFO),
    unimplemented(("GetPluginCapabilities.1",), "GetPluginCapabilities", {}, ALL),
    unimplemented(("Probe.1",), "Probe", {}, {"ready": {"value": True}}),
    unimplemented(("GetMachineStatus.1",), "GetMachineStatus", STATUS_REQ, CREATED),
    unimplemented(("ShutDownMachine.1",), "ShutDownMachine", STATUS_REQ, {}),
    unimplemented(("ListMachines.1",), "ListMachines", LIST_REQ, LISTED),
    unimplemented(("GetVolumeIDs.1",), "GetVolumeIDs", PV_REQ, PV_IDS),
    Case(
        SPEC,
        ("Connectivity.6",),
        "cmi.unimplemented-advertised",
        breach=(
            Step("CreateMachine", MACHINE, answer=CREATED),
            Step("Probe", error=("UNIMPLEMENTED", "identity served elsewhere")),
        ),
        twin=(
            Step("CreateMachine", MACHINE, answer=CREATED),
            Step("Probe", answer={"ready": {"value": True}}),
        ),
        background=BG,
        party="plugin",
        why="the endpoint serves the Machine service but not the Identity one",
    ),
    # -- capabilities ----------------------------------------------------------------------
    one(
        ("GetPluginCapabilities.3",),
        "cmi.required-capability-missing",
        "GetPluginCapabilities",
        ({}, caps("DELETE_MACHINE")),
        ({}, caps(*BASE)),
        party="plugin",
        background={"GetPluginCapabilities": caps(*BASE)},
    ),
    one(
        ("GetPluginCapabilities.4",),
        "cmi.required-capability-missing",
        "GetPluginCapabilities",
        ({}, caps("CREATE_MACHINE")),
        ({}, caps(*BASE)),
        party="plugin",
        background={"GetPluginCapabilities": caps(*BASE)},
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.2",),
        "cmi.capabilities-changed",
        breach=(
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=ALL),
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=caps(*BASE)),
            Step("GetPluginInfo", answer=INFO),
        ),
        twin=(
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=ALL),
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=ALL),
            Step("GetPluginInfo", answer=INFO),
        ),
        background=BG,
        party="plugin",
        why="the same name and version answered two sets of capabilities",
    ),
    # -- identity fields -------------------------------------------------------------------
    one(
        ("GetPluginInfo.2",),
        "cmi.plugin-name-format",
        "GetPluginInfo",
        ({}, {**INFO, "name": "cmi.example.com/provider"}),
        ({}, INFO),
        party="plugin",
        why="a '/' is no part of a domain name",
    ),
    one(
        ("GetPluginInfo.4",),
        "cmi.plugin-name-format",
        "GetPluginInfo",
        ({}, {**INFO, "name": "a" * 60 + ".example.com"}),
        ({}, {**INFO, "name": "a" * 50 + ".example.com"}),
        party="plugin",
        why="72 characters, more than 63",
    ),
    one(
        ("GetPluginInfo.5",),
        "cmi.required-field",
        "GetPluginInfo",
        ({}, without(INFO, "name")),
        ({}, INFO),
        party="plugin",
    ),
    one(
        ("GetPluginInfo.6",),
        "cmi.required-field",
        "GetPluginInfo",
        ({}, without(INFO, "version")),
        ({}, INFO),
        party="plugin",
    ),
    # -- machine fields --------------------------------------------------------------------
    missing(("CreateMachine.5",), "CreateMachine", MACHINE, "MachineName", CREATED),
    missing(("CreateMachine.6",), "CreateMachine", MACHINE, "ProviderSpec", CREATED),
    one(
        ("CreateMachine.7",),
        "cmi.required-field",
        "CreateMachine",
        (MACHINE, without(CREATED, "ProviderID")),
        (MACHINE, CREATED),
        party="plugin",
    ),
    one(
        ("CreateMachine.8", "REQUIRED-vs-OPTIONAL.1"),
        "cmi.required-field",
        "CreateMachine",
        (MACHINE, without(CREATED, "NodeName")),
        (MACHINE, CREATED),
        party="plugin",
    ),
    missing(("DeleteMachine.5",), "DeleteMachine", STATUS_REQ, "MachineName", {}),
    missing(("DeleteMachine.6",), "DeleteMachine", STATUS_REQ, "ProviderSpec", {}),
    missing(("GetMachineStatus.4",), "GetMachineStatus", STATUS_REQ, "MachineName", CREATED),
    missing(("GetMachineStatus.5",), "GetMachineStatus", STATUS_REQ, "ProviderSpec", CREATED),
    one(
        ("GetMachineStatus.6",),
        "cmi.required-field",
        "GetMachineStatus",
        (STATUS_REQ, without(CREATED, "ProviderID")),
        (STATUS_REQ, CREATED),
        party="plugin",
    ),
    one(
        ("GetMachineStatus.7",),
        "cmi.required-field",
        "GetMachineStatus",
        (STATUS_REQ, without(CREATED, "NodeName")),
        (STATUS_REQ, CREATED),
        party="plugin",
    ),
    missing(("ShutDownMachine.5",), "ShutDownMachine", STATUS_REQ, "MachineName", {}),
    missing(("ShutDownMachine.6",), "ShutDownMachine", STATUS_REQ, "ProviderSpec", {}),
    missing(("ListMachines.3",), "ListMachines", LIST_REQ, "ProviderSpec", LISTED),
    missing(("GetVolumeIDs.4",), "GetVolumeIDs", PV_REQ, "PVSpecList", PV_IDS),
    one(
        ("ListMachines.4", "REQUIRED-vs-OPTIONAL.2"),
        "cmi.required-field-caveat",
        "ListMachines",
        (LIST_REQ, {}),
        (LIST_REQ, LISTED),
        party="plugin",
        why="an empty REQUIRED listing (reported as advice)",
    ),
    one(
        ("GetVolumeIDs.5",),
        "cmi.required-field-caveat",
        "GetVolumeIDs",
        (PV_REQ, {}),
        (PV_REQ, PV_IDS),
        party="plugin",
        why="an empty REQUIRED listing (reported as advice)",
    ),
    one(
        ("Size-Limits.1",),
        "cmi.size-limit",
        "CreateMachine",
        ({**MACHINE, "MachineName": "m" * 129}, ("INVALID_ARGUMENT", "name too long")),
        ({**MACHINE, "MachineName": "m" * 128}, CREATED),
        party="co",
        why="a 129-byte string",
    ),
    one(
        ("Size-Limits.1",),
        "cmi.size-limit-echoed",
        "DeleteMachine",
        ({**STATUS_REQ, "ProviderID": "p" * 129}, {}),
        ({**STATUS_REQ, "ProviderID": "p" * 128}, {}),
        party="plugin",
        why="a 129-byte ProviderID the plugin made before this proxy saw it, passed back",
    ),
    one(
        ("Secrets-Requirements.1",),
        "cmi.secret-key-format",
        "CreateMachine",
        ({**MACHINE, "Secrets": {"access key": b"AKIA0001"}}, CREATED),
        ({**MACHINE, "Secrets": {"accessKeyID": b"AKIA0001"}}, CREATED),
        party="co",
        why="a space in a Secrets key",
    ),
    one(
        ("Secrets-Requirements.2",),
        "cmi.secret-value-format",
        "CreateMachine",
        ({**MACHINE, "Secrets": {"userData": b"\xff\xfe\xfd"}}, CREATED),
        ({**MACHINE, "Secrets": {"userData": b"//79"}}, CREATED),
        party="co",
        why="a Secrets value of bytes that are not UTF-8, not base64 text",
    ),
    one(
        ("Connectivity.2",),
        "cmi.malformed-message",
        "GetPluginInfo",
        ({}, b"\x0a\x40cmi"),
        ({}, INFO),
        party="plugin",
        why="a truncated protobuf message",
    ),
    # -- idempotency -----------------------------------------------------------------------
    Case(
        SPEC,
        ("CreateMachine.2", "CreateMachine.4"),
        "cmi.create-not-idempotent",
        breach=(
            Step("CreateMachine", MACHINE, answer=CREATED),
            Step(
                "CreateMachine",
                MACHINE,
                answer={**CREATED, "ProviderID": "aws:///eu-west-1/i-0002"},
            ),
        ),
        twin=(
            Step("CreateMachine", MACHINE, answer=CREATED),
            Step("CreateMachine", MACHINE, answer=CREATED),
        ),
        background=BG,
        party="plugin",
        why="the same MachineName and ProviderSpec answered with another VM",
    ),
    one(
        ("DeleteMachine.2", "DeleteMachine.4"),
        "cmi.delete-not-idempotent",
        "DeleteMachine",
        (STATUS_REQ, ("NOT_FOUND", "no such VM")),
        (STATUS_REQ, {}),
        party="plugin",
        why="a VM that does not exist answered NOT_FOUND instead of OK",
    ),
    Case(
        SPEC,
        ("ShutDownMachine.2", "ShutDownMachine.4"),
        "cmi.not-idempotent",
        breach=(
            Step("ShutDownMachine", STATUS_REQ),
            Step("ShutDownMachine", STATUS_REQ, error=("INVALID_ARGUMENT", "already stopped")),
        ),
        twin=(Step("ShutDownMachine", STATUS_REQ), Step("ShutDownMachine", STATUS_REQ)),
        background=BG,
        party="plugin",
        why="a VM shut down a moment ago refused a repeat of the same shut-down",
    ),
    Case(
        SPEC,
        ("GetMachineStatus.3",),
        "cmi.not-idempotent",
        breach=(
            Step("GetMachineStatus", STATUS_REQ, answer=CREATED),
            Step("GetMachineStatus", STATUS_REQ, error=("INVALID_ARGUMENT", "bad request")),
        ),
        why="an identical request answered OK, then refused as invalid",
        twin=(
            Step("GetMachineStatus", STATUS_REQ, answer=CREATED),
            Step("GetMachineStatus", STATUS_REQ, error=("UNAVAILABLE", "provider API down")),
        ),
        background=BG,
        party="plugin",
    ),
    # -- error scheme ----------------------------------------------------------------------
    one(
        ("Error-Scheme.1", "Error-Scheme.2"),
        "cmi.status-code-not-canonical",
        "Probe",
        ({}, ("42", "not ready")),
        ({}, ("FAILED_PRECONDITION", "not ready")),
        party="plugin",
        why="a grpc-status of 42 is none of gRPC's codes",
    ),
    Case(
        SPEC,
        ("Error-Scheme.14",),
        "cmi.status-details-nonempty",
        breach=(
            Step(
                "DeleteMachine",
                STATUS_REQ,
                error=("INTERNAL", "provider failure"),
                trailers=(("grpc-status-details-bin", STATUS_DETAILS),),
            ),
        ),
        twin=(Step("DeleteMachine", STATUS_REQ, error=("INTERNAL", "provider failure")),),
        background=BG,
        party="plugin",
    ),
    empty_message(("CreateMachine-Errors.4",), "CreateMachine", MACHINE),
    empty_message(("DeleteMachine-Errors.3",), "DeleteMachine", STATUS_REQ),
    empty_message(("GetMachineStatus-Errors.3",), "GetMachineStatus", STATUS_REQ),
    empty_message(("ShutDownMachine-Errors.3",), "ShutDownMachine", STATUS_REQ),
    empty_message(("ListMachines-Errors.4",), "ListMachines", LIST_REQ),
    empty_message(("GetVolumeIDs-Errors.1",), "GetVolumeIDs", PV_REQ),
    accepted(("CreateMachine-Errors.2",), "CreateMachine", MACHINE, "ProviderSpec", CREATED),
    accepted(("DeleteMachine-Errors.2",), "DeleteMachine", STATUS_REQ, "MachineName", {}),
    accepted(("ShutDownMachine-Errors.2",), "ShutDownMachine", STATUS_REQ, "MachineName", {}),
    accepted(("ListMachines-Errors.2",), "ListMachines", LIST_REQ, "ProviderSpec", LISTED),
    retry(
        ("Error-Scheme.6",),
        "CreateMachine",
        without(MACHINE, "ProviderSpec"),
        "INVALID_ARGUMENT",
        MACHINE,
        CREATED,
        first=BAD_SPEC,
        why="a request missing its REQUIRED ProviderSpec, refused, sent again as it was",
    ),
    retry(
        ("Error-Scheme.7", "CreateMachine-Errors.3"),
        "CreateMachine",
        BAD_SPEC,
        "INVALID_ARGUMENT",
        MACHINE,
        CREATED,
    ),
    retry(
        ("CreateMachine-Errors.3",),
        "CreateMachine",
        MACHINE,
        "ALREADY_EXISTS",
        {**MACHINE, "MachineName": "machine-2"},
        CREATED,
        why="refused for a VM of that name with another ProviderSpec, sent again unchanged",
        variant="already-exists",
    ),
    retry(
        ("CreateMachine-Errors.3",),
        "CreateMachine",
        {**MACHINE, "ProviderSpec": b'{"machineType": "m5.large", "cpus": 4096}'},
        "OUT_OF_RANGE",
        MACHINE,
        CREATED,
        why="refused for resource requests out of range, sent again unchanged",
        variant="out-of-range",
    ),
    retry(
        ("ListMachines-Errors.3",),
        "ListMachines",
        {"ProviderSpec": b'{"region": "eu-west-9"}'},
        "INVALID_ARGUMENT",
        LIST_REQ,
        LISTED,
    ),
    Case(
        SPEC,
        ("Error-Scheme.10",),
        "cmi.retry-while-pending",
        breach=(
            Step("CreateMachine", MACHINE, answer=CREATED, hold=0.6, pending=True),
            Step("CreateMachine", MACHINE, error=("ABORTED", "pending"), pending=True),
            Step("CreateMachine", MACHINE, answer=CREATED, hold=0.6, pending=True),
            Step("CreateMachine", MACHINE, answer=CREATED, wait=0.7),
        ),
        twin=(
            Step("CreateMachine", MACHINE, answer=CREATED, hold=0.2, pending=True),
            Step("CreateMachine", MACHINE, error=("ABORTED", "pending"), pending=True),
            Step("CreateMachine", MACHINE, answer=CREATED, wait=0.7),
        ),
        background=BG,
        party="co",
        why="retried after ABORTED while the call it collided with was still pending",
    ),
]

# -- variants: the same statements breached another way ------------------------------------
OTHER_VM = {**CREATED, "ProviderID": "aws:///eu-west-1/i-0002"}
ROTATED = {**MACHINE, "Secrets": {"accessKeyID": b"AKIA0002"}}
E_ACUTE = "\u00e9"

CASES += [
    Case(
        SPEC,
        ("CreateMachine.4",),
        "cmi.not-idempotent",
        breach=(
            Step("CreateMachine", MACHINE, answer=CREATED),
            Step("CreateMachine", MACHINE, error=("INVALID_ARGUMENT", "bad ProviderSpec")),
        ),
        twin=(
            Step("CreateMachine", MACHINE, answer=CREATED),
            Step("CreateMachine", MACHINE, answer=CREATED),
        ),
        background=BG,
        party="plugin",
        why="a create answered OK, then the identical request refused as invalid",
        variant="refused-repeat",
    ),
    Case(
        SPEC,
        ("DeleteMachine.4",),
        "cmi.not-idempotent",
        breach=(
            Step("DeleteMachine", STATUS_REQ),
            Step("DeleteMachine", STATUS_REQ, error=("INVALID_ARGUMENT", "no such machine")),
        ),
        twin=(Step("DeleteMachine", STATUS_REQ), Step("DeleteMachine", STATUS_REQ)),
        background=BG,
        party="plugin",
        why="a delete answered OK, then the identical request refused as invalid",
        variant="refused-repeat",
    ),
    Case(
        SPEC,
        ("CreateMachine.2", "CreateMachine.4"),
        "cmi.create-not-idempotent",
        breach=(
            Step("CreateMachine", MACHINE, answer=CREATED),
            Step("CreateMachine", MACHINE, answer={**CREATED, "NodeName": "node-2"}),
        ),
        twin=(
            Step("CreateMachine", MACHINE, answer=CREATED),
            Step("CreateMachine", MACHINE, answer=CREATED),
        ),
        background=BG,
        party="plugin",
        why="the same MachineName and ProviderSpec answered with the same VM under another"
        " NodeName",
        variant="node-name",
    ),
    Case(
        SPEC,
        ("CreateMachine.2", "CreateMachine.4"),
        "cmi.create-not-idempotent",
        breach=(
            Step(
                "CreateMachine",
                {**MACHINE, "Secrets": {"accessKeyID": b"AKIA0001"}},
                answer=CREATED,
            ),
            Step("CreateMachine", ROTATED, answer=OTHER_VM, new_connection=True),
        ),
        twin=(
            Step(
                "CreateMachine",
                {**MACHINE, "Secrets": {"accessKeyID": b"AKIA0001"}},
                answer=CREATED,
            ),
            Step("CreateMachine", ROTATED, answer=CREATED, new_connection=True),
        ),
        background=BG,
        party="plugin",
        why="a retry with rotated Secrets, over a connection of its own, answered another VM;"
        " rotated Secrets make no other request",
        variant="secrets-rotated",
    ),
    Case(
        SPEC,
        ("CreateMachine.2", "CreateMachine.4"),
        "cmi.create-not-idempotent",
        breach=(
            Step("CreateMachine", MACHINE, answer=CREATED, hold=0.3, pending=True),
            Step("CreateMachine", MACHINE, answer=OTHER_VM),
        ),
        twin=(
            Step("CreateMachine", MACHINE, answer=CREATED, hold=0.3, pending=True),
            Step("CreateMachine", MACHINE, answer=CREATED),
        ),
        background=BG,
        party="plugin",
        why="two concurrent identical creates answered with two VMs",
        variant="concurrent",
    ),
    one(
        ("Size-Limits.1",),
        "cmi.size-limit",
        "CreateMachine",
        (MACHINE, {**CREATED, "ProviderID": "aws:///" + "p" * 122}),
        (MACHINE, {**CREATED, "ProviderID": "aws:///" + "p" * 121}),
        party="plugin",
        why="the plugin's ProviderID of 129 bytes",
        variant="plugin",
    ),
    one(
        ("Size-Limits.1",),
        "cmi.size-limit",
        "DeleteMachine",
        ({**STATUS_REQ, "MachineName": E_ACUTE * 65}, ("INVALID_ARGUMENT", "name too long")),
        ({**STATUS_REQ, "MachineName": E_ACUTE * 64}, {}),
        party="co",
        why="65 characters of two UTF-8 bytes each: 130 bytes",
        variant="utf8-bytes",
    ),
    one(
        ("Size-Limits.1",),
        "cmi.size-limit",
        "GetPluginInfo",
        ({}, {**INFO, "manifest": {f"k{i:02d}": "v" * 100 for i in range(40)}}),
        ({}, {**INFO, "manifest": {f"k{i:02d}": "v" * 100 for i in range(39)}}),
        party="plugin",
        why="a map<string, string> of 4120 bytes, more than 4 KiB",
        variant="string-map",
    ),
    Case(
        SPEC,
        ("Error-Scheme.10",),
        "cmi.retry-while-pending",
        breach=(
            Step("DeleteMachine", STATUS_REQ, hold=0.6, pending=True),
            Step("ShutDownMachine", STATUS_REQ, error=("ABORTED", "pending"), pending=True),
            Step("DeleteMachine", STATUS_REQ, hold=0.6, pending=True),
            Step("ShutDownMachine", STATUS_REQ, wait=0.7),
        ),
        twin=(
            Step("DeleteMachine", STATUS_REQ, hold=0.2, pending=True),
            Step("ShutDownMachine", STATUS_REQ, error=("ABORTED", "pending"), pending=True),
            Step("ShutDownMachine", STATUS_REQ, wait=0.7),
        ),
        background=BG,
        party="co",
        why="a shut-down refused ABORTED retried while a delete of the same machine is in flight",
        variant="other-rpc",
    ),
    one(
        ("GetPluginInfo.2",),
        "cmi.plugin-name-format",
        "GetPluginInfo",
        ({}, {**INFO, "name": "cmi..example.com"}),
        ({}, INFO),
        party="plugin",
        why="an empty label between two dots",
        variant="empty-label",
    ),
    one(
        ("GetPluginInfo.2",),
        "cmi.plugin-name-format",
        "GetPluginInfo",
        ({}, {**INFO, "name": "cmi_provider.example.com"}),
        ({}, {**INFO, "name": "cmi-provider.example.com"}),
        party="plugin",
        why="an underscore is no letter, digit or hyphen of a domain label",
        variant="underscore",
    ),
    one(
        ("Secrets-Requirements.1",),
        "cmi.secret-key-format",
        "DeleteMachine",
        ({**STATUS_REQ, "Secrets": {"aws/accessKeyID": b"AKIA0001"}}, {}),
        ({**STATUS_REQ, "Secrets": {"aws.accessKeyID": b"AKIA0001"}}, {}),
        party="co",
        why="a '/' in a Secrets key",
        variant="slash",
    ),
    one(
        ("Secrets-Requirements.2",),
        "cmi.secret-value-format",
        "ListMachines",
        ({**LIST_REQ, "Secrets": {"serviceAccountJSON": b"\x80{}"}}, LISTED),
        ({**LIST_REQ, "Secrets": {"serviceAccountJSON": b"{}"}}, LISTED),
        party="co",
        why="a Secrets value starting with a lone UTF-8 continuation byte",
        variant="list",
    ),
    Case(
        SPEC,
        ("GetPluginCapabilities.2",),
        "cmi.capabilities-changed",
        breach=(
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=caps(*BASE)),
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=ALL),
            Step("GetPluginInfo", answer=INFO),
        ),
        twin=(
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=caps(*BASE)),
            Step("GetPluginInfo", answer=INFO),
            Step("GetPluginCapabilities", answer=caps(*reversed(BASE))),
            Step("GetPluginInfo", answer=INFO),
        ),
        background=BG,
        party="plugin",
        why="the same name and version gained capabilities; the twin lists the same set in"
        " another order",
        variant="added",
    ),
    one(
        ("Error-Scheme.2",),
        "cmi.status-code-not-canonical",
        "DeleteMachine",
        (STATUS_REQ, ("17", "provider failure")),
        (STATUS_REQ, ("UNAUTHENTICATED", "provider credentials expired")),
        party="plugin",
        why="grpc-status 17, the first number past the canonical codes (the twin: 16)",
        variant="17",
    ),
    one(
        ("Connectivity.2",),
        "cmi.malformed-message",
        "CreateMachine",
        (b"\x0a\x40machine", CREATED),
        (MACHINE, CREATED),
        party="co",
        why="a truncated protobuf request",
        variant="request",
    ),
    one(
        ("DeleteMachine.2",),
        "cmi.delete-not-idempotent",
        "DeleteMachine",
        (STATUS_REQ, ("5", "VM already deleted")),
        (STATUS_REQ, {}),
        party="plugin",
        why="NOT_FOUND sent as the raw grpc-status 5",
        variant="raw-code",
    ),
]
