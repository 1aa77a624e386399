"""Sweep of the rmsnorm ops against F.rms_norm, LLaMA-style eager and torch.compile, same run (CUDA).

    python rmsnorm/benchmarks/sweep.py [--quick] [--out PATH] [--budget-s S]

Loads the *built* kernel (rmsnorm/build, via kernels.get_local_kernel, as the activation sweep
does), measures the copy ceiling, checks each op against the fp32 reference of benchmark.py before
timing it, then times ours and three baselines in the same process:

  op                         ours                              eager / F.rms_norm / compile
  rms_norm                   rms_norm(out, x, w, eps)          LlamaRMSNorm.forward (transformers) /
                             (preallocated out)                F.rms_norm / torch.compile(LlamaRMSNorm)
  fused_add_rms_norm         fused_add_rms_norm(x, res, w)     r = x + res, then the same three norms
                             (in place)                        (out of place: return (norm(r), r))
  apply_rms_norm_backward    dinput and dweight from           autograd backward of the three
                             (grad, x, w), rstd recomputed     forwards, backward only (see below)

Backward baselines: the forward runs once, outside the timing, with x and w requiring grad; the
timed call is `torch.autograd.grad(y, (x, w), grad, retain_graph=True)`, i.e. only the backward
kernels (for torch.compile: the AOT-compiled backward, fed with what its forward saved). Autograd
runs backward ops on the stream their forward ran on, so these rows are captured on that stream
(graph_time_us_on, the same procedure as benchlib.gpu_time_us).

Sizes: tokens {1 … 65536} × hidden {2048, 3072, 4096, 5120, 8192} × {bf16, fp16} for the forward
ops; the backward at bf16, tokens {1, 64, 4096, 65536} × hidden {4096, 8192}; --quick: bf16,
hidden {4096, 8192}, tokens {1, 64, 4096, 65536}, and the backward at 64 and 4096 × 4096.
torch.compile: default mode, dynamic=False, compiled once per shape and reused for all
repetitions (compile time not timed); at roughly a second per compilation it dominates the run.
Cases therefore run in priority order (see cases()) and the sweep starts no new case once
--budget-s, counted from process start, would be exceeded; skipped cases are listed in the
result file, and --budget-s 0 runs them all. Writes benchmarks/results/<device>.json with
device, versions and commit.
"""

from __future__ import annotations

import time

_START = time.perf_counter()  # the time budget counts imports and compilation too

import functools  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

KERNEL_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(KERNEL_DIR.parent / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import (  # noqa: E402
    reference_fused_add_rms_norm,
    reference_rms_norm,
    reference_rms_norm_backward,
    relative_error,
)

import benchlib  # noqa: E402

DEVICE = "cuda"
EPS = 1e-6
TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536]
HIDDEN = [2048, 3072, 4096, 5120, 8192]
# The README's rows (scripts/bench_table.py ROW_FILTERS["rmsnorm"]), measured first.
HEADLINE_TOKENS = [1, 64, 4096, 65536]
HEADLINE_HIDDEN = [4096, 8192]
QUICK_TOKENS = [1, 64, 4096, 65536]
DECODE_MAX_TOKENS = 64  # per-call (wall) times up to here: decode sizes, where launches dominate
REP_MS = 10  # per measurement: 10 graph replays of ~REP_MS each (benchlib's default: 100)
BUDGET_S = {"full": 215.0, "quick": 75.0}  # leaves time for the final copy measurement and save

FWD, FUSED, BWD = "rms_norm", "fused_add_rms_norm", "apply_rms_norm_backward"
BASELINES = ("eager", "F.rms_norm", "compile")

