"""Sweep of the attention backward against PyTorch's SDPA backends, same run (CUDA).

    python attention/benchmarks/sweep_bwd.py [--quick] [--out PATH] [--budget-s S] [--match TEXT]

Loads the built kernel (attention/build, kernels.get_local_kernel), checks each case's gradients
before timing it, then times two things per contender in the same process:

  bwd       torch.autograd.grad(out, (q, k, v), dout) of a forward run beforehand (the backward
            kernels alone: for ours dsum, dK/dV and dQ)
  fwd_bwd   the forward and that backward together (a training step's attention)

Contenders: ours (flash_attn_func on q [B, S, 32, D], k / v [B, S, 8, D] bf16, deterministic=False
as by default: on capability 9.0 the Hopper backward) and SDPA's flash,
cuDNN and memory-efficient backends on [B, H, S, D] copies, with enable_gqa=True, or with K/V
expanded to 32 heads beforehand where a backend rejects GQA (noted per row in gqa_mode). A backend
that rejects a shape is recorded as null with its error.

Sizes (issue 31): B * S = 16K tokens, S in {512, 2K, 8K, 16K}, head dims 128, 64, 256 (in that
order), causal and not, GQA 32/8. TFLOP/s count the backward as 2.5x the forward's FLOPs
(4 B H S^2 D, halved when causal) and fwd_bwd as 3.5x. Peak memory: what each contender allocates
beyond its inputs during one fwd_bwd, at S = 16K. --quick: head dim 128 at 2K and 16K.

Check before timing: the gradients of batch 0 for the query heads of KV head 0 (its group of 4),
against float32 autograd of the formula; each must be within twice the error of bf16 autograd of
the same formula plus 8 bf16 units of roundoff of the largest gradient (the bound of
tests/test_attention_bwd_ops.py).
Writes benchmarks/results/backward/<device>.json with device, versions and commit.
"""

from __future__ import annotations

import time

_START = time.perf_counter()  # the time budget counts imports too

import gc  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

