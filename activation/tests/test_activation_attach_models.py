"""`attach_layers` on real transformers and diffusers models: the route that works with kernels
0.17.2, where transformers' hub-kernel decorators are inert and `kernelize` replaces nothing.

Each model is a tiny random one built from its config (or diffusers' FeedForward blocks). The
helper must replace exactly the expected modules (counts per host class), the replaced forwards
must be our layers' functions (identity), the output must be as accurate as the untouched
model's (activation_tiny_models.py derives the bound), and a model without any host class
must raise, untouched.
"""

import copy

import pytest
import torch
from activation_tiny_models import assert_as_accurate, causal_lm, float64_twin, flux, run_flux
from kernels import Mode

transformers = pytest.importorskip("transformers")


def _forward_fn(module):
    """The function an instance forward was replaced by; None for the class's own forward."""
    own = vars(module).get("forward")
    return None if own is None else getattr(own, "__func__", None)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def testcausal_lm(kernel, device, name):
    """The MLPs' act_fn (SiLUActivation; the MLP multiplies by up_proj itself)."""
    model = causal_lm(name).to(device)
    twin = float64_twin(model)
    ours = copy.deepcopy(model)
    assert kernel.attach_layers(ours, mode=Mode.TRAINING) == {"transformers.SiLUActivation": 2}
    for layer in ours.model.layers:
        assert _forward_fn(layer.mlp.act_fn) is kernel.layers.Silu.forward
    assert all(_forward_fn(layer.mlp.act_fn) is None for layer in model.model.layers)

    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        logits = [m(input_ids=ids).logits for m in (ours, model, twin)]
    assert_as_accurate(f"{name} logits", *logits)
    ours(input_ids=ids).logits.square().mean().backward()  # TRAINING: through our backward
    assert bool(ours.model.layers[0].mlp.gate_proj.weight.grad.isfinite().all())


def test_transformers_activations(kernel, device):
    from transformers.activations import ACT2CLS, ACT2FN

    names = ["gelu", "gelu_python", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "quick_gelu"]
    model = torch.nn.ModuleList([ACT2FN[n] for n in names] + [torch.nn.SiLU()]).to(device)
    ours = copy.deepcopy(model)
    counts = kernel.attach_layers(ours, device=device)
    assert counts == {
        "transformers.GELUActivation": 2,
        "transformers.GELUTanh": 1,
        "transformers.NewGELUActivation": 1,
        "transformers.FastGELUActivation": 1,
        "transformers.QuickGELUActivation": 1,
        "torch.nn.SiLU": 1,
    }, ACT2CLS
    layers = kernel.layers
    expected = [
        layers.Gelu,
        layers.Gelu,
        layers.GeluTanh,
        layers.NewGELU,
        layers.FastGELU,
        layers.QuickGELU,
        layers.Silu,
    ]
    x = 3 * torch.randn(4, 40, generator=torch.Generator().manual_seed(1)).to(device)
    for i, (module, layer) in enumerate(zip(ours, expected)):
        assert _forward_fn(module) is layer.forward, i
        with torch.no_grad():
            assert_as_accurate(f"{i}", module(x), model[i](x), model[i].double()(x.double()))
    inplace = torch.nn.ModuleList([torch.nn.SiLU(inplace=True), ACT2FN["gelu"]])
    assert kernel.attach_layers(inplace) == {"transformers.GELUActivation": 1}
    assert _forward_fn(inplace[0]) is None  # in-place SiLU: not ours


