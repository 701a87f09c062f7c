"""A multi-process Python load generator with the Go generator's flags and JSON output.

Used where the Go toolchain or Debian's grpc-go package is missing. Each process owns one
channel and runs its share of the streams as coroutines; the parent merges latencies. It
is several times costlier per call than the Go generator, so its own ceiling (measured
against the bare plugin in the same run) must be read before any proxy figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import grpc


def _seconds(raw: str) -> float:
    text = raw.strip()
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pyloadgen")
    p.add_argument("--addr", required=True)
    p.add_argument("--method", default="/csi.v1.Identity/GetPluginInfo")
    p.add_argument("--request", default="")
    p.add_argument("--server-stream", action="store_true")
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--duration", type=_seconds, default=0.0)
    p.add_argument("--calls", type=int, default=0)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--timeout", type=_seconds, default=60.0)
    p.add_argument("--procs", type=int, default=0, help="processes (default: min(streams, 2))")
    return p.parse_args(argv)


async def _worker(
    ns: argparse.Namespace, request: bytes, streams: int, calls: int
) -> dict[str, Any]:
    target = ns.addr.replace("unix://", "unix:", 1)
    size = 256 * 1024 * 1024
    options = [
        ("grpc.max_receive_message_length", size),
        ("grpc.max_send_message_length", size),
        ("grpc.default_authority", "localhost"),
    ]
    latencies: list[float] = []
    counts = {"errors": 0, "messages": 0, "bytes": 0}
    first_error = ""
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        if ns.server_stream:
            stream_call = channel.unary_stream(ns.method)
        else:
            unary_call = channel.unary_unary(ns.method)

        async def one() -> None:
            nonlocal first_error
            try:
                if ns.server_stream:
                    async for raw in stream_call(request, timeout=ns.timeout):
                        counts["messages"] += 1
                        counts["bytes"] += len(raw)
                else:
                    raw = await unary_call(request, timeout=ns.timeout)
                    counts["messages"] += 1
                    counts["bytes"] += len(raw)
            except grpc.aio.AioRpcError as err:
                counts["errors"] += 1
                first_error = first_error or f"{err.code().name}: {err.details()}"

        async def warm() -> None:
            for _ in range(ns.warmup):
                await one()

        await asyncio.gather(*(warm() for _ in range(streams)))
        counts.update(errors=0, messages=0, bytes=0)
        remaining = [calls]
        deadline = time.monotonic() + ns.duration if ns.duration else None

        async def run() -> None:
            while True:
                if deadline is not None:
                    if time.monotonic() >= deadline:
                        return
                else:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                t0 = time.perf_counter()
                await one()
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(run() for _ in range(streams)))
        elapsed = time.perf_counter() - start
    return {"latencies": latencies, "seconds": elapsed, "first_error": first_error, **counts}


def _run_worker(args: tuple[list[str], int, int]) -> dict[str, Any]:
    argv, streams, calls = args
    ns = parse(argv)
    request = Path(ns.request).read_bytes() if ns.request else b""
    return asyncio.run(_worker(ns, request, streams, calls))


def main(argv: list[str]) -> None:
    ns = parse(argv)
    procs = ns.procs or min(ns.streams, 2)
    shares = [ns.streams // procs + (1 if i < ns.streams % procs else 0) for i in range(procs)]
    call_shares = [ns.calls * s // ns.streams for s in shares]
    jobs = [(argv, s, c) for s, c in zip(shares, call_shares, strict=True) if s]
    if len(jobs) == 1:
        parts = [_run_worker(jobs[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
            parts = pool.map(_run_worker, jobs)
    lat = sorted(x for part in parts for x in part["latencies"])
    seconds = max(part["seconds"] for part in parts)
    result: dict[str, Any] = {
        "calls": len(lat),
        "errors": sum(p["errors"] for p in parts),
        "first_error": next((p["first_error"] for p in parts if p["first_error"]), ""),
        "seconds": seconds,
        "throughput": len(lat) / seconds if seconds else 0.0,
        "messages": sum(p["messages"] for p in parts),
        "bytes": sum(p["bytes"] for p in parts),
        "generator": "python",
    }
    if lat:
        result.update(
            mean_us=sum(lat) / len(lat) * 1e6,
            p50_us=lat[len(lat) // 2] * 1e6,
            p99_us=lat[len(lat) * 99 // 100] * 1e6,
            max_us=lat[-1] * 1e6,
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
