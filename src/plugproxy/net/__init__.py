"""The sockets to the CO and to the plugin: UNIX and TCP listeners, TLS files and their
rotation, TLS diagnostics. The proxy's own HTTP/2 connection to the plugin is the relay's
(:mod:`plugproxy.relay.upstream`).

- :mod:`~plugproxy.net.sockets`: UNIX socket paths (claiming, permissions, errors named);
- :mod:`~plugproxy.net.transport`: listen and upstream transports, TLS contexts, identities;
- :mod:`~plugproxy.net.tlsfiles`: certificate files watched and reloaded;
- :mod:`~plugproxy.net.tlslog`: a failed handshake as one structured line.

May import: :mod:`plugproxy.core`, :mod:`plugproxy.api`.
"""
