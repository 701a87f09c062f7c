"""Pipeline stages, one module each; their order is in plugproxy.pipeline.

May import: :mod:`plugproxy.core`, :mod:`plugproxy.api`, :mod:`plugproxy.spec`,
:mod:`plugproxy.rules`.
"""
