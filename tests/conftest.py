"""Settings for every test: the slow tier's time limit, and the event loop policy each test starts with."""

import asyncio

import pytest

SLOW_TIMEOUT_S = 1800


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A slow test (learning runs, load, real CLIs at scale) gets 30 minutes unless it sets its own limit;
    the project-wide 300 s (pyproject.toml) is meant for the default tier, and it stopped slow tests that
    run longer."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


@pytest.fixture(autouse=True)
def default_event_loop_policy():
    """Put back the event loop policy a test found: a test that installs uvloop for the process (uvicorn and
    libraries may) would have every later test run on uvloop without saying so. Tests that need uvloop name it
    (tests/sandbox/test_pipes.py, tests/reliability/test_load.py); benchmarks run on a loop of their own
    (`benchmarks.proxy_load.run_on`)."""
    policy = asyncio.get_event_loop_policy()
    yield
    asyncio.set_event_loop_policy(policy)
