"""Run every rope op of the built kernel, forward and backward, on awkward shapes, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 9 python rope/tests/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python rope/tests/sanitize.py

Shapes cover head sizes that are not a multiple of any vector width (6, 34, 80) next to the real
ones (64, 128, 256), partial rotary, NeoX and GPT-J pairs, half and per-channel (per-head) tables
in fp32 and in the activation dtype, every row mode (positions int64/int32, sequence offsets,
varlen with an empty sequence), one token, 4097 tokens and no token; each in float32, float16
and bfloat16. Written tensors are exact-size allocations or views whose buffer ends where the
view ends (the key of a fused [q | v | k] buffer is its last columns), and tables and positions
are exact-size, so memcheck reports any access past a row, a table or a tensor. Not collected by
pytest (no test_ prefix). `--device cpu` runs the same calls on the CPU build (a quick check that
the script itself works).
"""

import argparse
from pathlib import Path

import kernels
import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HQ, HK = 4, 2
# (head_size, rot_dim)
HEADS = [(6, 6), (34, 34), (34, 18), (64, 64), (80, 32), (128, 128), (128, 64), (256, 256)]
TOKENS = [0, 1, 7, 300, 4097]


def cos_sin(rows, width, dtype, device):
    theta = torch.rand(rows, width, device=device) * 6.3
    return theta.cos().to(dtype), theta.sin().to(dtype)


def qk_layouts(tokens, d, dtype, device):
    """(q, k, positions shape) in the layouts vLLM passes: exact [T, H * D] tensors; column
    views of a fused [q | v | k] buffer (k ends where the buffer ends); [B, S, H, D]."""
    yield (
        torch.randn(tokens, HQ * d, dtype=dtype, device=device),
        torch.randn(tokens, HK * d, dtype=dtype, device=device),
        (tokens,),
    )
    buf = torch.randn(tokens, (HQ + 2 * HK) * d, dtype=dtype, device=device)
    yield buf[:, : HQ * d], buf[:, (HQ + HK) * d :], (tokens,)
    if tokens % 3 == 0 or tokens == 1:
        b = 1 if tokens == 1 else 3
        s = tokens // b
        yield (
            torch.randn(b, s, HQ, d, dtype=dtype, device=device),
            torch.randn(b, s, HK, d, dtype=dtype, device=device),
            (b, s),
        )


