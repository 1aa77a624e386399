"""The Hopper path of the CUDA attention forward (kernel_src/attention_sm90.h) on a device of
capability 9.0; skipped everywhere else, the CPU included.

- Which calls take it: the CUDA kernels a torch.profiler trace names (the Hopper kernel is
  attention::sm90::attn_fwd_sm90_kernel, stage 1's attn_fwd_kernel) for calls inside and
  outside the rule, and with ATTENTION_HOPPER=0 (read at every call).
- Its results against the float64 reference (attention_cases.py: within twice PyTorch's own error
  in the dtype), lse included: fp16 and bf16, head dims 64, 96, 128, 192 and 256, and 40, 80, 160
  and 224 between them, causal or not, GQA / MQA, odd lengths, fewer and more queries than keys
  (causal rows that see no key: out 0, lse +inf), batches of one and of several, strided views of
  packed tensors, sliding windows (one- and two-sided, narrower than a key block), softcap and
  ALiBi, varlen batches (empty sequences, key blocks that run into the next sequence's rows); out and lse start as NaN and out is a view into a wider NaN buffer, so an
  element left unwritten, or a column written past head_dim, fails.
- Determinism (the same bits on a rerun), and agreement with the stage-1 kernels on the same
  inputs (ATTENTION_HOPPER=0): each is within the bound of the reference, so
  they differ by at most twice the bound.
"""

import pytest
import torch
from attention_cases import (
    BF16,
    F16,
    F32,
    FLOOR,
    LSE_TOL,
    alibi_slopes,
    batch_check,
    cu_seqlens,
    dtype_id,
    nan_padded,
    packed_check,
    pytorch_attention,
    randn,
    ref_attention,
    untouched_past,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="the Hopper path runs on devices of capability 9.0",
)

HOPPER_KERNEL = "attn_fwd_sm90_kernel"
STAGE1_KERNEL = "attn_fwd_kernel"


def traced(call):
    """(call()'s result, the names of the CUDA kernels it launched, as the profiler shows them)."""
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        result = call()
        torch.cuda.synchronize()
    return result, {e.key for e in prof.key_averages()}


def path_of(names: set) -> str:
    """Which forward kernel ran, "hopper" or "stage1" (exactly one of them must have)."""
    hopper = any(HOPPER_KERNEL in n for n in names)
    stage1 = any(STAGE1_KERNEL in n for n in names)
    assert hopper != stage1, f"expected one forward kernel in the trace, got {sorted(names)}"
    return "hopper" if hopper else "stage1"


def attn_fwd(
    kernel, out, q, k, v, lse, causal, num_splits=0, window=(-1, -1), softcap=0.0, slopes=None
):
    """The out-param op on a fixed-length batch (no index tensor) at the default scale."""
    kernel.ops.attn_fwd(
        out, q, k, v, lse, None, None, None, None, None, None, slopes, 0, 0, q.shape[-1] ** -0.5,
        softcap, causal, window[0], window[1], num_splits,
    )  # fmt: skip


def qkv(b, sq, sk, h, hk, d, dtype, seed=0):
    return (
        randn((b, sq, h, d), dtype, "cuda", seed=seed + 1),
        randn((b, sk, hk, d), dtype, "cuda", seed=seed + 2),
        randn((b, sk, hk, d), dtype, "cuda", seed=seed + 3),
    )


# ---- (a) which calls take the Hopper path ----

# name -> (call on a kernel, expected path). Eligible: fp16 / bf16, head dim a multiple of 8 in
# 40..256 (36 is padded to 40 by the op), fixed length, num_splits 0 or 1, seqlen_q >= 64; any
# mask and score modifier.
B, S, H, HK = 2, 256, 8, 2


def _eligible(causal, dtype=BF16, d=128, sq=S, num_splits=0):
    def call(kernel):
        q, k, v = qkv(B, sq, S, H, HK, d, dtype)
        out = torch.empty_like(q)
        attn_fwd(kernel, out, q, k, v, None, causal, num_splits)

    return call


