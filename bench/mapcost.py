"""What the rules' bounded memories cost per operation and per entry: ours or cachetools'.

    python bench/mapcost.py                      # time per operation, bytes per entry
    python bench/mapcost.py --instructions       # also instructions per operation (valgrind)

The expiring memories (``rules.memory.ExpiringMap``) are compared with cachetools'
``TTLCache``, and the memories whose values depend only on their key (``rules.memory.
remember`` on an OrderedDict) with its ``LRUCache``, each filled to ``--size`` entries keyed
by volume-id-like strings, for the operations the rules' per-call paths make: setting a new
key in a full map (the oldest goes), setting a key again, reading one that is there and one
that is not, ``in``, and refreshing an entry's time (``touch``; for TTLCache a read and a
set again). Instructions are counted with callgrind as the difference of two runs of
``--ops`` and ``2 * --ops`` operations (the set-up cancels out), so the machine's load does
not move them; the times do.
"""

from __future__ import annotations

import argparse
import gc
import re
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from plugproxy.core.memory import ExpiringMap, remember  # noqa: E402

TTL = 3600.0
IMPLS = ("ours", "cachetools")
KINDS = ("expiring", "lru")
OPS = ("set-new", "set-again", "get-hit", "get-miss", "contains", "touch")


def key(i: int) -> str:
    return f"pvc-{i:08d}-0000-4000-8000-{i:012d}"


def empty(impl: str, kind: str, size: int) -> Any:
    """An empty map of ``impl`` and ``kind`` bounded at ``size`` entries."""
    if impl == "ours":
        return ExpiringMap(size, TTL) if kind == "expiring" else OrderedDict()
    import cachetools  # noqa: PLC0415

    return cachetools.TTLCache(size, TTL) if kind == "expiring" else cachetools.LRUCache(size)


def put(impl: str, kind: str, table: Any, k: str, value: Any, size: int) -> None:
    if impl == "ours" and kind == "lru":
        remember(table, k, value, size)
    else:
        table[k] = value


def filled(impl: str, kind: str, size: int) -> Any:
    """A map of ``impl`` and ``kind`` holding ``size`` entries."""
    table = empty(impl, kind, size)
    for i in range(size):
        put(impl, kind, table, key(i), (i, b"0123456789abcdef"), size)
    return table


def operation(impl: str, kind: str, op: str, table: Any, size: int) -> Callable[[int], None]:
    """One operation on the i-th key (keys are made beforehand, outside what is counted)."""
    value = (0, b"0123456789abcdef")
    keys = [key(i) for i in range(2 * size)]
    ours_lru = impl == "ours" and kind == "lru"
    if op == "harness":  # what every figure includes: the call and the key's lookup
        return lambda i: keys[i % size]
    if op == "set-new":  # keys past the ones held: the oldest goes each time
        if ours_lru:
            return lambda i: remember(table, keys[size + i % size], value, size)
        return lambda i: table.__setitem__(keys[size + i % size], value)
    if op == "set-again":
        if ours_lru:
            return lambda i: remember(table, keys[i % size], value, size)
        return lambda i: table.__setitem__(keys[i % size], value)
    if op == "get-hit":
        return lambda i: table.get(keys[i % size])
    if op == "get-miss":
        return lambda i: table.get(keys[size + i % size])
    if op == "contains":
        return lambda i: keys[i % size] in table
    # touch: the entry's time starts again
    if impl == "ours" and kind == "expiring":
        return lambda i: table.touch(keys[i % size])
    if ours_lru:
        return lambda i: table.move_to_end(keys[i % size])

    def read_and_set(i: int) -> None:
        k = keys[i % size]
        found = table.get(k)
        if found is not None:
            table[k] = found

    return read_and_set


def run_ops(impl: str, kind: str, op: str, size: int, ops: int) -> None:
    table = filled(impl, kind, size)
    fn = operation(impl, kind, op, table, size)
    for i in range(ops):
        fn(i)


def timed(impl: str, kind: str, op: str, size: int, ops: int, repeat: int) -> float:
    """Median ns per operation over ``repeat`` runs, each on a freshly filled map."""
    found = []
    for _ in range(repeat):
        table = filled(impl, kind, size)
        fn = operation(impl, kind, op, table, size)
        gc.collect()
        start = time.perf_counter_ns()
        for i in range(ops):
            fn(i)
        found.append((time.perf_counter_ns() - start) / ops)
    return statistics.median(found)


def per_entry(impl: str, kind: str, size: int) -> float:
    """Bytes held per entry beyond its key and value (tracemalloc, both made first)."""
    keys = [key(i) for i in range(size)]
    value = (0, b"0123456789abcdef")
    table = empty(impl, kind, size)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for k in keys:
        put(impl, kind, table, k, value, size)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / size


def instructions(impl: str, kind: str, op: str, size: int, ops: int) -> float:
    """Instructions per operation: callgrind's totals for 2 * ops minus ops, over ops."""
    totals = []
    for n in (ops, 2 * ops):
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--run",
            impl,
            kind,
            op,
            "--size",
            str(size),
            "--ops",
            str(n),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        match = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
        if match is None:
            raise RuntimeError(f"no instruction count from callgrind: {out.stderr[-500:]}")
        totals.append(int(match.group(1)))
    return (totals[1] - totals[0]) / ops


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/mapcost.py", description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=20_000, help="entries each map holds")
    p.add_argument("--ops", type=int, default=20_000, help="operations per measured run")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per figure (median)")
    p.add_argument("--instructions", action="store_true", help="also count with callgrind")
    p.add_argument("--run", nargs=3, metavar=("IMPL", "KIND", "OP"), help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.run:
        run_ops(*ns.run, ns.size, ns.ops)
        return 0
    try:
        import cachetools  # noqa: F401, PLC0415
    except ImportError:
        sys.exit("bench/mapcost.py: cachetools is not installed (pip install cachetools)")
    print(f"maps of {ns.size:,} entries; ns per operation (median of {ns.repeat})", end="")
    print(", instructions per operation (callgrind)" if ns.instructions else "")
    harness = f"{timed('ours', 'lru', 'harness', ns.size, ns.ops, ns.repeat):.0f} ns"
    if ns.instructions:
        harness += f", {instructions('ours', 'lru', 'harness', ns.size, ns.ops):.0f} instr"
    print(f"each figure includes the harness's own {harness} per operation")
    for kind in KINDS:
        names = {"expiring": "ExpiringMap | TTLCache", "lru": "remember() | LRUCache"}
        print(f"\n{kind}: {names[kind]}")
        for op in OPS:
            shown = []
            for impl in IMPLS:
                figure = f"{timed(impl, kind, op, ns.size, ns.ops, ns.repeat):7.0f} ns"
                if ns.instructions:
                    figure += f" {instructions(impl, kind, op, ns.size, ns.ops):7.0f} instr"
                shown.append(figure)
            print(f"  {op:10} {' | '.join(shown)}", flush=True)
        held = [per_entry(impl, kind, ns.size) for impl in IMPLS]
        print(f"  {'bytes/entry':10} {held[0]:7.0f}    | {held[1]:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
