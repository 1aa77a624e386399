"""`attach_layers` on real transformers and diffusers models: the route that works with kernels
0.17.2, where transformers' hub-kernel decorators are inert and `kernelize` replaces nothing.

Each model is a tiny random one built from its config. The helper must replace exactly the
expected modules (counts per host class), the replaced forwards must be our layers' functions
(identity, not a name match), the model's output must be as accurate as the untouched model's
(rmsnorm_tiny_models.py derives the bound), and a model without any host class must raise,
untouched.
"""

import copy
import inspect

import pytest
import torch
from kernels import Mode
from rmsnorm_tiny_models import assert_as_accurate, causal_lm, float64_twin, flux, run_flux

transformers = pytest.importorskip("transformers")


def _replaced_by(model, cls_name, layer):
    """How many modules of class `cls_name` run `layer`'s forward, and how many there are."""
    modules = [m for m in model.modules() if type(m).__name__ == cls_name]
    ours = [m for m in modules if getattr(m.forward, "__func__", None) is layer.forward]
    return len(ours), len(modules)


# Llama: 2 decoder layers x (input, post-attention) + the final norm. Qwen3 adds the per-head
# q_norm and k_norm of each attention ([B, S, heads, head_dim] inputs).
@pytest.mark.parametrize(
    "name,host,count", [("llama", "LlamaRMSNorm", 5), ("qwen3", "Qwen3RMSNorm", 9)]
)
def testcausal_lm(kernel, device, name, host, count):
    model = causal_lm(name).to(device)
    twin = float64_twin(model)
    ours = copy.deepcopy(model)
    assert kernel.attach_layers(ours, mode=Mode.TRAINING) == {host: count}
    assert _replaced_by(ours, host, kernel.layers.RMSNorm) == (count, count)
    assert _replaced_by(model, host, kernel.layers.RMSNorm) == (0, count)  # the copy only

    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        logits = [m(input_ids=ids).logits for m in (ours, model, twin)]
    assert_as_accurate(f"{name} logits", *logits)
    # TRAINING mode: gradients reach every norm weight through our backward.
    ours(input_ids=ids).logits.square().mean().backward()
    for n, p in ours.named_parameters():
        if "norm" in n:
            assert p.grad is not None and bool(p.grad.isfinite().all()), n


def test_default_hosts_share_llama_code(kernel):
    """The bare transformers names of the default map go to layers.RMSNorm because their
    forwards are LlamaRMSNorm's code (transformers copies it per model); a release that changes
    one must fail here rather than silently compute something else."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    want = inspect.getsource(LlamaRMSNorm.forward)
    checked = 0
    for key, entry in kernel.layers.HOST_CLASSES.items():
        if entry is not kernel.layers.RMSNorm or key == "LlamaRMSNorm":
            continue
        model_dir = key[: -len("RMSNorm")].lower()
        model_dir = {"qwen3moe": "qwen3_moe"}.get(model_dir, model_dir)
        module = pytest.importorskip(f"transformers.models.{model_dir}.modeling_{model_dir}")
        assert inspect.getsource(getattr(module, key).forward) == want, key
        checked += 1
    assert checked >= 5


def test_gemma_and_diffusers_norms(kernel, device):
    from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    model = torch.nn.Sequential(
        GemmaRMSNorm(48, eps=1e-6),
        DiffusersRMSNorm(48, eps=1e-6),
        DiffusersRMSNorm(48, eps=1e-6, elementwise_affine=False),  # weight None
        torch.nn.RMSNorm(48),  # eps None
        torch.nn.RMSNorm([4, 48]),  # two dimensions: not ours
    ).to(device)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
        model[0].weight.copy_(0.2 * torch.randn_like(model[0].weight))  # Gemma: 1 + weight
    ours = copy.deepcopy(model)
    counts = kernel.attach_layers(ours, device=device)
    assert counts == {"GemmaRMSNorm": 1, "diffusers.RMSNorm": 2, "torch.nn.RMSNorm": 1}
    layers = kernel.layers
    expected = [
        layers.GemmaRMSNorm,
        layers.DiffusersRMSNorm,
        layers.DiffusersRMSNorm,
        layers.TorchRMSNorm,
    ]
    for module, layer in zip(ours, expected):
        assert module.forward.__func__ is layer.forward
    assert "forward" not in vars(ours[4])

    x = torch.randn(2, 4, 48, generator=torch.Generator().manual_seed(4)).to(device)
    twin = float64_twin(model)
    for i in range(4):
        with torch.no_grad():
            got = [m[i](x if m is not twin else x.double()) for m in (ours, model, twin)]
        assert_as_accurate(f"{type(model[i]).__name__} {i}", *got)


def test_flux_transformer(kernel, device):
    """diffusers' Flux uses torch.nn.RMSNorm for its q/k norms."""
    pytest.importorskip("diffusers")
    model = flux().to(device)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.RMSNorm):
                m.weight.copy_(1.0 + 0.2 * torch.randn_like(m.weight))
    twin = float64_twin(model)
    ours = copy.deepcopy(model)
    # double block: norm_q, norm_k, norm_added_q, norm_added_k; single block: norm_q, norm_k
    assert kernel.attach_layers(ours) == {"torch.nn.RMSNorm": 6}
    assert _replaced_by(ours, "RMSNorm", kernel.layers.TorchRMSNorm) == (6, 6)
    out = [run_flux(ours, device), run_flux(model, device), run_flux(twin, device, torch.float64)]
    assert_as_accurate("flux output", *out)


