"""The `kernelize` layers: loaded through kernels' own layer machinery from the local build.

A small model (Linear -> activation host module) is kernelized with a `LocalLayerRepository`
mapping that names each mode explicitly and `use_fallback=False`, so a layer that the loader
rejects, or that lacks a mode, fails instead of silently keeping the host forward. The
kernelized layer's output, and in TRAINING mode the gradient it passes back to the Linear, must
match float64 autograd of the reference within the tolerance table of activation_cases.py.
"""

from pathlib import Path

import pytest
import torch
import torch.nn as nn
from activation_cases import OpCase, assert_within_bound, magnitude, make_input
from kernels import (
    LocalLayerRepository,
    Mode,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)

# layer name -> (op case, host-module attributes the layer reads)
LAYERS = {
    "SiluAndMul": (OpCase("silu_and_mul", gated=True), {}),
    "MulAndSilu": (OpCase("mul_and_silu", gated=True, act_second=True), {}),
    "GeluAndMul": (OpCase("gelu_and_mul", gated=True), {}),
    "GeluTanhAndMul": (OpCase("gelu_tanh_and_mul", gated=True), {}),
    "FatreluAndMul": (
        OpCase("fatrelu_and_mul", gated=True, scalars={"threshold": 0.5}),
        {"threshold": 0.5},
    ),
    "SwigluOAIAndMul": (
        OpCase(
            "swigluoai_and_mul", gated=True, interleaved=True, scalars={"alpha": 1.0, "limit": 1.5}
        ),
        {"alpha": 1.0, "limit": 1.5},
    ),
    "Silu": (OpCase("silu", gated=False), {}),
    "Gelu": (OpCase("gelu", gated=False), {}),
    "GeluTanh": (OpCase("gelu_tanh", gated=False), {}),
    "FastGELU": (OpCase("gelu_fast", gated=False), {}),
    "NewGELU": (OpCase("gelu_new", gated=False), {}),
    "QuickGELU": (OpCase("gelu_quick", gated=False), {}),
}

HIDDEN = 24  # host activation width (the Linear produces 2 * HIDDEN for gated layers)


def _model(kernel, layer_name, device):
    case, attrs = LAYERS[layer_name]

    @use_kernel_forward_from_hub(layer_name)
    class Host(nn.Module):
        def __init__(self):
            super().__init__()
            for key, value in attrs.items():
                setattr(self, key, value)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return case.reference(kernel, x, compute_dtype=x.dtype).to(x.dtype)

    width = 2 * HIDDEN if case.gated else HIDDEN
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, width), Host()).to(device), case


def _mapping(kernel, layer_name, device, modes):
    # The variant directory the `kernel` fixture was loaded from (a path form get_local_kernel
    # accepts), so the layers come from the same build as the rest of the tests.
    repo = LocalLayerRepository(repo_path=Path(kernel.__file__).parent, layer_name=layer_name)
    return {layer_name: {device: {mode: repo for mode in modes}}}


def _is_kernel_forward(module, layer_name):
    fn = getattr(module.forward, "__func__", None)
    return (
        fn is not None
        and fn.__qualname__ == f"{layer_name}.forward"
        and fn.__module__.endswith(".layers")
    )


@pytest.mark.kernels_ci
@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_layer_flags(kernel, layer_name):
    layer = getattr(kernel.layers, layer_name)
    assert layer.has_backward is True and layer.can_torch_compile is True
    assert layer.__init__ is nn.Module.__init__


@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_kernelize_inference(kernel, device, layer_name):
    model, case = _model(kernel, layer_name, device)
    model.eval()
    with use_kernel_mapping(
        _mapping(kernel, layer_name, device, [Mode.INFERENCE]), inherit_mapping=False
    ):
        kernelize(model, mode=Mode.INFERENCE, device=device, use_fallback=False)
    assert _is_kernel_forward(model[1], layer_name)
    x = make_input((7, 16), torch.float32, device)
    with torch.no_grad():
        hidden = model[0](x)
        out = model(x)
    assert_within_bound(out, case.reference(kernel, hidden), magnitude(case, hidden), layer_name)


@pytest.mark.parametrize("compile_", [False, True], ids=["eager", "compile"])
@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_kernelize_training(kernel, device, layer_name, compile_):
    model, case = _model(kernel, layer_name, device)
    mode = Mode.TRAINING | Mode.TORCH_COMPILE if compile_ else Mode.TRAINING
    with use_kernel_mapping(_mapping(kernel, layer_name, device, [mode]), inherit_mapping=False):
        kernelize(model, mode=mode, device=device, use_fallback=False)
    linear, act = model[0], model[1]
    assert _is_kernel_forward(act, layer_name)
    if compile_:
        torch._dynamo.reset()
        act = torch.compile(act, fullgraph=True)

    x = make_input((9, 16), torch.float32, device)
    hidden = linear(x)
    hidden.retain_grad()
    out = act(hidden)
    grad_out = make_input(out.shape, torch.float32, device, scale=1.0, seed=1)
    out.backward(grad_out)
    # The gradient the layer hands back to the Linear, vs float64 autograd of the reference.
    h64 = hidden.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(case.reference(kernel, h64), h64, grad_out.double())
    assert_within_bound(
        hidden.grad, ref, magnitude(case, hidden.detach(), grad_out), f"{layer_name} grad"
    )
    assert_within_bound(
        out, case.reference(kernel, hidden.detach()), magnitude(case, hidden.detach()), layer_name
    )
    for name, p in linear.named_parameters():
        assert p.grad is not None and bool(p.grad.isfinite().all()), (
            f"{layer_name}: no gradient for {name}"
        )


@pytest.mark.kernels_ci
def test_fatrelu_and_mul_constructor(kernel, device):
    # kernels-community's `FatreluAndMul(threshold: float = 0.0)`: a standalone module whose
    # forward uses the threshold given to the constructor. The class keeps nn.Module's own
    # constructor and no extra members, so kernels' layer validation still accepts it.
    from kernels.layer.layer import _validate_layer

    layer_cls = kernel.layers.FatreluAndMul
    x = make_input((5, 2 * HIDDEN), torch.float32, device)
    for module, threshold in (
        (layer_cls(0.5), 0.5),
        (layer_cls(threshold=0.25), 0.25),
        (layer_cls(), 0.0),
    ):
        assert isinstance(module, nn.Module) and module.threshold == threshold
        torch.testing.assert_close(
            module(x), kernel.fatrelu_and_mul(x, threshold=threshold), rtol=0, atol=0
        )
    assert layer_cls.__init__ is nn.Module.__init__

    class Host(nn.Module):
        def forward(self, x):
            return x

    _validate_layer(check_cls=Host, cls=layer_cls, repo="FatreluAndMul")
    with pytest.raises(TypeError):
        layer_cls(0.5, 1.0)
