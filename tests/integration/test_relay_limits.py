"""The frame relay's bounds (src/plugproxy/relay/limits.py) against misbehaving HTTP/2 peers.

Each test runs the proxy as a separate process (so its VmRSS can be read from /proc), the
recorder plugin in the test process, one raw attacker (an asyncio UNIX socket writing frames
built with plugproxy.relay.frames, hpack and h2) and, on another connection, a real
grpc.aio client that keeps making unary calls while the attack runs. Each test checks that
the proxy's memory stays within a bound derived from limits.py, that the attacker gets the
reaction the RFCs and limits.py promise, and that the other client is served throughout.

The measured numbers (RSS before / peak / after, time to the proxy's reaction) are printed
at the end of the module (``pytest -s``) for docs/hardening.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.settings
import pytest

from plugproxy.net.sockets import socket_answers
from plugproxy.relay import hpackcodec
from plugproxy.relay.frames import (
    CANCEL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    PRIORITY,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    header_frames,
    rst_stream,
)
from plugproxy.relay.limits import DEFAULT_LIMITS as LIMITS
from plugproxy.relay.limits import DEFAULT_WINDOW
from tests.support import ECHO, RecorderPlugin

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
CREATE = "/csi.v1.Controller/CreateVolume"  # known: its request is gathered for the stages
# Known, unary, not asked by the proxy itself (the metrics stage calls GetPluginInfo): its
# answers are gathered for the stages' finish hooks as well as relayed.
LIST_VOLUMES = "/csi.v1.Controller/ListVolumes"
BIG = "/test.Big/Get"  # unknown to the proxy: relayed as bytes, never gathered
DEFAULT_MAX_MESSAGE = 16 * MiB  # --max-message-bytes default
PROBE_TIMEOUT = 2.0  # the other client's calls must each complete within this, during attacks
ATTACK_SECONDS = 10.0  # no attack loop runs longer than this

# Bound used by several tests: the proxy starts at ~50 MiB; an attack that the limits
# contain costs it a few MiB (a header block, a window, some stream state). 40 MiB leaves
# room for allocator noise and Python's arenas, and is far below what each attack would
# cost without its limit (noted per test).
GENERAL_BOUND = 40 * MiB


# -- measurements ----------------------------------------------------------------------------


@dataclass
class Row:
    attack: str
    before: int  # KiB
    peak: int
    after: int
    reaction: float | None  # seconds from the attack's first byte to the proxy's reaction
    note: str = ""


RESULTS: list[Row] = []


@pytest.fixture(scope="module", autouse=True)
def _print_results() -> Any:
    yield
    if not RESULTS:
        return
    lines = [
        "",
        "relay limits: proxy VmRSS (MiB) before / peak / after each attack, and reaction time",
        f"{'attack':44} {'before':>7} {'peak':>7} {'after':>7} {'growth':>7} {'reaction':>9}  note",
    ]
    for r in RESULTS:
        reaction = "-" if r.reaction is None else f"{r.reaction * 1000:.0f} ms"
        lines.append(
            f"{r.attack:44} {r.before / 1024:7.1f} {r.peak / 1024:7.1f} {r.after / 1024:7.1f} "
            f"{(r.peak - r.before) / 1024:+7.1f} {reaction:>9}  {r.note}"
        )
    print("\n".join(lines))


def _status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])  # kB
    raise AssertionError(f"no {key} for {pid}")


class Memory:
    """VmRSS of the proxy: before the attack, sampled during it, and its peak (VmHWM, reset
    through /proc/<pid>/clear_refs when the kernel lets us, else the highest sample)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = 0
        self.samples: list[int] = []
        self.hwm_reset = False
        self._task: asyncio.Task[None] | None = None

    def rss(self) -> int:
        return _status(self.pid, "VmRSS")

    def start(self) -> None:
        self.before = self.rss()
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.samples = [self.before]
        self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            with contextlib.suppress(OSError, AssertionError):
                self.samples.append(self.rss())

    def peak(self) -> int:
        peak = max(self.samples)
        if self.hwm_reset:
            with contextlib.suppress(OSError, AssertionError):
                peak = max(peak, _status(self.pid, "VmHWM"))
        return peak

    async def stop(self) -> int:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return self.peak()

    def growth(self) -> int:
        return (self.peak() - self.before) * 1024  # bytes


# -- processes and peers ---------------------------------------------------------------------


@dataclass
class Proxy:
    proc: subprocess.Popen[bytes]
    listen: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


