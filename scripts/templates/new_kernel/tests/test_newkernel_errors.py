"""Bad input: a rejected call raises before writing anything, and its message names the public
function and the offending argument."""

import pytest
import torch
from newkernel_cases import make_input


def _raises(match):
    return pytest.raises(RuntimeError, match=match)


@pytest.mark.kernels_ci
def test_bad_arguments_are_named(kernel, device):
    x = make_input((5, 8), torch.float32, device)
    with _raises(r"^scale: input must be float32, float16, bfloat16 or float64, got int32"):
        kernel.scale(x.int())  # allocating form: through the functional custom op
    with _raises(r"^scale: input must be float32, float16, bfloat16 or float64, got int64"):
        kernel.scale(x.long(), out=torch.empty(5, 8, dtype=torch.long, device=device))
    with _raises(r"^scale: out must have the dtype of input \(expected float32, got float16\)"):
        kernel.scale(x, out=torch.empty(5, 8, dtype=torch.float16, device=device))
    with _raises(r"^scale: out must have shape \[5, 8\] \(the input shape\), got \[5, 4\]"):
        kernel.scale(x, out=torch.empty(5, 4, device=device))
    with _raises(r"^scale: out must have stride 1 along its last dimension"):
        kernel.scale(x, out=torch.empty(8, 5, device=device).t())
    with _raises(r"^scale: out rows must not overlap"):
        kernel.scale(x, out=torch.empty(1, 8, device=device).expand(5, 8))


@pytest.mark.kernels_ci
def test_overlap_is_refused(kernel, device):
    x = make_input((6, 24), torch.float32, device)
    x0 = x.clone()
    with _raises(r"^scale: out must not share memory with input"):
        kernel.scale(x, out=x)
    with _raises(r"^scale: out must not share memory with input"):
        kernel.scale(x[:, :8], out=x[:, 4:12])
    assert torch.equal(x, x0)
    # Interleaved views that share no element run.
    kernel.scale(x[:, :12], 2.0, out=x[:, 12:])
    torch.testing.assert_close(x[:, 12:], 2.0 * x0[:, :12], rtol=0, atol=0)


@pytest.mark.kernels_ci
def test_non_tensor_argument_names_the_parameter(kernel):
    with pytest.raises(TypeError, match=r"^scale: x must be a tensor, got float"):
        kernel.scale(2.0)
    with pytest.raises(TypeError, match=r"^scale: out must be a tensor or None, got int"):
        kernel.scale(torch.ones(3), 2.0, out=3)


def test_device_mismatch(kernel, device):
    if device != "cuda":
        pytest.skip("needs a second device type")
    x = make_input((5, 8), torch.float32, device)
    with _raises(r"^scale: out must be on the device of input \(expected cuda:\d, got cpu\)"):
        kernel.scale(x, out=torch.empty(5, 8))
