"""What the specs' descriptors say, made ready at startup: the method registry and each
spec's descriptor pool, the objects a request names, and the redaction plans.

- :mod:`~plugproxy.spec.registry`: descriptor pools (bundled and ``--descriptor-set``) and
  every method's spec, message types and streaming kind;
- :mod:`~plugproxy.spec.keys`: the objects (volume, bucket, machine) a request names, per
  spec (what serialization locks and the log shows);
- :mod:`~plugproxy.spec.redact`: which fields are secret, from the descriptors' options and
  the fields the specs forgot to mark, compiled into plans;
- :mod:`~plugproxy.spec.csi_names`: what CSI v0.3 and v1 call the fields both have, for the
  fake plugins and the rule tables that serve both versions with one piece of code.

May import: :mod:`plugproxy.core`, :mod:`plugproxy.api`. The rule tables
(:mod:`plugproxy.rules`) build on this package.
"""