async def wait_socket(path: str, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not socket_answers(path, 0.2):
        if proc.poll() is not None:
            raise AssertionError(f"the proxy exited with {proc.returncode} before listening")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not start listening in time")
        await asyncio.sleep(0.02)


def spawn_proxy(listen: str, upstream: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "plugproxy",
                "serve",
                "--listen",
                f"unix://{listen}",
                "--upstream",
                f"unix://{upstream}",
                "--admin-listen",
                "off",
                "--relay",
                "frames",
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    finally:
        out.close()


@contextlib.asynccontextmanager
async def proxy_process(tmp_path: Path, upstream: str, *args: str) -> AsyncIterator[Proxy]:
    """The proxy as its own process (killed at the end), with the frame relay."""
    listen = str(tmp_path / "proxy.sock")
    assert len(listen) < 100, listen
    log = tmp_path / "proxy.log"
    proc = spawn_proxy(listen, upstream, log, *args)
    try:
        await wait_socket(listen, proc)
        yield Proxy(proc, listen, log)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.fixture
async def recorder(tmp_path: Path) -> AsyncIterator[tuple[RecorderPlugin, str]]:
    """The recorder plugin (tests/support.py) in this process; it accepts large requests so
    that a stream it is sent stays open rather than being refused by gRPC's 4 MiB default."""
    path = str(tmp_path / "plugin.sock")
    plugin = RecorderPlugin()
    server = grpc.aio.server(options=(("grpc.max_receive_message_length", 64 * MiB),))
    server.add_generic_rpc_handlers([plugin])
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    try:
        yield plugin, path
    finally:
        await server.stop(0)


class Prober:
    """The other client: a real gRPC channel making one unary call after another."""

    def __init__(self, listen: str, path: str = ECHO + "Unary") -> None:
        self.channel = grpc.aio.insecure_channel(f"unix:{listen}")
        self.call = self.channel.unary_unary(path)
        self.results: list[tuple[float, float, str]] = []  # (start, end, code name)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Prober:
        assert await self.call(b"warm-up", timeout=10) == b"echo:warm-up"
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, PROBE_TIMEOUT + 5)
        await self.channel.close()

    async def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                answer = await self.call(b"probe", timeout=PROBE_TIMEOUT)
                code = "OK" if answer == b"echo:probe" else "WRONG-ANSWER"
            except grpc.aio.AioRpcError as err:
                code = err.code().name
            self.results.append((start, time.monotonic(), code))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.02)

    async def check(self, start: float, end: float, max_latency: float = PROBE_TIMEOUT) -> str:
        """Every call overlapping [start, end] succeeded within ``max_latency``, and at least
        one call started at or after ``start`` (for attacks shorter than a call, the first
        such call counts as during). Returns a summary for the table."""
        deadline = time.monotonic() + PROBE_TIMEOUT + 2
        while not any(r[0] >= start for r in self.results):
            assert time.monotonic() < deadline, "the other client completed no call"
            await asyncio.sleep(0.01)
        first = min(r[0] for r in self.results if r[0] >= start)
        end = max(end, first)
        during = [r for r in self.results if r[1] >= start and r[0] <= end]
        bad = [r for r in during if r[2] != "OK"]
        assert not bad, f"the other client's calls failed during the attack: {bad[:5]}"
        slowest = max(r[1] - r[0] for r in during)
        assert slowest < max_latency, f"a call of the other client took {slowest:.2f}s"
        return f"other client: {len(during)} calls OK, max {slowest * 1000:.0f} ms"


OPEN_PEERS: list[Peer] = []


@pytest.fixture(autouse=True)
async def _close_peers() -> AsyncIterator[None]:
    """Raw peers a test leaves open (say, on a failed assertion) are closed after it."""
    yield
    while OPEN_PEERS:
        await OPEN_PEERS.pop().close()


class Peer:
    """A raw HTTP/2 client over a non-blocking UNIX socket; optionally reads and parses
    what the proxy sends (GOAWAY, RST_STREAM, WINDOW_UPDATE are recorded)."""

    def __init__(self, path: str) -> None:
        OPEN_PEERS.append(self)
        self.path = path
        self.sock: socket.socket | None = None
        self.sent = 0
        self.broken = False  # a write failed: the proxy closed the connection
        self.stalled = False  # a write did not complete in time: the proxy stopped reading
        self.failed_at: float | None = None  # when the write that broke or stalled began
        self.started = 0.0
        self.goaway: tuple[int, int, bytes] | None = None  # (last stream, code, debug)
        self.goaway_at: float | None = None
        self.eof_at: float | None = None
        self.resets: dict[int, int] = {}
        self.first_reset_at: float | None = None
        self.counts: Counter[int] = Counter()
        self.conn_credit = 0  # WINDOW_UPDATE increments on stream 0
        self.reacted = asyncio.Event()  # GOAWAY or EOF
        self._reader: asyncio.Task[None] | None = None
        self._buf = bytearray()

    async def open(self, *, read: bool = True, rcvbuf: int = 0, preface: bool = True) -> Peer:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await loop.sock_connect(sock, self.path)
        self.sock = sock
        if read:
            self._reader = loop.create_task(self._read())
        if preface:
            assert await self.send(PREFACE + frame(SETTINGS, 0, 0))
        self.started = time.monotonic()
        return self

    async def send(self, data: bytes, timeout: float = 5.0) -> bool:
        if self.broken or self.stalled or self.sock is None:
            return False
        began = time.monotonic()
        try:
            await asyncio.wait_for(
                asyncio.get_running_loop().sock_sendall(self.sock, data), timeout
            )
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.broken = True
            self.failed_at = began
            return False
        except TimeoutError:
            self.stalled = True
            self.failed_at = began
            return False
        self.sent += len(data)
        return True

    def start_reading(self) -> None:
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        assert self.sock is not None
        while True:
            try:
                chunk = await loop.sock_recv(self.sock, 1 << 18)
            except OSError:
                chunk = b""
            if not chunk:
                self.eof_at = time.monotonic()
                self.reacted.set()
                return
            buf = self._buf
            buf += chunk
            pos = 0
            while len(buf) - pos >= 9:
                size = int.from_bytes(buf[pos : pos + 3], "big")
                if len(buf) - pos < 9 + size:
                    break
                ftype, sid = buf[pos + 3], int.from_bytes(buf[pos + 5 : pos + 9], "big")
                payload = bytes(buf[pos + 9 : pos + 9 + min(size, 512)])
                pos += 9 + size
                self._frame(ftype, sid & 0x7FFFFFFF, payload)
            del buf[:pos]

    def _frame(self, ftype: int, sid: int, payload: bytes) -> None:
        self.counts[ftype] += 1
        now = time.monotonic()
        if ftype == GOAWAY and self.goaway is None:
            last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            self.goaway = (last, int.from_bytes(payload[4:8], "big"), payload[8:])
            self.goaway_at = now
            self.reacted.set()
        elif ftype == RST_STREAM:
            self.resets[sid] = int.from_bytes(payload[:4], "big")
            if self.first_reset_at is None:
                self.first_reset_at = now
        elif ftype == WINDOW_UPDATE and sid == 0:
            self.conn_credit += int.from_bytes(payload[:4], "big") & 0x7FFFFFFF

    async def wait_reaction(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self.reacted.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def read_to_end(self, timeout: float) -> None:
        """Start reading (if not yet) and wait for the proxy to close the connection."""
        self.start_reading()
        assert self._reader is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), timeout)

    def reaction_time(self) -> float | None:
        at = self.goaway_at or self.eof_at
        return None if at is None else at - self.started

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def request_headers(path: str, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode()),
        (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *extra,
    ]


def request_block(path: str, *extra: tuple[bytes, bytes]) -> bytes:
    """A header block of literals that never enter the dynamic table: stands on its own."""
    return hpackcodec.encode(request_headers(path, *extra))


