"""CPU per call of each stage's own hooks, in-process: no sockets, no relay, no other process.

    python bench/stagecost.py                 # every stage, 20,000 GetPluginInfo calls each
    python bench/stagecost.py --calls 5000 validation tracing

Each stage is built from the same flags `plugproxy serve` would use, compiled into the
method's chain, and driven through on_start, on_response and on_finish with the bench's
GetPluginInfo answer. What `run.py --features` measures on top of this is the relay's
work for a call that has any stage at all (the call object, its metadata, holding the
request until on_start), and the load on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import payloads  # noqa: E402
import run  # noqa: E402

from plugproxy import pipeline, serve  # noqa: E402
from plugproxy.api import Call, LazyMessage  # noqa: E402
from plugproxy.log import Logger  # noqa: E402

# The stages run.py --features prices, minus serialization: GetPluginInfo has no key, so
# that stage is not in its chain. Flags and environment are run.py's own.
STAGES = {name: spec for name, spec in run.FEATURES.items() if name != "serialization"}
METHOD = payloads.PLUGIN_INFO


async def cost(stage: str, calls: int, log: Path) -> float:
    """Microseconds of process CPU per call (all threads: exporters included)."""
    added, dropped, env = STAGES[stage]
    saved = {key: os.environ.get(key) for key in (*env, "OTEL_TRACES_EXPORTER")}
    os.environ.update({"OTEL_TRACES_EXPORTER": "none", **env})
    try:
        passthrough = run.serve_flags("passthrough", log)
        argv = [f for f in passthrough if f not in dropped] + ["--admin-listen", "off", *added]
        endpoints = ["--listen", "unix:///nonexistent/in.sock"]
        endpoints += ["--upstream", "unix:///nonexistent/up.sock"]  # never connected
        ns = serve.parse_args([*endpoints, *argv])
        with log.open("w") as stream:
            logger = Logger(stream)
            server = serve.ProxyServer(ns, logger=logger)
            method = server.registry.lookup(METHOD)
            chain = pipeline.compile_chain(server.stages, method, logger)
            if chain is None:
                return 0.0
            answer = payloads.plugin_info_response()
            metadata = (("user-agent", "grpc-go/1.60"), ("content-type", "application/grpc"))

            async def drive(n: int) -> None:
                for _ in range(n):
                    call = Call(method, metadata, [], 30.0, "unix:")
                    call.request = LazyMessage(b"", method.request_class)
                    pending = chain.begin(call)
                    if pending is not None:
                        await pending
                    call.response = LazyMessage(answer, method.response_class)
                    call.response_count = 1
                    chain.run_response(call, call.response)
                    chain.run_finish(call)

            await drive(min(calls, 500))
            gc.collect()
            start = time.process_time()
            await drive(calls)
            for each in server.stages:  # flush exporters: their work is part of the cost
                await each.shutdown()
            return (time.process_time() - start) / calls * 1e6
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _stdout_discarded() -> Iterator[None]:
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench/stagecost.py", description=__doc__.split("\n")[0])
    p.add_argument("stages", nargs="*", metavar="STAGE", help=f"any of {', '.join(STAGES)}")
    p.add_argument("--calls", type=int, default=20_000)
    ns = p.parse_args(argv)
    unknown = [s for s in ns.stages if s not in STAGES]
    if unknown:
        p.error(f"unknown stage(s) {', '.join(unknown)}; known: {', '.join(STAGES)}")
    chosen = ns.stages or list(STAGES)
    rows = []
    with _stdout_discarded():  # the console span exporter writes to file descriptor 1
        for stage in chosen:
            rows.append((stage, await cost(stage, ns.calls, Path(os.devnull))))
    print(f"{'stage':20} µs CPU per call ({ns.calls} GetPluginInfo calls, in-process)")
    for stage, us in rows:
        print(f"{stage:20} {us:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
