"""`plugproxy prepare-dir`: what the injected init container runs in an image without a shell."""

from __future__ import annotations

import os
import pathlib
import stat

import pytest

from plugproxy.cli import main as cli


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(["prepare-dir", *args])
    out, err = capsys.readouterr()
    assert out == ""
    return code, err


def test_creates_parents_and_sets_owner_and_mode_of_the_last_one(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "a" / "b"
    owner = f"{os.getuid()}:{os.getgid()}"
    code, err = run(capsys, str(target), "--owner", owner, "--mode", "0750")
    assert (code, err) == (0, "")
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert (target.stat().st_uid, target.stat().st_gid) == (os.getuid(), os.getgid())
    assert (tmp_path / "a").is_dir()
    # An existing directory is fine; the mode is applied again.
    target.chmod(0o700)
    code, err = run(capsys, str(target), "--mode", "770")
    assert (code, err) == (0, "")
    assert stat.S_IMODE(target.stat().st_mode) == 0o770


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_gives_the_directory_to_another_group(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(capsys, str(tmp_path / "csi"), "--owner", "0:65532", "--mode", "0770")
    assert (code, err) == (0, "")
    assert (tmp_path / "csi").stat().st_gid == 65532


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--owner", "root:root"], "--owner 'root:root': expected numeric UID:GID"),
        (["--owner", "0"], "--owner '0': expected numeric UID:GID"),
        (["--owner", "0:4294967295"], "expected numeric UID:GID"),
        (["--mode", "rwx"], "--mode 'rwx': expected an octal mode"),
        (["--mode", "0779"], "--mode '0779': expected an octal mode"),
        (["--mode", "07777x"], "expected an octal mode"),
    ],
)
def test_bad_flags_get_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(capsys, str(tmp_path / "d"), *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "d").exists()  # checked before anything is created


def test_bad_paths_get_one_line_and_exit_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    code, err = run(capsys, str(tmp_path / "file"), "--mode", "0770")
    assert code == 2 and "exists and is not a directory" in err
    assert len(err.strip().splitlines()) == 1
    code, err = run(capsys, "relative/dir")
    assert code == 2 and "expected an absolute path" in err
    with pytest.raises(SystemExit) as exc:
        cli.main(["prepare-dir"])
    assert exc.value.code == 2
    assert "PATH" in capsys.readouterr().err
