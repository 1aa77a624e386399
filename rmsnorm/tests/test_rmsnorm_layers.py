"""The `kernelize` layers against the real transformers and diffusers modules.

Layers are loaded through kernels' own machinery from the local build: a `LocalLayerRepository`
mapping names each mode explicitly and `kernelize(..., use_fallback=False)` raises instead of
silently keeping the host forward. The host modules are the installed transformers (5.x) and
diffusers (0.42) classes. transformers 5.23 only activates its `use_kernel_forward_from_hub`
decorators with kernels >= 0.18.2 (the repo pins 0.17.2), and diffusers' RMSNorm and
transformers' GemmaRMSNorm are not decorated at all, so the tests attach the layer name to the
class themselves (what the decorator does), for the duration of a test.

For each module: the output dtype must be the module's; values must be within the forward
bound of the float64 reference (rmsnorm_cases.py); on the elements the contract decides, the
kernel and the module itself must both equal the prescribed value bit for bit (so they agree
there; elsewhere they may differ by one ulp of the undecided rounding). TRAINING mode checks the
gradients (input and weight) against float64 autograd, and TRAINING | TORCH_COMPILE runs the
kernelized module under torch.compile(fullgraph=True): this is what makes `has_backward` and
`can_torch_compile` true in fact.
"""

import copy
import inspect
import types
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping
from rmsnorm_cases import (
    BF16,
    DTYPES,
    F16,
    F32,
    Parts,
    assert_decided,
    assert_within,
    check_grads,
    forward_bound,
    make_input,
)
from rmsnorm_tiny_models import causal_lm

transformers = pytest.importorskip("transformers")
diffusers_normalization = pytest.importorskip("diffusers.models.normalization")

from transformers.models.gemma.modeling_gemma import GemmaRMSNorm as HFGemmaRMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm as HFLlamaRMSNorm  # noqa: E402

DiffusersRMSNorm = diffusers_normalization.RMSNorm

LAYERS = ["RMSNorm", "LlamaRMSNorm", "GemmaRMSNorm", "DiffusersRMSNorm", "TorchRMSNorm"]
MODES = {
    "inference": Mode.INFERENCE,
    "training": Mode.TRAINING,
    "training+compile": Mode.TRAINING | Mode.TORCH_COMPILE,
}


@pytest.fixture
def named(monkeypatch):
    """named(cls, layer_name): give a host class its kernel layer name for this test."""

    def attach(cls, layer_name):
        monkeypatch.setattr(cls, "kernel_layer_name", layer_name, raising=False)
        monkeypatch.setattr(
            cls, "kernel_condition", staticmethod(lambda module: True), raising=False
        )

    return attach


def _kernelize(model, kernel, kernel_layer_name, layer, device, mode):
    # The variant directory the `kernel` fixture was loaded from (a path form get_local_kernel
    # accepts), so the layers come from the same build as the rest of the tests.
    repo = LocalLayerRepository(repo_path=Path(kernel.__file__).parent, layer_name=layer)
    with use_kernel_mapping({kernel_layer_name: {device: {mode: repo}}}, inherit_mapping=False):
        kernelize(model, mode=mode, device=device, use_fallback=False)
    return model


def _is_kernel_forward(module, layer):
    fn = getattr(module.forward, "__func__", None)
    return (
        fn is not None
        and fn.__module__.endswith(".layers")
        and fn.__qualname__.split(".")[0] in (layer, "RMSNorm")
    )


def _run(module, x, mode_name, grad_out_seed=1):
    """Output (and, in training modes, the gradients of x and weight) of `module` on x."""
    if mode_name == "training+compile":
        torch._dynamo.reset()
        module_call = torch.compile(module, fullgraph=True)
    else:
        module_call = module
    if mode_name == "inference":
        with torch.no_grad():
            return module_call(x), None
    xr = x.clone().requires_grad_()
    y = module_call(xr)
    grad_out = make_input(y.shape, y.dtype, y.device, scale=1.0, seed=grad_out_seed)
    params = [xr] + [p for p in module.parameters()]
    grads = torch.autograd.grad(y, params, grad_out)
    return y.detach(), (grad_out, grads)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("layer", LAYERS)
def test_layer_flags(kernel, layer):
    cls = getattr(kernel.layers, layer)
    assert cls.has_backward is True and cls.can_torch_compile is True
    assert cls.__init__ is nn.Module.__init__
    extra = {n for n, _ in inspect.getmembers(cls)} - {n for n, _ in inspect.getmembers(nn.Module)}
    assert extra == {"has_backward", "can_torch_compile"}


# ---- transformers LlamaRMSNorm ----


