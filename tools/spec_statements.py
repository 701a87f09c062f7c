"""The normative statements of a spec text, and the coverage matrix that answers each.

A statement is one sentence of a spec's markdown that holds an RFC 2119 keyword in capitals
(MUST, MUST NOT, SHALL, SHALL NOT, REQUIRED, SHOULD, SHOULD NOT, RECOMMENDED), in prose, a
list item, a table row or a comment of the spec's protobuf listings. A keyword in quotes or
backticks is a mention, not a requirement. Each statement gets a stable id from its section
and its rank in that section (``CreateVolume.3``); statements in a protobuf listing also
name the message or field the comment belongs to.

The matrix (``spec-coverage/<spec>.toml``) gives every statement an entry: its class
(``a`` checkable from one call, ``b`` checkable with state seen on the socket, ``c`` not
judgeable from the socket), the party it binds, and the rules that implement it or why a
proxy cannot judge it. A checkable statement the rules catch only in part (or not at all)
says what is left (``rest``): ``off-wire`` when no sequence of calls and answers on the
socket could show the rest of a breach (backend or host state, CO-internal decisions, calls
on other sockets or replicas), ``gap`` when some uncaught breach is on the wire and a rule
could catch it. tests/test_spec_coverage.py holds the two together.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from plugproxy.rules import TABLES  # noqa: E402

# The spec texts sit in shared/specs beside the checkout, or beside one of its parents.
SPECS = next(
    (d / "shared" / "specs" for d in ROOT.parents if (d / "shared" / "specs").is_dir()),
    ROOT.parent / "shared" / "specs",
)
MATRIX_DIR = ROOT / "spec-coverage"

# spec name -> (title, spec text relative to SPECS)
SPEC_TEXTS: dict[str, tuple[str, str]] = {
    "csi_v1": ("CSI v1.12", "csi/spec-v1.12.0.md"),
    "csi_v0": ("CSI v0.3", "csi/spec-v0.3.0.md"),
    "cosi_v1alpha1": ("COSI v1alpha1", "cosi/spec-v1alpha1.md"),
    "cosi_v1alpha2": ("COSI v1alpha2", "cosi/spec-v1alpha2.md"),
    "cmi_v1": ("CMI v1", "cmi/spec.md"),
}

_KEYWORD = re.compile(
    r"\b(MUST NOT|MUST|SHALL NOT|SHALL|REQUIRED|SHOULD NOT|SHOULD|NOT RECOMMENDED|RECOMMENDED)\b"
)
# Spans of a spec text where requirements are written in lower case ("must", "should"),
# by spec: (first line, last line). Their statements get ids ``<section>.lc<n>`` so that
# the ids of the statements in capitals do not move.
LOWER_CASE_SPANS: dict[str, tuple[tuple[int, int], ...]] = {
    "csi_v1": ((3135, 3445),),  # GetVolumeGroupSnapshot prose, the SnapshotMetadata service
    "cosi_v1alpha1": ((180, 200),),  # the Provisioner service's comments
    "cosi_v1alpha2": ((460, 700),),  # the id fields' "must be at most 2048 characters"
}
_LOWER_KEYWORD = re.compile(r"\b(must not|must|shall not|shall|should not|should)\b")
# A keyword in quotes or backticks is named, not required ("MUST", `REQUIRED`).
_MENTION = re.compile(
    r"[\"`“]\s*(?:MUST NOT|MUST|SHALL NOT|SHALL|REQUIRED|SHOULD NOT|SHOULD|NOT RECOMMENDED"
    r"|RECOMMENDED|MAY|OPTIONAL)\s*[\"`”]"
)
_MUST_WORDS = {"MUST", "MUST NOT", "SHALL", "SHALL NOT", "REQUIRED"}
# A sentence ends at '.', '!' or '?' before a capital, a quote or a bracket; "e.g." does not.
_SENTENCE = re.compile(r"\S(?:.*?)(?:(?<=[.!?])(?<!e\.g\.)(?<!i\.e\.)(?=\s+[A-Z`\"(*])|$)")
_HEADING = re.compile(r"^(#+)\s+(.*)$")
_LIST_ITEM = re.compile(r"^\s*([*-]|\d+\.)\s+")
_PROTO_BLOCK = re.compile(r"^\s*(message|service|enum|oneof)\s+(\w+)\s*\{")
_PROTO_RPC = re.compile(r"^\s*rpc\s+(\w+)\s*\(")
_PROTO_FIELD = re.compile(r"^\s*(?:repeated\s+|optional\s+)?([\w.<>, ]+?)\s+(\w+)\s*=\s*\d+")

CLASSES = ("a", "b", "c")
CHECKABLE = ("a", "b")
PARTIES = ("co", "plugin", "both", "other")
OFF_WIRE, GAP = "off-wire", "gap"
RESTS = (OFF_WIRE, GAP)  # what is left of a statement the rules catch only in part


@dataclass(frozen=True, slots=True)
class Statement:
    id: str
    section: str
    line: int  # 1-based line of the spec text where the sentence starts
    level: str  # MUST or SHOULD (the strongest keyword of the sentence)
    keywords: tuple[str, ...]
    context: str  # message, field or RPC of a protobuf comment; "" in prose
    text: str


def _slug(heading: str) -> str:
    words = re.sub(r"[^A-Za-z0-9]+", " ", heading).split()
    return "-".join(words) or "top"


def _keywords(sentence: str) -> tuple[str, ...]:
    return tuple(_KEYWORD.findall(_MENTION.sub("", sentence)))


@dataclass
class _Paragraph:
    line: int
    section: str
    context: str
    lines: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)  # the spec line of each of ``lines``

    def add(self, number: int, text: str) -> None:
        self.lines.append(text)
        self.numbers.append(number)

    def sentences(self) -> list[tuple[int, str]]:
        """(spec line where it starts, sentence) for each sentence of the paragraph."""
        text, starts = "", []
        for number, line in zip(self.numbers, self.lines, strict=True):
            if text:
                text += " "
            starts.append((len(text), number))
            text += line
        out = []
        for match in _SENTENCE.finditer(text):
            sentence = match.group(0).strip()
            line = max((n for offset, n in starts if offset <= match.start()), default=self.line)
            out.append((line, sentence))
        return out


def _paragraphs(text: str) -> list[_Paragraph]:
    """Prose paragraphs, list items, table rows and protobuf comment blocks, in order."""
    out: list[_Paragraph] = []
    section = "top"
    current: _Paragraph | None = None
    in_code = False
    scopes: list[str] = []  # protobuf nesting inside a listing
    pending: _Paragraph | None = None  # a comment block waiting for what it documents

    def close() -> None:
        nonlocal current
        if current is not None and current.lines:
            out.append(current)
        current = None

    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if line.lstrip().startswith("```"):
            close()
            in_code = not in_code
            scopes = []
            pending = None
            continue
        if in_code:
            stripped = line.strip()
            if stripped.startswith("//"):
                body = stripped[2:].strip()
                if not body:  # an empty comment line ends a paragraph of the comment
                    if pending is not None and pending.lines:
                        out.append(pending)
                    pending = None
                    continue
                if pending is None:
                    pending = _Paragraph(number, section, ".".join(scopes))
                pending.add(number, body)
                continue
            # What the comment documents names it: a field, a nested type, an RPC.
            target = ""
            block = _PROTO_BLOCK.match(line)
            rpc = _PROTO_RPC.match(line)
            decl = _PROTO_FIELD.match(line)
            if block:
                target = block.group(2)
            elif rpc:
                target = rpc.group(1)
            elif decl:
                target = decl.group(2)
            if pending is not None:
                if target:
                    pending.context = ".".join([*scopes, target])
                out.append(pending)
                pending = None
            if block and block.group(1) != "oneof":
                scopes.append(block.group(2))
            elif stripped.startswith("}") and scopes and not stripped.startswith("})"):
                scopes.pop()
            continue
        heading = _HEADING.match(line)
        if heading:
            close()
            section = heading.group(2).strip()
            continue
        if not line.strip():
            close()
            continue
        if line.lstrip().startswith("|"):
            close()
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            row = " / ".join(c.replace("`", "") for c in cells[:2] if c)  # condition, code
            for cell in cells:  # each cell, one paragraph; the row names its condition
                if cell:
                    current = _Paragraph(number, section, row if len(cells) > 2 else "")
                    current.add(number, cell.strip())
                    close()
            continue
        if _LIST_ITEM.match(line):
            close()
            current = _Paragraph(number, section, "")
            current.add(number, _LIST_ITEM.sub("", line).strip())
            continue
        if current is None:
            current = _Paragraph(number, section, "")
        current.add(number, line.strip())
    close()
    return out


def extract(text: str, lower_case: tuple[tuple[int, int], ...] = ()) -> list[Statement]:
    """Every normative sentence of ``text``, with ids unique in the spec; in the
    ``lower_case`` line spans, sentences with lower-case keywords too."""
    ranks: Counter[str] = Counter()
    out: list[Statement] = []
    for para in _paragraphs(text):
        for line, sentence in para.sentences():
            keywords = _keywords(sentence)
            slug = _slug(para.section)
            rank = ""
            if keywords:
                ranks[slug] += 1
                rank = str(ranks[slug])
            elif any(first <= line <= last for first, last in lower_case):
                keywords = tuple(
                    k.upper() for k in _LOWER_KEYWORD.findall(_MENTION.sub("", sentence))
                )
                if keywords:
                    ranks[slug + "/lc"] += 1
                    rank = f"lc{ranks[slug + '/lc']}"
            if not keywords:
                continue
            level = "MUST" if any(k in _MUST_WORDS for k in keywords) else "SHOULD"
            out.append(
                Statement(
                    id=f"{slug}.{rank}",
                    section=para.section.replace("`", ""),
                    line=line,
                    level=level,
                    keywords=keywords,
                    context=para.context,
                    text=sentence,
                )
            )
    return out


def statements(spec: str) -> list[Statement]:
    text = (SPECS / SPEC_TEXTS[spec][1]).read_text(encoding="utf-8")
    return extract(text, LOWER_CASE_SPANS.get(spec, ()))


@dataclass(frozen=True, slots=True)
class Entry:
    """How the project answers one statement."""

    id: str
    cls: str
    party: str
    rules: tuple[str, ...] = ()
    partial: str = ""  # what of the statement the rules miss; empty when fully covered
    why: str = ""  # why a proxy cannot judge it (class c), or why it is not judged yet
    rest: str = ""  # partial or not judged: off-wire, or gap (a rule could catch more)
    what: str = ""  # the statement in a few words of our own

    @property
    def full(self) -> bool:
        return self.cls in CHECKABLE and bool(self.rules) and not self.partial

    @property
    def needs_rest(self) -> bool:
        """A checkable statement the rules do not fully catch says what is left."""
        return self.cls in CHECKABLE and not self.full


def matrix_files(spec: str) -> list[pathlib.Path]:
    """The matrix of a spec: ``<spec>.toml``, or parts ``<spec>.<part>.toml``."""
    return sorted(MATRIX_DIR.glob(f"{spec}.toml")) + sorted(MATRIX_DIR.glob(f"{spec}.*.toml"))


def unstated_rules(spec: str) -> dict[str, str]:
    """Rules whose requirement the spec states without an RFC keyword -> where and how.

    A matrix file's ``[unstated]`` table: ``"csi.name-banned-characters" = "line 818: ..."``.
    """
    out: dict[str, str] = {}
    for path in matrix_files(spec):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        out.update(data.get("unstated", {}))
    return out


def load_matrix(spec: str) -> dict[str, Entry]:
    raw_entries: dict[str, dict[str, object]] = {}
    for path in matrix_files(spec):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        for sid, raw in data.get("statements", {}).items():
            if sid in raw_entries:
                raise ValueError(f"{path.name}: {sid} has an entry in another part too")
            raw_entries[sid] = raw
    entries: dict[str, Entry] = {}
    for sid, raw in raw_entries.items():
        entries[sid] = Entry(
            id=sid,
            cls=raw.get("class", ""),
            party=raw.get("party", ""),
            rules=tuple(raw.get("rules", ())),  # type: ignore[arg-type]
            partial=raw.get("partial", ""),
            why=raw.get("why", ""),
            rest=raw.get("rest", ""),
            what=raw.get("what", ""),
        )
    return entries


def entry_problems(entry: Entry) -> list[str]:
    """What is wrong with one entry on its own."""
    problems = []
    if entry.cls not in CLASSES:
        problems.append(f"class {entry.cls!r} is not one of {', '.join(CLASSES)}")
    if entry.party not in PARTIES:
        problems.append(f"party {entry.party!r} is not one of {', '.join(PARTIES)}")
    if entry.cls == "c" and entry.rules:
        problems.append("class c (not judgeable) names rules")
    if entry.cls == "c" and not entry.why:
        problems.append("class c needs a why")
    if entry.cls in CHECKABLE and not entry.rules and not entry.why:
        problems.append("a checkable statement without rules needs a why")
    if entry.partial and not entry.rules:
        problems.append("partial without rules")
    if entry.needs_rest and entry.rest not in RESTS:
        problems.append(
            f"rest {entry.rest!r} is not one of {', '.join(RESTS)}"
            if entry.rest
            else f"a partial or unjudged statement needs rest ({' or '.join(RESTS)})"
        )
    if entry.rest and not entry.needs_rest:
        problems.append("rest on a statement that is fully covered or not checkable")
    return problems


@dataclass(frozen=True)
class Counts:
    statements: int
    checkable: int
    full: int
    partial_off_wire: int  # partial; the rest cannot show on the socket
    partial_gap: int  # partial; a rule could catch more
    missing_off_wire: int  # no rule; nothing of it shows on the socket
    missing_gap: int  # no rule; a rule could catch it

    @property
    def partial(self) -> int:
        return self.partial_off_wire + self.partial_gap

    @property
    def missing(self) -> int:
        return self.missing_off_wire + self.missing_gap

    @property
    def full_ratio(self) -> float:
        return self.full / self.checkable if self.checkable else 1.0

    @property
    def visible_ratio(self) -> float:
        """Judged as far as the socket shows: full, or all that is left is off the wire."""
        judged = self.full + self.partial_off_wire + self.missing_off_wire
        return judged / self.checkable if self.checkable else 1.0


def count(entries: dict[str, Entry]) -> Counts:
    checkable = [e for e in entries.values() if e.cls in CHECKABLE]
    left = Counter((bool(e.rules), e.rest == OFF_WIRE) for e in checkable if not e.full)
    return Counts(
        statements=len(entries),
        checkable=len(checkable),
        full=sum(1 for e in checkable if e.full),
        partial_off_wire=left[True, True],
        partial_gap=left[True, False],
        missing_off_wire=left[False, True],
        missing_gap=left[False, False],
    )


def rule_ids(spec: str) -> set[str]:
    """The ids of the rules the spec's table holds."""
    return {r.id for r in TABLES[spec.replace("_", ".", 1)].rules}


