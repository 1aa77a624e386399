"""torch.library conformance of the rmsnorm ops: opcheck, torch.compile parity, no recompiles.

`opcheck` runs on every C++ op (the out-param and in-place ones included, with each optional
argument present and absent) and on every allocating custom op: schema (mutation annotations),
fake kernel, autograd registration and AOT dispatch with static and dynamic shapes. Compiled
(fullgraph) forward and backward graphs must equal eager bit for bit, since both run the same
opaque kernels; `fullgraph=True` turns any graph break into an error.
"""

import pytest
import torch
import torch.nn as nn
from rmsnorm_cases import BF16, F32, make_input, make_weight

EPS = 1e-6


def _opcheck(op, args):
    torch.library.opcheck(op, args)


# ---- opcheck ----


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_opcheck_out_and_in_place_ops(kernel, device, dtype):
    ops = kernel.ops
    x = make_input((3, 2, 9), dtype, device)
    r = make_input(x.shape, dtype, device, seed=3)
    w = make_weight("same", 9, dtype, device)
    w32 = make_weight("fp32", 9, dtype, device)
    for weight in (w, w32, None):
        _opcheck(ops.rms_norm.default, (torch.empty_like(x), x, weight, EPS))
        _opcheck(ops.gemma_rms_norm.default, (torch.empty_like(x), x, weight, EPS))
        _opcheck(ops.fused_add_rms_norm.default, (x.clone(), r.clone(), weight, EPS))
        _opcheck(ops.gemma_fused_add_rms_norm.default, (x.clone(), r.clone(), weight, EPS))
    _opcheck(ops.rms_norm.default, (torch.empty_like(x, dtype=F32), x, w32, EPS))
    for mod_shape in ((3, 9), (3, 1, 9)):
        scale = make_input(mod_shape, dtype, device, scale=0.5, seed=7)
        shift = make_input(mod_shape, dtype, device, seed=8)
        _opcheck(ops.rms_norm_modulate.default, (torch.empty_like(x), x, w, scale, shift, EPS))
        _opcheck(ops.rms_norm_modulate.default, (torch.empty_like(x), x, None, scale, shift, EPS))


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_opcheck_general_ops(kernel, device, dtype):
    ops = kernel.ops
    x = make_input((3, 2, 9), dtype, device)
    r = make_input(x.shape, dtype, device, seed=3)
    w32 = make_weight("fp32", 9, dtype, device)
    scale = make_input((3, 9), dtype, device, scale=0.5, seed=7)
    shift = make_input((3, 1, 9), dtype, device, seed=8)
    out32 = torch.empty_like(x, dtype=F32)
    rstd = torch.empty(x.shape[:-1], device=device)
    # every option: fused add + rstd + Llama rounding; modulation; nothing optional
    _opcheck(
        ops.rms_norm_fwd.default,
        (out32, x, w32, r, torch.empty_like(x), None, None, rstd, EPS, 0.0, dtype),
    )
    _opcheck(
        ops.rms_norm_fwd.default,
        (torch.empty_like(x), x, w32, None, None, scale, shift, None, EPS, 0.0, None),
    )
    _opcheck(
        ops.rms_norm_fwd.default,
        (torch.empty_like(x), x, None, None, None, None, None, None, EPS, 1.0, BF16),
    )

    grad_out = make_input(x.shape, F32, device, scale=1.0, seed=1)
    grad_res = make_input(x.shape, dtype, device, scale=1.0, seed=2)
    _opcheck(
        ops.rms_norm_bwd.default,
        (
            torch.empty_like(x),
            torch.empty_like(w32),
            None,
            None,
            grad_out,
            x,
            w32,
            grad_res,
            None,
            EPS,
            0.0,
            dtype,
        ),
    )
    _opcheck(
        ops.rms_norm_bwd.default,
        (
            torch.empty_like(x),
            torch.empty_like(w32),
            torch.empty_like(scale),
            torch.empty_like(scale),
            grad_out.to(dtype),
            x,
            w32,
            None,
            scale,
            EPS,
            0.0,
            None,
        ),
    )
    _opcheck(
        ops.rms_norm_bwd.default,
        (torch.empty_like(x), None, None, None, grad_out, x, None, None, None, EPS, 1.0, None),
    )


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_opcheck_functional_ops(kernel, device, dtype):
    ops = kernel.ops
    x = make_input((3, 2, 9), dtype, device).requires_grad_()
    r = make_input(x.shape, dtype, device, seed=3).requires_grad_()
    w32 = make_weight("fp32", 9, dtype, device).requires_grad_()
    scale = make_input((3, 9), dtype, device, scale=0.5, seed=7).requires_grad_()
    shift = make_input((3, 1, 9), dtype, device, seed=8).requires_grad_()
    _opcheck(ops.rms_norm_functional.default, (x, w32, None, None, EPS, 0.0, dtype, F32))
    _opcheck(ops.rms_norm_functional.default, (x, w32, scale, shift, EPS, 0.0, None, dtype))
    _opcheck(ops.rms_norm_functional.default, (x, None, None, None, EPS, 1.0, None, dtype))
    _opcheck(ops.add_rms_norm_functional.default, (x, r, w32, EPS, 0.0, dtype, F32))
    _opcheck(ops.add_rms_norm_functional.default, (x, r, None, EPS, 1.0, None, dtype))

    xd, wd, sd = x.detach(), w32.detach(), scale.detach()
    grad_out = make_input(x.shape, F32, device, scale=1.0, seed=1)
    _opcheck(
        ops.rms_norm_bwd_functional.default,
        (grad_out, xd, wd, xd.clone(), None, EPS, 0.0, dtype, True, False, False),
    )
    _opcheck(
        ops.rms_norm_bwd_functional.default,
        (grad_out.to(dtype), xd, wd, None, sd, EPS, 0.0, None, True, True, True),
    )
    _opcheck(
        ops.rms_norm_bwd_functional.default,
        (grad_out.to(dtype), xd, None, None, sd, EPS, 0.0, None, False, False, True),
    )


