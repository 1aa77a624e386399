"""The kernel inside the frameworks that load Hub attention kernels: transformers (a small random
LlamaForCausalLM, prefill with padding and cached decoding) and diffusers (the flash_hub /
flash_varlen_hub backends).

transformers 5.23 loads a Hub attention kernel for ``attn_implementation="<org>/<repo>"``:
``_check_and_adjust_attn_implementation`` -> ``lazy_import_flash_attention`` -> ``_lazy_imports``
-> ``load_and_register_attn_kernel``, which calls ``get_kernel(repo, version=1)`` (so
``LOCAL_KERNELS`` redirects it to our build), requires ``flash_attn_varlen_func`` and wraps it
with transformers' own ``flash_attention_forward``; ``flash_attn_func`` serves unpadded batches
and ``flash_attn_with_kvcache`` the paged continuous-batching cache. That code path is gated on
kernels >= 0.18.2 (``is_kernels_available``); the repository pins kernels 0.17.2, with which it
raises ImportError. So:

* the AttentionInterface route, which works with the pinned kernels, registers
  ``transformers_attention_forward`` (and transformers' flash mask function) under a name;
* the Hub route is run with only the version gate lifted (``is_kernels_available`` patched to
  True and ``get_kernel_hub`` bound to the installed kernels' ``get_kernel``): everything else
  is transformers' own code calling our functions, which checks the names, argument names and
  return types it needs;
* a test pins down that the unpatched Hub route raises ImportError with kernels 0.17.2.

Error bound for the logits: the same model in float64 with SDPA is the reference; ours (in the
test dtype) may be at most twice as far from it as SDPA in the same dtype, plus a floor of
2**-20 (fp32: ~8 float32 ulps at the logits' magnitude, below 1; the fp32 errors measured are
about 2e-7, the bf16 ones about 3e-3).
"""

import functools
import types
from dataclasses import replace

import pytest
import torch
from attention_cases import BF16, F32, dtype_id, randn
from attention_tiny_models import LM_SIZES, assert_as_accurate, float64_twin, flux, run_flux

transformers = pytest.importorskip("transformers")
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface  # noqa: E402

REPO_ID = "open-kernels/attention"
NAME = "open_kernels_attention"
LOGIT_FLOOR = 2.0**-20


def _config(device):
    # head_dim 16 on the CPU (the config); CUDA instantiates head_dim >= 32.
    return LlamaConfig(
        **dict(LM_SIZES, max_position_embeddings=256), head_dim=16 if device == "cpu" else 32
    )


def _model(device, attn, dtype):
    torch.manual_seed(0)
    model = LlamaForCausalLM(_config(device)).eval()
    model = model.to(device=device if dtype != torch.float64 else "cpu", dtype=dtype)
    model.set_attn_implementation(attn)
    return model


def _inputs(device):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (3, 13), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    mask[2, :1] = 0
    return ids.to(device), mask.to(device)


def _run(model, ids, mask, steps=3):
    """Prefill logits, then greedy decoding with a DynamicCache: logits of every step (the tokens
    fed back are the reference's, passed in by the caller through `feed`)."""
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    cache = DynamicCache()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        logits = [out.logits.float().cpu()]
        for step in range(steps):
            token = torch.full(
                (ids.shape[0], 1), (7 * step + 3) % 128, dtype=ids.dtype, device=device
            )
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            out = model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True)
            logits.append(out.logits.float().cpu())
    return logits


def _compare(ours, pytorch, ref, mask, what):
    keep = mask.bool().cpu()
    for step, (o, p, r) in enumerate(zip(ours, pytorch, ref)):
        if step == 0:  # prefill: padded positions are not compared
            o, p, r = o[keep], p[keep], r[keep]
        r = r.double()
        err = (o.double() - r).abs().max().item()
        err_pt = (p.double() - r).abs().max().item()
        assert err <= 2 * err_pt + LOGIT_FLOOR, (
            f"{what} step {step}: {err:.3g} vs SDPA {err_pt:.3g}"
        )


def _dtypes(device):
    return [BF16] if device == "cuda" else [F32, BF16]


