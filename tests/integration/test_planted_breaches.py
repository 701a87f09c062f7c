"""Every covered statement of the coverage matrix (spec-coverage/) holds against a planted
breach: the breach sent through a real proxy is reported under the statement's rule, and
the nearest legitimate variant passes an enforcing proxy untouched and unreported."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import pkgutil
import sys
from types import ModuleType

import pytest

from tests.integration import planted
from tests.integration.planted.harness import (
    SPEC_OF_MATRIX,
    Case,
    describe,
    expected_code,
    run_steps,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    if "spec_statements" in sys.modules:
        return sys.modules["spec_statements"]
    spec = importlib.util.spec_from_file_location(
        "spec_statements", ROOT / "tools" / "spec_statements.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["spec_statements"] = module
    spec.loader.exec_module(module)
    return module


def _cases() -> list[Case]:
    out: list[Case] = []
    for info in pkgutil.iter_modules(planted.__path__):
        module = importlib.import_module(f"{planted.__name__}.{info.name}")
        out.extend(getattr(module, "CASES", ()))  # harness and builders hold none
    return out


CASES = _cases()
MATRIX = {name: _tool().load_matrix(matrix) for matrix, name in SPEC_OF_MATRIX.items()}


def test_every_covered_statement_has_a_planted_breach():
    planted_ids = {(c.spec, s) for c in CASES for s in c.statements}
    missing = {
        spec: sorted(sid for sid, e in entries.items() if e.full and (spec, sid) not in planted_ids)
        for spec, entries in MATRIX.items()
    }
    assert not any(missing.values()), missing


def test_each_case_names_a_judged_statement_and_one_of_its_rules():
    problems = []
    for case in CASES:
        for sid in case.statements:
            entry = MATRIX[case.spec].get(sid)
            if entry is None:
                problems.append(f"{case.id}: no statement {sid}")
            elif case.rule not in entry.rules:
                problems.append(f"{case.id}: {sid} names {entry.rules}, not {case.rule}")
    assert not problems, "\n".join(problems)


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_breach_is_reported_and_twin_is_silent(case: Case):
    breach = await run_steps(case, case.breach, "audit")
    assert case.rule in breach.rules(), (
        f"breach of {case.statements} not reported as {case.rule}:\n{describe(breach)}"
    )
    if case.party:
        parties = {v["party"] for v in breach.violations if v["rule"] == case.rule}
        assert case.party in parties, parties
    twin = await run_steps(case, case.twin, "enforce")
    assert case.rule not in case.twin_allows
    unexpected = [v for v in twin.violations if v["rule"] not in case.twin_allows]
    assert not unexpected, f"twin of {case.id} reported:\n{describe(twin)}"
    assert [c.split(":")[0] for c in twin.codes] == [expected_code(s) for s in case.twin], (
        twin.codes
    )