CONTENDERS = {
    FWD: {
        "ours": "kernel.rms_norm(out, x, w, eps), out preallocated",
        "eager": "transformers LlamaRMSNorm.forward: fp32 variance, normalized value cast back, times w",
        "F.rms_norm": "torch.nn.functional.rms_norm(x, (hidden,), w, eps)",
        "compile": "torch.compile(LlamaRMSNorm.forward code, dynamic=False)",
    },
    FUSED: {
        "ours": "kernel.fused_add_rms_norm(x, residual, w, eps), in place (re-applied to the same buffers)",
        "eager": "r = x + residual; (LlamaRMSNorm(r), r), out of place",
        "F.rms_norm": "r = x + residual; (F.rms_norm(r), r): no fused F.rms_norm form exists",
        "compile": "torch.compile of the eager add + LlamaRMSNorm, dynamic=False",
    },
    BWD: {
        "ours": "kernel.apply_rms_norm_backward(grad, x, w, None, None, eps) -> [dinput, dweight], rstd recomputed",
        "eager": "autograd backward of LlamaRMSNorm.forward only (forward run once before timing, retain_graph=True)",
        "F.rms_norm": "autograd backward of F.rms_norm only (idem)",
        "compile": "AOT-compiled backward of torch.compile(LlamaRMSNorm.forward) only, fed with what its forward saved (idem)",
    },
}

METHOD = (
    "GPU time = median of 10 CUDA-graph replays, each of back-to-back calls filling about "
    f"{REP_MS} ms (triton do_bench_cudagraph; backward rows: the same procedure captured on the "
    "stream their autograd graph was recorded on); per-call time at <= "
    f"{DECODE_MAX_TOKENS} tokens = median of back-to-back launches (triton do_bench), launch "
    "overhead included; bytes = inputs read once + outputs written once (rms_norm: x, w -> out; "
    "fused_add_rms_norm: x, residual, w -> x, residual; backward: grad, x, w -> dinput, dweight), "
    "and every contender's GB/s uses those bytes; inputs are not rotated: rows with l2_resident "
    "(bytes <= the device's L2, l2_bytes) replay on L2-resident data for every contender alike and "
    "may exceed the copy ceiling; each op is checked against an fp32 reference before timing; "
    "copy ceiling = 1 GiB device-to-device copy after a clock warm-up, best of before and after "
    "the sweep, same run; torch.compile: default mode, dynamic=False, one compilation per shape, "
    "compile time excluded"
)
BASELINES_NOTE = (
    "eager = transformers' LlamaRMSNorm code (fp32 upcast); torch.compile compiles that code; "
    "fused_add_rms_norm rows: ours in place vs x + residual followed by each norm; "
    "apply_rms_norm_backward rows: dinput and dweight from (grad, x, w) vs each forward's "
    "autograd backward alone"
)


# ---- the code users run today (baselines) ----


def llama_rms_norm(x, weight):
    """transformers' LlamaRMSNorm.forward."""
    input_dtype = x.dtype
    hidden_states = x.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + EPS)
    return weight * hidden_states.to(input_dtype)


def f_rms_norm(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def add_llama_rms_norm(x, residual, weight):
    """A transformers decoder layer: residual add in the activation dtype, then the norm."""
    r = x + residual
    return llama_rms_norm(r, weight), r


def add_f_rms_norm(x, residual, weight):
    r = x + residual
    return f_rms_norm(r, weight), r


# ---- timing ----


def graph_time_us_on(stream: torch.cuda.Stream, fn, *, rep_ms: int = REP_MS) -> float:
    """benchlib.gpu_time_us's procedure (triton do_bench_cudagraph: warm-up, a 5-call estimate,
    rep_ms / estimate calls unrolled in one CUDA graph, median of 10 replays), with the calls,
    the capture and the replays on `stream`. A backward-only capture must run on the stream its
    autograd graph was recorded on: backward ops run on their forward's stream."""
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate_ms = start.elapsed_time(end) / 5
        n_repeat = max(1, int(rep_ms / estimate_ms)) if estimate_ms > 0 else 1000
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(n_repeat):
                fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / n_repeat)
    return 1000.0 * statistics.median(times)


# Verification bound (benchlib.check_close): `want` is the fp32 reference (rounded once where the
# op rounds once). The kernel and the reference sum squares in different orders, which can move a
# rounding by one ulp.
check = functools.partial(benchlib.check_close, ulps=2.0, rms_ulps=2.0)


# ---- cases ----


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str  # torch dtype name, e.g. "bfloat16"
    tokens: int
    hidden: int

    @property
    def label(self) -> str:
        return f"{self.op} {self.dtype} {self.tokens}x{self.hidden}"


