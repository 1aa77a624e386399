#!/usr/bin/env python3
"""Profiling drivers behind scripts/profile.sh: Nsight Compute on one op of one kernel, Nsight
Systems, and torch-profiler traces of an op or an end-to-end run, with GPU time per op family.

    profile_tools.py ncu   KERNEL OP [sizes] [--set full] [--section S ...] [--kernel-regex RE]
                                             [--launch-skip N] [--launch-count N]
    profile_tools.py nsys  KERNEL OP [sizes]  |  nsys e2e --model M [e2e args]
    profile_tools.py trace KERNEL OP [sizes]  |  trace e2e --model M [e2e args]
    profile_tools.py run-op KERNEL OP [sizes] [--warmup N] [--iters N]   (what ncu and nsys run)
    profile_tools.py families TRACE.json|KERN_SUM.csv               (the per-family table again)
    profile_tools.py gaps TRACE.json[.gz] [--window-ms MS]   (GPU idle time and the host ops behind it)

Sizes (each kernel reads the ones it needs): --tokens, --hidden (rmsnorm's hidden size,
activation's output width d; gated ops read 2d), --heads, --kv-heads, --head-dim, --batch,
--seqlen (attention: query length for flash_attn_func, cache length for flash_attn_with_kvcache),
--block-size (0: contiguous cache), --no-causal, --dtype. Every command takes --reports DIR
(default profiles/<UTC time>/, git-ignored) and --dry-run (print the commands, run nothing).

`e2e` targets: --model, --device and --size name the run, --reports and --dry-run are ours, and
everything else on the command line goes to scripts/e2e.py unchanged (its --configs, --iters,
--out, ...).

run-op loads the built kernel from <kernel>/build (kernels.get_local_kernel, the CUDA variant,
as the benchmark sweeps do; --build DIR for another), calls the op --warmup times, then opens the
CUDA profiler range (cudaProfilerStart) and calls it --iters times. ncu and nsys capture only
that range (--profile-from-start off / --capture-range=cudaProfilerApi), so the warm-up calls,
input set-up and module loading are never profiled; --launch-skip / --launch-count then count
launches of the filtered kernels inside the range.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
E2E_SCRIPT = REPO_ROOT / "scripts" / "e2e.py"

# ---- op families of GPU kernels ----

# Kernel name -> family, first match wins. Attention comes before GEMM because several attention
# kernels are CUTLASS-based (fmha_cutlass*), and rotate_q / cache_write / kv_append are the
# attention kernel's own helpers. Names are matched case-insensitively and come in three
# flavours: this repository's kernels (rms_norm_fwd_kernel, rope_kernel, gated_act_fwd_kernel,
# attn_fwd_kernel), PyTorch's eager kernels (named after their functor: silu_kernel,
# rsqrt_kernel_cuda, vectorized_layer_norm_kernel, which F.rms_norm also runs) and inductor's
# generated ones (triton_{poi,red,per}_fused_<ops>_<n>, named after the ops they fuse).
# Eager decompositions spread over generic kernels (pow, mean, add, mul, cat) land in "other".
FAMILIES: tuple[tuple[str, re.Pattern], ...] = (
    (
        "attention",
        re.compile(
            r"flash|fmha|attn|attention|sdpa|softmax|paged|reshape_and_cache|cache_write"
            r"|kv_append|rotate_q",
            re.I,
        ),
    ),
    (
        "gemm",
        re.compile(
            r"gemm|gemv|cublas|cutlass|nvjet|xmma|wgmma|splitk|matmul"
            r"|(^|_)(mm|addmm|bmm|baddbmm)(_|$)",
            re.I,
        ),
    ),
    ("rmsnorm", re.compile(r"rms_?norm|layer_?norm|rsqrt", re.I)),
    # inductor's rotate_half: a fused cat of the negated half
    (
        "rope",
        re.compile(r"rope|rotary|rotate_half|^triton_\w*_fused\w*(cat\w*neg|neg\w*cat)", re.I),
    ),
    ("activation", re.compile(r"_act_|silu|gelu|swiglu|sigmoid|tanh|_and_mul|glu_", re.I)),
)
FAMILY_NAMES = tuple(name for name, _ in FAMILIES) + ("other",)


def family(kernel_name: str) -> str:
    for name, pattern in FAMILIES:
        if pattern.search(kernel_name):
            return name
    return "other"


def family_table(kernels: dict[str, tuple[float, int]]) -> dict:
    """{kernel name: (GPU µs, launches)} -> per family: µs, share, launches, the top kernels."""
    total = sum(us for us, _ in kernels.values()) or 1.0
    table = {n: {"us": 0.0, "share": 0.0, "launches": 0, "top": []} for n in FAMILY_NAMES}
    for name, (us, launches) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
        row = table[family(name)]
        row["us"] += us
        row["launches"] += launches
        if len(row["top"]) < 3:
            row["top"].append({"name": name, "us": us, "launches": launches})
    for row in table.values():
        row["share"] = row["us"] / total
    return {"total_us": total, "families": table}


def kernels_from_chrome_trace(path: Path) -> dict[str, tuple[float, int]]:
    """GPU kernels (and memcpy / memset, counted as "other") of a torch-profiler Chrome trace."""
    events = json.loads(Path(path).read_text())
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    kernels: dict[str, tuple[float, int]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat", "").lower() in (
            "kernel",
            "gpu_memcpy",
            "gpu_memset",
        ):
            us, n = kernels.get(e["name"], (0.0, 0))
            kernels[e["name"]] = (us + float(e.get("dur", 0.0)), n + 1)
    return kernels


def _trace_events(path: Path) -> list:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)
    return events.get("traceEvents", []) if isinstance(events, dict) else events


def idle_gaps(path: Path, window_ms: float = 150.0, min_gap_us: float = 3.0) -> dict:
    """GPU idle time in the last `window_ms` of a torch-profiler Chrome trace (kernels, copies and
    memsets on any stream, merged), and for each gap longer than `min_gap_us` the host op that
    launched the work after it: the innermost CPU op around the launch's runtime call (matched by
    correlation id). A gap whose launch call ended after the GPU ran dry is `late`: the GPU waited
    for the host there. Totals per innermost op show which host work the GPU waited behind."""
    events = _trace_events(path)
    gpu_cats = ("kernel", "gpu_memcpy", "gpu_memset")
    work = sorted(
        (e for e in events if e.get("ph") == "X" and e.get("cat", "").lower() in gpu_cats),
        key=lambda e: e["ts"],
    )
    if not work:
        raise SystemExit(f"{path}: no GPU activity in the trace")
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("ph") == "X"
        and e.get("cat", "").lower() == "cuda_runtime"
        and "correlation" in e.get("args", {})
    }
    host_ops: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat", "").lower() in ("cpu_op", "user_annotation"):
            host_ops.setdefault((e["pid"], e["tid"]), []).append(e)

    def launcher(call) -> str:
        around = [
            e
            for e in host_ops.get((call["pid"], call["tid"]), [])
            if e["ts"] <= call["ts"] and e["ts"] + e["dur"] >= call["ts"] + call["dur"]
        ]
        return min(around, key=lambda e: e["dur"])["name"] if around else "(no host op)"

    end = max(e["ts"] + e["dur"] for e in work)
    work = [e for e in work if e["ts"] >= end - window_ms * 1000]
    busy_until, busy, idle, late = work[0]["ts"] + work[0]["dur"], work[0]["dur"], 0.0, 0.0
    by_op: dict = {}
    for e in work[1:]:
        gap = e["ts"] - busy_until
        if gap > min_gap_us:
            call = launches.get(e.get("args", {}).get("correlation"))
            name = launcher(call) if call else "(no launch record)"
            idle += gap
            row = by_op.setdefault(name, {"idle_us": 0.0, "late_us": 0.0, "gaps": 0})
            row["idle_us"] += gap
            row["gaps"] += 1
            if call is not None and call["ts"] + call["dur"] > busy_until:
                row["late_us"] += gap
                late += gap
        busy += max(0.0, e["ts"] + e["dur"] - max(busy_until, e["ts"]))
        busy_until = max(busy_until, e["ts"] + e["dur"])
    span = end - work[0]["ts"]
    ops = sorted(by_op.items(), key=lambda kv: -kv[1]["idle_us"])
    return {"span_us": span, "busy_us": busy, "idle_us": idle, "late_us": late, "by_op": dict(ops)}


def format_gaps(g: dict, rows: int = 15) -> str:
    lines = [
        f"last {g['span_us'] / 1000:.1f} ms: GPU busy {g['busy_us'] / 1000:.1f} ms, idle "
        f"{g['idle_us'] / 1000:.1f} ms, of which {g['late_us'] / 1000:.1f} ms waiting for a launch",
        f"{'idle ms':>9} {'late ms':>9} {'gaps':>6}  host op launching the work after the gap",
    ]
    for name, row in list(g["by_op"].items())[:rows]:
        lines.append(
            f"{row['idle_us'] / 1000:>9.2f} {row['late_us'] / 1000:>9.2f} {row['gaps']:>6}  {name[:90]}"
        )
    return "\n".join(lines)


def kernels_from_nsys_csv(path: Path) -> dict[str, tuple[float, int]]:
    """`nsys stats --report cuda_gpu_kern_sum --format csv` -> {name: (µs, launches)}."""
    kernels: dict[str, tuple[float, int]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            us, n = kernels.get(row["Name"], (0.0, 0))
            kernels[row["Name"]] = (
                us + float(row["Total Time (ns)"]) / 1000,
                n + int(row["Instances"]),
            )
    return kernels


def format_table(summary: dict) -> str:
    lines = [
        f"GPU time per op family (total {summary['total_us'] / 1000:.3f} ms)",
        f"{'family':<11} {'ms':>10} {'share':>7} {'launches':>9}  top kernel",
    ]
    rows = sorted(summary["families"].items(), key=lambda kv: -kv[1]["us"])
    for name, row in rows:
        top = row["top"][0]["name"] if row["top"] else ""
        top = top if len(top) <= 80 else top[:77] + "..."
        lines.append(
            f"{name:<11} {row['us'] / 1000:>10.3f} {100 * row['share']:>6.1f}% "
            f"{row['launches']:>9}  {top}"
        )
    return "\n".join(lines)


def write_table(kernels: dict[str, tuple[float, int]], out_dir: Path) -> None:
    summary = family_table(kernels)
    (out_dir / "families.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = format_table(summary)
    (out_dir / "families.txt").write_text(text + "\n")
    print(text)
    print(f"per-family table: {out_dir / 'families.txt'} (and families.json)")


# ---- the ops: inputs and a call per (kernel, op) ----

# ncu's -k filter per kernel folder: the CUDA kernels its ops launch (function names without
# namespace or template arguments, which is what ncu matches by default).
KERNEL_REGEX = {
    "rmsnorm": r"rms_norm_",
    "activation": r"(gated|unary)_act_",
    "rope": r"rope_kernel",
    "attention": r"attn_fwd|attn_bwd|cache_write|kv_append|rotate_q",
}


def _package_functions(kernel: str) -> tuple[str, ...]:
    """The public functions of <kernel>'s Python package (its `__all__` entries defined as
    functions in __init__.py), read from the source: no import, no GPU."""
    import ast

    path = REPO_ROOT / kernel / "torch-ext" / kernel / "__init__.py"
    if not path.is_file():
        return ()
    tree = ast.parse(path.read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return tuple(n for n in ast.literal_eval(node.value) if n in defined)
    return ()


OPS = {
    "rmsnorm": (
        "rms_norm",
        "fused_add_rms_norm",
        "gemma_rms_norm",
        "gemma_fused_add_rms_norm",
        "apply_rms_norm_backward",
    ),
    # every activation op has the same (out, x) form: gated ones (x is [..., 2d]) are the
    # `*_and_*` ones
    "activation": _package_functions("activation"),
    "rope": ("rotary_embedding", "apply_rotary_transformers"),
    "attention": ("flash_attn_func", "flash_attn_with_kvcache"),
}
DEFAULT_HIDDEN = {"rmsnorm": 4096, "activation": 14336}


def make_call(mod, kernel: str, op: str, a: argparse.Namespace, dev: str = "cuda"):
    """A no-argument callable running `op` of the loaded kernel `mod` on fresh inputs (`dev`:
    the tests call every op of a CPU build with it)."""
    import torch

    dtype = getattr(torch, a.dtype)

    def rand(*shape, scale=1.0):
        return scale * torch.randn(*shape, device=dev, dtype=dtype)

    hidden = a.hidden or DEFAULT_HIDDEN.get(kernel, 4096)
    if kernel == "rmsnorm":
        x, w = rand(a.tokens, hidden), rand(hidden, scale=0.1)
        if op in ("rms_norm", "gemma_rms_norm"):
            out = torch.empty_like(x)
            return lambda: getattr(mod, op)(out, x, w, 1e-6)
        if op in ("fused_add_rms_norm", "gemma_fused_add_rms_norm"):
            residual = rand(a.tokens, hidden)
            return lambda: getattr(mod, op)(x, residual, w, 1e-6)
        grad = rand(a.tokens, hidden, scale=0.1)
        return lambda: mod.apply_rms_norm_backward(grad, x, w, None, None, 1e-6)
    if kernel == "activation":
        x = rand(a.tokens, 2 * hidden if "_and_" in op else hidden)
        out = torch.empty(a.tokens, hidden, device=dev, dtype=dtype)
        return lambda: getattr(mod, op)(out, x)
    if kernel == "rope":
        d = a.head_dim
        if op == "rotary_embedding":
            # in place on the q and k columns of a fused qkv buffer, as vLLM calls it
            q_size, kv_size = a.heads * d, a.kv_heads * d
            qkv = rand(a.tokens, q_size + 2 * kv_size)
            q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
            positions = torch.arange(a.tokens, device=dev)
            angles = torch.rand(a.tokens, d // 2, device=dev) * 6.283
            cache = torch.cat([angles.cos(), angles.sin()], dim=-1)  # fp32 [positions, d]
            return lambda: mod.rotary_embedding(positions, q, k, d, cache, True)
        q = rand(1, a.heads, a.tokens, d)
        k = rand(1, a.kv_heads, a.tokens, d)
        angles = torch.rand(1, a.tokens, d, device=dev) * 6.283
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        return lambda: mod.apply_rotary_transformers(q, k, cos, sin)
    if kernel == "attention":
        b, s, d = a.batch, a.seqlen, a.head_dim
        if op == "flash_attn_func":
            q, k, v = (rand(b, s, h, d) for h in (a.heads, a.kv_heads, a.kv_heads))
            return lambda: mod.flash_attn_func(q, k, v, causal=a.causal)
        q = rand(b, 1, a.heads, d)
        seqlens = torch.full((b,), s, dtype=torch.int32, device=dev)
        table = None
        if a.block_size:
            blocks = -(-s // a.block_size)
            k_cache = rand(b * blocks, a.block_size, a.kv_heads, d)
            table = torch.randperm(b * blocks, device=dev, dtype=torch.int32).view(b, blocks)
        else:
            k_cache = rand(b, s, a.kv_heads, d)
        v_cache = torch.randn_like(k_cache)
        return lambda: mod.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=True
        )
    raise SystemExit(f"profile: no driver for kernel {kernel!r} (known: {', '.join(OPS)})")


def run_op(a: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("profile: run-op needs a CUDA GPU")
    import kernels

    build = Path(a.build) if a.build else REPO_ROOT / a.kernel / "build"
    mod = kernels.get_local_kernel(build, backend="cuda")
    fn = make_call(mod, a.kernel, a.op, a)
    for _ in range(a.warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    with torch.cuda.nvtx.range(f"{a.kernel}.{a.op}"):
        for _ in range(a.iters):
            fn()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"ran {a.kernel}.{a.op} {a.iters}x after {a.warmup} warm-up calls ({mod.__name__})")
    return 0


# ---- command lines ----


def default_out_dir() -> Path:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return REPO_ROOT / "profiles" / stamp


def _add_sizes(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sizes (each kernel reads the ones it needs)")
    g.add_argument("--tokens", type=int, default=4096)
    g.add_argument(
        "--hidden", type=int, help="rmsnorm: hidden (4096); activation: output width d (14336)"
    )
    g.add_argument("--heads", type=int, default=32, help="query heads")
    g.add_argument("--kv-heads", type=int, default=8)
    g.add_argument("--head-dim", type=int, default=128)
    g.add_argument("--batch", type=int, default=1)
    g.add_argument(
        "--seqlen", type=int, default=4096, help="attention: query length, or cache length"
    )
    g.add_argument("--block-size", type=int, default=0, help="paged cache block (0: contiguous)")
    g.add_argument("--no-causal", dest="causal", action="store_false")
    g.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--warmup", type=int, default=3, help="calls before the profiled range")
    p.add_argument("--iters", type=int, default=1, help="calls inside the profiled range")
    p.add_argument("--build", help="kernel build folder (default: <kernel>/build)")


def _add_common(p: argparse.ArgumentParser) -> None:
    # not --out: scripts/e2e.py's --out (its results JSON) passes through
    p.add_argument("--reports", type=Path, help="report folder (default: profiles/<UTC time>/)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="scripts/profile.sh",
        description="Profile one op of a kernel of this repository, or an end-to-end run.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  scripts/profile.sh ncu rmsnorm rms_norm --tokens 4096 --hidden 4096\n"
            "  scripts/profile.sh ncu attention flash_attn_with_kvcache --batch 8 --seqlen 32768 "
            "--block-size 16 --set detailed\n"
            "  scripts/profile.sh trace e2e --model qwen3 --size full --configs eager+kit\n"
            "  scripts/profile.sh nsys activation silu_and_mul --tokens 8192\n"
            "ops: "
            + "; ".join(f"{k}: {', '.join(v)}" for k, v in OPS.items())
            + "\nreports go to profiles/<UTC time>/ (git-ignored) unless --reports is given."
        ),
    )
    sub = top.add_subparsers(dest="mode", required=True, metavar="MODE")

    ncu = sub.add_parser("ncu", help="Nsight Compute report of one op's CUDA kernels")
    ncu.add_argument("kernel")
    ncu.add_argument("op")
    _add_sizes(ncu)
    _add_common(ncu)
    ncu.add_argument("--set", default="full", help="ncu section set (default: full)")
    ncu.add_argument(
        "--section", action="append", default=[], help="an ncu section instead of a set"
    )
    ncu.add_argument("--kernel-regex", help="ncu -k regex (default: the kernel folder's kernels)")
    ncu.add_argument("--launch-skip", type=int, default=0, help="filtered launches to skip")
    ncu.add_argument("--launch-count", type=int, default=0, help="launches to profile (0: all)")
    ncu.add_argument("--ncu", default="ncu", help="the ncu executable")

    for mode, what in (("nsys", "Nsight Systems timeline"), ("trace", "torch-profiler trace")):
        p = sub.add_parser(
            mode,
            help=f"{what} of one op (KERNEL OP) or of scripts/e2e.py (e2e --model M ...)",
            description=f"{what} of one op, or of an end-to-end run: `{mode} e2e --model M "
            "[--device D] [--size S] [--reports DIR] [--dry-run] [scripts/e2e.py arguments]`.",
        )
        p.add_argument("kernel", help="a kernel folder, or e2e")
        p.add_argument("op", help="the op")
        _add_sizes(p)
        _add_common(p)
        if mode == "nsys":
            p.add_argument("--nsys", default="nsys", help="the nsys executable")

    run = sub.add_parser("run-op", help="call one op under a CUDA profiler range (the driver)")
    run.add_argument("kernel")
    run.add_argument("op")
    _add_sizes(run)

    fam = sub.add_parser("families", help="GPU time per op family of a trace or nsys CSV")
    fam.add_argument("path", type=Path)
    fam.add_argument("--reports", type=Path, help="where to write families.txt / .json")

    gaps = sub.add_parser("gaps", help="GPU idle time of a trace and the host ops behind it")
    gaps.add_argument("path", type=Path, help="torch-profiler Chrome trace (.json or .json.gz)")
    gaps.add_argument("--window-ms", type=float, default=150.0, help="the trace's last MS only")
    return top


def e2e_parser(mode: str) -> argparse.ArgumentParser:
    """`nsys e2e` / `trace e2e`: only these options are ours, the rest is scripts/e2e.py's."""
    p = argparse.ArgumentParser(prog=f"scripts/profile.sh {mode} e2e")
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--size")
    _add_common(p)
    if mode == "nsys":
        p.add_argument("--nsys", default="nsys", help="the nsys executable")
    return p


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The arguments, and for `e2e` targets the rest of the command line (for scripts/e2e.py)."""
    if len(argv) >= 2 and argv[0] in ("nsys", "trace") and argv[1] == "e2e":
        args, rest = e2e_parser(argv[0]).parse_known_args(argv[2:])
        args.mode, args.kernel, args.op = argv[0], "e2e", None
        return args, rest
    args = parser().parse_args(argv)
    if args.mode in ("ncu", "nsys", "trace", "run-op"):
        if args.kernel in OPS and args.op not in OPS[args.kernel]:
            parser().error(
                f"{args.kernel} has no op {args.op!r} here (known: {', '.join(OPS[args.kernel])})"
            )
    return args, []


def _driver_args(a: argparse.Namespace) -> list[str]:
    """The run-op command line that reproduces `a`'s op and sizes."""
    argv = [a.kernel, a.op, "--tokens", str(a.tokens)]
    if a.hidden:
        argv += ["--hidden", str(a.hidden)]
    argv += ["--heads", str(a.heads), "--kv-heads", str(a.kv_heads), "--head-dim", str(a.head_dim)]
    argv += ["--batch", str(a.batch), "--seqlen", str(a.seqlen), "--block-size", str(a.block_size)]
    argv += ["--dtype", a.dtype, "--warmup", str(a.warmup), "--iters", str(a.iters)]
    if not a.causal:
        argv.append("--no-causal")
    if a.build:
        argv += ["--build", a.build]
    return [sys.executable, str(Path(__file__).resolve()), "run-op", *argv]


