"""The violations file: records, rotation within the bound, write errors, two writers, and
the report read back from it."""

from __future__ import annotations

import io
import json
import os

import pytest
from prometheus_client import CollectorRegistry, Counter

from plugproxy.core.endpoints import ConfigError
from plugproxy.core.log import Logger
from plugproxy.rules.violationlog import MIN_MAX_BYTES, ViolationFile, file_report, read

MESSAGE = "volume_id is REQUIRED but empty"


def violation(run: str, n: int, rejected: bool = False) -> dict[str, object]:
    return {
        "event": "violation",
        "time": 1_800_000_000.0 + n,
        "run": run,
        "spec": "csi.v1",
        "rule": "csi.required-field",
        "level": "MUST",
        "party": "co",
        "method": "/csi.v1.Controller/DeleteVolume",
        "field": "volume_id",
        "section": "CSI v1.12 §DeleteVolume",
        "request_id": f"req-{n}",
        "rejected": rejected,
        "message": MESSAGE,
    }


def writer(path: str, run: str, judged: dict[str, int], max_bytes: int = MIN_MAX_BYTES, **kw):
    logs = io.StringIO()
    vf = ViolationFile(path, max_bytes, Logger(stream=logs), **kw)
    vf.open(
        {"time": 1_800_000_000.0, "run": run, "started": 1_800_000_000.0, "mode": "audit"},
        judged.copy,
    )
    return vf, logs


def records(path: str) -> list[dict[str, object]]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_rotation_keeps_the_latest_records_within_the_bound(tmp_path):
    path = str(tmp_path / "violations.jsonl")
    judged = {"csi.v1": 0}
    vf, _ = writer(path, "r1", judged)
    for n in range(2_000):
        vf.add(violation("r1", n))
        judged["csi.v1"] += 1
        if n % 50 == 49:
            vf.flush()
            assert os.path.getsize(path) + _size(path + ".1") <= MIN_MAX_BYTES
    vf.close()
    total = os.path.getsize(path) + os.path.getsize(path + ".1")
    assert MIN_MAX_BYTES / 2 < total <= MIN_MAX_BYTES  # PATH.1 full, PATH filling
    kept = [r for name in (path + ".1", path) for r in records(name)]
    ids = [r["request_id"] for r in kept if r["event"] == "violation"]
    # the latest are kept, in order, none twice; the oldest went with the first .1
    assert ids[-1] == "req-1999" and ids == [f"req-{n}" for n in range(2_000 - len(ids), 2_000)]
    for name in (path, path + ".1"):  # each file names its run first
        assert records(name)[0]["event"] == "run" and records(name)[0]["run"] == "r1"
    assert kept[-1]["event"] == "stop"
    tally = read(path)
    ((entry),) = tally.entries.values()
    assert entry["count"] == len(ids) and tally.unreadable == 0


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def test_a_write_error_is_logged_once_counted_and_reported_in_the_file(tmp_path):
    path = str(tmp_path / "violations.jsonl")
    registry = CollectorRegistry()
    errors = Counter("errors", "", registry=registry)
    vf, logs = writer(path, "r1", {}, errors=errors)
    vf.path = "/dev/full"  # every write: ENOSPC, a full disk
    for n in range(3):
        vf.add(violation("r1", n))
        vf.flush()  # never raises
    assert vf.write_errors == 3 and vf.lost == 3
    assert registry.get_sample_value("errors_total") == 3.0
    warnings = [json.loads(line) for line in logs.getvalue().splitlines()]
    assert [(w["level"], w["error"]) for w in warnings] == [("warning", "No space left on device")]
    vf.path = path  # space again: the loss is recorded, the next violation written
    vf.add(violation("r1", 3))
    vf.flush()
    vf.close()
    events = [(r["event"], r.get("violations")) for r in records(path)]
    assert ("lost", 3) in events and events[-1] == ("stop", None)
    assert "violations file written again" in logs.getvalue()
    assert file_report(path)["violations_file"]["lost"] == 3


def test_two_writers_share_the_file_through_rotations(tmp_path):
    """A rolling update: the old proxy drains while the new one starts on the same file."""
    path = str(tmp_path / "violations.jsonl")
    a, _ = writer(path, "old", {})
    b, _ = writer(path, "new", {})
    for n in range(1_500):
        (a if n % 2 else b).add(violation("old" if n % 2 else "new", n))
        if n % 30 == 29:
            a.flush()
            b.flush()
    a.close()
    b.close()
    assert os.path.getsize(path) + os.path.getsize(path + ".1") <= MIN_MAX_BYTES
    for name in (path, path + ".1"):
        headed: set[str] = set()
        for rec in records(name):  # whole lines only, and each run named before its records
            if rec["event"] == "run":
                headed.add(str(rec["run"]))
            else:
                assert rec["run"] in headed, (name, rec)


def test_the_report_of_a_file_gives_window_runs_and_calls_judged(tmp_path):
    path = tmp_path / "violations.jsonl"
    lines = [
        {"event": "run", "time": "2027-01-15T08:00:00.000Z", "run": "a", "mode": "enforce"},
        {"event": "judged", "time": "2027-01-15T08:00:30.000Z", "run": "a", "calls": {"csi.v1": 7}},
        {**violation("a", 0, rejected=True), "time": "2027-01-15T08:00:20.000Z"},
        {"event": "stop", "time": "2027-01-15T08:01:00.000Z", "run": "a"},
        {"event": "run", "time": "2027-01-15T09:00:00.000Z", "run": "b", "mode": "audit"},
        {**violation("b", 1), "time": "2027-01-15T09:00:05.000Z"},
        {"event": "judged", "time": "2027-01-15T09:00:06.000Z", "run": "b", "calls": {"csi.v1": 5}},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines) + '{"event": "viol'  # torn
    path.write_text(text)
    data = file_report(str(path))
    assert data["since"] == "2027-01-15T08:00:00Z" and data["until"] == "2027-01-15T09:00:06Z"
    assert data["calls_judged"] == 12 and data["calls_judged_by_spec"] == {"csi.v1": 12}
    assert data["total"] == 2 and data["rejected"] == 1 and data["mode"] == "audit"
    (entry,) = data["violations"]
    assert entry["count"] == 2 and entry["rejected"] == 1 and entry["last_request_id"] == "req-1"
    assert [(r["run"], r["mode"], r["calls_judged"], r["stopped"]) for r in data["runs"]] == [
        ("a", "enforce", 7, "2027-01-15T08:01:00Z"),
        ("b", "audit", 5, None),  # killed: no stop record
    ]
    assert data["violations_file"]["unreadable_lines"] == 1


def test_a_missing_directory_or_file_is_one_line(tmp_path):
    vf = ViolationFile(str(tmp_path / "absent" / "v.jsonl"), MIN_MAX_BYTES, Logger())
    with pytest.raises(ConfigError, match=r"directory .*absent does not exist"):
        vf.load()
    with pytest.raises(ConfigError, match="no such file"):
        file_report(str(tmp_path / "v.jsonl"))
