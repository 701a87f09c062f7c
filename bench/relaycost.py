"""CPU per call of the frame relay itself, in-process: no sockets, no other process.

    python bench/relaycost.py                     # 20,000 passthrough GetPluginInfo calls
    python bench/relaycost.py --calls 5000 --batch 16
    python bench/relaycost.py --serve-args=--log-payloads   # with the default stages
    python bench/relaycost.py --method list-volumes --calls 40 --serve-args=--log-payloads

A CO connection and a plugin connection are fed prepared bytes: the CO writes `--batch`
unary calls per read (as a loaded client does), the plugin answers each with headers, one
message and trailers, HPACK-encoded the way grpc servers encode them. The relay runs with
no stage (passthrough), so what is measured is the HTTP/2 work on both sides: frames,
HPACK, the stream mapping and flow control. ``--serve-args`` builds the stages
`plugproxy serve` would build from those flags (``""`` is the default configuration), so
the figure then includes the stages' hooks and what a call with a chain costs the relay
(its Call, metadata, held request and re-encoded headers); their log lines are discarded.
``--method list-volumes`` answers run.py's 10,000-entry ListVolumes page instead, one call
at a time, in DATA frames of 16 KiB that arrive 64 KiB a read; the plugin's capabilities
are asked first, untimed, as a proxy learns them before it judges a listing.

The time per call moves with whatever else the machine runs. For a figure that does not,
count instructions with valgrind and take the difference of two call counts, both runs
preparing the same bytes (``--prepare``), so that the harness's own HPACK encoding of the
calls cancels out and only the relay's work remains:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/relaycost.py --calls 1000 --prepare 4000    # then --calls 4000
    # instructions per call = (I(4000) - I(1000)) / 3000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import hpack

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import payloads  # noqa: E402

from plugproxy.cli import serve  # noqa: E402
from plugproxy.core.endpoints import parse_endpoint  # noqa: E402
from plugproxy.core.log import Logger  # noqa: E402
from plugproxy.relay.framerelay import FrameRelay  # noqa: E402
from plugproxy.relay.frames import (  # noqa: E402
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    PREFACE,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    settings_frame,
)
from plugproxy.relay.pairing import Pairing, PluginSide  # noqa: E402
from plugproxy.relay.upstream import Upstream  # noqa: E402
from plugproxy.spec.registry import Registry  # noqa: E402


class Sink(asyncio.Transport):
    """A transport that drops what is written to it."""

    def writelines(self, data: Any) -> None:
        pass

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return "bench" if name == "peername" else default


READ = 64 * 1024  # what the plugin's answers arrive in, a read at a time
FRAME = 16 * 1024  # SETTINGS_MAX_FRAME_SIZE at its default


LIST_ENTRIES = 10_000  # run.py's ListVolumes page


def calls_of(method: str, calls: int) -> tuple[list[tuple[str, bytes]], int]:
    """(path, answer) of each call, and how many of the first are asked untimed."""
    if method == "list-volumes":
        untimed = list(payloads.capability_responses().items())
        page = payloads.list_volumes_response(LIST_ENTRIES)
        return [*untimed, *[(payloads.LIST_VOLUMES, page)] * calls], len(untimed)
    return [(payloads.PLUGIN_INFO, payloads.plugin_info_response())] * calls, 0


def prepared(batch: int, answers: list[tuple[str, bytes]]) -> tuple[list[bytes], list[list[bytes]]]:
    """What the CO writes, one read per ``batch`` calls, and what the plugin answers to
    each batch, in reads of READ bytes; ``answers``: (path, answer) of each call."""
    client, server = hpack.Encoder(), hpack.Encoder()
    request = b"\x00\x00\x00\x00\x00"  # an empty request: every method here takes one
    co_reads, plugin_reads = [], []
    for first in range(0, len(answers), batch):
        co, plugin = [], []
        for n in range(first, min(first + batch, len(answers))):
            path, body = answers[n]
            answer = b"\x00" + len(body).to_bytes(4, "big") + body
            sid = 2 * n + 1  # both sides number streams alike: the relay opens them in order
            block = client.encode(
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", path),
                    (":authority", "localhost"),
                    ("content-type", "application/grpc"),
                    ("user-agent", "grpc-go/1.33.3"),
                    ("te", "trailers"),
                    # Deadlines move: about one call in three carries a value not seen before
                    # (as a grpc-go client's do under load), which HPACK sends as a literal.
                    ("grpc-timeout", f"{9_990_000 + n // 3}m"),
                ]
            )
            co.append(
                frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, request)
            )
            head = server.encode([(":status", "200"), ("content-type", "application/grpc")])
            tail = server.encode([("grpc-status", "0"), ("grpc-message", "")])
            plugin.append(frame(HEADERS, END_HEADERS, sid, head))
            plugin += [
                frame(DATA, 0, sid, answer[at : at + FRAME]) for at in range(0, len(answer), FRAME)
            ]
            plugin.append(frame(HEADERS, END_HEADERS | END_STREAM, sid, tail))
        co_reads.append(b"".join(co))
        answered = b"".join(plugin)
        plugin_reads.append([answered[at : at + READ] for at in range(0, len(answered), READ)])
    return co_reads, plugin_reads


async def cost(
    calls: int,
    batch: int,
    serve_args: str | None = None,
    log: TextIO | None = None,
    method: str = "plugin-info",
    prepare: int = 0,
) -> float:
    logger = Logger(fmt="json", level="warning")
    upstream = Upstream(parse_endpoint("unix:///bench.sock", "--upstream"), logger, 1 << 24)
    registry: Any = Registry(("csi.v1",))
    stages: list[Any] = []
    if serve_args is not None:
        endpoints = ["--listen", "unix:///bench-in.sock", "--upstream", "unix:///bench.sock"]
        settings = serve.parse_settings(
            [*endpoints, "--admin-listen", "off", *shlex.split(serve_args)]
        )
        logger = Logger(log)
        server = serve.ProxyServer(settings, logger=logger)
        registry, stages = server.registry, server.stages
    sides: list[PluginSide] = []
    dialled = asyncio.Event()

    async def connect(pairing: Pairing) -> PluginSide:
        side = PluginSide(pairing)
        side.connection_made(Sink())
        sides.append(side)
        dialled.set()
        return side

    relay = FrameRelay(
        registry,
        upstream,
        stages,
        logger,
        max_message_bytes=1 << 24,
        max_concurrent_calls=10_000,
        dial=connect,
    )
    pairing = Pairing(relay)
    pairing.connection_made(Sink())
    await dialled.wait()
    # The CO grants the relay all the window it could want; the plugin says hello.
    grant = frame(WINDOW_UPDATE, 0, 0, (2**31 - 1 - 65_535).to_bytes(4, "big"))
    windows = settings_frame({INITIAL_WINDOW_SIZE: 2**31 - 1})
    pairing.data_received(PREFACE + windows + grant)
    sides[0].data_received(frame(SETTINGS, 0, 0))
    answers, untimed = calls_of(method, max(calls, prepare))
    if untimed:
        batch = 1  # a listing's calls one at a time, as a CO pages through them
    reads = list(zip(*prepared(batch, answers), strict=True))
    timed = untimed // batch
    # Calls prepared beyond --calls are never sent: only their encoding is paid.
    reads = reads[: timed + -(-calls // batch)]

    def relay_all(part: list[tuple[bytes, list[bytes]]]) -> None:
        for co_read, plugin_reads in part:
            pairing.data_received(co_read)
            for chunk in plugin_reads:
                sides[0].data_received(chunk)

    relay_all(reads[:timed])
    gc.collect()
    start = time.process_time()
    relay_all(reads[timed:])
    spent = time.process_time() - start
    if relay.active or len(sides) != 1:
        raise SystemExit("bench/relaycost.py: calls did not complete; the harness is out of date")
    return spent / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=8, help="calls per read")
    parser.add_argument(
        "--prepare",
        type=int,
        default=0,
        help="encode this many calls (at least --calls) and relay the first --calls",
    )
    parser.add_argument("--method", choices=("plugin-info", "list-volumes"), default="plugin-info")
    parser.add_argument(
        "--serve-args", default=None, help='stages as these serve flags build them ("": defaults)'
    )
    ns = parser.parse_args()
    with open(os.devnull, "w") as log:
        us = asyncio.run(cost(ns.calls, ns.batch, ns.serve_args, log, ns.method, ns.prepare))
    what = "passthrough" if ns.serve_args is None else f"serve {ns.serve_args or '(defaults)'}"
    if ns.method == "list-volumes":
        print(f"frame relay, {what}: {us / 1000:.2f} ms CPU per ListVolumes call")
    else:
        print(f"frame relay, {what}: {us:.1f} µs CPU per call")


if __name__ == "__main__":
    main()
