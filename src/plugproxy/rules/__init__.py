"""Spec rule tables (one module per spec) and the engine that compiles them.

A table's module is imported the first time its table is asked for: a proxy judging only
CSI v1 calls never loads the tables of the other specs. Spec ``a.b`` has its table in module
``a_b`` and its rule ids start with ``a.`` (its family); a table merges the rule families
of its spec (for CSI ``csi_common``, ``csi_volumes``, ``csi_snapshots`` and the others). The
generic rules of every spec, which the validate stage tells each step of a call, are
:mod:`~plugproxy.rules.generic`; what it writes of the violations it records is
:mod:`~plugproxy.rules.violationlog`.

May import: :mod:`plugproxy.core`, :mod:`plugproxy.api`, :mod:`plugproxy.spec`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from plugproxy.rules.engine import Rule, SpecTable
from plugproxy.spec.registry import SPEC_NAMES


class _Tables(Mapping[str, SpecTable]):
    """Bundled spec name -> its rule table, imported on first use."""

    def __getitem__(self, spec: str) -> SpecTable:
        if spec not in SPEC_NAMES:
            raise KeyError(spec)
        table: SpecTable = importlib.import_module(f"{__name__}.{spec.replace('.', '_')}").TABLE
        return table

    def __iter__(self) -> Iterator[str]:
        return iter(SPEC_NAMES)

    def __len__(self) -> int:
        return len(SPEC_NAMES)


TABLES: Mapping[str, SpecTable] = _Tables()


def all_rules() -> dict[str, Rule]:
    """Every rule id of every table (csi.* rules are shared by csi.v1 and csi.v0)."""
    out: dict[str, Rule] = {}
    for table in TABLES.values():
        for rule in table.rules:
            out.setdefault(rule.id, rule)
    return out


def find_rule(rule_id: str) -> Rule | None:
    """The bundled rule with this id, importing only the tables of its family."""
    family = rule_id.partition(".")[0]
    for spec in SPEC_NAMES:
        if spec.partition(".")[0] == family:
            for rule in TABLES[spec].rules:
                if rule.id == rule_id:
                    return rule
    return None
