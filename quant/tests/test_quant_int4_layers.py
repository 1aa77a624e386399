"""QuantizedLinear(quant="int4"): round-to-nearest quantization within half a step, the forward
against the float64 product of the layer's own dequantized weight, GPTQ / AWQ checkpoint loading
against the formats' definitions, state_dict round trips, a tiny Llama (replaced, compiled,
reloaded from a GPTQ state_dict), and errors."""

import pytest
import torch
import torch.nn as nn
from quant_linear_cases import cosine, random_input, random_linear
from test_quant_int4_ops import F32_ROUNDOFF, UNIT_ROUNDOFF, awq_checkpoint, gen, gptq_checkpoint

COMPILE_BACKEND = {"cpu": "aot_eager", "cuda": "inductor"}


def dequantized(kernel, layer):
    """float64 weight [N, K] of an int4 layer, from its buffers: (q - z) * s (exact), rows in a's
    order (perm undone)."""
    codes = kernel.int4_unpack(layer.weight).cpu().double()
    group = layer.group_size
    s = layer.weight_scale.cpu().double().repeat_interleave(group, 0)
    z = (
        8.0
        if layer.weight_zero is None
        else layer.weight_zero.cpu().double().repeat_interleave(group, 0)
    )
    w = (codes - z) * s  # [K, N], packed row order
    if layer.perm is not None:
        unsorted = torch.empty_like(w)
        unsorted[layer.perm.cpu().long()] = w
        w = unsorted
    return w.t()


def assert_forward_matches(kernel, layer, x, label=""):
    """layer(x) against float64 x @ W^T + bias, W the layer's dequantized weight: the bound of a
    float32 sum rounded once (test_quant_int4_ops.reference)."""
    w = dequantized(kernel, layer)
    xd = x.cpu().double().reshape(-1, layer.in_features)
    ref = xd @ w.t()
    if layer.bias is not None:
        ref = ref + layer.bias.cpu().double()
    unit = UNIT_ROUNDOFF[layer.weight_scale.dtype]
    bound = (
        layer.in_features * F32_ROUNDOFF * (xd.abs() @ w.abs().t()) + unit * ref.abs() + 2.0**-24
    )
    got = layer(x).cpu().double().reshape(ref.shape)
    err = (got - ref).abs()
    assert bool((err <= bound).all()), f"{label}: max error {err.max():.3g}"


@pytest.mark.parametrize("zero_point", [False, True], ids=["symmetric", "zero_point"])
@pytest.mark.parametrize("group_size", [32, 128, -1])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_from_linear(kernel, int4_device, zero_point, group_size, dtype):
    torch.manual_seed(0)
    linear = nn.Linear(256, 192, bias=True).to(int4_device)
    layer = kernel.QuantizedLinear.from_linear(
        linear, "int4", group_size=group_size, zero_point=zero_point, dtype=dtype
    )
    # Rounding to nearest: every weight within half a step (a step with a zero point, whose
    # range may clamp by half a step more) of the float weight, up to the scale's own rounding.
    w = dequantized(kernel, layer)
    step = layer.weight_scale.cpu().double().repeat_interleave(layer.group_size, 0).t()
    slack = (1.0 if zero_point else 0.5) * step * (1 + 2 * UNIT_ROUNDOFF[dtype]) + 1e-12
    err = (w - linear.weight.detach().cpu().double()).abs()
    assert bool((err <= slack + UNIT_ROUNDOFF[dtype] * w.abs()).all())
    x = torch.randn((3, 5, 256), generator=gen(1)).to(dtype).to(int4_device)
    assert_forward_matches(kernel, layer, x)
    assert layer(x).shape == (3, 5, 192) and layer(x).dtype == dtype
    assert layer(x.float()).dtype == torch.float32  # computed in the layer's dtype, cast back