# ---- errors ----


@pytest.mark.kernels_ci
def test_nothing_matched_raises_and_touches_nothing(kernel, device):
    model = causal_lm("llama").to(device)
    with pytest.raises(ValueError, match=r"attach_layers: no module .*GemmaRMSNorm.*LlamaRMSNorm"):
        kernel.attach_layers(model, classes=["GemmaRMSNorm"])
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).to(device)
    with pytest.raises(ValueError, match=r"looked for LlamaRMSNorm, .*LayerNorm"):
        kernel.attach_layers(plain)
    assert not any("forward" in vars(m) for m in model.modules())


@pytest.mark.kernels_ci
def test_argument_errors(kernel, device):
    # On the device the kernel was built for: attach_layers refuses a device without kernels
    # (the CUDA build has no CPU kernels), and the last call below must succeed.
    model = causal_lm("llama").to(device)

    class NoBackward(torch.nn.Module):
        has_backward = False
        can_torch_compile = True

        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="NoBackward .*no backward; mode asks TRAINING"):
        kernel.attach_layers(model, mode=Mode.TRAINING, classes={"LlamaRMSNorm": NoBackward})
    with pytest.raises(ValueError, match="does not support torch.compile"):
        kernel.attach_layers(
            model,
            mode=Mode.INFERENCE | Mode.TORCH_COMPILE,
            classes={
                "LlamaRMSNorm": type("NoCompile", (NoBackward,), {"can_torch_compile": False})
            },
        )
    with pytest.raises(ValueError, match="'NotANorm', which has no default layer"):
        kernel.attach_layers(model, classes=["NotANorm"])
    with pytest.raises(ValueError, match="names no layer 'Nope'"):
        kernel.attach_layers(model, classes={"LlamaRMSNorm": "Nope"})
    with pytest.raises(ValueError, match="mode must be a kernels Mode"):
        kernel.attach_layers(model, mode="training")
    with pytest.raises(ValueError, match="device 'mps' has no kernels in this build"):
        kernel.attach_layers(model, device="mps")
    model.model.norm._hf_hook = object()  # what accelerate's add_hook_to_module leaves
    with pytest.raises(ValueError, match="model.norm .*carries an accelerate or diffusers hook"):
        kernel.attach_layers(model)
    del model.model.norm._hf_hook
    model.model.layers[1].input_layernorm._diffusers_hook = object()  # diffusers' group offload
    with pytest.raises(ValueError, match="input_layernorm .*carries an accelerate or diffusers"):
        kernel.attach_layers(model)
    assert not any("forward" in vars(m) for m in model.modules())
    # a layer name resolves to the package's layer
    del model.model.layers[1].input_layernorm._diffusers_hook
    assert kernel.attach_layers(model, classes={"LlamaRMSNorm": "LlamaRMSNorm"}) == {
        "LlamaRMSNorm": 5
    }
    assert model.model.norm.forward.__func__ is kernel.layers.LlamaRMSNorm.forward


def test_forward_survives_accelerate_hooks(kernel, device):
    """accelerate's hooks (enable_model_cpu_offload and the like) keep the forward they find:
    a forward attached before them stays in use."""
    hooks = pytest.importorskip("accelerate.hooks")
    model = causal_lm("llama").to(device)
    kernel.attach_layers(model)
    hooks.add_hook_to_module(model.model.norm, hooks.ModelHook())
    assert model.model.norm._old_forward.__func__ is kernel.layers.RMSNorm.forward
    calls = []
    original = model.model.norm._old_forward
    model.model.norm._old_forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 4, dtype=torch.long, device=device))
    assert calls == [1]
