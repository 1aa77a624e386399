"""torch.library conformance of the newkernel ops: opcheck (schema, fake kernel, autograd
registration, AOT dispatch), torch.compile parity with eager, no recompiles across sizes."""

import pytest
import torch
from newkernel_cases import make_input


@pytest.mark.kernels_ci
def test_opcheck(kernel, device):
    x = make_input((3, 2, 9), torch.float32, device)
    torch.library.opcheck(kernel.ops.scale.default, (torch.empty_like(x), x, 0.5))
    torch.library.opcheck(kernel.ops.scale_functional.default, (x.requires_grad_(), 0.5))


def test_compile_parity(kernel, device):
    # The compiled (fullgraph) forward and backward run the same opaque kernels: equal to eager
    # bit for bit; the dynamic token dimension must not recompile.
    torch._dynamo.reset()

    def functional(x):
        return kernel.scale(x, 0.5)

    def out_param(out, x):
        return kernel.scale(x, 0.5, out=out)

    compiled = torch.compile(functional, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for tokens in (5, 9, 33):
            x = make_input((tokens, 13), torch.float32, device, seed=tokens).requires_grad_()
            torch._dynamo.mark_dynamic(x, 0)
            y = compiled(x)
            (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
            torch.testing.assert_close(y, functional(x), rtol=0, atol=0)
            torch.testing.assert_close(grad, torch.full_like(x, 0.5), rtol=0, atol=0)
    x = make_input((5, 13), torch.float32, device)
    out = torch.full_like(x, float("nan"))
    torch.compile(out_param, fullgraph=True)(out, x)
    torch.testing.assert_close(out, functional(x), rtol=0, atol=0)


@pytest.mark.kernels_ci
def test_fake_kernels_validate(kernel, device):
    # Errors surface at trace time, with the op name and the argument.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 7, device=device)
        with pytest.raises(RuntimeError, match=r"scale: out must have shape \[4, 7\]"):
            kernel.ops.scale(torch.empty(4, 3, device=device), x)
        with pytest.raises(RuntimeError, match=r"scale: input must be float32"):
            kernel.ops.scale_functional(torch.empty(4, 7, dtype=torch.int32, device=device))
        assert kernel.scale(x).shape == (4, 7)
