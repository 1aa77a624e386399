"""Shared benchmark harness for the kernels of this repository (used by <kernel>/benchmarks/sweep.py).

Method (shared/docs/performance.md):
- GPU time comes from CUDA-graph replay of each call (triton.testing.do_bench_cudagraph, median):
  launch overhead is excluded for every contender alike, so a 2 µs kernel is not measured as the
  5 µs it takes Python to launch it.
- The memory ceiling is a device-to-device copy of 1 GiB measured in the same run.
- Achieved bandwidth = bytes that the op must move (each input read once, each output written
  once) / median time.
- Every result file records the device, driver, CUDA, torch, triton, the git commit and the id of
  the kernel build, so a README table generated from it can be traced back.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    # Named by the caller (a copy of the tree on the GPU machine, whose .git, if any, may be
    # stale): that wins over what git says.
    if os.environ.get("KERNELS_COMMIT"):
        return os.environ["KERNELS_COMMIT"]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT, capture_output=True, text=True, check=True,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def environment(kernel_module=None) -> dict:
    """Device, software versions and provenance for a result file."""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["device"] = props.name
        env["sm_count"] = props.multi_processor_count
        env["capability"] = "%d.%d" % (props.major, props.minor)
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=True,
            ).stdout.strip().splitlines()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            env["driver"] = None
    else:
        env["device"] = platform.processor() or platform.machine()
    if kernel_module is not None:
        env["kernel_id"] = kernel_module.__name__
    return env


def _warm_up(fn) -> None:
    """A few calls before timing: compiles, allocator, autotuning (and, for graphs, outside the
    capture)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()


def gpu_time_us(fn, *, rep_ms: int = 100) -> float:
    """Median GPU time of one call of `fn` in µs, from CUDA-graph replay."""
    import triton.testing

    _warm_up(fn)
    return 1000.0 * triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")


def wall_time_us(fn, *, rep_ms: int = 100) -> float:
    """Median time per call in µs with plain back-to-back launches: what an eager caller sees,
    CPU launch overhead included (triton.testing.do_bench)."""
    import triton.testing

    _warm_up(fn)
    return 1000.0 * triton.testing.do_bench(fn, rep=rep_ms, return_mode="median")


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second, in GB/s).

    Half a second of copies first brings the GPU from its idle clock to its working clock."""
    import time

    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    start = time.perf_counter()
    while time.perf_counter() - start < 0.5:
        for _ in range(20):
            dst.copy_(src)
        torch.cuda.synchronize()
    # Not inside a CUDA graph: there a device-to-device copy_ becomes a memcpy node served by
    # the copy engines (seen: 2.7 TB/s on an H200), not the SM copy kernel it is in eager mode
    # (4.2+ TB/s). At 1 GiB, launch overhead is negligible.
    us = wall_time_us(lambda: dst.copy_(src), rep_ms=300)
    return 2 * nbytes / (us * 1e-6) / 1e9


def save(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n")


def device_slug(name: str) -> str:
    return "".join(c.lower() if c.isalnum() else "-" for c in name).strip("-").replace("--", "-")
