"""The bundled specs' descriptor sets, written from protos/ by `make protos`: data only.

May import: nothing of plugproxy.
"""
