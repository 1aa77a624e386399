"""Run the attention ops on KV-cache index values out of range, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 9 python attention/tests/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python attention/tests/sanitize.py --small

Each bad call (a cache that a new key would overflow, paged or not, with and without appended
keys and over every split path; a paged varlen call whose seqused_k passes its block_table row;
a negative cache_seqlens or a rotary row out of range; a slot_mapping slot past the cache) must return without touching memory outside its tensors, leave the CUDA
context usable and make check_kvcache_errors raise an error naming the argument; each call at
exactly the capacity must raise nothing. The overflowing sequence is the last one and every
tensor is an exact-size allocation (PyTorch's caching allocator is switched off, so each tensor
is an allocation of its own): a read or write past a block-table row, a cache or a slot range
leaves its allocation, which memcheck reports. A few plain prefill calls follow (on an H100 / H200
the Hopper kernel's, for memcheck and racecheck), then backward calls on exact-size tensors,
with deterministic=True (the dQ pass) and False (dQ added with atomics into a workspace, then
converted). Not collected by pytest (no test_ prefix).
`--device cpu` runs the same calls on the CPU build, where each bad call raises at once.
`--small` leaves out the Llama-sized backward calls: racecheck checks every shared-memory access
and needs minutes for them, and the small GQA calls already run the same split-group code.
`--backward-only` runs the backward calls alone (a change to the backward kernels).
"""

import argparse
import itertools
import os
from pathlib import Path

# Before CUDA starts: every tensor its own cudaMalloc, so memcheck sees a tensor's exact end.
os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import kernels  # noqa: E402
import torch  # noqa: E402

B, HQ, HK, PAGE, PAGES = 3, 8, 2, 16, 2
ROWS = PAGE * PAGES  # rows per sequence: a cache row, or a block_table row of PAGES pages


def expect(k, device, name, call):
    """A bad call: raises naming `name` at once (CPU) or at check_kvcache_errors (CUDA)."""
    try:
        call()
        if device == "cuda":
            torch.cuda.synchronize()  # the context survives: no device assertion
            k.check_kvcache_errors()
    except RuntimeError as error:
        assert name in str(error), f"expected an error naming {name}, got: {error}"
        return
    raise AssertionError(f"no error naming {name}")


def fits(k, device, call):
    call()
    if device == "cuda":
        k.check_kvcache_errors()


def kvcache_calls(k, dtype, device):
    """flash_attn_with_kvcache, the last sequence exactly full (fits) or one row over."""
    for d in (64, 128):
        q = torch.randn(B, 1, HQ, d, dtype=dtype, device=device)
        for paged in (True, False):
            shape = (B * PAGES, PAGE, HK, d) if paged else (B, ROWS, HK, d)
            kc = torch.randn(shape, dtype=dtype, device=device)
            vc = torch.randn(shape, dtype=dtype, device=device)
            table = torch.arange(B * PAGES, dtype=torch.int32, device=device).view(B, PAGES)
            table = table if paged else None
            name = "block_table" if paged else "cache_seqlens"
            for new in (0, 1, 3):
                kn = torch.randn(B, new, HK, d, dtype=dtype, device=device) if new else None
                for splits in (0, 1, 4):
                    for over in (0, 1):
                        lens = torch.tensor(
                            [5, 17, ROWS - new + over], dtype=torch.int32, device=device
                        )

                        def call():
                            return k.flash_attn_with_kvcache(
                                q,
                                kc,
                                vc,
                                kn,
                                kn,
                                cache_seqlens=lens,
                                block_table=table,
                                causal=True,
                                num_splits=splits,
                            )

                        if over:
                            expect(k, device, name, call)
                        else:
                            fits(k, device, call)


