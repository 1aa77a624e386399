#!/usr/bin/env python3
"""Build kernel folders into kernel-builder-conformant `build/<variant>/` trees, without Nix.

For every kernel folder (a top-level directory with a `build.toml`), or the ones named, this
writes what kernel-builder's local install writes (huggingface/kernels, kernel-builder):

    <kernel>/build/<variant>/__init__.py, *.py      the Python package from torch-ext/<name>/
    <kernel>/build/<variant>/_ops.py                 generated: binds torch.ops.<ops name>
    <kernel>/build/<variant>/<ops name>.abi3.so      the extension, ops name _<name>_<backend>_<id>
    <kernel>/build/<variant>/metadata.json           with digest and provenance
    <kernel>/build/CARD.md, <kernel>/build/benchmarks/

The CPU variant is always built; the CUDA variant when Torch has CUDA and nvcc is found, for the
local GPU's capability (or every capability of build.toml / the toolkit with --all-archs).
Compilation is incremental and parallel (ninja; scratch files in <kernel>/_build/). A variant
directory is replaced only after it was built completely, so a failure leaves the previous
build as it was. Every .so is checked for manylinux_2_28 / abi3 with kernel-abi-check and each
variant is smoke-loaded with `kernels.get_local_kernel` (all in one process; a variant that loaded
before with the same metadata.json, recorded in _build/<variant>/smoke-loaded, is not reloaded).
-j caps the compiler processes over all kernels and variants together.

The ops id is per kernel: 7 hex digits of the kernel folder's tree in HEAD, plus `_dirty` when
git reports any change inside the folder, untracked files included. A commit outside the folder
keeps the id. (Nix builds take the id from the flake's revision instead; see README.md.)

Usage: python scripts/build.py [KERNEL ...] [--backend cpu|cuda] [--all-archs]
                               [--cuda-archs 9.0a,...] [-j N] [--no-smoke]
"""

from __future__ import annotations

import argparse
import ast
import base64
import concurrent.futures
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parent.parent

# The builder identity recorded in metadata `provenance` (kernel-builder's metadata.json). Semver build
# metadata says which builder produced the tree: this script, following kernel-builder 0.17.
BUILDER_VERSION = "0.17.0+monorepo.scripts.build"
KERNELS_MINVER = "0.14.0"