def e2e_argv(a: argparse.Namespace, rest: list[str]) -> list[str]:
    """scripts/e2e.py's command line. Assumed interface (the harness is developed alongside):
    --model, --device and --size, the rest passed through; --no-profile because the harness's
    own one-call torch profile cannot run inside this one (the profiler does not nest)."""
    argv = ["--model", a.model, "--device", a.device]
    if a.size:
        argv += ["--size", a.size]
    argv += rest
    if "--no-profile" not in argv:
        argv.append("--no-profile")
    return argv


def ncu_command(a: argparse.Namespace, out: Path) -> list[str]:
    regex = a.kernel_regex or KERNEL_REGEX.get(a.kernel)
    cmd = [a.ncu, "--profile-from-start", "off", "--target-processes", "all"]
    if a.section:
        for s in a.section:
            cmd += ["--section", s]
    else:
        cmd += ["--set", a.set]
    cmd += ["--import-source", "yes"]  # source view where the build has -lineinfo
    if regex:
        cmd += ["-k", f"regex:{regex}"]
    if a.launch_skip:
        cmd += ["--launch-skip", str(a.launch_skip)]
    if a.launch_count:
        cmd += ["--launch-count", str(a.launch_count)]
    cmd += ["-f", "-o", str(out / f"{a.kernel}-{a.op}")]
    return cmd + _driver_args(a)


