"""Shared benchmark harness for the kernels of this repository (used by <kernel>/benchmarks/sweep.py).

Method:
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

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import time
import types
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
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def pdl_from_env(var: str):
    """The ops' enable_pdl from the environment variable `var` (e.g. ACTIVATION_PDL): "1" -> True
    (programmatic dependent launch for every launch), "0" -> False, unset or anything else ->
    None (each launch's default). Only the benchmarks read such variables; the kernels take
    enable_pdl as an argument."""
    value = os.environ.get(var)
    return True if value == "1" else False if value == "0" else None


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
            env["driver"] = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[0]
            )
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
    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    start = time.perf_counter()
    while time.perf_counter() - start < 0.5:
        for _ in range(20):
            dst.copy_(src)
        torch.cuda.synchronize()
    # Not inside a CUDA graph: there a device-to-device copy_ becomes a memcpy node served by
    # the copy engines, well below the SM copy kernel it is in eager mode. At 1 GiB, launch
    # overhead is negligible.
    us = wall_time_us(lambda: dst.copy_(src), rep_ms=300)
    return 2 * nbytes / (us * 1e-6) / 1e9


def save(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n")


def device_slug(name: str) -> str:
    return "".join(c.lower() if c.isalnum() else "-" for c in name).strip("-").replace("--", "-")


# ---- the budgeted sweeps (rmsnorm/benchmarks/sweep.py, rope/benchmarks/sweep.py) ----
#
# Each sweep lists its cases in priority order (the README's rows first) and times ours and the
# baselines of each case in the same process; a case is a frozen dataclass with an `op` field.
# torch.compile dominates the run time, so the sweep starts no new case once its time budget,
# counted from process start, would be exceeded; skipped cases are listed in the result file.


def compiled(fn, tag: str):
    """torch.compile(fn, dynamic=False) on a copy of fn with its own code object: Dynamo caches
    per code object, so each shape gets a one-entry cache (no recompile limit, no walk over the
    guards of other shapes in the per-call times)."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    fresh = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return torch.compile(fresh, dynamic=False)


def check_close(
    what: str, got: torch.Tensor, want: torch.Tensor, *, ulps: float, rms_ulps: float
) -> None:
    """|got - want| <= ulps * eps * |want| + rms_ulps * eps * rms(want), eps of got's dtype; NaN
    fails (SystemExit naming `what`). `want` is the fp32 reference (rounded once where the op
    rounds once)."""
    eps = torch.finfo(got.dtype).eps
    want = want.float()
    err = (got.float() - want).abs()
    bound = ulps * eps * want.abs() + rms_ulps * eps * want.pow(2).mean().sqrt()
    if not bool((err <= bound).all()):
        raise SystemExit(f"verification failed for {what}: max err {err.max().item()}")


def sweep_arguments(description: str, quick_help: str, budget_s: dict) -> argparse.ArgumentParser:
    """--quick, --out and --budget-s (defaults: budget_s["full"], budget_s["quick"])."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument(
        "--out", type=Path, help="result file (default benchmarks/results/<device>.json)"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        help="start no new case once this many seconds since process start would be exceeded "
        f"(default {budget_s['full']:.0f}, --quick {budget_s['quick']:.0f}; 0: no limit)",
    )
    return parser


def timing_row(case, nbytes: int, l2_bytes, us: dict, wall: dict, baselines) -> dict:
    """A result row: the case's fields, the bytes the op must move (and whether they fit in the
    L2), GPU µs and GB/s per contender, speed-ups of ours over each baseline and, where per-call
    times were taken (`wall`), those and their speed-ups."""
    result = {
        **dataclasses.asdict(case),
        "bytes": nbytes,
        "l2_resident": None if l2_bytes is None else nbytes <= l2_bytes,
        "us": us,
        "gbs": {k: nbytes / (v * 1e-6) / 1e9 for k, v in us.items()},
    }
    for name in baselines:
        result[f"speedup_vs_{name}"] = us[name] / us["ours"]
    if wall:
        result["wall_us"] = wall
        for name in wall:
            if name != "ours":
                result[f"wall_speedup_vs_{name}"] = wall[name] / wall["ours"]
    return result


def summary_line(head: str, r: dict, baselines) -> str:
    """One printed line per row: `head` (the case), then ours' time, bandwidth and share of the
    copy ceiling, the speed-ups and the per-call times."""
    line = (
        f"{head}  ours {r['us']['ours']:9.2f} us "
        f"{r['gbs']['ours']:6.0f} GB/s ({100 * r['copy_fraction']:5.1f}% copy)"
        + "".join(f"  {k} x{r[f'speedup_vs_{k}']:.2f}" for k in baselines)
    )
    if "wall_us" in r:
        line += "  per call: " + " / ".join(f"{k} {v:.1f}" for k, v in r["wall_us"].items()) + " us"
    return line


def load_built_kernel(kernel_dir: Path):
    """The CUDA variant of <kernel>/build, loaded as users load it (kernels.get_local_kernel)."""
    if not torch.cuda.is_available():
        raise SystemExit("the sweep times CUDA kernels; no GPU is available")
    import kernels

    return kernels.get_local_kernel(kernel_dir / "build", backend="cuda")


def final_copy_ceiling(results: list, copy_gbs: float) -> float:
    """The better of `copy_gbs` (measured before the sweep) and a copy measured now, so that no
    fraction is inflated by a copy measured while the clocks were still low; every row's
    copy_fraction is recomputed against it."""
    copy_gbs = max(copy_gbs, copy_bandwidth_gbs())
    for r in results:
        r["copy_fraction"] = r["gbs"]["ours"] / copy_gbs
    print(f"copy ceiling (best of before/after): {copy_gbs:.0f} GB/s")
    return copy_gbs


def result_path(out, kernel_dir: Path, env: dict, subdir: str = "") -> Path:
    """--out, or <kernel>/benchmarks/results[/<subdir>]/<device>.json. A suite of its own (quant's
    GEMMs) writes to a subdir, out of the per-kernel tables and plots that read results/*.json."""
    results = kernel_dir / "benchmarks" / "results"
    return out or (results / subdir if subdir else results) / f"{device_slug(env['device'])}.json"


def run_budgeted_sweep(
    *,
    kernel_name: str,
    kernel_dir: Path,
    start: float,
    args,
    budget_s: dict,
    cases,
    run_case,
    summary,
    sort_key,
    notes: dict,
    results_subdir: str = "",
) -> tuple[Path, dict]:
    """The main of a budgeted sweep: load the built kernel, measure the copy ceiling, run `cases`
    (priority order) until the budget, re-measure the ceiling, write the result file.

    args: from sweep_arguments; run_case(kernel, case, l2_bytes) -> a row (timing_row);
    summary(row) -> its printed line (summary_line); sort_key(row) orders the result file; notes
    (method, baselines, contenders) go into the payload after the environment; results_subdir:
    see result_path. Returns the result file's path and its payload."""
    budget = (
        args.budget_s if args.budget_s is not None else budget_s["quick" if args.quick else "full"]
    )
    kernel = load_built_kernel(kernel_dir)
    env = environment(kernel)
    l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
    copy_gbs = copy_bandwidth_gbs()
    print(f"{env['device']}: copy ceiling {copy_gbs:.0f} GB/s, L2 {l2_bytes} B", flush=True)

    results, skipped, spent = [], [], {}
    # Each CUDA-graph capture starts with gc.collect(), which would walk every object of torch,
    # Dynamo and Inductor again: freeze what is alive between cases (after collecting, so that
    # no garbage of a case is frozen) and each collection sees only the objects of one case.
    gc.collect()
    gc.freeze()
    for case in cases:
        elapsed = time.perf_counter() - start
        # The next case of an op costs about what the last ones did (the first case of the run
        # also pays the one-time torch.compile start-up: a median leaves it out).
        past = spent.get(case.op, [])[-5:]
        estimate = 1.5 * statistics.median(past) if past else 0.0
        if budget > 0 and elapsed + estimate > budget:
            skipped.append(case)
            continue
        began = time.perf_counter()
        r = run_case(kernel, case, l2_bytes)
        gc.collect()
        gc.freeze()
        spent.setdefault(case.op, []).append(time.perf_counter() - began)
        r["copy_fraction"] = r["gbs"]["ours"] / copy_gbs
        results.append(r)
        print(f"[{elapsed:5.0f} s] " + summary(r), flush=True)
    if skipped:
        print(
            f"time budget of {budget:.0f} s reached: {len(skipped)} of {len(cases)} cases skipped "
            f"(listed in the result file; --budget-s 0 runs them all)",
            flush=True,
        )
    copy_gbs = final_copy_ceiling(results, copy_gbs)
    results.sort(key=sort_key)
    payload = {
        "kernel": kernel_name,
        "environment": env,
        **notes,
        "copy_gbs": copy_gbs,
        "l2_bytes": l2_bytes,
        "budget_s": budget,
        "skipped": [dataclasses.asdict(c) for c in skipped],
        "wall_s": time.perf_counter() - start,
        "results": results,
    }
    path = result_path(args.out, kernel_dir, env, results_subdir)
    save(path, payload)
    print(f"wrote {path} ({len(results)} cases, {payload['wall_s']:.0f} s)")
    return path, payload
