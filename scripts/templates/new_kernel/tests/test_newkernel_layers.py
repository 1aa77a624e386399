"""The `kernelize` layers, loaded through kernels' own layer machinery from the local build.

A small model (Linear -> host module) is kernelized with a `LocalLayerRepository` mapping that
names each mode and `use_fallback=False`, so a layer the loader rejects fails instead of silently
keeping the host's forward.
"""

from pathlib import Path

import pytest
import torch
import torch.nn as nn
from kernels import (
    LocalLayerRepository,
    Mode,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from newkernel_cases import assert_within_bound, make_input

ALPHA = 0.75


def _model(device):
    @use_kernel_forward_from_hub("Scale")
    class Host(nn.Module):
        def __init__(self):
            super().__init__()
            self.alpha = ALPHA

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.alpha * x

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 24), Host()).to(device)


def _kernelize(kernel, model, device, mode):
    # The variant directory the `kernel` fixture loaded, so the layer comes from the same build.
    repo = LocalLayerRepository(repo_path=Path(kernel.__file__).parent, layer_name="Scale")
    with use_kernel_mapping({"Scale": {device: {mode: repo}}}, inherit_mapping=False):
        kernelize(model, mode=mode, device=device, use_fallback=False)
    fn = model[1].forward.__func__
    assert fn.__qualname__ == "Scale.forward" and fn.__module__.endswith(".layers")


@pytest.mark.kernels_ci
def test_layer_flags(kernel):
    assert kernel.layers.Scale.has_backward is True
    assert kernel.layers.Scale.can_torch_compile is True
    assert kernel.layers.Scale.__init__ is nn.Module.__init__


def test_kernelize_inference(kernel, device):
    model = _model(device).eval()
    _kernelize(kernel, model, device, Mode.INFERENCE)
    x = make_input((7, 16), torch.float32, device)
    with torch.no_grad():
        hidden = model[0](x)
        out = model(x)
    assert_within_bound(out, kernel._reference.scale(hidden, ALPHA, torch.float64), "inference")


@pytest.mark.parametrize("compile_", [False, True], ids=["eager", "compile"])
def test_kernelize_training(kernel, device, compile_):
    model = _model(device)
    mode = Mode.TRAINING | Mode.TORCH_COMPILE if compile_ else Mode.TRAINING
    _kernelize(kernel, model, device, mode)
    linear, layer = model[0], model[1]
    if compile_:
        torch._dynamo.reset()
        layer = torch.compile(layer, fullgraph=True)
    x = make_input((9, 16), torch.float32, device)
    hidden = linear(x)
    hidden.retain_grad()
    out = layer(hidden)
    grad_out = make_input(out.shape, torch.float32, device, seed=1)
    out.backward(grad_out)
    ref = kernel._reference.scale
    assert_within_bound(out, ref(hidden.detach(), ALPHA, torch.float64), "training forward")
    assert_within_bound(hidden.grad, ref(grad_out, ALPHA, torch.float64), "training grad")
    assert linear.weight.grad is not None and bool(linear.weight.grad.isfinite().all())
