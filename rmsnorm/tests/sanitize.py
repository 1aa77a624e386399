"""Run every rmsnorm op of the built kernel, forward and backward, on awkward shapes, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 9 python rmsnorm/tests/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python rmsnorm/tests/sanitize.py

Shapes cover one element, hidden sizes that are not a multiple of any vector width (the scalar
tail), a hidden size of 65544 (several blocks per row), many short rows, views into wider buffers
at odd offsets (misaligned rows), row-strided views, 3-D inputs with per-sample modulation, inputs
of 32 MB and more (the forward's L2 prefetch) and empty inputs; each in float32, float16 and
bfloat16, with a weight in the input dtype, a float32 weight and no weight. Outputs and
gradients are exact-size allocations (or views whose buffers end where the view ends), so any
write past a row or a tensor is reported by memcheck; the backward reductions (grad_weight,
grad_scale, grad_shift) use the kernels' workspaces.
Not collected by pytest (no test_ prefix). `--device cpu` runs the same calls on the CPU build
(a quick check that the script itself works).
"""

import argparse
from pathlib import Path

import kernels
import torch

EPS = 1e-6
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (rows, hidden)
SHAPES = [
    (1, 1),
    (7, 3),
    (5, 8),
    (3, 13),
    (2, 127),
    (4, 4096),
    (3, 4097),
    (2, 14336),
    (1, 65544),
    (300, 24),
    (0, 64),
]


def row_views(rows, hidden, dtype, device):
    """Contiguous input, a column slice at an odd offset, a row-strided slice."""
    yield torch.randn(rows, hidden, dtype=dtype, device=device)
    wide = torch.randn(rows, hidden + 3, dtype=dtype, device=device)
    yield wide[:, 1 : 1 + hidden]  # row stride not a multiple of any vector width, odd base
    tall = torch.randn(2 * rows, hidden, dtype=dtype, device=device)
    yield tall[::2]


def padded_copy(t):
    """A copy of t as a view at an odd offset into a wider buffer (same values)."""
    buf = torch.empty(*t.shape[:-1], t.shape[-1] + 3, dtype=t.dtype, device=t.device)
    view = buf[..., 1 : 1 + t.shape[-1]]
    view.copy_(t)
    return view


def weights(hidden, dtype, device):
    yield torch.randn(hidden, dtype=dtype, device=device)
    yield torch.randn(hidden, dtype=torch.float32, device=device)
    yield None


def run_plain(k, x, w, dtype):
    """vLLM / flashinfer forms and the general ops, forward and backward, on one input."""
    ops = k.ops
    hidden = x.shape[-1]
    out_dtype = torch.float32 if w is not None and w.dtype != dtype else dtype
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    k.rms_norm(out, x, w, EPS)
    k.gemma_rms_norm(torch.empty_like(x), x, w, EPS)
    k.rmsnorm(x, w, EPS, out=torch.empty_like(x))

    # In place (fused add, both tensors written) on misaligned views of their own buffers.
    xi, ri = padded_copy(x), padded_copy(torch.randn_like(x))
    k.fused_add_rms_norm(xi, ri, w, EPS)
    k.gemma_fused_add_rms_norm(xi, ri, w, EPS)
    k.fused_add_rmsnorm(xi, ri, w, EPS)

    # General forward with every output: out (fp32 when the weight is), residual_out, rstd.
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    ops.rms_norm_fwd(out, x, w, ri, torch.empty_like(x), None, None, rstd, EPS, 0.0, dtype)

    # General backward: grad_input, grad_weight, with and without grad_residual, in place.
    grad_out = torch.randn(x.shape, dtype=out_dtype, device=x.device)
    grad_weight = None if w is None else torch.empty_like(w)
    ops.rms_norm_bwd(
        torch.empty_like(x), grad_weight, None, None, grad_out, x, w, None, None, EPS, 0.0, dtype
    )
    grad_res = torch.randn_like(x)
    ops.rms_norm_bwd(
        grad_res, grad_weight, None, None, grad_out, x, w, grad_res, None, EPS, 1.0, None
    )

    # Differentiable forms through autograd (their own allocations).
    xg = x.detach().clone().requires_grad_()
    params = [xg] + ([] if w is None else [w.detach().clone().requires_grad_()])
    wg = None if w is None else params[1]
    y = k.rms_norm_func(xg, wg, EPS)
    torch.autograd.grad(y, params, torch.randn_like(y))
    y = k.rms_norm_func(xg, wg, EPS, gemma=True)
    torch.autograd.grad(y, params, torch.randn_like(y))
    rg = torch.randn_like(x).requires_grad_()
    y, r_out = k.add_rms_norm(xg, rg, wg, EPS)
    torch.autograd.grad([y, r_out], params + [rg], [torch.randn_like(y), torch.randn_like(r_out)])
    if w is not None and hidden > 0:
        y = k.apply_rms_norm(x, w, EPS)
        k.apply_rms_norm_backward(torch.randn_like(y), x, w, y, None, EPS)


