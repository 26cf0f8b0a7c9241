"""What CI installs must be there: under CI=true a missing tool or pinned package fails its test
instead of skipping it, so a broken entry point cannot pass as a skip."""

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(present: bool, what: str) -> None:
    """Skip when `what` is missing on a developer's machine; fail under CI=true, which installs it."""
    if present:
        return
    if in_ci():
        pytest.fail(f"{what} is missing, and CI installs it", pytrace=False)
    pytest.skip(f"{what} is missing")
