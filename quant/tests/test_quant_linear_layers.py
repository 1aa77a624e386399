"""QuantizedLinear, replace_linear_with_quantized and calibrate_input_scales, through the built
kernel: outputs against a float64 product of the dequantized operands (the exact result of the
8-bit GEMM, up to the documented rounding) and against the float layer they came from, every quant
mode and activation, static and dynamic scales, state_dict round trips and errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from quant_linear_cases import (
    BLOCK,
    QUANTS,
    assert_gemm_close,
    cosine,
    dequantized_weight,
    exact_output,
    random_input,
    random_linear,
)

ACTIVATIONS = [None, "gelu", "gelu_tanh", "silu"]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


# ---- the layer's values ----


@pytest.mark.kernels_ci
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("quant", QUANTS)
def test_matches_dequantized_product(kernel, gemm_device, quant, bias, activation):
    # N = 208: a partial last 128-row block for fp8_block; 3-D input, 7 tokens
    k, n = 256, 208
    layer = kernel.QuantizedLinear.from_linear(
        random_linear(k, n, bias, gemm_device), quant=quant, activation=activation
    )
    x = random_input((3, 7, k), torch.bfloat16, gemm_device)
    out = layer(x)
    assert out.shape == (3, 7, n)
    ref, mag = exact_output(kernel, layer, x)
    assert_gemm_close(out, ref, mag, k, torch.bfloat16, fp8=quant != "int8")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("quant", QUANTS)
def test_input_dtypes_and_shapes(kernel, gemm_device, quant, dtype):
    """Every input dtype; 1-D, 2-D with one and 13 tokens, 4-D, and a strided (sliced) input."""
    k, n = 128, 48
    layer = kernel.QuantizedLinear.from_linear(
        random_linear(k, n, True, gemm_device, dtype=torch.float16), quant=quant
    )
    wide = random_input((13, 2 * k), dtype, gemm_device)
    for x in [wide[0, :k], wide[:1, :k], wide[:, k:], wide.reshape(2, 13, 1, k)]:
        out = layer(x)
        assert out.dtype == dtype and out.shape == (*x.shape[:-1], n)
        ref, mag = exact_output(kernel, layer, x)
        # float32 inputs: the 16-bit result is the module's dtype (float16 here)
        assert_gemm_close(
            out.to(layer.dtype if dtype == torch.float32 else dtype),
            ref,
            mag,
            k,
            dtype if dtype != torch.float32 else torch.float16,
            fp8=quant != "int8",
        )


@pytest.mark.parametrize("quant", QUANTS)
def test_close_to_the_float_layer(kernel, gemm_device, quant):
    """Against the bf16 nn.Linear it came from: the 8-bit rounding of weights and activations
    (fp8: relative 2**-4 per element, int8: half a step of amax / 127) gives each output a
    relative error of a few percent at most, independent across outputs, so cosine similarity
    stays above 0.995 (fp8) and 0.9995 (int8); a wrong scale or layout gives far less."""
    linear = random_linear(512, 256, True, gemm_device)
    layer = kernel.QuantizedLinear.from_linear(linear, quant=quant)
    x = random_input((33, 512), torch.bfloat16, gemm_device)
    with torch.no_grad():
        expected = linear(x)
    assert cosine(layer(x), expected) >= (0.9995 if quant == "int8" else 0.995)


@pytest.mark.parametrize("quant", QUANTS)
def test_weight_quantization(kernel, gemm_device, quant):
    """Scales are amax / 448 (fp8) or amax / 127 (int8) per row or per 128x128 block, and each
    weight is within half a step of its 8-bit grid: relative 2**-4 for normal fp8 values, 2**-10
    of the scale for subnormal ones (fp8's smallest step is 2**-9), half a scale for int8."""
    linear = random_linear(256, 144, False, gemm_device, dtype=torch.float32)
    layer = kernel.QuantizedLinear.from_linear(linear, quant=quant)
    w = linear.weight.detach().double()
    expected_dtype = torch.int8 if quant == "int8" else torch.float8_e4m3fn
    assert layer.weight.dtype == expected_dtype and layer.weight.shape == (144, 256)
    if quant == "fp8_block":
        blocks = F.pad(w, (0, 0, 0, 2 * BLOCK - 144)).reshape(2, BLOCK, 2, BLOCK)
        amax = blocks.abs().amax(dim=(1, 3))
        scale_per_row = layer.weight_scale.double().repeat_interleave(BLOCK, 0)[:144]
        scale_per_row = scale_per_row.repeat_interleave(BLOCK, 1)
    else:
        amax = w.abs().amax(dim=1)
        scale_per_row = layer.weight_scale.double().reshape(-1, 1)
    top = 127.0 if quant == "int8" else 448.0
    torch.testing.assert_close(layer.weight_scale.double(), amax / top, rtol=2**-23, atol=0)
    err = (dequantized_weight(layer) - w).abs()
    if quant == "int8":
        bound = 0.5 * scale_per_row * (1 + 2**-20)
    else:
        bound = torch.maximum(2.0**-4 * w.abs(), 2.0**-10 * scale_per_row)
    assert bool((err <= bound).all())


@pytest.mark.parametrize("quant", ["fp8", "int8"])
def test_static_input_scale(kernel, gemm_device, quant):
    """act_scale: one per-tensor scale for every token, saturating what lies beyond it."""
    layer = kernel.QuantizedLinear.from_linear(
        random_linear(128, 64, True, gemm_device), quant=quant, act_scale=0.0625
    )
    assert layer.input_scale.dtype == torch.float32 and float(layer.input_scale) == 0.0625
    x = random_input((9, 128), torch.bfloat16, gemm_device)
    ref, mag = exact_output(kernel, layer, x)
    assert_gemm_close(layer(x), ref, mag, 128, torch.bfloat16, fp8=quant != "int8")
    dynamic = kernel.QuantizedLinear.from_linear(
        random_linear(128, 64, True, gemm_device), quant=quant
    )
    assert not torch.equal(dynamic(x), layer(x))  # the static scale is really used


@pytest.mark.kernels_ci
@pytest.mark.parametrize("quant", QUANTS)
def test_compile_matches_eager(kernel, gemm_device, quant):
    """torch.compile(fullgraph=True) traces the layer (quantize op, GEMM, fakes) and gives the
    eager result bit for bit; a new token count does not recompile (dynamic first dimension)."""
    model = torch.nn.Sequential(
        kernel.QuantizedLinear.from_linear(random_linear(256, 128, True, gemm_device), quant=quant),
        kernel.QuantizedLinear.from_linear(
            random_linear(128, 128, False, gemm_device), quant=quant, activation="gelu_tanh"
        ),
    )
    torch._dynamo.reset()
    backend = "inductor" if gemm_device == "cuda" else "aot_eager"
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    for tokens in (9, 20):
        x = random_input((tokens, 256), torch.bfloat16, gemm_device, seed=tokens)
        torch._dynamo.mark_dynamic(x, 0)
        with torch._dynamo.config.patch(error_on_recompile=tokens != 9):
            assert torch.equal(compiled(x), model(x))


# ---- state ----


@pytest.mark.kernels_ci
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("quant", QUANTS)
def test_state_dict_round_trip(kernel, gemm_device, quant, static, tmp_path):
    act_scale = 0.02 if static and quant != "fp8_block" else None
    layer = kernel.QuantizedLinear.from_linear(
        random_linear(256, 160, True, gemm_device),
        quant=quant,
        activation="silu",
        act_scale=act_scale,
    )
    path = tmp_path / "layer.pt"
    torch.save(layer.state_dict(), path)
    expected_keys = {"weight", "weight_scale", "bias"} | ({"input_scale"} if act_scale else set())
    assert set(layer.state_dict()) == expected_keys
    # built dynamic: a saved input_scale makes it static
    fresh = kernel.QuantizedLinear(256, 160, quant=quant, activation="silu", device=gemm_device)
    fresh.load_state_dict(torch.load(path))
    x = random_input((5, 256), torch.bfloat16, gemm_device)
    assert torch.equal(fresh(x), layer(x))
    assert (fresh.input_scale is None) == (act_scale is None)


def test_to_dtype_keeps_quantized_buffers(kernel, gemm_device):
    """model.half() / .to(dtype) must not turn the fp8 weight into floats or round the scales."""
    layer = kernel.QuantizedLinear.from_linear(
        random_linear(128, 32, True, gemm_device), quant="fp8", act_scale=0.1
    )
    scale = layer.weight_scale.clone()
    layer.half()
    assert layer.weight.dtype == torch.float8_e4m3fn
    assert layer.weight_scale.dtype == torch.float32 and torch.equal(layer.weight_scale, scale)
    assert layer.input_scale.dtype == torch.float32
    assert layer.bias.dtype == torch.float16
    x = random_input((4, 128), torch.float16, gemm_device)
    ref, mag = exact_output(kernel, layer, x)
    assert_gemm_close(layer(x), ref, mag, 128, torch.float16, fp8=True)


def test_extra_repr(kernel):
    layer = kernel.QuantizedLinear(64, 32, bias=False, quant="int8", activation="gelu")
    assert repr(layer) == (
        "QuantizedLinear(in_features=64, out_features=32, bias=False, quant=int8, "
        "activation=gelu, input_scale=dynamic, dtype=bfloat16)"
    )


# ---- errors ----


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(in_features=24, out_features=32), r"multiples of 16"),
        (dict(in_features=32, out_features=40), r"multiples of 16"),
        (dict(in_features=64, out_features=32, quant="fp8_block"), r"multiple of 128"),
        (dict(in_features=32, out_features=32, quant="nf4"), r"quant must be one of"),
        (dict(in_features=32, out_features=32, activation="relu"), r"activation must be one"),
        (dict(in_features=32, out_features=32, dtype=torch.float32), r"dtype must be bfloat16"),
        (dict(in_features=0, out_features=32), r"in_features must be a positive int"),
        (dict(in_features=32, out_features=32, act_scale=-1.0), r"act_scale must be one positive"),
        (dict(in_features=128, out_features=32, quant="fp8_block", act_scale=1.0), r"None with"),
    ],
)
def test_construction_errors(kernel, kwargs, message):
    with pytest.raises(ValueError, match="^QuantizedLinear: .*" + message):
        kernel.QuantizedLinear(**kwargs)


