"""Spec rule tables (one module per spec) and the engine that compiles them."""

from __future__ import annotations

from plugproxy.rules import (
    cmi_v1,
    cosi_v1alpha1,
    csi_v0,
    csi_v1,
    deviceplugin_v1beta1,
    dra_v1beta1,
    kms_v2,
    pluginregistration_v1,
)
from plugproxy.rules.engine import Rule, SpecTable

TABLES: dict[str, SpecTable] = {
    t.spec: t
    for t in (
        csi_v1.TABLE,
        csi_v0.TABLE,
        cosi_v1alpha1.TABLE,
        cmi_v1.TABLE,
        kms_v2.TABLE,
        deviceplugin_v1beta1.TABLE,
        dra_v1beta1.TABLE,
        pluginregistration_v1.TABLE,
    )
}


def all_rules() -> dict[str, Rule]:
    """Every rule id of every table (csi.* rules are shared by csi.v1 and csi.v0)."""
    out: dict[str, Rule] = {}
    for table in TABLES.values():
        for rule in table.rules:
            out.setdefault(rule.id, rule)
    return out