def nsys_command(a: argparse.Namespace, out: Path, rest: list[str]) -> list[str]:
    name = f"e2e-{a.model}" if a.kernel == "e2e" else f"{a.kernel}-{a.op}"
    cmd = [a.nsys, "profile", "--trace", "cuda,nvtx,osrt", "--force-overwrite", "true"]
    cmd += ["-o", str(out / name)]
    if a.kernel == "e2e":
        return cmd + [sys.executable, str(E2E_SCRIPT), *e2e_argv(a, rest)]
    return (
        cmd
        + ["--capture-range", "cudaProfilerApi", "--capture-range-end", "stop"]
        + (_driver_args(a))
    )


def _which(exe: str, what: str, hint: str) -> str:
    found = shutil.which(exe) or shutil.which(exe, path="/usr/local/cuda/bin")
    if not found:
        raise SystemExit(f"profile: {what} ({exe}) is not installed or not on PATH. {hint}")
    return found


def _run(cmd: list[str], dry_run: bool) -> int:
    print("+ " + shlex.join(cmd), flush=True)
    return 0 if dry_run else subprocess.call(cmd)


def profile_ncu(a: argparse.Namespace, out: Path) -> int:
    if not a.dry_run:
        a.ncu = _which(a.ncu, "Nsight Compute", "It ships with the CUDA toolkit (ncu).")
    rc = _run(ncu_command(a, out), a.dry_run)
    rep = out / f"{a.kernel}-{a.op}.ncu-rep"
    if rc == 0 and not a.dry_run:
        details = out / f"{a.kernel}-{a.op}-details.txt"
        with open(details, "w") as f:
            subprocess.call([a.ncu, "--import", str(rep), "--page", "details"], stdout=f)
        print(f"report: {rep} (open in ncu-ui; text: {details})")
    elif rc != 0:
        print(
            "profile: ncu failed; ERR_NVGPUCTRPERM means GPU performance counters are restricted "
            "to root (run as root, or set NVreg_RestrictProfilingToAdminUsers=0)",
            file=sys.stderr,
        )
    return rc