def run_vllm(k, dtype, device):
    calls = 0
    for d, rot in HEADS:
        for tdtype in {torch.float32, dtype}:
            cache = torch.cat(cos_sin(64, rot // 2, tdtype, device), dim=-1)
            for tokens in TOKENS:
                for q, key, pshape in qk_layouts(tokens, d, dtype, device):
                    positions = torch.randint(0, 64, pshape, device=device)
                    for is_neox in (True, False):
                        k.rotary_embedding(positions, q, key, d, cache, is_neox)
                        k.rotary_embedding(positions.int(), q, None, d, cache, is_neox)
                        calls += 2
                    k.apply_rope_with_cos_sin_cache_inplace(
                        positions, q, key, d, cache.float(), is_neox=True
                    )
            offsets = torch.randint(0, 2, (7,), device=device) * 32
            q, key = (
                torch.randn(7, HQ * d, dtype=dtype, device=device),
                torch.randn(7, HK * d, dtype=dtype, device=device),
            )
            k.batched_rotary_embedding(
                torch.randint(0, 32, (7,), device=device), q, key, d, cache, False, rot, offsets
            )
    return calls


def run_general(k, dtype, device):
    """rope_inplace / rope_out in every row mode, table kind and direction."""
    ops = k.ops
    d, rot = 34, 18
    for mode in ("positions", "sequence", "varlen"):
        for table in ("half", "full", "per_head"):
            hq, hk = (3, 3) if table == "per_head" else (HQ, HK)
            th = hq if table == "per_head" else 1
            w = rot // 2 if table == "half" else rot
            if mode == "varlen":
                b, s = 1, 10
                rows = dict(
                    positions=None,
                    seqlen_offsets=torch.tensor([4, 0, 1, 7], dtype=torch.int32, device=device),
                    cu_seqlens=torch.tensor([0, 3, 3, 9, 10], dtype=torch.int32, device=device),
                    seqlen_offset=2,
                )
                r, tb = 16, 1
            elif mode == "sequence":
                b, s = 3, 5
                rows = dict(
                    positions=None,
                    seqlen_offsets=torch.tensor([0, 6, 2], dtype=torch.int32, device=device),
                    cu_seqlens=None,
                    seqlen_offset=3,
                )
                r, tb = 14, b
            else:
                b, s = 3, 5
                rows = dict(
                    positions=torch.randint(0, 16, (b, s), device=device),
                    seqlen_offsets=None,
                    cu_seqlens=None,
                    seqlen_offset=0,
                )
                r, tb = 16, 1
            for tdtype in {torch.float32, dtype}:
                c, sn = cos_sin(tb * r * th, w, tdtype, device)
                c, sn = c.view(tb, r, th, w), sn.view(tb, r, th, w)
                tail = (
                    rows["positions"],
                    rows["seqlen_offsets"],
                    rows["cu_seqlens"],
                    rows["seqlen_offset"],
                    rot,
                )
                for interleaved in (False, True):
                    for transpose in (False, True):
                        flags = (interleaved, table != "half", transpose)
                        q = torch.randn(b, s, hq, d, dtype=dtype, device=device)
                        kk = torch.randn(b, s, hk, d, dtype=dtype, device=device)
                        ops.rope_inplace(q, kk, c, sn, *tail, *flags)
                        ops.rope_out(
                            torch.empty_like(q), q, torch.empty_like(kk), kk, c, sn, *tail, *flags
                        )
                        ops.rope_out(torch.empty_like(q), q, None, None, c, sn, *tail, *flags)


def run_apply_rotary(k, dtype, device):
    """kernels-community apply_rotary: the kernel path (halves of one tensor, cos/sin broadcast
    over heads), in place and out of place, and the fallback (separate tensors)."""
    for shape in ((2, 3, 5, 34), (1, 1, 1, 6), (2, 4, 300, 128)):
        b, h, s, d = shape
        x = torch.randn(shape, dtype=dtype, device=device)
        c, sn = cos_sin(b * s, d // 2, dtype, device)
        c, sn = c.view(b, 1, s, d // 2), sn.view(b, 1, s, d // 2)
        out = torch.empty_like(x)
        for conj in (False, True):
            k.apply_rotary(
                x[..., : d // 2],
                x[..., d // 2 :],
                c,
                sn,
                out[..., : d // 2],
                out[..., d // 2 :],
                conj,
            )
            k.apply_rotary(
                x[..., : d // 2], x[..., d // 2 :], c, sn, x[..., : d // 2], x[..., d // 2 :], conj
            )
        x1, x2 = x[..., : d // 2].contiguous(), x[..., d // 2 :].contiguous()
        k.apply_rotary(x1, x2, c, sn, torch.empty_like(x1), torch.empty_like(x2), False)


def run_functional(k, dtype, device):
    """The differentiable Python forms, forward and backward."""
    for d, rot in ((34, 18), (64, 64), (128, 128)):
        c, sn = cos_sin(40, rot // 2, dtype, device)
        for interleaved in (False, True):
            x = torch.randn(3, 7, HQ, d, dtype=dtype, device=device, requires_grad=True)
            offsets = torch.tensor([0, 5, 30], dtype=torch.int32, device=device)
            y = k.apply_rotary_emb(x, c, sn, interleaved=interleaved, seqlen_offsets=offsets)
            torch.autograd.grad(y, [x], torch.randn_like(y))
            k.apply_rotary_emb(
                x.detach().clone(), c, sn, interleaved=interleaved, inplace=True, seqlen_offsets=7
            )
            cu = torch.tensor([0, 4, 4, 11], dtype=torch.int32, device=device)
            xv = torch.randn(11, HQ, d, dtype=dtype, device=device, requires_grad=True)
            y = k.apply_rotary_emb(
                xv,
                c,
                sn,
                interleaved=interleaved,
                cu_seqlens=cu,
                max_seqlen=7,
                seqlen_offsets=offsets,
            )
            torch.autograd.grad(y, [xv], torch.randn_like(y))
        # transformers form (q [B, H, S, D]), with cos/sin gradients
        q = torch.randn(2, HQ, 9, d, dtype=dtype, device=device, requires_grad=True)
        kk = torch.randn(2, HK, 9, d, dtype=dtype, device=device, requires_grad=True)
        cf, sf = cos_sin(2 * 9, d, dtype, device)
        cf, sf = cf.view(2, 9, d).requires_grad_(), sf.view(2, 9, d).requires_grad_()
        qe, ke = k.apply_rotary_transformers(q, kk, cf, sf)
        torch.autograd.grad([qe, ke], [q, kk, cf, sf], [torch.randn_like(qe), torch.randn_like(ke)])
        # LTX-Video form (x [B, S, H * D], per-channel freqs [1, S, H * D])
        x = torch.randn(2, 9, HQ * d, dtype=dtype, device=device, requires_grad=True)
        cl, sl = cos_sin(9, HQ * d, torch.float32, device)
        y = k.apply_rotary_emb_ltx(x, (cl[None], sl[None]))
        torch.autograd.grad(y, [x], torch.randn_like(y))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    k = kernels.get_local_kernel(
        Path(__file__).resolve().parent.parent / "build", backend=args.device
    )
    torch.manual_seed(0)
    calls = 0
    for dtype in DTYPES:
        calls += run_vllm(k, dtype, args.device)
        run_general(k, dtype, args.device)
        run_apply_rotary(k, dtype, args.device)
        run_functional(k, dtype, args.device)
    if args.device == "cuda":
        torch.cuda.synchronize()
    print(
        f"sanitize: all ops ran ({calls} rotary_embedding calls, plus the general, kernels-community "
        f"and functional forms; {args.device})"
    )


if __name__ == "__main__":
    main()
