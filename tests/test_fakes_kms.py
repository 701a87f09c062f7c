"""The fake KMS v2 plugin: real AES-GCM round trips, refusals, knobs and misbehaviours."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from plugproxy.fakes import FailureRule, FakeKnobs, SpecClient, start_fake_plugin
from plugproxy.fakes.kms import PLAINTEXT_MAX


async def _kms(tmp_path: Path, knobs: FakeKnobs | None = None):
    handle = await start_fake_plugin("kms.v2", f"unix://{tmp_path}/kms.sock", knobs)
    return handle, SpecClient(handle.target, "kms.v2")


async def test_encrypt_decrypt_round_trip_with_a_key_made_at_startup(tmp_path):
    handle, c = await _kms(tmp_path)
    try:
        status = await c.call("Status")
        assert (status.version, status.healthz) == ("v2", "ok") and status.key_id
        dek = os.urandom(32)
        enc = await c.call("Encrypt", plaintext=dek, uid="u1")
        assert enc.key_id == status.key_id
        assert dek not in enc.ciphertext and len(enc.ciphertext) == 12 + 32 + 16
        again = await c.call("Encrypt", plaintext=dek, uid="u2")
        assert again.ciphertext != enc.ciphertext  # a fresh nonce each time
        dec = await c.call(
            "Decrypt", ciphertext=enc.ciphertext, key_id=enc.key_id, annotations=enc.annotations
        )
        assert dec.plaintext == dek
        # Another plugin instance holds another key: its ciphertext does not open here.
        (tmp_path / "other").mkdir()
        other, oc = await _kms(tmp_path / "other")
        try:
            assert (await oc.call("Status")).key_id != status.key_id
            foreign = await oc.call("Encrypt", plaintext=dek)
        finally:
            await oc.close()
            await other.stop(0)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.call("Decrypt", ciphertext=foreign.ciphertext, key_id=foreign.key_id)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as err:
            # one bit of the tag flipped (replacing the last byte by a fixed one would leave
            # it unchanged once in 256 runs)
            tampered = enc.ciphertext[:-1] + bytes([enc.ciphertext[-1] ^ 1])
            await c.call("Decrypt", ciphertext=tampered, key_id=enc.key_id)
        assert err.value.details() == "ciphertext does not authenticate"
        for bad in (b"", b"x" * (PLAINTEXT_MAX + 1)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.call("Encrypt", plaintext=bad)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert len((await c.call("Encrypt", plaintext=b"x" * PLAINTEXT_MAX)).ciphertext) == 1024
    finally:
        await c.close()
        await handle.stop(0)


async def test_knobs_and_misbehaviours(tmp_path):
    knobs = FakeKnobs(misbehave={"kms-version-v1"})
    handle, c = await _kms(tmp_path, knobs)
    try:
        assert (await c.call("Status")).version == "v1"
        handle.plugin.knobs.misbehave = {"kms-key-id-empty"}
        assert (await c.call("Encrypt", plaintext=b"k" * 32)).key_id == ""
        handle.plugin.knobs.misbehave = set()
        handle.plugin.knobs.failures["Status"] = FailureRule(grpc.StatusCode.UNAVAILABLE, 1)
        with pytest.raises(grpc.aio.AioRpcError):
            await c.call("Status")
        assert (await c.call("Status")).healthz == "ok"
    finally:
        await c.close()
        await handle.stop(0)


def test_runnable_from_the_command_line_by_alias(tmp_path):
    sock = tmp_path / "kms.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "plugproxy",
            "fake-plugin",
            "--spec",
            "kms",
            "--listen",
            f"unix://{sock}",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == f"fake kms.v2 plugin listening on unix://{sock}\n"

        async def talk() -> None:
            async with SpecClient(f"unix:{sock}", "kms.v2") as c:
                enc = await c.call("Encrypt", plaintext=b"seed")
                assert (
                    await c.call("Decrypt", ciphertext=enc.ciphertext, key_id=enc.key_id)
                ).plaintext == b"seed"

        asyncio.run(talk())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_cryptography_is_imported_only_when_the_fake_kms_plugin_starts():
    code = (
        "import sys\n"
        "import plugproxy.cli.main, plugproxy.fakes, plugproxy.cli.serve\n"
        "assert 'cryptography' not in sys.modules\n"
        "from plugproxy.fakes.kms import FakeKmsV2\n"
        "FakeKmsV2()\n"
        "assert 'cryptography' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
