"""Rules and method-level checks shared by the CSI tables (csi.v1 and csi.v0).

Rule ids are the same for both versions (``--rule csi.size-limit=off`` covers both); each
version cites its own spec title in sections. csi.v0 names a few fields differently
(``Volume.id``, ``Snapshot.id``): the checks take those names as parameters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import HANDOVER, ExpiringMap, ago, message_digest
from plugproxy.rules.engine import (
    CO,
    MUST,
    PLUGIN,
    SHOULD,
    CompiledSpec,
    Hooks,
    Rule,
    Violation,
    list_length,
    malformed_message_rule,
)
from plugproxy.rules.state import added, removed

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.state import SpecState

BOTH = (CO, PLUGIN)

# Codes gRPC itself produces for any call (deadlines, cancellation, transport trouble,
# crashes, a message over the receiver's size limit: RESOURCE_EXHAUSTED); a plugin
# returning them is never judged against an RPC's error table.
TRANSPORT_CODES = frozenset(
    {"CANCELLED", "DEADLINE_EXCEEDED", "UNKNOWN", "INTERNAL", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}
)


# The topologies a CO sends mostly repeat what the plugin reported (NodeGetInfo, a volume's
# accessible_topology) or an administrator wrote (StorageClass allowedTopologies): the CO
# did not make them, so enforce mode does not reject them; both parties are reported.
# The arguments the ALREADY_EXISTS rows of CreateVolume and CreateSnapshot compare (CSI
# v1.12 and v0.3): a create of the same name keeping them all keeps an incompatibility, and
# one changing any of them names another object. Secrets are never among them.
CREATE_VOLUME_ARGUMENTS = (
    "capacity_range",
    "volume_capabilities",
    "parameters",
    "accessibility_requirements",
    "volume_content_source",
)
CREATE_SNAPSHOT_ARGUMENTS = ("source_volume_id", "parameters")

ECHOED_TOPOLOGY = (
    "Reported, never enforced: a CO's topologies usually repeat the plugin's own or an"
    " administrator's."
)


def csi_rules(title: str, v1: bool) -> tuple[Rule, ...]:
    """The csi.* rule catalogue, citing ``title`` (e.g. "CSI v1.12")."""
    topology_note = (
        "Judged in every Topology, in requests (the CO) and responses (the plugin). The key"
        " prefix is lower-case domain name notation."
        if v1
        else "Judged in every Topology, in requests (the CO) and responses (the plugin). CSI"
        " v0.3 allows the key prefix the characters of a key name (upper case and '_'), in"
        " reverse domain name notation: two or more labels joined by single dots."
    )
    rules = [
        Rule(
            "csi.required-field",
            MUST,
            BOTH,
            f"{title} §{{rpc}}",
            "A field the spec marks REQUIRED is missing (empty, absent, or no oneof member).",
            note="REQUIRED numbers and bools are skipped where proto3 cannot tell unset from a"
            " valid 0 or false; CSI v1's GetMetadata* volume_capacity_bytes and a VolumeUsage's"
            " total in BYTES are judged, since no volume has 0 bytes (reported, never"
            " enforced).",
        ),
        Rule(
            "csi.size-limit",
            MUST,
            BOTH,
            f"{title} §Size Limits",
            "A string exceeds 128 bytes or a map<string,string> 4 KiB, unless the field's"
            " own description overrides the limit.",
            note="The limits apply to messages each party generates: an id, token or context"
            " the plugin made is judged where the plugin returns it, never where the CO"
            " passes it back.",
        ),
        Rule(
            "csi.plugin-name-format",
            MUST,
            (PLUGIN,),
            f"{title} §GetPluginInfo",
            "The plugin name is not 63 characters or less in domain name notation.",
        ),
        Rule(
            "csi.secret-key-format",
            MUST,
            (CO,),
            f"{title} §Secrets Requirements",
            "A secrets map key is not made of alphanumerics, '-', '_' and '.'.",
        ),
        Rule(
            "csi.negative-value",
            MUST,
            BOTH,
            f"{title} §{{rpc}}",
            "A size, capacity, count or usage field the spec says MUST NOT be negative is.",
        ),
        malformed_message_rule("csi", f"{title} §{{rpc}}", "INVALID_ARGUMENT"),
        Rule(
            "csi.error-message-empty",
            MUST,
            (PLUGIN,),
            f"{title} §Error Scheme",
            "A non-OK status carries an empty message.",
        ),
        Rule(
            "csi.status-details-nonempty",
            MUST,
            (PLUGIN,),
            f"{title} §Error Scheme",
            "A non-OK status carries a google.rpc.Status with details (grpc-status-details-bin).",
        ),
        Rule(
            "csi.unimplemented-advertised",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "The plugin answers UNIMPLEMENTED for an RPC it must implement: an Identity RPC,"
            " one whose capability it advertises, or one every plugin serving that RPC's"
            " service MUST implement while it serves it.",
            note=(
                "A service is served when the plugin advertises it (CONTROLLER_SERVICE,"
                " GROUP_CONTROLLER_SERVICE, SNAPSHOT_METADATA_SERVICE) or another of its RPCs"
                " answered OK in the last 5 minutes. Controller: ControllerGetCapabilities,"
                " ValidateVolumeCapabilities; Node: NodePublishVolume (§RPC Interface: the"
                " Node Plugin MUST implement the Node service; its own section sets no"
                " condition), NodeUnpublishVolume, NodeGetCapabilities, and NodeGetInfo while"
                " the controller advertises PUBLISH_UNPUBLISH_VOLUME; GroupController:"
                " GroupControllerGetCapabilities; SnapshotMetadata: GetMetadataAllocated and"
                " GetMetadataDelta (the spec's 'must' is lower case)."
                if v1
                else "A service is served when the plugin advertises it (CONTROLLER_SERVICE)"
                " or another of its RPCs answered OK in the last 5 minutes. Controller:"
                " ControllerGetCapabilities, ValidateVolumeCapabilities; Node:"
                " NodePublishVolume, NodeUnpublishVolume, NodeGetCapabilities, and both"
                " NodeGetId and NodeGetInfo (the v0.3 proto: 'Prior to CSI 1.0 - CSI plugins"
                " MUST implement both'; the text makes them conditional, the proto is followed)."
            ),
        ),
        Rule(
            "csi.error-code-unexpected",
            SHOULD,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "A status code neither in the RPC's error table nor a general one (advisory).",
        ),
        Rule(
            "csi.capability-not-advertised",
            SHOULD,
            (CO,),
            f"{title} §{{rpc}}",
            "The CO calls an RPC, or asks for a content source, gated by a capability the"
            " plugin did not advertise (advisory).",
            reject_code=None,
            note="The spec obliges the plugin to implement an advertised RPC but forbids the"
            " CO nothing; the plugin's own UNIMPLEMENTED is the answer. A content source"
            " without its capability is a SHOULD NOT (§CreateVolume errors).",
        ),
        Rule(
            "csi.topology-requirement-without-capability",
            MUST,
            (CO,),
            f"{title} §CreateVolume",
            "CreateVolume sets accessibility_requirements while the plugin does not advertise"
            " the accessibility constraints capability.",
        ),
        Rule(
            "csi.capacity-topology-without-capability",
            MUST,
            (CO,),
            f"{title} §GetCapacity",
            "GetCapacity sets accessible_topology while the plugin does not advertise the"
            " accessibility constraints capability.",
            note="The field SHALL NOT be set without the capability; enforced, like"
            " CreateVolume's accessibility_requirements, with the §Error Scheme answer for a"
            " field the plugin does not allow.",
        ),
        Rule(
            "csi.path-not-absolute",
            MUST,
            (CO,),
            f"{title} §{{rpc}}",
            "A node path (staging_target_path, target_path, volume_path) the spec says MUST"
            " be absolute is set but relative; an empty optional path is not judged.",
            reject_code=None,
            note="A Windows absolute path (drive letter or UNC) counts as absolute: kubelet"
            " on Windows nodes passes c:\\ paths. Reported, never enforced: no error row"
            " names a relative path, and conformance suites (csi-sanity) send one to a"
            " NodeGetVolumeStats of a missing volume and expect the plugin's NOT_FOUND.",
        ),
        Rule(
            "csi.topology-key-format",
            MUST,
            BOTH,
            f"{title} §CreateVolume",
            "A Topology key lacks its name segment, or its name or prefix is over 63"
            " characters or uses characters or ends the spec does not allow.",
            reject_code=None,
            note=topology_note + " " + ECHOED_TOPOLOGY,
        ),
        Rule(
            "csi.topology-key-duplicate",
            MUST,
            BOTH,
            f"{title} §CreateVolume",
            "A Topology holds two keys differing only in case (keys are case-insensitive).",
            reject_code=None,
            note=ECHOED_TOPOLOGY,
        ),
        Rule(
            "csi.topology-value-format",
            MUST,
            BOTH,
            f"{title} §CreateVolume",
            "A Topology value is empty, over 63 characters, or not alphanumeric at both ends"
            " with '-', '_', '.' or alphanumerics between.",
            reject_code=None,
            note=ECHOED_TOPOLOGY,
        ),
        Rule(
            "csi.topology-requirement-empty",
            MUST,
            (CO,),
            f"{title} §CreateVolume",
            "accessibility_requirements is set with neither requisite nor preferred topologies.",
        ),
        Rule(
            "csi.topology-preferred-not-requisite",
            MUST,
            (CO,),
            f"{title} §CreateVolume",
            "A preferred topology is missing from the requisite list while requisite is set"
            " (keys compared case-insensitively).",
        ),
        Rule(
            "csi.capacity-out-of-range",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "CreateVolume returns a capacity outside the requested capacity_range"
            + (", or an expansion one below its required_bytes." if v1 else "."),
            # Judged for the expansions by csi_responses.
            note='CapacityRange (§CreateVolume): "Volume MUST be at least this big" and'
            ' "MUST not be bigger" than limit_bytes. ControllerExpandVolume and'
            " NodeExpandVolume are judged against required_bytes only: a volume already larger"
            " than the target SHOULD be answered 0 OK, with its real capacity."
            if v1
            else "",
        ),
        Rule(
            "csi.content-source-not-echoed",
            SHOULD,
            (PLUGIN,),
            f"{title} §CreateVolume",
            "CreateVolume from a source answers without (or with another kind of) content_source.",
        ),
        Rule(
            "csi.topology-without-capability",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "accessible_topology is returned without the VOLUME_ACCESSIBILITY_CONSTRAINTS"
            " plugin capability.",
        ),
        Rule(
            "csi.list-max-entries",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "A list call returns more entries than max_entries.",
        ),
        Rule(
            "csi.snapshot-source-mismatch",
            MUST,
            (PLUGIN,),
            f"{title} §CreateSnapshot",
            "CreateSnapshot reports a source_volume_id other than the requested one.",
        ),
        Rule(
            "csi.call-order",
            MUST,
            (CO,),
            f"{title} §Volume Lifecycle",
            "A node or controller call breaks the order the spec requires, as seen by the proxy.",
            reject_code="FAILED_PRECONDITION",
            note="Enforced only for NodePublishVolume before NodeStageVolume, the one case"
            " whose answer the spec prescribes (FAILED_PRECONDITION); the others are reported.",
        ),
        Rule(
            "csi.delete-while-published",
            SHOULD,
            (CO,),
            f"{title} §Volume Lifecycle",
            "DeleteVolume of a volume the proxy saw published, which the plugin refused as in"
            " use (advisory).",
            reject_code=None,
            note="The lifecycle figures are a general expectation of what a CO MAY do, and"
            " the plugin answers an in-use volume itself; judged on that answer so that HA"
            " controllers, whose calls pass through other replicas, are not flagged.",
        ),
        Rule(
            "csi.create-not-idempotent",
            MUST,
            (PLUGIN,),
            f"{title} §CreateVolume",
            "A repeated CreateVolume or CreateSnapshot"
            + (" or CreateVolumeGroupSnapshot" if v1 else "")
            + " with the same name and arguments returns another id"
            + ("." if v1 else "; or, for the same volume, another capacity or topology."),
            reject_code=None,
            note=f"Judged only within {HANDOVER:.0f} s of the earlier answer (a leader-election"
            " lease: no other HA replica can have deleted the object and created it anew"
            " meanwhile) and while no delete of the id was seen since."
            + (
                ""
                if v1
                else " CSI v0.3 has no RPC that changes a volume's size or topology, so a"
                " repeat answering the same volume must answer them as before (capacity 0,"
                " unknown, is not compared)."
            ),
        ),
        Rule(
            "csi.size-limit-recommended",
            SHOULD,
            BOTH,
            f"{title} §{{rpc}}",
            "A field over a size limit judged as advisory only: v1 node_id over the"
            " RECOMMENDED 128 bytes, v0 paths, human-readable messages.",
            reject_code=None,
            note="Human-readable messages (VolumeCondition.message, ValidateVolumeCapabilities"
            "Response.message, v0 SnapshotStatus.details) are written for people and real"
            " plugins exceed 128 bytes.",
        ),
    ]
    rules += generic_rules("csi", title, "CO", CSI_REPEAT_NOTE)
    rules.append(
        Rule(
            "csi.size-limit-echoed",
            MUST,
            (PLUGIN,),
            f"{title} §Size Limits",
            "An id or token the plugin makes is over its size limit where the CO passes it back.",
            reject_code=None,
            note="Judged in every request that carries it, wherever it was made (another"
            " replica, before the proxy started); blamed on the plugin, whose kind of"
            " value it is, and never rejected, since the CO only passes it back. Maps"
            " passed back are not judged: the CO adds entries of its own to some.",
        )
    )
    if v1:  # CSI v0.3 has no caveated REQUIRED fields and no rule on name characters
        rules += [
            Rule(
                "csi.required-field-caveat",
                MUST,
                (CO,),
                f"{title} §{{rpc}}",
                "A REQUIRED field is missing that the text around it lets a plugin do"
                " without; reported, never rejected.",
                reject_code=None,
                note="The field is REQUIRED without condition, so its absence is a MUST"
                " breach by the CO; but a plugin that does not rely on it answers the call"
                " (the caveat says so), which is why the proxy does not refuse it for the"
                " plugin.",
            ),
            Rule(
                "csi.retry-advised-unchanged",
                SHOULD,
                (CO,),
                f"{title} §{{rpc}}",
                "The CO re-sent an identical DeleteVolumeGroupSnapshot or"
                " GetVolumeGroupSnapshot within 10 minutes of the plugin answering it"
                " INVALID_ARGUMENT, whose row for these RPCs advises other snapshot_ids; or"
                " an identical GetMetadataAllocated or GetMetadataDelta after"
                " INVALID_ARGUMENT or OUT_OF_RANGE, whose rows advise a corrected argument"
                " or a valid starting_offset.",
                reject_code=None,
                note="Reported, never enforced. The row adds a snapshot_ids mismatch to the"
                " general INVALID_ARGUMENT cases and only advises a change (SHOULD), so the"
                " re-send is judged at that level; either way the same request cannot"
                " succeed.",
            ),
            Rule(
                "csi.name-banned-characters",
                MUST,
                (CO,),
                f"{title} §{{rpc}}",
                "A CreateVolume/CreateSnapshot name contains a banned control character.",
            ),
            Rule(
                "csi.validate-confirmed-mismatch",
                MUST,
                (PLUGIN,),
                f"{title} §ValidateVolumeCapabilities",
                "The confirmed part of ValidateVolumeCapabilities holds what was not requested.",
                note="Compared field by field: a field the confirmed capability leaves unset"
                " is tolerated, as an older plugin confirms without newer fields (the NOTE in"
                " the section leaves reconciling them to the CO).",
            ),
            Rule(
                "csi.unimplemented-recommended",
                SHOULD,
                (PLUGIN,),
                f"{title} §Volume Lifecycle",
                "A Controller RPC answered UNIMPLEMENTED (advisory): controller plugins"
                " SHOULD implement every RPC of the service.",
                reject_code=None,
                note="UNIMPLEMENTED is still the right answer for an RPC a plugin does not"
                " support, and the capabilities say which optional RPCs a CO may call; the"
                " advisory says only that the plugin leaves part of the service out. An RPC"
                " the plugin MUST implement is csi.unimplemented-advertised's.",
            ),
            Rule(
                "csi.validate-confirmed-unsupported",
                MUST,
                (PLUGIN,),
                f"{title} §ValidateVolumeCapabilities, §ControllerGetCapabilities",
                "ValidateVolumeCapabilities confirms a single-node writer access mode that the"
                " plugin's controller capabilities say it does not support.",
                note="SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER are supported only"
                " by a plugin that lists SINGLE_NODE_MULTI_WRITER; judged once the proxy knows"
                " the controller capabilities (it asks the plugin itself if need be).",
            ),
            Rule(
                "csi.metadata-max-results",
                MUST,
                (PLUGIN,),
                f"{title} §{{rpc}}",
                "A snapshot metadata message carries more than max_results tuples.",
            ),
            Rule(
                "csi.metadata-offset",
                MUST,
                (PLUGIN,),
                f"{title} §{{rpc}}",
                "A snapshot metadata tuple ends before the requested starting_offset.",
            ),
        ]
    return tuple(rules)


CSI_REPEAT_NOTE = (
    "CSI adds ALREADY_EXISTS for CreateSnapshot and CreateVolumeGroupSnapshot, judged once an"
    " answer said the snapshot is ready to use, and ALREADY_EXISTS and FAILED_PRECONDITION"
    " on the node service, whose volumes only this socket's caller changes, and OUT_OF_RANGE"
    " for NodeExpandVolume (a volume that reached the target stays that large); node paths"
    " are objects too. NOT_FOUND from a delete is csi.delete-not-idempotent's."
    " ControllerPublishVolume is also judged when the repeat is not identical but asks the"
    " capability and readonly of the publication seen (other secrets or volume_context),"
    " within a leader-election lease of it and with no unpublish of the volume sent since:"
    " ALREADY_EXISTS, FAILED_PRECONDITION or RESOURCE_EXHAUSTED then deny a compatible"
    " publication that exists."
)


def generic_rules(
    family: str, title: str, caller: str, repeat_note: str = "", backoff: bool = True
) -> list[Rule]:
    """The rules every spec shares (the validate stage judges them), for ``family``;
    ``caller`` names the client in summaries (CO, COSI system, CMI-Client), ``repeat_note``
    says what the family's table adds to not-idempotent; ``backoff``: whether the spec's
    recovery rows ask for exponential back off (retry-without-backoff)."""
    rules = [
        Rule(
            f"{family}.error-message-unreadable",
            MUST,
            (PLUGIN,),
            f"{title} §Error Scheme",
            "A non-OK status carries a message that is not readable text: control characters"
            " other than tab and line breaks, or bytes that are not UTF-8.",
            note="grpc-message is percent-encoded UTF-8 on the wire; bytes that do not decode"
            " as UTF-8 reach the proxy as U+FFFD, and a message holding one is reported too."
            " The message is never quoted.",
        ),
        Rule(
            f"{family}.status-code-not-canonical",
            MUST,
            (PLUGIN,),
            f"{title} §Error Scheme",
            "The plugin's status is not a canonical gRPC code: a grpc-status outside 0-16 or"
            " not a number, or no grpc-status at all.",
            note="Judged on the grpc-status the plugin sent, which the caller receives"
            " unchanged. Behind the gRPC relay (TLS endpoints) grpc reads the status itself"
            " and makes a number outside 0-16 UNKNOWN: only a missing or unreadable status"
            " is seen there.",
        ),
        Rule(
            f"{family}.bad-request-accepted",
            MUST,
            (PLUGIN,),
            f"{title} §Error Scheme",
            f"The plugin answered OK to a request the proxy found breaking a MUST whose spec"
            f" prescribes the answer (a missing REQUIRED or an invalid field: INVALID_ARGUMENT;"
            f" the per-RPC error rows the proxy can see), which the {caller} sent in audit mode.",
            note="Counts the request rules enforce would reject, with the answer enforce"
            " would give; a rule switched off, or whose enforce mode answers the request"
            " itself, is not counted.",
        ),
        Rule(
            f"{family}.bad-request-wrong-code",
            MUST,
            (PLUGIN,),
            f"{title} §Error Scheme",
            "The plugin refused a request the proxy found breaking a MUST whose spec prescribes"
            " the answer (a missing REQUIRED or an invalid field: INVALID_ARGUMENT; the per-RPC"
            " rows the proxy can see) with another code.",
            reject_code=None,
            note="Codes a plugin may give before it reads the fields are not judged:"
            " UNAUTHENTICATED, PERMISSION_DENIED, UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED and"
            " UNIMPLEMENTED, nor the caller's own cancellations and deadlines.",
        ),
        Rule(
            f"{family}.retry-without-change",
            MUST,
            (CO,),
            f"{title} §Error Scheme",
            f"The {caller} re-sent an identical request (same fields; map order aside) within"
            " 10 minutes of the plugin answering it with a code whose recovery says the caller"
            " MUST fix the request first or MUST NOT retry.",
            reject_code=None,
            note="Reported, never enforced. A per-RPC error row whose recovery for the same"
            " code only advises (SHOULD, MAY) or asks for a change outside the request takes"
            " precedence and is not judged. Requests without fields (identity and capability"
            " queries) are not judged: independent callers send the same bytes.",
        ),
        Rule(
            f"{family}.retry-unfixed",
            MUST,
            (CO,),
            f"{title} §Error Scheme",
            f"After an answer whose recovery says the {caller} MUST NOT retry, or MUST fix"
            " fields it names first (the capacity range; after ALREADY_EXISTS the arguments of"
            " CreateVolume, CreateSnapshot, NodeStageVolume and NodePublishVolume, and in CSI"
            f" v0.3 of ControllerPublishVolume), the {caller} called the same RPC for the same"
            " object again within 10 minutes: at all, or with those fields unchanged.",
            reject_code=None,
            note="The object is the one the call is about (its volume, snapshot, bucket or"
            " machine; a CreateVolume's name). An identical re-send is retry-without-change"
            " instead. RPCs naming no object and requests without fields are not judged:"
            " another caller may make the same call. Any other answer for the object ends"
            " the refusal; calls through another replica are not seen and never count.",
        ),
        Rule(
            f"{family}.retry-while-pending",
            SHOULD,
            (CO,),
            f"{title} §Error Scheme",
            f"After the plugin answered ABORTED (an operation pending for the object), the"
            f" {caller} retried the call for that object while another call for it was still"
            " in flight at the proxy.",
            reject_code=None,
            note="The retry is the next call of the same RPC naming the object the ABORTED"
            " call was about (its volume, snapshot, bucket or machine; a CreateVolume's name)"
            " within 10 minutes; in flight means received by the proxy and not yet answered,"
            " queued by the serialize stage included. Calls through another replica are not"
            " seen and never count.",
        ),
        Rule(
            f"{family}.retry-without-backoff",
            SHOULD,
            (CO,),
            f"{title} §Error Scheme",
            f"The {caller} re-sent an identical request at least three times after answers"
            " whose recovery says to retry with exponential back off, and the waits did not"
            " grow.",
            reject_code=None,
            note="A wait is the time from an answer to the next identical request. Judged"
            " when three waits in a row are each under 10 s and they do not grow: the last is"
            " under 1.5 times the first, and the steps between them do not grow by 1.5 times"
            " each either, from a first step of at least 2 ms and 5 % of the first wait (a"
            " doubling wait behind a steady overhead of the caller's own);"
            " every answer in the series is a back-off row's. A burst with jitter, a steady"
            " or a slowly rising pace are judged. Real COs never trip it: kubelet waits 0.5 s"
            " and doubles up to about 2 min, the Kubernetes CSI sidecars wait 1 s (client-go's"
            " default limiter 5 ms) and double up to 5 min, jitter on top of a doubling keeps"
            " it growing, and a backoff held at a cap of 10 s or more is not judged. A"
            " back off whose every wait is drawn at random below its cap (full jitter) may be"
            " judged. NodeGetVolumeStats is polled: only waits under 1 s are judged there.",
        ),
    ]
    if not backoff:
        rules.pop()
    rules += [
        Rule(
            f"{family}.not-idempotent",
            MUST,
            (PLUGIN,),
            f"{title} §{{rpc}}",
            "An identical repeat of the last successful state change of the same objects, within"
            " 10 minutes and with no other state change of them seen since, was answered with"
            " an error that an idempotent operation rules out.",
            note="Only answers no change outside the proxy's view (another replica, the"
            " backend) can explain are judged: INVALID_ARGUMENT and UNIMPLEMENTED everywhere,"
            " and the codes the table adds per RPC. Transient codes, NOT_FOUND and"
            " permission codes are never judged." + (" " + repeat_note if repeat_note else ""),
        ),
    ]
    return rules


def staging_path_missing(st: SpecState, req: Any) -> bool:
    """§NodePublishVolume Errors, "Staging target path not set": STAGE_UNSTAGE_VOLUME is
    advertised (known) and the request has no staging_target_path."""
    node = st.known_capabilities("node")
    return not req.staging_target_path and node is not None and "STAGE_UNSTAGE_VOLUME" in node


def capability_names(response: Any) -> frozenset[str]:
    """Names of the capability enum values a *GetCapabilities response lists; for COSI
    v1alpha2's DriverGetInfo, the protocols it lists as supported (S3, AZURE, GCS)."""
    names: set[str] = set()
    if "supported_protocols" in response.DESCRIPTOR.fields_by_name:
        for protocol in response.supported_protocols:
            fd = protocol.DESCRIPTOR.fields_by_name["type"]
            value = fd.enum_type.values_by_number.get(protocol.type)
            if value is not None and value.number:
                names.add(value.name)
        return frozenset(names)
    for cap in response.capabilities:
        kind = cap.WhichOneof("type")
        if kind is None:
            continue
        inner = getattr(cap, kind)
        for fd in inner.DESCRIPTOR.fields:
            if fd.enum_type is not None and not fd.is_repeated:
                value = fd.enum_type.values_by_number.get(getattr(inner, fd.name))
                if value is not None:
                    names.add(value.name)
    return frozenset(names)


