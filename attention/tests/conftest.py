"""pytest configuration of the attention tests: load the built kernel, pick the device.

Tests never import the source package: `kernel` is `kernels.get_kernel("open-kernels/attention",
version=1)`, which `LOCAL_KERNELS` redirects to this folder's `build/` (run
`python scripts/build.py attention` first). Set LOCAL_KERNELS yourself to test another build.
The fixtures come from attention_fixture.py, a copy of common/kernel_fixture.py
(scripts/sync_common.py).

This directory is not a package (no __init__.py) and its modules have names of their own
(attention_cases, attention_fixture, test_attention_*), so that `pytest tests */tests` can collect
it next to activation/tests (top-level modules), rope/tests and rmsnorm/tests (the package `tests`)
without an "import file mismatch".
"""

from pathlib import Path

from attention_fixture import KERNELS_CI_MARKER, kernel_fixtures

REPO_ID = "open-kernels/attention"
BUILD_DIR = Path(__file__).resolve().parent.parent / "build"

kernel, device = kernel_fixtures(REPO_ID, version=1, build_dir=BUILD_DIR)


def pytest_configure(config):
    config.addinivalue_line("markers", KERNELS_CI_MARKER)
    config.addinivalue_line(
        "markers", "slow: torch.compile or whole models; still part of the default run"
    )
