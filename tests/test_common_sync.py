"""The copies of common/ helpers in the kernel folders match their source (scripts/sync_common.py)
and build.toml lists every copied source or header, so Nix (which sees only listed files) builds
with it."""

import re
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import sync_common  # noqa: E402

COPIES = sync_common.copies()
# Sources and headers are built from build.toml's lists; Python helpers (tests/, the package) need
# no listing.
BUILT_COPIES = [(src, dst) for src, dst in COPIES if dst.suffix != ".py"]


def _id(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_every_common_file_has_users():
    names = {p.name for p in (REPO / "common").iterdir() if p.is_file()}
    assert names == set(sync_common.USERS), "list every common/ file in sync_common.USERS"


def test_destinations_are_known_folders():
    for name, users in sync_common.USERS.items():
        folder = users.dest.split("/")[0]
        assert folder in ("kernel_src", "torch-ext", "tests"), (
            f"{name}: copies go to kernel_src/, torch-ext/ or tests/"
        )
        assert Path(users.dest).suffix == Path(name).suffix, f"{name}: a copy keeps the file type"


@pytest.mark.parametrize("src,dst", COPIES, ids=lambda p: _id(p))
def test_copy_is_identical(src, dst):
    assert dst.exists(), f"{_id(dst)} is missing: run python scripts/sync_common.py"
    assert dst.read_bytes() == src.read_bytes(), (
        f"{_id(dst)} differs from {_id(src)}: edit common/, then run python scripts/sync_common.py"
    )


def _includes(kernel_dir: Path, sources: list[str], header: str) -> bool:
    pattern = re.compile(r'^\s*#\s*include\s+"' + re.escape(header) + '"', re.MULTILINE)
    return any(
        pattern.search((kernel_dir / s).read_text()) for s in sources if (kernel_dir / s).is_file()
    )


@pytest.mark.parametrize("src,dst", BUILT_COPIES, ids=lambda p: _id(p))
def test_copy_is_listed_in_build_toml(src, dst):
    """A copy that build.toml does not list would be missing from Nix builds: a torch-ext/ copy
    belongs to [torch] src; a kernel_src/ copy to the src of every [kernel.*] component whose
    listed sources include it (and of one at least)."""
    kernel_dir = REPO / dst.relative_to(REPO).parts[0]
    build_toml = kernel_dir / "build.toml"
    if not build_toml.exists():
        pytest.skip(f"{kernel_dir.name} has no build.toml yet")
    config = tomllib.loads(build_toml.read_text())
    rel = str(dst.relative_to(kernel_dir))
    if rel.startswith("torch-ext/"):
        assert rel in config.get("torch", {}).get("src", []), (
            f"{_id(build_toml)}: [torch] src must list {rel}"
        )
        return
    components = config.get("kernel", {})
    listing = [name for name, comp in components.items() if rel in comp.get("src", [])]
    assert listing, f"{_id(build_toml)}: the src of a [kernel.*] component must list {rel}"
    for name, comp in components.items():
        if _includes(kernel_dir, comp.get("src", []), dst.name):
            assert name in listing, (
                f"{_id(build_toml)}: [kernel.{name}] includes {dst.name}, so its src must list {rel}"
            )


@pytest.mark.parametrize(
    "kernel_dir", sorted(p.parent for p in REPO.glob("*/kernel_src")), ids=lambda p: p.name
)
def test_kernel_src_reads_no_environment(kernel_dir):
    """Launch options are arguments (PDL: the ops' enable_pdl, pdl_request.h), never environment
    variables read once per process: benchmarks read those in Python and pass the argument."""
    for path in sorted((kernel_dir / "kernel_src").rglob("*")):
        if not path.is_file() or path.suffix not in (".h", ".cuh", ".cu", ".cpp", ".hpp"):
            continue
        rel = _id(path)
        reads = re.findall(r"\bgetenv\s*\(\s*([^)]*)\)", path.read_text())
        assert not reads, (
            f"{rel} reads the environment ({', '.join(reads)}): make it an argument of the op"
        )
