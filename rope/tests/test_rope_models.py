"""Agreement with the frameworks' own rotary code, the kernelize layer, and a whole Llama model.

- transformers 5.x `apply_rotary_pos_emb` (models/llama/modeling_llama.py) evaluates
  q * cos + rotate_half(q) * sin op by op in the activation dtype: two rounded products and a
  rounded sum (rope_cases.eager_bound); ours rounds once (rope_cases.bound). Both must be within
  their bound of the float64 reference, so they agree within the sum of the two bounds
  (elementwise); in bf16 that is about 2**-8 (|ref| + 2 (|q cos| + |rotate_half(q) sin|)).
- diffusers 0.42 LTX-Video `apply_rotary_emb` computes in fp32 and rounds once, as ours does:
  both are within the same bound, and on the elements that one rounding decides both must equal
  the correctly rounded value, hence each other, bit for bit.
- The layer `layers.apply_rotary_transformers` is loaded through kernels' own machinery
  (LocalLayerRepository from the build the `kernel` fixture loaded) and kernelized onto
  transformers' apply_rotary_pos_emb wrapped by kernels' `use_kernel_forward_from_hub`; kernels
  accepts it only because its forward has that function's parameters (q, k, cos, sin,
  unsqueeze_dim=1): kernels-community's 6-parameter layer (with position_ids) would be rejected
  ("different number of arguments").
- LlamaForCausalLM: transformers 5.23 decorates apply_rotary_pos_emb with
  `use_kernel_forward_from_hub("rotary_pos_emb")` and LlamaAttention with `use_kernelized_func`,
  but its hub integration is only active with kernels >= 0.18.2 (transformers'
  KERNELS_MIN_VERSION); the repository pins kernels 0.17.2, with which both decorators are
  no-ops. The model test therefore (a) replaces the module-level reference
  `modeling_llama.apply_rotary_pos_emb` (what LlamaAttention.forward calls) with ours, and (b)
  sets up what the decorators would, with the pinned kernels' own functions, and kernelizes.
"""

import copy
import inspect
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from rope_cases import (
    BF16,
    DTYPES,
    F32,
    U,
    assert_decided,
    assert_within,
    bound,
    check,
    dtype_id,
    eager_bound,
    make_input,
    ref_ltx,
    ref_transformers,
)

transformers = pytest.importorskip("transformers")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
transformer_ltx = pytest.importorskip("diffusers.models.transformers.transformer_ltx")


def _llama_config(**kwargs):
    from transformers import LlamaConfig

    cfg = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
    )
    cfg.update(kwargs)
    return LlamaConfig(**cfg)


def _hf_cos_sin(batch, seqlen, dtype, device, head_dim=16, theta=10000.0, offset=0):
    """cos, sin [B, S, head_dim] from transformers' own LlamaRotaryEmbedding (fp32 math, cast to
    the activation dtype), at positions offset + [0, S) per batch row (shifted per row)."""
    cfg = _llama_config(hidden_size=4 * head_dim, num_attention_heads=4, rope_theta=theta)
    rotary = modeling_llama.LlamaRotaryEmbedding(cfg).to(device)
    pos = (torch.arange(seqlen) + offset)[None] + 7 * torch.arange(batch)[:, None]
    x = torch.empty(1, dtype=dtype, device=device)
    return rotary(x, pos.to(device))


# ---- transformers apply_rotary_pos_emb ----


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_agrees_with_transformers(kernel, device, dtype, unsqueeze_dim):
    b, s, hq, hk, d = 2, 37, 4, 2, 64
    cos, sin = _hf_cos_sin(b, s, dtype, device, head_dim=d, offset=1000)
    shape = (lambda h: (b, h, s, d)) if unsqueeze_dim == 1 else (lambda h: (b, s, h, d))
    q, k = make_input(shape(hq), dtype, device), make_input(shape(hk), dtype, device, seed=1)
    hf_q, hf_k = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    our_q, our_k = kernel.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for name, ours, theirs, x in (("q", our_q, hf_q, q), ("k", our_k, hf_k, k)):
        assert ours.dtype == theirs.dtype == dtype
        ref = ref_transformers(x, cos, sin, unsqueeze_dim)
        what = f"{dtype_id(dtype)} {name}"
        check(ours, ref, "kernel " + what)
        assert_within(
            theirs, ref.value, eager_bound(ref, dtype), "transformers " + what + " (its bound)"
        )
        assert_within(
            ours,
            theirs.double().cpu(),
            bound(ref, dtype) + eager_bound(ref, dtype),
            "kernel vs transformers " + what,
        )


