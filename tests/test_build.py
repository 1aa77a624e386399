"""scripts/build.py: conformance of what it writes, incrementality and failure behaviour.

The conformance half checks the real builds in <kernel>/build/ (scripts/dev.sh test builds them
before pytest runs; the tests skip with that instruction when a build is missing). The behaviour
half builds a small throwaway kernel in a temporary git repository, so it can break it at will.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kernels._rust as kernels_rust
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import build as build_script  # noqa: E402

KERNEL_DIRS = build_script.discover_kernels(REPO)


def _variants(kernel_dir: Path) -> list[Path]:
    build = kernel_dir / "build"
    variants = (
        [p for p in build.iterdir() if p.is_dir() and (p / "metadata.json").is_file()]
        if build.is_dir()
        else []
    )
    if not variants:
        pytest.skip(f"{kernel_dir.name} is not built: run scripts/dev.sh build")
    return variants


@pytest.mark.parametrize("kernel_dir", KERNEL_DIRS, ids=lambda p: p.name)
def test_variant_layout_matches_kernel_builder(kernel_dir: Path):
    project = build_script.load_project(kernel_dir)
    for variant in _variants(kernel_dir):
        # The name parses as the loader parses it and matches this machine's Torch.
        assert re.fullmatch(
            r"torch\d\d+-cxx11-(cpu|cu\d\d\d)-(x86_64|aarch64)-linux", variant.name
        ), variant.name
        meta = json.loads((variant / "metadata.json").read_text())
        kernels_rust.Metadata.read_from_file(variant / "metadata.json")  # the loader's validation
        ops_name = meta["id"]
        backend = meta["backend"]["type"]
        assert re.fullmatch(rf"_{project.python_name}_{backend}_[0-9a-f]{{7}}(_dirty)?", ops_name)
        # The five places kernel-builder names the ops id agree: .so stem, _ops.py, metadata id.
        sos = sorted(p.name for p in variant.glob("*.so"))
        assert sos == [f"{ops_name}.abi3.so"], sos
        ops_py = (variant / "_ops.py").read_text()
        assert f"from . import {ops_name}\n" in ops_py
        assert f"torch.ops.{ops_name}\n" in ops_py
        assert f'return f"{ops_name}::{{op_name}}"' in ops_py
        assert meta["name"] == project.name and meta["version"] == project.version
        assert meta["license"] == project.license
        assert meta["python-depends"] == [] and "torch" not in meta["python-depends"]
        if backend == "cuda":
            assert (
                meta["backend"]["archs"] == sorted(meta["backend"]["archs"])
                and meta["backend"]["archs"]
            )
        else:
            assert "archs" not in meta["backend"]
        # Flat layout: the package's .py files at the variant root, no bytecode, no .pyi.
        package = kernel_dir / "torch-ext" / project.python_name
        expected = {
            str(p.relative_to(package))
            for p in package.rglob("*.py")
            if "__pycache__" not in p.parts and p.name != "_ops.py"
        }
        shipped = {str(p.relative_to(variant)) for p in variant.rglob("*") if p.is_file()}
        assert shipped == expected | {"_ops.py", "metadata.json", f"{ops_name}.abi3.so"}
        for rel in expected:
            assert (variant / rel).read_bytes() == (package / rel).read_bytes(), rel
        # The digest is the one kernel-builder's `hash` would write, over the final tree.
        actual = kernels_rust.Digest.hash_variant(kernels_rust.DigestAlgorithm.SHA256, variant)
        assert meta["digest"] == {
            "algorithm": "sha256",
            "files": dict(sorted(actual.files.items())),
        }
        assert set(meta["provenance"]) <= {"kernel-builder", "kernel"}


@pytest.mark.parametrize("kernel_dir", KERNEL_DIRS, ids=lambda p: p.name)
def test_card_and_benchmarks_are_bundled(kernel_dir: Path):
    _variants(kernel_dir)
    project = build_script.load_project(kernel_dir)
    card = (kernel_dir / "build" / "CARD.md").read_text()
    assert card.startswith("---\n") and "library_name: kernels" in card.split("---")[1]
    assert "{{" not in card and "{%" not in card, "CARD.md was not rendered"
    assert project.repo_id in card
    bench = kernel_dir / "build" / "benchmarks" / "benchmark.py"
    assert bench.read_bytes() == (kernel_dir / "benchmarks" / "benchmark.py").read_bytes()


@pytest.mark.parametrize("kernel_dir", KERNEL_DIRS, ids=lambda p: p.name)
def test_built_kernel_loads_and_registers_its_namespace(kernel_dir: Path):
    variants = [
        v
        for v in _variants(kernel_dir)
        if json.loads((v / "metadata.json").read_text())["backend"]["type"] == "cpu"
    ]
    if not variants:
        pytest.skip("no CPU variant")
    meta = json.loads((variants[0] / "metadata.json").read_text())
    code = (
        "import json, pathlib, sys, torch, kernels\n"
        "m = kernels.get_local_kernel(pathlib.Path(sys.argv[1]), backend='cpu')\n"
        # Public functions need not share an op's name (quant's wrap vLLM's raw ops).
        "ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith(m.__name__ + '::')]\n"
        "print(json.dumps([m.__name__, sorted(m.__all__), bool(ops)]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(kernel_dir / "build")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    name, exported, registered = json.loads(out.strip().splitlines()[-1])
    assert name == meta["id"]
    assert exported and registered


# ---- behaviour, on a throwaway kernel -------------------------------------------------------

TOY_TOML = """\
[general]
name = "toy-kernel"
version = 3
edition = 5
license = "Apache-2.0"
backends = ["cpu"]

