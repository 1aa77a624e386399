"""pytest configuration of the newkernel tests: load the built kernel, pick the device.

Tests never import the source package: `kernel` is `kernels.get_kernel("open-kernels/newkernel",
version=1)`, which `LOCAL_KERNELS` redirects to this folder's `build/` (run
`python scripts/build.py newkernel` first). Set LOCAL_KERNELS yourself to test another build.
The fixtures come from newkernel_fixture.py, a copy of common/kernel_fixture.py
(scripts/sync_common.py).
"""

from pathlib import Path

from newkernel_fixture import KERNELS_CI_MARKER, kernel_fixtures

REPO_ID = "open-kernels/newkernel"
BUILD_DIR = Path(__file__).resolve().parent.parent / "build"

kernel, device = kernel_fixtures(REPO_ID, version=1, build_dir=BUILD_DIR)


def pytest_configure(config):
    config.addinivalue_line("markers", KERNELS_CI_MARKER)