def run_modulated(k, dtype, device):
    for batch, tokens, hidden in [(2, 3, 96), (3, 1, 13), (1, 5, 4097), (4, 7, 8), (2, 0, 16)]:
        x = torch.randn(batch, tokens, hidden + 1, dtype=dtype, device=device)[
            ..., 1:
        ]  # misaligned view
        for mod_shape in ((batch, hidden), (batch, 1, hidden)):
            scale = torch.randn(mod_shape, dtype=dtype, device=device)
            shift = torch.randn(mod_shape, dtype=dtype, device=device)
            for w in weights(hidden, dtype, device):
                k.ops.rms_norm_modulate(torch.empty_like(x), x, w, scale, shift, EPS)
                grads = [
                    torch.empty_like(w) if w is not None else None,
                    torch.empty_like(scale),
                    torch.empty_like(scale),
                ]
                k.ops.rms_norm_bwd(
                    torch.empty_like(x),
                    *grads,
                    torch.randn_like(x),
                    x,
                    w,
                    None,
                    scale,
                    EPS,
                    0.0,
                    None,
                )
                leaves = [t.detach().clone().requires_grad_() for t in (x, scale, shift)]
                wg = None if w is None else w.detach().clone().requires_grad_()
                y = k.rms_norm_modulate(leaves[0], wg, leaves[1], leaves[2], EPS)
                torch.autograd.grad(y, leaves + ([] if wg is None else [wg]), torch.randn_like(y))


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
        for rows, hidden in SHAPES:
            for x in row_views(rows, hidden, dtype, args.device):
                for w in weights(hidden, dtype, args.device):
                    run_plain(k, x, w, dtype)
                    calls += 1
        run_modulated(k, dtype, args.device)
        # 32 MB and more: the forward prefetches rows ahead into L2 (up to the last row).
        rows = 2 * (32 << 20) // (8192 * dtype.itemsize)
        x = torch.randn(rows, 8192, dtype=dtype, device=args.device)
        for view in (x, x[: x.shape[0] // 2 + 1], x[::2]):
            out = torch.empty(view.shape, dtype=dtype, device=args.device)
            k.rms_norm(out, view, torch.randn(8192, dtype=dtype, device=args.device), EPS)
            k.fused_add_rms_norm(view, torch.randn_like(view), None, EPS)
        x = torch.randn(2, 3, 4, 33, dtype=dtype, device=args.device)  # 4-D leading dims
        run_plain(k, x, torch.randn(33, dtype=dtype, device=args.device), dtype)
    if args.device == "cuda":
        torch.cuda.synchronize()
    print(
        f"sanitize: all ops ran ({calls} input/weight combinations, plus the modulated forms; {args.device})"
    )


if __name__ == "__main__":
    main()