# ---- diffusers LTX-Video ----


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_agrees_with_diffusers_ltx(kernel, device, dtype):
    # LTXVideoRotaryPosEmbed's own freqs for a 2 x 3 x 4 latent video, inner dim 64 (4 heads x 16):
    # 64 % 6 = 4 leading channels of cos = 1, sin = 0 (identity pairs), fp32 tables.
    batch, frames, height, width, dim = 2, 2, 3, 4, 64
    rope = transformer_ltx.LTXVideoRotaryPosEmbed(
        dim=dim, base_num_frames=20, base_height=32, base_width=32
    )
    x = make_input((batch, frames * height * width, dim), dtype, device)
    cos, sin = rope(x, frames, height, width, rope_interpolation_scale=(1 / 25, 32.0, 32.0))
    assert cos.dtype == F32 and cos.shape == x.shape
    theirs = transformer_ltx.apply_rotary_emb(x, (cos, sin))
    ours = kernel.apply_rotary_emb_ltx(x, (cos, sin))
    assert ours.dtype == theirs.dtype == dtype
    ref = ref_ltx(x, cos, sin)
    check(ours, ref, "kernel")
    check(theirs, ref, "diffusers (fp32, one rounding: the same bound)")
    assert_within(ours, theirs.double().cpu(), 2 * bound(ref, dtype), "kernel vs diffusers")
    if dtype != F32:
        assert_decided(ours, ref, "kernel")
        assert_decided(theirs, ref, "diffusers")


# ---- the kernelize layer ----


@pytest.mark.kernels_ci
def test_layer_flags(kernel):
    cls = kernel.layers.apply_rotary_transformers
    assert issubclass(cls, nn.Module)
    assert cls.has_backward is True and cls.can_torch_compile is True
    assert cls.__init__ is nn.Module.__init__
    extra = {n for n, _ in inspect.getmembers(cls)} - {n for n, _ in inspect.getmembers(nn.Module)}
    assert extra == {"has_backward", "can_torch_compile"}


def _hub_function(fn):
    """What transformers' `@use_kernel_forward_from_hub("rotary_pos_emb")` does to its
    apply_rotary_pos_emb with kernels >= 0.18.2, done with the pinned kernels' own decorator:
    the function becomes an instance of a module whose forward kernelize can replace."""
    from kernels import use_kernel_forward_from_hub

    return use_kernel_forward_from_hub("rotary_pos_emb")(fn)


def _kernelize_rotary(model, kernel, device, mode):
    """kernelize `model` with our layer for transformers' `rotary_pos_emb` name, loaded through
    kernels' LocalLayerRepository from the build the `kernel` fixture loaded; no fallback."""
    from kernels import LocalLayerRepository, kernelize, use_kernel_mapping

    repo = LocalLayerRepository(
        repo_path=Path(kernel.__file__).parent, layer_name="apply_rotary_transformers"
    )
    with use_kernel_mapping({"rotary_pos_emb": {device: {mode: repo}}}, inherit_mapping=False):
        kernelize(model, mode=mode, device=device, use_fallback=False)
    return model


MODES = ["inference", "training", "training+compile"]


def _mode(name):
    from kernels import Mode

    return {
        "inference": Mode.INFERENCE,
        "training": Mode.TRAINING,
        "training+compile": Mode.TRAINING | Mode.TORCH_COMPILE,
    }[name]


@pytest.mark.parametrize("mode_name", MODES)
def test_kernelize_function(kernel, device, mode_name):
    # transformers' own apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) wrapped as the hub
    # decorator wraps it, attached to a host module with kernels' use_kernelized_func: kernelize
    # accepts the layer (same parameter count and kinds) and the host then runs our forward.
    from kernels import use_kernelized_func

    fn = _hub_function(inspect.unwrap(modeling_llama.apply_rotary_pos_emb))

    @use_kernelized_func(fn)
    class Host(nn.Module):
        def forward(self, q, k, cos, sin):
            return fn(q, k, cos, sin)

    host = _kernelize_rotary(Host(), kernel, device, _mode(mode_name))
    assert fn.forward.__func__ is kernel.layers.apply_rotary_transformers.forward

    q = make_input((2, 4, 5, 16), BF16, device, seed=1)
    k = make_input((2, 2, 5, 16), BF16, device, seed=2)
    cos, sin = _hf_cos_sin(2, 5, BF16, device)
    call = host
    if mode_name == "training+compile":
        torch._dynamo.reset()
        call = torch.compile(host, fullgraph=True)
    qr, kr = q.clone().requires_grad_(), k.clone().requires_grad_()
    got = call(qr, kr, cos, sin)
    want = kernel.apply_rotary_transformers(q, k, cos, sin)
    for a, b in zip(got, want):
        assert torch.equal(a.detach(), b)
    if mode_name != "inference":
        grads = torch.autograd.grad(got, [qr, kr], [torch.ones_like(g) for g in got])
        qw, kw = q.clone().requires_grad_(), k.clone().requires_grad_()
        want_grads = torch.autograd.grad(
            kernel.apply_rotary_transformers(qw, kw, cos, sin),
            [qw, kw],
            [torch.ones_like(g) for g in got],
        )
        for a, b in zip(grads, want_grads):
            assert torch.equal(a, b)


