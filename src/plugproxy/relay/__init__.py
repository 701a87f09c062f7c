"""How calls cross the proxy. Two relays share the stage pipeline:

- :mod:`~plugproxy.relay.framerelay` (plaintext sockets): two HTTP/2 endpoints joined by
  stream mapping. Its parts, each rule in one place:

  - :mod:`~plugproxy.relay.frames`: frame codec and the rules one frame shows;
  - :mod:`~plugproxy.relay.limits`: every bound kept on a peer;
  - :mod:`~plugproxy.relay.hpackcodec`: HPACK and malformed-message checks (§8.2-8.3);
  - :mod:`~plugproxy.relay.connection`: one connection's state, as server or client;
  - :mod:`~plugproxy.relay.pairing`: stream mapping and end-to-end flow control;
  - :mod:`~plugproxy.relay.grpcwire`: gRPC messages, deadlines, metadata, statuses.

- :mod:`~plugproxy.relay.grpcrelay` (TLS endpoints): a gRPC server and client, where grpc
  owns the handshake and the identity checks.

- :mod:`~plugproxy.relay.upstream`: the proxy's own HTTP/2 connection to the plugin.

May import: :mod:`plugproxy.core`, :mod:`plugproxy.api`, :mod:`plugproxy.net`,
:mod:`plugproxy.spec`, :mod:`plugproxy.pipeline`.
"""