@pytest.mark.parametrize("mode_name", list(MODES))
@pytest.mark.parametrize(
    "dtypes",
    [(F32, F32), (BF16, BF16), (F16, F16), (BF16, F32), (F16, F32)],
    ids=lambda d: f"x={d[0]},w={d[1]}".replace("torch.", ""),
)
@pytest.mark.parametrize("layer", ["RMSNorm", "LlamaRMSNorm"])
def test_transformers_llama_rms_norm(kernel, device, named, layer, dtypes, mode_name):
    xdtype, wdtype = dtypes
    named(HFLlamaRMSNorm, "RMSNorm")
    hidden = 96
    module = HFLlamaRMSNorm(hidden, eps=1e-5).to(device=device, dtype=wdtype)
    with torch.no_grad():
        module.weight.copy_(make_input((hidden,), wdtype, device, scale=0.5, mean=1.0, seed=5))
    x = make_input((3, 5, hidden), xdtype, device)
    ours = _kernelize(copy.deepcopy(module), kernel, "RMSNorm", layer, device, MODES[mode_name])
    assert _is_kernel_forward(ours, layer)

    y, grads = _run(ours, x, mode_name)
    y_hf, _ = _run(module, x, "inference")
    assert y.dtype == y_hf.dtype == torch.promote_types(xdtype, wdtype)
    parts = Parts(kernel, x, module.weight, 1e-5)
    bound = forward_bound(parts, y.dtype, xdtype)
    assert_within(y, parts.y, bound, "kernel")
    assert_within(y_hf, parts.y, bound, "transformers (the bound is not tighter than PyTorch)")
    assert_decided(y, parts, y.dtype, xdtype, "kernel")
    assert_decided(y_hf, parts, y.dtype, xdtype, "transformers")
    if grads is not None:
        grad_out, (gx, gw) = grads
        assert gx.dtype == xdtype and gw.dtype == wdtype
        check_grads(
            kernel,
            {"input": gx, "weight": gw},
            x,
            module.weight,
            grad_out,
            1e-5,
            what=f"LlamaRMSNorm {mode_name}",
        )


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_framework_references(kernel, device, dtype):
    # kernel._reference's framework forwards are op-for-op copies of the modules (the benchmarks'
    # eager baselines): bit for bit equal, output dtype included.
    ref = kernel._reference
    hidden = 24
    x = make_input((3, hidden), dtype, device)
    for wdtype in (dtype, F32):
        llama = HFLlamaRMSNorm(hidden, eps=1e-5).to(device=device, dtype=wdtype)
        gemma = HFGemmaRMSNorm(hidden, eps=1e-6).to(device=device, dtype=wdtype)
        diff = DiffusersRMSNorm(hidden, eps=1e-6, bias=True).to(device=device, dtype=wdtype)
        for m in (llama, gemma, diff):
            with torch.no_grad():
                for i, p in enumerate(m.parameters()):
                    p.copy_(make_input(p.shape, wdtype, device, scale=0.5, mean=1.0, seed=5 + i))
        with torch.no_grad():
            pairs = [
                (llama(x), ref.llama_rms_norm(x, llama.weight, 1e-5)),
                (gemma(x), ref.gemma_rms_norm(x, gemma.weight, 1e-6)),
                (diff(x), ref.diffusers_rms_norm(x, diff.weight, diff.bias, 1e-6)),
            ]
        for got, want in pairs:
            assert got.dtype == want.dtype and torch.equal(got, want)
    no_weight = DiffusersRMSNorm(hidden, eps=1e-6, elementwise_affine=False).to(device)
    assert torch.equal(no_weight(x), ref.diffusers_rms_norm(x, None, None, 1e-6))


@pytest.mark.kernels_ci
def test_variance_epsilon_falls_back_to_eps(kernel, device):
    # A host module with `eps` and no `variance_epsilon` (Qwen-style norms): RMSNorm reads eps.
    class Host(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8, device=device))
            self.eps = 0.5

    host = Host()
    x = make_input((3, 8), F32, device)
    y = types.MethodType(kernel.layers.RMSNorm.forward, host)(x)
    torch.testing.assert_close(y, kernel.rms_norm_func(x, host.weight, 0.5), rtol=0, atol=0)


# ---- transformers GemmaRMSNorm ----