hpack_int = hpackcodec.encode_integer  # RFC 7541 §5.1


def literal_indexed(name: bytes, value: bytes) -> bytes:
    """RFC 7541 §6.2.1: literal with incremental indexing, new name, no Huffman."""
    return b"\x40" + hpack_int(len(name), 7, 0) + name + hpack_int(len(value), 7, 0) + value


def grpc_prefix(length: int) -> bytes:
    return b"\x00" + length.to_bytes(4, "big")


@dataclass
class Attack:
    memory: Memory
    reaction: float | None = None  # filled in by the test
    note: str = ""


@contextlib.asynccontextmanager
async def measured(proxy: Proxy, name: str) -> AsyncIterator[Attack]:
    """Samples the proxy's RSS around the block and records a row for the table (the block
    sets the attack's reaction time and note). Checks the proxy is still alive after."""
    attack = Attack(Memory(proxy.pid))
    memory = attack.memory
    memory.start()
    try:
        yield attack
    finally:
        peak = await memory.stop()
        await asyncio.sleep(0.3)  # the connections the attack used are closed by now
        after = memory.rss() if proxy.alive() else 0
        RESULTS.append(Row(name, memory.before, peak, after, attack.reaction, attack.note))
    assert proxy.alive(), "the proxy died during the attack"


def assert_bounded(memory: Memory, bound: int, what: str) -> None:
    growth = memory.growth()
    assert growth < bound, (
        f"{what}: proxy RSS grew by {growth / MiB:.1f} MiB "
        f"({memory.before / 1024:.1f} -> {memory.peak() / 1024:.1f} MiB), bound {bound / MiB:.0f}"
    )


# -- 1. CONTINUATION flood -------------------------------------------------------------------


async def test_continuation_flood_is_cut_at_max_header_block_bytes(tmp_path, recorder):
    """HEADERS without END_HEADERS, then CONTINUATION after CONTINUATION (16 KiB each, up to
    10,000 per connection = 160 MiB): FrameReader checks the block's size as each fragment
    arrives, so past max_header_block_bytes (64 KiB) the connection gets GOAWAY
    ENHANCE_YOUR_CALM and the proxy has held at most one block per connection.

    Bound: 8 connections x 64 KiB of block + read buffers is well under 1 MiB; +16 MiB leaves
    room for noise. Without the check each connection would hold what it sent (up to 160 MiB,
    so >1 GiB here), and the header_block_seconds timer would only fire after 10 s."""
    _, upstream = recorder
    conns, frames_each = 8, 10_000
    fragment = frame(CONTINUATION, 0, 1, b"\x00" * LIMITS.max_frame_size)
    async with (
        proxy_process(tmp_path, upstream) as proxy,
        Prober(proxy.listen) as prober,
        measured(proxy, "1. CONTINUATION flood (8 conns)") as m,
    ):
        peers = [await Peer(proxy.listen).open() for _ in range(conns)]
        start = time.monotonic()

        async def flood(peer: Peer) -> int:
            sent = 0
            await peer.send(frame(HEADERS, END_STREAM, 1, request_block(ECHO + "Unary")))
            deadline = time.monotonic() + ATTACK_SECONDS
            while sent < frames_each and not peer.reacted.is_set():
                if time.monotonic() > deadline or not await peer.send(fragment, 2.0):
                    break
                sent += 1
            return sent

        sent = await asyncio.gather(*(flood(p) for p in peers))
        for peer in peers:
            await peer.wait_reaction(5)
        end = time.monotonic()
        assert_bounded(m.memory, 16 * MiB, "CONTINUATION flood")
        reactions = [p.reaction_time() for p in peers]
        for peer in peers:
            assert peer.goaway is not None, "no GOAWAY for an endless header block"
            assert peer.goaway[1] == ENHANCE_YOUR_CALM, peer.goaway
        # The proxy stopped reading long before the 10,000th fragment (it failed the
        # connection at the fourth, past 64 KiB; what more we wrote went into socket buffers).
        assert max(sent) < 200, sent
        assert all(r is not None and r < 2.0 for r in reactions), reactions
        m.reaction = max(r for r in reactions if r is not None)
        m.note = (
            f"GOAWAY ENHANCE_YOUR_CALM on {conns}/{conns}; <= {max(sent)} fragments "
            f"written of {frames_each}; " + await prober.check(start, end)
        )
        for peer in peers:
            await peer.close()


async def test_empty_continuation_flood_is_cut_at_max_continuation_frames(tmp_path, recorder):
    """The other CONTINUATION flood: empty fragments, so the block never grows and the byte
    bound never trips; each one still costs a frame's work. The number of CONTINUATION
    frames a block may take (max_continuation_frames) ends it: GOAWAY ENHANCE_YOUR_CALM at
    once, after no more fragments than that limit were read.

    Bound: +16 MiB (the block stays empty)."""
    _, upstream = recorder
    batch = frame(CONTINUATION, 0, 1) * 2_000
    async with (
        proxy_process(tmp_path, upstream) as proxy,
        Prober(proxy.listen) as prober,
        measured(proxy, "1b. empty CONTINUATION flood") as m,
    ):
        peer = await Peer(proxy.listen).open()
        start = peer.started
        await peer.send(frame(HEADERS, END_STREAM, 1, request_block(ECHO + "Unary")))
        written = 0
        while not peer.reacted.is_set() and time.monotonic() - start < 5:
            if not await peer.send(batch, 2.0):
                break
            written += 2_000
            await asyncio.sleep(0.002)
        assert await peer.wait_reaction(2), f"no reaction after {written} fragments"
        end = time.monotonic()
        assert_bounded(m.memory, 16 * MiB, "empty CONTINUATION flood")
        assert peer.goaway is not None and peer.goaway[1] == ENHANCE_YOUR_CALM, peer.goaway
        reaction = peer.reaction_time()
        assert reaction is not None and reaction < 2, reaction
        m.reaction = reaction
        other = await prober.check(start, end)
        m.note = f"GOAWAY ENHANCE_YOUR_CALM after {written} empty fragments sent; {other}"
        await peer.close()
    assert '"reason":"too many CONTINUATION frames"' in proxy.log.read_text()