def test_call_errors(kernel, gemm_device):
    layer = kernel.QuantizedLinear.from_linear(random_linear(32, 16, True, gemm_device))
    with pytest.raises(
        ValueError, match=r"^QuantizedLinear.forward: x must have shape \[\.\.\., 32\]"
    ):
        layer(torch.randn(4, 48, device=gemm_device, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"^QuantizedLinear.forward: x must be bfloat16.*float64"):
        layer(torch.randn(4, 32, device=gemm_device, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^QuantizedLinear.quantize_from_float: weight must have"):
        layer.quantize_from_float(torch.randn(16, 48))
    with pytest.raises(
        ValueError, match=r"^QuantizedLinear.quantize_from_float: bias must be given"
    ):
        layer.quantize_from_float(torch.randn(16, 32))
    with pytest.raises(
        ValueError, match=r"^QuantizedLinear.quantize_from_float: weight must be fin"
    ):
        layer.quantize_from_float(torch.full((16, 32), math.inf), torch.zeros(16))
    with pytest.raises(TypeError, match=r"^QuantizedLinear.from_linear: linear must be"):
        kernel.QuantizedLinear.from_linear(torch.nn.Conv1d(32, 16, 1))


# ---- replacing the linears of a model ----


class Blocks(torch.nn.Module):
    """Every kind of module replace_linear_with_quantized meets."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(128, 256)
        self.down = torch.nn.Linear(256, 128, bias=False)
        self.odd = torch.nn.Linear(128, 24)  # N not a multiple of 16
        self.attn = torch.nn.MultiheadAttention(128, 4)  # out_proj: an nn.Linear subclass
        self.small = torch.nn.Linear(64, 128)  # K fine for fp8 / int8, not for 128x128 blocks
        self.lm_head = torch.nn.Linear(128, 64)


@pytest.mark.parametrize("quant", QUANTS)
def test_replace_report(kernel, gemm_device, quant):
    model = Blocks().to(gemm_device)
    report = kernel.replace_linear_with_quantized(model, quant)
    replaced = ["up", "down"] + (["small"] if quant != "fp8_block" else [])
    assert report.replaced == tuple(replaced) and report.num_replaced == len(replaced)
    assert set(report.skipped) == {"odd", "attn.out_proj", "lm_head"} | (
        {"small"} if quant == "fp8_block" else set()
    )
    assert "multiples of 16" in report.skipped["odd"]
    assert "skip pattern 'lm_head'" in report.skipped["lm_head"]
    assert "subclass" in report.skipped["attn.out_proj"]
    if quant == "fp8_block":
        assert "multiple of 128" in report.skipped["small"]
    for name in replaced:
        layer = model.get_submodule(name)
        assert type(layer).__name__ == "QuantizedLinear" and layer.quant == quant
    assert type(model.lm_head) is torch.nn.Linear
    assert str(report).startswith(f"replaced {len(replaced)} linear(s), skipped ")
    # skip patterns are substrings of qualified names; nothing left to replace the second time
    again = kernel.replace_linear_with_quantized(Blocks().to(gemm_device), quant, skip=("u", "lm_"))
    assert "up" not in again.replaced and "lm_head" in again.skipped
    assert kernel.replace_linear_with_quantized(model, quant).num_replaced == 0


def test_replace_errors(kernel):
    with pytest.raises(ValueError, match=r"^replace_linear_with_quantized: quant must be one of"):
        kernel.replace_linear_with_quantized(Blocks(), "nf4")
    with pytest.raises(TypeError, match=r"^replace_linear_with_quantized: model must be"):
        kernel.replace_linear_with_quantized([torch.nn.Linear(16, 16)])


# ---- calibration ----


@pytest.mark.parametrize("quant", ["fp8", "int8"])
def test_calibrate_input_scales(kernel, gemm_device, quant):
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    model = model.to(gemm_device, torch.bfloat16)
    kernel.replace_linear_with_quantized(model, quant)
    batches = [random_input((5, 64), torch.bfloat16, gemm_device, seed=s) for s in range(3)]
    seen = {"0": [], "2": []}
    model[2].register_forward_pre_hook(lambda m, a: seen["2"].append(a[0].abs().amax()))
    with kernel.calibrate_input_scales(model) as scales:
        for x in batches:
            model(x)
    top = 448.0 if quant == "fp8" else 127.0
    amax = {"0": max(float(x.abs().amax()) for x in batches), "2": float(max(seen["2"]))}
    assert set(scales) == {"0", "2"}
    for name, value in amax.items():
        layer = model.get_submodule(name)
        assert layer.input_scale.dtype == torch.float32 and layer.input_scale.shape == (1,)
        assert math.isclose(float(layer.input_scale), value / top, rel_tol=2**-22)
        assert math.isclose(scales[name], value / top, rel_tol=2**-22)
    ref, mag = exact_output(kernel, model[0], batches[0])
    assert_gemm_close(model[0](batches[0]), ref, mag, 64, torch.bfloat16, fp8=quant != "int8")


def test_calibrate_errors_leave_the_model(kernel, gemm_device):
    model = torch.nn.Sequential(torch.nn.Linear(64, 32)).to(gemm_device, torch.bfloat16)
    kernel.replace_linear_with_quantized(model, "fp8")
    with pytest.raises(ValueError, match=r"^calibrate_input_scales: no forward pass"):
        with kernel.calibrate_input_scales(model):
            pass
    assert model[0].input_scale is None
    with pytest.raises(KeyError):
        with kernel.calibrate_input_scales(model):
            model(random_input((2, 64), torch.bfloat16, gemm_device))
            raise KeyError("user code failed")
    assert model[0].input_scale is None and not model[0]._forward_pre_hooks
    with pytest.raises(ValueError, match=r"^calibrate_input_scales: the model has no fp8 or int8"):
        with kernel.calibrate_input_scales(torch.nn.Linear(16, 16)):
            pass
