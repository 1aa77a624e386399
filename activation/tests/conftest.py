"""pytest configuration of the activation tests: load the built kernel, pick the device.

Tests never import the source package: `kernel` is `kernels.get_kernel("open-kernels/activation",
version=1)`, which `LOCAL_KERNELS` redirects to this folder's `build/` (run
`python scripts/build.py activation` first). Set LOCAL_KERNELS yourself to test another build.
"""

import os
from pathlib import Path

import pytest
import torch

REPO_ID = "open-kernels/activation"
BUILD_DIR = Path(__file__).resolve().parent.parent / "build"



def _add_local_kernel() -> None:
    # Appended to (not replacing) an existing LOCAL_KERNELS, so that a session that also runs
    # other kernels' suites keeps their redirections; an explicit entry for our id wins.
    entries = [e for e in os.environ.get("LOCAL_KERNELS", "").split(":") if e]
    if not any(e.split("=", 1)[0] == REPO_ID for e in entries):
        os.environ["LOCAL_KERNELS"] = ":".join(entries + [f"{REPO_ID}={BUILD_DIR}"])


def pytest_configure(config):
    config.addinivalue_line("markers", "kernels_ci: fast subset (< 60 s) run by kernels CI")


@pytest.fixture(scope="session")
def kernel():
    import kernels

    _add_local_kernel()
    return kernels.get_kernel(REPO_ID, version=1)


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