# -- 2. HPACK amplification ------------------------------------------------------------------


async def test_hpack_amplification_stops_at_max_header_list_size(tmp_path, recorder):
    """A 4 KiB literal inserted into the dynamic table, then referenced by one-byte indexed
    fields (0xBE) tens of thousands of times: 40,000 references decode to 161 MB of header
    list from a 44 KB block. Two forms: all in one block (hpack's decoder) and the
    references alone in a second block (the relay's fast path for indexed-only blocks).
    Decoding stops as soon as max_header_list_size (64 KiB) is passed: GOAWAY
    ENHANCE_YOUR_CALM within milliseconds, and the event loop is never busy long enough to
    delay the other client.

    Bound: +40 MiB. Without the limit each block would be re-encoded toward the plugin as
    ~160 MB of literals (10 connections: >1.5 GB) and keep the loop busy for seconds."""
    _, upstream = recorder
    amp = literal_indexed(b"x-amp", b"a" * 4000)  # 4,037 bytes in the table (4096 max)
    one_block = request_block(ECHO + "Unary") + amp + b"\xbe" * 40_000
    insert = request_block(ECHO + "Unary") + amp
    refs_only = b"\xbe" * 60_000
    assert len(one_block) < LIMITS.max_header_block_bytes
    async with (
        proxy_process(tmp_path, upstream) as proxy,
        Prober(proxy.listen) as prober,
        measured(proxy, "2. HPACK amplification (10 conns)") as m,
    ):
        start = time.monotonic()
        peers: list[Peer] = []
        for i in range(10):
            peer = await Peer(proxy.listen).open()
            peers.append(peer)
            if i % 2:
                sent_at = time.monotonic()
                await peer.send(header_frames(1, one_block, True))
            else:
                await peer.send(header_frames(1, insert, True))
                await asyncio.sleep(0.05)  # a separate read: stream 1 is a normal call
                sent_at = time.monotonic()
                await peer.send(header_frames(3, refs_only, True))
            assert await peer.wait_reaction(5), "no reaction to the amplified block"
            peer.started = sent_at
            await asyncio.sleep(0.05)
        end = time.monotonic()
        assert_bounded(m.memory, GENERAL_BOUND, "HPACK amplification")
        for peer in peers:
            assert peer.goaway is not None and peer.goaway[1] == ENHANCE_YOUR_CALM, peer.goaway
        reactions = [p.reaction_time() or 0.0 for p in peers]
        assert max(reactions) < 1.0, reactions
        m.reaction = max(reactions)
        m.note = "GOAWAY ENHANCE_YOUR_CALM on 10/10; " + await prober.check(start, end, 1.0)
        for peer in peers:
            await peer.close()


# -- 3. Oversized frame ----------------------------------------------------------------------


async def test_oversized_frame_is_refused_before_its_payload_is_read(tmp_path, recorder):
    """A DATA frame header declaring 16 MiB - 1 (the largest 24-bit length) against our
    SETTINGS_MAX_FRAME_SIZE of 16 KiB: GOAWAY FRAME_SIZE_ERROR from the 9-byte header alone.

    Bound: +24 MiB for 4 connections. A reader that waited for the whole frame would hold
    16 MiB per connection (64 MiB here) before even looking at it."""
    _, upstream = recorder
    declared = (1 << 24) - 1
    chunk = b"\x00" * (256 * 1024)
    async with (
        proxy_process(tmp_path, upstream) as proxy,
        Prober(proxy.listen) as prober,
        measured(proxy, "3. oversized DATA frame (4 conns)") as m,
    ):
        start = time.monotonic()

        async def attack() -> tuple[Peer, int]:
            peer = await Peer(proxy.listen).open()
            await peer.send(frame(HEADERS, END_HEADERS, 1, request_block(ECHO + "Unary")))
            await peer.send(declared.to_bytes(3, "big") + bytes((DATA, 0)) + (1).to_bytes(4, "big"))
            payload = 0
            deadline = time.monotonic() + ATTACK_SECONDS
            while payload < declared and time.monotonic() < deadline:
                if not await peer.send(chunk, 2.0):
                    break
                payload += len(chunk)
            await peer.wait_reaction(5)
            return peer, payload

        results = await asyncio.gather(*(attack() for _ in range(4)))
        end = time.monotonic()
        assert_bounded(m.memory, 24 * MiB, "oversized frame")
        for peer, payload in results:
            assert peer.goaway is not None and peer.goaway[1] == FRAME_SIZE_ERROR, peer.goaway
            # The proxy closed at the header: it never took the 16 MiB we meant to send.
            assert payload < 4 * MiB, payload
        reactions = [p.reaction_time() or 0.0 for p, _ in results]
        assert max(reactions) < 1.0, reactions
        m.reaction = max(reactions)
        m.note = (
            "GOAWAY FRAME_SIZE_ERROR on 4/4; payload written before the close "
            f"<= {max(p for _, p in results) // 1024} KiB of 16 MiB; "
            + await prober.check(start, end)
        )
        for peer, _ in results:
            await peer.close()


# -- 4. gRPC length-prefix claims ------------------------------------------------------------


