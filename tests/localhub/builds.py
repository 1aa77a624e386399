"""Helpers to fake or alter kernel build trees in tests (digests via the loader's own Rust core)."""

from __future__ import annotations

import json
from pathlib import Path

from kernels._rust import Digest, DigestAlgorithm


def rehash(variant_dir: Path) -> dict:
    """Recompute `digest` in the variant's metadata.json over its current files; returns the metadata."""
    meta_path = Path(variant_dir) / "metadata.json"
    meta = json.loads(meta_path.read_text())
    digest = Digest.hash_variant(DigestAlgorithm.SHA256, variant_dir)
    meta["digest"] = {"algorithm": "sha256", "files": dict(sorted(digest.files.items()))}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def edit_metadata(variant_dir: Path, **changes) -> dict:
    """Set top-level metadata keys (None removes a key); the digest does not cover metadata.json."""
    meta_path = Path(variant_dir) / "metadata.json"
    meta = json.loads(meta_path.read_text())
    for key, value in changes.items():
        key = key.replace("_", "-")
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def make_fake_kernel(
    root: Path,
    *,
    name: str = "fakek",
    version: int = 1,
    repo_id: str | None = "open-kernels/fakek",
    variants: tuple[str, ...] = ("torch-cpu",),
    card: bool = True,
) -> Path:
    """A kernel folder with a Python-only build (loadable noarch layout, or arch names for upload-only tests)."""
    kdir = Path(root) / name
    (kdir / "build").mkdir(parents=True)
    hub = f'\n[general.hub]\nrepo-id = "{repo_id}"\n' if repo_id else "\n"
    (kdir / "build.toml").write_text(
        f'[general]\nname = "{name}"\nversion = {version}\nedition = 5\nlicense = "Apache-2.0"\n'
        f'backends = ["cpu"]\n{hub}\n[torch-noarch]\n'
    )
    bench = kdir / "build" / "benchmarks"
    bench.mkdir()
    (bench / "benchmark.py").write_text("def run():\n    return 0\n")
    (bench / "helper.py").write_text("# not a benchmark*.py file: never uploaded\n")
    if card:
        (kdir / "build" / "CARD.md").write_text(
            f"---\nlibrary_name: kernels\nlicense: apache-2.0\n---\n\n# {name}\n\nversion {version}\n"
        )
    for variant in variants:
        vdir = kdir / "build" / variant
        vdir.mkdir()
        (vdir / "__init__.py").write_text(
            f'from ._ops import ops\n\n__all__ = ["hello"]\n\n\ndef hello():\n    return "{name} v{version} {variant}"\n'
        )
        (vdir / "_ops.py").write_text(f'ops = None\nOPS_NAME = "_{name}_cpu_abc1234"\n')
        (vdir / "metadata.json").write_text(
            json.dumps(
                {
                    "name": name,
                    "id": f"_{name}_cpu_abc1234",
                    "version": version,
                    "license": "Apache-2.0",
                    "python-depends": [],
                    "kernel-depends": [],
                    "backend": {"type": "cpu"},
                    "provenance": {
                        "kernel-builder": {"version": "0.17.0"},
                        "kernel": {"commit": "ab" * 20, "dirty": False},
                    },
                },
                indent=2,
            )
        )
        rehash(vdir)
    return kdir
