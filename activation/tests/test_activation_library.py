"""torch.library conformance of the activation ops: opcheck, torch.compile parity, no recompiles.

`opcheck` runs on every C++ op (forward `<op>` and backward `<op>_bwd`) and on every allocating
custom op (`<op>_functional`, `<op>_bwd_functional`): schema, fake kernel, autograd registration
and AOT dispatch. The compiled (fullgraph) forward and backward must equal eager bit for bit,
since both run the same opaque kernels.
"""

import pytest
import torch
from activation_cases import CASE_IDS, CASES, DEFAULT_CASE_IDS, DEFAULT_CASES, make_input


def _scalars(case):
    return tuple(case.scalars.values())


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_opcheck_out_ops(kernel, device, case):
    x = make_input(case.input_shape((3, 2), 9), torch.float32, device)
    out = torch.empty(case.out_shape(x.shape), device=device)
    torch.library.opcheck(getattr(kernel.ops, case.name).default, (out, x, *_scalars(case)))
    grad_out = make_input(out.shape, torch.float32, device, scale=1.0, seed=1)
    grad_input = torch.empty_like(x)
    torch.library.opcheck(
        getattr(kernel.ops, case.name + "_bwd").default, (grad_input, grad_out, x, *_scalars(case))
    )


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_opcheck_functional_ops(kernel, device, case):
    x = make_input(case.input_shape((3, 2), 9), torch.float32, device).requires_grad_()
    torch.library.opcheck(
        getattr(kernel.ops, case.name + "_functional").default, (x, *_scalars(case))
    )
    grad_out = make_input(case.out_shape(x.shape), torch.float32, device, scale=1.0, seed=1)
    torch.library.opcheck(
        getattr(kernel.ops, case.name + "_bwd_functional").default,
        (grad_out, x.detach(), *_scalars(case)),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_compile_parity(kernel, device, case, dtype):
    torch._dynamo.reset()

    def functional(x):
        return case.call(kernel, x)

    def out_param(out, x):
        return case.call(kernel, out, x)

    x = make_input(case.input_shape((5, 3), 13), dtype, device)
    grad_out = make_input(case.out_shape(x.shape), dtype, device, scale=1.0, seed=1)

    xe = x.clone().requires_grad_()
    ye = functional(xe)
    (ge,) = torch.autograd.grad(ye, xe, grad_out)

    xc = x.clone().requires_grad_()
    yc = torch.compile(functional, fullgraph=True)(xc)
    (gc,) = torch.autograd.grad(yc, xc, grad_out)
    torch.testing.assert_close(yc, ye, rtol=0, atol=0)
    torch.testing.assert_close(gc, ge, rtol=0, atol=0)

    out = torch.full_like(ye, float("nan"))
    result = torch.compile(out_param, fullgraph=True)(out, x)
    torch.testing.assert_close(out, ye.detach(), rtol=0, atol=0)
    torch.testing.assert_close(result, out, rtol=0, atol=0)


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=DEFAULT_CASE_IDS)
def test_no_recompile_across_batch_sizes(kernel, device, case):
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: case.call(kernel, x), fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for tokens in (5, 9, 33):
            x = make_input(
                case.input_shape((tokens,), 12), torch.float32, device, seed=tokens
            ).requires_grad_()
            torch._dynamo.mark_dynamic(x, 0)
            y = compiled(x)
            (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
            xe = x.detach().clone().requires_grad_()
            ye = case.call(kernel, xe)
            (grad_e,) = torch.autograd.grad(ye, xe, torch.ones_like(ye))
            torch.testing.assert_close(y, ye, rtol=0, atol=0)
            torch.testing.assert_close(grad, grad_e, rtol=0, atol=0)


@pytest.mark.kernels_ci
def test_fake_kernels_validate(kernel, device):
    # Shape errors surface at trace time, with the op name and the argument.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 7, device=device)
        with pytest.raises(
            RuntimeError, match=r"silu_and_mul: input last dimension must be even \(2 \* d\), got 7"
        ):
            kernel.silu_and_mul(x)
        with pytest.raises(
            RuntimeError,
            match=r"gelu: out must have shape \[4, 7\] \(the input shape\), got \[4, 3\]",
        ):
            kernel.gelu(torch.empty(4, 3, device=device), x)
        with pytest.raises(
            RuntimeError, match=r"silu_and_mul_bwd: grad_out must have shape \[4, 4\]"
        ):
            kernel.ops.silu_and_mul_bwd_functional(
                torch.empty(4, 3, device=device), torch.empty(4, 8, device=device)
            )
        y = kernel.silu_and_mul(torch.empty(4, 10, device=device))
        assert y.shape == (4, 5)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("enable_pdl", [None, True, False], ids=str)
def test_enable_pdl_reaches_the_ops(kernel, device, enable_pdl):
    """enable_pdl is an argument of every op (schema `bool? enable_pdl=None`), of the allocating
    ops and of the Python functions; it changes how the CUDA kernel is launched, never the result
    (the CPU ignores it)."""
    x = make_input((3, 2, 18), torch.float32, device)
    out = torch.empty(3, 2, 9, device=device)
    torch.library.opcheck(kernel.ops.silu_and_mul.default, (out, x, enable_pdl))
    torch.library.opcheck(kernel.ops.fatrelu_and_mul.default, (out, x, 0.5, enable_pdl))
    grad_out = make_input((3, 2, 9), torch.float32, device, scale=1.0, seed=1)
    torch.library.opcheck(
        kernel.ops.silu_and_mul_bwd.default, (torch.empty_like(x), grad_out, x, enable_pdl)
    )
    xg = x.clone().requires_grad_()
    torch.library.opcheck(kernel.ops.silu_and_mul_functional.default, (xg, enable_pdl))
    torch.library.opcheck(kernel.ops.silu_and_mul_bwd_functional.default, (grad_out, x, enable_pdl))

    expected = kernel.silu_and_mul(x)
    assert torch.equal(kernel.silu_and_mul(x, enable_pdl=enable_pdl), expected)
    assert torch.equal(
        kernel.silu_and_mul(torch.empty_like(expected), x, enable_pdl=enable_pdl), expected
    )
    assert torch.equal(kernel.gelu(x, enable_pdl=enable_pdl), kernel.gelu(x))
    y = kernel.silu_and_mul(xg, enable_pdl=enable_pdl)
    (g,) = torch.autograd.grad(y, xg, grad_out)
    (g0,) = torch.autograd.grad(kernel.silu_and_mul(xg), xg, grad_out)
    assert torch.equal(g, g0)
