"""The copies of common/ helpers in the kernel folders match their source (scripts/sync_common.py)."""

import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import sync_common  # noqa: E402


def test_every_common_file_has_users():
    names = {p.name for p in (REPO / "common").iterdir() if p.is_file()}
    assert names == set(sync_common.USERS), "list every common/ file in sync_common.USERS"


@pytest.mark.parametrize("src,dst", sync_common.copies(), ids=lambda p: str(p.relative_to(REPO)))
def test_copy_is_identical(src, dst):
    assert dst.exists(), f"{dst.relative_to(REPO)} is missing: run python scripts/sync_common.py"
    assert dst.read_bytes() == src.read_bytes(), (
        f"{dst.relative_to(REPO)} differs from {src.relative_to(REPO)}: edit common/, then run "
        "python scripts/sync_common.py"
    )


@pytest.mark.parametrize("src,dst", sync_common.copies(), ids=lambda p: str(p.relative_to(REPO)))
def test_copy_is_listed_in_build_toml(src, dst):
    """A copy that build.toml does not list would be missing from Nix builds."""
    build_toml = dst.parent.parent / "build.toml"
    if not build_toml.exists():
        pytest.skip(f"{build_toml.parent.name} has no build.toml yet")
    config = tomllib.loads(build_toml.read_text())
    listed = {s for k in config.get("kernel", {}).values() for s in k.get("src", [])}
    assert f"kernel_src/{dst.name}" in listed, f"{build_toml.relative_to(REPO)} must list kernel_src/{dst.name}"