def matrix_problems(spec: str, entries: dict[str, Entry] | None = None) -> list[str]:
    """Every way the matrix and the spec text or the rule table disagree."""
    entries = load_matrix(spec) if entries is None else entries
    wanted = {s.id for s in statements(spec)}
    known_rules = rule_ids(spec)
    problems = [f"{sid}: no entry" for sid in sorted(wanted - entries.keys())]
    problems += [f"{sid}: no such statement" for sid in sorted(entries.keys() - wanted)]
    cited: set[str] = set()
    for sid, entry in sorted(entries.items()):
        problems += [f"{sid}: {p}" for p in entry_problems(entry)]
        for rule in entry.rules:
            cited.add(rule)
            if rule not in known_rules:
                problems.append(f"{sid}: unknown rule {rule}")
    unstated = unstated_rules(spec)
    problems += [f"unstated {r}: unknown rule" for r in sorted(unstated.keys() - known_rules)]
    problems += [f"unstated {r}: a statement names it" for r in sorted(unstated.keys() & cited)]
    named = cited | unstated.keys()
    problems += [f"rule {r}: no statement names it" for r in sorted(known_rules - named)]
    return problems


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Normative statements and their coverage.")
    sub = parser.add_subparsers(dest="command", required=True)

    # The spec as --spec names it (csi.v1) or as the matrix files do (csi_v1).
    def spec_name(name: str) -> str:
        return name.replace(".", "_")

    listing = sub.add_parser("list", help="print the statements of a spec")
    listing.add_argument("spec", type=spec_name, choices=sorted(SPEC_TEXTS))
    check = sub.add_parser("check", help="check a spec's matrix; print its counts")
    check.add_argument("spec", type=spec_name, choices=sorted(SPEC_TEXTS))
    ns = parser.parse_args(argv)
    if ns.command == "list":
        for s in statements(ns.spec):
            where = f" [{s.context}]" if s.context else ""
            print(f"{s.id}\tline {s.line}\t{s.level}{where}\t{s.text}")
        return 0
    problems = matrix_problems(ns.spec)
    for p in problems:
        print(p)
    c = count(load_matrix(ns.spec))
    print(
        f"{ns.spec}: {c.statements} statements, {c.checkable} checkable: {c.full} full,"
        f" {c.partial_off_wire} partial off-wire, {c.partial_gap} partial gap,"
        f" {c.missing_off_wire} missing off-wire, {c.missing_gap} missing gap"
        f" ({c.full_ratio:.1%} full; {c.visible_ratio:.1%} full + off-wire, judged as far"
        f" as the socket shows); {len(problems)} problem(s)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_coverage() -> str:
    """docs/coverage.md: the counts, what a rule could still catch, then every statement of
    every spec with its answer."""
    parts = [
        "# Spec coverage\n\n"
        "<!-- Generated by tools/gen_docs.py from spec-coverage/*.toml and the spec texts;"
        " edit those, then run `make docs`. -->\n\n"
        "Every normative statement of each spec text (a sentence with MUST, MUST NOT, SHALL,\n"
        "SHALL NOT, REQUIRED, SHOULD, SHOULD NOT or RECOMMENDED, in prose, tables and the\n"
        "protobuf listings' comments; `tools/spec_statements.py list SPEC` prints them) and\n"
        "how plugproxy answers it. Where a spec writes requirements in lower case (CSI's\n"
        "SnapshotMetadata service, COSI v1alpha1's Provisioner comments, COSI v1alpha2's\n"
        "bucket and account id fields) those sentences count too; their ids end in\n"
        "`.lcN`. Classes: **a** checkable from one call, **b** checkable\n"
        "with what the proxy saw on its socket (capabilities, earlier calls, the messages of\n"
        "one stream), **c** not judgeable from the socket (host and backend effects, other\n"
        "nodes, documentation, deployment, intentions). A checkable statement is *covered*\n"
        "when its rules catch every breach of it, *partial* when they catch part, *not\n"
        "judged* when no rule does. `tests/test_spec_coverage.py` fails when a statement has\n"
        "no entry, an entry names a rule that does not exist, a rule answers no statement, or\n"
        "a partial or unjudged statement does not say what is left.\n\n"
        "Every covered statement has a planted breach\n"
        "(`tests/integration/test_planted_breaches.py`, its table in\n"
        "`tests/integration/planted/`): the calls of a CO and the answers of a scripted plugin\n"
        "(a real gRPC server) that break the statement, sent through a real proxy in audit mode,\n"
        "must be reported under the statement's rule; its nearest legitimate variant, sent\n"
        "through a proxy in enforce mode, must pass untouched and unreported. The test fails\n"
        "when a covered statement has no such case.\n\n"
        "What is left of a partial or unjudged statement is of two kinds. **off-wire**: no\n"
        "sequence of calls and answers on the socket could show the rest of a breach: it lies\n"
        "in backend or host state, in the CO's own decisions (what it verified before\n"
        "retrying, when the spec does not say by which call), or in calls on another socket\n"
        "or replica (the controller's socket seen from a node, an HA replica). No proxy can\n"
        "do more there. **gap**: some breach that goes uncaught is on the wire, so a rule\n"
        "could catch it (sometimes at the price of false alarms, which is why it is not\n"
        "judged yet); these are listed together under\n"
        "[What a rule could still catch](#what-a-rule-could-still-catch). The goal is 95 % of\n"
        "the checkable statements judged *as far as the socket shows* (covered plus\n"
        "off-wire) for every spec, with no false alarm on legitimate traffic; *covered* alone\n"
        "tells how much of a spec a proxy can judge whole.\n\n"
        "| Spec | Statements | Not judgeable (c) | Checkable (a+b) | Covered |"
        " Partial, off-wire | Partial, gap | Not judged, off-wire | Not judged, gap |"
        " Covered % | As far as the socket shows % |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    ]
    gaps = [
        "\n## What a rule could still catch\n\n"
        "Checkable statements with a breach on the wire that no rule catches yet (`rest ="
        ' "gap"`), by spec: what is judged, and what is left.\n'
    ]
    bodies = []
    for spec, (title, path) in SPEC_TEXTS.items():
        entries = load_matrix(spec)
        texts = {s.id: s for s in statements(spec)}
        c = count(entries)
        parts.append(
            f"| {title} | {c.statements} | {c.statements - c.checkable} | {c.checkable} |"
            f" {c.full} | {c.partial_off_wire} | {c.partial_gap} | {c.missing_off_wire} |"
            f" {c.missing_gap} | {c.full_ratio:.1%} | {c.visible_ratio:.1%} |\n"
        )
        open_gaps = [e for e in entries.values() if e.needs_rest and e.rest == GAP]
        if open_gaps:
            gaps.append(
                f"\n### {title}\n\n"
                "| Id | Level | Party | Rules | What is left | In short |\n"
                "|---|---|---|---|---|---|\n"
            )
            for e in sorted(open_gaps, key=lambda e: texts[e.id].line if e.id in texts else 0):
                level = texts[e.id].level if e.id in texts else ""
                rules = ", ".join(f"`{r}`" for r in e.rules) or "none"
                gaps.append(
                    f"| `{e.id}` | {level} | {e.party} | {rules} |"
                    f" {_cell(e.partial or e.why)} | {_cell(e.what)} |\n"
                )
        rows = [
            f"## {title}\n\n"
            f"Statements of `{path}`; *line* is its line in that file; *rest* says, for a\n"
            "partial or unjudged statement, whether what is left is off the wire or a gap.\n\n"
            "| Id | Line | Level | Party | Class | Rules, or why not judged | Rest | In short |\n"
            "|---|---:|---|---|---|---|---|---|\n"
        ]
        for s in statements(spec):
            e = entries.get(s.id)
            if e is None:
                rows.append(f"| `{s.id}` | {s.line} | {s.level} | | | (no entry) | | |\n")
                continue
            answer = ", ".join(f"`{r}`" for r in e.rules)
            if e.partial:
                answer += f" (partial: {e.partial})"
            if not e.rules:
                answer = e.why
            rows.append(
                f"| `{s.id}` | {s.line} | {s.level} | {e.party} | {e.cls} | {_cell(answer)} |"
                f" {e.rest} | {_cell(e.what)} |\n"
            )
        unstated = unstated_rules(spec)
        if unstated:
            rows.append(
                "\nRules whose requirement the text states without an RFC keyword:\n\n"
                + "".join(f"- `{r}`: {_cell(why)}\n" for r, why in sorted(unstated.items()))
            )
        bodies.append("".join(rows))
    return "".join(parts) + "".join(gaps) + "\n" + "\n".join(bodies)
