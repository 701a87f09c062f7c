"""(family module: to be written)"""

from __future__ import annotations

from plugproxy.rules.engine import Hooks


def hooks(title: str, v1: bool) -> Hooks:
    """The family's rules and checks for the CSI version cited as ``title``."""
    return Hooks()