# ---- torch.compile ----


class Block(nn.Module):
    """A diffusion/LLM-style block that uses every differentiable functional form."""

    def __init__(self, kernel, hidden, dtype):
        super().__init__()
        self.kernel = kernel
        self.w_add = nn.Parameter(make_input((hidden,), dtype, "cpu", scale=0.5, mean=1.0, seed=11))
        self.w_norm = nn.Parameter(
            make_input((hidden,), dtype, "cpu", scale=0.5, mean=1.0, seed=12)
        )
        self.w_gemma = nn.Parameter(make_input((hidden,), dtype, "cpu", scale=0.5, seed=13))
        self.w_mod = nn.Parameter(make_input((hidden,), dtype, "cpu", scale=0.5, mean=1.0, seed=14))

    def forward(self, x, residual, cond):
        k = self.kernel
        h, residual = k.add_rms_norm(x, residual, self.w_add, EPS)
        h = k.rms_norm_func(h, self.w_norm, EPS)
        h = k.rms_norm_func(h * 2.0, self.w_gemma, EPS, gemma=True)
        scale, shift = cond.chunk(2, dim=-1)  # [B, D] views with row stride 2 * D
        h = k.rms_norm_modulate(h, self.w_mod, scale, shift, EPS)
        return h, residual


def _block_inputs(batch, tokens, hidden, dtype, device, seed=0):
    x = make_input((batch, tokens, hidden), dtype, device, seed=seed).requires_grad_()
    residual = make_input((batch, tokens, hidden), dtype, device, seed=seed + 1).requires_grad_()
    cond = make_input((batch, 2 * hidden), dtype, device, scale=0.5, seed=seed + 2).requires_grad_()
    return x, residual, cond


