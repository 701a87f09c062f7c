"""Every command the README and docs/ show, checked as a reader would paste it.

Each shell block of every page is one of three kinds, listed below by the first line of its
command text (so a new or changed block fails here until it is given one):

- RUN_HERE: run, in page order, in one shell (the one its fence names) in an empty
  directory, with the venv's bin on the PATH as the README's activation line puts it. A
  block that starts servers in the background is followed by a wait for the sockets and
  ports it listens on — the pause a reader makes before pasting the next block. Every
  command must succeed.
- RUN_ELSEWHERE: run as written by another test, named here (which checks the page's text).
- NOT_HERE: needs what a test machine has not got (a cluster, a registry, a remote host,
  a privileged path); the reason is given.

Whatever the kind, every ``plugproxy ...`` command in a block or in an inline code span is
parsed by the CLI's own parser, so a renamed flag or a wrong value in any page fails here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from plugproxy.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = {"sh": "sh", "bash": "bash", "console": "bash", "shell": "bash"}

# page (relative to the root) -> first lines of the blocks run here, in page order.
RUN_HERE: dict[str, list[str]] = {
    "README.md": [
        ". .venv/bin/activate",
        "plugproxy fake-plugin --spec csi.v1 --listen unix:///tmp/plugin.sock &",
        "export CSI_ENDPOINT=unix:///tmp/csi.sock",
        "plugproxy report --admin http://127.0.0.1:9808",
    ],
    "docs/observability.md": ["plugproxy demo --trace"],
}
BRIDGE_DOC_TEST = (
    "tests/integration/test_remote_bridge_doc.py"
    "::test_the_one_host_recipe_bridges_a_call_over_mutual_tls"
)
ANY_PLUGIN_DOC_TEST = (
    "tests/integration/test_any_plugin_doc.py"
    "::test_the_page_builds_the_set_and_serves_it_as_it_says"
)
# first line -> the test that runs that block as written.
RUN_ELSEWHERE: dict[str, str] = {
    "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365": (
        BRIDGE_DOC_TEST
    ),
    "plugproxy fake-plugin --spec csi.v1 --listen unix://$PWD/plugin.sock &": BRIDGE_DOC_TEST,
    "plugproxy serve --listen unix://$PWD/csi.sock --upstream tls://localhost:17443": (
        BRIDGE_DOC_TEST
    ),
    "pip install grpcio-tools": ANY_PLUGIN_DOC_TEST,
    "plugproxy serve --listen unix://$PWD/vault.sock --upstream unix://$PWD/plugin.sock": (
        ANY_PLUGIN_DOC_TEST
    ),
}
CLUSTER = "needs a cluster (kubectl, helm)"
# first line -> why it cannot run on a test machine.
NOT_HERE: dict[str, str] = {
    "make demo": "the set-up itself: CI runs it on a fresh clone before the suite",
    "make test": "this suite itself (.ci/run)",
    "plugproxy serve --listen unix:///run/csi/csi.sock --upstream unix:///run/csi/plugin.sock": (
        "a pod's paths; the README's walk-through runs serve on temporary ones"
    ),
    "plugproxy serve --listen unix:///run/csi/csi.sock --upstream tls://appliance:7443": (
        "two hosts; docs/remote-bridge.md's one-host recipe is run by " + BRIDGE_DOC_TEST
    ),
    "plugproxy fake-plugin --spec csi.v1 --listen unix:///tmp/h2spec-fake.sock &": (
        "h2spec is not packaged for Debian; tests/test_relay_conformance.py sends its cases"
    ),
    "make image": "podman push needs a registry; `make image` is run by tests/support.built_image",
    "plugproxy fake-plugin --spec csi.v1 --listen unix:///tmp/fake.sock": (
        "a server in the foreground; the README's walk-through starts one in the background"
    ),
    "helm template my-driver vendor/csi-driver | plugproxy inject"
    " --image registry.example.com/plugproxy:0.1.0 - | kubectl apply -f -": CLUSTER,
    "plugproxy webhook --tls-cert /tls/tls.crt --tls-key /tls/tls.key": (
        "a Secret's certificate mounted at /tls; tests/test_cli_webhook.py serves the webhook"
    ),
    "kubectl -n <ns> logs <pod> -c plugproxy | grep -m1 'plugproxy listening'": CLUSTER,
    "OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4317": (
        "a collector named collector; tests/integration/test_trace_propagation.py exports to a"
        " real OTLP receiver"
    ),
    "python bench/run.py --quick": (
        "minutes of load; tests/test_bench.py runs its --smoke and --features modes"
    ),
    "/tmp/plugproxy-bench-go-*/mockplugin --listen=/tmp/p.sock --table=<payload dir>/table.json &": (
        "a profiling recipe: py-spy and the benchmark's Go tools, with a pid to fill in"
    ),
    "plugproxy serve --listen unix:///csi/csi.sock --upstream unix:///csi/plugin.sock": (
        "a pod's paths; the README's walk-through runs serve on temporary ones"
    ),
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    shell: str
    text: str

    @property
    def first_line(self) -> str:
        """The first line that is not a comment, without its own comment or continuation:
        how the tables above name the block."""
        line = next((ln for ln in self.text.splitlines() if ln.strip() and ln[0] != "#"), "")
        return re.sub(r"\s+#\s.*$", "", line).rstrip(" \\")

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.first_line}"


def page_blocks(page: Path) -> list[Block]:
    name = str(page.relative_to(ROOT))
    found: list[Block] = []
    fence: tuple[int, str] | None = None
    lines: list[str] = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if fence is None:
            match = re.match(r"^```(\w+)", line)
            if match and match.group(1) in SHELLS:
                fence, lines = (number, SHELLS[match.group(1)]), []
            elif line.startswith("```"):
                fence, lines = (number, ""), []
        elif line.startswith("```"):
            if fence[1]:
                found.append(Block(name, fence[0], fence[1], "\n".join(lines) + "\n"))
            fence = None
        else:
            lines.append(line)
    return found


ALL_BLOCKS = [block for page in PAGES for block in page_blocks(page)]


def shell_lines(text: str) -> list[str]:
    """The text's command lines: continuations joined, heredoc bodies dropped, a quoted
    string that spans lines kept as one line."""
    lines: list[str] = []
    pending = ""
    heredoc_end: str | None = None
    for line in text.replace("\\\n", " ").splitlines():
        if heredoc_end is not None:
            heredoc_end = None if line.strip() == heredoc_end else heredoc_end
            continue
        pending = f"{pending}\n{line}" if pending else line
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)", pending)
        heredoc_end = heredoc.group(1) if heredoc else None
        lines.append(pending)
        pending = ""
    return lines


def shell_commands(text: str) -> list[list[str]]:
    """The simple commands of a shell text, split at pipes, lists and background marks,
    leading VAR=value assignments removed."""
    commands: list[list[str]] = []
    for line in shell_lines(text):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        for token in lexer:
            if token and set(token) <= set(";&|()<>"):
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    result = []
    for command in commands:
        words = list(command)
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words = words[1:]
        if words:
            result.append(words)
    return result


# Code spans that start with the word but quote output, not a command.
NOT_COMMANDS = {"plugproxy listening"}


def inline_commands(page: Path) -> list[tuple[int, str]]:
    """`plugproxy ...` code spans outside fenced blocks that are commands (more than a
    subcommand's name), with their line numbers."""
    spans: list[tuple[int, str]] = []
    in_fence = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if not in_fence:
            for span in re.findall(r"`(plugproxy [^`]+)`", line):
                if span not in NOT_COMMANDS and len(span.split()) > 2:
                    spans.append((number, span))
    return spans


def parse_plugproxy(argv: list[str]) -> str | None:
    """None when the CLI's parser takes these arguments, else what it said."""
    parser = cli.build_parser(argv)
    try:
        parser.parse_args(argv)
    except SystemExit as exc:  # --help and --version exit 0
        return None if exc.code == 0 else f"exit {exc.code}"
    return None


def test_every_block_is_run_or_says_why_not() -> None:
    listed = {line for lines in RUN_HERE.values() for line in lines}
    known = listed | set(RUN_ELSEWHERE) | set(NOT_HERE)
    unclassified = [str(b) for b in ALL_BLOCKS if b.first_line not in known]
    assert not unclassified, "shell blocks neither run nor excused:\n" + "\n".join(unclassified)
    present = {b.first_line for b in ALL_BLOCKS}
    stale = sorted(known - present)
    assert not stale, f"listed blocks no page has any more: {stale}"


def test_blocks_run_elsewhere_name_a_real_test() -> None:
    for first_line, test in RUN_ELSEWHERE.items():
        path, _, name = test.partition("::")
        source = (ROOT / path).read_text()
        assert f"def {name}(" in source, f"{first_line!r}: {test} does not exist"


@pytest.mark.parametrize(
    "where,argv",
    [
        pytest.param(str(b), cmd[1:], id=f"{b.page}:{b.line}")
        for b in ALL_BLOCKS
        for cmd in shell_commands(b.text)
        if cmd[0] == "plugproxy"
    ]
    + [
        pytest.param(f"{page.name}:{line}", shlex.split(span)[1:], id=f"{page.name}:{line}")
        for page in PAGES
        for line, span in inline_commands(page)
    ],
)
def test_plugproxy_commands_parse(where: str, argv: list[str]) -> None:
    problem = parse_plugproxy(argv)
    assert problem is None, f"{where}: `plugproxy {shlex.join(argv)}` is refused ({problem})"


def listening_targets(text: str) -> list[str]:
    """What a block's servers listen on, for the wait before the next block."""
    targets = []
    for command in shell_commands(text):
        for flag in ("--listen", "--admin-listen"):
            for index, word in enumerate(command[:-1]):
                if word == flag and command[index + 1] != "off":
                    targets.append(command[index + 1])
            targets += [w.split("=", 1)[1] for w in command if w.startswith(flag + "=")]
    return targets


WAIT_FUNCTION = r"""
__doc_wait() {  # the reader's pause: wait until what the last block started listens
  for target in "$@"; do
    i=0
    until __doc_ready "$target"; do
      i=$((i + 1)); [ "$i" -lt 300 ] || { echo "not listening: $target" >&2; return 1; }
      sleep 0.1
    done
  done
}
__doc_ready() {
  case "$1" in
    unix://*) [ -S "${1#unix://}" ] ;;
    *) python3 -c "import socket,sys; h,p=sys.argv[1].rsplit(':',1); \
socket.create_connection((h,int(p)),1).close()" "${1#*://}" 2>/dev/null ;;
  esac
}
"""


def page_script(blocks: list[Block]) -> str:
    parts = ["set -e", WAIT_FUNCTION]
    for block in blocks:
        parts.append(f"echo '>>> {block.page}:{block.line}'")
        parts.append(block.text)
        if "&" in block.text:
            targets = " ".join(shlex.quote(t) for t in listening_targets(block.text))
            if targets:
                # $PWD and other variables in the targets expand as the block's did.
                parts.append(f"__doc_wait {targets.replace(chr(39), '')}")
    return "\n".join(parts) + "\n"


@pytest.mark.parametrize("page", sorted(RUN_HERE))
def test_page_commands_run_as_pasted(page: str, tmp_path: Path) -> None:
    wanted = RUN_HERE[page]
    blocks = [b for b in ALL_BLOCKS if b.page == page and b.first_line in wanted]
    assert [b.first_line for b in blocks] == wanted, f"{page}: blocks moved or changed"
    shells = {b.shell for b in blocks}
    assert len(shells) == 1, f"{page}: blocks for different shells: {shells}"
    env = dict(os.environ)
    # What the README's activation line does: the venv's commands first on the PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp_path)
    # The activation line names the clone's .venv; here it is the venv running this suite.
    (tmp_path / ".venv").symlink_to(sys.prefix)
    env.pop("PLUGPROXY_ADMIN_LISTEN", None)
    # A file, not a pipe: the servers left in the background keep their stdout open.
    log_path = tmp_path / "page.log"
    with log_path.open("w") as log:
        shell = subprocess.Popen(
            [shells.pop(), "-c", page_script(blocks)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        shell.wait(timeout=240)
    finally:
        # The servers the blocks left in the background.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGTERM)
    output = log_path.read_text()
    assert shell.returncode == 0, f"{page}: a command failed as pasted:\n{output}"
