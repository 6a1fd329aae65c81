import pytest

from harness_adapters.base import HarnessInstall


@pytest.fixture(scope="session", autouse=True)
def _harnesses_installed():
    if not HarnessInstall.default().binary("claude").exists():
        pytest.fail("the harness CLIs are not installed: run `bash scripts/setup.sh` first")