@pytest.mark.parametrize("mode_name", list(MODES))
@pytest.mark.parametrize(
    "dtypes",
    [(F32, F32), (BF16, BF16), (F16, F16), (BF16, F32)],
    ids=lambda d: f"x={d[0]},w={d[1]}".replace("torch.", ""),
)
def test_transformers_gemma_rms_norm(kernel, device, named, dtypes, mode_name):
    xdtype, wdtype = dtypes
    named(HFGemmaRMSNorm, "GemmaRMSNorm")
    hidden = 80
    module = HFGemmaRMSNorm(hidden, eps=1e-6).to(device=device, dtype=wdtype)
    with torch.no_grad():
        module.weight.copy_(make_input((hidden,), wdtype, device, scale=0.5, seed=5))
    x = make_input((4, 7, hidden), xdtype, device)
    ours = _kernelize(
        copy.deepcopy(module), kernel, "GemmaRMSNorm", "GemmaRMSNorm", device, MODES[mode_name]
    )
    assert _is_kernel_forward(ours, "GemmaRMSNorm")

    y, grads = _run(ours, x, mode_name)
    y_hf, _ = _run(module, x, "inference")
    assert y.dtype == y_hf.dtype == xdtype
    parts = Parts(kernel, x, module.weight, 1e-6, weight_offset=1.0)
    bound = forward_bound(parts, xdtype, None)
    assert_within(y, parts.y, bound, "kernel")
    assert_within(y_hf, parts.y, bound, "transformers")
    assert_decided(y, parts, xdtype, None, "kernel")
    assert_decided(y_hf, parts, xdtype, None, "transformers")
    if grads is not None:
        grad_out, (gx, gw) = grads
        check_grads(
            kernel,
            {"input": gx, "weight": gw},
            x,
            module.weight,
            grad_out,
            1e-6,
            weight_offset=1.0,
            norm_dtype=None,
            what="Gemma",
        )


# ---- diffusers RMSNorm ----

# (x dtype, weight: None / dtype): no weight, same dtype, fp32 weight with half input (fp32
# result), and the odd half-weight-of-another-dtype cases (rounded to the weight dtype).
DIFFUSERS_CASES = [
    (F32, None),
    (BF16, None),
    (F16, None),
    (F32, F32),
    (BF16, BF16),
    (F16, F16),
    (BF16, F32),
    (F16, F32),
    (F32, BF16),
    (F32, F16),
    (F16, BF16),
]


def _diffusers_id(case):
    x, w = case
    return f"x={x},w={w}".replace("torch.", "")


# Every case for inference; the training modes take one case per casting branch (CI time).
DIFFUSERS_RUNS = [(case, "inference") for case in DIFFUSERS_CASES] + [
    (case, mode)
    for mode in ("training", "training+compile")
    for case in [(F32, None), (BF16, BF16), (BF16, F32), (F32, BF16)]
]


@pytest.mark.parametrize(
    "case,mode_name", DIFFUSERS_RUNS, ids=lambda v: _diffusers_id(v) if isinstance(v, tuple) else v
)
def test_diffusers_rms_norm(kernel, device, named, case, mode_name):
    xdtype, wdtype = case
    named(DiffusersRMSNorm, "DiffusersRMSNorm")
    hidden = 72
    module = DiffusersRMSNorm(hidden, eps=1e-6, elementwise_affine=wdtype is not None).to(device)
    if wdtype is not None:
        module = module.to(wdtype)
        with torch.no_grad():
            module.weight.copy_(make_input((hidden,), wdtype, device, scale=0.5, mean=1.0, seed=5))
    x = make_input((2, 9, hidden), xdtype, device)
    ours = _kernelize(
        copy.deepcopy(module),
        kernel,
        "DiffusersRMSNorm",
        "DiffusersRMSNorm",
        device,
        MODES[mode_name],
    )
    assert _is_kernel_forward(ours, "DiffusersRMSNorm")

    y, grads = _run(ours, x, mode_name)
    y_hf, _ = _run(module, x, "inference")
    assert y.dtype == y_hf.dtype
    # diffusers' rounding of n: to the weight dtype when it is half, none for an fp32 weight,
    # to the input dtype without weight (then n is the output).
    if wdtype is None:
        norm_dtype = None
    else:
        norm_dtype = wdtype if wdtype in (F16, BF16) else None
    parts = Parts(kernel, x, module.weight, 1e-6)
    bound = forward_bound(parts, y.dtype, norm_dtype)
    assert_within(y, parts.y, bound, "kernel")
    assert_within(y_hf, parts.y, bound, "diffusers")
    assert_decided(y, parts, y.dtype, norm_dtype, "kernel")
    assert_decided(y_hf, parts, y.dtype, norm_dtype, "diffusers")
    if grads is not None:
        grad_out, g = grads
        actual = {"input": g[0]}
        if wdtype is not None:
            actual["weight"] = g[1]
            assert g[1].dtype == wdtype
        check_grads(
            kernel,
            actual,
            x,
            module.weight,
            grad_out,
            1e-6,
            norm_dtype=norm_dtype,
            what=f"diffusers {mode_name}",
        )


