"""plugproxy: a spec-aware gRPC sidecar for CSI, COSI and CMI plugins."""

__version__ = "0.1.0"