def _func(d=128, sq=S, alibi=False, **kwargs):
    def call(kernel):
        q, k, v = qkv(B, sq, S, H, HK, d, BF16)
        slopes = alibi_slopes(H, "cuda") if alibi else None
        kernel.flash_attn_func(q, k, v, alibi_slopes=slopes, **kwargs)

    return call


def _varlen(kernel):
    lens = [S, S]
    cu = cu_seqlens(lens, "cuda")
    q, k, v = (t.flatten(0, 1) for t in qkv(B, S, S, H, HK, 128, BF16))
    kernel.flash_attn_varlen_func(q, k, v, cu, cu, S, S, causal=True)


def _kvcache(kernel):
    q, k, v = qkv(B, S, S, H, HK, 128, BF16)
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    kernel.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True)


def _broadcast_kv(kernel):
    q, k, v = qkv(B, S, S, H, HK, 128, BF16)
    kernel.flash_attn_func(q, k[:1].expand_as(k), v[:1].expand_as(v), causal=True)


PATH_CASES = {
    "bf16_d128_gqa": (_eligible(False), "hopper"),
    "bf16_d128_gqa_causal": (_eligible(True), "hopper"),
    "fp16_d64_causal": (_eligible(True, dtype=F16, d=64), "hopper"),
    "seqlen_q_64": (_eligible(True, sq=64), "hopper"),
    "num_splits_1": (_eligible(False, num_splits=1), "hopper"),
    "flash_attn_func_causal": (_func(causal=True), "hopper"),
    "softcap": (_func(causal=True, softcap=5.0), "hopper"),
    "window": (_func(window_size=(32, 0)), "hopper"),
    "causal_window": (_func(causal=True, window_size=(32, -1)), "hopper"),
    "alibi": (_func(causal=True, alibi=True), "hopper"),
    "head_dim_96": (_func(causal=True, d=96), "hopper"),
    "head_dim_256": (_func(causal=True, d=256), "hopper"),
    "head_dim_80": (_func(causal=True, d=80), "hopper"),
    "head_dim_40": (_func(causal=True, d=40), "hopper"),
    "head_dim_32": (_func(causal=True, d=32), "stage1"),
    "head_dim_36": (_func(causal=True, d=36), "hopper"),
    "seqlen_q_1": (_func(sq=1), "stage1"),
    "seqlen_q_63": (_func(causal=True, sq=63), "stage1"),
    "num_splits_2": (_eligible(False, num_splits=2), "stage1"),
    "varlen": (_varlen, "hopper"),
    "kvcache_seqlens": (_kvcache, "stage1"),
    "broadcast_kv_batch": (_broadcast_kv, "stage1"),
}


@pytest.mark.parametrize("name", list(PATH_CASES))
def test_which_calls_take_the_hopper_path(kernel, name):
    call, expected = PATH_CASES[name]
    assert path_of(traced(lambda: call(kernel))[1]) == expected


# ---- (b) results against the reference ----

# (batch, len_q, len_k, heads_q, heads_kv, head_dim)
CASES = [
    (2, 256, 256, 8, 2, 128),  # GQA
    (1, 77, 1000, 4, 1, 64),  # MQA, fewer queries than keys, batch of one
    (2, 1300, 77, 4, 4, 128),  # more queries than keys: causal rows 0..1222 see no key
    (1, 1000, 1000, 6, 3, 64),
    (3, 64, 1300, 2, 1, 128),  # the shortest query length the rule admits
    (2, 129, 200, 2, 2, 64),  # one row past a 128-row tile, inside a 192-row one
    (1, 577, 600, 4, 2, 64),  # one row past three 192-row query tiles (head dim 64's tile)
    (2, 200, 1, 4, 2, 128),  # a single key
    (2, 300, 333, 4, 2, 96),  # 64-byte swizzle atoms
    (1, 200, 333, 4, 1, 192),  # one Q buffer, 112-key blocks
    (2, 300, 250, 2, 2, 256),  # one Q buffer, 80-key blocks
    (1, 400, 100, 2, 1, 256),  # one Q buffer, causal tiles without keys (Q freed at the end)
    # Head dims between the instances: the next one up, columns past the head dim zero-filled
    (2, 300, 333, 4, 2, 80),
    (1, 200, 200, 4, 1, 40),
    (1, 200, 333, 4, 2, 160),
    (2, 130, 150, 2, 2, 224),
]


