"""scripts/new_kernel.py end to end, in a temporary copy of the repository (the slow test).

The copy holds what scaffolding, building and checking a kernel read (scripts/, common/, the
root flake, the lint configuration and the repository tests that judge a kernel folder), as a
git repository, so the build gets a clean id and the Nix check sees tracked files. There the
script creates a kernel, which must then pass, as generated: the lint, the common/ drift check,
the Nix file check, the layout and common-sync tests, scripts/build.py (CPU, smoke-loaded with
kernels) and its own test suite, and scripts/compile_check.py when nvcc is installed. The real
tree never holds the scaffolded kernel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NAME = "scaffoldcheck"
COPIED = [
    "scripts",
    "common",
    "requirements-dev.txt",
    "ruff.toml",
    ".clang-format",
    "flake.nix",
    "flake.lock",
    "tests/test_layout.py",
    "tests/test_common_sync.py",
]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false"]


def run(args: list, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    # LOCAL_KERNELS of this session (set by other kernels' fixtures) must not leak in.
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_KERNELS"}
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, (
        f"$ {' '.join(res.args)}\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    )
    return res.stdout


def tool(name: str) -> str | None:
    local = Path(sys.executable).parent / name
    return str(local) if local.is_file() else shutil.which(name)


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for rel in COPIED:
        src, dst = REPO / rel, root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore)
        else:
            shutil.copy2(src, dst)
    if shutil.which("git"):
        ok(run(["git", "init", "-q"], root))
        ok(run([*GIT, "add", "-A"], root))
        ok(run([*GIT, "commit", "-qm", "copy"], root))
    return root


def test_refusals(copy: Path):
    script = [sys.executable, "scripts/new_kernel.py"]
    for bad in ("Bad", "my-kernel", "my_kernel", "x", "tests", "testing", "class"):
        res = run([*script, bad], copy)
        assert res.returncode == 1 and "invalid kernel name" in res.stderr, (bad, res.stderr)
    (copy / "taken").mkdir()
    res = run([*script, "taken"], copy)
    assert res.returncode == 1 and "taken/ already exists" in res.stderr
    (copy / "taken").rmdir()


@pytest.mark.slow
def test_scaffolded_kernel_builds_and_passes_its_tests(copy: Path):
    py = sys.executable
    out = ok(run([py, "scripts/new_kernel.py", NAME], copy))
    assert f"python scripts/build.py {NAME}" in out and "upload.py" in out
    assert "def scale(" in (copy / NAME / "torch-ext" / NAME / "__init__.py").read_text()
    if shutil.which("git"):
        ok(run([*GIT, "add", "-A"], copy))
        ok(run([*GIT, "commit", "-qm", NAME], copy))

    # What CI's lint and the repository tests check of every kernel folder.
    ok(run([py, "scripts/sync_common.py", "--check"], copy))
    assert "OK: 0 problem(s)" in ok(run([py, "scripts/nix_locks.py", "check"], copy))
    if tool("ruff"):
        ok(run([tool("ruff"), "format", "--check", NAME, "scripts"], copy))
        ok(run([tool("ruff"), "check", NAME, "scripts"], copy))
    if tool("clang-format"):
        cxx = [p for p in (copy / NAME).rglob("*") if p.suffix in (".h", ".cpp", ".cu", ".cuh")]
        ok(run([tool("clang-format"), "--style=file", "--dry-run", "-Werror", *cxx], copy))
    checks = ok(
        run(
            [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", NAME]
            + ["tests/test_layout.py", "tests/test_common_sync.py"],
            copy,
        )
    )
    assert " passed" in checks and "failed" not in checks

    # Build (CPU), smoke-load with kernels, and run the kernel's own tests.
    build = ok(run([py, "scripts/build.py", NAME, "--backend", "cpu", "-j", "2"], copy))
    assert f"smoke-load: loaded _{NAME}_cpu_" in build
    assert "_dirty" not in build or not shutil.which("git")
    tests = ok(run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{NAME}/tests"], copy))
    assert " passed" in tests and "failed" not in tests
    # The CUDA code, without a GPU (skipped, with a message, where nvcc is not installed).
    ok(run([py, "scripts/compile_check.py", NAME, "--jobs", "1"], copy))