@pytest.fixture
def isolated_interfaces(monkeypatch):
    """Registrations into transformers' global attention / mask interfaces are undone after the
    test, and so is the flash-attention state transformers caches at module level."""
    from transformers import modeling_flash_attention_utils as mfa

    monkeypatch.setattr(
        AttentionInterface, "_global_mapping", dict(AttentionInterface._global_mapping)
    )
    monkeypatch.setattr(
        AttentionMaskInterface, "_global_mapping", dict(AttentionMaskInterface._global_mapping)
    )
    for name in (
        "_loaded_implementation",
        "_flash_fn",
        "_flash_varlen_fn",
        "_flash_with_kvcache_fn",
        "_pad_fn",
        "_unpad_fn",
        "_process_flash_kwargs_fn",
        "_process_with_kvcache_kwargs_fn",
    ):
        if hasattr(mfa, name):  # the set differs between transformers releases
            monkeypatch.setattr(mfa, name, getattr(mfa, name))
    return monkeypatch


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_llama_through_attention_interface(kernel, device, dtype, isolated_interfaces):
    """Works with the pinned kernels 0.17.2: our function registered under a name."""
    if dtype not in _dtypes(device):
        pytest.skip("float32 runs in bfloat16 on CUDA")
    _register(kernel)
    ids, mask = _inputs(device)
    _check_against(
        _model, "sdpa", device, dtype, ids, mask, f"AttentionInterface {dtype_id(dtype)}"
    )
    # unpadded batch: the flash_attn_func path (no mask)
    _check_against(_model, "sdpa", device, dtype, ids, torch.ones_like(mask), "unpadded", steps=1)


def _register(kernel):
    """Our function and transformers' flash mask function under NAME (isolated_interfaces undoes
    it after the test)."""
    AttentionInterface.register(NAME, kernel.transformers_attention_forward)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])


def _check_against(build, baseline, device, dtype, ids, mask, what, steps=3):
    """The model of `build` with our attention (NAME) against the same model with `baseline`
    attention in `dtype`, and in float64 as the reference (_compare)."""
    ref = _run(build(device, baseline, torch.float64), ids, mask, steps=steps)
    pytorch = _run(build(device, baseline, dtype), ids, mask, steps=steps)
    ours = _run(build(device, NAME, dtype), ids, mask, steps=steps)
    _compare(ours, pytorch, ref, mask, what)


def _gpt_oss(device, attn, dtype):
    """A random 2-layer GptOssForCausalLM (a sliding-window layer and a full one, 4 experts) with
    random attention sinks (initialized to zeros, which would hide a wrong sink)."""
    config = transformers.GptOssConfig(
        **dict(LM_SIZES, max_position_embeddings=256, intermediate_size=64),
        head_dim=16 if device == "cpu" else 32,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters=dict(rope_type="default", rope_theta=150000.0),
    )
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "sinks"):
                module.sinks.normal_(0.0, 1.0)
    model = model.to(device=device if dtype != torch.float64 else "cpu", dtype=dtype)
    model.set_attn_implementation(attn)
    model.set_experts_implementation("eager")  # grouped_mm takes no float64
    return model


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_gpt_oss_sinks_through_attention_interface(kernel, device, dtype, isolated_interfaces):
    """gpt-oss passes its per-head sinks as s_aux: padded prefill and cached decoding against the
    same model with transformers' eager attention (its own sink formula), float64 as reference."""
    if dtype not in _dtypes(device):
        pytest.skip("float32 runs in bfloat16 on CUDA")
    _register(kernel)
    ids, mask = _inputs(device)
    _check_against(_gpt_oss, "eager", device, dtype, ids, mask, f"gpt-oss {dtype_id(dtype)}")


def _kernels_version():
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version("kernels"))