# kernel-builder's default CUDA capabilities per toolkit (its CMake arch lists).
DEFAULT_CUDA_ARCHS = [
    ((13, 0), ["7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "11.0", "12.0", "12.1+PTX"]),
    ((12, 8), ["7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.1", "12.0+PTX"]),
    ((0, 0), ["7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0+PTX"]),
]

_print_lock = threading.Lock()


def log(prefix: str, message: str) -> None:
    with _print_lock:
        print(f"[{prefix}] {message}", flush=True)


def _rel(path: Path) -> str:
    """A path relative to the repository when it lies inside it, for messages."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


class BuildError(Exception):
    """A build failure with a message that names the kernel and, where known, the file."""


# --------------------------------------------------------------------------------------------
# build.toml
# --------------------------------------------------------------------------------------------


@dataclass
class Component:
    """One `[kernel.<name>]` section."""

    name: str
    backend: str
    src: list[str]
    include: list[str] = field(default_factory=list)
    cxx_flags: list[str] = field(default_factory=list)
    cuda_flags: list[str] = field(default_factory=list)
    cuda_capabilities: list[str] | None = None
    depends: list[str] = field(default_factory=list)


@dataclass
class KernelProject:
    path: Path
    name: str
    version: int
    license: str
    backends: list[str]
    repo_id: str | None
    upstream: str | None
    source: str | None
    python_depends: dict[str, list[str]]  # "" = general, else backend name
    kernel_depends: dict[str, list[dict]]
    torch_src: list[str]
    torch_include: list[str]
    torch_cxx_flags: list[str]
    pyext: list[str]
    components: list[Component]

    @property
    def python_name(self) -> str:
        return self.name.replace("-", "_")

    def sources(self, backend: str) -> list[str]:
        files = list(self.torch_src)
        for comp in self.components:
            if comp.backend == backend:
                files += comp.src
        return files


def discover_kernels(root: Path = REPO_ROOT) -> list[Path]:
    """Top-level directories that hold a build.toml (scripts/ and tests/ do not)."""
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "build.toml").is_file())


def load_project(kernel_dir: Path) -> KernelProject:
    label = kernel_dir.name
    toml_path = kernel_dir / "build.toml"
    if not toml_path.is_file():
        raise BuildError(f"{label}: no build.toml in {kernel_dir}")
    # The exact validation kernel-builder's `check-config` runs (unknown keys, edition, names).
    try:
        import kernels._rust as kernels_rust

        kernels_rust.Build.open(kernel_dir)
    except ImportError as exc:
        raise BuildError(f"{label}: the `kernels` package is needed to validate build.toml ({exc})")
    except ValueError as exc:
        raise BuildError(f"{label}: invalid {_rel(toml_path)}: {exc}")
    try:
        cfg = tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise BuildError(f"{label}: invalid {_rel(toml_path)}: {exc}")

    general = cfg["general"]
    if "torch" not in cfg:
        raise BuildError(f"{label}: build.toml: this script builds [torch] kernels only")
    torch_cfg = cfg["torch"]
    python_depends = {"": list(general.get("python-depends", []))}
    kernel_depends = {"": list(general.get("kernel-depends", []))}
    for backend in general["backends"]:
        section = general.get(backend, {})
        python_depends[backend] = list(section.get("python-depends", []))
        kernel_depends[backend] = list(section.get("kernel-depends", []))
    components = [
        Component(
            name=name,
            backend=comp["backend"],
            src=list(comp["src"]),
            include=list(comp.get("include", [])),
            cxx_flags=list(comp.get("cxx-flags", [])),
            cuda_flags=list(comp.get("cuda-flags", [])),
            cuda_capabilities=comp.get("cuda-capabilities"),
            depends=list(comp.get("depends", [])),
        )
        for name, comp in cfg.get("kernel", {}).items()
    ]
    project = KernelProject(
        path=kernel_dir,
        name=general["name"],
        version=int(general["version"]),
        license=general["license"],
        backends=list(general["backends"]),
        repo_id=general.get("hub", {}).get("repo-id"),
        upstream=general.get("upstream"),
        source=general.get("source"),
        python_depends=python_depends,
        kernel_depends=kernel_depends,
        torch_src=list(torch_cfg.get("src", [])),
        torch_include=list(torch_cfg.get("include", [])),
        torch_cxx_flags=list(torch_cfg.get("cxx-flags", [])),
        pyext=list(torch_cfg.get("pyext", ["py", "pyi"])),
        components=components,
    )
    # Nix sees only the files listed in build.toml: a missing one must fail here too.
    listed = set(project.torch_src) | {f for c in components for f in c.src}
    for rel in sorted(listed):
        if not (kernel_dir / rel).is_file():
            raise BuildError(f"{label}: source {rel} is listed in build.toml but does not exist")
    package_init = kernel_dir / "torch-ext" / project.python_name / "__init__.py"
    if not package_init.is_file():
        raise BuildError(f"{label}: missing {_rel(package_init)}")
    return project


# --------------------------------------------------------------------------------------------
# CUTLASS: the headers a `cutlass_<major>_<minor>` dependency stands for, without Nix
# --------------------------------------------------------------------------------------------

# The CUTLASS release each build.toml tag stands for in kernel-builder (HF-K
# kernel-builder/src/pyproject/deps.rs; cutlass_4_4 has no CMake pin there, Nix supplies 4.4).
CUTLASS_TAGS = {
    "cutlass_2_10": "2.10.0",
    "cutlass_3_5": "3.5.1",
    "cutlass_3_6": "3.6.0",
    "cutlass_3_8": "3.8.0",
    "cutlass_3_9": "3.9.2",
    "cutlass_4_0": "4.0.0",
    "cutlass_4_4": "4.4",
    "cutlass_4_5": "4.5.2",
}
# Where the headers come from offline: the pinned PyPI wheel (requirements-dev.txt) ships the C++
# tree inside its `cutlass_library` package; $CUTLASS_SRC_DIR (a CUTLASS checkout, the variable
# kernel-builder's CMake reads) overrides it.
CUTLASS_PIP = "nvidia-cutlass (requirements-dev.txt)"


def cutlass_tags(project: KernelProject, backend: str) -> list[str]:
    """The cutlass_* tags the project's `backend` components depend on."""
    return sorted(
        {
            dep
            for comp in project.components
            if comp.backend == backend
            for dep in comp.depends
            if dep.startswith("cutlass_")
        }
    )


def cutlass_root() -> tuple[Path | None, str]:
    """(CUTLASS source root holding include/, where it came from); root None when absent."""
    env = os.environ.get("CUTLASS_SRC_DIR")
    if env:
        return Path(env), "$CUTLASS_SRC_DIR"
    import importlib.util

    spec = importlib.util.find_spec("cutlass_library")  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        return None, CUTLASS_PIP
    return Path(list(spec.submodule_search_locations)[0]) / "source", CUTLASS_PIP


def cutlass_version(include_dir: Path) -> str:
    """ "major.minor.patch" from cutlass/version.h."""
    text = (include_dir / "cutlass" / "version.h").read_text()
    parts = [
        re.search(rf"#define CUTLASS_{k}\s+(\d+)", text).group(1)
        for k in ("MAJOR", "MINOR", "PATCH")
    ]
    return ".".join(parts)


def cutlass_includes(project: KernelProject, backend: str) -> list[Path]:
    """Include folders for a project whose `backend` components depend on a cutlass_* tag (none
    otherwise): CUTLASS's include/ and, when present, tools/util/include/. Raises BuildError,
    naming the tag and the fix, when the headers are not installed."""
    tags = cutlass_tags(project, backend)
    if not tags:
        return []
    root, origin = cutlass_root()
    include = root / "include" if root is not None else None
    if include is None or not (include / "cutlass" / "numeric_types.h").is_file():
        where = f" (looked in {include})" if include is not None else ""
        raise BuildError(
            f"{project.name}: build.toml depends on {', '.join(tags)} but no CUTLASS headers were "
            f"found{where}: pip install -r requirements-dev.txt (nvidia-cutlass), or set "
            "CUTLASS_SRC_DIR to a CUTLASS checkout"
        )
    util = root / "tools" / "util" / "include"
    return [include] + ([util] if util.is_dir() else [])


def describe_cutlass(project: KernelProject, backend: str) -> str | None:
    """One line for the build log: the headers used against the version the tag stands for."""
    includes = cutlass_includes(project, backend)
    if not includes:
        return None
    _, origin = cutlass_root()
    tags = cutlass_tags(project, backend)
    pinned = ", ".join(f"{t} = {CUTLASS_TAGS.get(t, '?')} under Nix" for t in tags)
    return f"CUTLASS {cutlass_version(includes[0])} from {origin} ({pinned})"


# --------------------------------------------------------------------------------------------
# Identity: ops id from the kernel folder's git tree
# --------------------------------------------------------------------------------------------


@dataclass
class GitIdentity:
    unique_id: str  # 7 hex digits of the kernel folder's tree, "_dirty" appended for a dirty folder
    commit: str | None  # the last commit that changed the kernel folder
    dirty: bool


def _git(args: list[str], cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def git_identity(kernel_dir: Path) -> GitIdentity:
    """The identity of one kernel folder, decided by that folder alone.

    The id is the folder's own tree in HEAD (the common/ helpers it uses are copies inside it), so
    a commit elsewhere in the repository keeps the id, the .so name and the uploaded files. A
    folder is dirty when git reports any change inside it, untracked files included: a kernel
    that was never committed has no tree of its own and must not pass as a clean build.
    """
    try:
        head = _git(["rev-parse", "HEAD"], kernel_dir)
        dirty = bool(_git(["status", "--porcelain", "--", "."], kernel_dir))
    except (subprocess.CalledProcessError, FileNotFoundError):
        # Outside git kernel-builder uses a random lowercase base32 id.
        random_id = base64.b32encode(os.urandom(8)).decode().rstrip("=").lower()
        return GitIdentity(unique_id=random_id, commit=None, dirty=True)
    try:
        tree = _git(["rev-parse", "HEAD:./"], kernel_dir)
        commit = _git(["log", "-1", "--format=%H", "--", "."], kernel_dir) or head
    except subprocess.CalledProcessError:
        # Not in HEAD at all: the repository's tree keeps the id stable between rebuilds.
        tree, commit, dirty = _git(["rev-parse", "HEAD^{tree}"], kernel_dir), head, True
    return GitIdentity(unique_id=tree[:7] + ("_dirty" if dirty else ""), commit=commit, dirty=dirty)


# --------------------------------------------------------------------------------------------
# Toolchain and variants
# --------------------------------------------------------------------------------------------


@dataclass
class Toolchain:
    torch_version: tuple[int, int]
    cxx11_abi: bool
    cpu: str
    os: str
    torch_includes: list[str]
    torch_lib_dir: str
    python_include: str
    cxx: str
    cxx_std: str
    nvcc: str | None
    cuda_version: tuple[int, int] | None  # from nvcc, as kernel-builder's CMake does
    local_capability: str | None

    def variant(self, backend: str) -> str:
        major, minor = self.torch_version
        abi = "-cxx11" if self.cxx11_abi else "-cxx98"
        if backend == "cpu":
            compute = "cpu"
        elif backend == "cuda":
            compute = "cu%d%d" % self.cuda_version
        else:
            raise BuildError(f"backend {backend} is not supported by this script")
        return f"torch{major}{minor}{abi}-{compute}-{self.cpu}-{self.os}"


def find_nvcc() -> str | None:
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            candidate = Path(os.environ[env]) / "bin" / "nvcc"
            if candidate.is_file():
                return str(candidate)
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None
    )


def detect_toolchain() -> Toolchain:
    import sysconfig

    import torch
    from torch.utils import cpp_extension

    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    nvcc = find_nvcc() if torch.version.cuda else None
    cuda_version = None
    if nvcc:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        match = re.search(r"release (\d+)\.(\d+)", out)
        cuda_version = (int(match.group(1)), int(match.group(2))) if match else None
        if cuda_version is None or cuda_version[1] >= 10:
            # The variant grammar flattens major.minor into digits (kernel-builder's variant names).
            raise BuildError(f"cannot encode the CUDA version of {nvcc} in a variant name")
    local_cap = None
    if nvcc and torch.cuda.is_available():
        cap_major, cap_minor = torch.cuda.get_device_capability()
        local_cap = f"{cap_major}.{cap_minor}"
    machine = platform.machine()
    return Toolchain(
        torch_version=(major, minor),
        cxx11_abi=bool(torch.compiled_with_cxx11_abi()),
        cpu={"arm64": "aarch64", "AMD64": "x86_64"}.get(machine, machine),
        os=platform.system().lower(),
        torch_includes=cpp_extension.include_paths(),
        torch_lib_dir=cpp_extension.library_paths()[0],
        python_include=sysconfig.get_paths()["include"],
        cxx=os.environ.get("CXX", "c++"),
        # kernel-builder's rule: C++17 for Torch < 2.12, C++20 from 2.12 on.
        cxx_std="c++20" if (major, minor) >= (2, 12) else "c++17",
        nvcc=nvcc,
        cuda_version=cuda_version,
        local_capability=local_cap,
    )


def _cap_key(cap: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", cap).groups()
    return int(major), int(minor)


def cuda_archs(
    project: KernelProject, tc: Toolchain, all_archs: bool, override: list[str] | None
) -> list[str]:
    """The capabilities of the components that declare none: --cuda-archs, else every toolkit
    capability with --all-archs (or without a local GPU), else the local GPU's, as kernel-builder's
    CMake does without BUILD_ALL_SUPPORTED_ARCHS."""
    if override:
        return sorted(set(override), key=_cap_key)
    if all_archs or tc.local_capability is None:
        return next(archs for minver, archs in DEFAULT_CUDA_ARCHS if tc.cuda_version >= minver)
    return [tc.local_capability]


def component_archs(
    project: KernelProject, comp: Component, tc: Toolchain, base: list[str]
) -> list[str]:
    """A component's capabilities: its build.toml cuda-capabilities, kernel-builder's "loose
    intersection" with the toolkit's (a declared capability survives if the toolkit knows its
    number), narrowed to those of `base` where any match. A component whose capabilities miss
    `base` entirely (Hopper-only kernels on another GPU) still compiles for its own, so that the
    host code that calls it links."""
    if not comp.cuda_capabilities:
        return base
    toolkit = next(archs for minver, archs in DEFAULT_CUDA_ARCHS if tc.cuda_version >= minver)
    known = {_cap_key(a) for a in toolkit}
    declared = [a for a in comp.cuda_capabilities if _cap_key(a) in known]
    if not declared:
        raise BuildError(
            f"{project.name}: [kernel.{comp.name}] has an empty set of capabilities for "
            f"CUDA {tc.cuda_version}"
        )
    wanted = {_cap_key(a) for a in base}
    return [a for a in declared if _cap_key(a) in wanted] or declared


def gencode_flags(archs: list[str]) -> list[str]:
    flags = []
    for arch in archs:
        match = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", arch)
        if not match:
            raise BuildError(f"unknown CUDA capability {arch!r}")
        number = match.group(1) + match.group(2) + match.group(3)
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if match.group(4):
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    return flags


# --------------------------------------------------------------------------------------------
# Generated files
# --------------------------------------------------------------------------------------------

REGISTRATION_H = """\
// Generated by scripts/build.py: the registration macros kernel-builder provides.
#pragma once

#include <Python.h>

#define _CONCAT(A, B) A##B
#define CONCAT(A, B) _CONCAT(A, B)
#define _STRINGIFY(A) #A
#define STRINGIFY(A) _STRINGIFY(A)

// The op namespace is the build's unique ops name, never a hard-coded string.
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)
#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) TORCH_LIBRARY_IMPL(NAME, DEVICE, MODULE)

// An empty Python module (limited API): importing the .so runs the static registrations.
#define REGISTER_EXTENSION(NAME)                                                        \\
  PyMODINIT_FUNC CONCAT(PyInit_, NAME)() {                                              \\
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, STRINGIFY(NAME), nullptr, \\
                                        0, nullptr};                                    \\
    return PyModule_Create(&module);                                                    \\
  }
"""

OPS_PY = '''\
import torch
from . import {ops_name}
ops = torch.ops.{ops_name}


def add_op_namespace_prefix(op_name: str):
    """
    Prefix op by namespace.
    """
    return f"{ops_name}::{{op_name}}"
'''


def render_card(project: KernelProject) -> str | None:
    """Render CARD.md as kernel-builder's `fill-card` does."""
    card = project.path / "CARD.md"
    if not card.is_file():
        return None
    if project.repo_id is None:
        raise BuildError(f"{project.name}: CARD.md needs [general.hub] repo-id in build.toml")
    import jinja2

    package = project.path / "torch-ext" / project.python_name
    exported = _string_list(package / "__init__.py", "__all__")
    layers: list[str] = []
    if "layers" in exported:
        for candidate in (package / "layers.py", package / "layers" / "__init__.py"):
            if candidate.is_file():
                tree = ast.parse(candidate.read_text())
                layers = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    try:
        return env.from_string(card.read_text()).render(
            repo_id=project.repo_id,
            version=project.version,
            functions=[name for name in exported if name != "layers"],
            layers=layers,
            has_benchmark=(project.path / "benchmarks" / "benchmark.py").is_file(),
            upstream=project.upstream,
            source=project.source,
            license=project.license.lower(),
        )
    except jinja2.TemplateError as exc:
        raise BuildError(f"{project.name}: CARD.md: {exc}")


def _string_list(path: Path, variable: str) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == variable for t in node.targets
        ):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return []


def make_metadata(
    project: KernelProject, backend: str, ops_name: str, archs: list[str] | None
) -> dict:
    """metadata.json without digest, keys in kernel-builder's order."""
    meta: dict = {"name": project.name, "id": ops_name, "version": project.version}
    meta["kernels-minver"] = KERNELS_MINVER
    meta["license"] = project.license
    if project.upstream:
        meta["upstream"] = project.upstream
    if project.source:
        meta["source"] = project.source
    meta["python-depends"] = project.python_depends[""] + project.python_depends.get(backend, [])
    meta["kernel-depends"] = project.kernel_depends[""] + project.kernel_depends.get(backend, [])
    meta["backend"] = {"type": backend}
    if archs is not None:
        meta["backend"]["archs"] = sorted(set(archs))
    return meta


def add_digest_and_provenance(meta: dict, variant_dir: Path, ident: GitIdentity) -> dict:
    import kernels._rust as kernels_rust

    digest = kernels_rust.Digest.hash_variant(kernels_rust.DigestAlgorithm.SHA256, variant_dir)
    meta["digest"] = {"algorithm": "sha256", "files": dict(sorted(digest.files.items()))}
    provenance: dict = {"kernel-builder": {"version": BUILDER_VERSION}}
    if ident.commit is not None:
        provenance["kernel"] = {"commit": ident.commit, "dirty": ident.dirty}
    meta["provenance"] = provenance
    return meta


# --------------------------------------------------------------------------------------------
# Compilation
# --------------------------------------------------------------------------------------------


def _ninja_escape(text: str) -> str:
    return text.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _shell_join(args: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(a) for a in args)


def write_ninja(
    project: KernelProject,
    backend: str,
    tc: Toolchain,
    ops_name: str,
    scratch: Path,
    archs: list[str] | None,
) -> tuple[Path, dict[str, str]]:
    """Write build.ninja for one variant; returns the .so path and object → source mapping."""
    gen_dir = scratch / "gen"
    gen_dir.mkdir(parents=True, exist_ok=True)
    registration = gen_dir / "registration.h"
    if not registration.is_file() or registration.read_text() != REGISTRATION_H:
        registration.write_text(REGISTRATION_H)

    includes = [project.path / inc for inc in project.torch_include]
    cxx_extra = list(project.torch_cxx_flags)
    for comp in project.components:
        if comp.backend == backend:
            includes += [project.path / inc for inc in comp.include]
            cxx_extra += comp.cxx_flags
    system_includes = [*tc.torch_includes, tc.python_include]
    if backend == "cuda":
        system_includes.append(str(Path(tc.nvcc).resolve().parent.parent / "include"))
    system_includes += [str(p) for p in cutlass_includes(project, backend)]
    include_flags = [f"-I{p}" for p in [gen_dir, *includes]]
    for path in system_includes:
        include_flags += ["-isystem", str(path)]  # separate arguments: nvcc rejects "-isystem<dir>"
    defines = [
        f"-DTORCH_EXTENSION_NAME={ops_name}",
        "-DPy_LIMITED_API=0x03090000",  # abi3, Python 3.9, as kernel-builder builds
        f"-D_GLIBCXX_USE_CXX11_ABI={int(tc.cxx11_abi)}",
        f"-D{backend.upper()}_KERNEL",
    ]
    if backend == "cuda":
        defines += ["-DUSE_CUDA=1", "-DENABLE_FP8"]
    cxx_flags = [
        "-O3",
        "-fPIC",
        f"-std={tc.cxx_std}",
        "-fno-gnu-unique",
        "-Wall",
        *defines,
        *include_flags,
        *cxx_extra,
    ]
    nvcc_flags: list[str] = []
    if backend == "cuda":
        nvcc_flags = [
            "-O3",
            f"-std={tc.cxx_std}",
            "--expt-relaxed-constexpr",
            "--expt-extended-lambda",
            f"-ccbin={tc.cxx}",
            "-Xcompiler=-fPIC",
            "-Xcompiler=-fno-gnu-unique",
            f"--threads={os.environ.get('NVCC_THREADS', '4')}",
            *defines,
            *include_flags,
        ]
    link_libs = [f"-L{tc.torch_lib_dir}", "-lc10", "-ltorch", "-ltorch_cpu"]
    if backend == "cuda":
        cuda_lib = Path(tc.nvcc).resolve().parent.parent / "lib64"
        link_libs += ["-lc10_cuda", "-ltorch_cuda", f"-L{cuda_lib}", "-lcudart"]

    lines = [
        "ninja_required_version = 1.3",
        f"cxx = {tc.cxx}",
        f"cxxflags = {_shell_join(cxx_flags)}",
        "rule cxx",
        "  command = $cxx -MMD -MF $out.d $cxxflags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = compile $src",
        "rule link",
        # No RPATH: Torch and the CUDA runtime are already loaded when the kernel is imported.
        "  command = $cxx -shared -o $out $in $libs",
        "  description = link $outname",
    ]
    if backend == "cuda":
        lines += [
            f"nvcc = {tc.nvcc}",
            f"nvccflags = {_shell_join(nvcc_flags)}",
            "rule nvcc",
            # $archflags: each component's gencode and cuda-flags (component_archs).
            "  command = $nvcc -MD -MF $out.d $nvccflags $archflags -c $in -o $out",
            "  depfile = $out.d",
            "  deps = gcc",
            "  description = compile $src",
        ]
    objects: dict[str, str] = {}
    units = [(rel, None) for rel in project.torch_src]
    units += [(rel, c) for c in project.components if c.backend == backend for rel in c.src]
    for rel, comp in units:
        suffix = Path(rel).suffix
        if suffix in (".h", ".hpp", ".cuh", ".inc"):
            continue  # headers are listed for Nix's source filter; ninja tracks them via depfiles
        if suffix == ".cu" and backend != "cuda":
            raise BuildError(f"{project.name}: {rel} is CUDA code in a {backend} component")
        rule = "nvcc" if suffix == ".cu" else "cxx"
        obj = f"obj/{rel}.o"
        objects[obj] = rel
        lines.append(f"build {_ninja_escape(obj)}: {rule} {_ninja_escape(str(project.path / rel))}")
        lines.append(f"  src = {rel}")
        if rule == "nvcc":
            comp_archs = component_archs(project, comp, tc, archs or []) if comp else archs or []
            flags = [*gencode_flags(comp_archs), *(comp.cuda_flags if comp else [])]
            lines.append(f"  archflags = {_shell_join(flags)}")
    so_path = scratch / f"{ops_name}.abi3.so"
    lines.append(
        f"build {_ninja_escape(so_path.name)}: link {' '.join(_ninja_escape(o) for o in objects)}"
    )
    lines.append(f"  libs = {_shell_join(link_libs)}")
    lines.append(f"  outname = {so_path.name}")
    lines.append(f"default {_ninja_escape(so_path.name)}")
    content = "\n".join(lines) + "\n"
    ninja_file = scratch / "build.ninja"
    if not ninja_file.is_file() or ninja_file.read_text() != content:
        ninja_file.write_text(content)  # rewrite only on change, so ninja stays incremental
    return so_path, objects


def run_ninja(
    prefix: str, scratch: Path, jobs: int, objects: dict[str, str], project: KernelProject
) -> None:
    ninja = shutil.which("ninja")
    if ninja is None:
        raise BuildError("ninja was not found on PATH (pip install ninja)")
    env = dict(os.environ, NINJA_STATUS="[%f/%t] ")
    proc = subprocess.Popen(
        [ninja, "-C", str(scratch), "-j", str(jobs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    failed: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line.startswith("ninja: Entering directory") or not line:
            continue
        match = re.match(r"FAILED: (?:\[code=\d+\] )?(\S+)", line)
        if match:
            failed.append(objects.get(match.group(1), match.group(1)))
        log(prefix, line)
    if proc.wait() != 0:
        what = ", ".join(failed) if failed else "the build"
        raise BuildError(f"{project.name}: compiling {what} failed (compiler output above)")


# --------------------------------------------------------------------------------------------
# One variant
# --------------------------------------------------------------------------------------------


@dataclass
class VariantResult:
    kernel: str
    variant: str
    path: Path
    abi_findings: list[str]


def check_abi(so_path: Path) -> list[str]:
    """manylinux_2_28 and abi3 (Python 3.9) findings, as kernel-builder check-abi reports them."""
    try:
        import kernel_abi_check
    except ImportError:
        return ["kernel-abi-check is not installed: ABI not checked"]
    obj = kernel_abi_check.ObjectFile(str(so_path))
    findings = []
    manylinux = obj.check_manylinux("manylinux_2_28")
    if manylinux:
        symbols = sorted({f"{v.name}@{v.dep}_{v.version}" for v in manylinux})
        findings.append(
            f"manylinux_2_28: {len(symbols)} symbol(s) newer than the policy allows: "
            + ", ".join(symbols[:8])
            + (" ..." if len(symbols) > 8 else "")
            + " (build with a manylinux_2_28 toolchain, as Nix does, for a publishable .so)"
        )
    python_abi = obj.check_python_abi("3.9")
    if python_abi:
        names = sorted({str(getattr(v, "name", v)) for v in python_abi})  # symbol names
        findings.append(
            f"abi3 (3.9): {len(python_abi)} symbol(s) outside the limited API: "
            + ", ".join(names[:8])
        )
    return findings


def build_variant(
    project: KernelProject,
    backend: str,
    tc: Toolchain,
    ident: GitIdentity,
    jobs: int,
    all_archs: bool,
    archs_override: list[str] | None,
) -> VariantResult:
    variant = tc.variant(backend)
    prefix = f"{project.name} {variant}"
    ops_name = f"_{project.python_name}_{backend}_{ident.unique_id}"
    archs = cuda_archs(project, tc, all_archs, archs_override) if backend == "cuda" else None
    if archs:
        log(prefix, "CUDA capabilities: " + ", ".join(archs))
        for comp in project.components:
            if comp.backend == backend and comp.cuda_capabilities:
                own = component_archs(project, comp, tc, archs)
                if own != archs:
                    log(prefix, f"  [kernel.{comp.name}]: " + ", ".join(own))
    cutlass_line = describe_cutlass(project, backend)
    if cutlass_line:
        log(prefix, cutlass_line)
    scratch = project.path / "_build" / variant
    scratch.mkdir(parents=True, exist_ok=True)
    # Every commit changes the ops name: drop libraries of earlier ids from the scratch dir.
    for stale in scratch.glob(f"_{project.python_name}_{backend}_*.abi3.so"):
        if stale.name != f"{ops_name}.abi3.so":
            stale.unlink()
    so_path, objects = write_ninja(project, backend, tc, ops_name, scratch, archs)
    run_ninja(prefix, scratch, jobs, objects, project)

    build_dir = project.path / "build"
    build_dir.mkdir(exist_ok=True)
    staging = build_dir / f".{variant}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    try:
        staging.mkdir()
        package = project.path / "torch-ext" / project.python_name
        extensions = {f".{ext}" for ext in project.pyext if ext != "pyi"}  # .pyi is not installed
        for src in sorted(package.rglob("*")):
            rel = src.relative_to(package)
            if not src.is_file() or "__pycache__" in rel.parts or src.suffix not in extensions:
                continue
            if rel == Path("_ops.py"):
                continue  # generated below, never taken from the source tree
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, staging / rel)
        (staging / "_ops.py").write_text(OPS_PY.format(ops_name=ops_name))
        shutil.copy2(so_path, staging / so_path.name)
        built = None
        if archs is not None:  # every capability some component compiled
            built = [
                a
                for c in project.components
                if c.backend == backend
                for a in component_archs(project, c, tc, archs)
            ]
        meta = make_metadata(project, backend, ops_name, built)
        meta = add_digest_and_provenance(meta, staging, ident)
        (staging / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
        import kernels._rust as kernels_rust

        try:
            kernels_rust.Metadata.read_from_file(staging / "metadata.json")
        except ValueError as exc:
            raise BuildError(f"{project.name}: generated metadata.json is invalid: {exc}")
        final = build_dir / variant
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    findings = check_abi(final / so_path.name)
    for finding in findings:
        log(prefix, f"ABI: {finding}")
    if not findings:
        log(prefix, "ABI: manylinux_2_28 and abi3 (3.9) clean")
    log(prefix, f"wrote {_rel(final)}")
    return VariantResult(project.name, variant, final, findings)


def finish_kernel(project: KernelProject) -> None:
    """build/CARD.md and build/benchmarks/, as the Nix bundle has them."""
    build_dir = project.path / "build"
    card = render_card(project)
    if card is not None:
        (build_dir / "CARD.md").write_text(card)
    bench_src = project.path / "benchmarks"
    bench_dst = build_dir / "benchmarks"
    if bench_dst.exists():
        shutil.rmtree(bench_dst)
    if bench_src.is_dir():
        shutil.copytree(bench_src, bench_dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


SMOKE = """
import json, pathlib, sys, kernels
for arg in sys.argv[1:]:
    variant = pathlib.Path(arg)
    meta = json.loads((variant / "metadata.json").read_text())
    try:
        module = kernels.get_local_kernel(variant.parent, backend=meta["backend"]["type"])
        assert module.__name__ == meta["id"], (module.__name__, meta["id"])
        line = "loaded " + module.__name__ + ": " + ", ".join(getattr(module, "__all__", []))
        print(json.dumps([arg, True, line]), flush=True)
    except Exception as exc:
        print(json.dumps([arg, False, f"{type(exc).__name__}: {exc}"]), flush=True)
"""


def _smoke_stamp(result: VariantResult) -> tuple[Path, str]:
    """The stamp file and the value it holds once this exact variant has loaded."""
    import hashlib

    stamp = result.path.parent.parent / "_build" / result.variant / "smoke-loaded"
    # metadata.json carries the id and the digest of every other file: same bytes, same variant.
    return stamp, hashlib.sha256((result.path / "metadata.json").read_bytes()).hexdigest()


def smoke_load(results: list[VariantResult]) -> None:
    """Load every variant with kernels.get_local_kernel, in one process (Torch is imported once).

    A variant whose stamp says it already loaded with these exact contents is not loaded again,
    which keeps a no-op rebuild fast.
    """
    pending = []
    for result in results:
        stamp, value = _smoke_stamp(result)
        if stamp.is_file() and stamp.read_text() == value:
            log(f"{result.kernel} {result.variant}", "smoke-load: unchanged since it last loaded")
        else:
            pending.append(result)
    if not pending:
        return
    proc = subprocess.run(
        [sys.executable, "-c", SMOKE, *(str(r.path) for r in pending)],
        capture_output=True,
        text=True,
    )
    outcomes = {}
    for line in proc.stdout.splitlines():
        if line.startswith("["):
            path, ok, message = json.loads(line)
            outcomes[path] = (ok, message)
    errors = []
    for result in pending:
        ok, message = outcomes.get(str(result.path), (False, proc.stderr.strip() or "no output"))
        if not ok:
            errors.append(
                f"{result.kernel}: kernels.get_local_kernel failed on {result.variant}:\n{message}"
            )
            continue
        stamp, value = _smoke_stamp(result)
        stamp.write_text(value)
        log(f"{result.kernel} {result.variant}", "smoke-load: " + message)
    if errors:
        raise BuildError("\n".join(errors))


def parallelism(variants: int, jobs: int) -> tuple[int, int]:
    """(variants built at once, ninja -j for each): their product never exceeds `jobs`."""
    workers = max(1, min(variants, jobs))
    return workers, max(1, jobs // workers)


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernels", nargs="*", help="kernel folders to build (default: all)")
    parser.add_argument(
        "--backend",
        choices=["cpu", "cuda"],
        action="append",
        help="build only this backend (repeatable; default: all available)",
    )
    parser.add_argument(
        "--all-archs",
        action="store_true",
        help="CUDA: every capability of build.toml / the toolkit, not only the local GPU",
    )
    parser.add_argument("--cuda-archs", help="CUDA: comma-separated capabilities, e.g. 9.0a")
    parser.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=os.cpu_count() or 2,
        help="most compiler processes at once, over all kernels and variants",
    )
    parser.add_argument(
        "--no-smoke", action="store_true", help="skip the get_local_kernel smoke load"
    )
    parser.add_argument("--strict-abi", action="store_true", help="fail on ABI findings")
    parser.add_argument(
        "--unique-id",
        help="ops id to use instead of the git tree id "
        "(kernel-builder create-pyproject --unique-id), e.g. on a copy without .git",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("-j must be at least 1")

    try:
        if args.kernels:
            dirs = []
            for name in args.kernels:
                path = (REPO_ROOT / name).resolve() if not Path(name).is_absolute() else Path(name)
                if not (path / "build.toml").is_file():
                    raise BuildError(f"{name}: not a kernel folder (no build.toml)")
                dirs.append(path)
        else:
            dirs = discover_kernels()
        projects = [load_project(d) for d in dirs]
        tc = detect_toolchain()
        jobs = []
        for project in projects:
            backends = [b for b in project.backends if b in ("cpu", "cuda")]
            if args.backend:
                backends = [b for b in backends if b in args.backend]
            if "cuda" in backends and tc.cuda_version is None:
                why = "Torch has no CUDA" if not _torch_has_cuda() else "nvcc was not found"
                print(f"[{project.name}] skipping the CUDA variant: {why}")
                backends.remove("cuda")
            ident = git_identity(project.path)
            if args.unique_id:
                if not re.fullmatch(r"[a-z0-9_]+", args.unique_id):
                    raise BuildError(
                        f"--unique-id {args.unique_id!r}: use lowercase letters, digits and _"
                    )
                ident = GitIdentity(args.unique_id, ident.commit, ident.dirty)
            if ident.commit is None:
                print(f"[{project.name}] note: not a git checkout, random ops id {ident.unique_id}")
            elif ident.dirty:
                print(
                    f"[{project.name}] note: uncommitted or untracked files in {_rel(project.path)}, "
                    f"ops id {ident.unique_id}"
                )
            jobs += [(project, b, ident) for b in backends]
        if not jobs:
            raise BuildError("nothing to build")
        override = args.cuda_archs.split(",") if args.cuda_archs else None
        workers, per_job = parallelism(len(jobs), args.jobs)
        results: list[VariantResult] = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [
                pool.submit(build_variant, p, b, tc, ident, per_job, args.all_archs, override)
                for p, b, ident in jobs
            ]
            errors = []
            for future in futures:
                try:
                    results.append(future.result())
                except BuildError as exc:
                    errors.append(str(exc))
            if errors:
                raise BuildError("\n".join(errors))
        for project in projects:
            finish_kernel(project)
        if not args.no_smoke:
            smoke_load(results)
        if args.strict_abi and any(r.abi_findings for r in results):
            raise BuildError("ABI findings (see above) with --strict-abi")
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("built: " + ", ".join(f"{r.kernel}/build/{r.variant}" for r in results))
    return 0


def _torch_has_cuda() -> bool:
    import torch

    return torch.version.cuda is not None


if __name__ == "__main__":
    sys.exit(main())
