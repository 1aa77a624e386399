#!/usr/bin/env python3
"""Compile every kernel's CUDA sources for one architecture, without Torch: a CI gate.

The CUDA files under <kernel>/kernel_src/ include no Torch headers (device code and torch-free
launchers), so nvcc alone can compile them on a CPU-only machine. CI installs the CPU build of
Torch, so scripts/build.py skips the CUDA variant there; this check is what stops a change to
device code that does not compile from landing.

    python scripts/compile_check.py [KERNEL ...] [--arch 9.0a] [--jobs N] [--sample-instances]

Each .cu of a `backend = "cuda"` component compiles with the flags scripts/build.py passes to
nvcc (its include folders and cuda-flags from build.toml), in parallel, to a scratch folder, and
so does each torch-free driver under <kernel>/benchmarks/probe/ (with the flags of the kernel's
first CUDA component).
--sample-instances (what CI runs) compiles, of the translation units a kernel's
kernel_src/generate_instances.py writes, only those it lists in CI_SAMPLE: one per kernel
template, since the rest instantiate the same code with other tile constants and each is minutes
of CPU (every unit compiles in the device builds of scripts/gpu_check.sh).

Exit status 0 when all compile, 1 when one fails (its compiler output is printed), and 0 with a
printed reason when nvcc is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build  # noqa: E402

CXX_STD = "c++17"


def cuda_sources(project: build.KernelProject) -> list[tuple[str, list[str]]]:
    """(source, nvcc flags particular to it) for every .cu of the project's CUDA components."""
    jobs = []
    # The CUTLASS headers scripts/build.py uses (the pinned pip wheel or $CUTLASS_SRC_DIR), for the
    # components that depend on a cutlass_* tag.
    cutlass = [
        flag for inc in build.cutlass_includes(project, "cuda") for flag in ("-isystem", str(inc))
    ]
    probe_flags = None
    for comp in project.components:
        if comp.backend != "cuda":
            continue
        includes = [f"-I{project.path / inc}" for inc in comp.include]
        if any(dep.startswith("cutlass_") for dep in comp.depends):
            includes += cutlass
        for rel in comp.src:
            if rel.endswith(".cu"):
                jobs.append((rel, includes + list(comp.cuda_flags)))
        if probe_flags is None:  # the probes include the first CUDA component's headers
            probe_flags = includes + list(comp.cuda_flags)
    return jobs + (probe_sources(project, probe_flags) if probe_flags is not None else [])


def probe_sources(project: build.KernelProject, flags: list[str]) -> list[tuple[str, list[str]]]:
    """The torch-free standalone drivers under benchmarks/probe/ (kernel timings without torch,
    built by hand on the GPU machine), with `flags`: compiled here so that a change of the
    kernels' host API that breaks one does not land. Probes that include torch are built by
    their Python scripts through torch's extension loader and are not compiled here."""
    probes = sorted((project.path / "benchmarks" / "probe").glob("*.cu"))
    return [
        (str(path.relative_to(project.path)), flags)
        for path in probes
        if not any(
            line.startswith("#include") and ("torch" in line or "c10/" in line)
            for line in path.read_text().splitlines()
        )
    ]


def generated_units_to_skip(project: build.KernelProject) -> set[str]:
    """The generated .cu files (as build.toml lists them) that are not in the generator's
    CI_SAMPLE."""
    script = project.path / "kernel_src" / "generate_instances.py"
    if not script.is_file():
        return set()
    spec = importlib.util.spec_from_file_location(f"{project.name}_generate_instances", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    units = {name for name in module.generated_files() if name.endswith(".cu")}
    return {f"kernel_src/{name}" for name in units - set(module.CI_SAMPLE)}


def compile_one(
    nvcc: str, arch: str, project: build.KernelProject, rel: str, extra: list[str], scratch: Path
) -> tuple[str, float, str | None]:
    obj = scratch / project.name / (rel.replace("/", "_") + ".o")
    obj.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        nvcc,
        "-O3",
        f"-std={CXX_STD}",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        *build.gencode_flags([arch]),
        "-DCUDA_KERNEL",
        "-DUSE_CUDA=1",
        "-DENABLE_FP8",
        f"-I{project.path / 'kernel_src'}",
        *extra,
        "-c",
        str(project.path / rel),
        "-o",
        str(obj),
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - start
    error = None if proc.returncode == 0 else (proc.stdout + proc.stderr).strip()
    return f"{project.name}/{rel}", seconds, error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", nargs="*", help="kernel folders (default: every one)")
    parser.add_argument("--arch", default="9.0a", help="one CUDA capability (default 9.0a)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--sample-instances",
        action="store_true",
        help="of the generated instance units, compile only each generator's CI_SAMPLE",
    )
    args = parser.parse_args(argv)

    nvcc = build.find_nvcc()
    if nvcc is None:
        print("compile_check: skipped, nvcc was not found (set CUDA_HOME or put nvcc on PATH)")
        return 0
    dirs = [build.REPO_ROOT / k for k in args.kernels] if args.kernels else build.discover_kernels()
    work = []
    for kernel_dir in dirs:
        project = build.load_project(kernel_dir)
        try:
            sources = cuda_sources(project)
        except build.BuildError as exc:
            print(f"compile_check: {exc}")
            return 1
        skip = generated_units_to_skip(project) if args.sample_instances else set()
        if skip:
            print(
                f"compile_check: {project.name}: {len(skip)} generated units left to the device builds"
            )
        work += [(project, rel, extra) for rel, extra in sources if rel not in skip]
        cutlass_line = build.describe_cutlass(project, "cuda")
        if cutlass_line:
            print(f"compile_check: {project.name}: {cutlass_line}")
    # Longest first: the biggest translation units set the wall time.
    work.sort(key=lambda item: -(item[0].path / item[1]).stat().st_size)

    start = time.monotonic()
    failures = 0
    with (
        tempfile.TemporaryDirectory(prefix="compile-check-") as tmp,
        ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool,
    ):
        futures = [
            pool.submit(compile_one, nvcc, args.arch, p, rel, extra, Path(tmp))
            for p, rel, extra in work
        ]
        for future in futures:
            name, seconds, error = future.result()
            print(
                f"compile_check: {name} ({args.arch}) {'ok' if error is None else 'FAILED'} "
                f"in {seconds:.1f} s",
                flush=True,
            )
            if error is not None:
                failures += 1
                print(error)
    wall = time.monotonic() - start
    print(
        f"compile_check: {len(work) - failures} of {len(work)} CUDA sources compiled for "
        f"sm_{args.arch.replace('.', '')} in {wall:.0f} s wall ({args.jobs} jobs)"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
