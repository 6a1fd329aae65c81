"""Settings for every test: the slow tier's time limit."""

import pytest

SLOW_TIMEOUT_S = 1800


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A slow test (learning runs, load, real CLIs at scale) gets 30 minutes unless it sets its own limit;
    the project-wide 300 s (pyproject.toml) is meant for the default tier, and it stopped slow tests that
    run longer."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