def _case_id(c):
    return "b{}_q{}_k{}_h{}x{}_d{}".format(*c)


def _hopper_call(kernel, q, k, v, causal):
    """attn_fwd into NaN-filled out (a view with wider rows) and lse, asserting that the Hopper
    kernel ran -> (out, lse)."""
    b, sq, h, d = q.shape
    buf, out = nan_padded(q.shape, q.dtype, "cuda")
    lse = torch.full((b, h, sq), float("nan"), dtype=F32, device="cuda")
    _, names = traced(lambda: attn_fwd(kernel, out, q, k, v, lse, causal))
    assert path_of(names) == "hopper"
    untouched_past(buf, d, "Hopper out")
    return out, lse


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_hopper_against_reference(kernel, case, causal):
    b, sq, sk, h, hk, d = case
    for dtype in (F16, BF16):
        q, k, v = qkv(b, sq, sk, h, hk, d, dtype, seed=sum(case))
        out, lse = _hopper_call(kernel, q, k, v, causal)
        batch_check(out, q, k, v, lse, f"{dtype_id(dtype)} causal={causal}", causal=causal)


@pytest.mark.parametrize("d", [40, 64, 80, 96, 128, 192, 256])
def test_hopper_strided_views(kernel, d):
    """q, k, v unbound from packed tensors (qkv [B, S, 3, H, D], and kv [B, S, 2, H_kv, D] with q
    sliced out of a wider buffer), k / v as transposes of [B, H_kv, S, D] (transformers' layout)."""
    b, s, h, hk = 2, 333, 4, 2
    for dtype in (F16, BF16):
        packed = randn((b, s, 3, h, d), dtype, "cuda", seed=11)
        q, k, v = packed.unbind(2)
        out, lse = _hopper_call(kernel, q, k, v, True)
        batch_check(out, q, k, v, lse, f"{dtype_id(dtype)} qkv packed", causal=True)
        q = randn((b, s, h, 3 * d), dtype, "cuda", seed=12)[..., d : 2 * d]
        kv = randn((b, s + 50, 2, hk, d), dtype, "cuda", seed=13)
        for k, v in (
            kv.unbind(2),
            (
                randn((b, hk, s + 50, d), dtype, "cuda", seed=14).transpose(1, 2),
                randn((b, hk, s + 50, d), dtype, "cuda", seed=15).transpose(1, 2),
            ),
        ):
            assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
            out, lse = _hopper_call(kernel, q, k, v, False)
            batch_check(out, q, k, v, lse, f"{dtype_id(dtype)} strided")


# Masks and score modifiers: name -> (causal, window, softcap, ALiBi slopes per batch). Windows
# narrower than a key block, wider than the keys, one-sided, and both around the diagonal.
MODES = {
    "window": (False, (32, 8), 0.0, False),
    "window_left": (False, (100, -1), 0.0, False),
    "window_right": (False, (-1, 3), 0.0, False),
    "causal_window": (True, (200, -1), 0.0, False),
    "wide_window": (False, (5000, 5000), 0.0, False),
    "softcap": (True, (-1, -1), 2.0, False),
    "alibi": (False, (-1, -1), 0.0, True),
    "all": (True, (64, 0), 3.0, True),
}
MODE_CASES = [
    (2, 300, 333, 4, 2, 128),
    (1, 1000, 700, 4, 1, 64),  # more queries than keys: rows left of every window see no key
    (2, 200, 250, 2, 2, 256),
    (1, 130, 400, 4, 2, 80),
]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", MODE_CASES, ids=_case_id)
def test_hopper_masks_and_score_modifiers(kernel, case, mode):
    b, sq, sk, h, hk, d = case
    causal, window, softcap, alibi = MODES[mode]
    slopes = alibi_slopes(h, "cuda", batch=b) if alibi else None
    for dtype in (F16, BF16):
        q, k, v = qkv(b, sq, sk, h, hk, d, dtype, seed=sum(case))
        buf, out = nan_padded(q.shape, dtype, "cuda")
        lse = torch.full((b, h, sq), float("nan"), dtype=F32, device="cuda")
        call = lambda: attn_fwd(  # noqa: E731
            kernel, out, q, k, v, lse, causal, window=window, softcap=softcap, slopes=slopes
        )
        assert path_of(traced(call)[1]) == "hopper"
        untouched_past(buf, d, "Hopper out")
        batch_check(
            out,
            q,
            k,
            v,
            lse,
            f"{dtype_id(dtype)} {mode}",
            causal=causal,
            window=window,
            softcap=softcap,
            slopes=None if slopes is None else list(slopes.unbind(0)),
        )


