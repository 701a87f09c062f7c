"""The container image definition, checked without a container engine: its stages, user,
entrypoint and environment, that it installs through the Makefile's `install` target, and
that the build context it gets is enough to build a complete package.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field

import pytest

from plugproxy.cli.inject import DEFAULT_IMAGE

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with line continuations joined."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        elif keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m[1], m[0]), words[0])
            name = words[2] if len(words) > 2 and words[1].upper() == "AS" else ""
            stages.append(Stage(base, name))
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return args, stages


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def stages(dockerfile: str) -> list[Stage]:
    return parse_dockerfile(dockerfile)[1]


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in stage.all("ENV"):
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def test_bases_are_build_arguments_on_debian_12(dockerfile: str, stages: list[Stage]) -> None:
    """Both bases are Debian 12, so both hold /usr/bin/python3.11: the venv copied from the
    build stage links to that interpreter."""
    args, _ = parse_dockerfile(dockerfile)
    froms = re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)
    assert froms == ["${BUILD_BASE}", "${RUNTIME_BASE}"]
    assert re.fullmatch(r"(docker\.io/(library/)?)?debian:(bookworm|12)-slim", args["BUILD_BASE"])
    assert re.fullmatch(r"gcr\.io/distroless/python3-debian12:nonroot", args["RUNTIME_BASE"])
    assert stages[0].name, "the build stage is named so the final stage can copy from it"


def test_final_stage_runs_as_a_numeric_non_root_user(stages: list[Stage]) -> None:
    users = stages[-1].all("USER")
    assert users, "the final stage must set USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0  # numeric: runAsNonRoot can verify it
    assert not gid or (gid.isdigit() and int(gid) > 0)


def test_final_stage_runs_nothing_and_copies_only_the_venv(stages: list[Stage]) -> None:
    final = stages[-1]
    # The runtime base has no shell to run a command with, nor tools to run.
    assert final.all("RUN") == []
    for source in final.all("COPY") + final.all("ADD"):
        assert source.startswith("--from="), f"final stage copies from the context: {source}"


def test_entrypoint_is_plugproxy_serve(stages: list[Stage]) -> None:
    final = stages[-1]
    assert json.loads(final.all("ENTRYPOINT")[-1]) == ["plugproxy"]
    assert json.loads(final.all("CMD")[-1]) == ["serve"]


def test_environment_suits_a_read_only_root_filesystem(stages: list[Stage]) -> None:
    env = env_of(stages[-1])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"  # log lines leave at once, not on exit
    # Bytecode is compiled at build time instead.
    assert any("compileall" in run for run in stages[0].all("RUN"))


def install_venv(stage: Stage) -> str:
    for command in stage.all("RUN"):
        match = re.search(r"\bmake install\b([^&;]*)", command)
        if match:
            settings = dict(w.partition("=")[::2] for w in shlex.split(match[1]) if "=" in w)
            return settings["VENV"]
    raise AssertionError("the build stage must install with `make install`")


def test_the_venv_loses_pip_and_setuptools_and_the_build_ca_stays_a_secret(
    stages: list[Stage],
) -> None:
    (install,) = [c for c in stages[0].all("RUN") if "make install" in c]
    steps = [step.strip() for step in install.split("&&")]
    make = next(i for i, step in enumerate(steps) if step.startswith("make install"))
    (uninstall,) = [step for step in steps[make:] if " uninstall " in step]
    assert {"pip", "setuptools"} <= set(shlex.split(uninstall))
    # The CA reaches pip as a secret mount of this step, never as a file or ENV of a layer.
    assert install.startswith("--mount=type=secret,id=build-ca ")
    assert "export PIP_CERT=/run/secrets/build-ca" in steps[0]
    for stage in stages:
        assert not {"PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"} & set(env_of(stage))
        for copy in stage.all("COPY") + stage.all("ADD"):
            assert not re.search(r"\.(crt|pem)\b|ca-cert|build-ca", copy), copy


def test_install_step_is_the_makefile_target(stages: list[Stage]) -> None:
    build, final = stages[0], stages[-1]
    venv = install_venv(build)
    copies = [c for c in final.all("COPY") if c.startswith(f"--from={build.name} ")]
    assert copies == [f"--from={build.name} {venv} {venv}"]
    assert env_of(final)["PATH"].startswith(f"{venv}/bin:")
    # The same target `make demo` goes through.
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    demo = re.search(r"^demo:(.*)$", makefile, re.MULTILINE)
    assert demo and "install" in demo[1].split()


def test_make_install_would_install_a_regular_copy_into_the_given_venv(
    stages: list[Stage], tmp_path: pathlib.Path
) -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    command = next(c for c in stages[0].all("RUN") if "make install" in c)
    words = shlex.split(next(part for part in command.split("&&") if "make install" in part))
    venv = str(tmp_path / "venv")
    words = [f"VENV={venv}" if w.startswith("VENV=") else w for w in words]
    out = subprocess.run(
        [make, "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert f"-m venv {venv}" in out
    assert re.search(rf"{re.escape(venv)}/bin/pip install -v \.\s", out), out
    assert " -e " not in out  # an editable install would need /src at run time


def make_n_image(*settings: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    """`make image` as it would run (-n: nothing is built)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    return subprocess.run(
        [make, "--no-print-directory", "-n", "image", *settings],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_make_image_tags_the_image_inject_wires_by_default() -> None:
    out = make_n_image("ENGINE=podman").stdout
    assert re.search(rf"^podman build --tag {re.escape(DEFAULT_IMAGE)} ", out, re.MULTILINE), out


def test_make_image_builds_its_bases_tagged_by_their_recipe_or_pulls_them() -> None:
    recipe = hashlib.sha256((ROOT / "tools" / "build-bases.sh").read_bytes()).hexdigest()[:12]
    build = f"localhost/plugproxy-base-build:bookworm-{recipe}"
    runtime = f"localhost/plugproxy-base-runtime:bookworm-{recipe}"
    out = make_n_image("ENGINE=podman").stdout  # BASES=debian is the default
    assert f"tools/build-bases.sh podman {build} {runtime}\n" in out
    assert f"--build-arg BUILD_BASE={build} --build-arg RUNTIME_BASE={runtime}" in out
    pulled = make_n_image("ENGINE=podman", "BASES=pull").stdout
    assert "podman build" in pulled
    assert "build-bases.sh" not in pulled and "--build-arg" not in pulled


def test_make_image_passes_the_build_ca_as_a_secret(tmp_path: pathlib.Path) -> None:
    ca = tmp_path / "proxy-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    out = make_n_image("ENGINE=podman", f"BUILD_CA={ca}").stdout
    assert f"--secret id=build-ca,src={ca} ." in out
    assert "--secret" not in make_n_image("ENGINE=podman", "BUILD_CA=").stdout
    host_bundle = pathlib.Path("/etc/ssl/certs/ca-certificates.crt")
    default = make_n_image("ENGINE=podman").stdout
    assert (f"--secret id=build-ca,src={host_bundle} ." in default) == host_bundle.exists()
    missing = make_n_image("ENGINE=podman", f"BUILD_CA={tmp_path}/none.pem")
    assert missing.returncode != 0
    assert missing.stderr.strip().endswith(f"BUILD_CA {tmp_path}/none.pem does not exist.  Stop.")


@pytest.mark.parametrize(
    ("tools", "engine"),
    [
        ({"docker": 0, "podman": 0}, "docker"),  # docker's engine answers
        ({"docker": 1, "podman": 0}, "podman"),  # a docker CLI without an engine
        ({"podman": 0}, "podman"),
        ({"docker": 1}, None),
        ({}, None),
    ],
)
def test_make_image_chooses_docker_with_an_engine_else_podman_else_says_so(
    tmp_path: pathlib.Path, tools: dict[str, int], engine: str | None
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sed", "sha256sum", "cut"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    for name, status in tools.items():  # `info` answers with this status
        (bin_dir / name).write_text(f"#!/bin/sh\nexit {status}\n")
        (bin_dir / name).chmod(0o755)
    result = make_n_image(path=str(bin_dir))
    if engine is None:
        assert result.returncode != 0
        assert result.stderr.count("\n") == 1, result.stderr
        assert "make image: needs podman, or docker with a running engine" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert re.search(rf"^{engine} build --tag ", result.stdout, re.MULTILINE)


def test_building_the_bases_without_debootstrap_is_a_one_line_error(tmp_path: pathlib.Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    bash = shutil.which("bash")
    assert bash is not None
    (bin_dir / "bash").symlink_to(bash)
    (bin_dir / "podman").write_text("#!/bin/sh\nexit 1\n")  # no such image yet
    (bin_dir / "podman").chmod(0o755)
    result = subprocess.run(
        [str(ROOT / "tools" / "build-bases.sh"), "podman", "build:x", "runtime:x"],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr == (
        "build-bases: debootstrap is not installed (apt-get install debootstrap),"
        " or use BASES=pull\n"
    )


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern: `*` stays within a directory, `**` spans directories."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def dockerignore_admits(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    admitted = True
    for raw in patterns:
        negate = raw.startswith("!")
        regex = glob_regex(raw.removeprefix("!").strip("/"))
        if any(regex.match(c) for c in candidates):
            admitted = negate
    return admitted


def ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def build_context(root: pathlib.Path) -> list[str]:
    patterns = ignore_patterns()
    files = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for filename in filenames:
            rel = os.path.relpath(os.path.join(dirpath, filename), root)
            if dockerignore_admits(patterns, rel):
                files.append(rel)
    return sorted(files)


def test_dockerignore_admits_what_the_build_needs_and_nothing_else(stages: list[Stage]) -> None:
    patterns = ignore_patterns()
    for copy in stages[0].all("COPY"):
        for source in shlex.split(copy)[:-1]:
            assert dockerignore_admits(patterns, source.rstrip("/")), source
    for needed in (
        "Makefile",
        "pyproject.toml",
        "setup.py",
        "README.md",
        "src/plugproxy/cli/main.py",
    ):
        assert dockerignore_admits(patterns, needed), needed
    for kept_out in (".venv/bin/python", ".git/HEAD", "tests/test_deploy.py", "deploy/x.yaml"):
        assert not dockerignore_admits(patterns, kept_out), kept_out
    assert not dockerignore_admits(patterns, "src/plugproxy/__pycache__/cli.cpython-311.pyc")


def test_the_build_context_builds_a_complete_package(tmp_path: pathlib.Path) -> None:
    """Build the wheel from exactly the files the image build would receive."""
    context = tmp_path / "context"
    for rel in build_context(ROOT):
        target = context / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    assert (context / "src" / "plugproxy" / "descriptors").is_dir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "dist"),
            str(context),
        ],
        check=True,
        capture_output=True,
        # What is packaged, not how fast it runs: the compiled build has its own tests.
        env={**os.environ, "PLUGPROXY_COMPILE": "0"},
    )
    wheel = next((tmp_path / "dist").glob("plugproxy-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "plugproxy = plugproxy.cli.main:main" in zf.read(entry_points).decode()
    assert "plugproxy/py.typed" in names
    shipped = {n.rsplit("/", 1)[-1] for n in names if n.startswith("plugproxy/descriptors/")}
    source = {p.name for p in (ROOT / "src/plugproxy/descriptors").glob("*.binpb")}
    assert source and source <= shipped
    modules = {n for n in names if n.endswith(".py")}
    expected = {
        str(p.relative_to(ROOT / "src"))
        for p in (ROOT / "src" / "plugproxy").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert expected <= modules


def test_serve_with_the_image_environment_writes_only_its_socket(
    stages: list[Stage], tmp_path: pathlib.Path
) -> None:
    """Under a read-only root the proxy may write nothing but its socket: no bytecode,
    no state in the working directory, HOME or TMPDIR."""
    image_env = {k: v for k, v in env_of(stages[-1]).items() if k != "PATH"}
    scratch = {name: tmp_path / name for name in ("cwd", "home", "tmp", "run")}
    for path in scratch.values():
        path.mkdir()
    socket, plugin_socket = scratch["run"] / "csi.sock", scratch["run"] / "plugin.sock"
    # The proxy listens once its plugin answers: a fake plugin, in a process of its own.
    fake = ["fake-plugin", "--spec", "csi.v1", "--listen", f"unix://{plugin_socket}"]
    plugin = subprocess.Popen(
        [sys.executable, "-m", "plugproxy", *fake],
        cwd=tmp_path,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(scratch["home"]),
        "TMPDIR": str(scratch["tmp"]),
        **image_env,
        "PLUGPROXY_LISTEN": f"unix://{socket}",
        "PLUGPROXY_UPSTREAM": f"unix://{plugin_socket}",
        "PLUGPROXY_ADMIN_LISTEN": "off",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugproxy", "serve"],
        cwd=scratch["cwd"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        while not lines or "plugproxy listening" not in lines[-1]:
            lines.append(proc.stdout.readline())
            assert lines[-1], "".join(lines) + (proc.stderr.read() if proc.stderr else "")
        assert socket.exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        for process in (proc, plugin):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert not socket.exists(), "the socket is removed on shutdown"
    for name in ("cwd", "home", "tmp"):
        assert not any(scratch[name].iterdir()), f"wrote into {name}"
