"""Builds plugproxy, with its hot path compiled by mypyc where a C compiler is present.

The modules in COMPILED are what every call runs (docs/performance.md, "The compiled
build"): the frame relay, the stage chain, the default stages' per-call hooks, the redactor,
the rule engine and the generic rules. They stay ordinary typed Python, the code everyone
reads and tests; mypyc turns the same files into C extensions at install time. Without a C
compiler, with PLUGPROXY_COMPILE=0, or for an editable install (whose sources must stay
live), the package is built as pure Python and behaves the same; the build says once why.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import sysconfig
import tempfile

from setuptools import setup

COMPILED = [
    "src/plugproxy/relay/frames.py",
    "src/plugproxy/relay/limits.py",
    "src/plugproxy/relay/hpackcodec.py",
    "src/plugproxy/relay/grpcwire.py",
    "src/plugproxy/relay/connection.py",
    "src/plugproxy/relay/pairing.py",
    "src/plugproxy/relay/framerelay.py",
    "src/plugproxy/pipeline.py",
    "src/plugproxy/api.py",
    "src/plugproxy/core/log.py",
    "src/plugproxy/core/sampling.py",
    "src/plugproxy/spec/keys.py",
    "src/plugproxy/core/locks.py",
    "src/plugproxy/spec/redact.py",
    "src/plugproxy/stages/calllog.py",
    "src/plugproxy/stages/metrics.py",
    "src/plugproxy/stages/serialize.py",
    "src/plugproxy/stages/validate.py",
    "src/plugproxy/rules/engine.py",
    "src/plugproxy/rules/generic.py",
    "src/plugproxy/core/memory.py",
    "src/plugproxy/rules/state.py",
]


def interpreted_because() -> str:
    """Why this build stays pure Python, or "" to compile."""
    if os.environ.get("PLUGPROXY_COMPILE", "1") == "0":
        return "PLUGPROXY_COMPILE=0"
    if any(arg in ("editable_wheel", "develop") for arg in sys.argv):
        return "an editable install keeps its sources live"
    # The compiler setuptools will call: $CC, else the one Python was built with.
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if not shutil.which(compiler):
        return f"no C compiler ({compiler})"
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python headers in {include} (python3-dev)"
    return ""


# The commands that build code; metadata steps (egg_info, dist_info) need no compilation.
BUILDING = {"bdist_wheel", "build", "build_ext", "install"}
# Every build starts empty: pip builds a local tree in place, and a build/ left by an
# earlier one (another module list, another build kind) would ship its extensions too.
BUILD_BASE = tempfile.mkdtemp(prefix="plugproxy-build-")
atexit.register(shutil.rmtree, BUILD_BASE, ignore_errors=True)


def extensions() -> list[object]:
    if not BUILDING.intersection(sys.argv):
        return []
    why = interpreted_because()
    if not why:
        try:
            from mypyc.build import mypycify  # noqa: PLC0415
        except ImportError:
            why = "mypyc is not installed"
    if why:
        print(f"plugproxy: building interpreted (pure Python): {why}", file=sys.stderr)
        return []
    print(f"plugproxy: compiling {len(COMPILED)} modules with mypyc", file=sys.stderr)
    # The runtime dependencies' types are never read (--no-site-packages): they are Any, so
    # the same source compiles to the same code whether or not the installing interpreter
    # already has them (a second install into a venv does; read, hpack's typed table made
    # every header field a new tuple: 20,100 instead of 5,700 instructions a header block).
    # What `make check` holds strictly against their stubs is let pass here. The tracing
    # stage stays Python: it subclasses the OpenTelemetry SDK's classes, which a compiled
    # class cannot do when they are unknown, and costs nothing when it is off.
    relaxed = [
        "--no-site-packages",
        "--ignore-missing-imports",
        "--allow-subclassing-any",
        "--no-warn-return-any",
        "--no-warn-unused-ignores",
    ]
    return list(
        mypycify(
            [*relaxed, *COMPILED],
            # -Os: 3.6 % more instructions than -O3, 0.5 MiB less resident at start-up.
            opt_level=os.environ.get("MYPYC_OPT_LEVEL", "s"),
            target_dir=os.path.join(BUILD_BASE, "c"),
            multi_file=True,  # one C file a module, compiled in parallel below
        )
    )


setup(
    ext_modules=extensions(),
    options={"build": {"build_base": BUILD_BASE}, "build_ext": {"parallel": os.cpu_count() or 1}},
)