@pytest.mark.kernels_ci
@pytest.mark.parametrize("wdtype", [BF16, F32], ids=str)
def test_diffusers_rms_norm_bias(kernel, device, named, wdtype):
    # bias=True: the bias is added last, by the same PyTorch add as diffusers'.
    named(DiffusersRMSNorm, "DiffusersRMSNorm")
    module = DiffusersRMSNorm(40, eps=1e-6, bias=True).to(device=device, dtype=wdtype)
    with torch.no_grad():
        module.weight.copy_(make_input((40,), wdtype, device, scale=0.5, mean=1.0, seed=5))
        module.bias.copy_(make_input((40,), wdtype, device, scale=0.5, seed=6))
    no_bias = copy.deepcopy(module)
    no_bias.bias = None
    x = make_input((3, 40), BF16, device)
    mode = Mode.TRAINING
    ours = _kernelize(
        copy.deepcopy(module), kernel, "DiffusersRMSNorm", "DiffusersRMSNorm", device, mode
    )
    ours_no_bias = _kernelize(no_bias, kernel, "DiffusersRMSNorm", "DiffusersRMSNorm", device, mode)
    y = ours(x)
    assert y.dtype == module(x).dtype
    assert torch.equal(y, ours_no_bias(x) + module.bias)
    y.sum().backward()
    torch.testing.assert_close(ours.bias.grad, torch.full_like(module.bias, 3.0), rtol=0, atol=0)


# ---- a whole model: LlamaForCausalLM ----


def _tiny_llama(device, dtype):
    return causal_lm("llama").to(device=device, dtype=dtype)


def _float64_twin(kernel, model):
    """The model in float64 with the norms computed in float64 (LlamaRMSNorm itself casts to
    float32): the accuracy reference of both the original and the kernelized model."""
    twin = copy.deepcopy(model).to(torch.float64)
    for m in twin.modules():
        if isinstance(m, HFLlamaRMSNorm):
            m.forward = types.MethodType(
                lambda self, h: kernel._reference.rms_norm(
                    h, self.weight, self.variance_epsilon, compute_dtype=torch.float64
                ),
                m,
            )
    return twin


def _llama_dtypes(device):
    return [F32, BF16] if device == "cuda" else [F32]


@pytest.mark.slow
def test_llama_for_causal_lm(kernel, device, named):
    """Logits and gradients of a tiny random Llama with the norms kernelized.

    Tolerance: the kernelized model must be as accurate as the original one, measured against a
    float64 twin (float64 weights and activations, float64 norms): for logits and for every
    parameter gradient, max |kernelized - float64| <= 2 * max |original - float64| + a floor of
    16 u * max |float64| (fp32) or 16 half-ulps (bf16). The model differs from the original only
    in its 5 norms, whose outputs are within the forward bound (a few fp32 ulps at hidden 64, one
    bf16 ulp where the rounding of n is undecided) of the exact norm, as PyTorch's are; everything
    else (matmuls, attention, softmax) rounds identically, so the two errors are of one size.
    Direct comparison: logits agree within the sum of the two measured errors.
    """
    named(HFLlamaRMSNorm, "RMSNorm")
    for dtype in _llama_dtypes(device):
        model = _tiny_llama(device, dtype)
        twin = _float64_twin(kernel, model)
        ours = _kernelize(copy.deepcopy(model), kernel, "RMSNorm", "RMSNorm", device, Mode.TRAINING)
        assert sum(_is_kernel_forward(m, "RMSNorm") for m in ours.modules()) == 5
        ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1)).to(device)
        labels = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2)).to(
            device
        )

        def logits_and_grads(m):
            m.zero_grad()
            out = m(input_ids=ids, labels=labels)
            out.loss.backward()
            return out.logits.detach().double(), {
                n: p.grad.double() for n, p in m.named_parameters()
            }

        ref_logits, ref_grads = logits_and_grads(twin)
        orig_logits, orig_grads = logits_and_grads(model)
        our_logits, our_grads = logits_and_grads(ours)
        assert our_logits.dtype == orig_logits.dtype

        floor = 16 * (2.0**-24 if dtype == F32 else 2.0**-8)

        def check(name, ours_t, orig_t, ref_t):
            scale = float(ref_t.abs().max())
            e_orig = float((orig_t - ref_t).abs().max())
            e_ours = float((ours_t - ref_t).abs().max())
            assert e_ours <= 2 * e_orig + floor * scale, (
                f"{dtype} {name}: kernelized error {e_ours:.3e} vs original {e_orig:.3e} (max |ref| {scale:.3e})"
            )
            assert float((ours_t - orig_t).abs().max()) <= e_orig + e_ours + floor * scale, name

        check("logits", our_logits, orig_logits, ref_logits)
        for name in ref_grads:
            check(f"grad {name}", our_grads[name], orig_grads[name], ref_grads[name])