def cases(quick: bool) -> list[Case]:
    """Every case of the sweep, in priority order: the README's rows, the other hidden sizes, the
    other token counts, then fp16. A time-budget cut removes the end of this list."""
    bf16, fp16 = "bfloat16", "float16"
    if quick:
        grid = [(bf16, t, h) for h in HEADLINE_HIDDEN for t in QUICK_TOKENS]
        return [Case(op, *g) for g in grid for op in (FWD, FUSED)] + [
            Case(BWD, bf16, t, 4096) for t in (64, 4096)
        ]
    ordered = [
        Case(op, bf16, t, h)
        for h in HEADLINE_HIDDEN
        for t in HEADLINE_TOKENS
        for op in (FWD, FUSED, BWD)
    ]
    other_hidden = [h for h in HIDDEN if h not in HEADLINE_HIDDEN]
    other_tokens = [t for t in TOKENS if t not in HEADLINE_TOKENS]
    tiers = [
        (bf16, other_hidden, HEADLINE_TOKENS),
        (bf16, HIDDEN, other_tokens),
        (fp16, HIDDEN, HEADLINE_TOKENS),
        (fp16, HIDDEN, other_tokens),
    ]
    for dtype, hiddens, tokens in tiers:
        ordered += [Case(op, dtype, t, h) for h in hiddens for t in tokens for op in (FWD, FUSED)]
    return ordered


def _bytes(case: Case, element: int) -> int:
    """Bytes each op must move (the weight and dweight have the input dtype here)."""
    matrix, vector = case.tokens * case.hidden * element, case.hidden * element
    if case.op == FWD:  # read x, w; write out
        return 2 * matrix + vector
    if case.op == FUSED:  # read x, residual, w; write x, residual
        return 4 * matrix + vector
    return 3 * matrix + 2 * vector  # read grad, x, w; write dinput, dweight


def run_forward(kernel, case: Case, dtype: torch.dtype) -> tuple[dict, dict, dict]:
    """rms_norm or fused_add_rms_norm: (GPU µs per contender, per-call µs at decode sizes, extra
    result fields)."""
    tag = f"{case.dtype}_{case.tokens}x{case.hidden}"
    x = torch.randn(case.tokens, case.hidden, dtype=dtype, device=DEVICE)
    w = (1 + 0.1 * torch.randn(case.hidden, device=DEVICE)).to(dtype)
    in_place = []  # buffers ours re-applies to while it is timed
    if case.op == FWD:
        out = torch.full_like(x, float("nan"))  # poisoned: an unwritten element fails the check
        kernel.rms_norm(out, x, w, EPS)
        check(case.label, out, reference_rms_norm(x, w, EPS))
        compiled_fn = benchlib.compiled(llama_rms_norm, tag)
        timed = {
            "ours": lambda: kernel.rms_norm(out, x, w, EPS),
            "eager": lambda: llama_rms_norm(x, w),
            "F.rms_norm": lambda: f_rms_norm(x, w),
            "compile": lambda: compiled_fn(x, w),
        }
    else:
        residual = torch.randn_like(x)
        want_out, want_residual = reference_fused_add_rms_norm(x, residual, w, EPS)
        x_in, residual_in = in_place = [x.clone(), residual.clone()]
        kernel.fused_add_rms_norm(x_in, residual_in, w, EPS)
        check(case.label, x_in, want_out)
        check(case.label + " residual", residual_in, want_residual, ulps=1.0, rms_ulps=0.0)
        compiled_fn = benchlib.compiled(add_llama_rms_norm, tag)
        # Ours re-applies to the same buffers: residual grows by about |w| per call until adding
        # x (|x| < 10) no longer changes it in the input dtype: it settles at 4096 in bf16 and
        # 32768 in fp16 (of 65504), so it stays finite; checked after the timing.
        timed = {
            "ours": lambda: kernel.fused_add_rms_norm(x_in, residual_in, w, EPS),
            "eager": lambda: add_llama_rms_norm(x, residual, w),
            "F.rms_norm": lambda: add_f_rms_norm(x, residual, w),
            "compile": lambda: compiled_fn(x, residual, w),
        }
    us = {k: benchlib.gpu_time_us(fn, rep_ms=REP_MS) for k, fn in timed.items()}
    wall = {}
    if case.tokens <= DECODE_MAX_TOKENS:
        # Decode sizes: a call costs its launch more than its GPU time; report what an eager
        # caller sees too (Python + dispatcher + launch; torch.compile adds its guards).
        wall = {
            k: benchlib.wall_time_us(timed[k], rep_ms=REP_MS)
            for k in ("ours", "F.rms_norm", "compile")
        }
    extra = (
        {"finite_after_timing": all(bool(torch.isfinite(b).all()) for b in in_place)}
        if in_place
        else {}
    )
    return us, wall, extra