@pytest.mark.parametrize("act_order", [False, True], ids=["ordered", "act_order"])
def test_load_gptq(kernel, int4_device, act_order):
    """The layer computes x @ W^T for W as GPTQ defines it: (q[k, n] - 8) * scales[g_idx[k], n]."""
    qweight, scales, g_idx, codes = gptq_checkpoint(256, 128, 64, act_order, seed=2)
    layer = kernel.QuantizedLinear(
        256, 128, bias=False, quant="int4", group_size=64, dtype=torch.float16, device=int4_device
    )
    qzeros = torch.full((4, 16), 0x77777777, dtype=torch.int32)
    layer.load_gptq(qweight, scales.half(), g_idx if act_order else None, qzeros)
    assert (layer.perm is not None) == act_order
    w = ((codes.double() - 8) * scales.half().double()[g_idx.long()]).t()
    torch.testing.assert_close(dequantized(kernel, layer), w, rtol=0, atol=0)
    x = torch.randn((7, 256), generator=gen(3)).half().to(int4_device)
    assert_forward_matches(kernel, layer, x)


def test_load_awq(kernel, int4_device):
    """(q[k, n] - z[k // g, n]) * s[k // g, n], AWQ's definition."""
    qweight, qzeros, scales, codes, zeros = awq_checkpoint(128, 192, 32, seed=4)
    layer = kernel.QuantizedLinear(
        128, 192, quant="int4", group_size=32, zero_point=True, device=int4_device
    )
    bias = torch.randn(192, generator=gen(5)).bfloat16()
    layer.load_awq(qweight, qzeros, scales.bfloat16(), bias)
    rows = torch.arange(128) // 32
    w = (codes.double() - zeros.double()[rows]) * scales.bfloat16().double()[rows]
    torch.testing.assert_close(dequantized(kernel, layer), w.t(), rtol=0, atol=0)
    assert_forward_matches(
        kernel, layer, torch.randn((4, 128), generator=gen(6)).bfloat16().to(int4_device)
    )


def test_state_dict_round_trip_keeps_act_order(kernel, int4_device):
    qweight, scales, g_idx, _ = gptq_checkpoint(128, 64, 32, True, seed=7)
    layer = kernel.QuantizedLinear(
        128, 64, bias=False, quant="int4", group_size=32, device=int4_device
    )
    layer.load_gptq(qweight, scales, g_idx)
    fresh = kernel.QuantizedLinear(
        128, 64, bias=False, quant="int4", group_size=32, device=int4_device
    )
    assert fresh.perm is None
    fresh.load_state_dict(layer.state_dict())
    x = torch.randn((3, 128), generator=gen(8)).bfloat16().to(int4_device)
    assert torch.equal(fresh(x), layer(x))
    assert "act_order=True" in repr(fresh)


