"""Bad input: a rejected call raises, and its message names the offending argument.

Memory overlap between a written tensor and another argument is tested exactly by the C++ layer
(torch_checks::may_overlap), also for strided views of one buffer: a real overlap is refused,
interleaved views that share no element run.
"""

import pytest
import torch
from rmsnorm_cases import F32, check_forward, make_input, make_weight

EPS = 1e-6
HIDDEN = 16


def _raises(arg):
    return pytest.raises(RuntimeError, match=rf"(?<![\w.]){arg}(?!\w)")


@pytest.mark.kernels_ci
def test_strided_out_overlapping_input_is_refused(kernel, device):
    # Row views of one [6, 40] buffer (row stride 40): ATen finds them "too hard".
    buf = make_input((6, 40), F32, device)
    w = make_weight("same", HIDDEN, F32, device)
    with _raises("rms_norm: out must be input itself"):  # in place is allowed, overlap is not
        kernel.rms_norm(buf[:, 8:24], buf[:, :16], w, EPS)  # columns 8..15 of each row are both
    with _raises("rms_norm: out must not share memory with weight"):
        kernel.rms_norm(buf[0, 16:32], buf[1, :16], buf[0, 24:40], EPS)
    with _raises("fused_add_rms_norm: input must not share memory with residual"):
        kernel.fused_add_rms_norm(buf[:, :16], buf[:, 12:28], w, EPS)


@pytest.mark.kernels_ci
def test_disjoint_strided_views_of_one_buffer_run(kernel, device):
    # The two halves of the last dimension: their address ranges interleave, no element is shared.
    buf = make_input((6, 2 * HIDDEN), F32, device)
    w = make_weight("same", HIDDEN, F32, device)
    x, out = buf[:, :HIDDEN], buf[:, HIDDEN:]
    x0 = x.clone()
    kernel.rms_norm(out, x, w, EPS)
    assert torch.equal(x, x0)
    check_forward(kernel, out, x0, w, EPS, norm_dtype=F32, what="halves of one buffer")
    # fused add in place on the even and odd rows of one buffer.
    buf = make_input((12, HIDDEN), F32, device, seed=1)
    xi, ri = buf[0::2], buf[1::2]
    x0, r0 = xi.clone(), ri.clone()
    kernel.fused_add_rms_norm(xi, ri, w, EPS)
    expected_r = x0 + r0
    torch.testing.assert_close(ri, expected_r)
    check_forward(kernel, xi, expected_r, w, EPS, norm_dtype=F32, what="even and odd rows")


# ---- errors name the public function called, not the op it reached ----


def _public_calls(kernel, device):
    """(public function, exception, message, call): a weight of the wrong hidden size for every
    entry point that takes a weight, and for attach_layers (which takes a model) a tensor where
    the model goes."""
    x = make_input((3, HIDDEN), F32, device)
    res = make_input((3, HIDDEN), F32, device, seed=1)
    out = torch.empty_like(x)
    mod = make_input((3, HIDDEN), F32, device, seed=2)
    w = make_weight("same", HIDDEN - 1, F32, device)
    k = kernel
    weight = (RuntimeError, rf"weight must have shape \[{HIDDEN}\]")
    return [
        ("rms_norm", *weight, lambda: k.rms_norm(out, x, w, EPS)),
        ("fused_add_rms_norm", *weight, lambda: k.fused_add_rms_norm(x, res, w, EPS)),
        ("gemma_rms_norm", *weight, lambda: k.gemma_rms_norm(out, x, w, EPS)),
        ("gemma_fused_add_rms_norm", *weight, lambda: k.gemma_fused_add_rms_norm(x, res, w, EPS)),
        ("rmsnorm", *weight, lambda: k.rmsnorm(x, w)),
        ("rmsnorm", *weight, lambda: k.rmsnorm(x, w, out=out)),  # the general op rms_norm_fwd
        ("fused_add_rmsnorm", *weight, lambda: k.fused_add_rmsnorm(x, res, w)),
        ("gemma_rmsnorm", *weight, lambda: k.gemma_rmsnorm(x, w)),
        ("gemma_rmsnorm", *weight, lambda: k.gemma_rmsnorm(x, w, out=out)),
        ("gemma_fused_add_rmsnorm", *weight, lambda: k.gemma_fused_add_rmsnorm(x, res, w)),
        ("rms_norm_func", *weight, lambda: k.rms_norm_func(x, w)),
        ("rms_norm_func", *weight, lambda: k.rms_norm_func(x, w, gemma=True)),
        ("add_rms_norm", *weight, lambda: k.add_rms_norm(x, res, w)),
        ("add_rms_norm", *weight, lambda: k.add_rms_norm(x, res, w, gemma=True)),
        ("rms_norm_modulate", *weight, lambda: k.rms_norm_modulate(x, w, mod, mod)),
        ("apply_rms_norm", *weight, lambda: k.apply_rms_norm(x, w, EPS)),
        (
            "apply_rms_norm_backward",
            *weight,
            lambda: k.apply_rms_norm_backward(x, x, w, None, None, EPS),
        ),
        (
            "attach_layers",
            TypeError,
            "model must be a torch.nn.Module, got Tensor",
            lambda: k.attach_layers(x),
        ),
    ]


@pytest.mark.kernels_ci
def test_errors_name_the_public_function_called(kernel, device):
    calls = _public_calls(kernel, device)
    public = {n for n in kernel.__all__ if callable(getattr(kernel, n))}
    assert {name for name, *_ in calls} == public, "one bad call per public function"
    for name, error, message, call in calls:
        with pytest.raises(error, match=rf"^{name}: {message}"):
            call()


@pytest.mark.kernels_ci
def test_an_argument_of_the_wrong_type_names_the_function_and_its_signature(kernel, device):
    x = make_input((3, HIDDEN), F32, device)
    w = make_weight("same", HIDDEN, F32, device)
    # vLLM's rms_norm(out, input, weight, epsilon) called as flashinfer's rmsnorm(input, weight, eps)
    with pytest.raises(
        TypeError,
        match=r"^rms_norm: weight must be a tensor or None, got float "
        r"\(signature: rms_norm\(out, input, weight, epsilon, enable_pdl=None\)\)",
    ):
        kernel.rms_norm(x, w, EPS, EPS)
    with pytest.raises(TypeError, match=r"^rmsnorm: input must be a tensor, got float"):
        kernel.rmsnorm(1.0, w)


@pytest.mark.kernels_ci
def test_errors_through_a_layer_name_the_layer(kernel, device):
    class Host(torch.nn.Module):  # the state a kernelized transformers / diffusers module holds
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(make_weight("same", HIDDEN - 1, F32, device))
            self.variance_epsilon = self.eps = EPS
            self.bias = None

    x = make_input((3, HIDDEN), F32, device)
    for layer in ("RMSNorm", "LlamaRMSNorm", "GemmaRMSNorm", "DiffusersRMSNorm"):
        forward = getattr(kernel.layers, layer).forward
        with pytest.raises(RuntimeError, match=rf"^{layer}\.forward: weight must have shape"):
            forward(Host(), x)
