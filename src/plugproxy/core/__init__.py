"""What every other package builds on, and which imports nothing else of plugproxy.

- :mod:`~plugproxy.core.endpoints`: the addresses users give (``unix://``, ``tcp://``,
  ``tls://``) and :class:`~plugproxy.core.endpoints.ConfigError`, the one error a wrong
  setting raises;
- :mod:`~plugproxy.core.options`: flags declared next to the code they configure, with
  their environment variables and parsers (durations, sizes);
- :mod:`~plugproxy.core.log`: the one writer of log lines;
- :mod:`~plugproxy.core.sampling`: large messages read from a sample of their long lists;
- :mod:`~plugproxy.core.memory`: bounded, expiring maps (what the rules, the redactor and
  readiness remember);
- :mod:`~plugproxy.core.locks`: per-object locks that are given back when unused.

May import: nothing of plugproxy outside this package.
"""