def profile_nsys(a: argparse.Namespace, out: Path, rest: list[str]) -> int:
    if not a.dry_run:
        a.nsys = _which(
            a.nsys,
            "Nsight Systems",
            "Install it (e.g. the nsight-systems package), or use `scripts/profile.sh trace ...` "
            "for a torch-profiler trace, which needs nothing beyond PyTorch.",
        )
    rc = _run(nsys_command(a, out, rest), a.dry_run)
    name = f"e2e-{a.model}" if a.kernel == "e2e" else f"{a.kernel}-{a.op}"
    if rc == 0 and not a.dry_run:
        stats = [a.nsys, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv"]
        stats += ["--force-export", "true", "-o", str(out / name), str(out / f"{name}.nsys-rep")]
        if _run(stats, False) == 0:
            csvs = sorted(out.glob(f"{name}*cuda_gpu_kern_sum*.csv"))
            if csvs:
                write_table(kernels_from_nsys_csv(csvs[0]), out)
        print(f"report: {out / (name + '.nsys-rep')} (open in nsys-ui)")
    return rc


def profile_trace(a: argparse.Namespace, out: Path, rest: list[str]) -> int:
    """The torch profiler (CPU and CUDA activity) around an e2e run or an op's profiled calls,
    in this process; writes a Chrome trace (chrome://tracing, ui.perfetto.dev) and the table."""
    if a.kernel == "e2e":
        argv = e2e_argv(a, rest)
        print("+ torch.profiler around: " + shlex.join(["scripts/e2e.py", *argv]), flush=True)
    else:
        print("+ torch.profiler around: " + shlex.join(_driver_args(a)[2:]), flush=True)
    if a.dry_run:
        return 0
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    rc = 0
    with profile(activities=activities) as prof:
        if a.kernel == "e2e":
            rc = run_e2e(argv)
        else:
            rc = run_op(a)
    trace = out / ("e2e-" + a.model if a.kernel == "e2e" else f"{a.kernel}-{a.op}")
    trace = trace.with_suffix(".trace.json")
    prof.export_chrome_trace(str(trace))
    print(f"trace: {trace} (open in ui.perfetto.dev or chrome://tracing)")
    write_table(kernels_from_chrome_trace(trace), out)
    return rc


def run_e2e(argv: list[str]) -> int:
    """scripts/e2e.py in this process, so the profiler sees its work. Assumed: the harness's
    module exposes main(argv) (it returns its results document). Should it change, only this
    function needs to."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("e2e", E2E_SCRIPT)
    if spec is None or not E2E_SCRIPT.is_file():
        raise SystemExit(f"profile: {E2E_SCRIPT} not found")
    e2e = importlib.util.module_from_spec(spec)
    sys.modules["e2e"] = e2e  # its dataclasses look their module up there
    spec.loader.exec_module(e2e)
    try:
        e2e.main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args, rest = parse(sys.argv[1:] if argv is None else argv)
    if args.mode == "run-op":
        return run_op(args)
    if args.mode == "gaps":
        print(format_gaps(idle_gaps(args.path, args.window_ms)))
        return 0
    if args.mode == "families":
        path = args.path
        kernels = (
            kernels_from_nsys_csv(path)
            if path.suffix == ".csv"
            else kernels_from_chrome_trace(path)
        )
        out = args.reports or path.parent
        out.mkdir(parents=True, exist_ok=True)
        write_table(kernels, out)
        return 0
    out = args.reports or default_out_dir()
    if not args.dry_run:
        out.mkdir(parents=True, exist_ok=True)
    print(
        f"reports: {out}" + (" (dry run: nothing is written)" if args.dry_run else ""), flush=True
    )
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.mode == "ncu":
        rc = profile_ncu(args, out)
    elif args.mode == "nsys":
        rc = profile_nsys(args, out, rest)
    else:
        rc = profile_trace(args, out, rest)
    if not args.dry_run:
        print(f"reports: {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
