"""Rule tables of ``--descriptor-set`` specs, read from the standard annotations.

A descriptor set carries no spec text, only its descriptors; what they state is judged:

- ``<spec>.required-field``: a field annotated ``google.api.field_behavior = REQUIRED``
  (AIP-203) is missing, with the engine's proto3 reading (empty string, bytes, list or
  map; enum 0; absent message; unset proto3 ``optional`` scalar; plain bool and number
  fields are not judged). Requests judge the caller, responses the plugin; enforce answers
  such a request INVALID_ARGUMENT naming the field, as AIP-203 asks of the service.
- ``<spec>.malformed-message``: the bytes do not decode as the RPC's message type.
- ``<spec>.status-code-not-canonical``: the plugin's grpc-status is not one of gRPC's
  canonical codes.
- ``<spec>.bad-request-accepted``: the plugin answered OK to a request missing a REQUIRED
  field (in audit mode, where the request reached it).

The annotation is an extension of google.protobuf.FieldOptions; it is resolved by its full
name in the set's own pool, from the option bytes (with protobuf's upb backend the options
of a descriptor from another pool carry extensions only as unknown fields). A set that does
not contain google/api/field_behavior.proto has no REQUIRED fields.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from plugproxy.api import SpecInfo
from plugproxy.rules.engine import CO, MUST, PLUGIN, Rule, SpecTable, malformed_message_rule

FIELD_BEHAVIOR = "google.api.field_behavior"
RULE_SUFFIXES = (
    "required-field",
    "malformed-message",
    "status-code-not-canonical",
    "bad-request-accepted",
)


def service_files(spec: SpecInfo) -> list[str]:
    """The files of ``spec`` that define services (what rule sections cite)."""
    return [n for n in spec.files if spec.pool.FindFileByName(n).services_by_name]


def rules_for(spec: SpecInfo) -> tuple[Rule, ...]:
    family = spec.name
    where = ", ".join(service_files(spec)) or spec.name
    return (
        Rule(
            f"{family}.required-field",
            MUST,
            (CO, PLUGIN),
            f"{where} §{{rpc}} ({FIELD_BEHAVIOR} = REQUIRED, AIP-203)",
            "A field annotated google.api.field_behavior = REQUIRED is missing.",
        ),
        malformed_message_rule(family, f"{where} §{{rpc}}", "INVALID_ARGUMENT"),
        Rule(
            f"{family}.status-code-not-canonical",
            MUST,
            (PLUGIN,),
            "gRPC status codes",
            "The plugin's status is not a canonical gRPC code (0-16), or it sent none.",
        ),
        Rule(
            f"{family}.bad-request-accepted",
            MUST,
            (PLUGIN,),
            f"{where} §{{rpc}} (AIP-203)",
            "The plugin answered OK to a request missing a REQUIRED field, which the caller"
            " sent in audit mode.",
        ),
    )


def required_fields(spec: SpecInfo) -> dict[str, tuple[str, ...]]:
    """Message full name -> its fields annotated REQUIRED, from the set's own pool."""
    try:
        ext: Any = spec.pool.FindExtensionByName(FIELD_BEHAVIOR)
    except KeyError:
        return {}
    options_class = spec.field_options_class
    if options_class is None:
        return {}
    required_number = ext.enum_type.values_by_name["REQUIRED"].number
    out: dict[str, tuple[str, ...]] = {}
    for full_name in spec.message_classes:
        desc: Descriptor = spec.descriptor(full_name)
        if desc.GetOptions().map_entry:
            continue
        names = tuple(
            fd.name
            for fd in desc.fields
            if not _in_real_oneof(fd) and required_number in _behaviors(fd, options_class, ext)
        )
        if names:
            out[full_name] = names
    return out


def _behaviors(fd: FieldDescriptor, options_class: Any, ext: Any) -> list[int]:
    raw = fd.GetOptions().SerializeToString()
    if not raw:
        return []
    return list(options_class.FromString(raw).Extensions[ext])


def _in_real_oneof(fd: FieldDescriptor) -> bool:
    # A oneof member cannot be REQUIRED on its own (AIP-203); proto3 `optional` makes a
    # one-field synthetic oneof, which does not count.
    oneof = fd.containing_oneof
    return oneof is not None and len(oneof.fields) > 1


def table_for(spec: SpecInfo) -> SpecTable:
    """The rule table of a descriptor-set spec (names in it are full names)."""
    return SpecTable(
        spec=spec.name,
        family=spec.name,
        title=spec.name,
        package="",
        rules=rules_for(spec),
        required=required_fields(spec),
        string_limit=None,  # the annotations state no size limits
        map_limit=None,
    )
