#!/usr/bin/env python3
"""Copy the shared device helpers of common/ into the kernel folders that use them.

Each kernel folder is a standalone kernel-builder project (Nix sees only that folder), so a
helper that several kernels need cannot be included from outside it. common/ holds the one
source of truth; this script writes a byte-identical copy into each user's kernel_src/, and
tests/test_common_sync.py fails when a copy drifts.

    python scripts/sync_common.py          # write the copies
    python scripts/sync_common.py --check  # exit 1 and list the copies that differ
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMON = REPO / "common"

# common file -> the kernel folders whose kernel_src/ holds a copy
USERS: dict[str, tuple[str, ...]] = {
    "pdl.cuh": ("activation", "attention", "rmsnorm", "rope"),
}


def copies() -> list[tuple[Path, Path]]:
    """(source, copy) pairs; kernel folders that do not exist yet are skipped."""
    pairs = []
    for name, kernels in USERS.items():
        for kernel in kernels:
            if (REPO / kernel / "build.toml").exists() or (REPO / kernel / "kernel_src").is_dir():
                pairs.append((COMMON / name, REPO / kernel / "kernel_src" / name))
    return pairs


def stale() -> list[Path]:
    return [dst for src, dst in copies() if not dst.exists() or dst.read_bytes() != src.read_bytes()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report copies that differ")
    args = parser.parse_args()
    if args.check:
        bad = stale()
        for path in bad:
            print(f"out of date: {path.relative_to(REPO)} (run python scripts/sync_common.py)")
        return 1 if bad else 0
    for src, dst in copies():
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            dst.write_bytes(src.read_bytes())
            print(f"wrote {dst.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