# Varlen batches: (query lengths, key lengths, heads_q, heads_kv, head_dim). Empty query and key
# sequences, one shorter than a tile, lengths off the tiles, and a key block of each sequence that
# runs into the next one's rows (they must not count).
VARLEN_CASES = [
    ([300, 0, 64, 1, 513], [200, 50, 0, 700, 513], 4, 2, 128),
    ([129, 577, 3], [577, 129, 90], 4, 1, 64),
    ([250, 81], [333, 80], 2, 2, 256),
    ([200, 100, 170], [100, 200, 170], 4, 2, 80),
]


def _varlen_id(c):
    return "q{}_k{}_h{}x{}_d{}".format("-".join(map(str, c[0])), "-".join(map(str, c[1])), *c[2:])


@pytest.mark.parametrize("mode", ["plain", "causal", "window", "all"])
@pytest.mark.parametrize("case", VARLEN_CASES, ids=_varlen_id)
def test_hopper_varlen(kernel, case, mode):
    lens_q, lens_k, h, hk, d = case
    causal, window, softcap, alibi = {
        "plain": (False, (-1, -1), 0.0, False),
        "causal": (True, (-1, -1), 0.0, False),
        "window": (False, (48, 16), 0.0, False),
        "all": (True, (100, 0), 2.0, True),
    }[mode]
    batch = len(lens_q)
    cu_q, cu_k = cu_seqlens(lens_q, "cuda"), cu_seqlens(lens_k, "cuda")
    slopes = alibi_slopes(h, "cuda", batch=batch) if alibi else None
    for dtype in (F16, BF16):
        q = randn((sum(lens_q), h, d), dtype, "cuda", seed=1)
        k = randn((sum(lens_k), hk, d), dtype, "cuda", seed=2)
        v = randn((sum(lens_k), hk, d), dtype, "cuda", seed=3)
        buf, out = nan_padded(q.shape, dtype, "cuda")
        lse = torch.full((h, sum(lens_q)), float("nan"), dtype=F32, device="cuda")

        def call():
            kernel.ops.attn_fwd(
                out, q, k, v, lse, cu_q, cu_k, None, None, None, None, slopes, max(lens_q),
                max(lens_k), d**-0.5, softcap, causal, window[0], window[1], 0,
            )  # fmt: skip

        assert path_of(traced(call)[1]) == "hopper"
        untouched_past(buf, d, "Hopper varlen out")
        packed_check(
            out,
            q,
            k,
            v,
            lens_q,
            lens_k,
            f"{dtype_id(dtype)} varlen {mode}",
            lse,
            causal=causal,
            window=window,
            softcap=softcap,
            slopes=None if slopes is None else list(slopes.unbind(0)),
        )


def test_no_key_at_all(kernel):
    """seqlen_k = 0 (answered by the torch layer before either path): out 0, lse +inf."""
    q = randn((2, 100, 4, 128), BF16, "cuda")
    k = randn((2, 0, 2, 128), BF16, "cuda")
    for causal in (False, True):
        out, lse, _ = kernel.flash_attn_func(q, k, k, causal=causal, return_attn_probs=True)
        assert bool((out == 0).all()) and bool((lse == float("inf")).all())


