"""What the DRA kubelet plugin API states alike in v1beta1 and v1: one set of rules, each
version's table citing its own file.

REQUIRED fields, as the API's comments call them: a Claim's ``namespace``, ``uid`` and
``name`` (kubelet sends them) and a Device's ``pool_name`` and ``device_name`` (the plugin
answers them). The answer's ``claims`` map is keyed by claim uid and holds the claims "for
which preparation was done or attempted": every claim of the request must have an entry
(NodeUnprepareResourcesResponse: "even if that entry is nil"; NodePrepareResourcesResponse:
"it is an error if some claim ... does not get prepared"), and an entry for a claim the
request did not name is a claim nobody asked to prepare (kubelet fails the call for it).
A claim's own failure is its entry's ``error``, not a violation. The API states no size
limits and no error scheme. v1 adds ``Device.share_id``, optional, which nothing judges.
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
    list_length,
    malformed_message_rule,
)

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.state import SpecState

FILE = "api.proto"
FAMILY = "dra"

REQUIRED: dict[str, tuple[str, ...]] = {
    "Claim": ("namespace", "uid", "name"),
    "Device": ("pool_name", "device_name"),
}


def rules(title: str) -> tuple[Rule, ...]:
    """The rules of the version called ``title`` ("DRA v1"), cited in its file."""
    return (
        Rule(
            "dra.required-field",
            MUST,
            (CO, PLUGIN),
            f"{title} {FILE} §{{rpc}}",
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
            f"{title} {FILE} §{{rpc}}Response",
            "The answer's claims map has no entry for a claim uid of the request.",
            reject_code=None,
            note="kubelet calls NodePrepareResources again for claims left out; the API still"
            " calls it an error.",
        ),
        Rule(
            "dra.claim-not-requested",
            MUST,
            (PLUGIN,),
            f"{title} {FILE} §{{rpc}}Response",
            "The answer's claims map has an entry for a claim uid the request did not name.",
            reject_code=None,
            note="The map holds the claims the call prepared or attempted, keyed by uid;"
            " kubelet fails the call, prepare or unprepare, when it finds an entry it did not"
            " ask for.",
        ),
        malformed_message_rule(FAMILY, f"{title} {FILE} §{{rpc}}", None),
    )


def _listed(items: list[str]) -> str:
    return ", ".join(items[:5]) + (" …" if len(items) > 5 else "")


def every_claim_answered(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    if list_length(call, resp, "claims") > len(resp.claims):
        return  # a sampled answer: the entries left out may be the ones looked for
    missing = [i for i, c in enumerate(req.claims) if c.uid and c.uid not in resp.claims]
    if missing:
        yield Violation(
            cs.rule("claim-not-answered"),
            "claims",
            f"claims has no entry for {len(missing)} of the {len(req.claims)} requested"
            f" claims (the request's {_listed([f'claims[{i}]' for i in missing])})",
        )


def only_requested_claims(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    asked = {c.uid for c in req.claims}
    extra = sum(1 for uid in resp.claims if uid not in asked)
    if extra:
        # Counted, not quoted: a uid is the plugin's string and violations never quote one.
        yield Violation(
            cs.rule("claim-not-requested"),
            "claims",
            f"claims has {extra} entr{'y' if extra == 1 else 'ies'} keyed by a uid none of"
            f" the request's {len(req.claims)} claims has",
        )


def table(spec: str, title: str, package: str) -> SpecTable:
    """The table of DRA version ``spec`` (package ``package``)."""
    checks = (every_claim_answered, only_requested_claims)
    return SpecTable(
        spec=spec,
        family=FAMILY,
        title=title,
        package=package,
        rules=rules(title),
        required=REQUIRED,
        string_limit=None,
        map_limit=None,
        response_checks={"NodePrepareResources": checks, "NodeUnprepareResources": checks},
    )