@pytest.mark.kernels_ci
def test_hub_route_needs_kernels_0_18_2(kernel, device):
    """transformers 5.23's Hub route refuses kernels < 0.18.2 with an ImportError naming the
    version range (this is why the AttentionInterface route exists)."""
    from packaging.version import Version

    if _kernels_version() >= Version("0.18.2"):
        pytest.skip("kernels >= 0.18.2 is installed: the Hub route itself is tested below")
    with pytest.raises(ImportError, match="kernels"):
        _model(device, REPO_ID, _dtypes(device)[0])


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["llama", "gpt_oss"])
def test_through_the_hub_route(kernel, device, isolated_interfaces, model_name):
    """transformers' own Hub-kernel path (load_and_register_attn_kernel, flash_attention_forward,
    _flash_attention_forward) running our build through LOCAL_KERNELS, with only the kernels
    version gate lifted when the installed kernels is older than transformers wants. gpt-oss:
    transformers finds ``s_aux`` in our signature and passes its sinks (against its eager
    attention, which has them too)."""
    import kernels
    from packaging.version import Version
    from transformers.integrations import hub_kernels

    if _kernels_version() < Version("0.18.2"):
        isolated_interfaces.setattr(hub_kernels, "is_kernels_available", lambda *a, **k: True)
        isolated_interfaces.setattr(
            hub_kernels, "get_kernel_hub", kernels.get_kernel, raising=False
        )
    # Count the calls that reach our functions (transformers looks them up on the module that
    # LOCAL_KERNELS resolves to, which is this fixture's module): where and when transformers
    # stores them differs between releases, so the test checks that they ran, and for gpt-oss
    # that they received the sinks.
    calls = {"flash_attn_func": 0, "flash_attn_varlen_func": 0, "s_aux": 0}

    def counting(name):
        fn = getattr(kernel, name)

        @functools.wraps(fn)  # transformers inspects the signature
        def wrapper(*args, **kwargs):
            calls[name] += 1
            calls["s_aux"] += kwargs.get("s_aux") is not None
            return fn(*args, **kwargs)

        return wrapper

    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        isolated_interfaces.setattr(kernel, name, counting(name))
    build, baseline = (_model, "sdpa") if model_name == "llama" else (_gpt_oss, "eager")
    dtype = _dtypes(device)[-1]
    ids, mask = _inputs(device)
    model = build(device, REPO_ID, dtype)
    if REPO_ID not in AttentionInterface._global_mapping:
        import transformers

        # Releases before the kernels >= 0.18.2 gate accept the repo id without loading it (no
        # error at set_attn_implementation, a KeyError at the first forward): their Hub route
        # does not exist with the pinned kernels, so there is nothing of ours to test there.
        pytest.skip(
            f"transformers {transformers.__version__} did not register {REPO_ID} through its Hub route"
        )
    ref = _run(build(device, baseline, torch.float64), ids, mask)
    pytorch = _run(build(device, baseline, dtype), ids, mask)
    ours = _run(model, ids, mask)
    assert calls["flash_attn_varlen_func"] > 0, f"transformers did not call our kernel: {calls}"
    if model_name == "gpt_oss":
        assert calls["s_aux"] > 0, f"transformers did not pass the sinks: {calls}"
    _compare(ours, pytorch, ref, mask, f"Hub route, {model_name}")


# ---- diffusers ----


@pytest.fixture
def diffusers_hub(kernel, monkeypatch):
    """diffusers' flash_hub / flash_varlen_hub backends served by our package, and its
    _flash_3_hub / _flash_3_varlen_hub backends by its ``fa3``, through
    ``use_with_diffusers()``, the recipe of the card, with loading from the Hub made to fail:
    the backends must not need it. diffusers' registry entries and active backend are restored
    after the test."""
    ad = pytest.importorskip("diffusers.models.attention_dispatch")
    import kernels

    monkeypatch.setattr(
        ad,
        "_HUB_KERNELS_REGISTRY",
        {name: replace(config) for name, config in ad._HUB_KERNELS_REGISTRY.items()},
    )
    monkeypatch.setattr(
        ad._AttentionBackendRegistry,
        "_active_backend",
        ad._AttentionBackendRegistry._active_backend,
    )

    def no_download(*args, **kwargs):
        raise AssertionError(f"diffusers tried to load a kernel: get_kernel{args}")

    monkeypatch.setattr(kernels, "get_kernel", no_download)
    assert kernel.use_with_diffusers() == [
        "flash_hub",
        "flash_varlen_hub",
        "_flash_3_hub",
        "_flash_3_varlen_hub",
    ]
    return ad


# Per backend pair (dense, varlen): diffusers' backend names, the function the dense backend calls
# (in `kernel`), the context-parallel forward / backward ops of each (in diffusers'
# attention_dispatch) and the keyword that asks the dense backend for the lse. The FA3 backends call FA3's
# flash_attn_func with its keywords (qv, descales, num_splits, pack_gqa, sm_margin) and their
# context-parallel ops FA3's _flash_attn_forward / _flash_attn_backward with its positional lists.
HUBS = {
    "fa2": (
        ("FLASH_HUB", "FLASH_VARLEN_HUB"),
        "flash_attn_func",
        ("_flash_attention_hub_forward_op", "_flash_attention_hub_backward_op"),
        ("_flash_varlen_attention_hub_forward_op", "_flash_varlen_attention_hub_backward_op"),
        "return_lse",
    ),
    "fa3": (
        ("_FLASH_3_HUB", "_FLASH_3_VARLEN_HUB"),
        "fa3.flash_attn_func",
        ("_flash_attention_3_hub_forward_op", "_flash_attention_3_hub_backward_op"),
        ("_flash_attention_3_varlen_hub_forward_op", "_flash_attention_3_varlen_hub_backward_op"),
        "return_attn_probs",
    ),
}