def append_calls(k, dtype, device):
    """The append's other checks: cache_seqlens < 0, rotary tables too short. (A bad block id or
    cache_batch_idx is skipped by the append too, but the attention that follows trusts those
    values, as flash-attn does: no case here.)"""
    d = 64
    q = torch.randn(B, 1, HQ, d, dtype=dtype, device=device)
    kn = torch.randn(B, 1, HK, d, dtype=dtype, device=device)
    lens = torch.tensor([3, 4, PAGE + 2], dtype=torch.int32, device=device)
    dense = torch.randn(B, ROWS, HK, d, dtype=dtype, device=device)
    negative = torch.tensor([3, 4, -1], dtype=torch.int32, device=device)
    expect(
        k,
        device,
        "cache_seqlens",
        lambda: k.flash_attn_with_kvcache(q, dense, dense.clone(), kn, kn, cache_seqlens=negative),
    )
    cos = torch.ones(PAGE + 2, d // 4, dtype=dtype, device=device)  # row PAGE + 2 is needed
    expect(
        k,
        device,
        "rotary_cos",
        lambda: k.flash_attn_with_kvcache(
            q, dense, dense.clone(), kn, kn, cos, cos, cache_seqlens=lens, causal=True
        ),
    )


def varlen_calls(k, dtype, device):
    """flash_attn_varlen_func over a paged cache, seqused_k of the last sequence past its row."""
    d = 128
    q = torch.randn(B, HQ, d, dtype=dtype, device=device)
    cache = torch.randn(B * PAGES, PAGE, HK, d, dtype=dtype, device=device)
    table = torch.arange(B * PAGES, dtype=torch.int32, device=device).view(B, PAGES)
    cu_q = torch.arange(B + 1, dtype=torch.int32, device=device)
    for over in (0, 1):
        used = torch.tensor([5, 20, ROWS + over], dtype=torch.int32, device=device)

        def call():
            return k.flash_attn_varlen_func(
                q, cache, cache, cu_q, None, 1, ROWS + over, seqused_k=used, block_table=table
            )

        if over:
            expect(k, device, "block_table", call)
        else:
            fits(k, device, call)


def slot_calls(k, dtype, device):
    """reshape_and_cache(_flash) with the last token's slot just past the cache."""
    d, tokens = 64, 4
    key = torch.randn(tokens, HK, d, dtype=dtype, device=device)
    slots = B * PAGE
    for over in (0, 1):
        mapping = torch.tensor([0, 5, 17, slots - 1 + over], device=device)
        flash = torch.randn(B, PAGE, HK, d, dtype=dtype, device=device)
        split_key = torch.randn(B, HK, d // 8, PAGE, 8, dtype=dtype, device=device)
        split_value = torch.randn(B, HK, d, PAGE, dtype=dtype, device=device)
        calls = [
            lambda: k.reshape_and_cache_flash(key, key, flash, flash.clone(), mapping),
            lambda: k.reshape_and_cache(key, key, split_key, split_value, mapping),
        ]
        for call in calls:
            if over:
                expect(k, device, "slot_mapping", call)
            else:
                fits(k, device, call)


def prefill_calls(k, dtype, device):
    """Exact-size prefill calls, causal or not, with GQA and lengths off the tile sizes (on an
    H100 / H200 the Hopper kernel runs them: TMA loads past a tensor's end, the persistent tile
    hand-out, the epilogue staged in shared memory, head dims between the instances), plus fewer
    keys than queries, windows and score modifiers, and a varlen batch."""
    for sq, sk, d in (
        (77, 77, 64),
        (400, 333, 64),
        (200, 333, 128),
        (300, 130, 128),
        (150, 201, 96),
        (150, 201, 192),
        (150, 201, 256),
        (150, 201, 80),  # the 96 instance, columns past 80 zero-filled by TMA
        (130, 77, 40),  # the 64 instance
    ):
        q = torch.randn(2, sq, 4, d, dtype=dtype, device=device)
        kv = [torch.randn(2, sk, 2, d, dtype=dtype, device=device) for _ in range(2)]
        for causal in (False, True):
            k.flash_attn_func(q, *kv, causal=causal)
    # Windows (a band narrower than a key block, one side open), softcap and ALiBi
    q = torch.randn(2, 300, 4, 128, dtype=dtype, device=device)
    kv = [torch.randn(2, 333, 2, 128, dtype=dtype, device=device) for _ in range(2)]
    slopes = torch.rand(2, 4, dtype=torch.float32, device=device)
    k.flash_attn_func(q, *kv, window_size=(32, 8))
    k.flash_attn_func(q, *kv, window_size=(100, -1), softcap=2.0)
    k.flash_attn_func(q, *kv, causal=True, window_size=(64, 0), alibi_slopes=slopes)
    # Packed sequences: an empty one, and the last key block of the batch at the tensor's end
    lens_q, lens_k = [300, 0, 77, 130], [200, 50, 333, 130]
    cu_q, cu_k = (
        torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device=device)
        for n in (lens_q, lens_k)
    )
    q = torch.randn(sum(lens_q), 4, 128, dtype=dtype, device=device)
    kv = [torch.randn(sum(lens_k), 2, 128, dtype=dtype, device=device) for _ in range(2)]
    for causal in (False, True):
        k.flash_attn_varlen_func(q, *kv, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)


def backward_calls(k, dtype, device, deterministic, small):
    """Exact-size backward calls (dQ, dK, dV through autograd), causal, windowed or not, with
    GQA, every head-dim instance and lengths off the 64-row tiles, plus a varlen batch whose
    middle sequence has no keys (on capability 9.0 with atomics, the Hopper backward's): a row or
    key tile past a tensor's end leaves its allocation."""
    for sq, sk, d, window in (
        (77, 77, 32, (-1, -1)),
        (130, 200, 64, (-1, -1)),  # the Hopper backward's too
        (200, 130, 96, (40, 0)),  # Hopper: the 128 instance, zero-filled columns, a window
        (150, 130, 40, (-1, -1)),  # Hopper: the 64 instance
        (150, 201, 128, (-1, -1)),  # the Hopper backward's, on capability 9.0 with atomics
        (201, 150, 128, (64, 8)),  # the Hopper backward's, in a band
        (200, 130, 128, (-1, -1)),
        (130, 150, 256, (-1, -1)),  # two warps a key slab; Hopper: 64-key blocks, dQ atomics
        (70, 100, 192, (30, 5)),  # the 256 instance (both backwards), zero columns past 192
        (65, 80, 100, (-1, -1)),  # zero-padded copies of head dim 104
    ):
        q = torch.randn(2, sq, 4, d, dtype=dtype, device=device, requires_grad=True)
        kv = [
            torch.randn(2, sk, 2, d, dtype=dtype, device=device, requires_grad=True)
            for _ in range(2)
        ]
        for causal in (False, True):
            out = k.flash_attn_func(
                q, *kv, causal=causal, window_size=window, deterministic=deterministic
            )
            out.backward(torch.randn_like(out))
    if not small:
        # Llama's 32 / 8 heads, lengths off the tiles: on 114-132 SMs the Hopper backward keeps
        # each GQA group in one CTA without a mask and splits it in two with one (dK / dV partials).
        q = torch.randn(2, 1030, 32, 128, dtype=dtype, device=device, requires_grad=True)
        kv = [
            torch.randn(2, 1030, 8, 128, dtype=dtype, device=device, requires_grad=True)
            for _ in range(2)
        ]
        for causal in (False, True):
            out = k.flash_attn_func(q, *kv, causal=causal, deterministic=deterministic)
            out.backward(torch.randn_like(out))
    lens_q, lens_k = (70, 3, 129), (65, 0, 140)
    cu_q = torch.tensor([0, 70, 73, 202], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 65, 65, 205], dtype=torch.int32, device=device)
    for d in (64, 256):
        q = torch.randn(sum(lens_q), 4, d, dtype=dtype, device=device, requires_grad=True)
        kv = [
            torch.randn(sum(lens_k), 2, d, dtype=dtype, device=device, requires_grad=True)
            for _ in range(2)
        ]
        out = k.flash_attn_varlen_func(
            q, *kv, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, deterministic=deterministic
        )
        out.backward(torch.randn_like(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--small", action="store_true", help="no Llama-sized backward calls")
    parser.add_argument("--backward-only", action="store_true", help="the backward calls alone")
    args = parser.parse_args()
    k = kernels.get_local_kernel(
        Path(__file__).resolve().parent.parent / "build", backend=args.device
    )
    for dtype in (torch.bfloat16, torch.float16):
        forward = (kvcache_calls, append_calls, varlen_calls, slot_calls, prefill_calls)
        for run in () if args.backward_only else forward:
            run(k, dtype, args.device)
        # both schedules of the CUDA backward
        for deterministic in (True, False):
            backward_calls(k, dtype, args.device, deterministic, args.small)
    if args.device == "cuda":
        torch.cuda.synchronize()
        k.check_kvcache_errors()
    print(f"sanitize: all ops ran ({args.device})")


if __name__ == "__main__":
    main()
