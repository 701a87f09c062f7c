"""The violation record: counts per (rule, method, party), and the violations file that
keeps them across restarts (``--violations-file``).

:class:`Tally` counts violations, the calls judged and the runs they come from; the
validation stage keeps one for ``GET /violations`` and ``plugproxy report --file`` builds
one from the file. Both print the same report.

The file is JSON lines, appended, one record a line (``event`` says which):

- ``run``: a proxy started (``time``, ``run`` id, ``started``, ``mode``, ``rule_modes``,
  ``version``, ``host``); written again at the top of each new file after a rotation, so
  each file names the runs it holds.
- ``violation``: one occurrence: ``time``, ``run``, ``spec``, ``rule``, ``level``,
  ``party``, ``method``, ``field``, ``section``, ``request_id``, ``rejected`` (the proxy
  answered the call itself, in enforce mode) and ``message``. Messages and fields name
  fields and rules; they never quote a string field's value.
- ``judged``: calls judged since the last such record, by spec (``calls``): written with
  each batch of violations and at least once a minute while calls are judged.
- ``lost``: violations that could not be written (a write error, or more than
  :data:`MAX_PENDING` waiting), with ``why``; they stayed counted in the proxy's memory.
- ``stop``: the proxy stopped in order. A run without one ended abruptly (killed, a node
  lost): what it judged in its last second, and up to a minute of calls judged, may be
  missing.

Writes never wait on the event loop: records are queued and a thread appends them at least
once a second and at shutdown. The file and its one predecessor ``PATH.1`` together stay
under ``--violations-file-max-bytes``: a file reaching half of it is renamed to ``PATH.1``
(replacing the older one) and a new one is begun, so the latest records are kept. A write
error is logged once (until writes succeed again), counted, and never fails a call. An
exclusive lock (flock) around each append and rotation lets two proxies share the file for
the moments of a rolling update.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson

from plugproxy.core.endpoints import ConfigError

FORMAT = 1
FLUSH_INTERVAL = 1.0  # seconds between appends
JUDGED_INTERVAL = 60.0  # calls judged are written at least this often while they change
MAX_PENDING = 10_000  # violations waiting for the writer; more are counted as lost
MIN_MAX_BYTES = 64 * 1024
DEFAULT_MAX_BYTES = 10 * 1024 * 1024
FILE_MODE = 0o640


def utc(when: float) -> str:
    """A report's time: UTC to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def utc_ms(when: float) -> str:
    """A record's time: UTC to the millisecond."""
    whole = int(when)
    ms = min(int((when - whole) * 1000), 999)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ms:03d}Z"