@pytest.mark.parametrize("path", [CREATE, ECHO + "Hang"], ids=["known-csi", "unknown"])
async def test_length_prefix_claims_cost_only_the_bytes_that_arrived(tmp_path, recorder, path):
    """500 streams, each sending only a 5-byte gRPC prefix claiming 16 MiB (the default
    --max-message-bytes, so it is not refused) and nothing more. Messages keeps what arrived,
    never what a prefix claims; a known CSI method (gathered for the stages) and an unknown
    one (relayed) alike.

    Bound: +40 MiB; 500 streams' state is a few MiB. Allocating for the claims would be
    500 x 16 MiB = 8 GiB."""
    plugin, upstream = recorder
    streams = 500
    async with proxy_process(tmp_path, upstream) as proxy, Prober(proxy.listen) as prober:
        plugin.raw[CREATE] = lambda req: b""
        async with grpc.aio.insecure_channel(f"unix:{proxy.listen}") as warm:
            await warm.unary_unary(CREATE)(b"\x0a\x03pvc", timeout=5)  # stages loaded
        async with measured(proxy, f"4. prefix claims x500 ({path.rsplit('/', 1)[1]})") as m:
            peer = await Peer(proxy.listen).open()
            start = time.monotonic()
            claim = grpc_prefix(DEFAULT_MAX_MESSAGE)
            for batch in range(0, streams, 50):
                out = b"".join(
                    frame(HEADERS, END_HEADERS, 2 * i + 1, request_block(path))
                    + frame(DATA, 0, 2 * i + 1, claim)
                    for i in range(batch, batch + 50)
                )
                assert await peer.send(out)
            await asyncio.sleep(1.0)  # the calls sit in the proxy (and the plugin)
            end = time.monotonic()
            assert_bounded(m.memory, GENERAL_BOUND, "length-prefix claims")
            assert peer.goaway is None and not peer.resets, (peer.goaway, peer.resets)
            m.note = f"{streams} calls held, none refused; " + await prober.check(start, end)
            await peer.close()


async def fill_windows(peer: Peer, path: str, streams: int) -> int:
    """Opens ``streams`` calls on ``path``, each sending a prefix that claims 16 MiB and then
    exactly its initial stream window (1 MiB, prefix included): all the proxy granted. The
    connection window is respected too: before each stream we wait (up to 1 s) for the
    credit the proxy gives back on stream 0. Returns the bytes sent."""
    body = b"\x00" * LIMITS.max_frame_size
    per_stream = LIMITS.stream_window
    frames_per_stream = per_stream // len(body)
    granted = DEFAULT_WINDOW  # the proxy's WINDOW_UPDATEs on stream 0 add to it
    deadline = time.monotonic() + ATTACK_SECONDS
    sent = 0
    for i in range(streams):
        sid = 2 * i + 1
        out = [
            frame(HEADERS, END_HEADERS, sid, request_block(path)),
            frame(DATA, 0, sid, grpc_prefix(DEFAULT_MAX_MESSAGE) + body[:-5]),
            *[frame(DATA, 0, sid, body)] * (frames_per_stream - 1),
        ]
        waited = min(deadline, time.monotonic() + 1.0)
        while sent + per_stream > granted + peer.conn_credit:
            if time.monotonic() > waited or peer.reacted.is_set():
                return sent  # a proxy that holds the credit back ends the attack here
            await asyncio.sleep(0.005)
        if not await peer.send(b"".join(out)):
            break
        sent += per_stream
    return sent


async def test_partial_messages_on_many_streams_stay_within_the_collect_budget(tmp_path, recorder):
    """Up to 300 streams on CreateVolume (gathered whole for the stages), each sending a
    prefix claiming 16 MiB then exactly what the proxy granted the stream: its 1 MiB initial
    window (SETTINGS_INITIAL_WINDOW_SIZE), within the connection window as the proxy
    credits it. Gathered bytes are credited as they arrive, so the stream windows alone
    would let one connection fill max_concurrent_streams x 1 MiB (1 GiB); past
    collect_budget the proxy withholds the connection window too, and the attack stops.

    Bound: collect_budget (32 MiB) + connection_window (4 MiB) + 40 MiB of slack. (Before
    the connection window was withheld, 300 streams made the proxy hold 300 MiB.)"""
    plugin, upstream = recorder
    async with proxy_process(tmp_path, upstream) as proxy, Prober(proxy.listen) as prober:
        plugin.raw[CREATE] = lambda req: b""
        async with grpc.aio.insecure_channel(f"unix:{proxy.listen}") as warm:
            await warm.unary_unary(CREATE)(b"\x0a\x03pvc", timeout=5)
        async with measured(proxy, "4b. 300 streams x 1 MiB window, CreateVolume") as m:
            peer = await Peer(proxy.listen).open()
            start = time.monotonic()
            sent = await fill_windows(peer, CREATE, 300)
            await asyncio.sleep(0.5)
            end = time.monotonic()
            m.note = (
                f"credit withheld after {sent // MiB} MiB of 300 MiB "
                f"(connection credit {peer.conn_credit // MiB} MiB); "
                + await prober.check(start, end)
            )
            assert_bounded(
                m.memory,
                LIMITS.collect_budget + LIMITS.connection_window + GENERAL_BOUND,
                "partial messages",
            )
            # The proxy stopped crediting the connection once past the budget.
            budget = LIMITS.collect_budget + LIMITS.connection_window + LIMITS.stream_window
            assert sent <= budget, f"{sent // MiB} MiB gathered on one connection"
            assert peer.goaway is None  # within the windows granted: nothing to refuse
            await peer.close()


async def test_memory_of_closed_connections_is_given_back(tmp_path, recorder):
    """8 connections one after the other, each gathering 24 MiB of unfinished CreateVolume
    messages (24 streams x their 1 MiB window: within collect_budget), then closing. What a
    closed connection held must be freed, so the proxy needs about one connection's worth.

    Bound: 24 MiB (one connection) + 40 MiB of slack. (When a closed connection was left to
    Python's cyclic garbage collector, as reference cycles, each one added about 25 MiB
    until a full collection happened to run: +173 MiB after 8.)"""
    plugin, upstream = recorder
    rounds, streams = 8, 24
    async with proxy_process(tmp_path, upstream) as proxy, Prober(proxy.listen) as prober:
        plugin.raw[CREATE] = lambda req: b""
        async with grpc.aio.insecure_channel(f"unix:{proxy.listen}") as warm:
            await warm.unary_unary(CREATE)(b"\x0a\x03pvc", timeout=5)
        async with measured(proxy, "4c. 8 closed conns x 24 MiB gathered") as m:
            start = time.monotonic()
            after_close = []
            for _ in range(rounds):
                peer = await Peer(proxy.listen).open()
                sent = await fill_windows(peer, CREATE, streams)
                assert sent == streams * LIMITS.stream_window
                await asyncio.sleep(0.2)
                await peer.close()
                await asyncio.sleep(0.2)
                after_close.append(m.memory.rss() // 1024)
            end = time.monotonic()
            m.note = f"RSS (MiB) after each close: {after_close}; " + await prober.check(start, end)
            assert_bounded(
                m.memory, streams * LIMITS.stream_window + GENERAL_BOUND, "closed connections"
            )


# -- 5. DATA beyond the window ---------------------------------------------------------------


class Gate:
    """The plugin socket the proxy dials: each connection is spliced to the recorder,
    except those accepted while ``freeze`` is set, which are never read (a plugin that is
    stuck). The proxy dials the plugin once per CO connection, so an attacker's calls can
    go to a stuck plugin while other clients' calls reach the live one."""

    def __init__(self, path: str, target: str) -> None:
        self.path = path
        self.target = target
        self.freeze = False
        self.frozen: list[asyncio.StreamWriter] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._accept, self.path)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        if self.freeze:
            writer.transport.pause_reading()  # type: ignore[attr-defined]
            self.frozen.append(writer)
            return
        up_reader, up_writer = await asyncio.open_unix_connection(self.target)
        self.writers.append(up_writer)
        loop = asyncio.get_running_loop()
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = loop.create_task(self._pipe(src, dst))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while chunk := await src.read(1 << 16):
                dst.write(chunk)
                await dst.drain()
        dst.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        for writer in self.writers:
            writer.close()