def run_backward(kernel, case: Case, dtype: torch.dtype) -> tuple[dict, dict, dict]:
    """apply_rms_norm_backward: as run_forward (no per-call times)."""
    tag = f"bwd_{case.dtype}_{case.tokens}x{case.hidden}"
    x = torch.randn(case.tokens, case.hidden, dtype=dtype, device=DEVICE)
    w = (1 + 0.1 * torch.randn(case.hidden, device=DEVICE)).to(dtype)
    grad = torch.randn_like(x)
    dx, dw = kernel.apply_rms_norm_backward(grad, x, w, None, None, EPS)
    want_dx, want_dw = reference_rms_norm_backward(grad, x, w, EPS)
    check(case.label + " dinput", dx, want_dx)
    # dweight sums `tokens` products: compared as a whole (relative norm error <= 2 ulps).
    err = relative_error(dw, want_dw)
    if not err <= 2 * torch.finfo(dtype).eps:
        raise SystemExit(f"verification failed for {case.label} dweight: relative error {err}")
    del dx, dw, want_dx, want_dw

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    compiled_fn = benchlib.compiled(llama_rms_norm, tag)
    with torch.cuda.stream(stream):  # record the forwards on the stream the backward is timed on
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        outputs = {
            "eager": llama_rms_norm(xr, wr),
            "F.rms_norm": f_rms_norm(xr, wr),
            "compile": compiled_fn(xr, wr),
        }
    timed = {"ours": lambda: kernel.apply_rms_norm_backward(grad, x, w, None, None, EPS)}
    for name, y in outputs.items():
        timed[name] = lambda y=y: torch.autograd.grad(y, (xr, wr), grad, retain_graph=True)
    us = {k: graph_time_us_on(stream, fn) for k, fn in timed.items()}
    return us, {}, {}


def run_case(kernel, case: Case, l2_bytes: int | None) -> dict:
    dtype = getattr(torch, case.dtype)
    us, wall, extra = (run_backward if case.op == BWD else run_forward)(kernel, case, dtype)
    result = benchlib.timing_row(
        case, _bytes(case, torch.finfo(dtype).bits // 8), l2_bytes, us, wall, BASELINES
    )
    result.update(extra)
    return result


def _summary(r: dict) -> str:
    head = f"{r['op']:24s} {r['dtype']:8s} T={r['tokens']:6d} H={r['hidden']:5d}"
    line = benchlib.summary_line(head, r, BASELINES)
    if r.get("finite_after_timing") is False:
        line += "  WARNING: in-place buffers not finite after timing"
    return line


def parse_args(argv=None):
    parser = benchlib.sweep_arguments(
        __doc__.split("\n\n")[0], "bf16, hidden 4096/8192, 4 token counts", BUDGET_S
    )
    return parser.parse_args(argv)


def main():
    args = parse_args()
    order = {op: i for i, op in enumerate((FWD, FUSED, BWD))}
    benchlib.run_budgeted_sweep(
        kernel_name="rmsnorm",
        kernel_dir=KERNEL_DIR,
        start=_START,
        args=args,
        budget_s=BUDGET_S,
        cases=cases(args.quick),
        run_case=run_case,
        summary=_summary,
        sort_key=lambda r: (order[r["op"]], r["dtype"], r["hidden"], r["tokens"]),
        notes={"method": METHOD, "baselines": BASELINES_NOTE, "contenders": CONTENDERS},
    )


if __name__ == "__main__":
    main()
