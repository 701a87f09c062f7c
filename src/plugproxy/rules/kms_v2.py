"""Rule table of KMS v2 (package v2; kube-apiserver is the client, the KMS plugin serves).

The API's own comments set the plugin's answers: ``key_id`` not empty and at most 1 kB
(StatusResponse, EncryptResponse), ``ciphertext`` not empty and at most 1 kB, annotation
keys fully qualified domain names and annotations (keys and values) at most 32 kB in all,
``version`` "v2" or "v2beta1". kube-apiserver enforces the same bounds (1 kB = 1024 bytes,
32 kB = 32768, inclusive) and rejects an answer breaking them, so each is a MUST of the
plugin. The API states nothing of the requests, so no rule judges kube-apiserver, and it
has no error scheme: any status code may carry any message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.rules.engine import (
    MUST,
    PLUGIN,
    CompiledSpec,
    Rule,
    SpecTable,
    Violation,
    malformed_message_rule,
)

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.state import SpecState

TITLE = "KMS v2"
FILE = "api.proto"
KEY_ID_MAX = 1024
CIPHERTEXT_MAX = 1024
ANNOTATIONS_MAX = 32 * 1024
VERSIONS = ("v2", "v2beta1")
# RFC 1123 subdomain with at least two labels, as kube-apiserver checks annotation keys.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_FQDN = re.compile(rf"{_LABEL}(\.{_LABEL})+")
FQDN_MAX = 253

RULES = (
    Rule(
        "kms.required-field",
        MUST,
        (PLUGIN,),
        f"{TITLE} {FILE} §{{rpc}}",
        "key_id or ciphertext, which the API says must not be empty, is empty.",
        reject_code=None,
    ),
    Rule(
        "kms.size-limit",
        MUST,
        (PLUGIN,),
        f"{TITLE} {FILE} §{{rpc}}",
        "key_id or ciphertext exceeds 1 kB, or the annotations exceed 32 kB in all.",
        reject_code=None,
        note="1 kB is 1024 bytes and 32 kB 32768, the bounds kube-apiserver applies.",
    ),
    Rule(
        "kms.annotation-key-format",
        MUST,
        (PLUGIN,),
        f"{TITLE} {FILE} §EncryptResponse",
        "An annotation key is not a fully qualified domain name (RFC 1123).",
        reject_code=None,
    ),
    Rule(
        "kms.version-unsupported",
        MUST,
        (PLUGIN,),
        f"{TITLE} {FILE} §StatusResponse",
        'Status answers a version other than "v2" or "v2beta1".',
        reject_code=None,
    ),
    malformed_message_rule("kms", f"{TITLE} {FILE} §{{rpc}}", None),
)

REQUIRED: dict[str, tuple[str, ...]] = {
    "StatusResponse": ("key_id",),
    "EncryptResponse": ("ciphertext", "key_id"),
}


def annotation_problems(annotations: Any) -> Iterable[tuple[str, str]]:
    """(field, why) for each annotation breaking the API's constraints; never quotes values."""
    total = 0
    for key in sorted(annotations):
        total += len(key.encode()) + len(annotations[key])
        if len(key) > FQDN_MAX or not _FQDN.fullmatch(key):
            yield (
                f"annotations[{key!r}]",
                "annotation key is not a fully qualified domain name (lower-case RFC 1123"
                f" labels joined by '.', at least two, at most {FQDN_MAX} characters)",
            )
    if total > ANNOTATIONS_MAX:
        yield "annotations", f"annotations hold {total} bytes; at most {ANNOTATIONS_MAX} allowed"


def _encrypt_answer(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if len(resp.ciphertext) > CIPHERTEXT_MAX:
        yield Violation(
            cs.rule("size-limit"),
            "ciphertext",
            f"ciphertext is {len(resp.ciphertext)} bytes; at most {CIPHERTEXT_MAX} allowed",
        )
    for field, why in annotation_problems(resp.annotations):
        suffix = "size-limit" if field == "annotations" else "annotation-key-format"
        yield Violation(cs.rule(suffix), field, why)


def _status_answer(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if resp.version not in VERSIONS:
        what = "empty" if not resp.version else "another string"
        yield Violation(
            cs.rule("version-unsupported"),
            "version",
            f"version is {what}; kube-apiserver accepts only {' or '.join(VERSIONS)}",
        )


TABLE = SpecTable(
    spec="kms.v2",
    family="kms",
    title=TITLE,
    package="v2",
    rules=RULES,
    required=REQUIRED,
    string_limit=None,
    map_limit=None,
    size_overrides={
        ("StatusResponse", "key_id"): KEY_ID_MAX,
        ("EncryptResponse", "key_id"): KEY_ID_MAX,
    },
    response_checks={"Encrypt": (_encrypt_answer,), "Status": (_status_answer,)},
)
