"""Bad input: a rejected call raises, and its message names the offending argument.

Memory overlap between a written and a read tensor is tested exactly by the C++ layer
(torch_checks::may_overlap), also for strided views of one buffer: a real overlap is refused,
interleaved views that share no element run.
"""

import pytest
import torch
from activation_cases import ALL_NAMES, make_input


def _raises(arg):
    return pytest.raises(RuntimeError, match=rf"(?<![\w.]){arg}(?!\w)")


@pytest.mark.kernels_ci
def test_strided_out_overlapping_input_is_refused(kernel, device):
    # Row views of one [6, 24] buffer (row stride 24): ATen finds them "too hard".
    buf = make_input((6, 24), torch.float32, device)
    with _raises("silu: out must not share memory with input"):
        kernel.silu(buf[:, 4:12], buf[:, :8])  # columns 4..7 of each row are both
    with _raises("silu_and_mul: out must not share memory with input"):
        kernel.silu_and_mul(buf[:, 12:20], buf[:, :16])  # out meets the second half of input
    with _raises("gelu: out must not share memory with input"):
        kernel.gelu(buf[:, 8:16], buf[:, 1:17:2])  # input: odd columns 1..15


@pytest.mark.kernels_ci
def test_disjoint_strided_views_of_one_buffer_run(kernel, device):
    buf = make_input((6, 24), torch.float32, device)
    # The two halves of the last dimension: their address ranges interleave, no element is shared.
    x, out = buf[:, :12], buf[:, 12:]
    x0 = x.clone()
    kernel.silu(out, x)
    torch.testing.assert_close(out, torch.nn.functional.silu(x0))
    assert torch.equal(x, x0)
    # Input on the even columns 0..14 (stride 2), out on columns 15..22.
    x, out = buf[:, 0:16:2], buf[:, 15:23]
    x0 = x.clone()
    kernel.gelu(out, x)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x0))
    assert torch.equal(x, x0)
    # Gated: input [:, :16] (both halves), out the last 8 columns.
    buf = make_input((6, 24), torch.float32, device, seed=1)
    x, out = buf[:, :16], buf[:, 16:]
    x0 = x.clone()
    kernel.silu_and_mul(out, x)
    torch.testing.assert_close(out, torch.nn.functional.silu(x0[:, :8]) * x0[:, 8:])
    assert torch.equal(x, x0)


# ---- errors name the public function called ----


@pytest.mark.kernels_ci
def test_errors_name_the_public_function_called(kernel, device):
    """One bad call per public function, whose error starts with that function's name: each
    activation in both call forms, attach_layers (which takes a model) given a tensor."""
    public = {n for n in kernel.__all__ if callable(getattr(kernel, n))}
    assert public == set(ALL_NAMES) | {"attach_layers"}, "one bad call per public function"
    x = make_input((3, 8), torch.float32, device)
    for name in ALL_NAMES:
        fn = getattr(kernel, name)
        with pytest.raises(RuntimeError, match=rf"^{name}: input must be float32, float16"):
            fn(x.to(torch.int32))  # functional form: through the {name}_functional custom op
        with pytest.raises(RuntimeError, match=rf"^{name}: out must have the dtype of input"):
            fn(torch.empty(3, 8, dtype=torch.float16, device=device), x)
    with pytest.raises(
        TypeError, match=r"^attach_layers: model must be a torch.nn.Module, got Tensor"
    ):
        kernel.attach_layers(x)


@pytest.mark.kernels_ci
def test_a_scalar_passed_by_position_names_the_function_and_its_signature(kernel, device):
    x = make_input((3, 8), torch.float32, device)
    # kernels-community's fatrelu_and_mul(out, input, threshold) called functionally: 0.5 lands on
    # x, not threshold. Without the check, the op's schema error named neither.
    with pytest.raises(
        TypeError,
        match=r"^fatrelu_and_mul: second must be a tensor or None, got float \(signature: "
        r"fatrelu_and_mul\(first=None, second=None, /, threshold=0\.0, \*, out=None, x=None, "
        r"input=None, enable_pdl=None\)\); pass scalars by keyword, e\.g\. "
        r"fatrelu_and_mul\(\.\.\., threshold=0\.5\)",
    ):
        kernel.fatrelu_and_mul(x, 0.5)
    torch.testing.assert_close(
        kernel.fatrelu_and_mul(x, threshold=0.5), kernel.fatrelu_and_mul(None, x, 0.5)
    )
    with pytest.raises(TypeError, match=r"^silu: first must be a tensor or None, got float"):
        kernel.silu(2.0)
