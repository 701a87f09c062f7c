"""Rule table of COSI v1alpha1 (package cosi.v1alpha1).

REQUIRED fields: the 11 "This field is REQUIRED" of the spec's messages; one of them names
``DriverCreateBucketRequest.bucket_name``, a field the spec's own proto calls ``name`` (also
marked REQUIRED), so 10 distinct fields are checked. ``authentication_type`` is an enum:
0 (UnknownAuthenticationType) counts as missing. The credential detail maps are plugin
secrets: their keys follow COSI §Secrets Requirements.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.rules.csi_common import TRANSPORT_CODES
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

TITLE = "COSI v1alpha1"
BOTH = (CO, PLUGIN)

RULES = (
    Rule(
        "cosi.required-field",
        MUST,
        BOTH,
        f"{TITLE} §{{rpc}}",
        "A field the spec marks REQUIRED is missing.",
    ),
    Rule(
        "cosi.size-limit",
        MUST,
        BOTH,
        f"{TITLE} §Size Limits",
        "A string exceeds 128 bytes or a map<string,string> 4 KiB.",
        note="bucket_id and account_id are judged where the driver returns them, not where"
        " the COSI system passes them back.",
    ),
    Rule(
        "cosi.plugin-name-format",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverGetInfo",
        "The driver name is not 63 characters or less in domain name notation.",
    ),
    Rule(
        "cosi.secret-key-format",
        MUST,
        BOTH,
        f"{TITLE} §Secrets Requirements",
        "A secrets map key is not made of alphanumerics, '-', '_' and '.'.",
    ),
    Rule(
        "cosi.malformed-message",
        MUST,
        BOTH,
        f"{TITLE} §{{rpc}}",
        "The message bytes do not decode as the RPC's message type.",
    ),
    Rule(
        "cosi.error-message-empty",
        MUST,
        (PLUGIN,),
        f"{TITLE} §Error Scheme",
        "A non-OK status carries an empty message.",
    ),
    Rule(
        "cosi.status-details-nonempty",
        MUST,
        (PLUGIN,),
        f"{TITLE} §Error Scheme",
        "A non-OK status carries a google.rpc.Status with details (grpc-status-details-bin).",
    ),
    Rule(
        "cosi.unimplemented-advertised",
        MUST,
        (PLUGIN,),
        f"{TITLE} §{{rpc}}",
        "The driver answers UNIMPLEMENTED for an RPC every driver must implement"
        " (DriverGetInfo, DriverCreateBucket).",
    ),
    Rule(
        "cosi.unimplemented-recommended",
        SHOULD,
        (PLUGIN,),
        f"{TITLE} §Bucket Lifecycle",
        "The driver answers UNIMPLEMENTED for an RPC drivers SHOULD implement (advisory).",
        note="Only DriverCreateBucket and the REQUIRED Identity RPC must be implemented;"
        " the spec asks for the other Provisioner RPCs with a SHOULD.",
    ),
    Rule(
        "cosi.error-code-unexpected",
        SHOULD,
        (PLUGIN,),
        f"{TITLE} §{{rpc}}",
        "A status code neither in the RPC's error table nor a general one (advisory).",
    ),
    Rule(
        "cosi.bucket-id-empty",
        MUST,
        (PLUGIN,),
        f"{TITLE} §DriverCreateBucket",
        "DriverCreateBucket succeeds without the bucket_id every later call REQUIRES.",
    ),
)

REQUIRED: dict[str, tuple[str, ...]] = {
    "DriverGetInfoResponse": ("name",),
    "DriverCreateBucketRequest": ("name",),
    "DriverDeleteBucketRequest": ("bucket_id",),
    "DriverGrantBucketAccessRequest": ("bucket_id", "name", "authentication_type"),
    "DriverGrantBucketAccessResponse": ("account_id", "credentials"),
    "DriverRevokeBucketAccessRequest": ("bucket_id", "account_id"),
}


def _bucket_id(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if not resp.bucket_id:
        yield Violation(
            cs.rule("bucket-id-empty"),
            "bucket_id",
            "bucket_id is empty; DriverDeleteBucket and DriverGrantBucketAccess REQUIRE it",
        )


TABLE = SpecTable(
    spec="cosi.v1alpha1",
    family="cosi",
    title=TITLE,
    package="cosi.v1alpha1",
    rules=RULES,
    required=REQUIRED,
    plugin_name_fields=(("DriverGetInfoResponse", "name"),),
    secret_maps=(("CredentialDetails", "secrets"),),
    error_codes={
        "DriverCreateBucket": frozenset({"ALREADY_EXISTS", "INVALID_ARGUMENT", "OUT_OF_RANGE"})
    },
    general_codes=frozenset(
        {"ABORTED", "INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED", "UNIMPLEMENTED"}
    )
    | TRANSPORT_CODES,
    # §DriverCreateBucket: MUST implement; §Connectivity: the REQUIRED Identity RPCs.
    required_rpcs=frozenset({"DriverGetInfo", "DriverCreateBucket"}),
    # §Bucket Lifecycle: plugins SHOULD implement all RPCs of the service.
    recommended_rpcs=frozenset(
        {"DriverDeleteBucket", "DriverGrantBucketAccess", "DriverRevokeBucketAccess"}
    ),
    # The COSI system passes back the ids the driver made (blamed where they were made).
    echoes={
        ("DriverDeleteBucketRequest", "bucket_id"): ("DriverCreateBucketResponse", "bucket_id"),
        ("DriverGrantBucketAccessRequest", "bucket_id"): (
            "DriverCreateBucketResponse",
            "bucket_id",
        ),
        ("DriverRevokeBucketAccessRequest", "bucket_id"): (
            "DriverCreateBucketResponse",
            "bucket_id",
        ),
        ("DriverRevokeBucketAccessRequest", "account_id"): (
            "DriverGrantBucketAccessResponse",
            "account_id",
        ),
    },
    response_checks={"DriverCreateBucket": (_bucket_id,)},
)