def _confirms(confirmed: Any, requested: Any) -> bool:
    """Whether every field ``confirmed`` sets matches ``requested``; unset ones are tolerated.

    An older plugin confirms a capability without the fields it does not know (CSI v1.12
    §ValidateVolumeCapabilities, NOTE); what it does set must be what was asked for.
    """
    for fd, value in confirmed.ListFields():
        if fd.message_type is not None and not fd.is_repeated:
            if not requested.HasField(fd.name) or not _confirms(value, getattr(requested, fd.name)):
                return False
        elif fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            wanted_map = getattr(requested, fd.name)
            if any(k not in wanted_map or wanted_map[k] != v for k, v in value.items()):
                return False
        elif fd.is_repeated:
            wanted = list(getattr(requested, fd.name))
            if fd.message_type is not None:
                if not all(any(_confirms(v, w) for w in wanted) for v in value):
                    return False
            elif not set(value) <= set(wanted):
                return False
        elif getattr(requested, fd.name) != value:
            return False
    return True


class CreatedShapes:
    """CreateVolume name -> (capacity_bytes, accessible_topology digest) of its last answer
    (SpecState part; used where no RPC can change them, CSI v0.3)."""

    def __init__(self, st: SpecState) -> None:
        self.shapes: ExpiringMap[str, tuple[int, bytes]] = ExpiringMap(
            st.max_volumes, st.lifecycle_ttl, st.clock
        )


