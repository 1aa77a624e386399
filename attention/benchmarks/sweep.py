"""Sweep of the attention forward against PyTorch's SDPA backends, same run (CUDA).

    python attention/benchmarks/sweep.py [--quick] [--out PATH] [--budget-s S]

Loads the *built* kernel (attention/build, via kernels.get_local_kernel, as the other sweeps do),
measures the copy ceiling, checks each of our calls against a float32 reference on a sample of
query rows before timing it, then times ours and three baselines in the same process:

  workload   ours                                          baselines (same inputs, [B, H, S, D] copies)
  prefill    flash_attn_func(q, k, v, causal=...) on       F.scaled_dot_product_attention under
             q/k/v [B, S, 32, D] bf16                      sdpa_kernel(FLASH_ATTENTION) / (CUDNN_ATTENTION)
                                                           / (EFFICIENT_ATTENTION)
  decode     flash_attn_with_kvcache(q [B, 1, 32, 128],    the same three SDPA backends on the contiguous
             cache, cache_seqlens=L): contiguous cache     cache [B, 8, L, 128] with enable_gqa=True (if a
             [B, L, 8, 128], or paged [blocks, 16 | 256,   backend rejects GQA, with K/V expanded to 32
             8, 128] through a random block table          heads beforehand: noted per row in gqa_mode)

Sizes: prefill B * S = 16K tokens at S in {512, 2K, 8K, 16K}, 32 heads, head_dim {64, 128, 256,
192, 96}, causal and not, and causal at S in {2K, 16K} for head dims without an instance of their own
{80, 160, 40, 224} (CUDA runs the next instantiated head dim, 96 / 192 / 64 / 256; their TFLOP/s
count the actual head dim); a varlen prefill of 12 packed sequences of 128 to 4096 tokens (16K in
all, head_dim 128, causal and not) through flash_attn_varlen_func, against PyTorch's FlashAttention-2
varlen op and SDPA cuDNN / efficient on nested (jagged) tensors (non-causal only); decode GQA 32/8 head_dim 128, KV length {1K, 4K, 16K, 32K} x batch {1,
8, 64} x {contiguous, paged 16, paged 256} (the baselines are timed once per batch and length, on
the contiguous cache). Reported: time, TFLOP/s (prefill: 4 B H S^2 D, halved when causal), KV GB/s
and % of the copy ceiling (decode: bytes of K and V read), and at S = 16K the peak memory each
contender allocates beyond its inputs. A backend that rejects a shape (cuDNN at head_dim 256, for
instance) is recorded as null. --quick: prefill head_dim 128 at 2K and 16K, decode batch {1, 64} at
32K (contiguous and paged 16). Cases run in priority order (the README's rows first, then the head
dims between the instances) and the sweep starts no new case once --budget-s, counted from process
start, would be exceeded (skipped cases are listed in the result file; --budget-s 0 runs them all);
--match TEXT keeps only the cases whose label contains TEXT.
Writes benchmarks/results/<device>.json with device, versions and commit (scripts/benchlib.py).
"""

from __future__ import annotations

import time

_START = time.perf_counter()  # the time budget counts imports too

import gc  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

