"""Planted-breach tables: one module per spec area, each a list ``CASES`` of
:class:`tests.integration.planted.harness.Case`, run by test_planted_breaches.py."""