# ---- (c) determinism ----


def test_hopper_is_deterministic(kernel):
    for causal in (False, True):
        q, k, v = qkv(2, 1000, 1300, 8, 2, 128, BF16, seed=21)
        first = _hopper_call(kernel, q, k, v, causal)
        for _ in range(2):
            again = _hopper_call(kernel, q, k, v, causal)
            assert all(torch.equal(a, b) for a, b in zip(first, again)), f"causal={causal}"


def test_hopper_in_a_cuda_graph(kernel):
    """Causal calls hand tiles out through a counter the op zeroes at every call: replays of a
    captured call (new inputs copied in) must give the eager results."""
    q, k, v = qkv(2, 1000, 1000, 8, 2, 128, BF16, seed=41)
    static = [t.clone() for t in (q, k, v)]
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graphs requires
        kernel.flash_attn_func(*static, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.flash_attn_func(*static, causal=True)
    for seed in (42, 43):
        fresh = qkv(2, 1000, 1000, 8, 2, 128, BF16, seed=seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, kernel.flash_attn_func(*fresh, causal=True)), f"seed {seed}"


# ---- (d) agreement with stage 1 ----

AGREE_CASES = [
    (2, 256, 256, 8, 2, 128, BF16, True),
    (1, 1300, 77, 4, 1, 64, F16, True),
    (2, 77, 1000, 4, 4, 128, F16, False),
]


def test_hopper_agrees_with_stage1(kernel, monkeypatch):
    """Both paths on the same inputs: with ATTENTION_HOPPER=0 (read at every call) the same call
    runs stage 1 (its trace names no Hopper kernel), and the outputs differ by at most twice the
    reference bound (each is within it), the lse by at most twice LSE_TOL (1 + |lse|)."""
    inputs, hopper, stage1 = [], [], []
    for b, sq, sk, h, hk, d, dtype, causal in AGREE_CASES:
        q, k, v = qkv(b, sq, sk, h, hk, d, dtype, seed=31)

        def call():
            return kernel.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)

        (out, lse, _), names = traced(call)
        assert path_of(names) == "hopper"
        hopper.append((out.cpu(), lse.cpu()))
        with monkeypatch.context() as m:
            m.setenv("ATTENTION_HOPPER", "0")
            (out, lse, _), names = traced(call)
        stage1.append((out.cpu(), lse.cpu(), names))
        inputs.append((q.cpu(), k.cpu(), v.cpu(), causal))
    for (q, k, v, causal), (out_h, lse_h), (out_s, lse_s, names) in zip(inputs, hopper, stage1):
        what = f"{dtype_id(q.dtype)} {tuple(q.shape)} causal={causal}"
        assert path_of(set(names)) == "stage1", what
        bound, ref_lse = 0.0, []
        for i in range(q.shape[0]):
            ref, rl = ref_attention(q[i], k[i], v[i], q.shape[-1] ** -0.5, causal)
            pt = pytorch_attention(
                q[i].cuda(), k[i].cuda(), v[i].cuda(), q.shape[-1] ** -0.5, causal
            )
            bound = max(bound, (pt.cpu().double() - ref).abs().max().item())
            ref_lse.append(rl)
        bound = 2 * (2 * bound + FLOOR * v.abs().max().item())
        diff = (out_h.double() - out_s.double()).abs().max().item()
        assert diff <= bound, f"{what}: paths differ by {diff:.3g} > {bound:.3g}"
        ref_lse = torch.stack(ref_lse)
        inf = torch.isinf(ref_lse)
        assert torch.equal(lse_h[inf], lse_s[inf]), f"{what}: rows without keys"
        tol = 2 * LSE_TOL * (1 + ref_lse[~inf].abs())
        lse_diff = (lse_h.double()[~inf] - lse_s.double()[~inf]).abs()
        assert bool((lse_diff <= tol).all()), f"{what}: lse differs by {lse_diff.max():.3g}"
