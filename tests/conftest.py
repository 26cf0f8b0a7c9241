"""Shared pytest wiring. Fixture modules live in tests/fixtures/ and register here."""

pytest_plugins: list[str] = ["tests.fixtures.cluster", "tests.fixtures.kueue"]
