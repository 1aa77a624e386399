#!/usr/bin/env python3
"""Copy the shared helpers of common/ into the kernel folders that use them.

Each kernel folder is a standalone kernel-builder project (Nix sees only that folder), and its
tests/ must run on their own, so a helper that several kernels need cannot be included or
imported from outside the folder. common/ holds the one source of truth; this script writes a
byte-identical copy into each user's folder (kernel_src/, torch-ext/ or tests/, as USERS says),
and tests/test_common_sync.py fails when a copy drifts or is missing from build.toml.

    python scripts/sync_common.py          # write the copies
    python scripts/sync_common.py --check  # exit 1 and list the copies that differ
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
COMMON = REPO / "common"


class Users(NamedTuple):
    # Path of the copy inside each kernel folder; "{kernel}" is replaced by the folder's name (for
    # tests/ helpers: module names must differ between folders that pytest collects together).
    dest: str
    kernels: tuple[str, ...]


# common file -> where its copies go and which kernel folders hold one
USERS: dict[str, Users] = {
    # device code and launchers: listed in the [kernel.*] src of the components that include it
    "pdl.cuh": Users("kernel_src/pdl.cuh", ("activation", "attention", "rmsnorm", "rope")),
    "pdl_request.h": Users(
        "kernel_src/pdl_request.h", ("activation", "attention", "rmsnorm", "rope")
    ),
    "dispatch.cuh": Users(
        "kernel_src/dispatch.cuh", ("activation", "attention", "quant", "rmsnorm", "rope")
    ),
    "cuda_chunk.cuh": Users("kernel_src/cuda_chunk.cuh", ("rmsnorm", "rope")),
    "cpu_convert.h": Users("kernel_src/cpu_convert.h", ("rmsnorm", "rope")),
    # the Torch-facing layer: listed in [torch] src
    "torch_checks.h": Users(
        "torch-ext/torch_checks.h", ("activation", "attention", "quant", "rmsnorm", "rope")
    ),
    # the Python package: error messages name the public function called (Nix sees the package's
    # Python files without a listing)
    "public_errors.py": Users(
        "torch-ext/{kernel}/_public_errors.py",
        ("activation", "attention", "quant", "rmsnorm", "rope"),
    ),
    # the Python package: the eager-inference shortcut past the custom ops
    "eager_path.py": Users(
        "torch-ext/{kernel}/_eager_path.py", ("activation", "attention", "rmsnorm", "rope")
    ),
    # the Python package: attach_layers, the kernelize layers attached by host class (rope has
    # no host module class to attach to; attention plugs in through AttentionInterface)
    "hub_layers.py": Users("torch-ext/{kernel}/_hub_layers.py", ("activation", "rmsnorm")),
    # pytest helpers (Nix sees the Python files of tests/ without a listing)
    "kernel_fixture.py": Users(
        "tests/{kernel}_fixture.py", ("activation", "attention", "quant", "rmsnorm", "rope")
    ),
    "tiny_models.py": Users(
        "tests/{kernel}_tiny_models.py", ("activation", "attention", "quant", "rmsnorm")
    ),
}


def copies() -> list[tuple[Path, Path]]:
    """(source, copy) pairs; kernel folders that do not exist yet are skipped."""
    pairs = []
    for name, users in USERS.items():
        for kernel in users.kernels:
            if (REPO / kernel / "build.toml").exists() or (REPO / kernel / "kernel_src").is_dir():
                pairs.append((COMMON / name, REPO / kernel / users.dest.format(kernel=kernel)))
    return pairs


def stale() -> list[tuple[Path, Path]]:
    """The (source, copy) pairs whose copy is missing or differs from its source."""
    return [
        (src, dst)
        for src, dst in copies()
        if not dst.exists() or dst.read_bytes() != src.read_bytes()
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report copies that differ")
    args = parser.parse_args()
    if args.check:
        bad = stale()
        for _, dst in bad:
            print(f"out of date: {dst.relative_to(REPO)} (run python scripts/sync_common.py)")
        return 1 if bad else 0
    for src, dst in stale():
        dst.write_bytes(src.read_bytes())
        print(f"wrote {dst.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