def parse_time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Tally:
    """Violations per (rule, method, party), the runs they come from and the calls judged.

    Not locked: the validation stage holds its own lock around it."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.first: float | None = None  # the earliest and latest record (the window)
        self.last: float | None = None
        self.records = 0
        self.unreadable = 0  # lines of a file that were not a record (a torn last line)
        self.lost = 0  # violations the file's ``lost`` records say were never written

    def seen(self, when: float) -> None:
        """Widen the window to ``when``."""
        if self.first is None or when < self.first:
            self.first = when
        if self.last is None or when > self.last:
            self.last = when

    def run(self, run_id: str) -> dict[str, Any]:
        found = self.runs.get(run_id)
        if found is None:
            found = self.runs[run_id] = {
                "run": run_id,
                "started": None,
                "stopped": None,
                "mode": None,
                "rule_modes": {},
                "host": None,
                "version": None,
                "calls_judged": {},
                "violations": 0,
                "rejected": 0,
            }
        return found

    def violation(
        self,
        when: float,
        spec: str,
        rule: str,
        level: str,
        method: str,
        party: str,
        section: str,
        message: str,
        field: str = "",
        request_id: str = "",
        rejected: bool = False,
        run: str = "",
    ) -> None:
        key = (rule, method, party)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = {
                "rule": rule,
                "method": method,
                "party": party,
                "spec": spec,
                "level": level,
                "section": section,
                "count": 0,
                "rejected": 0,
                "earlier_runs": 0,
                "first_seen": when,
                "last_seen": when,
            }
        entry["count"] += 1
        entry["rejected"] += bool(rejected)
        entry["first_seen"] = min(entry["first_seen"], when)
        if when >= entry["last_seen"] or entry["count"] == 1:
            entry["last_seen"] = when
            entry["last_field"] = field
            entry["last_message"] = message
            entry["last_request_id"] = request_id
            entry["section"] = section
        if run:
            info = self.run(run)
            info["violations"] += 1
            info["rejected"] += bool(rejected)
        self.seen(when)

    def record(self, rec: Any) -> None:
        """One record of the file."""
        when = parse_time(rec.get("time")) if isinstance(rec, dict) else None
        if when is None:
            self.unreadable += 1
            return
        self.records += 1
        event = rec.get("event")
        run_id = str(rec.get("run", ""))
        if event == "violation":
            self.violation(
                when,
                str(rec.get("spec", "")),
                str(rec.get("rule", "")),
                str(rec.get("level", "")),
                str(rec.get("method", "")),
                str(rec.get("party", "")),
                str(rec.get("section", "")),
                str(rec.get("message", "")),
                str(rec.get("field", "")),
                str(rec.get("request_id", "")),
                rec.get("rejected") is True,
                run_id,
            )
            return
        self.seen(when)
        if not run_id:
            return
        info = self.run(run_id)
        if event == "run":
            info["started"] = parse_time(rec.get("started")) or when
            for key in ("mode", "host", "version"):
                if isinstance(rec.get(key), str):
                    info[key] = rec[key]
            if isinstance(rec.get("rule_modes"), dict):
                info["rule_modes"] = dict(rec["rule_modes"])
        elif event == "judged" and isinstance(rec.get("calls"), dict):
            judged = info["calls_judged"]
            for spec, n in rec["calls"].items():
                if isinstance(n, int) and n > 0:
                    judged[spec] = judged.get(spec, 0) + n
        elif event == "stop":
            info["stopped"] = when
        elif event == "lost" and isinstance(rec.get("violations"), int):
            self.lost += rec["violations"]

    def mark_earlier(self) -> None:
        """What was counted so far comes from earlier runs (loaded from the file)."""
        for entry in self.entries.values():
            entry["earlier_runs"] = entry["count"]

    def calls_judged(self, live: Mapping[str, int] | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for info in self.runs.values():
            for spec, n in info["calls_judged"].items():
                out[spec] = out.get(spec, 0) + n
        for spec, n in (live or {}).items():
            out[spec] = out.get(spec, 0) + n
        return out

    def report(
        self,
        until: float,
        current: str = "",
        live_judged: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """The report ``GET /violations`` serves (``current``: this proxy's run, whose calls
        judged are ``live_judged``)."""
        entries = [dict(e) for e in self.entries.values()]
        entries.sort(key=lambda e: (-e["count"], e["rule"], e["method"], e["party"]))
        for e in entries:
            e["first_seen"] = utc(e["first_seen"])
            e["last_seen"] = utc(e["last_seen"])
        runs = []
        for info in sorted(
            self.runs.values(), key=lambda r: (r["started"] or self.first or 0.0, r["run"])
        ):
            judged = dict(info["calls_judged"])
            if info["run"] == current:
                for spec, n in (live_judged or {}).items():
                    judged[spec] = judged.get(spec, 0) + n
            run = {
                "run": info["run"],
                "started": utc(info["started"]) if info["started"] else None,
                "stopped": utc(info["stopped"]) if info["stopped"] else None,
                "mode": info["mode"],
                "rule_modes": info["rule_modes"],
                "host": info["host"],
                "version": info["version"],
                "calls_judged": sum(judged.values()),
                "violations": info["violations"],
                "rejected": info["rejected"],
            }
            if info["run"] == current:
                run["current"] = True
            runs.append(run)
        last_run = next((r for r in reversed(runs) if r["mode"] is not None), None)
        by_spec = self.calls_judged(live_judged)
        since = self.first if self.first is not None else until
        return {
            "since": utc(since),
            "until": utc(until),
            "mode": last_run["mode"] if last_run else None,
            "rule_modes": last_run["rule_modes"] if last_run else {},
            "calls_judged": sum(by_spec.values()),
            "calls_judged_by_spec": dict(sorted(by_spec.items())),
            "total": sum(e["count"] for e in entries),
            "rejected": sum(e["rejected"] for e in entries),
            "runs": runs,
            "violations": entries,
        }


def _lines(path: str) -> Iterator[bytes]:
    try:
        with open(path, "rb") as f:
            yield from f
    except FileNotFoundError:
        return


def read(path: str, tally: Tally | None = None) -> Tally:
    """The records of ``PATH.1`` and ``PATH``, oldest first; OSError when unreadable."""
    tally = tally if tally is not None else Tally()
    for name in (path + ".1", path):
        for line in _lines(name):
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                if line.strip():
                    tally.unreadable += 1
                continue
            tally.record(rec)
    return tally


def load_file(path: str) -> Tally:
    """``plugproxy report --file``: ConfigError (one line) when there is nothing to read."""
    if not os.path.exists(path) and not os.path.exists(path + ".1"):
        raise ConfigError(f"{path}: no such file (nor {path}.1)")
    try:
        return read(path)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None


def file_report(path: str) -> dict[str, Any]:
    """The report of a violations file, as ``GET /violations`` shapes it; ``until`` is
    its latest record."""
    tally = load_file(path)
    data = tally.report(tally.last if tally.last is not None else time.time())
    data["violations_file"] = {
        "path": path,
        "records": tally.records,
        "unreadable_lines": tally.unreadable,
        "lost": tally.lost,
    }
    return data


class ViolationFile:
    """Appends records to the violations file from a thread of its own; see the module."""

    def __init__(
        self,
        path: str,
        max_bytes: int,
        logger: Any,
        source: str = "--violations-file",
        errors: Any = None,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.logger = logger
        self.source = source
        self.errors = errors  # a prometheus Counter of failed writes, or None
        self.write_errors = 0
        self.lost = 0  # violations never written
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        self._unwritten = 0  # violations not written since the last lost record
        self._why = ""
        self._failing = False
        self._fd = -1
        self._opened = False
        self._headed: tuple[int, int] | None = None  # the file this run's record is in
        self._fresh = 0  # the size of a file holding only this run's record
        self._header: dict[str, Any] = {}
        self._judged: Callable[[], Mapping[str, int]] = dict
        self._written: dict[str, int] = {}  # calls judged already in a judged record
        self._judged_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def _half(self) -> int:
        return self.max_bytes // 2

    def load(self) -> Tally:
        """What the file and ``PATH.1`` hold (earlier runs); ConfigError when their
        directory is missing or they cannot be read."""
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise ConfigError(f"{self.source} {self.path}: directory {directory} does not exist")
        try:
            return read(self.path)
        except OSError as exc:
            raise ConfigError(f"{self.source} {self.path}: {exc.strerror or exc}") from None

    def open(self, header: dict[str, Any], judged: Callable[[], Mapping[str, int]]) -> None:
        """Open for appending and write this run's ``run`` record; ConfigError when it
        cannot be (a read-only or missing mount). ``judged``: calls judged so far, by spec."""
        self._header = {"event": "run", **header, "format": FORMAT}
        self._judged = judged
        self._fresh = len(self._header_line())
        try:
            self._fd = self._open_path()
            with self._locked():
                self._append([])
        except OSError as exc:
            raise ConfigError(f"{self.source} {self.path}: {exc.strerror or exc}") from None
        self._opened = True
        self._judged_at = time.monotonic()

    def _open_path(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)

    def _header_line(self) -> bytes:
        return self._line({**self._header, "time": time.time()})

    def _line(self, rec: dict[str, Any]) -> bytes:
        rec = dict(rec)
        rec["time"] = utc_ms(rec["time"])
        if rec["event"] == "run":
            rec["started"] = utc_ms(rec["started"])
        return orjson.dumps(rec) + b"\n"

    # -- the event loop's side ---------------------------------------------------------

    def add(self, record: dict[str, Any]) -> None:
        """Queue a record (its ``time`` a float); never blocks on the file."""
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                self._unwritten += 1
                self.lost += 1
                self._why = f"more than {MAX_PENDING} violations waiting to be written"
                return
            self._pending.append(record)

    def start(self) -> None:
        if not self._opened or self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name="plugproxy-violations-file", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Write what is queued and a ``stop`` record, then close (blocks; run it in a
        thread from the event loop)."""
        thread = self._thread
        if thread is not None:
            self._stop.set()
            thread.join(10.0)
            self._thread = None
        elif self._opened:
            self.flush(final=True)
        self._opened = False
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    # -- the writer thread -------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_INTERVAL):
            self.flush()
        self.flush(final=True)

    def flush(self, final: bool = False) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            unwritten, self._unwritten = self._unwritten, 0
            why = self._why
        run = self._header.get("run", "")
        now = time.time()
        lines = [self._line(rec) for rec in batch]
        judged, delta = self._judged_delta(
            force=bool(lines) or final or time.monotonic() - self._judged_at >= JUDGED_INTERVAL
        )
        if delta:
            judged_line = {"event": "judged", "time": now, "run": run, "calls": delta}
            lines.insert(0, self._line(judged_line))
        if unwritten:
            lines.append(
                self._line(
                    {"event": "lost", "time": now, "run": run, "violations": unwritten, "why": why}
                )
            )
        if final:
            lines.append(self._line({"event": "stop", "time": now, "run": run}))
        if not lines:
            return
        try:
            with self._locked():
                self._append(lines)
        except OSError as exc:
            self._failed(exc, len(batch), len(batch) + unwritten)
            return
        self._written = judged
        self._judged_at = time.monotonic()
        if self._failing:
            self._failing = False
            self.logger.info("violations file written again", path=self.path)

    def _judged_delta(self, force: bool) -> tuple[dict[str, int], dict[str, int]]:
        if not force:
            return self._written, {}
        now = dict(self._judged())
        delta = {s: n - self._written.get(s, 0) for s, n in now.items()}
        return now, {s: n for s, n in sorted(delta.items()) if n > 0}

    def _failed(self, exc: OSError, violations: int, unwritten: int) -> None:
        """A write failed: ``violations`` of this batch are lost, and with the ones not
        written before (``unwritten`` in all) are named in the next ``lost`` record."""
        self.write_errors += 1
        if self.errors is not None:
            self.errors.inc()
        why = exc.strerror or type(exc).__name__
        with self._lock:
            self._unwritten += unwritten
            self._why = f"write failed: {why}"
            self.lost += violations
        if not self._failing:
            self._failing = True
            self.logger.warning(
                "violations file write failed; violations stay counted in memory",
                path=self.path,
                error=why,
            )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the file's lock, on the file the path names now: another proxy sharing it
        may have rotated it meanwhile, or someone removed it."""
        for _ in range(5):
            if self._fd < 0:
                self._fd = self._open_path()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                same = os.path.samestat(os.fstat(self._fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(self._fd)  # its lock goes with it
            self._fd = -1
        else:
            raise OSError(errno.EAGAIN, "the file keeps being replaced")
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _append(self, lines: list[bytes]) -> None:
        """Append ``lines`` (the lock held), this run's record first in a file that does not
        have it yet; rotate before a line would take the file past half the bound, unless
        the file holds nothing but that record."""
        st = os.fstat(self._fd)
        size = st.st_size
        chunk: list[bytes] = []
        if (st.st_dev, st.st_ino) != self._headed:
            chunk.append(self._header_line())
            self._headed = (st.st_dev, st.st_ino)
        length = sum(map(len, chunk))
        for line in lines:
            if size + length + len(line) > self._half and size + length > self._fresh:
                self._write(self._fd, b"".join(chunk))
                chunk, length = [], 0
                size = self._rotate()
            chunk.append(line)
            length += len(line)
        if chunk:
            self._write(self._fd, b"".join(chunk))

    def _rotate(self) -> int:
        """PATH becomes PATH.1 (the older PATH.1 goes) and a new PATH begins with this
        run's record; the new file's size. The old file's lock goes with its descriptor."""
        os.replace(self.path, self.path + ".1")
        fd = self._open_path()
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.close(self._fd)
        self._fd = fd
        header = self._header_line()
        self._write(fd, header)
        st = os.fstat(fd)
        self._headed = (st.st_dev, st.st_ino)
        self._fresh = len(header)
        return len(header)

    @staticmethod
    def _write(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