async def test_data_beyond_the_window_is_a_flow_control_error(tmp_path, recorder):
    """Calls to a plugin that reads nothing: the proxy credits the CO only for bytes that
    reached the plugin, so after the connection window (4 MiB) nothing more may come. The
    attacker ignores that and writes 1 MiB on each of 64 streams (each within its stream
    window, 64 MiB in all): GOAWAY FLOW_CONTROL_ERROR once the connection window is passed.

    Bound: +24 MiB (the 4 MiB window held for the stuck plugin, plus read buffers). Without
    the check the proxy would queue all 64 MiB for the plugin."""
    _, recorder_path = recorder
    gate = Gate(str(tmp_path / "gate.sock"), recorder_path)
    await gate.start()
    streams = 64
    body = b"\x00" * LIMITS.max_frame_size
    try:
        async with proxy_process(tmp_path, gate.path) as proxy:
            # proxy_process's readiness check connected once, and the proxy dialled the
            # plugin for it: let that dial land before the gate starts freezing.
            await asyncio.sleep(0.3)
            gate.freeze = True
            peer = await Peer(proxy.listen).open()
            deadline = time.monotonic() + 5
            while not gate.frozen:  # the proxy dials the plugin as the CO connects
                assert time.monotonic() < deadline, "the proxy did not dial the plugin"
                await asyncio.sleep(0.01)
            gate.freeze = False
            async with (
                Prober(proxy.listen) as prober,
                measured(proxy, "5. DATA beyond the window (64 MiB)") as m,
            ):
                start = peer.started = time.monotonic()
                written = 0
                for i in range(streams):
                    sid = 2 * i + 1
                    out = [
                        frame(HEADERS, END_HEADERS, sid, request_block(ECHO + "Hang")),
                        frame(DATA, 0, sid, grpc_prefix(8 * MiB) + body[:-5]),
                    ]
                    out += [frame(DATA, 0, sid, body)] * (LIMITS.stream_window // len(body) - 1)
                    if peer.reacted.is_set() or not await peer.send(b"".join(out), 2.0):
                        break
                    written += LIMITS.stream_window
                assert await peer.wait_reaction(5), "no reaction to DATA beyond the window"
                end = time.monotonic()
                assert_bounded(m.memory, 24 * MiB, "DATA beyond the window")
                assert len(gate.frozen) == 1, "the attacker's calls did not go to the stuck plugin"
                assert peer.goaway is not None, "no GOAWAY"
                assert peer.goaway[1] == FLOW_CONTROL_ERROR, peer.goaway
                assert written < 16 * MiB, written  # cut off well before the 64 MiB
                m.reaction = peer.reaction_time()
                m.note = (
                    f"GOAWAY FLOW_CONTROL_ERROR after <= {written // MiB} MiB written; "
                    + await prober.check(start, end)
                )
                await peer.close()
    finally:
        await gate.stop()


# -- 6. Rapid reset --------------------------------------------------------------------------


async def test_rapid_reset_gets_enhance_your_calm_after_the_burst(tmp_path, recorder):
    """CVE-2023-44487: open a call and reset it at once, 5,000 times, as fast as the socket
    takes it. The reset bucket (reset_burst 1,000, refilled at reset_rate 33/s) empties, then
    GOAWAY ENHANCE_YOUR_CALM; the calls past it are never processed, and streams opened and
    reset in the same read never reach the plugin at all.

    Bound: +40 MiB; reset streams leave no state (reset_ids is capped at 1,024 ids)."""
    plugin, upstream = recorder
    opened = 5_000
    async with (
        proxy_process(tmp_path, upstream) as proxy,
        Prober(proxy.listen) as prober,
        measured(proxy, "6. rapid reset (5,000 streams)") as m,
    ):
        peer = await Peer(proxy.listen).open()
        start = peer.started
        block = request_block(ECHO + "Hang")
        attempted = 0
        deadline = start + ATTACK_SECONDS
        for batch in range(0, opened, 20):
            out = b"".join(
                frame(HEADERS, END_HEADERS, 2 * i + 1, block)
                + frame(DATA, END_STREAM, 2 * i + 1, grpc_prefix(0))
                + rst_stream(2 * i + 1, CANCEL)
                for i in range(batch, batch + 20)
            )
            if peer.reacted.is_set() or time.monotonic() > deadline:
                break
            if not await peer.send(out, 2.0):
                break
            attempted = batch + 20
            await asyncio.sleep(0)
        assert await peer.wait_reaction(5), "no reaction to rapid resets"
        reaction = peer.reaction_time()
        assert reaction is not None
        await asyncio.sleep(0.3)  # calls that did reach the plugin are recorded by now
        end = time.monotonic()
        assert_bounded(m.memory, GENERAL_BOUND, "rapid reset")
        assert peer.goaway is not None and peer.goaway[1] == ENHANCE_YOUR_CALM, peer.goaway
        processed = (peer.goaway[0] + 1) // 2  # streams the proxy took, per its GOAWAY
        allowed = LIMITS.reset_burst + LIMITS.reset_rate * reaction + 1
        assert LIMITS.reset_burst <= processed <= allowed + 5, (processed, allowed)
        reached = sum(1 for s in plugin.seen if s.method == ECHO + "Hang")
        assert reached <= processed
        assert reached < opened // 4, (reached, opened)
        m.reaction = reaction
        m.note = (
            f"GOAWAY ENHANCE_YOUR_CALM after {processed} streams "
            f"({attempted} written); plugin saw {reached}; " + await prober.check(start, end)
        )
        await peer.close()


# -- 7. Control-frame floods -----------------------------------------------------------------

FLOOD_BATCH = 2_000  # frames per write
FLOOD_BATCHES = 120  # 240,000 frames at most: several times what the limit lets through


def flood_batches(kind: str) -> list[bytes]:
    """What each flood writes, built before the attack (so that building it does not
    compete with the proxy for the CPU while the other client's latency is measured)."""
    if kind == "ping":  # answered by PING ACK (17 bytes)
        return [frame(PING, 0, 0, b"pingpong") * FLOOD_BATCH] * FLOOD_BATCHES
    if kind == "settings":  # answered by SETTINGS ACK (9 bytes)
        return [frame(SETTINGS, 0, 0) * FLOOD_BATCH] * FLOOD_BATCHES
    # A PRIORITY frame naming its own stream is a stream error (RFC 9113 §5.3.1), answered
    # by RST_STREAM (13 bytes); each frame names a new stream.
    head = bytes((0, 0, 5, PRIORITY, 0))
    out = []
    for batch in range(FLOOD_BATCHES):
        first = 2 * batch * FLOOD_BATCH + 1
        ids = [(2 * i + first).to_bytes(4, "big") for i in range(FLOOD_BATCH)]
        out.append(b"".join(head + sid + sid + b"\x10" for sid in ids))
    return out


FLOODS = ["ping", "settings", "rst"]


@pytest.mark.parametrize("kind", FLOODS)
async def test_control_frame_flood_from_a_peer_that_never_reads(tmp_path, recorder, kind):
    """Frames that each ask for a reply (PING, SETTINGS, a stream error), from a client that
    never reads its socket: replies pile up in the proxy's write buffer. Past
    max_queued_control_frames (10,000) queued while the socket is not writable, the proxy
    gives up on the connection (GOAWAY ENHANCE_YOUR_CALM, which a peer that does not read
    may never see) and stops reading it; what we then read is replies, then the close.

    Bound: +16 MiB: 10,000 replies are at most 170 KB, plus the 64 KiB write buffer.
    Without the limit the proxy would buffer one reply per frame for as long as we write."""
    _, upstream = recorder
    batches = flood_batches(kind)
    async with (
        proxy_process(tmp_path, upstream) as proxy,
        Prober(proxy.listen) as prober,
        measured(proxy, f"7. {kind} flood, never reading") as m,
    ):
        peer = await Peer(proxy.listen).open(read=False, rcvbuf=4096)
        start = peer.started
        flooded = 0
        deadline = start + ATTACK_SECONDS
        for out in batches:
            if time.monotonic() > deadline or not await peer.send(out, 1.0):
                break
            flooded += FLOOD_BATCH
        end = time.monotonic()
        assert peer.stalled or peer.broken, f"the proxy read {flooded} frames and more"
        assert_bounded(m.memory, 16 * MiB, f"{kind} flood")
        # Now read what reached our socket: replies, any GOAWAY, then the close.
        await peer.read_to_end(5)
        assert peer.eof_at is not None, "the proxy did not close the connection"
        if peer.goaway is not None:
            assert peer.goaway[1] == ENHANCE_YOUR_CALM, peer.goaway
        reason = '"reason":"too many replies not read"'
        assert proxy.log.read_text().count(reason) == 1, "not cut off by the reply limit"
        replies = peer.counts[PING] + peer.counts[SETTINGS] + peer.counts[RST_STREAM]
        assert peer.failed_at is not None
        m.reaction = peer.failed_at - start
        goaway = "GOAWAY ENHANCE_YOUR_CALM read" if peer.goaway else "no GOAWAY read"
        m.note = (
            f"cut off after {flooded} frames written ({'closed' if peer.broken else 'stalled'}), "
            f"{replies} replies read, {goaway}; " + await prober.check(start, end)
        )
        await peer.close()


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_a_peer_cut_off_for_not_reading_does_not_keep_its_connection(tmp_path, recorder):
    """10 connections each flood PINGs without ever reading, until the proxy gives up on
    them (GOAWAY ENHANCE_YOUR_CALM, it stops reading). Having given up, the proxy should
    let the connection go within a few seconds (Go's server closes it at once); otherwise
    each such peer keeps a descriptor and ~0.6 MiB of unread replies for good, and
    connections are not limited in number.

    Checked: the proxy logged that it cut off every one of them, and its open descriptors
    are back to their number before the attack within 3 s of that, while the peers still
    do not read. (When a failed connection was only closed gracefully, asyncio waited for
    the unread replies to drain and every one of them stayed open for good.)"""
    _, upstream = recorder
    conns = 10
    batches = flood_batches("ping")
    async with (
        proxy_process(tmp_path, upstream) as proxy,
        Prober(proxy.listen) as prober,
        measured(proxy, "7b. 10 ping floods cut off, never reading") as m,
    ):
        fds_before = open_fds(proxy.pid)
        start = time.monotonic()

        async def flood() -> Peer:
            peer = await Peer(proxy.listen).open(read=False, rcvbuf=4096)
            for out in batches:
                if not await peer.send(out, 2.0):
                    break
            assert peer.stalled or peer.broken, "the proxy kept reading a peer that never reads"
            return peer

        peers = await asyncio.gather(*(flood() for _ in range(conns)))

        def cut_off() -> int:
            return proxy.log.read_text().count('"reason":"too many replies not read"')

        # The log line follows the cut-off on the proxy's loop; on a busy machine, later.
        logged_by = time.monotonic() + 10.0
        logged = cut_off()
        while logged < conns and time.monotonic() < logged_by:
            await asyncio.sleep(0.05)
            logged = cut_off()
        assert logged == conns, f"the proxy cut off {logged} of {conns} connections"
        cut = time.monotonic()
        held = open_fds(proxy.pid) - fds_before
        while held > 0 and time.monotonic() < cut + 3.0:
            await asyncio.sleep(0.1)
            held = open_fds(proxy.pid) - fds_before
        end = time.monotonic()
        per_conn = (m.memory.rss() - m.memory.before) / conns
        m.note = (
            f"{held} of {conns} cut-off connections still open 3 s later, "
            f"~{per_conn:.0f} KiB RSS each; " + await prober.check(start, end)
        )
        assert held <= 0, f"{held} connections the proxy gave up on are still open"
        for peer in peers:
            await peer.close()


# -- 8. Slow / stalled reader ----------------------------------------------------------------


async def test_a_stalled_reader_does_not_make_the_proxy_buffer_the_answer(tmp_path, recorder):
    """A client grants the largest windows (SETTINGS_INITIAL_WINDOW_SIZE and the connection
    window 2^31-1), asks 8 calls for 8 MiB each (64 MiB) and never reads its socket. Once
    the proxy's write buffer is full it stops writing; plugin bytes are credited back only as
    they reach the CO, so the plugin is held to its windows (1 MiB per stream, 4 MiB per
    connection) and the proxy holds about that much.

    Bound: +20 MiB (4 MiB of connection window toward the plugin, the write buffer, one
    gathered unary response per known-method stream up to its window). A proxy that kept
    reading the plugin would hold the 64 MiB."""
    plugin, upstream = recorder
    answer = b"x" * (8 * MiB)
    plugin.raw[BIG] = lambda req: answer
    plugin.raw[LIST_VOLUMES] = lambda req: answer
    paths = [BIG] * 4 + [LIST_VOLUMES] * 4  # unknown: relayed; known: also gathered
    async with (
        proxy_process(tmp_path, upstream) as proxy,
        Prober(proxy.listen) as prober,
        measured(proxy, "8. stalled reader, 8 x 8 MiB answers") as m,
    ):
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        conn = h2.connection.H2Connection(config)
        conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: 2**24 - 1,
            },
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(2**31 - 1 - 65_535)
        for i, path in enumerate(paths):
            sid = 2 * i + 1
            conn.send_headers(sid, request_headers(path))
            conn.send_data(sid, grpc_prefix(0), end_stream=True)
        peer = await Peer(proxy.listen).open(read=False, rcvbuf=4096, preface=False)
        start = peer.started
        assert await peer.send(conn.data_to_send())
        deadline = time.monotonic() + 5
        while sum(1 for s in plugin.seen if s.method in (BIG, LIST_VOLUMES)) < len(paths):
            assert time.monotonic() < deadline, "the calls did not reach the plugin"
            await asyncio.sleep(0.02)
        await asyncio.sleep(2.0)  # the plugin has 64 MiB to send; the proxy takes little
        end = time.monotonic()
        assert_bounded(m.memory, 20 * MiB, "stalled reader")
        m.note = f"plugin answered {len(paths)} x 8 MiB; " + await prober.check(start, end)
        await peer.close()