def tiny_llama(device):
    """A 2-layer Llama whose every projection int4 takes (K and N multiples of 64)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config).to(device, torch.bfloat16).eval()


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_tiny_llama(kernel, int4_device, fmt):
    """Every projection replaced (lm_head left), symmetric in groups of 64 (gptq) or with zero
    points in groups of 32 (awq):

    * the logits are as accurate as those of the same model with each weight replaced by the
      layer's dequantized weight (quant_tiny_models.assert_as_accurate, against its float64 twin),
      and within the int4 rounding of the bf16 model's (cosine >= 0.97: round to nearest on these
      random weights costs 0.009-0.017 of it on the CPU; a broken layer costs far more);
    * compiled with fullgraph, the same logits (up to the compiler's rounding);
    * the layers written as a checkpoint of the format load back into a fresh model bit for bit."""
    pytest.importorskip("transformers")
    import copy

    from quant_tiny_models import assert_as_accurate, float64_twin

    zero_point, group = fmt == "awq", 32 if fmt == "awq" else 64
    model = tiny_llama(int4_device)
    original = copy.deepcopy(model)
    ids = torch.randint(0, 128, (2, 11), generator=gen(9)).to(int4_device)
    with torch.no_grad():
        expected = model(ids).logits
        report = kernel.replace_linear_with_quantized(
            model, "int4", group_size=group, zero_point=zero_point
        )
        got = model(ids).logits
        assert report.num_replaced == 14 and set(report.skipped) == {"lm_head"}
        assert cosine(got, expected) >= 0.97
        layers = {
            name: layer
            for name, layer in model.named_modules()
            if isinstance(layer, kernel.QuantizedLinear)
        }
        for name, layer in layers.items():  # the dequantized weights, exact in bf16
            original.get_submodule(name).weight.copy_(dequantized(kernel, layer).bfloat16())
        untouched = original(ids).logits
        twin = float64_twin(original.cpu())(ids.cpu()).logits
        assert_as_accurate(f"int4 {fmt} logits", got.cpu(), untouched.cpu(), twin)

        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend=COMPILE_BACKEND[int4_device])
        assert cosine(compiled(ids).logits, got) >= 0.9999

        state = {}
        for name, layer in layers.items():
            state[name + ".scales"] = layer.weight_scale.clone()
            if fmt == "gptq":
                state[name + ".qweight"] = kernel.gptq_unrepack(layer.weight)
            else:
                state[name + ".qweight"] = kernel.awq_unrepack(layer.weight)
                state[name + ".qzeros"] = kernel.int4.awq_pack(layer.weight_zero.to(torch.uint8))
        other = tiny_llama(int4_device)
        kernel.replace_linear_with_quantized(other, "int4", group_size=group, zero_point=zero_point)
        assert len(kernel.load_int4_checkpoint(other, state, fmt)) == 14
        assert torch.equal(other(ids).logits, got)


@pytest.mark.parametrize("zero_point", [False, True], ids=["sym", "zeros"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_gated_mlp_holds_the_separate_layers(kernel, int4_device, zero_point, bias):
    """QuantizedGatedMLP.from_linears: gate_up holds exactly the codes, scales, zeros and biases
    of int4 QuantizedLinears of gate and of up, interleaved in blocks of 64 features, and down
    those of down's; forward is down(w4a16_gemm_gated(x, gate_up)) bit for bit."""
    gate = random_linear(256, 192, bias, int4_device, seed=1)
    up = random_linear(256, 192, bias, int4_device, seed=2)
    down = random_linear(192, 256, bias, int4_device, seed=3)
    mlp = kernel.QuantizedGatedMLP.from_linears(
        gate, up, down, "gelu_tanh", group_size=64, zero_point=zero_point
    )
    args = dict(quant="int4", group_size=64, zero_point=zero_point)
    g, u = (kernel.QuantizedLinear.from_linear(lin, **args) for lin in (gate, up))
    d = kernel.QuantizedLinear.from_linear(down, **args)

    def interleaved(a, b):  # [rows, N] tables, as pack_gate_up interleaves output features
        return kernel.pack_gate_up(a.t(), b.t()).t()

    codes = kernel.int4_unpack
    assert torch.equal(codes(mlp.gate_up.weight), interleaved(codes(g.weight), codes(u.weight)))
    assert torch.equal(mlp.gate_up.weight_scale, interleaved(g.weight_scale, u.weight_scale))
    if zero_point:
        assert torch.equal(mlp.gate_up.weight_zero, interleaved(g.weight_zero, u.weight_zero))
    if bias:
        assert torch.equal(mlp.gate_up.bias, kernel.pack_gate_up(g.bias, u.bias))
    for name in ("weight", "weight_scale", "weight_zero", "bias"):
        a, b = getattr(mlp.down, name), getattr(d, name)
        assert (a is None and b is None) or torch.equal(a, b), name

    x = random_input((3, 5, 256), torch.bfloat16, int4_device)
    gu = mlp.gate_up
    h = kernel.w4a16_gemm_gated(
        x.reshape(15, 256), gu.weight, gu.weight_scale, gu.weight_zero, bias=gu.bias,
        activation="gelu_tanh",
    )  # fmt: skip
    assert torch.equal(mlp(x), d(h).reshape(3, 5, 256))
    assert mlp(x.float()).dtype == torch.float32


def test_tiny_llama_fused_gated_mlp(kernel, int4_device):
    """replace_linear_with_quantized(..., fuse_gated_mlp=True) on a tiny Llama: each layer's MLP
    becomes a QuantizedGatedMLP (the other projections QuantizedLinears), the logits agree with
    the unfused int4 model's (the same quantized weights; only the rounding of the MLP's
    intermediate differs: cosine >= 0.999), and the model compiles with fullgraph."""
    pytest.importorskip("transformers")
    ids = torch.randint(0, 128, (2, 11), generator=gen(9)).to(int4_device)
    unfused, fused = tiny_llama(int4_device), tiny_llama(int4_device)
    with torch.no_grad():
        kernel.replace_linear_with_quantized(unfused, "int4", group_size=64)
        report = kernel.replace_linear_with_quantized(
            fused, "int4", group_size=64, fuse_gated_mlp=True
        )
        mlps = [f"model.layers.{i}.mlp" for i in range(2)]
        assert set(mlps) <= set(report.replaced) and report.num_replaced == 2 + 2 * 4
        assert all(isinstance(fused.get_submodule(n), kernel.QuantizedGatedMLP) for n in mlps)
        want, got = unfused(ids).logits, fused(ids).logits
        assert cosine(got, want) >= 0.999
        torch._dynamo.reset()
        compiled = torch.compile(fused, fullgraph=True, backend=COMPILE_BACKEND[int4_device])
        assert cosine(compiled(ids).logits, got) >= 0.9999


def test_fuse_gated_mlp_leaves_what_it_cannot_fuse(kernel, int4_device):
    """An MLP-shaped module that from_linears would refuse (a bias on some projections only) is
    not fused: its projections become QuantizedLinears one by one."""

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = random_linear(128, 128, True, int4_device)
            self.up_proj = random_linear(128, 128, False, int4_device)
            self.down_proj = random_linear(128, 128, False, int4_device)
            self.act_fn = nn.SiLU()

    model = nn.Sequential(MLP())
    report = kernel.replace_linear_with_quantized(model, "int4", fuse_gated_mlp=True)
    assert report.replaced == ("0.gate_proj", "0.up_proj", "0.down_proj")
    assert all(
        isinstance(m, kernel.QuantizedLinear)
        for m in model[0].children()
        if m is not model[0].act_fn
    )


def test_gated_mlp_errors(kernel, int4_device):
    gate = random_linear(128, 128, False, int4_device)
    up = random_linear(128, 128, False, int4_device)
    with pytest.raises(ValueError, match="fuse_gated_mlp needs quant='int4'"):
        kernel.replace_linear_with_quantized(torch.nn.Sequential(gate), "fp8", fuse_gated_mlp=True)
    with pytest.raises(TypeError, match="down must be a torch.nn.Linear"):
        kernel.QuantizedGatedMLP.from_linears(gate, up, torch.nn.Identity())
    with pytest.raises(ValueError, match="gate and up must be"):
        kernel.QuantizedGatedMLP.from_linears(
            gate,
            random_linear(128, 64, False, int4_device),
            random_linear(128, 128, False, int4_device),
        )
    with pytest.raises(ValueError, match="activation must be one of"):
        kernel.QuantizedGatedMLP(128, 128, "relu")
    mlp = kernel.QuantizedGatedMLP(128, 128)
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., 128\]"):
        mlp(torch.zeros(2, 64, device=int4_device))


