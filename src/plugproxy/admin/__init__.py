"""The operator's side of a running proxy: the HTTP server for /metrics, /healthz,
/readyz and /violations, and readiness from the plugin's own Probe.

May import: :mod:`plugproxy.core`, :mod:`plugproxy.api`, :mod:`plugproxy.net`,
:mod:`plugproxy.spec`.
"""
