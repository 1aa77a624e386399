"""The generated instance files of the CUDA kernels match their generators.

attention/kernel_src/generate_instances.py and quant/kernel_src/generate_instances.py each write one
translation unit per group of kernel instances and the declarations their host dispatcher
compiles against; a hand edit or a generator change without regenerating would build kernels the
dispatcher does not expect (or fail to link).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import build as build_script  # noqa: E402

# kernel -> file-name prefixes of its generated translation units
KERNELS = {
    "attention": ("attention_fwd_", "attention_bwd_", "attention_sm90_"),
    "quant": ("scaled_mm_sm90_",),
}


def _generator(kernel: str):
    spec = importlib.util.spec_from_file_location(
        f"{kernel}_generate_instances", REPO / kernel / "kernel_src" / "generate_instances.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATED = {k: _generator(k).generated_files() for k in KERNELS}


@pytest.mark.parametrize(
    "kernel,name", [(k, n) for k, files in GENERATED.items() for n in sorted(files)]
)
def test_checked_in_file_matches_the_generator(kernel: str, name: str):
    path = REPO / kernel / "kernel_src" / name
    assert path.is_file(), f"{name} is missing: run {kernel}/kernel_src/generate_instances.py"
    assert path.read_text() == GENERATED[kernel][name], (
        f"{name} differs from what generate_instances.py writes: rerun it (do not edit by hand)"
    )


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_no_stale_generated_file(kernel: str):
    on_disk = {
        p.name
        for p in (REPO / kernel / "kernel_src").iterdir()
        if p.name.startswith(KERNELS[kernel]) and p.suffix == ".cu"
    }
    generated = {n for n in GENERATED[kernel] if n.endswith(".cu")}
    # Hand-written files that share a prefix: the quant dispatcher and its gate pass, the Hopper
    # attention backward's host side.
    hand_written = {"scaled_mm_sm90.cu", "scaled_mm_sm90_gate.cu", "attention_sm90_bwd.cu"}
    assert on_disk - hand_written == generated


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_hopper_units_are_built_for_sm90a_only(kernel: str):
    """The Hopper units (wgmma, setmaxnreg: sm_90a code) are listed in the components built for
    9.0a alone, and in no other (a portable component would compile them for every capability)."""
    project = build_script.load_project(REPO / kernel)
    for name in (n for n in GENERATED[kernel] if "sm90" in n and n.endswith(".cu")):
        owners = [c for c in project.components if f"kernel_src/{name}" in c.src]
        assert owners, f"{name} is not listed in {kernel}/build.toml"
        for comp in owners:
            assert comp.cuda_capabilities == ["9.0a"], f"{name} is built by [kernel.{comp.name}]"


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_every_generated_unit_is_built(kernel: str):
    build_toml = (REPO / kernel / "build.toml").read_text()
    for name in GENERATED[kernel]:
        assert f'"kernel_src/{name}"' in build_toml, f"{name} is not listed in {kernel}/build.toml"


def test_every_attention_tile_config_is_instantiated():
    config = (REPO / "attention" / "kernel_src" / "attention_fwd_config.h").read_text()
    aliases = set(re.findall(r"^using ((?:Prefill|Decode)\w+) = TileConfig<", config, re.M))
    instantiated = {cfg for cfgs in _generator("attention").CONFIGS.values() for cfg in cfgs}
    assert aliases and aliases == instantiated


def test_every_quant_tile_config_is_instantiated():
    config = (REPO / "quant" / "kernel_src" / "scaled_mm_sm90_configs.cuh").read_text()
    structs = set(re.findall(r"^struct (Config\w+)", config, re.M))
    generator = _generator("quant")
    assert structs and structs == (
        set(generator.CONFIGS) | set(generator.BLOCK_CONFIGS) | set(generator.GATED_CONFIGS)
    )


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_generator_check_mode_passes(kernel: str):
    assert _generator(kernel).main(["--check"]) == 0


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_ci_sample_is_generated(kernel: str):
    sample = set(_generator(kernel).CI_SAMPLE)
    assert sample and sample <= {n for n in GENERATED[kernel] if n.endswith(".cu")}


def test_quant_ci_sample_covers_every_instance_kind():
    """CI compiles one unit of each kernel template: scaled (with and without zero points),
    gated and blockwise."""
    text = "".join(GENERATED["quant"][n] for n in _generator("quant").CI_SAMPLE)
    for kind in ("ScaledInstance", "GatedInstance", "BlockInstance"):
        assert f"template struct {kind}<" in text
    assert re.search(r"ScaledInstance<int8_t, \w+, \w+<int8_t>, true>", text)
