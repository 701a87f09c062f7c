"""tools/spec_statements.py: every normative statement of each spec text has an entry in the
coverage matrix (spec-coverage/), every entry names real rules, every rule answers a statement."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "spec_statements.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spec_statements", TOOL)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["spec_statements"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


statements = _load()
SPECS = sorted(statements.SPEC_TEXTS)

# The share of checkable statements whose rules catch every breach the socket can show, as
# reached, rounded down. A reading that plants a breach for each claim lowers it where a
# claim did not hold (the 2026-11-27 reading did, by half for CMI); rules raise it again.
FULL_FLOOR = {
    "csi_v1": 0.61,
    "csi_v0": 0.63,
    "cosi_v1alpha1": 0.69,
    "cosi_v1alpha2": 0.64,
    "cmi_v1": 0.56,
}
# The goal: 95 % judged as far as the socket shows (covered, or all that is left is off the
# wire) for every spec. It holds for all of them; these floors only ever rise.
AS_FAR_AS_VISIBLE_FLOOR = {
    "csi_v1": 0.95,
    "csi_v0": 0.97,
    "cosi_v1alpha1": 0.97,
    "cosi_v1alpha2": 0.98,
    "cmi_v1": 0.95,
}

SAMPLE = """# Title

## Notational Conventions

The keywords "MUST" and `SHOULD` are mentioned here, not required.

## Thing

A plugin MUST do one thing. It MAY do another.
The CO SHOULD NOT
wrap this sentence. Plain text.

* A list item that SHALL hold.

| Condition | Code | Recovery |
|---|---|---|
| Bad thing | 3 INVALID_ARGUMENT | Caller MUST fix it. |