KERNEL_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(KERNEL_DIR.parent / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import V_SCALE  # noqa: E402

import benchlib  # noqa: E402

DEVICE = "cuda"
PREFILL_TOKENS = 16384
PREFILL_SEQLENS = [512, 2048, 8192, 16384]
PREFILL_HEAD_DIMS = [64, 128, 256, 192, 96]  # 192 and 96 last: the grid first
# Head dims between the instances (each runs the next instantiated one), causal prefill only.
BETWEEN_HEAD_DIMS = [80, 160, 40, 224]
BETWEEN_SEQLENS = [2048, 16384]
HEADS = 32
# A varlen prefill: packed sequences of mixed lengths, 16K tokens in all (head dim 128).
VARLEN_LENGTHS = (4096, 3000, 2048, 1800, 1536, 1024, 900, 700, 512, 400, 240, 128)
DECODE_HEADS, DECODE_KV_HEADS, DECODE_HEAD_DIM = 32, 8, 128
DECODE_KV = [1024, 4096, 16384, 32768]
DECODE_BATCH = [1, 8, 64]
LAYOUTS = ["contiguous", "paged16", "paged256"]
# The README's rows (scripts/bench_table.py ROW_FILTERS["attention"]), measured first.
HEADLINE_HEAD_DIM = 128
HEADLINE_DECODE = [(1, 4096), (1, 32768), (8, 4096), (64, 4096), (64, 32768)]
HEADLINE_LAYOUTS = ["contiguous", "paged16"]
REP_MS = 10
BUDGET_S = {"full": 300.0, "quick": 90.0}
SAMPLE_ROWS = 256  # query rows checked against the reference per case

BASELINES = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient")
CONTENDERS = {
    "ours": "prefill: kernel.flash_attn_func(q, k, v, causal=...) on [B, S, H, D]; decode: "
    "kernel.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., block_table=...)",
    "ours_stage1": "prefill on capability 9.0 only: the same call with ATTENTION_HOPPER=0 (the sm_80+ "
    "kernel where the Hopper kernel would run)",
    "ours (varlen)": "kernel.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max, max, causal=...) on "
    "packed [total, H, D]; there sdpa_flash is aten._flash_attention_forward with the cumulative lengths "
    "(FlashAttention-2 varlen), sdpa_cudnn / sdpa_efficient SDPA on nested (jagged) tensors (non-causal only)",
    "sdpa_flash": "F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.FLASH_ATTENTION), [B, H, S, D]",
    "sdpa_cudnn": "F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.CUDNN_ATTENTION), [B, H, S, D]",
    "sdpa_efficient": "F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), [B, H, S, D]",
}
METHOD = (
    f"GPU time = median of 10 CUDA-graph replays, each of back-to-back calls filling about {REP_MS} ms "
    "(triton do_bench_cudagraph); prefill FLOPs = 4 B H S^2 D (varlen: 4 H D times the sum of each "
    "sequence's length squared), halved when causal; decode bytes = K and V "
    "read once (2 B L H_kv D x 2 bytes), % of copy against a 1 GiB device-to-device copy (best of before and "
    "after the sweep, same run); every contender's TFLOP/s and GB/s use those counts; each of our results is "
    f"checked on {SAMPLE_ROWS} sampled query rows against a float32 reference before timing (max error at most "
    "twice SDPA flash's, or 2**-7 of max |v| without it); peak memory = torch.cuda.max_memory_allocated during "
    "one call minus the memory allocated before it (inputs excluded), at S = 16K"
)
BASELINES_NOTE = (
    "PyTorch's SDPA flash (FlashAttention-2), cuDNN and memory-efficient backends, each forced with "
    "torch.nn.attention.sdpa_kernel, on contiguous [B, H, S, D] copies of the same inputs; decode baselines "
    "read the contiguous cache (SDPA has no paged form); varlen: SDPA flash is PyTorch's FlashAttention-2 "
    "varlen op on the packed rows, cuDNN and memory-efficient take nested (jagged) tensors, null where "
    "the backend rejects the call or a CUDA graph cannot hold it"
)


@dataclass(frozen=True)
class Case:
    op: str  # "prefill" | "varlen" | "decode"
    dtype: str
    batch: int  # varlen: sequences
    seqlen: int  # prefill: S; varlen: the longest sequence; decode: the KV length
    head_dim: int
    heads_q: int
    heads_kv: int
    causal: bool = True
    layout: str = "contiguous"  # decode: contiguous | paged16 | paged256
    lengths: tuple = ()  # varlen: each sequence's length

    @property
    def label(self) -> str:
        causal = " causal" if self.causal else ""
        if self.op == "prefill":
            return f"prefill B{self.batch} S{self.seqlen} H{self.heads_q} D{self.head_dim}{causal}"
        if self.op == "varlen":
            return f"varlen {self.batch} seqs {sum(self.lengths)} tokens H{self.heads_q} D{self.head_dim}{causal}"
        return f"decode B{self.batch} KV{self.seqlen} H{self.heads_q}/{self.heads_kv} D{self.head_dim} {self.layout}"


def _prefill(s, d, causal):
    return Case("prefill", "bfloat16", PREFILL_TOKENS // s, s, d, HEADS, HEADS, causal)


def _varlen(causal):
    n, d = len(VARLEN_LENGTHS), HEADLINE_HEAD_DIM
    return Case(
        "varlen",
        "bfloat16",
        n,
        max(VARLEN_LENGTHS),
        d,
        HEADS,
        HEADS,
        causal,
        lengths=VARLEN_LENGTHS,
    )


def _decode(b, kv, layout):
    return Case(
        "decode", "bfloat16", b, kv, DECODE_HEAD_DIM, DECODE_HEADS, DECODE_KV_HEADS, True, layout
    )


def cases(quick: bool) -> list[Case]:
    """Every case, in priority order: the README's rows (prefill head_dim 128, decode batch 1 / 64 at
    4K / 32K and batch 8 at 4K, contiguous and paged 16, the varlen batch), the head dims between
    the instances, then the rest of the grid. A time-budget cut removes the end."""
    if quick:
        return [_prefill(s, HEADLINE_HEAD_DIM, True) for s in (2048, 16384)] + [
            _decode(b, 32768, lay) for b in (1, 64) for lay in HEADLINE_LAYOUTS
        ]
    ordered = [_prefill(s, HEADLINE_HEAD_DIM, c) for c in (True, False) for s in PREFILL_SEQLENS]
    ordered += [_decode(b, kv, lay) for b, kv in HEADLINE_DECODE for lay in HEADLINE_LAYOUTS]
    ordered += [_varlen(c) for c in (True, False)]
    ordered += [_prefill(s, d, True) for d in BETWEEN_HEAD_DIMS for s in BETWEEN_SEQLENS]
    ordered += [
        _prefill(s, d, c)
        for d in PREFILL_HEAD_DIMS
        if d != HEADLINE_HEAD_DIM
        for c in (True, False)
        for s in PREFILL_SEQLENS
    ]
    ordered += [
        _decode(b, kv, lay)
        for b in DECODE_BATCH
        for kv in DECODE_KV
        for lay in LAYOUTS
        if not ((b, kv) in HEADLINE_DECODE and lay in HEADLINE_LAYOUTS)
    ]
    return ordered


def selected(todo: list[Case], match: list[str]) -> list[Case]:
    """The cases whose label (with a trailing space, so ' D96 ' also matches a non-causal label)
    contains any of `match`; all of them when `match` is empty."""
    return [c for c in todo if not match or any(m in c.label + " " for m in match)]


def flops(case: Case) -> int:
    if case.op == "decode":
        return (
            4 * case.batch * case.heads_q * case.seqlen * case.head_dim
        )  # one query row per sequence
    squares = (
        sum(n * n for n in case.lengths) if case.op == "varlen" else case.batch * case.seqlen**2
    )
    f = 4 * case.heads_q * squares * case.head_dim
    return f // 2 if case.causal else f


def kv_bytes(case: Case) -> int:
    rows = sum(case.lengths) if case.op == "varlen" else case.batch * case.seqlen
    return 2 * rows * case.heads_kv * case.head_dim * 2


# ---- correctness before timing ----


def reference_rows(q, k, v, rows, causal):
    """float32 attention of query rows `rows` of q [S_q, H, D] over k / v [S_k, H_kv, D]."""
    sq, h, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    group = h // hk
    qs = q[rows].float()  # [R, H, D]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("rhd,jhd->hrj", qs, kf) * d**-0.5
    if causal:
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > rows[:, None] + sk - sq, float("-inf"))
    return torch.einsum("hrj,jhd->rhd", torch.softmax(s, dim=-1), vf)


def verify(label, ours, flash, q, k, v, causal):
    """ours / flash: [S_q, H, D] outputs of one sequence (flash may be None)."""
    rows = torch.unique(
        torch.cat(
            [
                torch.arange(min(SAMPLE_ROWS // 2, q.shape[0]), device=q.device),
                torch.randint(0, q.shape[0], (SAMPLE_ROWS // 2,), device=q.device),
            ]
        )
    )
    ref = reference_rows(q, k, v, rows, causal)
    err = (ours[rows].float() - ref).abs().max().item()
    vmax = v.float().abs().max().item()
    if flash is not None:
        err_flash = (flash[rows].float() - ref).abs().max().item()
        bound = 2 * err_flash + 2.0**-20 * vmax
    else:
        bound = 2.0**-7 * vmax
    if not err <= bound:
        raise SystemExit(
            f"verification failed for {label}: max error {err:.3g} > bound {bound:.3g}"
        )


# ---- contenders ----


def sdpa(backend_name: str, q, k, v, causal, gqa):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "sdpa_flash": SDPBackend.FLASH_ATTENTION,
        "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    }[backend_name]

    def call():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return call


def _timed(fn):
    try:
        fn()  # a backend that rejects the shape raises here
    except RuntimeError as e:
        return None, str(e).splitlines()[0][:200]
    return benchlib.gpu_time_us(fn, rep_ms=REP_MS), None


def _timed_all(calls: dict, graph_may_fail=()) -> dict:
    """{"us": each call's time or None, "unsupported": why, for those that rejected the shape}.
    A call named in graph_may_fail (SDPA on nested tensors: cuDNN's cannot be captured) whose
    CUDA graph fails is timed by plain back-to-back launches instead (benchlib.wall_time_us:
    its launch overhead hides behind the GPU time of calls this long) and listed under
    "timed_without_graph", or null if that fails too; any other call that fails there stops the
    sweep."""
    us, errors, eager = {}, {}, []
    for name, fn in calls.items():
        try:
            us[name], err = _timed(fn)
        except Exception as e:  # noqa: BLE001 (capture errors are not all RuntimeErrors)
            if name not in graph_may_fail:
                raise
            us[name], err = _timed_without_graph(fn, e)
            if us[name] is not None:
                eager.append(name)
        if err:
            errors[name] = err
    result = {"us": us}
    if errors:
        result["unsupported"] = errors
    if eager:
        result["timed_without_graph"] = eager
    return result


def _timed_without_graph(fn, capture_error):
    """(µs, None) by plain launches after a failed graph capture, or (None, both errors)."""
    why = f"{type(capture_error).__name__}: {str(capture_error).splitlines()[0][:200]}"
    try:
        torch.cuda.synchronize()
        return benchlib.wall_time_us(fn, rep_ms=REP_MS), None
    except Exception as e:  # noqa: BLE001
        return None, f"{why}; without a graph: {type(e).__name__}: {str(e).splitlines()[0][:200]}"


def _peak_mib(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


def _stage1(fn):
    """fn with ATTENTION_HOPPER=0 while it runs (the op reads it at every call, so a CUDA graph
    captured inside holds the stage-1 kernel)."""

    def call():
        before = os.environ.get("ATTENTION_HOPPER")
        os.environ["ATTENTION_HOPPER"] = "0"
        try:
            return fn()
        finally:
            if before is None:
                del os.environ["ATTENTION_HOPPER"]
            else:
                os.environ["ATTENTION_HOPPER"] = before

    return call


def run_prefill(kernel, case: Case) -> dict:
    dtype = getattr(torch, case.dtype)
    shape = (case.batch, case.seqlen, case.heads_q, case.head_dim)
    q = torch.randn(shape, dtype=dtype, device=DEVICE)
    k = torch.randn(shape, dtype=dtype, device=DEVICE)
    v = V_SCALE * torch.randn(shape, dtype=dtype, device=DEVICE)
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    ours = lambda: kernel.flash_attn_func(q, k, v, causal=case.causal)  # noqa: E731
    calls = {"ours": ours}
    if torch.cuda.get_device_capability() == (9, 0):
        calls["ours_stage1"] = _stage1(ours)
    calls.update({name: sdpa(name, qt, kt, vt, case.causal, False) for name in BASELINES})
    out = ours()
    try:
        flash = calls["sdpa_flash"]()[0].transpose(0, 1)
    except RuntimeError:
        flash = None
    verify(case.label, out[0], flash, q[0], k[0], v[0], case.causal)
    del out, flash
    result = _timed_all(calls)
    us = result["us"]
    if case.seqlen == PREFILL_TOKENS:
        result["peak_mib"] = {
            name: (_peak_mib(fn) if us[name] is not None else None) for name, fn in calls.items()
        }
    return result


def run_varlen(kernel, case: Case) -> dict:
    """Packed sequences through flash_attn_varlen_func. Baselines on the same packed rows:
    sdpa_flash is PyTorch's FlashAttention-2 varlen op (aten._flash_attention_forward with
    cumulative lengths, what SDPA runs for nested tensors); cuDNN and memory-efficient take the
    sequences as nested (jagged) tensors [B, H, j, D], which SDPA accepts without a causal mask
    only. A backend that rejects the call, or whose call a CUDA graph cannot hold, is null."""
    dtype = getattr(torch, case.dtype)
    lens = list(case.lengths)
    offsets = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEVICE)
    cu = offsets.to(torch.int32)
    total, longest = sum(lens), max(lens)
    shape = (total, case.heads_q, case.head_dim)
    q = torch.randn(shape, dtype=dtype, device=DEVICE)
    k = torch.randn(shape, dtype=dtype, device=DEVICE)
    v = V_SCALE * torch.randn(shape, dtype=dtype, device=DEVICE)
    ours = lambda: kernel.flash_attn_varlen_func(  # noqa: E731
        q, k, v, cu, cu, longest, longest, causal=case.causal
    )
    calls = {"ours": ours}
    if torch.cuda.get_device_capability() == (9, 0):
        calls["ours_stage1"] = _stage1(ours)

    def flash_varlen():
        return torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, longest, longest, 0.0, case.causal, False
        )[0]

    nested = [
        torch.nested.nested_tensor_from_jagged(t, offsets, max_seqlen=longest).transpose(1, 2)
        for t in (q, k, v)
    ]
    calls["sdpa_flash"] = flash_varlen
    calls.update({name: sdpa(name, *nested, case.causal, False) for name in BASELINES[1:]})
    out = ours()
    try:
        flash = flash_varlen()
    except RuntimeError:
        flash = None
    for i in (0, len(lens) - 1):  # the longest sequence and the shortest
        rows = slice(int(offsets[i]), int(offsets[i + 1]))
        theirs = None if flash is None else flash[rows]
        verify(
            f"{case.label}, sequence {i}",
            out[rows],
            theirs,
            q[rows],
            k[rows],
            v[rows],
            case.causal,
        )
    del out, flash
    return _timed_all(calls, graph_may_fail=BASELINES[1:])


def _paged(k, v, block_size):
    b, L, hk, d = k.shape
    per_seq = L // block_size
    perm = torch.randperm(b * per_seq, device=k.device)
    table = perm.view(b, per_seq).to(torch.int32)
    kc = torch.empty((b * per_seq, block_size, hk, d), dtype=k.dtype, device=k.device)
    vc = torch.empty_like(kc)
    kc[perm] = k.reshape(b * per_seq, block_size, hk, d)
    vc[perm] = v.reshape(b * per_seq, block_size, hk, d)
    return kc, vc, table


_DECODE_BASELINES: dict = {}


def run_decode(kernel, case: Case) -> dict:
    dtype = getattr(torch, case.dtype)
    b, L = case.batch, case.seqlen
    q = torch.randn((b, 1, case.heads_q, case.head_dim), dtype=dtype, device=DEVICE)
    k = torch.randn((b, L, case.heads_kv, case.head_dim), dtype=dtype, device=DEVICE)
    v = V_SCALE * torch.randn((b, L, case.heads_kv, case.head_dim), dtype=dtype, device=DEVICE)
    seqlens = torch.full((b,), L, dtype=torch.int32, device=DEVICE)
    table = None
    k_cache, v_cache = k, v
    if case.layout != "contiguous":
        k_cache, v_cache, table = _paged(k, v, int(case.layout.removeprefix("paged")))
    ours = lambda: kernel.flash_attn_with_kvcache(  # noqa: E731
        q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=True
    )
    out = ours()
    verify(case.label, out[0], None, q[0], k[0], v[0], True)
    del out
    us = {"ours": _timed(ours)[0]}
    key = (b, L)
    if key not in _DECODE_BASELINES:
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        timings, modes = {}, {}
        for name in BASELINES:
            t, err = _timed(sdpa(name, qt, kt, vt, False, True))
            modes[name] = "enable_gqa"
            if t is None:  # the backend rejects GQA: K/V expanded to the query heads beforehand
                group = case.heads_q // case.heads_kv
                expanded = 2 * group * kt.numel() * kt.element_size()
                if expanded > 0.4 * torch.cuda.mem_get_info()[0]:
                    modes[name] = (
                        f"unsupported: {err}; K/V expanded to {case.heads_q} heads would not fit"
                    )
                else:
                    ke, ve = kt.repeat_interleave(group, dim=1), vt.repeat_interleave(group, dim=1)
                    t, err = _timed(sdpa(name, qt, ke, ve, False, False))
                    modes[name] = "expanded" if t is not None else f"unsupported: {err}"
                    del ke, ve
            timings[name] = t
        _DECODE_BASELINES[key] = (timings, modes)
        del qt, kt, vt
    timings, modes = _DECODE_BASELINES[key]
    us.update(timings)
    return {"us": us, "gqa_mode": modes}


def run_case(kernel, case: Case, copy_gbs: float) -> dict:
    run = {"prefill": run_prefill, "varlen": run_varlen, "decode": run_decode}[case.op]
    result = run(kernel, case)
    us = result.pop("us")
    f, nbytes = flops(case), kv_bytes(case)
    r = {
        **asdict(case),
        "flops": f,
        "bytes": nbytes,
        "us": us,
        "tflops": {k: (f / (t * 1e-6) / 1e12 if t else None) for k, t in us.items()},
        "gbs": {k: (nbytes / (t * 1e-6) / 1e9 if t else None) for k, t in us.items()},
        **result,
    }
    for name in BASELINES + ("ours_stage1",):
        if name in us:
            r[f"speedup_vs_{name}"] = us[name] / us["ours"] if us[name] and us["ours"] else None
    r["copy_fraction"] = (
        r["gbs"]["ours"] / copy_gbs if case.op == "decode" and r["gbs"]["ours"] else None
    )
    return r


def _summary(r: dict) -> str:
    us = r["us"]["ours"]
    rate = (
        f"{r['tflops']['ours']:7.1f} TFLOP/s"
        if r["op"] != "decode"
        else (f"{r['gbs']['ours']:6.0f} GB/s ({100 * r['copy_fraction']:5.1f}% copy)")
    )
    vs = "  ".join(
        f"{n} x{r[f'speedup_vs_{n}']:.2f}" if r.get(f"speedup_vs_{n}") else f"{n} -"
        for n in BASELINES + ("ours_stage1",)
        if f"speedup_vs_{n}" in r
    )
    return f"{Case(**{k: r[k] for k in Case.__dataclass_fields__}).label:48s} {us:10.1f} us {rate}  {vs}"


def parse_args(argv=None):
    parser = benchlib.sweep_arguments(
        __doc__.split("\n\n")[0], "prefill D128 at 2K / 16K, decode B1 / B64 at 32K", BUDGET_S
    )
    parser.add_argument(
        "--match",
        action="append",
        default=[],
        help="run only the cases whose label contains this text (repeatable; any match), e.g. "
        "--match ' D96 ' --match 'S512 '",
    )
    return parser.parse_args(argv)


def main():
    # The loop of benchlib.run_budgeted_sweep, kept here because that function cannot express three
    # things this sweep does: only decode rows have a copy_fraction (it sets one on every row, and
    # scripts/bench_table.py shows a "% of copy" wherever one is set), the payload has no l2_bytes,
    # and the caching allocator is emptied after each case.
    args = parse_args()
    budget = (
        args.budget_s if args.budget_s is not None else BUDGET_S["quick" if args.quick else "full"]
    )
    kernel = benchlib.load_built_kernel(KERNEL_DIR)
    env = benchlib.environment(kernel)
    copy_gbs = benchlib.copy_bandwidth_gbs()
    print(f"{env['device']}: copy ceiling {copy_gbs:.0f} GB/s", flush=True)

    todo = selected(cases(args.quick), args.match)
    results, skipped, spent = [], [], {}
    gc.collect()
    gc.freeze()
    for case in todo:
        elapsed = time.perf_counter() - _START
        past = spent.get(case.op, [])[-5:]
        estimate = 1.5 * statistics.median(past) if past else 0.0
        if budget > 0 and elapsed + estimate > budget:
            skipped.append(case)
            continue
        began = time.perf_counter()
        r = run_case(kernel, case, copy_gbs)
        gc.collect()
        gc.freeze()
        torch.cuda.empty_cache()
        spent.setdefault(case.op, []).append(time.perf_counter() - began)
        results.append(r)
        print(f"[{elapsed:5.0f} s] " + _summary(r), flush=True)
    if skipped:
        print(
            f"time budget of {budget:.0f} s reached: {len(skipped)} of {len(todo)} cases skipped "
            f"(listed in the result file; --budget-s 0 runs them all)",
            flush=True,
        )
    # Recomputes copy_fraction against the best ceiling on the rows given: the decode rows only.
    copy_gbs = benchlib.final_copy_ceiling(
        [r for r in results if r["op"] == "decode" and r["gbs"]["ours"]], copy_gbs
    )
    order = {"prefill": 0, "varlen": 1, "decode": 2}
    results.sort(
        key=lambda r: (
            order[r["op"]],
            r["head_dim"],
            not r["causal"],
            r["layout"],
            r["batch"],
            r["seqlen"],
        )
    )
    payload = {
        "kernel": "attention",
        "environment": env,
        "method": METHOD,
        "baselines": BASELINES_NOTE,
        "contenders": CONTENDERS,
        "copy_gbs": copy_gbs,
        "budget_s": budget,
        "skipped": [asdict(c) for c in skipped],
        "wall_s": time.perf_counter() - _START,
        "results": results,
    }
    path = benchlib.result_path(args.out, KERNEL_DIR, env)
    benchlib.save(path, payload)
    print(f"wrote {path} ({len(results)} cases, {payload['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
