"""Rule table of the DRA kubelet plugin API v1beta1 (package k8s.io.kubelet.pkg.apis.dra.v1beta1).

Its statements are v1's (:mod:`plugproxy.rules.dra_common`); a plugin serving both gets
each call judged by the version it was made in.
"""

from __future__ import annotations

from plugproxy.rules import dra_common

TITLE = "DRA v1beta1"

TABLE = dra_common.table("dra.v1beta1", TITLE, "k8s.io.kubelet.pkg.apis.dra.v1beta1")
