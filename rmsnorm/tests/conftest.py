"""pytest configuration of the rmsnorm tests: load the built kernel, pick the device.

Tests never import the source package: `kernel` is `kernels.get_kernel("open-kernels/rmsnorm",
version=1)`, which `LOCAL_KERNELS` redirects to this folder's `build/` (run
`python scripts/build.py rmsnorm` first). Set LOCAL_KERNELS yourself to test another build.
The fixtures come from rmsnorm_fixture.py, a copy of common/kernel_fixture.py (scripts/sync_common.py).
"""

from pathlib import Path

from rmsnorm_fixture import KERNELS_CI_MARKER, kernel_fixtures

REPO_ID = "open-kernels/rmsnorm"
BUILD_DIR = Path(__file__).resolve().parent.parent / "build"

kernel, device = kernel_fixtures(REPO_ID, version=1, build_dir=BUILD_DIR)


def pytest_configure(config):
    config.addinivalue_line("markers", KERNELS_CI_MARKER)
    config.addinivalue_line(
        "markers", "slow: large shapes or torch.compile; still part of the default run"
    )
