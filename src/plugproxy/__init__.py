"""plugproxy: a spec-aware gRPC sidecar for CSI, COSI and CMI plugins."""

from importlib.util import find_spec

__version__ = "0.1.0"


def build() -> str:
    """Which build runs: "compiled" when the hot path was compiled by mypyc at install
    (setup.py), else "interpreted"; found without importing it."""
    spec = find_spec("plugproxy.relay.pairing")
    origin = spec.origin if spec is not None else None
    return "compiled" if origin is not None and not origin.endswith(".py") else "interpreted"