KERNEL_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(KERNEL_DIR.parent / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import V_SCALE  # noqa: E402
from sweep import _peak_mib, sdpa, selected  # noqa: E402

import benchlib  # noqa: E402

DEVICE = "cuda"
TOKENS = 16384
SEQLENS = [2048, 16384, 8192, 512]  # the README's rows (2K, 16K) first
HEAD_DIMS = [128, 64, 256]
HEADS, KV_HEADS = 32, 8
REP_MS = 10
BUDGET_S = {"full": 360.0, "quick": 90.0}
BWD_FACTOR, FWD_BWD_FACTOR = 2.5, 3.5
UNIT_BF16 = 2.0**-8
STREAM = torch.cuda.Stream() if torch.cuda.is_available() else None

BASELINES = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient")
CONTENDERS = {
    "ours": "kernel.flash_attn_func(q, k, v, causal=...) on q [B, S, 32, D], k / v [B, S, 8, D], "
    "then torch.autograd.grad; deterministic=False (the default): the Hopper backward on "
    "capability 9.0 at head dims 64, 128 and 256, the mma.sync kernels with atomic dQ elsewhere",
    "sdpa_flash": "F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.FLASH_ATTENTION), [B, H, S, D]",
    "sdpa_cudnn": "F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.CUDNN_ATTENTION), [B, H, S, D]",
    "sdpa_efficient": "F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), [B, H, S, D]",
}
METHOD = (
    f"GPU time = median of 10 replays of a CUDA graph of back-to-back calls filling about {REP_MS} ms, "
    "captured on the stream the forwards ran on (autograd runs a backward on its forward's stream); bwd = torch.autograd.grad of a stored forward's output "
    "(retain_graph), fwd_bwd = forward + that backward; TFLOP/s: bwd = 2.5 x and fwd_bwd = 3.5 x the "
    "forward's 4 B H S^2 D (halved when causal); gradients checked before timing (module docstring); "
    "peak memory = torch.cuda.max_memory_allocated during one fwd_bwd minus the memory allocated "
    "before it, at S = 16K"
)


@dataclass(frozen=True)
class Case:
    batch: int
    seqlen: int
    head_dim: int
    causal: bool
    heads_q: int = HEADS
    heads_kv: int = KV_HEADS
    dtype: str = "bfloat16"

    @property
    def label(self) -> str:
        causal = " causal" if self.causal else ""
        return f"bwd B{self.batch} S{self.seqlen} H{self.heads_q}/{self.heads_kv} D{self.head_dim}{causal}"

    @property
    def fwd_flops(self) -> int:
        f = 4 * self.batch * self.heads_q * self.seqlen**2 * self.head_dim
        return f // 2 if self.causal else f


def cases(quick: bool) -> list[Case]:
    if quick:
        return [Case(TOKENS // s, s, 128, c) for s in (2048, 16384) for c in (True, False)]
    return [Case(TOKENS // s, s, d, c) for d in HEAD_DIMS for s in SEQLENS for c in (True, False)]


# ---- correctness before timing ----


def formula(q, k, v, causal):
    """[H, S, D] q over [H, S, D] k / v (already expanded), float math in q's dtype."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(
            torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf")
        )
    return torch.softmax(s, dim=-1) @ v


def group_grads(q, k, v, dout, causal, dtype):
    """Gradients for batch 0, KV head 0 and its query heads, by autograd of the formula in
    `dtype`: (dq [G, S, D], dk [S, D], dv [S, D]) in float32."""
    group = q.shape[2] // k.shape[2]
    qh = q[0, :, :group].transpose(0, 1).to(dtype).requires_grad_()
    kh = k[0, :, 0].to(dtype).requires_grad_()
    vh = v[0, :, 0].to(dtype).requires_grad_()
    out = formula(qh, kh.expand(group, -1, -1), vh.expand(group, -1, -1), causal)
    grads = torch.autograd.grad(out, (qh, kh, vh), dout[0, :, :group].transpose(0, 1).to(dtype))
    return [g.float() for g in grads]


def verify(case: Case, grads, q, k, v, dout):
    """grads: ours (dq, dk, dv) in the [B, S, H, D] layout."""
    group = case.heads_q // case.heads_kv
    mine = [
        grads[0][0, :, :group].transpose(0, 1).float(),
        grads[1][0, :, 0].float(),
        grads[2][0, :, 0].float(),
    ]
    ref = group_grads(q, k, v, dout, case.causal, torch.float32)
    low = group_grads(q, k, v, dout, case.causal, torch.bfloat16)
    errors = {}
    for name, m, r, b in zip(("dq", "dk", "dv"), mine, ref, low):
        err = (m - r).abs().max().item()
        bound = 2 * (b - r).abs().max().item() + 8 * UNIT_BF16 * r.abs().max().item()
        errors[name] = {"error": err, "bound": bound}
        if not err <= bound:
            raise SystemExit(
                f"verification failed for {case.label}: {name} error {err:.3g} > {bound:.3g}"
            )
    return errors


# ---- contenders ----


def inputs(case: Case):
    dtype = getattr(torch, case.dtype)
    b, s, d = case.batch, case.seqlen, case.head_dim
    q = torch.randn(b, s, case.heads_q, d, dtype=dtype, device=DEVICE)
    k = torch.randn(b, s, case.heads_kv, d, dtype=dtype, device=DEVICE)
    v = V_SCALE * torch.randn(b, s, case.heads_kv, d, dtype=dtype, device=DEVICE)
    dout = torch.randn(b, s, case.heads_q, d, dtype=dtype, device=DEVICE)
    return q, k, v, dout


def training_calls(forward, tensors, dout):
    """(bwd, fwd_bwd) closures for a forward over `tensors` (leaves that require grad)."""
    out = forward(*tensors)

    def bwd():
        return torch.autograd.grad(out, tensors, dout, retain_graph=True)

    def fwd_bwd():
        return torch.autograd.grad(forward(*tensors), tensors, dout)

    return bwd, fwd_bwd


def graph_time_us(fn) -> float:
    """Median GPU time of one call of `fn` in µs: 10 replays of a CUDA graph of back-to-back calls
    filling about REP_MS. Captured on STREAM, where every forward of this sweep runs: autograd runs
    a backward op on its forward's stream, so a capture on any other stream would not hold it."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    calls = max(1, min(500, round(REP_MS / (start.elapsed_time(end) / 3))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=STREAM):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(10):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(1000.0 * start.elapsed_time(end) / calls)
    del graph
    return statistics.median(times)


def _timed(fn):
    try:
        fn()  # a contender that rejects the shape raises here
    except RuntimeError as e:  # NotImplementedError included
        return None, str(e).splitlines()[0][:200]
    return graph_time_us(fn), None


def contender_calls(kernel, case: Case, q, k, v, dout):
    """{name: (bwd, fwd_bwd, gqa_mode)} for ours and each SDPA backend that takes the shape."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    calls = {
        "ours": (
            *training_calls(
                lambda q, k, v: kernel.flash_attn_func(q, k, v, causal=case.causal), leaves, dout
            ),
            "native",
        )
    }
    qt, kt, vt, dt = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
    group = case.heads_q // case.heads_kv
    for name in BASELINES:
        mode, kv = "enable_gqa", (kt, vt)
        try:
            sdpa(name, qt, kt, vt, case.causal, True)()
        except RuntimeError:  # the backend rejects GQA: K/V expanded to the query heads
            mode, kv = "expanded", (kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1))
        leaves = [t.detach().requires_grad_() for t in (qt, *kv)]
        gqa = mode == "enable_gqa"

        def forward(q, k, v, name=name, gqa=gqa):
            return sdpa(name, q, k, v, case.causal, gqa)()

        try:
            calls[name] = (*training_calls(forward, leaves, dt), mode)
        except RuntimeError as e:
            calls[name] = (None, None, f"unsupported: {str(e).splitlines()[0][:200]}")
    return calls


def run_case(kernel, case: Case) -> dict:
    with torch.cuda.stream(STREAM):
        return _run_case(kernel, case)


def _run_case(kernel, case: Case) -> dict:
    q, k, v, dout = inputs(case)
    calls = contender_calls(kernel, case, q, k, v, dout)
    errors, check = {}, None
    try:
        check = verify(case, calls["ours"][0](), q, k, v, dout)
    except NotImplementedError as e:
        errors["ours"] = str(e).splitlines()[0][:200]
    us = {"bwd": {}, "fwd_bwd": {}}
    peak = {}
    for name, (bwd, fwd_bwd, _) in calls.items():
        for kind, fn in (("bwd", bwd), ("fwd_bwd", fwd_bwd)):
            if fn is None or name in errors:
                us[kind][name] = None
                continue
            us[kind][name], err = _timed(fn)
            if err:
                errors[name] = err
        if case.seqlen == 16384 and fwd_bwd is not None and us["fwd_bwd"][name]:
            peak[name] = _peak_mib(fwd_bwd)
    flops = {"bwd": BWD_FACTOR * case.fwd_flops, "fwd_bwd": FWD_BWD_FACTOR * case.fwd_flops}
    r = {
        **asdict(case),
        "fwd_flops": case.fwd_flops,
        "us": us,
        "tflops": {
            kind: {n: (flops[kind] / (t * 1e-6) / 1e12 if t else None) for n, t in us[kind].items()}
            for kind in us
        },
        "peak_mib": peak,
        "gqa_mode": {n: c[2] for n, c in calls.items()},
        "check": check,
        "errors": errors,
    }
    for kind in us:
        mine = us[kind]["ours"]
        for name in BASELINES:
            t = us[kind].get(name)
            r.setdefault("speedup", {}).setdefault(kind, {})[name] = (
                t / mine if t and mine else None
            )
    return r


def _summary(r: dict) -> str:
    case = Case(**{k: r[k] for k in Case.__dataclass_fields__})
    mine = r["us"]["bwd"]["ours"]
    if mine is None:
        return f"{case.label:40s} ours: {r['errors'].get('ours', 'n/a')}"
    vs = "  ".join(f"{n} x{s:.2f}" if s else f"{n} -" for n, s in r["speedup"]["bwd"].items())
    return f"{case.label:40s} bwd {mine:9.1f} us {r['tflops']['bwd']['ours']:6.1f} TFLOP/s  {vs}"


def main():
    parser = benchlib.sweep_arguments(
        __doc__.split("\n\n")[0], "head dim 128 at 2K and 16K", BUDGET_S
    )
    parser.add_argument(
        "--match", action="append", default=[], help="keep the cases whose label contains this text"
    )
    args = parser.parse_args()
    budget = (
        args.budget_s if args.budget_s is not None else BUDGET_S["quick" if args.quick else "full"]
    )
    kernel = benchlib.load_built_kernel(KERNEL_DIR)
    env = benchlib.environment(kernel)
    todo = selected(cases(args.quick), args.match)
    results, skipped, spent = [], [], []
    for case in todo:
        elapsed = time.perf_counter() - _START
        estimate = 1.5 * statistics.median(spent[-5:]) if spent else 0.0
        if budget > 0 and elapsed + estimate > budget:
            skipped.append(case)
            continue
        began = time.perf_counter()
        r = run_case(kernel, case)
        gc.collect()
        torch.cuda.empty_cache()
        spent.append(time.perf_counter() - began)
        results.append(r)
        print(f"[{elapsed:5.0f} s] " + _summary(r), flush=True)
    if skipped:
        print(
            f"time budget of {budget:.0f} s reached: {len(skipped)} of {len(todo)} cases skipped",
            flush=True,
        )
    payload = {
        "kernel": "attention",
        "suite": "backward",
        "environment": env,
        "method": METHOD,
        "contenders": CONTENDERS,
        "budget_s": budget,
        "skipped": [asdict(c) for c in skipped],
        "wall_s": time.perf_counter() - _START,
        "results": results,
    }
    path = benchlib.result_path(args.out, KERNEL_DIR, env, subdir="backward")
    benchlib.save(path, payload)
    print(f"wrote {path} ({len(results)} cases, {payload['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
