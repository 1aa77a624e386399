"""pytest configuration of the attention tests: load the built kernel, pick the device.

Tests never import the source package: `kernel` is `kernels.get_kernel("open-kernels/attention",
version=1)`, which `LOCAL_KERNELS` redirects to this folder's `build/` (run
`python scripts/build.py attention` first). Set LOCAL_KERNELS yourself to test another build.

This directory is not a package (no __init__.py) and its modules have names of their own
(attention_cases, test_attention_*), so that `pytest tests */tests` can collect it next to
activation/tests (top-level modules), rope/tests and rmsnorm/tests (the package `tests`) without
an "import file mismatch".
"""

import os
from pathlib import Path

import pytest
import torch

REPO_ID = "open-kernels/attention"
BUILD_DIR = Path(__file__).resolve().parent.parent / "build"


def _add_local_kernel() -> None:
    # Appended to (not replacing) an existing LOCAL_KERNELS, so that a session that also runs
    # other kernels' suites keeps their redirections; an explicit entry for our id wins. Done
    # when the fixture first runs, not at import: activation/tests/conftest.py sets its entry at
    # import only if LOCAL_KERNELS is unset, which must stay true whatever the collection order.
    entries = [e for e in os.environ.get("LOCAL_KERNELS", "").split(":") if e]
    if not any(e.split("=", 1)[0] == REPO_ID for e in entries):
        os.environ["LOCAL_KERNELS"] = ":".join(entries + [f"{REPO_ID}={BUILD_DIR}"])


def pytest_configure(config):
    config.addinivalue_line("markers", "kernels_ci: fast subset (< 60 s) run by kernels CI")
    config.addinivalue_line("markers", "slow: torch.compile or whole models; still part of the default run")


@pytest.fixture(scope="session")
def kernel():
    import kernels

    _add_local_kernel()
    return kernels.get_kernel(REPO_ID, version=1)


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