def _same_shape(
    cs: CompiledSpec, st: SpecState, name: str, vol: Any, repeat: bool
) -> Iterable[Violation]:
    """A repeat of the last CreateVolume of ``name`` (same arguments, same volume, recent)
    answering another capacity or topology than it did; then remember this answer."""
    topology = b"".join(sorted(message_digest(t) for t in vol.accessible_topology))
    shapes = st.part(CreatedShapes).shapes
    before = shapes.get(name)
    shapes[name] = (vol.capacity_bytes, topology)
    if not repeat or before is None:
        return
    cap, was = before
    if cap > 0 and vol.capacity_bytes > 0 and cap != vol.capacity_bytes:
        yield Violation(
            cs.rule("create-not-idempotent"),
            "volume.capacity_bytes",
            f"CreateVolume repeated with the same name and arguments answered capacity_bytes"
            f" {vol.capacity_bytes} for the same volume, {cap} before; no RPC changes a"
            " volume's size",
        )
    elif was != topology:
        yield Violation(
            cs.rule("create-not-idempotent"),
            "volume.accessible_topology",
            "CreateVolume repeated with the same name and arguments answered another"
            " accessible_topology for the same volume than before",
        )


@dataclass(frozen=True)
class CsiChecks:
    """Method-level CSI checks, bound to one version's field names."""

    volume_id: str  # field of Volume holding its id: volume_id (v1) or id (v0)
    topology_capability: str = "VOLUME_ACCESSIBILITY_CONSTRAINTS"  # v0: ACCESSIBILITY_...
    has_topology: bool = True
    # No RPC changes a volume's size or topology (CSI v0.3 has no expansion): a repeated
    # CreateVolume must answer the capacity and topology it answered before.
    fixed_shape: bool = False

    # -- requests (party co) ------------------------------------------------------------

    def create_volume_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        yield from self._topology_without_capability(
            cs, st, req, "accessibility_requirements", "topology-requirement-without-capability"
        )
        controller = st.known_capabilities("controller")
        if controller is not None and req.HasField("volume_content_source"):
            kind = req.volume_content_source.WhichOneof("type")
            needed = {"snapshot": "CREATE_DELETE_SNAPSHOT", "volume": "CLONE_VOLUME"}.get(
                kind or ""
            )
            if needed is not None and needed not in controller:
                yield Violation(
                    cs.rule("capability-not-advertised"),
                    f"volume_content_source.{kind}",
                    f"volume_content_source.{kind} is set but the controller does not advertise"
                    f" {needed}",
                )

    def get_capacity_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        yield from self._topology_without_capability(
            cs, st, req, "accessible_topology", "capacity-topology-without-capability"
        )

    def _topology_without_capability(
        self, cs: CompiledSpec, st: SpecState, req: Any, field: str, rule: str
    ) -> Iterable[Violation]:
        """Topology in ``field`` when the plugin is known not to advertise the capability."""
        plugin = st.known_capabilities("plugin")
        if (
            self.has_topology
            and plugin is not None
            and req.HasField(field)
            and self.topology_capability not in plugin
        ):
            yield Violation(
                cs.rule(rule),
                field,
                f"{field} is set but the plugin does not advertise {self.topology_capability}",
            )

    def node_publish_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        node = st.known_capabilities("node")
        if node is None or "STAGE_UNSTAGE_VOLUME" not in node:
            return
        vs = st.peek(req.volume_id)
        if vs is not None and vs.known_unstaged and not vs.staged:
            yield Violation(
                cs.rule("call-order"),
                "volume_id",
                "NodePublishVolume before NodeStageVolume: the plugin advertises"
                " STAGE_UNSTAGE_VOLUME and the volume is not staged on this node",
            )

    def node_unstage_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        vs = st.peek(req.volume_id)
        if vs is not None and vs.published:
            # NodeUnstageVolume's error table has no row for this: reported, not enforced.
            yield Violation(
                cs.rule("call-order"),
                "volume_id",
                f"NodeUnstageVolume while {len(vs.published)} publication(s) of the volume"
                " remain on this node (NodeUnpublishVolume first)",
                enforceable=False,
            )

    def controller_unpublish_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        vs = st.peek(req.volume_id)
        if vs is None or st.node_id is None or not (vs.staged or vs.published):
            return
        if req.node_id and req.node_id != st.node_id:
            return
        what = "staged" if vs.staged else "published"
        # No error row prescribes an answer: reported, not enforced.
        yield Violation(
            cs.rule("call-order"),
            "volume_id",
            f"ControllerUnpublishVolume while the volume is still {what} on the node"
            " (NodeUnpublishVolume and NodeUnstageVolume first)",
            enforceable=False,
        )

    # -- answers with an error ------------------------------------------------------------

    def delete_volume_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        # Judged on the plugin's answer, not the proxy's memory alone: an HA peer may have
        # unpublished the volume through another replica, and then the plugin says OK.
        vs = st.peek(req.volume_id)
        if code != "FAILED_PRECONDITION" or vs is None:
            return
        nodes = st.controller_nodes(req.volume_id)
        if nodes:
            where = f"published to {len(nodes)} node(s)"
        elif vs.published or vs.staged:
            where = "staged or published on a node"
        else:
            return
        yield Violation(
            cs.rule("delete-while-published"),
            "volume_id",
            f"DeleteVolume while the volume is {where}; the plugin answered it is in use",
            party=CO,
        )

    def node_unstage_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        vs = st.peek(req.volume_id)
        if code == "NOT_FOUND" and vs is not None:  # the volume is gone: nothing stays staged
            vs.staged = removed(vs.staged, req.staging_target_path)
        return ()

    def node_unpublish_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code == "NOT_FOUND":  # the volume is gone: the publication with it
            self.unpublished(st, call, req, None)
        return ()

    def lifecycle_errors(self) -> dict[str, Any]:
        """Error answers the lifecycle learns from: a tabled NOT_FOUND undoes as surely as
        success; DeleteVolume's FAILED_PRECONDITION confirms the volume is in use."""
        return {
            "DeleteVolume": self.delete_volume_error,
            "NodeUnstageVolume": self.node_unstage_error,
            "NodeUnpublishVolume": self.node_unpublish_error,
        }

    def hooks(self, title: str, v1: bool, responses: dict[str, Any]) -> Hooks:
        """The checks of this module as one family, for csi_v1 and csi_v0 alike;
        ``responses``: the version's own response checks (RPC -> check)."""
        return Hooks(
            rules=csi_rules(title, v1=v1),
            capability_needs={
                "CreateVolume": ("plugin", "controller"),
                "GetCapacity": ("plugin",),
                "NodePublishVolume": ("node",),
                # CSI v1: which single-node access modes the controller supports
                **({"ValidateVolumeCapabilities": ("controller",)} if v1 else {}),
            },
            request_checks={
                "CreateVolume": (self.create_volume_request,),
                "GetCapacity": (self.get_capacity_request,),
                "NodePublishVolume": (self.node_publish_request,),
                "NodeUnstageVolume": (self.node_unstage_request,),
                "ControllerUnpublishVolume": (self.controller_unpublish_request,),
            },
            response_checks={
                "CreateVolume": (self.create_volume_response,),
                "NodeGetInfo": (self.node_get_info_response,),
                "ListVolumes": (self.list_response,),
                "ListSnapshots": (self.list_response,),
                "CreateSnapshot": (self.create_snapshot_response,),
                **{rpc: (check,) for rpc, check in responses.items()},
            },
            on_success={k: (v,) for k, v in self.lifecycle_transitions().items()},
            on_error={k: (v,) for k, v in self.lifecycle_errors().items()},
        )

    # -- responses (party plugin) -------------------------------------------------------

    def create_volume_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if not resp.HasField("volume"):
            return
        vol = resp.volume
        cap = vol.capacity_bytes
        if cap > 0 and req.HasField("capacity_range"):
            cr = req.capacity_range
            if cr.required_bytes > 0 and cap < cr.required_bytes:
                yield Violation(
                    cs.rule("capacity-out-of-range"),
                    "volume.capacity_bytes",
                    f"volume.capacity_bytes {cap} is below capacity_range.required_bytes"
                    f" {cr.required_bytes}",
                )
            if cr.limit_bytes > 0 and cap > cr.limit_bytes:
                yield Violation(
                    cs.rule("capacity-out-of-range"),
                    "volume.capacity_bytes",
                    f"volume.capacity_bytes {cap} is above capacity_range.limit_bytes"
                    f" {cr.limit_bytes}",
                )
        if req.HasField("volume_content_source"):
            asked = req.volume_content_source.WhichOneof("type")
            got = vol.content_source.WhichOneof("type") if vol.HasField("content_source") else None
            if got is None or (asked is not None and got != asked):
                yield Violation(
                    cs.rule("content-source-not-echoed"),
                    "volume.content_source",
                    f"CreateVolume from a {asked or 'source'} answered with"
                    f" {'no content_source' if got is None else f'content_source.{got}'}",
                )
        if self.has_topology:
            yield from self._topology(cs, st, vol.accessible_topology, "volume.accessible_topology")
        vid = getattr(vol, self.volume_id)
        if req.name and vid:
            digest = message_digest(req)
            prev = st.creates.get(req.name)
            # A delete finds the name through the volume's state: with that dropped to make
            # room, the delete of the earlier volume may have been missed.
            if prev is not None and st.volumes.dropped_after(prev[2]):
                prev = None
            now = st.clock()
            if self.fixed_shape:
                same = (
                    prev is not None
                    and prev[0] == digest
                    and prev[1] == vid
                    and now - prev[2] <= HANDOVER
                )
                yield from _same_shape(cs, st, req.name, vol, same)
            if (
                prev is not None
                and prev[0] == digest
                and prev[1] != vid
                and now - prev[2] <= HANDOVER
            ):
                yield Violation(
                    cs.rule("create-not-idempotent"),
                    f"volume.{self.volume_id}",
                    f"CreateVolume repeated with the same name and arguments returned another"
                    f" volume.{self.volume_id} than it did {ago(now - prev[2])}, and no delete"
                    " of that one was seen since",
                )
            st.creates[req.name] = (digest, vid, now)

    def _topology(
        self, cs: CompiledSpec, st: SpecState, topology: Any, where: str
    ) -> Iterable[Violation]:
        if not topology:
            return
        plugin = st.known_capabilities("plugin")
        if plugin is not None and self.topology_capability not in plugin:
            yield Violation(
                cs.rule("topology-without-capability"),
                where,
                f"{where} has {len(topology)} entries but the plugin does not advertise"
                f" {self.topology_capability}",
            )

    def node_get_info_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if resp.node_id:
            st.node_id = resp.node_id
        if self.has_topology and resp.HasField("accessible_topology"):
            yield from self._topology(
                cs, st, resp.accessible_topology.segments, "accessible_topology"
            )

    def node_get_id_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if resp.node_id:
            st.node_id = resp.node_id
        return ()

    def list_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        returned = list_length(call, resp, "entries")
        if req.max_entries > 0 and returned > req.max_entries:
            yield Violation(
                cs.rule("list-max-entries"),
                "entries",
                f"{returned} entries returned; max_entries was {req.max_entries}",
            )

    def create_snapshot_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if not resp.HasField("snapshot"):
            return
        got = resp.snapshot.source_volume_id
        if got and req.source_volume_id and got != req.source_volume_id:
            yield Violation(
                cs.rule("snapshot-source-mismatch"),
                "snapshot.source_volume_id",
                "snapshot.source_volume_id differs from the request's source_volume_id",
            )

    def validate_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if not resp.HasField("confirmed"):
            return
        confirmed = resp.confirmed
        rule = cs.rule("validate-confirmed-mismatch")
        asked = list(req.volume_capabilities)
        extra = sum(
            1 for c in confirmed.volume_capabilities if not any(_confirms(c, r) for r in asked)
        )
        if extra:
            yield Violation(
                rule,
                "confirmed.volume_capabilities",
                f"confirmed.volume_capabilities holds {extra} capabilit(ies) not in the request",
            )
        yield from _confirmed_unsupported(cs, st, confirmed)
        for name in ("volume_context", "parameters", "mutable_parameters"):
            if name not in confirmed.DESCRIPTOR.fields_by_name:
                continue
            requested = getattr(req, name)
            extra = sum(1 for k, v in getattr(confirmed, name).items() if requested.get(k) != v)
            if extra:
                yield Violation(
                    rule,
                    f"confirmed.{name}",
                    f"confirmed.{name} holds {extra} entr(ies) not in the request's {name}",
                )

    def metadata_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        blocks = resp.block_metadata
        sent = list_length(call, resp, "block_metadata")
        if req.max_results > 0 and sent > req.max_results:
            yield Violation(
                cs.rule("metadata-max-results"),
                "block_metadata",
                f"{sent} tuples in one message; max_results was {req.max_results}",
            )
        if resp.volume_capacity_bytes == 0:
            # REQUIRED; proto3 reads an unset number as 0, and no volume holds 0 bytes.
            yield Violation(
                cs.rule("required-field"),
                "volume_capacity_bytes",
                "volume_capacity_bytes is missing (0): no volume has a capacity of 0 bytes",
                enforceable=False,
            )
        start = req.starting_offset
        if start >= 0:
            # At 0 as well: a tuple with a negative byte_offset may end before it.
            early = sum(1 for b in blocks if b.byte_offset + b.size_bytes <= start)
            if early:
                yield Violation(
                    cs.rule("metadata-offset"),
                    "block_metadata",
                    f"{early} tuple(s) end at or before starting_offset {start}",
                )

    # -- bookkeeping after success (call order state) ---------------------------------

    def lifecycle_transitions(self) -> dict[str, Any]:
        """Successful calls that move a volume along the CSI v1.12 §Volume Lifecycle figures."""
        return {
            "CreateVolume": self.created,
            "DeleteVolume": self.deleted,
            "ControllerPublishVolume": self.controller_published,
            "NodeStageVolume": self.staged,
            "NodeUnstageVolume": self.unstaged,
            "NodePublishVolume": self.published,
            "NodeUnpublishVolume": self.unpublished,
            "NodeGetVolumeStats": self.in_use,
        }

    def created(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        vid = getattr(resp.volume, self.volume_id) if resp is not None else ""
        if not vid:
            return
        vs = st.peek(vid)
        if vs is None:
            vs = st.volume(vid)
            vs.known_unstaged = True  # a volume just created is staged nowhere
        vs.created_name = req.name

    def deleted(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        vs = st.peek(req.volume_id)
        if vs is not None and vs.created_name:
            entry = st.creates.get(vs.created_name)
            if entry is not None and entry[1] == req.volume_id:
                st.creates.pop(vs.created_name, None)
        st.forget(req.volume_id)

    def controller_published(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        # The publication itself (SpecState.publications) is kept by csi_volumes, which
        # compares later calls with it; ControllerUnpublishVolume ends it there too.
        if req.volume_id and req.node_id:
            st.volume(req.volume_id)

    def staged(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        if req.volume_id:
            vs = st.volume(req.volume_id)
            vs.staged = added(vs.staged, req.staging_target_path)
            vs.known_unstaged = False

    def unstaged(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        if req.volume_id:
            vs = st.volume(req.volume_id)
            vs.staged = removed(vs.staged, req.staging_target_path)
            if not vs.staged:
                vs.known_unstaged = True

    def published(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        if req.volume_id:
            vs = st.volume(req.volume_id)
            vs.published = added(vs.published, req.target_path)

    def unpublished(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        vs = st.peek(req.volume_id)
        if vs is not None:
            vs.published = removed(vs.published, req.target_path)

    def in_use(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        # The CO polls stats of the volumes it uses: what the proxy knows of them stays fresh.
        st.touch(req.volume_id)


# Access modes a plugin supports only when its controller lists SINGLE_NODE_MULTI_WRITER
# (CSI v1.12 §ControllerGetCapabilities); CSI v0.3 has neither.
_SINGLE_NODE_MODES = frozenset({"SINGLE_NODE_SINGLE_WRITER", "SINGLE_NODE_MULTI_WRITER"})


def _confirmed_unsupported(cs: CompiledSpec, st: SpecState, confirmed: Any) -> Iterable[Violation]:
    rule = cs.find("validate-confirmed-unsupported")
    caps = st.known_capabilities("controller")
    if rule is None or caps is None or "SINGLE_NODE_MULTI_WRITER" in caps:
        return
    for i, cap in enumerate(confirmed.volume_capabilities):
        if not cap.HasField("access_mode"):
            continue
        mode = cap.access_mode
        value = mode.DESCRIPTOR.fields_by_name["mode"].enum_type.values_by_number.get(mode.mode)
        if value is not None and value.name in _SINGLE_NODE_MODES:
            yield Violation(
                rule,
                f"confirmed.volume_capabilities[{i}].access_mode.mode",
                f"confirmed access mode {value.name}, but ControllerGetCapabilities does not"
                " list SINGLE_NODE_MULTI_WRITER",
            )
