"""Values, layouts and backward of the newkernel ops against the float64 reference.

Outputs are pre-filled with NaN, so an element the kernel does not write fails the bound, and
padding around an output view must still be NaN afterwards.
"""

import pytest
import torch
from newkernel_cases import DTYPES, assert_within_bound, make_input

NAN = float("nan")
ALPHA = -1.75

# 0-d to 4-D, odd and prime sizes (a CUDA vector tail), one wide row, enough rows for every
# thread.
SHAPES = [(), (1,), (7,), (13, 127), (3, 5, 7), (2, 3, 4, 5), (1, 4097), (83, 33), (2, 100_003)]


def _reference(kernel, x, alpha=ALPHA):
    return kernel._reference.scale(x, alpha, compute_dtype=torch.float64)


def _poisoned(shape, dtype, device):
    return torch.full(shape, NAN, dtype=dtype, device=device)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scale(kernel, device, dtype, shape):
    x = make_input(shape, dtype, device)
    out = _poisoned(shape, dtype, device)
    assert kernel.scale(x, ALPHA, out=out) is out
    assert_within_bound(out, _reference(kernel, x), f"scale {dtype} {shape}")
    # The allocating form runs the same kernel.
    y = kernel.scale(x, ALPHA)
    assert y.shape == x.shape and y.dtype == dtype
    torch.testing.assert_close(y, out, rtol=0, atol=0)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scale_ci(kernel, device, dtype):
    x = make_input((7, 3, 127), dtype, device)
    out = _poisoned(x.shape, dtype, device)
    kernel.scale(x, ALPHA, out=out)
    assert_within_bound(out, _reference(kernel, x), f"scale {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_views(kernel, device, dtype):
    # Column slices of wider buffers (row stride != width, offset base) and every other row;
    # the padding outside the out view stays NaN.
    x = make_input((5, 3, 20), dtype, device)[..., 3:16]
    buf = _poisoned((5, 3, 18), dtype, device)
    out = buf[..., 2:15]
    kernel.scale(x, ALPHA, out=out)
    assert_within_bound(out, _reference(kernel, x), f"{dtype} column slice")
    assert buf[..., :2].isnan().all() and buf[..., 15:].isnan().all()

    x = make_input((10, 13), dtype, device, seed=1)[::2]
    buf = _poisoned((10, 13), dtype, device)
    kernel.scale(x, ALPHA, out=buf[1::2])
    assert_within_bound(buf[1::2], _reference(kernel, x), f"{dtype} rows")
    assert buf[0::2].isnan().all()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_collapsible_inputs(kernel, device, dtype):
    # Read tensors that do not fit one row stride are read through a contiguous copy.
    views = {
        "transposed leading dims": make_input((4, 3, 13), dtype, device).transpose(0, 1),
        "last-dim stride 2": make_input((5, 26), dtype, device)[:, ::2],
        "broadcast rows (stride 0)": make_input((1, 13), dtype, device).expand(6, 13),
        "transposed matrix": make_input((13, 6), dtype, device).t(),
    }
    for what, x in views.items():
        out = _poisoned(x.shape, dtype, device)
        kernel.scale(x, ALPHA, out=out)
        assert_within_bound(out, _reference(kernel, x), what)
        assert_within_bound(kernel.scale(x, ALPHA), _reference(kernel, x), what + " allocating")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("shape", [(0,), (0, 16), (3, 0), (2, 0, 5)], ids=str)
def test_empty(kernel, device, shape):
    x = torch.empty(shape, device=device, requires_grad=True)
    out = torch.empty(shape, device=device)
    assert kernel.scale(x.detach(), ALPHA, out=out) is out
    y = kernel.scale(x, ALPHA)
    assert y.shape == x.shape
    (grad,) = torch.autograd.grad(y, x, torch.empty_like(y))
    assert grad.shape == x.shape


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward(kernel, device, dtype):
    x = make_input((5, 3, 13), dtype, device).requires_grad_()
    grad_out = make_input(x.shape, dtype, device, seed=1)
    (grad,) = torch.autograd.grad(kernel.scale(x, ALPHA), x, grad_out)
    assert grad.dtype == dtype and grad.shape == x.shape
    assert_within_bound(grad, _reference(kernel, grad_out), f"{dtype} grad")


@pytest.mark.kernels_ci
def test_gradcheck(kernel, device):
    x = make_input((3, 5), torch.float64, device).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: kernel.scale(t, 0.5), (x,))
    assert torch.autograd.gradgradcheck(lambda t: kernel.scale(t, 0.5), (x,))


@pytest.mark.kernels_ci
def test_out_form_is_not_differentiable(kernel, device):
    x = make_input((4, 6), torch.float32, device).requires_grad_()
    out = torch.empty(4, 6, device=device)
    kernel.scale(x, ALPHA, out=out)
    assert out.grad_fn is None
    assert kernel.scale(x, ALPHA).grad_fn is not None


@pytest.mark.kernels_ci
def test_public_api(kernel):
    assert sorted(kernel.__all__) == ["layers", "scale"]
    assert "ops" not in kernel.__all__ and hasattr(kernel, "ops")


def test_thread_count_does_not_change_results(kernel, device):
    # The CPU work split depends on the thread count; results must not.
    if device != "cpu":
        pytest.skip("CPU threading")
    x = make_input((300, 1031), torch.bfloat16, device)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel.scale(x, ALPHA)
        torch.set_num_threads(max(2, threads))
        many = kernel.scale(x, ALPHA)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(one, many, rtol=0, atol=0)
