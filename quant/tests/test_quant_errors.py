"""Errors name the public function called and the argument, and say what was expected."""

import pytest
import torch


@pytest.fixture
def x(device):
    return torch.randn(4, 64, device=device)


def raises(exc, match):
    return pytest.raises(exc, match=match)


@pytest.mark.kernels_ci
def test_input_dtype_and_rank(kernel, device):
    for fn in (kernel.scaled_fp8_quant, kernel.scaled_int8_quant, kernel.fp8_act_quant):
        name = fn.__name__
        with raises(ValueError, rf"^{name}: input must be float32, float16 or bfloat16, got int32"):
            fn(torch.ones(4, 64, dtype=torch.int32, device=device))
        with raises(ValueError, rf"^{name}: input must have at least one dimension"):
            fn(torch.tensor(1.0, device=device))
    with raises(TypeError, r"^scaled_fp8_quant: input must be a tensor, got list"):
        kernel.scaled_fp8_quant([1.0, 2.0])


@pytest.mark.kernels_ci
def test_scale_shapes_that_match_no_mode(kernel, x):
    per_token = torch.ones(4, 1, device=x.device)
    with raises(ValueError, r"^scaled_fp8_quant: a static scale must have one element .*\[4, 1\]"):
        kernel.scaled_fp8_quant(x, per_token)
    with raises(ValueError, r"^scaled_int8_quant: a static scale must have one element"):
        kernel.scaled_int8_quant(x, per_token)
    one = torch.ones(1, device=x.device)
    with raises(ValueError, r"^scaled_fp8_quant: scale_ub applies to dynamic per-token scales"):
        kernel.scaled_fp8_quant(x, one, scale_ub=one)
    with raises(ValueError, r"^scaled_fp8_quant: scale_ub applies to dynamic per-token scales"):
        kernel.scaled_fp8_quant(x, scale_ub=one)
    with raises(RuntimeError, r"^scaled_fp8_quant: scale must be float32, got float16"):
        kernel.scaled_fp8_quant(x, one.half())
    with raises(RuntimeError, r"^scaled_fp8_quant: scale_ub must have 1 element"):
        kernel.scaled_fp8_quant(x, scale_ub=per_token, use_per_token_if_dynamic=True)


@pytest.mark.kernels_ci
def test_int8_zero_point_rules(kernel, x):
    one = torch.ones(1, device=x.device)
    azp = torch.zeros(1, dtype=torch.int32, device=x.device)
    with raises(ValueError, r"^scaled_int8_quant: azp must be given exactly when symmetric=False"):
        kernel.scaled_int8_quant(x, one, azp)
    with raises(ValueError, r"^scaled_int8_quant: azp must be given exactly when symmetric=False"):
        kernel.scaled_int8_quant(x, one, symmetric=False)
    with raises(ValueError, r"^scaled_int8_quant: azp is only an input of static quantization"):
        kernel.scaled_int8_quant(x, azp=azp, symmetric=False)
    with raises(RuntimeError, r"^scaled_int8_quant: azp must be int32, got int64"):
        kernel.scaled_int8_quant(x, one, azp.long(), symmetric=False)


@pytest.mark.kernels_ci
def test_group_size(kernel, x):
    with raises(
        ValueError, r"^per_token_group_quant_fp8: group_size must divide .* \(64\), got 48"
    ):
        kernel.per_token_group_quant_fp8(x, 48)
    with raises(ValueError, r"^fp8_act_quant: group_size must divide .* \(64\), got 128"):
        kernel.fp8_act_quant(x, 128)
    with raises(ValueError, r"^per_token_group_quant_fp8: group_size must be a positive int"):
        kernel.per_token_group_quant_fp8(x, 0)
    with raises(ValueError, r"^per_token_group_quant_fp8: dtype must be None or torch.float8_e4"):
        kernel.per_token_group_quant_fp8(x, 32, 1e-10, torch.int8)


@pytest.mark.kernels_ci
def test_output_argument(kernel, x):
    bad = torch.empty(4, 64, dtype=torch.int8, device=x.device)
    with raises(ValueError, r"^scaled_fp8_quant: output must be float8_e4m3fn of shape \[4, 64\]"):
        kernel.scaled_fp8_quant(x, output=bad)
    strided = torch.empty(64, 4, dtype=torch.float8_e4m3fn, device=x.device).t()
    with raises(RuntimeError, r"^scaled_fp8_quant: result must have stride 1 along its last"):
        kernel.scaled_fp8_quant(x, output=strided)


@pytest.mark.kernels_ci
def test_raw_ops_name_themselves(kernel, x):
    """The raw ops keep their own names (vLLM callers see the op they called)."""
    out = torch.empty(4, 64, dtype=torch.int8, device=x.device)
    with raises(RuntimeError, r"^static_scaled_fp8_quant: result must be float8_e4m3fn, got int8"):
        kernel.ops.static_scaled_fp8_quant(out, x, torch.ones(1, device=x.device))
    scale = torch.empty(3, 1, device=x.device)
    with raises(RuntimeError, r"^dynamic_scaled_int8_quant: scale must have 4 element\(s\)"):
        kernel.ops.dynamic_scaled_int8_quant(out, x, scale, None)
    in_place = x.view(torch.int8)[:, :64]  # the first bytes of each input row
    with raises(
        RuntimeError, r"^static_scaled_int8_quant: result must not share memory with input"
    ):
        kernel.ops.static_scaled_int8_quant(in_place, x, torch.ones(1, device=x.device), None)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() >= (8, 9),
    reason="needs a GPU without fp8 (compute capability < 8.9)",
)
def test_fp8_needs_compute_capability_8_9(kernel):
    x = torch.randn(4, 64, device="cuda")
    with raises(RuntimeError, r"^scaled_fp8_quant: float8_e4m3fn needs a GPU of compute capab"):
        kernel.scaled_fp8_quant(x)
    kernel.scaled_int8_quant(x)  # int8 works everywhere
