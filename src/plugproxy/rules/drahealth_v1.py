"""Rule table of DRA device health v1 (package v1, service DRAResourceHealth).

Its statements are the other version's (:mod:`plugproxy.rules.drahealth_common`); a
plugin serving both gets each stream judged by the version kubelet opened it in.
"""

from __future__ import annotations

from plugproxy.rules import drahealth_common

TITLE = "DRA health v1"

TABLE = drahealth_common.table("drahealth.v1", TITLE, "v1")