```protobuf
message ThingRequest {
  // The id. This field is REQUIRED.
  string id = 1;

  // A nested message, RECOMMENDED.
  message Inner {
    // Inner MUST hold.
    string x = 1;
  }
}
```
"""


def test_extract_finds_each_normative_sentence_with_its_place():
    found = statements.extract(SAMPLE)
    by_id = {s.id: s for s in found}
    assert list(by_id) == [
        "Thing.1",
        "Thing.2",
        "Thing.3",
        "Thing.4",
        "Thing.5",
        "Thing.6",
        "Thing.7",
    ]
    assert by_id["Thing.1"].text == "A plugin MUST do one thing."
    assert by_id["Thing.1"].level == "MUST"
    # a sentence wrapped over two lines is one statement, starting where it starts
    assert by_id["Thing.2"].text == "The CO SHOULD NOT wrap this sentence."
    assert (by_id["Thing.2"].level, by_id["Thing.2"].line) == ("SHOULD", 10)
    assert by_id["Thing.3"].text == "A list item that SHALL hold."
    # a table row's statement names the row's condition and code
    assert by_id["Thing.4"].context == "Bad thing / 3 INVALID_ARGUMENT"
    # protobuf comments name what they document
    assert (by_id["Thing.5"].context, by_id["Thing.5"].text) == (
        "ThingRequest.id",
        "This field is REQUIRED.",
    )
    assert by_id["Thing.6"].context == "ThingRequest.Inner"
    assert by_id["Thing.7"].context == "ThingRequest.Inner.x"


def test_quoted_keywords_are_mentions_not_requirements():
    assert not [s for s in statements.extract(SAMPLE) if s.section == "Notational Conventions"]


def test_ids_are_stable_and_unique_in_every_spec():
    for spec in SPECS:
        first = statements.statements(spec)
        ids = [s.id for s in first]
        assert len(ids) == len(set(ids)), spec
        assert [s.id for s in statements.statements(spec)] == ids


def test_entry_problems_catch_unanswered_and_contradictory_entries():
    entry = statements.Entry
    assert statements.entry_problems(entry("x", "c", "plugin", rules=("csi.size-limit",))) == [
        "class c (not judgeable) names rules",
        "class c needs a why",
    ]
    assert statements.entry_problems(entry("x", "a", "co")) == [
        "a checkable statement without rules needs a why",
        "a partial or unjudged statement needs rest (off-wire or gap)",
    ]
    assert statements.entry_problems(entry("x", "d", "co", why="w")) == [
        "class 'd' is not one of a, b, c"
    ]
    assert not statements.entry_problems(entry("x", "a", "co", rules=("csi.size-limit",)))


def test_what_is_left_of_a_partial_or_unjudged_statement_is_off_wire_or_a_gap():
    entry = statements.Entry
    partial = entry("x", "b", "co", rules=("csi.call-order",), partial="p")
    assert statements.entry_problems(partial) == [
        "a partial or unjudged statement needs rest (off-wire or gap)"
    ]
    assert statements.entry_problems(entry("x", "a", "co", why="w", rest="maybe")) == [
        "rest 'maybe' is not one of off-wire, gap"
    ]
    assert not statements.entry_problems(
        entry("x", "b", "co", rules=("csi.call-order",), partial="p", rest="gap")
    )
    assert not statements.entry_problems(entry("x", "a", "co", why="w", rest="off-wire"))
    full = entry("x", "a", "co", rules=("csi.size-limit",), rest="gap")
    assert statements.entry_problems(full) == [
        "rest on a statement that is fully covered or not checkable"
    ]
    assert statements.entry_problems(entry("x", "c", "co", why="w", rest="off-wire")) == [
        "rest on a statement that is fully covered or not checkable"
    ]


def test_counts_split_partial_and_unjudged_by_what_is_left():
    entry = statements.Entry
    entries = {
        e.id: e
        for e in (
            entry("full", "a", "co", rules=("r",)),
            entry("po", "b", "co", rules=("r",), partial="p", rest="off-wire"),
            entry("pg", "b", "co", rules=("r",), partial="p", rest="gap"),
            entry("pg2", "a", "co", rules=("r",), partial="p", rest="gap"),
            entry("mo", "a", "co", why="w", rest="off-wire"),
            entry("mg", "a", "co", why="w", rest="gap"),
            entry("c", "c", "other", why="w"),
        )
    }
    c = statements.count(entries)
    assert (c.statements, c.checkable, c.full) == (7, 6, 1)
    assert (c.partial_off_wire, c.partial_gap, c.missing_off_wire, c.missing_gap) == (1, 2, 1, 1)
    assert (c.partial, c.missing) == (3, 2)
    assert c.full_ratio == 1 / 6
    assert c.visible_ratio == 3 / 6


def test_a_missing_entry_an_unknown_rule_and_an_unnamed_rule_are_problems():
    entries = statements.load_matrix("cmi_v1")
    sid = next(iter(entries))
    broken = dict(entries)
    del broken[sid]
    assert f"{sid}: no entry" in statements.matrix_problems("cmi_v1", broken)
    other = next(e for e in entries.values() if e.rules)
    renamed = {**entries, other.id: statements.Entry(other.id, other.cls, other.party, ("x.y",))}
    problems = statements.matrix_problems("cmi_v1", renamed)
    assert f"{other.id}: unknown rule x.y" in problems
    cited = {r for e in entries.values() for r in e.rules}
    lonely = sorted(cited)[0]
    without = {
        sid: statements.Entry(e.id, e.cls, e.party, (), why="w") if lonely in e.rules else e
        for sid, e in entries.items()
    }
    assert f"rule {lonely}: no statement names it" in statements.matrix_problems("cmi_v1", without)


@pytest.mark.parametrize("spec", SPECS)
def test_every_statement_has_an_entry_and_every_rule_a_statement(spec):
    problems = statements.matrix_problems(spec)
    assert not problems, "\n".join(problems[:40])


@pytest.mark.parametrize("spec", SPECS)
def test_checkable_statements_are_covered(spec):
    counts = statements.count(statements.load_matrix(spec))
    assert counts.full_ratio >= FULL_FLOOR[spec], counts


@pytest.mark.parametrize("spec", SPECS)
def test_checkable_statements_are_judged_as_far_as_the_socket_shows(spec):
    counts = statements.count(statements.load_matrix(spec))
    assert counts.visible_ratio >= AS_FAR_AS_VISIBLE_FLOOR[spec], counts


@pytest.mark.parametrize("spec", SPECS)
def test_every_partial_or_unjudged_statement_says_what_is_left(spec):
    entries = statements.load_matrix(spec)
    left = [e for e in entries.values() if e.needs_rest]
    assert left, spec
    assert all(e.rest in statements.RESTS for e in left), [e.id for e in left if not e.rest]
    assert all((e.partial or e.why) for e in left)


def test_coverage_page_lists_the_gaps_and_what_is_left():
    page = statements.render_coverage()
    assert "| Partial, off-wire | Partial, gap | Not judged, off-wire | Not judged, gap |" in page
    gaps = page.split("## What a rule could still catch", 1)[1].split("\n## CSI v1.12", 1)[0]
    for spec in SPECS:
        for e in statements.load_matrix(spec).values():
            if e.needs_rest and e.rest == "gap":
                assert f"| `{e.id}` |" in gaps, (spec, e.id)
    assert "| `Probe-Errors.3` |" not in gaps  # off-wire: the CO's belief, not a call
    assert "| off-wire | CO follows Probe recovery rows |" in page


def test_the_tool_takes_a_spec_as_serve_names_it_or_as_its_matrix_file(capsys):
    # docs/coverage.md says `tools/spec_statements.py list SPEC`; a reader types csi.v1.
    assert statements._main(["list", "cosi.v1alpha1"]) == 0
    dotted = capsys.readouterr().out
    assert statements._main(["list", "cosi_v1alpha1"]) == 0
    assert capsys.readouterr().out == dotted
    assert dotted.count("\n") == len(statements.statements("cosi_v1alpha1"))
