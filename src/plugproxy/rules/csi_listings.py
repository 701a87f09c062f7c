"""CSI paged listings (ListVolumes, ListSnapshots; CSI v1.12 and v0.3): a listing restarted
after the plugin refused its starting_token with ABORTED.

Only the refused token itself is remembered, as a digest, in :class:`ListingMemory` (a
bounded count of tokens, forgotten with the lifecycle's hour); a token the plugin hands out
again as a next_token is valid again. Merged after the families whose response checks read
the same listings (csi_volumes, csi_snapshots): a page's token is forgotten after they ran.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import ExpiringMap, ago, digest
from plugproxy.rules.engine import CO, SHOULD, Hooks, Rule, Violation

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState

ABORTED_TOKENS = 1024  # listing tokens remembered as refused (ABORTED)
LISTINGS = ("ListVolumes", "ListSnapshots")


class ListingMemory:
    """Tokens the plugin refused, per spec table."""

    def __init__(self, st: SpecState) -> None:
        self.clock = st.clock
        # (rpc, starting_token digest) -> when the plugin answered it ABORTED
        self.aborted: ExpiringMap[tuple[str, bytes], float] = ExpiringMap(
            ABORTED_TOKENS, st.lifecycle_ttl, st.clock
        )


def _mem(st: SpecState) -> ListingMemory:
    return st.part(ListingMemory)


def list_request(cs: CompiledSpec, st: SpecState, call: Call, req: Any) -> Iterable[Violation]:
    mem = _mem(st)
    if not mem.aborted or not req.starting_token:
        return
    at = mem.aborted.get((call.method.name, digest(req.starting_token.encode())))
    if at is not None:
        yield Violation(
            cs.rule("list-restart-expected"),
            "starting_token",
            f"starting_token is the one {call.method.name} answered ABORTED (invalid)"
            f" {ago(mem.clock() - at)}; the listing SHOULD start again with an empty"
            " starting_token",
        )


def list_response(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
) -> Iterable[Violation]:
    # A token the plugin hands out again is valid again.
    mem = _mem(st)
    if mem.aborted and resp.next_token:
        mem.aborted.pop((call.method.name, digest(resp.next_token.encode())), None)
    return ()


def list_error(
    cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
) -> Iterable[Violation]:
    if code == "ABORTED" and req.starting_token:
        mem = _mem(st)
        key = (call.method.name, digest(req.starting_token.encode()))
        mem.aborted[key] = mem.clock()
    return ()


def hooks(title: str) -> Hooks:
    """The family's rule and checks for the CSI version cited as ``title``."""
    rule = Rule(
        "csi.list-restart-expected",
        SHOULD,
        (CO,),
        f"{title} §{{rpc}}",
        "ListVolumes or ListSnapshots passes again a starting_token the plugin answered"
        " ABORTED (invalid) for; the listing SHOULD start again with an empty token.",
        reject_code=None,
        note="Only the refused token itself is judged, unless the plugin hands it out again"
        " as a next_token: other callers may page with their own tokens meanwhile.",
    )
    return Hooks(
        rules=(rule,),
        request_checks={rpc: (list_request,) for rpc in LISTINGS},
        response_checks={rpc: (list_response,) for rpc in LISTINGS},
        on_error={rpc: (list_error,) for rpc in LISTINGS},
    )