def _attr(root, path: str):
    for name in path.split("."):
        root = getattr(root, name)
    return root


@pytest.mark.parametrize("hub", list(HUBS))
def test_diffusers_flash_hub(kernel, device, diffusers_hub, hub):
    ad = diffusers_hub
    (dense, _), function, (forward_op, backward_op), _, lse_keyword = HUBS[hub]
    backend = getattr(ad.AttentionBackendName, dense)
    b, s, h, d = 2, 33, 4, 64
    q, k, v = (randn((b, s, h, d), BF16, device, seed=i) for i in range(3))
    cfg = ad._HUB_KERNELS_REGISTRY[backend]
    assert cfg.kernel_fn is _attr(kernel, function)
    interface = kernel.fa3 if hub == "fa3" else kernel.flash_attn_interface
    assert cfg.wrapped_forward_fn is interface._flash_attn_forward
    out = ad.dispatch_attention_fn(q, k, v, is_causal=True, backend=backend)
    want = kernel.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, want)
    out, lse = ad.dispatch_attention_fn(
        q, k, v, backend=backend, attention_kwargs={lse_keyword: True}
    )
    assert out.shape == q.shape and lse.shape == (b, h, s)
    _context_parallel_ops(kernel, ad, forward_op, backward_op, q, k, v, None, causal=True)


def _context_parallel_ops(kernel, ad, forward_op, backward_op, q, k, v, mask, causal):
    """diffusers' context-parallel forward op (it calls the private forward) against
    flash_attn_func on each batch row's visible keys (`mask` [B, S_k] or None), and its backward
    op (the private backward) against autograd through flash_attn_func."""
    b, s, h, _ = q.shape
    saved = []
    ctx = types.SimpleNamespace(save_for_backward=lambda *t: saved.extend(t))
    out, lse = getattr(ad, forward_op)(ctx, q, k, v, mask, 0.0, causal, None, False, True)
    assert lse.shape == (b, s, h)
    ctx.saved_tensors = tuple(saved)
    grad = torch.ones_like(out)
    grads = getattr(ad, backward_op)(ctx, grad)
    for i in range(b):
        n = k.shape[1] if mask is None else int(mask[i].sum())
        leaves = [t[i : i + 1, : (s if t is q else n)].clone().requires_grad_() for t in (q, k, v)]
        want = kernel.flash_attn_func(*leaves, causal=causal)
        assert torch.equal(out[i : i + 1], want)
        want.backward(grad[i : i + 1])
        for got, leaf in zip(grads, leaves):
            assert torch.equal(got[i : i + 1, : leaf.shape[1]], leaf.grad)


@pytest.mark.parametrize("hub", list(HUBS))
def test_diffusers_flash_varlen_hub(kernel, device, diffusers_hub, hub):
    ad = diffusers_hub
    backend = getattr(ad.AttentionBackendName, HUBS[hub][0][1])
    b, sq, sk, h, d = 2, 9, 20, 4, 64
    q = randn((b, sq, h, d), BF16, device, seed=1)
    k, v = (randn((b, sk, h, d), BF16, device, seed=i) for i in (2, 3))
    mask = torch.ones(b, sk, dtype=torch.bool, device=device)
    mask[1, 12:] = False  # the second sequence has 12 keys
    out = ad.dispatch_attention_fn(q, k, v, attn_mask=mask, backend=backend)
    for i, n in enumerate((sk, 12)):
        want = kernel.flash_attn_func(q[i : i + 1], k[i : i + 1, :n], v[i : i + 1, :n])
        assert torch.equal(out[i : i + 1], want)
    _context_parallel_ops(kernel, ad, *HUBS[hub][3], q, k, v, mask, causal=False)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_diffusers_flux_with_flash_hub(kernel, device, diffusers_hub, dtype):
    """The whole recipe on a model: use_with_diffusers(), then set_attention_backend("flash_hub")
    on a tiny Flux transformer in `dtype`; our flash_attn_func runs every attention and the
    output is as accurate as with PyTorch's SDPA in the same dtype (attention_tiny_models.py
    derives the bound, in units of roundoff of the dtype).

    On CUDA the model runs in bfloat16 only (our CUDA kernel takes float16 / bfloat16, as
    flash-attn does). The float64 twin is made from the bfloat16 weights and takes the bfloat16
    inputs, so both errors measure the bfloat16 computation alone; there, every layer rounds to
    bfloat16 in both models and the attention (fp32 softmax and accumulation in ours and in
    SDPA, one rounding of the output) is a small part of either error."""
    if dtype not in _dtypes(device):
        pytest.skip("float32 runs in bfloat16 on CUDA")
    ad = diffusers_hub
    model = flux().to(device, dtype)
    twin = float64_twin(model)
    untouched = run_flux(model, device, dtype)  # before: set_attention_backend sets the global one
    reference = run_flux(twin, device, torch.float64, inputs_like=dtype)
    config = ad._HUB_KERNELS_REGISTRY[ad.AttentionBackendName.FLASH_HUB]
    assert config.kernel_fn is kernel.flash_attn_func
    calls = []
    ours = config.kernel_fn
    config.kernel_fn = lambda *a, **k: calls.append(1) or ours(*a, **k)
    model.set_attention_backend("flash_hub")
    assert_as_accurate("flux output", run_flux(model, device, dtype), untouched, reference)
    assert len(calls) == 2  # the double block's joint attention and the single block's


