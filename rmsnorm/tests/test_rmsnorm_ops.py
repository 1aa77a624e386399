"""Values, casting, layouts, backward, calling conventions and input validation of the rmsnorm ops.

Every value check compares the built kernel (`kernel` fixture) with the float64 reference under
the tolerance model of rmsnorm_cases.py (bounds derived from the prescribed roundings plus the
fp32 accumulation error), and checks bit for bit the elements whose result the contract decides.
Outputs are pre-filled with NaN, so an element the kernel does not write fails.
"""

import pytest
import torch
from rmsnorm_cases import (
    BF16,
    DTYPES,
    F16,
    F32,
    HALF_DTYPES,
    WEIGHT_KINDS,
    Parts,
    assert_within,
    check_forward,
    check_grads,
    forward_bound,
    make_input,
    make_weight,
    nan_like,
    rstd_error,
)
from rmsnorm_fixture import assert_autograd_routes_agree, run_in_fresh_process

EPS = 1e-6

# (leading dims, hidden): 1-D to 4-D inputs; hidden 1, 3, 17, 127 (odd, prime), 4096 and 4097
# (vector body and scalar tail), prime token counts, one token.
SHAPES = [
    ((), 1),
    ((7,), 1),
    ((5,), 3),
    ((13,), 17),
    ((3, 5), 127),
    ((2, 3, 4), 17),
    ((1, 2, 3, 2), 3),
    ((3,), 4096),
    ((2,), 4097),
]
FEW_SHAPES = [((7,), 3), ((3, 5), 127), ((2,), 4097)]
BIG_HIDDEN = 65536 + 8


def _id(shape):
    leading, hidden = shape
    return "x".join(str(s) for s in leading + (hidden,))


def _setup(shape, dtype, wkind, device, seed=0):
    leading, hidden = shape
    x = make_input(leading + (hidden,), dtype, device, seed=seed)
    return x, make_weight(wkind, hidden, dtype, device)


def _grad_out(shape, dtype, device, seed=1):
    return make_input(shape, dtype, device, scale=1.0, seed=seed)


