"""Tiny random transformers / diffusers models, and the accuracy check of a model whose modules
run our kernels against the same model untouched (test helpers of the kernels used inside those
frameworks).

One source of truth: common/tiny_models.py, copied by scripts/sync_common.py into each user's
tests/ as <kernel>_tiny_models.py; tests/test_common_sync.py fails when a copy drifts.

The bound of `assert_as_accurate`: both the untouched model and ours (same dtype) are measured
against a float64 twin (float64 weights and activations), and ours may be at most twice as far
from it as the untouched model, plus a floor of 16 units of roundoff of the dtype times
max |twin|; directly, the two agree within the sum of their two measured errors plus that floor.
The kernels replace a few modules by forwards that are within their own forward bound of the
exact result, as PyTorch's are, and every other operation rounds identically in both, so the two
errors are of one size.
"""

import copy
import types

import torch


def _float64_rms_norm(self, hidden_states):
    h = hidden_states
    return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def float64_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of `model`; transformers' Llama-style RMSNorms (a ``variance_epsilon``, a
    float32 upcast in their code) get a float64 forward, so the twin has no float32 step left."""
    twin = copy.deepcopy(model).to(torch.float64)
    for module in twin.modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_float64_rms_norm, module)
    return twin


def assert_as_accurate(what: str, ours: torch.Tensor, untouched: torch.Tensor, twin: torch.Tensor):
    """The check of the module docstring, on one output (e.g. the logits)."""
    assert ours.shape == untouched.shape == twin.shape and ours.dtype == untouched.dtype, what
    unit = 2.0**-24 if ours.dtype == torch.float32 else torch.finfo(ours.dtype).eps / 2
    ref = twin.double()
    floor = 16 * unit * float(ref.abs().max())
    e_untouched = float((untouched.double() - ref).abs().max())
    e_ours = float((ours.double() - ref).abs().max())
    assert e_ours <= 2 * e_untouched + floor, (
        f"{what}: error {e_ours:.3e} vs the untouched model's {e_untouched:.3e} (floor {floor:.3e})"
    )
    diff = float((ours.double() - untouched.double()).abs().max())
    assert diff <= e_ours + e_untouched + floor, f"{what}: ours and untouched differ by {diff:.3e}"


LM_SIZES = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
)


def causal_lm(name: str) -> torch.nn.Module:
    """A random 2-layer "llama" or "qwen3" ForCausalLM (float32, CPU), its norm weights random
    too (they are initialized to ones, which would hide a wrong weight read)."""
    import transformers

    if name == "llama":
        config, cls = transformers.LlamaConfig(**LM_SIZES), transformers.LlamaForCausalLM
    else:
        config = transformers.Qwen3Config(**LM_SIZES, head_dim=16)
        cls = transformers.Qwen3ForCausalLM
    torch.manual_seed(0)
    model = cls(config)
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__.endswith("RMSNorm"):
                m.weight.copy_(1.0 + 0.2 * torch.randn_like(m.weight))
    return model


def flux() -> torch.nn.Module:
    """A random diffusers FluxTransformer2DModel with one double and one single block."""
    import diffusers

    torch.manual_seed(0)
    return diffusers.FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=(4, 4, 8),
    )


def run_flux(model: torch.nn.Module, device, dtype=torch.float32, inputs_like=None) -> torch.Tensor:
    """`flux()`'s output on fixed random inputs of `dtype`, without autograd. The inputs are
    rounded to `inputs_like` (default `dtype`) first: the float64 twin of a bfloat16 model,
    run with ``inputs_like=torch.bfloat16``, takes exactly the values the model took."""
    like = dtype if inputs_like is None else inputs_like
    g = torch.Generator().manual_seed(5)
    inputs = dict(
        hidden_states=torch.randn(1, 16, 4, generator=g),
        encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
        pooled_projections=torch.randn(1, 32, generator=g),
        timestep=torch.tensor([1.0]),
        img_ids=torch.zeros(16, 3),
        txt_ids=torch.zeros(8, 3),
    )
    with torch.no_grad():
        inputs = {k: v.to(like).to(device, dtype) for k, v in inputs.items()}
        return model(**inputs, return_dict=False)[0]
