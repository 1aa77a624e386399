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

if "LOCAL_KERNELS" not in os.environ:
    os.environ["LOCAL_KERNELS"] = f"{REPO_ID}={BUILD_DIR}"


def pytest_configure(config):
    config.addinivalue_line("markers", "kernels_ci: fast subset (< 60 s) run by kernels CI")


@pytest.fixture(scope="session")
def kernel():
    import kernels

    return kernels.get_kernel(REPO_ID, version=1)


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
