"""The long fuzz run: the properties of tests/integration/test_fuzz.py for as long as asked.

    python bench/fuzz_long.py --minutes 30                 # audit and enforce, alternating
    python bench/fuzz_long.py --minutes 5 --mode enforce
    python bench/fuzz_long.py --minutes 60 --seed 1234     # reproduce a run's first batch

Every known method of every spec (CSI v1 and v0.3, COSI, CMI), requests and responses
drawn from the descriptors (random valid messages field by field, random byte strings,
mutated valid encodings), sent through a live in-process proxy with every stage that reads
messages switched on, against a recorder plugin answering with the fuzzed response bytes.

- audit: the plugin receives the request bytes and the caller the response bytes, unchanged.
- enforce: each call is either relayed unchanged or answered by the proxy with a reject code
  and a "plugproxy: ..." message; undecodable requests get INVALID_ARGUMENT "cannot decode".
- both: the proxy answers a Probe after every batch (it stayed up).

Batches of --batch examples run one after another with fresh seeds until the time is up.
The first failure is shrunk by Hypothesis to a minimal example, printed, and the run exits 1.
The proxy's own log lines (one per call, with payloads) go to --log (default /dev/null).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.integration.test_fuzz import (  # noqa: E402
    STAGE_ARGS,
    Case,
    FuzzTarget,
    cases,
    check_audit,
    check_enforce,
    start_target,
    stop_target,
)

CHECKS: dict[str, Callable[[FuzzTarget, Case, str, object], None]] = {
    "audit": check_audit,  # type: ignore[dict-item]
    "enforce": check_enforce,  # type: ignore[dict-item]
}


def run_batch(
    loop: asyncio.AbstractEventLoop, target: FuzzTarget, mode: str, size: int, batch_seed: int
) -> int:
    count = 0

    @seed(batch_seed)
    @settings(
        max_examples=size,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases())
    def prop(case: Case) -> None:
        nonlocal count
        count += 1
        fuzz_id, out = loop.run_until_complete(target.run(case))
        CHECKS[mode](target, case, fuzz_id, out)

    prop()
    if not loop.run_until_complete(target.alive()):
        raise AssertionError("the proxy stopped answering")
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True, help="how long to fuzz")
    parser.add_argument("--mode", choices=("audit", "enforce", "both"), default="both")
    parser.add_argument("--batch", type=int, default=500, help="examples per batch")
    parser.add_argument("--seed", type=int, help="seed of the first batch (default random)")
    parser.add_argument("--log", default=os.devnull, help="where the proxy's log lines go")
    ns = parser.parse_args(argv)
    if ns.minutes <= 0 or ns.batch <= 0:
        parser.error("--minutes and --batch must be positive")

    modes = ["audit", "enforce"] if ns.mode == "both" else [ns.mode]
    rng = random.Random(ns.seed)
    next_seed = ns.seed if ns.seed is not None else rng.randrange(2**32)
    loop = asyncio.new_event_loop()
    targets: dict[str, FuzzTarget] = {}
    totals = dict.fromkeys(modes, 0)
    started = time.monotonic()
    deadline = started + ns.minutes * 60
    with open(ns.log, "a") as log, contextlib.redirect_stdout(log):
        for mode in modes:
            tmp = tempfile.mkdtemp(prefix=f"plugproxy-fuzz-{mode}-")
            targets[mode] = loop.run_until_complete(
                start_target(tmp, "--validation", mode, *STAGE_ARGS)
            )
        try:
            batch = 0
            while time.monotonic() < deadline:
                mode = modes[batch % len(modes)]
                try:
                    totals[mode] += run_batch(loop, targets[mode], mode, ns.batch, next_seed)
                except Exception:
                    print(
                        f"fuzz_long: {mode} batch {batch} (seed {next_seed}) failed",
                        file=sys.stderr,
                    )
                    raise
                print(
                    f"fuzz_long: batch {batch} {mode} seed={next_seed} ok;"
                    f" {sum(totals.values())} examples in {time.monotonic() - started:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
                batch += 1
                next_seed = rng.randrange(2**32)
        finally:
            for target in targets.values():
                loop.run_until_complete(stop_target(target))
            loop.close()
    elapsed = time.monotonic() - started
    per_mode = ", ".join(f"{m} {n}" for m, n in totals.items())
    print(f"fuzz_long: passed: {sum(totals.values())} examples ({per_mode}) in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
