"""pytest configuration of the quant tests: load the built kernel, pick the device.

Tests never import the source package: `kernel` is `kernels.get_kernel("open-kernels/quant",
version=1)`, which `LOCAL_KERNELS` redirects to this folder's `build/` (run
`python scripts/build.py quant` first). Set LOCAL_KERNELS yourself to test another build.
The fixtures come from quant_fixture.py, a copy of common/kernel_fixture.py (scripts/sync_common.py).
"""

from pathlib import Path

import pytest
import torch
from quant_fixture import KERNELS_CI_MARKER, kernel_fixtures

REPO_ID = "open-kernels/quant"
BUILD_DIR = Path(__file__).resolve().parent.parent / "build"

kernel, device = kernel_fixtures(REPO_ID, version=1, build_dir=BUILD_DIR)


def pytest_configure(config):
    config.addinivalue_line("markers", KERNELS_CI_MARKER)


@pytest.fixture
def gemm_device(kernel, device, request):
    """`device`, where the QuantizedLinear tests run: fp8 needs compute capability 8.9 on CUDA
    (int8 alone would run on 7.5, but the tests cover every mode), and a test parametrized with
    quant="fp8_block" a GPU whose build runs blockwise fp8 (9.0)."""
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            pytest.skip("fp8 needs compute capability 8.9")
        params = getattr(getattr(request.node, "callspec", None), "params", {})
        if params.get("quant") == "fp8_block" and not (
            kernel.cutlass_scaled_mm_supports_block_fp8(major * 10 + minor)
        ):
            pytest.skip("blockwise fp8 needs compute capability 9.0")
    return device


@pytest.fixture
def int4_device(kernel, device):
    """`device`, where the int4 weight-only tests run: on CUDA the GEMM needs capability 8.0."""
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the int4 GEMM needs compute capability 8.0")
    return device
