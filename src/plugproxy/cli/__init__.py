"""The commands: ``plugproxy serve`` and the others, each a module with its flags and a
``run``; :mod:`~plugproxy.cli.main` parses the command line and imports only the command
asked for.

May import: any package of plugproxy; nothing imports this package but ``__main__``.
"""