@pytest.mark.slow
def test_diffusers_local_build_recipe(kernel, device, monkeypatch):
    """The card's recipe without our package's help, for a local build: LOCAL_KERNELS names
    diffusers' own repo id (it ignores the version diffusers asks for) and
    DIFFUSERS_TRUST_REMOTE_KERNELS=true skips the publisher query, in a fresh process (both are
    read at import)."""
    pytest.importorskip("diffusers")
    from pathlib import Path

    from attention_fixture import run_in_fresh_process

    build_dir = Path(kernel.__file__).parent.parent  # <kernel>/build, holding the variants
    monkeypatch.setenv("LOCAL_KERNELS", f"kernels-community/flash-attn2={build_dir}")
    monkeypatch.setenv("DIFFUSERS_TRUST_REMOTE_KERNELS", "true")
    run_in_fresh_process(
        f"""
import kernels, torch
from diffusers.models import attention_dispatch as ad
q, k, v = (torch.randn(2, 9, 2, 64, device={device!r}, dtype=torch.bfloat16) for _ in range(3))
with ad.attention_backend("flash_hub"):
    got = ad.dispatch_attention_fn(q, k, v, is_causal=True)
ours = kernels.get_kernel("kernels-community/flash-attn2", version=3)  # what diffusers loaded
assert ours.__name__.startswith("_attention_"), ours.__name__
fn = ad._HUB_KERNELS_REGISTRY[ad.AttentionBackendName.FLASH_HUB].kernel_fn
assert fn is ours.flash_attn_func
assert torch.equal(got, ours.flash_attn_func(q, k, v, causal=True))
print("ok")
"""
    )


def _loss_and_grads(model, ids, mask):
    """Causal-LM loss on ids (labels = ids) and every parameter's gradient, float64 on the CPU."""
    device = next(model.parameters()).device  # the float64 reference runs on the CPU
    ids, mask = ids.to(device), mask.to(device)
    model.train()
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)
    out.loss.backward()
    grads = {n: p.grad.detach().double().cpu() for n, p in model.named_parameters()}
    return out.loss.detach().double().cpu(), grads


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_llama_training_step(kernel, device, dtype, isolated_interfaces):
    """One training step of the tiny Llama with our attention (and its backward):
    the loss and every parameter's gradient at most twice as far from float64 SDPA as SDPA in
    the same dtype, plus a floor of 8 roundoff units of the largest gradient of each tensor."""
    if device == "cuda" and dtype == F32:
        pytest.skip("on CUDA the attention runs float32 activations in bfloat16")
    _register(kernel)
    ids, _ = _inputs(device)
    full = torch.ones_like(ids)
    ref_loss, ref = _loss_and_grads(_model(device, "sdpa", torch.float64), ids, full)
    pt_loss, pt = _loss_and_grads(_model(device, "sdpa", dtype), ids, full)
    our_loss, ours = _loss_and_grads(_model(device, NAME, dtype), ids, full)
    unit = 2.0**-24 if dtype == F32 else 2.0**-8
    assert abs(our_loss - ref_loss) <= 2 * abs(pt_loss - ref_loss) + 8 * unit * abs(ref_loss)
    for name, r in ref.items():
        err = float((ours[name] - r).abs().max())
        err_pt = float((pt[name] - r).abs().max())
        floor = 8 * unit * float(r.abs().max())
        assert err <= 2 * err_pt + floor, f"{name}: {err:.3g} vs SDPA {err_pt:.3g}"
