"""Rule table of the DRA kubelet plugin API v1beta1 (package k8s.io.kubelet.pkg.apis.dra.v1beta1).

REQUIRED fields, as the API's comments call them: a Claim's ``namespace``, ``uid`` and
``name`` (kubelet sends them) and a Device's ``pool_name`` and ``device_name`` (the plugin
answers them). Every claim of a request must have an entry, keyed by its uid, in the
answer's ``claims`` map (NodeUnprepareResourcesResponse: "even if that entry is nil";
NodePrepareResourcesResponse: "it is an error if some claim ... does not get prepared").
The API states no size limits and no error scheme.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.rules.engine import (
    CO,
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

TITLE = "DRA v1beta1"
FILE = "api.proto"

RULES = (
    Rule(
        "dra.required-field",
        MUST,
        (CO, PLUGIN),
        f"{TITLE} {FILE} §{{rpc}}",
        "A field the API calls REQUIRED is empty (Claim namespace, uid, name; Device"
        " pool_name, device_name).",
        reject_code=None,
        note="The API prescribes no answer to a bad request, so the rule is reported and"
        " never enforced.",
    ),
    Rule(
        "dra.claim-not-answered",
        MUST,
        (PLUGIN,),
        f"{TITLE} {FILE} §{{rpc}}Response",
        "The answer's claims map has no entry for a claim uid of the request.",
        reject_code=None,
        note="kubelet calls NodePrepareResources again for claims left out; the API still"
        " calls it an error.",
    ),
    malformed_message_rule("dra", f"{TITLE} {FILE} §{{rpc}}", None),
)

REQUIRED: dict[str, tuple[str, ...]] = {
    "Claim": ("namespace", "uid", "name"),
    "Device": ("pool_name", "device_name"),
}


def _every_claim_answered(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    missing = [i for i, c in enumerate(req.claims) if c.uid and c.uid not in resp.claims]
    if missing:
        which = ", ".join(f"claims[{i}]" for i in missing[:5]) + (" …" if len(missing) > 5 else "")
        yield Violation(
            cs.rule("claim-not-answered"),
            "claims",
            f"claims has no entry for {len(missing)} of the {len(req.claims)} requested"
            f" claims (the request's {which})",
        )


TABLE = SpecTable(
    spec="dra.v1beta1",
    family="dra",
    title=TITLE,
    package="k8s.io.kubelet.pkg.apis.dra.v1beta1",
    rules=RULES,
    required=REQUIRED,
    string_limit=None,
    map_limit=None,
    response_checks={
        "NodePrepareResources": (_every_claim_answered,),
        "NodeUnprepareResources": (_every_claim_answered,),
    },
)