def test_errors(kernel, int4_device):
    Q = kernel.QuantizedLinear
    with pytest.raises(ValueError, match="group_size must be one of"):
        Q(128, 64, quant="int4", group_size=48)
    with pytest.raises(
        ValueError, match="int4 needs in_features .* a multiple of 16 and out_features"
    ):
        Q(128, 96, quant="int4")
    with pytest.raises(ValueError, match="act_scale must be None with quant='int4'"):
        Q(128, 64, quant="int4", act_scale=0.1)
    sym = Q(128, 64, bias=False, quant="int4", group_size=32, device=int4_device)
    qweight, qzeros, scales, _, _ = awq_checkpoint(128, 64, 32, seed=10)
    with pytest.raises(
        ValueError, match="load_awq: needs a quant='int4' layer with zero_point=True"
    ):
        sym.load_awq(qweight, qzeros, scales)
    gq, gs, _, _ = gptq_checkpoint(128, 64, 32, False, seed=11)
    with pytest.raises(ValueError, match="qzeros must all be 7"):
        sym.load_gptq(gq, gs, qzeros=torch.zeros((4, 8), dtype=torch.int32))
    with pytest.raises(ValueError, match=r"load_gptq: scales must have shape \[4, 64\]"):
        sym.load_gptq(gq, gs[:2])
    with pytest.raises(ValueError, match='fmt must be "gptq" or "awq"'):
        kernel.load_int4_checkpoint(nn.Sequential(sym), {}, "exl2")
