"""The reliability suite (see ``tests/fixtures/reliability.py`` for the ``probe`` fixture and
how its rows become docs/reliability.md)."""