@pytest.mark.kernels_ci
def test_layer_signature_matches_transformers(kernel):
    """kernelize replaces transformers' `rotary_pos_emb` function only if the layer's forward has
    its parameter count and kinds (kernels' _validate_layer): Llama's
    apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)."""
    ours = list(
        inspect.signature(kernel.layers.apply_rotary_transformers.forward).parameters.values()
    )[1:]
    theirs = list(
        inspect.signature(inspect.unwrap(modeling_llama.apply_rotary_pos_emb)).parameters.values()
    )
    assert [p.kind for p in ours] == [p.kind for p in theirs], (ours, theirs)
    assert [p.name for p in ours] == [p.name for p in theirs]


# ---- a whole model: LlamaForCausalLM ----


def _tiny_llama(device, dtype):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(_llama_config(rope_theta=10000.0))
    return model.to(device=device, dtype=dtype)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["function", "kernelize"])
def test_llama_for_causal_lm(kernel, device, monkeypatch, path):
    """Logits and parameter gradients of a tiny random Llama (2 layers, hidden 64, 4 heads / 2 kv
    heads, head_dim 16) with our rotary embedding in place of transformers'.

    path "function": `modeling_llama.apply_rotary_pos_emb` (the name LlamaAttention.forward
    calls) is replaced by our `apply_rotary_pos_emb`. path "kernelize": the hub wiring that
    transformers' decorators set up with kernels >= 0.18.2, done here with the pinned kernels'
    own functions (`use_kernel_forward_from_hub` on transformers' function, `_kernel_funcs` on
    each attention module as `use_kernelized_func` sets it), then `kernelize(model,
    Mode.TRAINING)` with our layer.

    Tolerance: the patched model must be as accurate as the original one, measured against a
    float64 twin (float64 weights and activations; its rotary embedding in float64): for logits
    and every parameter gradient, max |ours - float64| <= 2 max |original - float64| + a floor of
    16 u * max |float64| (fp32) or 16 half-ulps of bf16. The models differ only in the rotation of
    q and k, where ours rounds once and transformers' rounds three times (so ours is, if anything,
    closer); everything else rounds identically. Direct comparison: logits and gradients agree
    within the sum of the two measured errors.
    """
    calls = []
    rope_impl = kernel._custom_ops.transformers_rope

    def counted(*args, **kwargs):
        calls.append(1)
        return rope_impl(*args, **kwargs)

    original_fn = modeling_llama.apply_rotary_pos_emb
    for dtype in [F32, BF16] if device == "cuda" else [F32]:
        model = _tiny_llama(device, dtype)
        twin = copy.deepcopy(model).to(torch.float64)
        patched = copy.deepcopy(model)
        ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1)).to(device)
        labels = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(2)).to(
            device
        )

        def logits_and_grads(m):
            m.zero_grad()
            out = m(input_ids=ids, labels=labels)
            out.loss.backward()
            return out.logits.detach().double(), {
                n: p.grad.double() for n, p in m.named_parameters()
            }

        monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", original_fn)
        ref_logits, ref_grads = logits_and_grads(twin)
        orig_logits, orig_grads = logits_and_grads(model)
        if path == "function":
            monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", kernel.apply_rotary_pos_emb)
        else:
            from kernels import Mode

            fn = _hub_function(inspect.unwrap(original_fn))
            monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", fn)
            attention = [
                m for m in patched.modules() if isinstance(m, modeling_llama.LlamaAttention)
            ]
            for m in attention:
                m.__dict__.setdefault("_kernel_funcs", {})["apply_rotary_pos_emb"] = fn
            _kernelize_rotary(patched, kernel, device, Mode.TRAINING)
            assert fn.forward.__func__ is kernel.layers.apply_rotary_transformers.forward
        monkeypatch.setattr(kernel._custom_ops, "transformers_rope", counted)
        calls.clear()
        our_logits, our_grads = logits_and_grads(patched)
        monkeypatch.setattr(kernel._custom_ops, "transformers_rope", rope_impl)
        assert len(calls) == 2, (
            f"our rotary embedding must run in each of the 2 layers, ran {len(calls)} times"
        )
        assert our_logits.dtype == orig_logits.dtype

        floor = 16 * (U if dtype == F32 else 2.0**-8)

        def check_close(name, ours_t, orig_t, ref_t):
            scale = float(ref_t.abs().max())
            e_orig = float((orig_t - ref_t).abs().max())
            e_ours = float((ours_t - ref_t).abs().max())
            assert e_ours <= 2 * e_orig + floor * scale, (
                f"{dtype} {name}: patched error {e_ours:.3e} vs original {e_orig:.3e} (max |ref| {scale:.3e})"
            )
            assert float((ours_t - orig_t).abs().max()) <= e_orig + e_ours + floor * scale, name

        check_close("logits", our_logits, orig_logits, ref_logits)
        for name in ref_grads:
            check_close(f"grad {name}", our_grads[name], orig_grads[name], ref_grads[name])
