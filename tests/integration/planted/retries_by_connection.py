"""A call whose request has no fields retried after UNIMPLEMENTED (CSI v1.12 §Error Scheme,
§NodeGetInfo errors; CSI v0.3 §NodeGetId and §NodeGetInfo errors: "Caller MUST NOT
retry"). Every caller sends the same bytes, so only the connection tells a retry from
another caller's first call."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_builders import v1_background
from tests.integration.planted.harness import Case, Step


def case(spec: str, statements: tuple[str, ...], rpc: str, background: dict[str, Any]) -> Case:
    refused = Step(rpc, error=("UNIMPLEMENTED", f"{rpc} is not served"))
    again = Step(rpc, error=("UNIMPLEMENTED", f"{rpc} is not served"), wait=0.05)
    other = Step(rpc, error=("UNIMPLEMENTED", f"{rpc} is not served"), new_connection=True)
    return Case(
        spec,
        statements,
        "csi.retry-without-change",
        breach=(refused, again),
        twin=(refused, other),  # another caller's first call
        background=background,
        party="co",
        # CSI v0.3 node plugins MUST serve both: the plugin's refusal is its own breach
        twin_allows=("csi.unimplemented-advertised",),
        variant="same-connection",
    )


V0 = {"GetPluginCapabilities": {"capabilities": []}}
CASES = [
    case("csi.v1", ("NodeGetInfo-Errors.2",), "NodeGetInfo", v1_background()),
    case("csi.v0", ("NodeGetId-Errors.3", "NodeGetId-Errors.4"), "NodeGetId", V0),
    case("csi.v0", ("NodeGetInfo-Errors.3", "NodeGetInfo-Errors.4"), "NodeGetInfo", V0),
]
