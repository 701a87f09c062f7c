"""CPU per call of each stage's own hooks, in-process: no sockets, no relay, no other process.

    python bench/stagecost.py                 # every stage, 20,000 GetPluginInfo calls each
    python bench/stagecost.py --calls 5000 validation tracing
    python bench/stagecost.py --method list-volumes --calls 20   # the 10,000-entry page

Each stage is built from the same flags `plugproxy serve` would use, compiled into the
method's chain, and driven through on_start, on_response and on_finish with the bench's
answer: GetPluginInfo, or run.py's ListVolumes page (--method list-volumes), whose
per-entry work the small answer cannot show. Every call of a run answers the same page, as
a plugin listing unchanged volumes does. What `run.py --features` measures on top of this is the relay's
work for a call that has any stage at all (the call object, its metadata, holding the
request until on_start), and the load on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import payloads  # noqa: E402
import run  # noqa: E402

from plugproxy import pipeline  # noqa: E402
from plugproxy.api import Call, LazyMessage  # noqa: E402
from plugproxy.cli import serve  # noqa: E402
from plugproxy.core.log import Logger  # noqa: E402
from plugproxy.stages.tracing_env import environment  # noqa: E402

# The stages run.py --features prices, minus serialization: GetPluginInfo has no key, so
# that stage is not in its chain. Flags and environment are run.py's own.
STAGES = {name: spec for name, spec in run.FEATURES.items() if name != "serialization"}
# --method: (the RPC, its answer's bytes, the default number of calls).
METHODS: dict[str, tuple[str, Callable[[], bytes], int]] = {
    "plugin-info": (payloads.PLUGIN_INFO, payloads.plugin_info_response, 20_000),
    "list-volumes": (
        payloads.LIST_VOLUMES,
        lambda: payloads.list_volumes_response(run.MODES["full"].list_entries),
        20,
    ),
}


async def cost(stage: str, calls: int, log: Path, method_name: str = "plugin-info") -> float:
    """Microseconds of process CPU per call (all threads: exporters included)."""
    added, dropped, env = STAGES[stage]
    with environment({"OTEL_TRACES_EXPORTER": "none", **env}):
        passthrough = run.serve_flags("passthrough", log)
        argv = [f for f in passthrough if f not in dropped] + ["--admin-listen", "off", *added]
        endpoints = ["--listen", "unix:///nonexistent/in.sock"]
        endpoints += ["--upstream", "unix:///nonexistent/up.sock"]  # never connected
        settings = serve.parse_settings([*endpoints, *argv])
        with log.open("w") as stream:
            logger = Logger(stream)
            server = serve.ProxyServer(settings, logger=logger)
            rpc, encode, _ = METHODS[method_name]
            metadata = (("user-agent", "grpc-go/1.60"), ("content-type", "application/grpc"))

            async def drive(rpc: str, answer: bytes, n: int) -> bool:
                method = server.registry.lookup(rpc)
                chain = pipeline.compile_chain(server.stages, method, logger)
                if chain is None:
                    return False
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
                return True

            if rpc == payloads.LIST_VOLUMES:  # the capabilities a real proxy knows by then
                for asked, capabilities in payloads.capability_responses().items():
                    await drive(asked, capabilities, 1)
            answer = encode()
            if not await drive(rpc, answer, min(calls, 500, max(calls // 4, 2))):
                return 0.0
            gc.collect()
            start = time.process_time()
            await drive(rpc, answer, calls)
            for each in server.stages:  # flush exporters: their work is part of the cost
                await each.shutdown()
            return (time.process_time() - start) / calls * 1e6


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
    p.add_argument("--method", choices=list(METHODS), default="plugin-info")
    p.add_argument("--calls", type=int, help="calls per stage (default: 20,000; 20 for a list)")
    p.add_argument("--repeat", type=int, default=1, help="runs per stage; the median is shown")
    ns = p.parse_args(argv)
    calls = ns.calls or METHODS[ns.method][2]
    if calls < 1 or ns.repeat < 1:
        p.error("--calls and --repeat must be at least 1")
    unknown = [s for s in ns.stages if s not in STAGES]
    if unknown:
        p.error(f"unknown stage(s) {', '.join(unknown)}; known: {', '.join(STAGES)}")
    chosen = ns.stages or list(STAGES)
    rpc = METHODS[ns.method][0].rsplit("/", 1)[1]
    runs: dict[str, list[float]] = {stage: [] for stage in chosen}
    with _stdout_discarded():  # the console span exporter writes to file descriptor 1
        for _ in range(ns.repeat):  # stages interleaved: a busy spell hits them all alike
            for stage in chosen:
                runs[stage].append(await cost(stage, calls, Path(os.devnull), ns.method))
    median = f", median of {ns.repeat} runs" if ns.repeat > 1 else ""
    # A page costs milliseconds, a small call microseconds.
    unit, scale = ("ms", 1e-3) if ns.method == "list-volumes" else ("µs", 1.0)
    print(f"{'stage':20} {unit} CPU per call ({calls} {rpc} calls, in-process{median})")
    for stage, each in runs.items():
        extra = "  (" + " ".join(f"{us * scale:.2f}" for us in each) + ")" if ns.repeat > 1 else ""
        print(f"{stage:20} {statistics.median(each) * scale:8.2f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
