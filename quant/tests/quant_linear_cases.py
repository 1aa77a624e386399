"""Shared by the QuantizedLinear tests: random float layers and inputs, and the float64 result
of the 8-bit GEMM the layer must reproduce (exact_output) with its derived bound
(assert_gemm_close)."""

import torch
import torch.nn.functional as F

QUANTS = ["fp8", "int8", "fp8_block"]
BLOCK = 128
# Output unit roundoff of the GEMM's 16-bit result.
UNIT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
ACT_FNS = {
    None: lambda v: v,
    "gelu": F.gelu,
    "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
    "silu": F.silu,
}


def random_linear(k, n, bias, device, seed=0, dtype=torch.bfloat16):
    """An nn.Linear with weights of a trained layer's size (|w| ~ 1 / sqrt(K)), a few rows
    scaled up or down by 2**4 so per-row scales differ, and a random bias."""
    torch.manual_seed(seed)
    linear = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        linear.weight[::7] *= 16.0
        linear.weight[3::11] /= 16.0
        if bias:
            linear.bias.normal_()
    return linear.to(device=device, dtype=dtype)


def random_input(shape, dtype, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 2.0
    x.view(-1)[:: max(1, x.numel() // 5)] *= 8.0  # outliers: rows with different amax
    return x.to(dtype).to(device)


def quantized_activation(kernel, layer, x):
    """The activation the layer feeds its GEMM, dequantized in float64 [M, K], through the
    package's quantize ops (their values are tested bit for bit in test_quant_ops.py)."""
    rows = x.reshape(-1, x.shape[-1])
    if layer.quant == "fp8_block":
        q, s = kernel.per_token_group_quant_fp8(rows, BLOCK)
        return q.double() * s.double().repeat_interleave(BLOCK, dim=-1)
    if layer.quant == "fp8":
        q, s = kernel.scaled_fp8_quant(rows, layer.input_scale, use_per_token_if_dynamic=True)
    else:
        q, s, _ = kernel.scaled_int8_quant(rows, layer.input_scale)
    return q.double() * s.double().reshape(-1, 1)


def dequantized_weight(layer):
    """The layer's weight in float64 [N, K]: its 8-bit values times their scales."""
    w, s = layer.weight.double(), layer.weight_scale.double()
    if layer.quant == "fp8_block":
        n, k = w.shape
        s = s.repeat_interleave(BLOCK, dim=0)[:n].repeat_interleave(BLOCK, dim=1)
        return w * s
    return w * s.reshape(-1, 1)


def exact_output(kernel, layer, x):
    """(float64 reference [..., N], magnitude [..., N]): act(a @ w.T + bias) from the dequantized
    operands, and |a| @ |w|.T + |bias|, the size of the terms the GEMM sums."""
    a, w = quantized_activation(kernel, layer, x), dequantized_weight(layer)
    v, mag = a @ w.T, a.abs() @ w.abs().T
    if layer.bias is not None:
        bias = layer.bias.to(x.dtype if x.dtype != torch.float32 else layer.dtype).double()
        v, mag = v + bias, mag + bias.abs()
    shape = (*x.shape[:-1], layer.out_features)
    return ACT_FNS[layer.activation](v).reshape(shape), mag.reshape(shape)


def assert_gemm_close(out, ref, mag, k, dtype, *, fp8=False):
    """The GEMM rounds once to its 16-bit output (half an ulp: UNIT * |ref|, doubled for the
    float32 activation functions' own few-ulp error) after an fp32 accumulation (int8: exact, fp8:
    at most K + 2 fp32 roundings of terms no larger than mag, times the activations' slope <= 1.13,
    bounded by 1.2). fp8 on Hopper tensor cores sums each 128-element slice of K with their ~14-bit
    accumulator before the float32 promotion: the bound of quant_scaled_mm_reference.bound
    (coarse_accumulator) for that part. A wrong scale, transpose, bias or activation is off by
    far more."""
    assert out.dtype == dtype and out.shape == ref.shape
    err = (out.double() - ref).abs()
    if fp8 and out.is_cuda and torch.cuda.get_device_capability(out.device) >= (9, 0):
        accumulation = 8 * (k + 4) ** 0.5 * 2.0**-14
    else:
        accumulation = 1.2 * (k + 2) * 2.0**-24
    tol = 2 * UNIT[dtype] * ref.abs() + accumulation * mag + 1e-30
    worst = float((err / tol).max())
    assert worst <= 1.0, f"error {float(err.max()):.3e} is {worst:.2f} x the bound"


def cosine(a, b):
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()