# -- 9. Thousands of idle streams ------------------------------------------------------------


async def test_idle_streams_past_max_concurrent_streams_are_refused(tmp_path, recorder):
    """1,500 calls opened with HEADERS only (no message, no END_STREAM) on one connection:
    the first max_concurrent_streams (1,000) stay open, the next 500 get RST_STREAM
    REFUSED_STREAM. With --max-concurrent-calls 1200, one connection cannot take every call
    slot: another connection's calls (the prober and a burst of 100) still succeed.

    The calls are CreateVolume: held in the proxy (each takes a --max-concurrent-calls slot)
    until their message comes, so the plugin is not part of the result. (Sent on to a
    grpc-python plugin instead, 1,000 idle calls plus a burst make that plugin cancel a few
    calls itself now and then, which the proxy relays as it should.)

    Bound: +40 MiB; 1,000 open calls cost a few MiB of stream and call state."""
    _, upstream = recorder
    opened = 1_500
    async with (
        proxy_process(tmp_path, upstream, "--max-concurrent-calls", "1200") as proxy,
        Prober(proxy.listen) as prober,
        measured(proxy, "9. 1,500 idle streams on one connection") as m,
    ):
        peer = await Peer(proxy.listen).open()
        start = peer.started
        block = request_block(CREATE)
        for batch in range(0, opened, 100):
            out = b"".join(
                frame(HEADERS, END_HEADERS, 2 * i + 1, block) for i in range(batch, batch + 100)
            )
            assert await peer.send(out)
        deadline = time.monotonic() + 5
        while len(peer.resets) < opened - LIMITS.max_concurrent_streams:
            assert time.monotonic() < deadline, f"{len(peer.resets)} streams refused"
            await asyncio.sleep(0.02)
        async with grpc.aio.insecure_channel(f"unix:{proxy.listen}") as other:
            echo = other.unary_unary(ECHO + "Unary")
            burst = await asyncio.gather(
                *(echo(b"b%d" % i, timeout=PROBE_TIMEOUT) for i in range(100))
            )
        assert burst == [b"echo:b%d" % i for i in range(100)]
        await asyncio.sleep(0.3)
        end = time.monotonic()
        assert_bounded(m.memory, GENERAL_BOUND, "idle streams")
        refused = sorted(peer.resets)
        assert all(code == REFUSED_STREAM for code in peer.resets.values()), {
            k: v for k, v in peer.resets.items() if v != REFUSED_STREAM
        }
        assert refused == [2 * i + 1 for i in range(LIMITS.max_concurrent_streams, opened)]
        assert peer.goaway is None
        assert peer.first_reset_at is not None
        m.reaction = peer.first_reset_at - start
        m.note = (
            f"{len(refused)} REFUSED_STREAM (streams 2001-2999); 100-call burst on "
            "another connection OK; " + await prober.check(start, end)
        )
        await peer.close()