def _run(model, inputs, seed=3):
    h, residual = model(*inputs)
    grads_out = [
        make_input(t.shape, t.dtype, t.device, scale=1.0, seed=seed + i)
        for i, t in enumerate((h, residual))
    ]
    leaves = list(inputs) + list(model.parameters())
    grads = torch.autograd.grad([h, residual], leaves, grads_out)
    return [h, residual, *grads]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_compile_parity(kernel, device, dtype):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = Block(kernel, 24, dtype).to(device)
    inputs = _block_inputs(2, 7, 24, dtype, device)
    eager = _run(model, inputs)
    compiled = _run(torch.compile(model, fullgraph=True), inputs)
    assert not torch._dynamo.utils.counters["graph_break"], dict(
        torch._dynamo.utils.counters["graph_break"]
    )
    for i, (a, b) in enumerate(zip(compiled, eager)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert torch.equal(a, b), f"output/gradient {i} differs between compiled and eager"


@pytest.mark.slow
def test_no_recompile_across_batch_sizes(kernel, device):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = Block(kernel, 16, F32).to(device)
    compiled = torch.compile(model, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i, (batch, tokens) in enumerate([(2, 5), (3, 9), (5, 33), (4, 2)]):
            inputs = _block_inputs(batch, tokens, 16, F32, device, seed=i)
            x, residual, cond = inputs
            for t in (x, residual):
                torch._dynamo.mark_dynamic(t, 0)
                torch._dynamo.mark_dynamic(t, 1)
            torch._dynamo.mark_dynamic(cond, 0)
            got = _run(compiled, inputs)
            want = _run(model, inputs)
            for a, b in zip(got, want):
                assert torch.equal(a, b)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert frames == 1, f"expected one compiled graph for all sizes, got {frames}"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_compile_out_param_and_in_place_ops(kernel, device, dtype):
    # The mutating ops under functionalization: the compiled function writes the caller's
    # tensors exactly as eager does.
    torch._dynamo.reset()

    def step(x, residual, w, out):
        kernel.fused_add_rms_norm(x, residual, w, EPS)  # vLLM, in place
        kernel.rms_norm(out, x, w, EPS)
        kernel.fused_add_rmsnorm(x, residual, w, EPS)  # flashinfer, in place
        y = kernel.gemma_rmsnorm(x, w, EPS, out=torch.empty_like(x))
        kernel.gemma_fused_add_rms_norm(x, residual, w, EPS)
        return y + 1.0

    x = make_input((5, 3, 20), dtype, device)
    residual = make_input(x.shape, dtype, device, seed=3)
    w = make_weight("same", 20, dtype, device)
    args_e = (x.clone(), residual.clone(), w, torch.empty_like(x))
    args_c = (x.clone(), residual.clone(), w, torch.full_like(x, float("nan")))
    ye = step(*args_e)
    yc = torch.compile(step, fullgraph=True)(*args_c)
    assert torch.equal(yc, ye)
    for a, b in zip(args_c, args_e):
        assert torch.equal(a, b)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("enable_pdl", [None, True, False], ids=str)
def test_enable_pdl_reaches_the_ops(kernel, device, enable_pdl):
    """enable_pdl is the last argument of every op (schema `bool? enable_pdl=None`), of the
    allocating ops and of the Python functions; it changes how the CUDA kernels are launched,
    never the result (the CPU ignores it)."""
    ops = kernel.ops
    x = make_input((3, 2, 9), F32, device)
    r = make_input(x.shape, F32, device, seed=3)
    w = make_weight("same", 9, F32, device)
    _opcheck(ops.rms_norm.default, (torch.empty_like(x), x, w, EPS, enable_pdl))
    _opcheck(ops.gemma_rms_norm.default, (torch.empty_like(x), x, w, EPS, enable_pdl))
    _opcheck(ops.fused_add_rms_norm.default, (x.clone(), r.clone(), w, EPS, enable_pdl))
    _opcheck(ops.gemma_fused_add_rms_norm.default, (x.clone(), r.clone(), w, EPS, enable_pdl))
    scale, shift = make_input((3, 9), F32, device, seed=4), make_input((3, 9), F32, device, seed=5)
    _opcheck(
        ops.rms_norm_modulate.default, (torch.empty_like(x), x, w, scale, shift, EPS, enable_pdl)
    )
    _opcheck(
        ops.rms_norm_fwd.default,
        (torch.empty_like(x), x, w, None, None, None, None, None, EPS, 0.0, None, enable_pdl),
    )
    _opcheck(
        ops.rms_norm_bwd.default,
        (
            torch.empty_like(x),
            torch.empty_like(w),
            None,
            None,
            r,
            x,
            w,
            None,
            None,
            EPS,
            0.0,
            None,
            enable_pdl,
        ),
    )
    _opcheck(ops.rms_norm_functional.default, (x, w, None, None, EPS, 0.0, None, F32, enable_pdl))
    _opcheck(ops.add_rms_norm_functional.default, (x, r, w, EPS, 0.0, None, F32, enable_pdl))
    _opcheck(
        ops.rms_norm_bwd_functional.default,
        (r, x, w, None, None, EPS, 0.0, None, True, False, False, enable_pdl),
    )

    assert torch.equal(kernel.rmsnorm(x, w, EPS, enable_pdl=enable_pdl), kernel.rmsnorm(x, w, EPS))
    out = kernel.rms_norm(torch.empty_like(x), x, w, EPS, enable_pdl=enable_pdl)
    assert torch.equal(out, kernel.rms_norm(torch.empty_like(x), x, w, EPS))
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = kernel.rms_norm_func(xg, wg, EPS, enable_pdl=enable_pdl)
    grads = torch.autograd.grad(y, [xg, wg], r)
    grads0 = torch.autograd.grad(kernel.rms_norm_func(xg, wg, EPS), [xg, wg], r)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads0))
