"""Smoke run of the benchmark harness (bench/run.py) with tiny counts: no timing asserted."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from plugproxy.spec.registry import load_spec
from tests.support import require, require_tool

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _check_report(report: dict[str, Any], out: Path, targets: set[str]) -> None:
    rows = report["summary"]["rows"]
    assert set(rows) == targets | {"direct"}
    for name, by_streams in report["throughput"].items():
        for streams, runs in by_streams.items():
            for run in runs:
                assert run["calls"] > 0, (name, streams)
                assert run["errors"] == 0, (name, streams, run["first_error"])
    for name, big in report["big_calls"].items():
        assert big["list_volumes"]["errors"] == 0, name
        assert big["list_volumes"]["bytes"] > 0, name
        # Every streamed message crossed: 2000 blocks at 1000 per message.
        assert big["metadata"]["messages"] == 2 * big["metadata"]["calls"], name
        assert big["companion"]["calls"] > 0, name
    for name in targets - {"direct"}:
        assert rows[name]["1"]["target_cpu_us_per_call"] > 0, name
        assert rows[name]["1"]["rss_bytes"] > 0, name
    saved = sorted(out.glob("*-smoke.json"))
    assert len(saved) == 1
    assert json.loads(saved[0].read_text())["mode"] == "smoke"
    table = next(out.glob("*-smoke.md")).read_text()
    assert "| passthrough | 16 |" in table


def test_payloads_are_spec_messages() -> None:
    payloads = _load("payloads")
    spec = load_spec("csi.v1")
    cls = spec.message_class("csi.v1.ListVolumesResponse")
    listed = cls.FromString(payloads.list_volumes_response(25))
    assert len(listed.entries) == 25
    assert listed.entries[3].volume.volume_id == "pvc-00000003"
    stream = payloads.metadata_allocated_stream(2500)
    blocks = spec.message_class("csi.v1.GetMetadataAllocatedResponse")
    assert [len(blocks.FromString(m).block_metadata) for m in stream] == [1000, 1000, 500]


def test_smoke_run_python_tools(tmp_path: Path) -> None:
    run = _load("run")
    report = run.main(
        [
            "--smoke",
            "--loadgen=python",
            "--plugin=python",
            "--targets=passthrough,full",
            f"--out={tmp_path}",
        ]
    )
    assert report["tools"] == {"loadgen": "python", "plugin": "python"}
    _check_report(report, tmp_path, {"passthrough", "full"})
    # Passthrough turns every stage off; full turns none off.
    assert "off" not in report["flags"]["full"]
    passthrough = report["flags"]["passthrough"]
    for flag in ("--serialize", "--call-log"):
        if flag in passthrough:
            assert passthrough[passthrough.index(flag) + 1] == "off"


def test_smoke_run_go_tools(tmp_path: Path) -> None:
    install = "Debian: apt-get install golang-go golang-google-grpc-dev"
    require_tool("go", install)
    require(Path("/usr/share/gocode/src/google.golang.org/grpc").is_dir(), f"Go's gRPC ({install})")
    run = _load("run")
    report = run.main(
        [
            "--smoke",
            "--loadgen=go",
            "--plugin=go",
            "--targets=passthrough,defaults",
            f"--out={tmp_path}",
        ]
    )
    assert report["tools"] == {"loadgen": "go", "plugin": "go"}
    _check_report(report, tmp_path, {"passthrough", "defaults"})
    # The default configuration with payload logging, priced against passthrough, and the
    # memory of each proxy once started.
    assert report["flags"]["defaults"] == ["--log-payloads"]
    assert set(report["startup_rss_bytes"]) == {"passthrough", "defaults"}
    assert "2_defaults_vs_passthrough_16_streams" in report["summary"]["goals"]
    assert "4_startup_rss_defaults" in report["summary"]["goals"]
    assert "RSS after start-up" in next(tmp_path.glob("*-smoke.md")).read_text()


def test_features_price_each_stage_alone_against_passthrough(tmp_path: Path) -> None:
    run = _load("run")
    report = run.main(
        [
            "--smoke",
            "--loadgen=python",
            "--plugin=python",
            "--targets=direct",
            "--features=validation,metrics",
            "--no-big",
            f"--out={tmp_path}",
        ]
    )
    flags = report["flags"]
    assert set(flags) == {"direct", "passthrough", "+validation", "+metrics"}
    # Each variant is passthrough's flags with one stage turned back on (last flag wins).
    validation = flags["+validation"]
    assert validation[-2:] == ["--validation", "audit"]
    assert "--disable-metrics" in flags["passthrough"]
    assert "--disable-metrics" not in flags["+metrics"]
    features = report["summary"]["features"]
    assert set(features) == {"validation", "metrics"}
    assert all(f["share_of_passthrough"] > 0 for f in features.values())
    assert "| validation |" in next(tmp_path.glob("*-smoke.md")).read_text()


def test_unknown_feature_is_a_one_line_error() -> None:
    run = _load("run")
    with pytest.raises(SystemExit) as exited:
        run.main(["--smoke", "--features=validation,warp-drive"])
    assert "warp-drive" in str(exited.value) and "validation" in str(exited.value)


def test_stagecost_prices_the_stages_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    stagecost = _load("stagecost")
    assert asyncio.run(stagecost.main(["--calls", "50", "validation", "call-log"])) == 0
    out = capsys.readouterr().out.splitlines()
    costs = {line.split()[0]: float(line.split()[1]) for line in out[1:]}
    assert set(costs) == {"validation", "call-log"}
    assert all(us > 0 for us in costs.values())
    with pytest.raises(SystemExit):
        asyncio.run(stagecost.main(["warp-drive"]))


def test_stagecost_prices_the_big_listing_with_its_capabilities_known(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stagecost = _load("stagecost")
    argv = ["--method", "list-volumes", "--calls", "2", "--repeat", "2", "validation"]
    assert asyncio.run(stagecost.main(argv)) == 0
    out = capsys.readouterr().out.splitlines()
    assert "ms CPU per call (2 ListVolumes calls" in out[0] and "median of 2 runs" in out[0]
    name, median, *runs = out[1].replace("(", "").replace(")", "").split()
    assert name == "validation" and float(median) > 0 and len(runs) == 2
    # the page is judged as by a proxy that learned the plugin's capabilities first
    payloads = stagecost.payloads
    asked = payloads.capability_responses()["/csi.v1.Controller/ControllerGetCapabilities"]
    answer = payloads._cls("ControllerGetCapabilitiesResponse").FromString(asked)
    names = {c.rpc.Type.Name(c.rpc.type) for c in answer.capabilities}
    assert {"LIST_VOLUMES", "LIST_VOLUMES_PUBLISHED_NODES"} <= names


def test_relaycost_relays_every_call_it_prepares() -> None:
    relaycost = _load("relaycost")
    # cost() raises SystemExit when a call did not complete (the harness went stale); calls
    # prepared beyond those relayed are left unsent (a callgrind difference counts the same
    # preparation twice).
    per_call = asyncio.run(relaycost.cost(200, 8, prepare=400))
    assert per_call > 0


def test_rulecost_keeps_rule_memory_within_its_bound(capsys: pytest.CaptureFixture[str]) -> None:
    rulecost = _load("rulecost")
    result = asyncio.run(rulecost.measure(volumes=60, max_volumes=20))
    # 14 calls a lifecycle; half of them stop after the repeated CreateSnapshot (9 calls)
    assert result["calls"] == 30 * 14 + 30 * 9
    assert 0 < result["volumes_tracked"] <= 20
    assert result["us_per_call"] > 0 and result["bytes_per_tracked_volume"] > 0
    assert asyncio.run(rulecost.main(["--volumes", "10"])) == 0
    assert "per tracked volume" in capsys.readouterr().out


def test_listandwatch_soak_script_holds_the_stream() -> None:
    soak = _load("listandwatch_soak")
    ns = soak.argparse.Namespace(
        duration=2.0, period=0.001, sample_every=0.5, keep=False, json=None
    )
    report = asyncio.run(soak.soak(ns))
    assert report["stream_state_at_end"] == "OK"
    assert report["updates"] > 50  # thousands when idle; a loaded machine is slower
    assert report["proxy_counted_messages"] >= report["updates"]


def test_dra_health_soak_script_counts_both_sides_alike() -> None:
    soak = _load("dra_health_soak")
    ns = soak.argparse.Namespace(
        duration=2.0,
        period=0.001,
        claim_every=0.02,
        sample_every=0.5,
        clean=False,
        keep=False,
        json=None,
    )
    report = asyncio.run(soak.soak(ns))
    assert report["stream_state_at_end"] == "OK"
    assert report["updates"]["client_received"] > 50  # thousands when idle
    assert report["claim_calls"]["client_ok"]["v1"] > 0
    assert report["claim_calls"]["client_ok"]["v1beta1"] > 0
    assert soak.counts_agree(report), report
    assert report["rss_kib_start"] > 0 and report["rss_kib_end"] > 0


def test_rsscost_probes_a_started_proxy_and_a_first_call() -> None:
    rsscost = _load("rsscost")
    result = rsscost.probe(("hpack",), [("kms.v2", rsscost.first_path("kms.v2"))])
    marks = [name for name, rss in result["marks"] if rss > 0]
    assert marks == [
        "interpreter",
        "hpack",
        "ProxyServer built",
        "started",
        "first kms.v2 call routed",
    ]
    assert result["ms"]["kms.v2"] > 0


def test_rsscost_objects_publishes_distinct_volumes_through_a_proxy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rsscost = _load("rsscost")
    # publish_ids fails the report when a call fails, so every id crossed the proxy.
    rsscost.report_objects([40, 80], "--max-remembered-objects 10", "python")
    out = capsys.readouterr().out
    assert "serve --max-remembered-objects 10" in out
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["0", "40", "80"]


def test_rsscost_holders_names_the_rules_memory() -> None:
    # tracemalloc names Python lines: the sources are run interpreted (PYTHONPATH=src), as
    # the report's docstring says, whichever build is installed.
    done = subprocess.run(
        [sys.executable, str(BENCH / "rsscost.py"), "holders", "--volumes", "60", "--top", "40"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(BENCH.parent / "src")},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "held after 60 ids" in done.stdout and "memory.py" in done.stdout  # ExpiringMap


def test_mapcost_compares_the_rules_memories_with_cachetools(
    capsys: pytest.CaptureFixture[str],
) -> None:
    require(importlib.util.find_spec("cachetools") is not None, "cachetools is not installed")
    mapcost = _load("mapcost")
    assert mapcost.main(["--size", "50", "--ops", "100", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    for op in mapcost.OPS:
        assert out.count(f"  {op} ") == 2, op  # both kinds of memory, both implementations
    assert out.count("bytes/entry") == 2