[general.hub]
repo-id = "test-org/toy-kernel"

[torch]
src = ["torch-ext/torch_binding.cpp"]
include = ["kernel_src"]

[kernel.toy_cpu]
backend = "cpu"
depends = ["torch"]
src = ["kernel_src/scale.cpp", "kernel_src/scale.h"]
"""

TOY_FILES = {
    "kernel_src/scale.h": "#pragma once\n#include <ATen/core/Tensor.h>\nvoid scale(at::Tensor& out, const at::Tensor& x, double factor);\n",
    "kernel_src/scale.cpp": '#include "scale.h"\n#include <ATen/ops/mul.h>\n'
    "void scale(at::Tensor& out, const at::Tensor& x, double factor) { out.copy_(at::mul(x, factor)); }\n",
    "torch-ext/torch_binding.cpp": '#include <torch/library.h>\n#include "registration.h"\n#include "scale.h"\n'
    "TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {\n"
    '  ops.def("scale(Tensor! out, Tensor x, float factor) -> ()");\n'
    '  ops.impl("scale", c10::kCPU, &scale);\n}\n'
    "REGISTER_EXTENSION(TORCH_EXTENSION_NAME)\n",
    "torch-ext/toy_kernel/__init__.py": "import torch\nfrom ._ops import ops\n\n"
    "def scale(x, factor):\n    out = torch.empty_like(x)\n    ops.scale(out, x, factor)\n    return out\n\n"
    '__all__ = ["scale"]\n',
    "torch-ext/toy_kernel/helpers/__init__.py": "VALUE = 1\n",
    "torch-ext/toy_kernel/stub.pyi": "def scale(x, factor): ...\n",
    "CARD.md": "---\nlibrary_name: kernels\nlicense: {{ license }}\n---\n# {{ repo_id }} v{{ version }}\n"
    "{% for f in functions %}- {{ f }}\n{% endfor %}",
    "benchmarks/benchmark.py": "# placeholder benchmark script for the toy kernel\n",
}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def toy_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("toyrepo")
    (repo / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "build.py", repo / "scripts" / "build.py")
    kernel = repo / "toy-kernel"
    for rel, text in {"build.toml": TOY_TOML, **TOY_FILES}.items():
        (kernel / rel).parent.mkdir(parents=True, exist_ok=True)
        (kernel / rel).write_text(text)
    (repo / ".gitignore").write_text("build/\n_build/\n__pycache__/\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "toy")
    return repo


def _build(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(repo / "scripts" / "build.py"), *args],
        cwd=repo,
        capture_output=True,
        text=True,
    )


def _variant(repo: Path) -> Path:
    (variant,) = [
        p
        for p in (repo / "toy-kernel" / "build").iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name != "benchmarks"
    ]
    return variant


def test_toy_build_is_conformant_and_loads(toy_repo: Path):
    proc = _build(toy_repo, "--jobs", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tree = _git(toy_repo, "rev-parse", "HEAD:toy-kernel")
    commit = _git(toy_repo, "rev-parse", "HEAD")
    variant = _variant(toy_repo)
    meta = json.loads((variant / "metadata.json").read_text())
    assert meta["id"] == f"_toy_kernel_cpu_{tree[:7]}"  # 7 hex of the kernel folder's tree
    assert meta["name"] == "toy-kernel" and meta["version"] == 3
    assert meta["provenance"]["kernel"] == {"commit": commit, "dirty": False}
    assert (variant / "helpers" / "__init__.py").is_file()  # nested packages are kept
    assert not (variant / "stub.pyi").exists()  # .pyi is not installed in arch builds
    card = (toy_repo / "toy-kernel" / "build" / "CARD.md").read_text()
    assert (
        "# test-org/toy-kernel v3" in card and "- scale" in card and "license: apache-2.0" in card
    )
    assert (
        "[toy-kernel " in proc.stdout and "compile kernel_src/scale.cpp" in proc.stdout
    )  # progress
    assert "smoke-load: loaded _toy_kernel_cpu_" in proc.stdout
    assert "ABI:" in proc.stdout  # kernel-abi-check ran and reported
    code = (
        "import pathlib, sys, torch, kernels\n"
        "m = kernels.get_local_kernel(pathlib.Path(sys.argv[1]))\n"
        "x = torch.arange(5.0)\nassert torch.equal(m.scale(x, 2.5), x * 2.5)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(toy_repo / "toy-kernel" / "build")], check=True)
    # A rebuild that changes nothing does not load the variant again.
    again = _build(toy_repo)
    assert again.returncode == 0, again.stderr
    assert "smoke-load: unchanged since it last loaded" in again.stdout, again.stdout


def test_toy_rebuild_is_incremental(toy_repo: Path):
    assert _build(toy_repo, "--no-smoke").returncode == 0
    proc = _build(toy_repo, "--no-smoke")
    assert proc.returncode == 0
    assert "compile" not in proc.stdout and "link" not in proc.stdout, proc.stdout


def test_change_outside_the_kernel_keeps_its_id(toy_repo: Path):
    assert _build(toy_repo, "--no-smoke").returncode == 0
    before = json.loads((_variant(toy_repo) / "metadata.json").read_text())
    (toy_repo / "README.md").write_text("# toys\n\n")
    proc = _build(toy_repo, "--no-smoke")  # uncommitted, outside the folder: still clean
    assert proc.returncode == 0 and "compile" not in proc.stdout, proc.stdout
    assert json.loads((_variant(toy_repo) / "metadata.json").read_text()) == before
    _git(toy_repo, "add", "README.md")
    _git(toy_repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "readme")
    proc = _build(toy_repo, "--no-smoke")
    assert proc.returncode == 0 and "compile" not in proc.stdout and "link" not in proc.stdout, (
        proc.stdout
    )
    # Same id, same provenance (the last commit that changed the folder): nothing new to upload.
    assert json.loads((_variant(toy_repo) / "metadata.json").read_text()) == before


def _upload_dry_run(kernel_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "upload.py"), str(kernel_dir), "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def test_untracked_or_modified_kernel_is_dirty_and_refused(toy_repo: Path):
    kernel = toy_repo / "toy-kernel"
    scale = kernel / "kernel_src" / "scale.cpp"
    original = scale.read_text()
    extra = kernel / "kernel_src" / "notes.h"
    try:
        for change in ("untracked", "modified"):
            if change == "untracked":
                extra.write_text("// never committed\n")
            else:
                extra.unlink()
                scale.write_text(original + "// touched\n")
            proc = _build(toy_repo, "--no-smoke")
            assert proc.returncode == 0, proc.stderr
            assert "note: uncommitted or untracked files in toy-kernel" in proc.stdout, proc.stdout
            meta = json.loads((_variant(toy_repo) / "metadata.json").read_text())
            assert (
                meta["id"].endswith("_dirty") and meta["provenance"]["kernel"]["dirty"] is True
            ), change
            assert len(list(_variant(toy_repo).glob("*.so"))) == 1  # no stale .so of the clean id
            refused = _upload_dry_run(kernel)
            assert refused.returncode == 1 and "dirty build" in refused.stderr, refused.stderr
    finally:
        scale.write_text(original)
        extra.unlink(missing_ok=True)


def _scratch_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "k").mkdir(parents=True)
    (repo / "k" / "a.txt").write_text("a\n")
    (repo / ".gitignore").write_text("build/\n")
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", ".")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "k")
    return repo


def test_identity_follows_the_kernel_folder(tmp_path: Path):
    repo = _scratch_repo(tmp_path)
    ident = build_script.git_identity(repo / "k")
    assert ident == build_script.GitIdentity(
        _git(repo, "rev-parse", "HEAD:k")[:7], _git(repo, "rev-parse", "HEAD"), False
    )
    (repo / "k" / "build").mkdir()
    (repo / "k" / "build" / "out.so").write_text("ignored\n")
    assert build_script.git_identity(repo / "k") == ident  # ignored files do not count
    # A never-committed kernel folder next to it: dirty, whatever HEAD says.
    (repo / "new").mkdir()
    (repo / "new" / "build.toml").write_text("[general]\n")
    fresh = build_script.git_identity(repo / "new")
    assert fresh.dirty and fresh.unique_id.endswith("_dirty") and fresh.commit == ident.commit
    assert build_script.git_identity(repo / "k") == ident  # the neighbour's files are not k's


def test_jobs_cap_the_compilers_over_all_variants():
    for variants in range(1, 9):
        for jobs in range(1, 9):
            workers, per_job = build_script.parallelism(variants, jobs)
            assert 1 <= workers <= variants and workers * per_job <= jobs, (variants, jobs)
    assert build_script.parallelism(8, 1) == (1, 1)
    assert build_script.parallelism(2, 8) == (2, 4)
    with pytest.raises(SystemExit):
        build_script.main(["-j", "0"])


@pytest.mark.parametrize(
    "breakage, message",
    [
        (
            lambda k: (k / "build.toml").write_text(
                TOY_TOML.replace('license = "Apache-2.0"\n', 'license = "Apache-2.0"\ncolour = 1\n')
            ),
            r"toy-kernel: invalid toy-kernel/build\.toml: .*Unknown field colour",
        ),
        (
            lambda k: (k / "build.toml").write_text(
                TOY_TOML.replace(
                    '"kernel_src/scale.h"]', '"kernel_src/scale.h", "kernel_src/gone.cpp"]'
                )
            ),
            r"toy-kernel: source kernel_src/gone\.cpp is listed in build\.toml but does not exist",
        ),
        (
            lambda k: (k / "kernel_src" / "scale.cpp").write_text(
                TOY_FILES["kernel_src/scale.cpp"] + "int broken(\n"
            ),
            r"toy-kernel: compiling kernel_src/scale\.cpp failed",
        ),
    ],
    ids=["unknown-key", "missing-source", "compiler-error"],
)
def test_failures_name_kernel_and_file_and_keep_previous_build(toy_repo: Path, breakage, message):
    kernel = toy_repo / "toy-kernel"
    assert _build(toy_repo, "--no-smoke").returncode == 0
    before = {
        p.relative_to(_variant(toy_repo)): p.read_bytes()
        for p in _variant(toy_repo).rglob('*')
        if p.is_file()
    }
    saved = {rel: (kernel / rel).read_text() for rel in ("build.toml", "kernel_src/scale.cpp")}
    try:
        breakage(kernel)
        proc = _build(toy_repo, "--no-smoke")
        assert proc.returncode != 0
        assert re.search(message, proc.stderr), proc.stderr
        after = {
            p.relative_to(_variant(toy_repo)): p.read_bytes()
            for p in _variant(toy_repo).rglob('*')
            if p.is_file()
        }
        assert after == before  # the previous variant is untouched
        assert not list((kernel / "build").glob(".*partial"))  # nothing half-written left behind
    finally:
        for rel, text in saved.items():
            (kernel / rel).write_text(text)


def test_dev_sh_help_exits_0_and_prints_only_the_usage():
    for arg in ("--help", "-h", "help"):
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "dev.sh"), arg], capture_output=True, text=True
        )
        assert proc.returncode == 0 and not proc.stderr, (arg, proc.stderr)
        lines = proc.stdout.splitlines()
        assert (
            lines[0] == "One entry point on a fresh machine."
            and "scripts/dev.sh build" in proc.stdout
        )
        assert not any(line.startswith(("set ", "cd ", "#")) for line in lines), proc.stdout
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "dev.sh"), "nonsense"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "unknown command: nonsense" in proc.stderr


# ---- CUTLASS for kernels whose build.toml depends on a cutlass_* tag ----


def test_cutlass_tags_name_kernel_builder_versions():
    """Every tag kernel-builder accepts has a version here, and the repository's kernels use
    only such tags."""
    assert set(build_script.CUTLASS_TAGS) == {
        "cutlass_2_10",
        "cutlass_3_5",
        "cutlass_3_6",
        "cutlass_3_8",
        "cutlass_3_9",
        "cutlass_4_0",
        "cutlass_4_4",
        "cutlass_4_5",
    }
    for kernel_dir in KERNEL_DIRS:
        for comp in build_script.load_project(kernel_dir).components:
            tags = [d for d in comp.depends if d.startswith("cutlass_")]
            assert set(tags) <= set(build_script.CUTLASS_TAGS), (kernel_dir.name, tags)


def test_cutlass_headers_come_from_the_pinned_wheel(monkeypatch):
    """quant's CUDA component gets CUTLASS's include folder (the pinned nvidia-cutlass wheel),
    its CPU component none; the version is the one requirements-dev.txt pins."""
    monkeypatch.delenv("CUTLASS_SRC_DIR", raising=False)
    project = build_script.load_project(REPO / "quant")
    assert build_script.cutlass_tags(project, "cuda") == ["cutlass_4_0"]
    assert build_script.cutlass_includes(project, "cpu") == []
    includes = build_script.cutlass_includes(project, "cuda")
    assert (includes[0] / "cutlass" / "numeric_types.h").is_file()
    pin = re.search(
        r"^nvidia-cutlass==(\d+)\.(\d+)\.(\d+)", (REPO / "requirements-dev.txt").read_text(), re.M
    )
    assert build_script.cutlass_version(includes[0]) == ".".join(pin.groups())
    line = build_script.describe_cutlass(project, "cuda")
    assert line.startswith(f"CUTLASS {'.'.join(pin.groups())} from nvidia-cutlass")
    assert "cutlass_4_0 = 4.0.0 under Nix" in line


def test_missing_cutlass_headers_fail_naming_the_fix(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("CUTLASS_SRC_DIR", str(tmp_path))
    project = build_script.load_project(REPO / "quant")
    with pytest.raises(
        build_script.BuildError,
        match=r"^quant: build.toml depends on cutlass_4_0 but no CUTLASS headers were found",
    ):
        build_script.cutlass_includes(project, "cuda")
    # A checkout named by $CUTLASS_SRC_DIR wins over the wheel.
    (tmp_path / "include" / "cutlass").mkdir(parents=True)
    (tmp_path / "include" / "cutlass" / "numeric_types.h").write_text("")
    assert build_script.cutlass_includes(project, "cuda") == [tmp_path / "include"]


def _component(caps):
    return build_script.Component(name="k", backend="cuda", src=[], cuda_capabilities=caps)


@pytest.mark.parametrize(
    "caps,base,expected",
    [
        # No declared capabilities: the build's own (local GPU, --cuda-archs or the toolkit's).
        (None, ["8.0", "9.0"], ["8.0", "9.0"]),
        # Declared ones narrow to the build's by number, keeping their suffix ...
        (["8.0", "9.0", "10.0"], ["9.0"], ["9.0"]),
        (["9.0a"], ["9.0"], ["9.0a"]),
        (["9.0a"], ["9.0a"], ["9.0a"]),
        # ... and a component for other GPUs still compiles for its own, so its callers link.
        (["9.0a"], ["8.6"], ["9.0a"]),
        # Capabilities the toolkit does not know drop out (kernel-builder's loose intersection).
        (["9.0a", "6.1"], ["9.0", "10.0"], ["9.0a"]),
    ],
)
def test_component_capabilities(caps, base, expected):
    project = build_script.load_project(REPO / "quant")
    tc = type("Toolchain", (), {"cuda_version": (13, 0)})()
    assert build_script.component_archs(project, _component(caps), tc, base) == expected


def test_component_without_known_capabilities_fails_naming_it():
    project = build_script.load_project(REPO / "quant")
    tc = type("Toolchain", (), {"cuda_version": (13, 0)})()
    with pytest.raises(build_script.BuildError, match=r"\[kernel\.k\] has an empty set"):
        build_script.component_archs(project, _component(["6.1"]), tc, ["9.0"])
