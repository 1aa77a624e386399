"""A tiny transformers Llama with its linears replaced by QuantizedLinear (every quant mode):
logits close to the bf16 model's, eager and under torch.compile(fullgraph=True)."""

import pytest
import torch
from quant_linear_cases import QUANTS, cosine
from quant_tiny_models import LM_SIZES, causal_lm

# CPU: aot_eager traces the same full graph through the fake kernels in seconds (Inductor's CPU
# code generation would take a minute); CUDA: the real compiler.
COMPILE_BACKEND = {"cpu": "aot_eager", "cuda": "inductor"}


def tiny_llama(quant, device):
    """causal_lm("llama") in bfloat16; for fp8_block the same model with hidden 128 and
    intermediate 256 (its K must be a multiple of 128)."""
    if quant != "fp8_block":
        model = causal_lm("llama")
    else:
        import transformers

        torch.manual_seed(0)
        sizes = dict(LM_SIZES, hidden_size=128, intermediate_size=256)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**sizes))
    return model.to(device, torch.bfloat16).eval()


def random_ids(device):
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, LM_SIZES["vocab_size"], (2, 11), generator=g).to(device)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("quant", QUANTS)
def test_tiny_llama(kernel, gemm_device, quant):
    """Logits of the quantized model against the bf16 one: cosine similarity >= 0.99 (two layers
    of 8-bit rounding cost 1e-4 to 1.5e-3 of it on these random weights; a broken layer costs far
    more); every projection replaced, lm_head left."""
    model = tiny_llama(quant, gemm_device)
    ids = random_ids(gemm_device)
    with torch.no_grad():
        expected = model(ids).logits
        report = kernel.replace_linear_with_quantized(model, quant)
        got = model(ids).logits
    assert report.num_replaced == 7 * LM_SIZES["num_hidden_layers"]
    assert set(report.skipped) == {"lm_head"}
    assert cosine(got, expected) >= 0.99


@pytest.mark.kernels_ci
def test_tiny_llama_compiles(kernel, gemm_device):
    """torch.compile(fullgraph=True) of the fp8 model gives the eager logits (CUDA: up to
    Inductor's own rounding). Every mode's layer is compiled on its own in
    test_quant_linear_layers.py; the whole model takes seconds per mode."""
    model = tiny_llama("fp8", gemm_device)
    kernel.replace_linear_with_quantized(model, "fp8")
    ids = random_ids(gemm_device)
    with torch.no_grad():
        eager = model(ids).logits
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend=COMPILE_BACKEND[gemm_device])
        got = compiled(ids).logits
    if gemm_device == "cpu":
        torch.testing.assert_close(got, eager, rtol=0, atol=0)  # aot_eager runs the eager ops
    else:
        # Inductor fuses the float ops between the layers (norms, rotary, softmax), which then
        # round differently, and a bf16 input one ulp off can move an 8-bit value by a step: the
        # difference is of the size of the quantization error itself (1 - cos <= 1.5e-3 above),
        # far below what a wrong trace (a missed scale, a stale buffer) costs.
        assert cosine(got, eager) >= 0.999