# ---- vLLM out-param / in-place ops ----


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
@pytest.mark.parametrize("wkind", WEIGHT_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm(kernel, device, dtype, wkind, shape):
    x, w = _setup(shape, dtype, wkind, device)
    out = nan_like(x.shape, dtype, device)
    assert kernel.rms_norm(out, x, w, EPS) is out
    # LlamaRMSNorm casting: n rounded to the input dtype, then the weight.
    check_forward(kernel, out, x, w, EPS, norm_dtype=dtype, what=f"rms_norm {dtype} {wkind}")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_rms_norm_float32_out(kernel, device, dtype):
    # fp32 weight, half input, fp32 out: LlamaRMSNorm's promotion (weight * n.to(input dtype)).
    x, w = _setup(((9,), 127), dtype, "fp32", device)
    out = nan_like(x.shape, F32, device)
    kernel.rms_norm(out, x, w, EPS)
    check_forward(kernel, out, x, w, EPS, norm_dtype=dtype, what=f"rms_norm {dtype} -> float32")


@pytest.mark.parametrize("shape", FEW_SHAPES, ids=_id)
@pytest.mark.parametrize("wkind", WEIGHT_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemma_rms_norm(kernel, device, dtype, wkind, shape):
    x, w = _setup(shape, dtype, wkind, device)
    if w is not None:
        w = w - 1.0  # Gemma stores weight - 1
    out = nan_like(x.shape, dtype, device)
    assert kernel.gemma_rms_norm(out, x, w, EPS) is out
    check_forward(
        kernel,
        out,
        x,
        w,
        EPS,
        norm_dtype=None,
        weight_offset=1.0,
        what=f"gemma_rms_norm {dtype} {wkind}",
    )


@pytest.mark.parametrize("shape", FEW_SHAPES + [((1,), 1), ((2, 3, 4), 17)], ids=_id)
@pytest.mark.parametrize("wkind", WEIGHT_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gemma", [False, True], ids=["llama", "gemma"])
def test_fused_add_in_place(kernel, device, gemma, dtype, wkind, shape):
    x, w = _setup(shape, dtype, wkind, device)
    residual = make_input(x.shape, dtype, device, seed=3)
    # The reference adds in the input dtype (PyTorch: in fp32, rounded once), as the kernel does.
    expected_residual = kernel._reference.add_rms_norm(x, residual)[1]
    xi, ri = x.clone(), residual.clone()
    if gemma:
        assert kernel.gemma_fused_add_rms_norm(xi, ri, w, EPS) is None
    else:
        assert kernel.fused_add_rms_norm(xi, ri, w, EPS) is None
    # Both tensors are updated: residual <- x + residual (bit for bit), x <- norm(residual).
    assert torch.equal(ri, expected_residual)
    norm_dtype, offset = (None, 1.0) if gemma else (dtype, 0.0)
    check_forward(
        kernel,
        xi,
        ri,
        w,
        EPS,
        norm_dtype=norm_dtype,
        weight_offset=offset,
        what=f"fused_add {dtype} {wkind}",
    )


# ---- flashinfer / sgl-kernel names ----


@pytest.mark.parametrize("wkind", ["same", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flashinfer_api(kernel, device, dtype, wkind):
    x, w = _setup(((11,), 127), dtype, wkind, device)
    residual = make_input(x.shape, dtype, device, seed=3)

    # rmsnorm: one rounding (flashinfer), allocating and differentiable, or into `out`.
    y = kernel.rmsnorm(x, w, EPS, enable_pdl=True)
    assert y.dtype == dtype
    check_forward(kernel, y, x, w, EPS, norm_dtype=None, what=f"rmsnorm {dtype}")
    out = nan_like(x.shape, dtype, device)
    assert kernel.rmsnorm(x, w, EPS, out=out) is out
    assert torch.equal(out, y)

    gw = w - 1.0
    y = kernel.gemma_rmsnorm(x, gw, EPS)
    check_forward(
        kernel, y, x, gw, EPS, norm_dtype=None, weight_offset=1.0, what=f"gemma_rmsnorm {dtype}"
    )
    out = nan_like(x.shape, dtype, device)
    assert kernel.gemma_rmsnorm(x, gw, EPS, out=out, enable_pdl=False) is out
    assert torch.equal(out, y)

    for name, weight, offset in (
        ("fused_add_rmsnorm", w, 0.0),
        ("gemma_fused_add_rmsnorm", gw, 1.0),
    ):
        xi, ri = x.clone(), residual.clone()
        assert getattr(kernel, name)(xi, ri, weight, EPS, enable_pdl=None) is None
        assert torch.equal(ri, kernel._reference.add_rms_norm(x, residual)[1]), name
        check_forward(
            kernel,
            xi,
            ri,
            weight,
            EPS,
            norm_dtype=None,
            weight_offset=offset,
            what=f"{name} {dtype}",
        )


# ---- differentiable functional forms ----


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
@pytest.mark.parametrize("wkind", WEIGHT_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_func_forward(kernel, device, dtype, wkind, shape):
    x, w = _setup(shape, dtype, wkind, device)
    y = kernel.rms_norm_func(x, w, EPS)
    # transformers' promotion: weight * n.to(x.dtype) has dtype promote(weight, x).
    assert y.dtype == (F32 if wkind == "fp32" else dtype)
    check_forward(kernel, y, x, w, EPS, norm_dtype=dtype, what=f"rms_norm_func {dtype} {wkind}")
    if wkind != "fp32":
        out = torch.empty_like(x)
        assert torch.equal(kernel.rms_norm(out, x, w, EPS), y)  # the same kernel as the vLLM op
    gw = None if w is None else w - 1.0
    yg = kernel.rms_norm_func(x, gw, EPS, gemma=True)
    assert yg.dtype == dtype
    check_forward(
        kernel, yg, x, gw, EPS, norm_dtype=None, weight_offset=1.0, what=f"gemma {dtype} {wkind}"
    )


@pytest.mark.kernels_ci
@pytest.mark.parametrize(
    "dtypes",
    [(F16, BF16), (BF16, F16), (F32, BF16), (F32, F16)],
    ids=lambda d: f"x={d[0]},w={d[1]}".replace("torch.", ""),
)
def test_rms_norm_func_mixed_weight(kernel, device, dtypes):
    # A weight of another half dtype than x (or a half weight with fp32 x): PyTorch promotes to
    # fp32; the weight is widened to fp32 (exact) for the kernel. Bit for bit where decided.
    xdtype, wdtype = dtypes
    x = make_input((6, 17), xdtype, device)
    w = make_input((17,), wdtype, device, scale=0.5, mean=1.0, seed=5)
    y = kernel.rms_norm_func(x, w, EPS)
    assert y.dtype == torch.promote_types(xdtype, wdtype) == F32
    check_forward(kernel, y, x, w, EPS, norm_dtype=xdtype, what="mixed")
    yg = kernel.rms_norm_func(x, w, EPS, gemma=True)
    assert yg.dtype == xdtype
    check_forward(kernel, yg, x, w, EPS, norm_dtype=None, weight_offset=1.0, what="mixed gemma")
    # The flashinfer names take such a weight too (one rounding, the input dtype).
    yf = kernel.rmsnorm(x, w, EPS)
    assert yf.dtype == xdtype
    check_forward(kernel, yf, x, w, EPS, norm_dtype=None, what="mixed rmsnorm")
    assert torch.equal(kernel.rmsnorm(x, w, EPS, out=torch.empty_like(x)), yf)
    # The weight gradient comes back in the weight's dtype.
    wg = w.clone().requires_grad_()
    kernel.rms_norm_func(x, wg, EPS).sum().backward()
    assert wg.grad.dtype == wdtype


BWD_SHAPES = [((), 1), ((7,), 3), ((13,), 17), ((3, 5), 127), ((2,), 4097), ((2, 3, 4), 17)]


@pytest.mark.parametrize("shape", BWD_SHAPES, ids=_id)
@pytest.mark.parametrize("wkind", WEIGHT_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gemma", [False, True], ids=["llama", "gemma"])
def test_rms_norm_func_backward(kernel, device, gemma, dtype, wkind, shape):
    x, w = _setup(shape, dtype, wkind, device)
    if gemma and w is not None:
        w = w - 1.0
    x.requires_grad_()
    params = [x] if w is None else [x, w.requires_grad_()]
    y = kernel.rms_norm_func(x, w, EPS, gemma=gemma)
    grad_out = _grad_out(y.shape, y.dtype, device)
    grads = torch.autograd.grad(y, params, grad_out)
    assert grads[0].dtype == dtype and grads[0].shape == x.shape
    actual = {"input": grads[0]}
    if w is not None:
        assert grads[1].dtype == w.dtype and grads[1].shape == w.shape
        actual["weight"] = grads[1]
    check_grads(
        kernel,
        actual,
        x,
        w,
        grad_out,
        EPS,
        weight_offset=1.0 if gemma else 0.0,
        norm_dtype=None if gemma else dtype,
        what=f"{dtype} {wkind} gemma={gemma}",
    )


@pytest.mark.parametrize("shape", [((1,), 1), ((7,), 3), ((3, 5), 127), ((2,), 4097)], ids=_id)
@pytest.mark.parametrize("wkind", WEIGHT_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gemma", [False, True], ids=["llama", "gemma"])
def test_add_rms_norm(kernel, device, gemma, dtype, wkind, shape):
    x, w = _setup(shape, dtype, wkind, device)
    residual = make_input(x.shape, dtype, device, seed=3)
    x0, res0 = x.clone(), residual.clone()
    x.requires_grad_()
    residual.requires_grad_()
    params = [x, residual] + ([] if w is None else [w.requires_grad_()])
    out, residual_out = kernel.add_rms_norm(x, residual, w, EPS, gemma=gemma)
    assert torch.equal(x.detach(), x0) and torch.equal(residual.detach(), res0), (
        "inputs must not change"
    )
    assert torch.equal(residual_out.detach(), kernel._reference.add_rms_norm(x0, res0)[1])
    assert out.dtype == (F32 if wkind == "fp32" and not gemma else dtype)
    offset = 1.0 if gemma else 0.0
    check_forward(
        kernel,
        out,
        residual_out,
        w,
        EPS,
        norm_dtype=None if gemma else dtype,
        weight_offset=offset,
        what="add_rms_norm",
    )

    # Gradients from both outputs: d/dx = d/dresidual = d/dr (grad of out through the norm +
    # grad of residual_out).
    grad_out = _grad_out(out.shape, out.dtype, device)
    grad_res = _grad_out(residual_out.shape, dtype, device, seed=4)
    grads = torch.autograd.grad([out, residual_out], params, [grad_out, grad_res])
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    actual = {"input": grads[0]}
    if w is not None:
        actual["weight"] = grads[2]
    check_grads(
        kernel,
        actual,
        residual_out,
        w,
        grad_out,
        EPS,
        weight_offset=offset,
        grad_residual=grad_res,
        norm_dtype=None if gemma else dtype,
        what="add_rms_norm",
    )

    # Only residual_out reaching the loss: the gradient passes straight to x and residual.
    gx, gr = torch.autograd.grad(
        kernel.add_rms_norm(x, residual, w, EPS, gemma=gemma)[1], [x, residual], grad_res
    )
    assert torch.equal(gx, grad_res) and torch.equal(gr, grad_res)


@pytest.mark.parametrize("leading", [(2, 7), (3, 1), (2, 3, 5), (4,)], ids=str)
@pytest.mark.parametrize("scale_3d", [False, True], ids=["BD", "B1D"])
@pytest.mark.parametrize("wkind", WEIGHT_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_modulate(kernel, device, dtype, wkind, scale_3d, leading):
    hidden = 33
    x = make_input(leading + (hidden,), dtype, device)
    w = make_weight(wkind, hidden, dtype, device)
    batch = leading[0]
    mod_shape = (batch, 1, hidden) if scale_3d else (batch, hidden)
    scale = make_input(mod_shape, dtype, device, scale=0.5, seed=7)
    shift = make_input(mod_shape, dtype, device, scale=1.0, seed=8)
    params = [x, scale, shift] + ([] if w is None else [w])
    for p in params:
        p.requires_grad_()
    y = kernel.rms_norm_modulate(x, w, scale, shift, EPS)
    assert y.dtype == dtype and y.shape == x.shape
    check_forward(
        kernel,
        y,
        x,
        w,
        EPS,
        norm_dtype=None,
        scale=scale,
        shift=shift,
        what=f"modulate {dtype} {wkind}",
    )

    # The out-param op computes the same values.
    out = nan_like(x.shape, dtype, device)
    kernel.ops.rms_norm_modulate(
        out, x.detach(), w if w is None else w.detach(), scale.detach(), shift.detach(), EPS
    )
    assert torch.equal(out, y.detach())

    grad_out = _grad_out(y.shape, dtype, device)
    grads = torch.autograd.grad(y, params, grad_out)
    actual = {"input": grads[0], "scale": grads[1], "shift": grads[2]}
    assert grads[1].shape == scale.shape and grads[2].shape == shift.shape
    if w is not None:
        actual["weight"] = grads[3]
    check_grads(
        kernel,
        actual,
        x,
        w,
        grad_out,
        EPS,
        scale=scale,
        shift=shift,
        norm_dtype=None,
        what=f"modulate {dtype} {wkind}",
    )


def test_eager_autograd_route_matches_the_custom_op(kernel, device):
    """Eager calls that autograd records skip the custom op's autograd layer (its host time:
    _eager_path) and give the op's results: the norm (with a modulation) and the fused add."""
    x = make_input((3, 5, 64), torch.bfloat16, device).requires_grad_()
    residual = make_input((3, 5, 64), torch.bfloat16, device, seed=3).requires_grad_()
    w = make_weight("same", 64, torch.bfloat16, device).requires_grad_()
    scale = make_input((3, 64), torch.bfloat16, device, scale=0.5, seed=7).requires_grad_()
    shift = make_input((3, 64), torch.bfloat16, device, seed=8).requires_grad_()
    assert_autograd_routes_agree(
        lambda: kernel.rms_norm_modulate(x, w, scale, shift, EPS),
        (x, w, scale, shift),
        "RmsNormEager",
    )
    assert_autograd_routes_agree(
        lambda: kernel.add_rms_norm(x, residual, w, EPS), (x, residual, w), "AddRmsNormEager"
    )


@pytest.mark.kernels_ci
def test_rms_norm_modulate_partial_grads(kernel, device):
    # Only some inputs need gradients: the others are not computed (and nothing breaks).
    x = make_input((2, 5, 16), F32, device)
    w = make_weight("same", 16, F32, device)
    scale = make_input((2, 16), F32, device, scale=0.5, seed=7)
    shift = make_input((2, 1, 16), F32, device, seed=8).requires_grad_()
    y = kernel.rms_norm_modulate(x, w, scale, shift, EPS)
    (g,) = torch.autograd.grad(y, [shift], torch.ones_like(y))
    torch.testing.assert_close(g, torch.full_like(shift, 5.0), rtol=0, atol=0)


# ---- kernels-community/rmsnorm v1 ----


@pytest.mark.kernels_ci
@pytest.mark.parametrize("wkind", ["same", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_apply_rms_norm(kernel, device, dtype, wkind):
    x, w = _setup(((3, 7), 127), dtype, wkind, device)
    y = kernel.apply_rms_norm(x, w, EPS)
    assert isinstance(y, torch.Tensor)  # kernels-community returns the output tensor
    torch.testing.assert_close(y, kernel.rms_norm_func(x, w, EPS), rtol=0, atol=0)
    out, rstd = kernel.apply_rms_norm(x, w, EPS, return_rstd=True)
    assert torch.equal(out, y)
    assert rstd.dtype == F32 and rstd.shape == x.shape[:-1]
    parts = Parts(kernel, x, w, EPS)
    assert_within(rstd, parts.rstd.squeeze(-1), rstd_error(127) * parts.rstd.squeeze(-1), "rstd")

    grad_out = _grad_out(out.shape, out.dtype, device)
    dx, dw = kernel.apply_rms_norm_backward(grad_out, x, w, out, rstd, EPS)
    assert dx.dtype == dtype and dw.dtype == w.dtype
    check_grads(
        kernel, {"input": dx, "weight": dw}, x, w, grad_out, EPS, what="apply_rms_norm_backward"
    )
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ex, ew = torch.autograd.grad(kernel.rms_norm_func(xr, wr, EPS), [xr, wr], grad_out)
    assert torch.equal(dx, ex) and torch.equal(dw, ew)
    assert kernel.apply_rms_norm_backward(grad_out, x, w, out, rstd, EPS, True, False)[1] is None
    assert kernel.apply_rms_norm_backward(grad_out, x, w, out, rstd, EPS, False, True)[0] is None


# ---- large hidden size ----


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_big_hidden(kernel, device, dtype):
    x, w = _setup(((2,), BIG_HIDDEN), dtype, "same", device)
    out = nan_like(x.shape, dtype, device)
    kernel.rms_norm(out, x, w, EPS)
    check_forward(kernel, out, x, w, EPS, norm_dtype=dtype, what=f"rms_norm hidden={BIG_HIDDEN}")
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = kernel.rms_norm_func(xr, wr, EPS)
    grad_out = _grad_out(y.shape, y.dtype, device)
    gx, gw = torch.autograd.grad(y, [xr, wr], grad_out)
    check_grads(
        kernel, {"input": gx, "weight": gw}, x, w, grad_out, EPS, what=f"hidden={BIG_HIDDEN}"
    )


# ---- eps, special values ----


@pytest.mark.parametrize("eps", [1e-5, 0.25, 3.0], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_eps(kernel, device, dtype, eps):
    # eps is not negligible against mean(x^2) ~ 0.36, in every API that takes it.
    x = make_input((2, 3, 17), dtype, device, scale=0.6)
    w = make_weight("same", 17, dtype, device)
    r = make_input(x.shape, dtype, device, scale=0.1, seed=3)
    scale, shift = (
        make_input((2, 17), dtype, device, scale=0.5, seed=7),
        make_input((2, 17), dtype, device, seed=8),
    )
    check_forward(
        kernel,
        kernel.rms_norm(torch.empty_like(x), x, w, eps),
        x,
        w,
        eps,
        norm_dtype=dtype,
        what="rms_norm",
    )
    check_forward(
        kernel, kernel.rms_norm_func(x, w, eps), x, w, eps, norm_dtype=dtype, what="rms_norm_func"
    )
    check_forward(kernel, kernel.rmsnorm(x, w, eps), x, w, eps, norm_dtype=None, what="rmsnorm")
    check_forward(
        kernel,
        kernel.rms_norm_func(x, w, eps, gemma=True),
        x,
        w,
        eps,
        norm_dtype=None,
        weight_offset=1.0,
        what="gemma",
    )
    out, r_out = kernel.add_rms_norm(x, r, w, eps)
    check_forward(kernel, out, r_out, w, eps, norm_dtype=dtype, what="add_rms_norm")
    y = kernel.rms_norm_modulate(x, w, scale, shift, eps)
    check_forward(kernel, y, x, w, eps, norm_dtype=None, scale=scale, shift=shift, what="modulate")
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = kernel.rms_norm_func(xg, wg, eps)
    grad_out = _grad_out(y.shape, dtype, device)
    gx, gw = torch.autograd.grad(y, [xg, wg], grad_out)
    check_grads(kernel, {"input": gx, "weight": gw}, x, w, grad_out, eps, what="backward")
    rstd = kernel.apply_rms_norm(x, w, eps, return_rstd=True)[1]
    parts = Parts(kernel, x, w, eps)
    assert_within(rstd, parts.rstd.squeeze(-1), rstd_error(17) * parts.rstd.squeeze(-1), "rstd")


@pytest.mark.parametrize("hidden", [17, 4097, BIG_HIDDEN])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_exact_sum_of_squares(kernel, device, dtype, hidden):
    # Integers in [-8, 8]: every partial sum of squares is an integer below 2**24, exact in fp32
    # in any order, so rstd may only err by the rounding of /H, +eps, sqrt and 1/x (5u). This
    # makes the fp32 check tight (and would expose an element left out of the sum, or counted
    # twice, which the accumulation allowance of the general bound could hide for large H).
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-8, 9, (3, hidden), generator=g).to(device=device, dtype=dtype)
    w = make_weight("same", hidden, dtype, device)
    out = nan_like(x.shape, dtype, device)
    kernel.rms_norm(out, x, w, EPS)
    check_forward(
        kernel, out, x, w, EPS, norm_dtype=dtype, exact_sum=True, what="rms_norm, exact sum"
    )
    rstd = kernel.apply_rms_norm(x, w, EPS, return_rstd=True)[1]
    parts = Parts(kernel, x, w, EPS)
    assert_within(
        rstd,
        parts.rstd.squeeze(-1),
        rstd_error(hidden, exact_sum=True) * parts.rstd.squeeze(-1),
        "rstd",
    )
    check_forward(
        kernel,
        kernel.rms_norm_func(x, w, EPS, gemma=True),
        x,
        w,
        EPS,
        norm_dtype=None,
        weight_offset=1.0,
        exact_sum=True,
        what="gemma, exact sum",
    )


@pytest.mark.parametrize("hidden", [4097, BIG_HIDDEN])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_element_counted(kernel, device, dtype, hidden):
    # One non-zero element per row, at the head, the middle and the tail (the last vector and the
    # scalar remainder): its square is the whole sum, so out[i, p] = a / sqrt(a^2 / H + eps) and
    # every other element is 0. A position skipped by the reduction gives 1/sqrt(eps) instead.
    positions = [0, 1, 7, hidden // 2, hidden - 9, hidden - 8, hidden - 2, hidden - 1]
    x = torch.zeros(len(positions), hidden)
    for i, p in enumerate(positions):
        x[i, p] = 3.0 if i % 2 else -2.5
    x = x.to(device=device, dtype=dtype).reshape(2, len(positions) // 2, hidden)
    w = make_weight("same", hidden, dtype, device)
    check_forward(
        kernel,
        kernel.rms_norm(nan_like(x.shape, dtype, device), x, w, EPS),
        x,
        w,
        EPS,
        norm_dtype=dtype,
        exact_sum=True,
        what="rms_norm spikes",
    )
    check_forward(
        kernel,
        kernel.rms_norm_func(x, w, EPS),
        x,
        w,
        EPS,
        norm_dtype=dtype,
        exact_sum=True,
        what="func spikes",
    )
    xg = x.clone().requires_grad_()
    y = kernel.rms_norm_func(xg, w, EPS)
    grad_out = _grad_out(y.shape, dtype, device)
    (gx,) = torch.autograd.grad(y, [xg], grad_out)
    check_grads(kernel, {"input": gx}, x, w, grad_out, EPS, what="spikes backward")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_values(kernel, device, dtype):
    # A zero row (rstd = 1/sqrt(eps), out = 0), one spike, large values whose squares overflow
    # fp16 but not the fp32 accumulation, tiny values (squares underflow fp32; eps dominates).
    hidden = 19
    big = 6.0e4 if dtype == F16 else 1.0e15
    tiny = 1.0e-7 if dtype == F16 else 1.0e-25
    rows = [
        torch.zeros(hidden),
        torch.cat([torch.tensor([5.0]), torch.zeros(hidden - 1)]),
        torch.full((hidden,), big) * torch.tensor([(-1.0) ** i for i in range(hidden)]),
        torch.full((hidden,), tiny),
        torch.linspace(-4, 4, hidden),
    ]
    x = torch.stack(rows).to(device=device, dtype=dtype)
    w = make_weight("same", hidden, dtype, device)
    for what, fn in (
        ("rms_norm", lambda: kernel.rms_norm(nan_like(x.shape, dtype, device), x, w, EPS)),
        ("rms_norm_func", lambda: kernel.rms_norm_func(x, w, EPS)),
    ):
        out = fn()
        assert bool(out.isfinite().all()), what
        parts = Parts(kernel, x, w, EPS)
        assert_within(out, parts.y, forward_bound(parts, dtype, dtype), f"{what} special {dtype}")
    assert bool((out[0] == 0).all())


# ---- layouts ----


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_views(kernel, device, dtype):
    # input, out, residual are column slices of wider buffers (row stride != hidden, offset base)
    # and row-strided slices; padding outside the written views must stay NaN.
    hidden = 13
    w = make_weight("same", hidden, dtype, device)
    x = make_input((5, 3, hidden + 7), dtype, device)[..., 3 : 3 + hidden]
    out_buf = nan_like((5, 3, hidden + 5), dtype, device)
    out = out_buf[..., 2 : 2 + hidden]
    kernel.rms_norm(out, x, w, EPS)
    check_forward(kernel, out, x, w, EPS, norm_dtype=dtype, what="column slices")
    assert out_buf[..., :2].isnan().all() and out_buf[..., 2 + hidden :].isnan().all()

    x_rows = make_input((10, hidden), dtype, device, seed=2)[::2]
    out_buf = nan_like((10, hidden), dtype, device)
    kernel.rms_norm(out_buf[1::2], x_rows, w, EPS)
    check_forward(kernel, out_buf[1::2], x_rows, w, EPS, norm_dtype=dtype, what="row slices")
    assert out_buf[0::2].isnan().all()

    # In place on views: vLLM's fused add on column slices of wider buffers.
    xi = make_input((6, hidden + 4), dtype, device, seed=9)[:, 3 : 3 + hidden]
    ri = make_input((6, hidden + 2), dtype, device, seed=10)[:, :hidden]
    x0, r0 = xi.clone(), ri.clone()
    kernel.fused_add_rms_norm(xi, ri, w, EPS)
    assert torch.equal(ri, kernel._reference.add_rms_norm(x0, r0)[1])
    check_forward(kernel, xi, ri, w, EPS, norm_dtype=dtype, what="fused add on views")

    # The differentiable forms take views as well (inputs and gradients).
    xv = make_input((4, hidden + 3), dtype, device, seed=10)[:, 1 : 1 + hidden].requires_grad_()
    y = kernel.rms_norm_func(xv, w, EPS)
    grad_out = _grad_out((4, hidden + 2), dtype, device)[:, :hidden]
    (gx,) = torch.autograd.grad(y, [xv], grad_out)
    check_grads(kernel, {"input": gx}, xv, w, grad_out, EPS, what="views backward")


# Decode-sized inputs on the vector path (CUDA: up to 4 rows per SM, one row per CTA of 96 to 768
# threads, 1 to 8 vectors per thread): hidden 768 (3 warps), 2880 (360 vectors: idle threads in the
# last warp), 8192, 16384 and 32768 (bf16: 2, 4 and 8 vectors per thread); a row stride.
@pytest.mark.parametrize("hidden", [768, 2880, 8192, 16384, 32768])
@pytest.mark.parametrize("wkind", WEIGHT_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_sized_rows(kernel, device, dtype, wkind, hidden):
    w = make_weight(wkind, hidden, dtype, device)
    x_buf = make_input((3, hidden + 8), dtype, device, seed=4)
    for x in (x_buf[:1, :hidden], x_buf[:, :hidden]):
        out = nan_like(x.shape, dtype, device)
        kernel.rms_norm(out, x, w, EPS)
        check_forward(kernel, out, x, w, EPS, norm_dtype=dtype, what=f"rms_norm {tuple(x.shape)}")
        residual = make_input(x.shape, dtype, device, seed=6)
        for gemma in (False, True):
            xi, ri = x.clone(), residual.clone()
            fused_add = kernel.gemma_fused_add_rms_norm if gemma else kernel.fused_add_rms_norm
            fused_add(xi, ri, w, EPS)
            assert torch.equal(ri, kernel._reference.add_rms_norm(x, residual)[1])
            norm_dtype, offset = (None, 1.0) if gemma else (dtype, 0.0)
            what = f"{'gemma_' if gemma else ''}fused_add {tuple(x.shape)}"
            check_forward(
                kernel, xi, ri, w, EPS, norm_dtype=norm_dtype, weight_offset=offset, what=what
            )


def test_decode_size_boundary(kernel, device):
    # The last decode-sized row count (4 x SMs on CUDA) and the next, which takes the general
    # kernel: both agree with the reference.
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device != "cpu" else 2
    w = make_weight("same", 4096, BF16, device)
    for rows in (4 * sms, 4 * sms + 1):
        x = make_input((rows, 4096), BF16, device, seed=rows)
        out = nan_like(x.shape, BF16, device)
        kernel.rms_norm(out, x, w, EPS)
        check_forward(kernel, out, x, w, EPS, norm_dtype=BF16, what=f"rms_norm {rows} rows")


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_rows_prefetched_into_l2(kernel, device, dtype):
    # 32 MB inputs and more: the CUDA forward prefetches rows about half a wave ahead into L2
    # (hidden 8192: 264 bf16 rows ahead on 132 SMs; 132 fused): the last rows have none to
    # prefetch, and a row-strided view must prefetch its own rows, not those in between.
    if device == "cpu":
        pytest.skip("a CUDA launch path (the CPU kernel is covered by the other shapes)")
    hidden = 8192
    rows = (32 << 20) // (hidden * dtype.itemsize) + 3
    w = make_weight("same", hidden, dtype, device)
    x = make_input((rows, hidden), dtype, device, seed=4)
    out = nan_like(x.shape, dtype, device)
    kernel.rms_norm(out, x, w, EPS)
    check_forward(kernel, out, x, w, EPS, norm_dtype=dtype, what="many rows")
    x_rows = make_input((2 * rows, hidden), dtype, device, seed=5)[::2]
    out_buf = nan_like((2 * rows, hidden), dtype, device)
    kernel.rms_norm(out_buf[1::2], x_rows, w, EPS)
    check_forward(kernel, out_buf[1::2], x_rows, w, EPS, norm_dtype=dtype, what="many strided rows")
    assert out_buf[0::2].isnan().all()
    residual = make_input(x.shape, dtype, device, seed=6)
    expected_residual = kernel._reference.add_rms_norm(x, residual)[1]
    xi, ri = x.clone(), residual.clone()
    kernel.fused_add_rms_norm(xi, ri, w, EPS)
    assert torch.equal(ri, expected_residual)
    check_forward(kernel, xi, ri, w, EPS, norm_dtype=dtype, what="many rows, fused add")


# The first forward calls of a fresh process, made inside a CUDA-graph capture: their host code
# (device queries, the shared-memory carveout hint) must not break the capture. Decode rows (row
# kernel), rows past the decode size (general kernel) and a 32 MB input (its L2-prefetching
# instance); the replayed graph must equal eager calls made afterwards.
_FIRST_CALLS_IN_CAPTURE = r"""
import kernels, torch
k = kernels.get_kernel("open-kernels/rmsnorm", version=1)
sms = torch.cuda.get_device_properties(0).multi_processor_count
gen = torch.Generator(device="cuda").manual_seed(0)
xs = [torch.randn(r, 4096, device="cuda", dtype=torch.bfloat16, generator=gen) for r in (3, 4 * sms + 1, 4096)]
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, generator=gen)
outs = [torch.full_like(x, float("nan")) for x in xs]
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    for out, x in zip(outs, xs):
        k.rms_norm(out, x, w, 1e-6)
graph.replay()
torch.cuda.synchronize()
for out, x in zip(outs, xs):
    assert torch.equal(out, k.rms_norm(torch.empty_like(x), x, w, 1e-6)), x.shape
print("ok")
"""


def test_first_calls_inside_graph_capture(kernel, device):
    if device == "cpu":
        pytest.skip("CUDA graphs")
    run_in_fresh_process(_FIRST_CALLS_IN_CAPTURE)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_non_collapsible_inputs(kernel, device, dtype):
    # Read tensors that do not fit one row stride are read through a contiguous copy.
    hidden = 13
    w = make_weight("same", hidden, dtype, device)
    views = {
        "transposed leading dims": lambda b: b.transpose(0, 1),
        "last-dim stride 2": lambda b: b[:, ::2],
        "broadcast rows (stride 0)": lambda b: b.expand(6, hidden),
        "permuted 4-D": lambda b: b.permute(2, 0, 1, 3),
    }
    bases = {
        "transposed leading dims": (4, 3, hidden),
        "last-dim stride 2": (5, 2 * hidden),
        "broadcast rows (stride 0)": (1, hidden),
        "permuted 4-D": (2, 3, 2, hidden),
    }
    for what, view in views.items():
        base = make_input(bases[what], dtype, device).requires_grad_()
        x = view(base)
        out = nan_like(x.shape, dtype, device)
        kernel.rms_norm(out, x.detach(), w, EPS)
        check_forward(kernel, out, x, w, EPS, norm_dtype=dtype, what=what)
        y = kernel.rms_norm_func(x, w, EPS)
        torch.testing.assert_close(y, out, rtol=0, atol=0)
        grad_out = _grad_out(y.shape, dtype, device).transpose(0, -1).contiguous().transpose(0, -1)
        (gx,) = torch.autograd.grad(y, [x], grad_out)  # x is a non-leaf view: its own gradient
        check_grads(kernel, {"input": gx}, x, w, grad_out, EPS, what=f"{what} grad")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("shape", [(0, 16), (2, 0, 8), (0, 3, 5)], ids=str)
def test_empty(kernel, device, shape):
    # No rows: nothing is written, the weight/scale/shift gradients (sums over no rows) are 0.
    hidden = shape[-1]
    x = torch.empty(shape, device=device)
    w = make_weight("same", hidden, F32, device)
    out = torch.empty(shape, device=device)
    assert kernel.rms_norm(out, x, w, EPS) is out
    r = torch.empty(shape, device=device)
    kernel.fused_add_rms_norm(x, r, w, EPS)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = kernel.rms_norm_func(xg, wg, EPS)
    assert y.shape == x.shape
    gx, gw = torch.autograd.grad(y, [xg, wg], torch.empty_like(y))
    assert gx.shape == x.shape and torch.equal(gw, torch.zeros_like(w))

    grad_weight = nan_like(w.shape, F32, device)
    batch = shape[0]
    scale = torch.zeros(batch, hidden, device=device)
    grad_scale, grad_shift = nan_like(scale.shape, F32, device), nan_like(scale.shape, F32, device)
    kernel.ops.rms_norm_bwd(
        torch.empty(shape, device=device),
        grad_weight,
        grad_scale,
        grad_shift,
        torch.empty(shape, device=device),
        x,
        w,
        None,
        scale,
        EPS,
        0.0,
        None,
    )
    assert torch.equal(grad_weight, torch.zeros_like(w))
    assert torch.equal(grad_scale, torch.zeros_like(scale)) and torch.equal(
        grad_shift, torch.zeros_like(scale)
    )


# ---- the general ops, called directly ----


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_general_ops(kernel, device, dtype):
    # rms_norm_fwd with a fused add and rstd; rms_norm_bwd with grad_residual, in place on
    # grad_out (allowed: same view), every output NaN-poisoned.
    hidden = 31
    x, w = _setup(((3, 4), hidden), dtype, "fp32", device)
    residual = make_input(x.shape, dtype, device, seed=3)
    out, res_out = nan_like(x.shape, F32, device), nan_like(x.shape, dtype, device)
    rstd = nan_like(x.shape[:-1], F32, device)
    kernel.ops.rms_norm_fwd(out, x, w, residual, res_out, None, None, rstd, EPS, 0.0, dtype)
    assert torch.equal(res_out, kernel._reference.add_rms_norm(x, residual)[1])
    parts = check_forward(kernel, out, res_out, w, EPS, norm_dtype=dtype, what="rms_norm_fwd")
    assert_within(rstd, parts.rstd.squeeze(-1), rstd_error(hidden) * parts.rstd.squeeze(-1), "rstd")

    grad_out = _grad_out(x.shape, F32, device)
    grad_res = _grad_out(x.shape, dtype, device, seed=4)
    grad_input, grad_weight = nan_like(x.shape, dtype, device), nan_like(w.shape, F32, device)
    kernel.ops.rms_norm_bwd(
        grad_input, grad_weight, None, None, grad_out, res_out, w, grad_res, None, EPS, 0.0, dtype
    )
    check_grads(
        kernel,
        {"input": grad_input, "weight": grad_weight},
        res_out,
        w,
        grad_out,
        EPS,
        grad_residual=grad_res,
        what="rms_norm_bwd",
    )
    # grad_input may be grad_residual itself (in place).
    in_place = grad_res.clone()
    kernel.ops.rms_norm_bwd(
        in_place, None, None, None, grad_out, res_out, w, in_place, None, EPS, 0.0, dtype
    )
    assert torch.equal(in_place, grad_input)


@pytest.mark.kernels_ci
def test_deterministic(kernel, device):
    x, w = _setup(((37,), 1031), BF16, "fp32", device)
    x.requires_grad_()
    w.requires_grad_()
    runs = []
    for _ in range(2):
        y = kernel.rms_norm_func(x, w, EPS)
        runs.append((y, *torch.autograd.grad(y, [x, w], torch.ones_like(y))))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(300, 1031), (1, 100003), (4099, 3)], ids=str)
def test_thread_count_does_not_change_rows(kernel, device, shape):
    # The CPU work split depends on the thread count; per-row results (forward, grad_input)
    # must not. (grad_weight sums chunk partials, whose count follows the threads.)
    if device != "cpu":
        pytest.skip("CPU threading")
    x = make_input(shape, BF16, device).requires_grad_()
    w = make_weight("same", shape[-1], BF16, device)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, max(2, threads)):
            torch.set_num_threads(n)
            y = kernel.rms_norm_func(x, w, EPS)
            results.append((y, *torch.autograd.grad(y, [x], torch.ones_like(y))))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


# ---- API and validation ----

PUBLIC = [
    "rms_norm",
    "fused_add_rms_norm",
    "gemma_rms_norm",
    "gemma_fused_add_rms_norm",
    "rmsnorm",
    "fused_add_rmsnorm",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "rms_norm_func",
    "add_rms_norm",
    "rms_norm_modulate",
    "apply_rms_norm",
    "apply_rms_norm_backward",
    "attach_layers",  # puts the layers on a model's modules by host class
]


@pytest.mark.kernels_ci
def test_public_api(kernel):
    assert sorted(kernel.__all__) == sorted(PUBLIC + ["layers"])
    assert "ops" not in kernel.__all__ and hasattr(kernel, "ops")
    for name in PUBLIC:
        fn = getattr(kernel, name)
        assert callable(fn) and fn.__doc__, name


@pytest.mark.kernels_ci
def test_out_forms_are_not_differentiable(kernel, device):
    x = make_input((4, 8), F32, device).requires_grad_()
    out = torch.empty(4, 8, device=device)
    kernel.rms_norm(out, x, None, EPS)
    assert out.grad_fn is None
    assert kernel.rmsnorm(x, None, EPS).grad_fn is not None


def _raises(arg):
    # The message names the argument (C++ layer eagerly, the fakes under tracing).
    return pytest.raises(RuntimeError, match=rf"\b{arg}\b")


def _bad_calls(kernel, device, convert=lambda t: t):
    """(argument named in the message, call) pairs for every kind of bad input."""
    x = convert(make_input((5, 8), BF16, device))
    w = convert(make_weight("same", 8, BF16, device))
    out = convert(torch.empty(5, 8, dtype=BF16, device=device))
    x3 = convert(make_input((2, 3, 8), BF16, device))
    sc = convert(torch.zeros(2, 8, dtype=BF16, device=device))
    return [
        # hidden size mismatches
        ("weight", lambda: kernel.rms_norm(out, x, w[:7], EPS)),
        ("weight", lambda: kernel.rms_norm_func(x, w[:7], EPS)),
        ("residual", lambda: kernel.fused_add_rms_norm(x.clone(), x[:, :7].clone(), w, EPS)),
        ("residual", lambda: kernel.add_rms_norm(x, x[:, :7], w, EPS)),
        ("scale", lambda: kernel.rms_norm_modulate(x3, w, sc[:, :7], sc, EPS)),
        ("shift", lambda: kernel.rms_norm_modulate(x3, w, sc, sc[:, :7], EPS)),
        (
            "scale",
            lambda: kernel.rms_norm_modulate(
                x3, w, torch.zeros(3, 8, dtype=BF16, device=device), sc, EPS
            ),
        ),
        ("out", lambda: kernel.rms_norm(torch.empty(5, 7, dtype=BF16, device=device), x, w, EPS)),
        # dtype mismatches
        ("weight", lambda: kernel.rms_norm(out, x, w.half(), EPS)),
        ("residual", lambda: kernel.fused_add_rms_norm(x.clone(), x.half(), w, EPS)),
        ("residual", lambda: kernel.add_rms_norm(x, x.float(), w, EPS)),
        ("out", lambda: kernel.rms_norm(out.half(), x, w, EPS)),
        ("scale", lambda: kernel.rms_norm_modulate(x3, w, sc.float(), sc, EPS)),
        ("shift", lambda: kernel.rms_norm_modulate(x3, w, sc, sc.half(), EPS)),
        # eps <= 0
        ("epsilon", lambda: kernel.rms_norm(out, x, w, 0.0)),
        ("epsilon", lambda: kernel.rms_norm_func(x, w, -1e-6)),
        ("epsilon", lambda: kernel.add_rms_norm(x, x, w, 0.0)),
        ("epsilon", lambda: kernel.rms_norm_modulate(x3, w, sc, sc, -1.0)),
        ("epsilon", lambda: kernel.gemma_rmsnorm(x, w, 0.0)),
        # unsupported dtypes
        ("input", lambda: kernel.rms_norm(out.double(), x.double(), None, EPS)),
        ("input", lambda: kernel.rms_norm_func(x.double(), None, EPS)),
        ("input", lambda: kernel.rms_norm_func(x.double(), w.double(), EPS)),
        (
            "input",
            lambda: kernel.rmsnorm(torch.ones(5, 8, dtype=torch.int32, device=device), None, EPS),
        ),
        (
            "input",
            lambda: kernel.rms_norm_modulate(x3.double(), None, sc.double(), sc.double(), EPS),
        ),
        ("weight", lambda: kernel.rms_norm_func(x.float(), w.double(), EPS)),
    ]


@pytest.mark.kernels_ci
def test_bad_inputs(kernel, device):
    for arg, call in _bad_calls(kernel, device):
        with _raises(arg):
            call()


@pytest.mark.kernels_ci
def test_bad_inputs_under_tracing(kernel, device):
    # The fakes reject the same calls, naming the same argument, so compiled code fails at
    # trace time with a useful message.
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    calls = _bad_calls(kernel, device, convert=mode.from_tensor)
    with mode:
        for arg, call in calls:
            with _raises(arg):
                call()


@pytest.mark.kernels_ci
def test_layout_errors(kernel, device):
    x = make_input((5, 8), F32, device)
    with _raises("out"):  # written tensors need unit stride along hidden
        kernel.rms_norm(torch.empty(8, 5, device=device).t(), x, None, EPS)
    with _raises("out"):  # out may be input itself, but not a shifted view of it
        buf = make_input((5, 9), F32, device)
        kernel.rms_norm(buf[:, 1:], buf[:, :8], None, EPS)


def test_device_mismatch(kernel, device):
    # On CPU-only machines a meta tensor stands in for the second device.
    other = "cpu" if device == "cuda" else "meta"
    x = make_input((5, 8), F32, device)
    w = torch.ones(8, device=other)
    with _raises("weight"):
        kernel.rms_norm(torch.empty_like(x), x, w, EPS)
    with _raises("weight"):
        kernel.rms_norm_func(x, w, EPS)
    if device == "cuda":
        with _raises("out"):
            kernel.rms_norm(torch.empty(5, 8), x, None, EPS)
        with _raises("residual"):
            kernel.add_rms_norm(x, x.cpu(), None, EPS)
