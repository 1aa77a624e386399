"""The generated instance files of the CUDA attention forward match their generator.

attention/kernel_src/generate_instances.py writes one translation unit per (head dim, dtype), the
combine kernel's, and the dispatch declarations the host launcher compiles against; a hand edit or
a generator change without regenerating would build kernels the launcher does not expect (or fail
to link).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KERNEL_SRC = REPO / "attention" / "kernel_src"


def _generator():
    spec = importlib.util.spec_from_file_location(
        "attention_generate_instances", KERNEL_SRC / "generate_instances.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATED = _generator().generated_files()


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_checked_in_file_matches_the_generator(name: str):
    path = KERNEL_SRC / name
    assert path.is_file(), f"{name} is missing: run attention/kernel_src/generate_instances.py"
    assert path.read_text() == GENERATED[name], (
        f"{name} differs from what generate_instances.py writes: rerun it (do not edit by hand)"
    )


def test_no_stale_generated_file():
    on_disk = {
        p.name
        for p in KERNEL_SRC.iterdir()
        if p.name.startswith("attention_fwd_") and p.suffix == ".cu"
    }
    assert on_disk == {n for n in GENERATED if n.endswith(".cu")}


def test_every_tile_config_is_instantiated():
    config = (KERNEL_SRC / "attention_fwd_config.h").read_text()
    aliases = set(re.findall(r"^using ((?:Prefill|Decode)\w+) = TileConfig<", config, re.M))
    instantiated = {cfg for cfgs in _generator().CONFIGS.values() for cfg in cfgs}
    assert aliases and aliases == instantiated


def test_generator_check_mode_passes():
    assert _generator().main(["--check"]) == 0