def test_diffusers_feed_forward(kernel, device):
    """diffusers' FeedForward with each activation we reproduce; GEGLU (h * gelu(gate)) stays."""
    attention = pytest.importorskip("diffusers.models.attention")
    fns = ["gelu", "gelu-approximate", "swiglu", "geglu-approximate", "geglu"]
    torch.manual_seed(0)
    model = torch.nn.ModuleList([attention.FeedForward(24, activation_fn=f) for f in fns]).to(
        device
    )
    ours = copy.deepcopy(model)
    counts = kernel.attach_layers(ours)
    assert counts == {"diffusers.GELU": 2, "diffusers.SwiGLU": 1, "diffusers.ApproximateGELU": 1}
    layers = kernel.layers
    expected = [
        layers.DiffusersGELU,
        layers.DiffusersGELU,
        layers.DiffusersSwiGLU,
        layers.DiffusersApproximateGELU,
        None,
    ]
    twin = float64_twin(model)
    x = torch.randn(2, 5, 24, generator=torch.Generator().manual_seed(1)).to(device)
    for i, (block, layer) in enumerate(zip(ours, expected)):
        assert _forward_fn(block.net[0]) is (None if layer is None else layer.forward), fns[i]
        with torch.no_grad():
            assert_as_accurate(fns[i], block(x), model[i](x), twin[i](x.double()))


def test_flux_transformer(kernel, device):
    """diffusers' Flux: GELU(approximate="tanh") in the double block's two feed-forwards, and
    torch.nn.SiLU before the adaptive norms' and the time embedding's linears (the single
    block's torch.nn.GELU is not in the map)."""
    pytest.importorskip("diffusers")
    model = flux().to(device)
    twin = float64_twin(model)
    ours = copy.deepcopy(model)
    assert kernel.attach_layers(ours) == {"diffusers.GELU": 2, "torch.nn.SiLU": 6}
    block = ours.transformer_blocks[0]
    for ff in (block.ff, block.ff_context):
        assert _forward_fn(ff.net[0]) is kernel.layers.DiffusersGELU.forward

    out = [run_flux(ours, device), run_flux(model, device), run_flux(twin, device, torch.float64)]
    assert_as_accurate("flux output", *out)


@pytest.mark.kernels_ci
@pytest.mark.parametrize(
    "layer_name", ["DiffusersGELU", "DiffusersSwiGLU", "DiffusersApproximateGELU"]
)
def test_diffusers_layer_flags(kernel, layer_name):
    """kernels' layer rules, so that kernelize accepts these layers too."""
    import inspect

    layer = getattr(kernel.layers, layer_name)
    assert layer.has_backward is True and layer.can_torch_compile is True
    assert layer.__init__ is torch.nn.Module.__init__
    members = {n for n, _ in inspect.getmembers(layer)}
    assert members - {n for n, _ in inspect.getmembers(torch.nn.Module)} == {
        "has_backward",
        "can_torch_compile",
    }


# ---- errors ----


@pytest.mark.kernels_ci
def test_nothing_matched_raises_and_touches_nothing(kernel, device):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).to(device)
    with pytest.raises(
        ValueError,
        match=r"attach_layers: no module .*looked for transformers.SiLUActivation, .*torch.nn.modules.activation.ReLU",
    ):
        kernel.attach_layers(model)
    llama = causal_lm("llama").to(device)
    with pytest.raises(ValueError, match="looked for diffusers.GELU; .*SiLUActivation"):
        kernel.attach_layers(llama, classes=["diffusers.GELU"])
    assert not any("forward" in vars(m) for m in llama.modules())


@pytest.mark.kernels_ci
def test_mode_needs_the_layer_flags(kernel, device):
    class Plain(torch.nn.Module):
        has_backward = False

        def forward(self, x):
            return x

    # On the device the kernel was built for: attach_layers refuses a device without kernels
    # (the CUDA build has no CPU kernels), and the last call below must succeed.
    llama = causal_lm("llama").to(device)
    hosts = {"transformers.SiLUActivation": Plain}
    with pytest.raises(ValueError, match="Plain .*no backward; mode asks TRAINING"):
        kernel.attach_layers(llama, mode=Mode.TRAINING, classes=hosts)
    with pytest.raises(ValueError, match="Plain .*does not support torch.compile"):
        kernel.attach_layers(llama, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, classes=hosts)
    assert kernel.attach_layers(llama, mode=Mode.INFERENCE, classes=hosts) == {
        "transformers.SiLUActivation": 2
    }
