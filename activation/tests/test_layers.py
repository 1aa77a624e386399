"""The `kernelize` layers: loaded through kernels' own layer machinery from the local build.

A small model (Linear -> activation host module) is kernelized with a `LocalLayerRepository`
mapping that names each mode explicitly and `use_fallback=False`, so a layer that the loader
rejects, or that lacks a mode, fails instead of silently keeping the host forward. The
kernelized model must match the host (reference) model in outputs and in parameter gradients.
"""

import copy
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

from activation_cases import OpCase, assert_within_bound, magnitude, make_input

# layer name -> (op case, host-module attributes the layer reads)
LAYERS = {
    "SiluAndMul": (OpCase("silu_and_mul", gated=True), {}),
    "MulAndSilu": (OpCase("mul_and_silu", gated=True, act_second=True), {}),
    "GeluAndMul": (OpCase("gelu_and_mul", gated=True), {}),
    "GeluTanhAndMul": (OpCase("gelu_tanh_and_mul", gated=True), {}),
    "FatreluAndMul": (OpCase("fatrelu_and_mul", gated=True, scalars={"threshold": 0.5}), {"threshold": 0.5}),
    "SwigluOAIAndMul": (
        OpCase("swigluoai_and_mul", gated=True, interleaved=True, scalars={"alpha": 1.0, "limit": 1.5}),
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
    return fn is not None and fn.__qualname__ == f"{layer_name}.forward" and fn.__module__.endswith(".layers")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_layer_flags(kernel, layer_name):
    layer = getattr(kernel.layers, layer_name)
    assert layer.has_backward is True and layer.can_torch_compile is True
    assert layer.__init__ is nn.Module.__init__


@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_kernelize_inference(kernel, device, layer_name):
    model, case = _model(kernel, layer_name, device)
    reference = copy.deepcopy(model)
    model.eval()
    with use_kernel_mapping(_mapping(kernel, layer_name, device, [Mode.INFERENCE]), inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device=device, use_fallback=False)
    assert _is_kernel_forward(model[1], layer_name)
    x = make_input((7, 16), torch.float32, device)
    with torch.no_grad():
        hidden = model[0](x)
        out = model(x)
    ref = case.reference(kernel, hidden)
    assert_within_bound(out, ref, magnitude(case, hidden), layer_name)
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), rtol=1e-5, atol=1e-6)  # fp32 host forward


@pytest.mark.parametrize("compile_", [False, True], ids=["eager", "compile"])
@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_kernelize_training(kernel, device, layer_name, compile_):
    model, case = _model(kernel, layer_name, device)
    reference = copy.deepcopy(model).double()
    mode = Mode.TRAINING | Mode.TORCH_COMPILE if compile_ else Mode.TRAINING
    with use_kernel_mapping(_mapping(kernel, layer_name, device, [mode]), inherit_mapping=False):
        kernelize(model, mode=mode, device=device, use_fallback=False)
    assert _is_kernel_forward(model[1], layer_name)
    if compile_:
        torch._dynamo.reset()
        model = torch.compile(model, fullgraph=True)

    x = make_input((9, 16), torch.float32, device)
    grad_out = make_input((9, HIDDEN), torch.float32, device, scale=1.0, seed=1)
    model(x).backward(grad_out)
    reference(x.double()).backward(grad_out.double())
    # fp32 vs float64 through one Linear: the activation part is bounded by the table; the
    # Linear's fp32 matmul adds ~K * 2**-24 relative (K = 16), far below the 1e-5 used here.
    for (name, p), (_, p_ref) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad.float(), rtol=1e-5, atol=1e-5, msg=f"{layer_name} {name}")
