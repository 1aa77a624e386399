#!/usr/bin/env python3
"""The kit in real models: every kernel of this repository mapped into LlamaForCausalLM,
Qwen3ForCausalLM (transformers) and LTXVideoTransformer3DModel (diffusers), checked against the
untouched model, then timed.

    python scripts/e2e.py --model llama --device cuda --size full --out results/e2e/llama.json
    python scripts/e2e.py --model ltx --device cpu            # tiny config: the check only

Models are built from configs with random weights (nothing is downloaded). ``--size full`` uses
the published shapes: Llama-3-8B, Qwen3-8B and the LTX-Video 0.9 (2B) transformer on the latents
of a 49-frame 768x512 video; ``--size tiny`` (the default) two-layer models for the CPU. bf16 on
CUDA, built directly on the GPU.

How each kernel reaches the model (the public loading path: ``LOCAL_KERNELS`` points each
``open-kernels/<kernel>`` repo id at ``<kernel>/build`` and ``kernels.get_kernel`` loads it):

* rmsnorm, activation: each package's ``attach_layers`` (kernelize layers by host class name,
  with a check that they replaced something). Qwen3's per-head q_norm / k_norm are RMSNorm
  modules too; LTX's norms have no weight (``elementwise_affine=False``).
* attention, transformers: ``AttentionInterface.register`` + ``attn_implementation``. The
  registered function is the kit's ``transformers_attention_forward``, except for a query that
  attends to a longer, unpadded cache (static-cache prefill and decode): that call goes to the
  kit's ``flash_attn_with_kvcache`` with ``cache_seqlens`` taken on the device from
  ``position_ids``, because transformers hands a static cache to a flash-style function as the
  whole buffer plus a 2-D mask, which ``transformers_attention_forward`` unpads with a host
  sync (``nonzero``, ``.item()``) that CUDA graphs cannot capture. Batches here are unpadded.
* attention, diffusers: the ``flash_hub`` backend with its registry entry pointed at our repo
  id and loaded by diffusers' own ``_maybe_download_kernel_for_backend`` (which ``get_kernel``
  resolves through ``LOCAL_KERNELS``). flash_hub takes no mask, so LTX runs with
  ``encoder_attention_mask=None``: a prompt of exactly 128 tokens, no padding.
* rope: transformers applies rotary through the module-level function
  ``apply_rotary_pos_emb``; its hub hook (``use_kernel_forward_from_hub("rotary_pos_emb")``) is
  active only with kernels >= 0.18.2 and even then replaces one process-wide function object.
  So the harness swaps the model module's function (``modeling_llama.apply_rotary_pos_emb`` /
  ``transformer_ltx.apply_rotary_emb``) for the kit's drop-in while a kit configuration runs
  (``Kit.rope``), and puts it back after: scoped and explicit.

Check (before any timing): the untouched model in float32 (weights rounded through bf16, so only
activation rounding differs), the untouched model in the run dtype and the kernelized twin (the
same parameter tensors) on the same inputs: prefill logits (or the denoiser output) and, for the
language models, four decode steps after a static-cache prefill. The kernelized model must be
as close to float32 as the untouched one, within a factor K (2, max and mean of |error|): the
kit's ops round once where PyTorch rounds several times, and a factor 2 leaves room for an
equally valid but different rounding pattern that random weights amplify. Each tolerance is
printed and recorded. Every timed configuration is checked again the same way on the first
prefill shape (``agreement``), so a compiled model that computes something else is reported.

Measurements (four configurations, same process, same weights): ``eager``, ``eager+kit``,
``compile`` and ``compile+kit``. ``eager+kit`` maps every kernel of ``--kernels`` in;
``compile+kit`` only those of ``--compile-kernels`` (default: the attention; ``COMPILE_KERNELS``
says why), on a twin of its own. Prefill: a forward without cache, ``logits_to_keep=1`` (what
generate does), tokens per second at batch x length 1x2048, 8x2048, 1x16384. Decode: ms per
token with a StaticCache filled to the context (1x2048; ``--decode 1x2048,8x2048`` adds batch 8
at the cost of two more whole-model compiles), CUDA graphs through
``torch.compile(mode="reduce-overhead")`` in the compile configurations, eager steps otherwise.
LTX: one denoising step (one transformer forward) at batch 2 (classifier-free guidance).
Training (language models, ``--train 1x2048``; none by default): one step of forward, the
causal-LM loss and backward (gradients of every parameter, no optimizer), on a second twin whose
kit layers are the training ones, the kit's attention included (its backward).
Compiled prefill and denoise use ``dynamic=True`` (dynamo still compiles the first shape
statically, then once with dynamic sizes; batch 1 is specialized: at most three compiles) on
each repeated block (``--compile-scope
blocks``, regional compilation: one block compiles for all layers, seconds instead of minutes at
full size) or on the whole model (``--compile-scope model``); compiled decode is always the
whole model. The first call of each shape is timed separately as ``first_call_s`` (compile +
one run). Each median comes from CUDA events around single calls after warm-up. Prefill,
denoise, training and the eager decode steps interleave the configurations call by call, so
that the GPU's clock and the host's speed drift alike for all of them (``time_interleaved``);
the compiled decode steps run one configuration after the other (each records CUDA graphs of
its own). The JSON is rewritten after every measurement, so a run that is killed still leaves
what it measured, and no measurement starts after ``--budget-s`` (540 s: a GPU call may last
600 s). One torch-profiler run (eager+kit,
the first prefill / denoise shape, CUDA only; ``--no-profile`` skips it) gives the GPU time
share per op family.

Int4 weights (``--quant int4``, language models): the same run, but the variant set against
eager and compile is the model's twin with int4 weights (``replace_linear_with_quantized(model,
"int4", group_size=..., fuse_gated_mlp=True)``, round to nearest, symmetric): each MLP a
``QuantizedGatedMLP`` (two kernels), every other linear but lm_head an int4
``QuantizedLinear``. ``INT4_CONFIGS`` = eager, eager+int4, compile, compile+int4.
Decode only unless ``--shapes`` names prefill shapes (the int4 GEMM is decode-first: above 16
tokens it converts the weight again for every 16). The check compares the int4 twin with the
float32 model that holds its dequantized weights (exact: (q - z) s), within K times the error of
that model in bf16, as the kit's check does with the model's own weights.

    python scripts/e2e.py --model llama --device cuda --size full --quant int4 \
        --out results/e2e/llama-int4.json

JSON schema (``schema: "e2e/1"``; times in ms unless named ``_s``):

    {
      "schema": "e2e/1", "complete": bool,           # false until the last measurement ran
      "model": "llama"|"qwen3"|"ltx", "size": "tiny"|"full", "device": "cuda"|"cpu",
      "dtype": "bfloat16"|"float32",
      "environment": {"date", "commit", "dirty": bool, "device", "capability", "driver",
                      "torch", "cuda", "transformers", "diffusers", "kernels", "python"},
      "kit": {"<kernel>": {"build": "<build id>", "variant", "version", "commit", "dirty"}},
      "kit_compile": ["<kernel>", ...],               # the kernels compile+kit maps in
                                                      # (None with --quant int4)
      "configs": ["eager", ...],                      # the configurations this run measured
      "quant": None | {"quant": "int4", "group_size", "replaced": n, "skipped": {name: why}},
      "model_config": {...},                          # the model's config as a dict
      "routes": {"rmsnorm": {class: count}, "activation": {class: count},
                 "rope": "<what was swapped>", "attention": "<how>"},
      "routes_compile": {...}                         # compile+kit's twin
      "routes_train": {...}                           # with --train: the training twin's routes
      "routes_train_compile": {...}                   # compile+kit's training twin, likewise
      "check": {"passed": bool, "k": 2.0, "cases": [
          {"name": "prefill 1x2048" | "decode 4 steps after 1x2048" | "denoise ...",
           "bf16_vs_fp32": {"max", "mean"}, "kit_vs_fp32": {"max", "mean"},
           "kit_vs_bf16": {"max", "mean"}, "tolerance": {"max", "mean"}, "passed": bool}]},
      "measurements": [
          {"phase": "prefill"|"decode"|"denoise", "shape": "1x2048", "batch", "length",
           "config": "eager"|"eager+kit"|"compile"|"compile+kit" (or "eager+int4", "compile+int4"),
           "median_ms", "min_ms", "times_ms": [...], "first_call_s",
           "host_ms" (median time until a call returns to Python, before the GPU wait),
           "allocator" (CUDA: growth of the caching allocator's counters over the timed calls),
           "syncs": {"count", "where": ["file:line"]} (CUDA: synchronizing ops of one call),
           "tokens_per_s" (prefill, denoise: tokens processed per second),
           "graphs" (compile configs: dynamo's unique graphs so far in this configuration),
           "cudagraph_skips" (compiled decode: inductor's count, 0 = CUDA graphs used),
           "agreement": {"vs_fp32": {"max", "mean"}, "tolerance": {...}, "passed"}  # first shape
          }],
      "speedups": [{"phase", "shape", "kit_vs_eager": eager / eager+kit,
                    "compile_kit_vs_compile": compile / compile+kit,
                    "compile_kit_vs_eager": eager / compile+kit}],   # >1: faster with the kit
                                                      # (--quant int4: int4_vs_eager, ...)
      "profile": {"config", "phase", "shape", "total_us",    # profile_tools.family_table
                  "families": {"attention"|"gemm"|"rmsnorm"|"rope"|"activation"|"other":
                               {"us", "share", "launches", "top": [{"name", "us", "launches"}]}}},
      "errors": ["<config> <phase> <shape>: <exception>"],
      "wall_s": {"build", "check", "total"}             # seconds of this run, for planning
    }
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS = ("rmsnorm", "rope", "activation", "attention")
ORG = "open-kernels"
ATTENTION_NAME = "open_kernels_attention"
CONFIGS = ("eager", "eager+kit", "compile", "compile+kit")
# --quant int4 (language models): the untouched model against its twin whose linears (all but
# lm_head) are the quant package's int4 QuantizedLinear, rounded to nearest in groups.
INT4_CONFIGS = ("eager", "eager+int4", "compile", "compile+int4")
# The kit kernels compile+kit maps in. Under torch.compile, Inductor fuses RMSNorm, RoPE and the
# activation with their neighbours (a residual add, the q / k norm, the gate multiply), which
# opaque custom ops prevent; mapped in alone under compile they gave 0.97-1.02x (Llama-3-8B,
# results/e2e/NOTES.md), the attention is work Inductor does not generate. So compile + kit is
# what a user should run under compile: the kit's attention, Inductor's fusions for the rest.
COMPILE_KERNELS = ("attention",)
K = 2.0  # tolerance factor on the untouched model's own bf16-vs-fp32 error (module docstring)


# ---- loading the kit ----


def load_kit(names=KERNELS, root: Path = REPO_ROOT) -> dict:
    """Each kernel loaded as users load it: `kernels.get_kernel("open-kernels/<k>", version=1)`,
    with LOCAL_KERNELS pointing the repo id at `<k>/build` (an entry already in LOCAL_KERNELS
    for the repo id wins, so another build can be tested)."""
    import kernels

    entries = [e for e in os.environ.get("LOCAL_KERNELS", "").split(":") if e]
    present = {e.split("=", 1)[0] for e in entries}
    entries += [f"{ORG}/{k}={root / k / 'build'}" for k in names if f"{ORG}/{k}" not in present]
    os.environ["LOCAL_KERNELS"] = ":".join(entries)
    return {k: kernels.get_kernel(f"{ORG}/{k}", version=1) for k in names}


def build_info(module) -> dict:
    """Build id and provenance of a loaded kernel, from its variant's metadata.json."""
    variant = Path(module.__file__).parent
    try:
        meta = json.loads((variant / "metadata.json").read_text())
    except (OSError, ValueError):
        return {"build": module.__name__, "variant": variant.name}
    kernel = meta.get("provenance", {}).get("kernel", {})
    return {
        "build": meta.get("id", module.__name__),
        "variant": variant.name,
        "version": meta.get("version"),
        "commit": kernel.get("commit"),
        "dirty": kernel.get("dirty"),
    }


# ---- the models ----


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    kind: str  # "lm" (transformers causal LM) or "dit" (diffusers video transformer)
    module: str  # the modeling module whose rotary function is swapped
    cls: str
    rope_attr: str  # the function in `module` that applies rotary
    rope_kit: str  # the rope package's drop-in for it
    blocks: str  # attribute path of the repeated blocks (regional compilation)


SPECS = {
    "llama": Spec(
        "llama",
        "lm",
        "transformers.models.llama.modeling_llama",
        "LlamaForCausalLM",
        "apply_rotary_pos_emb",
        "apply_rotary_pos_emb",
        "model.layers",
    ),
    "qwen3": Spec(
        "qwen3",
        "lm",
        "transformers.models.qwen3.modeling_qwen3",
        "Qwen3ForCausalLM",
        "apply_rotary_pos_emb",
        "apply_rotary_pos_emb",
        "model.layers",
    ),
    "ltx": Spec(
        "ltx",
        "dit",
        "diffusers.models.transformers.transformer_ltx",
        "LTXVideoTransformer3DModel",
        "apply_rotary_emb",
        "apply_rotary_emb_ltx",
        "transformer_blocks",
    ),
}

# head_dim 32: the smallest the CUDA attention kernel instantiates, so tiny runs on both devices.
TINY_LM = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
)


def model_config(name: str, size: str):
    """The model's config: `full` writes out the published one, `tiny` a two-layer model."""
    if name == "llama":
        from transformers import LlamaConfig

        if size == "tiny":
            return LlamaConfig(**TINY_LM, rms_norm_eps=1e-5, rope_theta=500000.0)
        # meta-llama/Meta-Llama-3-8B config.json
        return LlamaConfig(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            hidden_act="silu",
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=False,
            bos_token_id=128000,
            eos_token_id=128001,
        )
    if name == "qwen3":
        from transformers import Qwen3Config

        if size == "tiny":
            return Qwen3Config(**TINY_LM, rms_norm_eps=1e-6, rope_theta=1000000.0)
        # Qwen/Qwen3-8B config.json
        return Qwen3Config(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            hidden_act="silu",
            max_position_embeddings=40960,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            attention_bias=False,
            use_sliding_window=False,
            tie_word_embeddings=False,
            bos_token_id=151643,
            eos_token_id=151645,
        )
    if name == "ltx":
        if size == "tiny":
            return dict(
                in_channels=8,
                out_channels=8,
                num_attention_heads=2,
                attention_head_dim=32,
                cross_attention_dim=64,
                num_layers=2,
                caption_channels=16,
            )
        # Lightricks/LTX-Video (0.9.x) transformer/config.json: 28 blocks of 32 heads x 64.
        return dict(
            in_channels=128,
            out_channels=128,
            patch_size=1,
            patch_size_t=1,
            num_attention_heads=32,
            attention_head_dim=64,
            cross_attention_dim=2048,
            num_layers=28,
            activation_fn="gelu-approximate",
            qk_norm="rms_norm_across_heads",
            norm_elementwise_affine=False,
            norm_eps=1e-6,
            caption_channels=4096,
            attention_bias=True,
            attention_out_bias=True,
        )
    raise ValueError(f"unknown model {name!r}; one of {sorted(SPECS)}")


def build_model(spec: Spec, size: str, device: str, seed: int = 0):
    """The untouched model in float32 on `device`, random weights (the model's own init, run on
    the device), weights rounded through bfloat16 so that a bf16 copy holds the same values.
    RMSNorm weights are drawn around 1 (init leaves them at exactly 1, which would hide a kernel
    that ignores them)."""
    module = importlib.import_module(spec.module)
    cls = getattr(module, spec.cls)
    cfg = model_config(spec.name, size)
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(**cfg) if isinstance(cfg, dict) else cls(cfg)
    model = model.eval()
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    with torch.no_grad():
        for name, m in model.named_modules():
            if type(m).__name__.endswith("RMSNorm") and getattr(m, "weight", None) is not None:
                m.weight.normal_(1.0, 0.1, generator=gen)
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))
    return model


def twin(model):
    """A second model object that shares every parameter and buffer with `model` (no memory):
    the kernelized copy. Module structure and config are copied, so kernel layers, attention
    implementation and backend are the twin's own."""
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo)


@contextlib.contextmanager
def compiled(model, spec: Spec, scope: str):
    """`model` for prefill / denoise under torch.compile(dynamic=True): the whole model, or
    (scope "blocks", regional compilation) each repeated block wrapped in place, which dynamo
    compiles once for all of them (the blocks share their code) and which compiles in seconds
    rather than minutes at full size. The blocks are put back on exit."""
    if scope == "model":
        yield torch.compile(model, dynamic=True)
        return
    parent = model
    *path, last = spec.blocks.split(".")
    for attr in path:
        parent = getattr(parent, attr)
    blocks = getattr(parent, last)
    originals = list(blocks)
    for i, block in enumerate(originals):
        blocks[i] = torch.compile(block, dynamic=True)
    try:
        yield model
    finally:
        for i, block in enumerate(originals):
            blocks[i] = block


# ---- inputs and forwards ----


def parse_shape(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.lower().split("x"))


def lm_ids(cfg, batch: int, length: int, device: str, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, length), generator=gen).to(device)


# VAE of LTX-Video: 8x temporal and 32x spatial compression to 128 latent channels, first frame
# kept: 49 frames -> (49 - 1) / 8 + 1 = 7 latent frames; 512 x 768 pixels -> 16 x 24 latents;
# 7 * 16 * 24 = 2688 tokens (patch size 1). Prompts: 128 T5 tokens (the pipeline's default
# max_sequence_length) of caption_channels each. The rope interpolation scale is what the
# pipeline passes: (temporal compression / frame rate, spatial compression, spatial compression).
LTX_TEMPORAL, LTX_SPATIAL, LTX_FPS = 8, 32, 25


def ltx_latent(frames: int, height: int, width: int) -> tuple[int, int, int]:
    return (frames - 1) // LTX_TEMPORAL + 1, height // LTX_SPATIAL, width // LTX_SPATIAL


def ltx_inputs(model, shape, dtype, device, prompt_tokens: int, seed: int = 1) -> dict:
    batch, frames, height, width = shape
    f, h, w = ltx_latent(frames, height, width)
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)

    def randn(*s):
        return torch.randn(*s, generator=gen).to(device=device, dtype=dtype)

    return dict(
        hidden_states=randn(batch, f * h * w, cfg.in_channels),
        encoder_hidden_states=randn(batch, prompt_tokens, cfg.caption_channels),
        timestep=torch.full((batch,), 500.0, device=device),
        encoder_attention_mask=None,
        num_frames=f,
        height=h,
        width=w,
        rope_interpolation_scale=(LTX_TEMPORAL / LTX_FPS, LTX_SPATIAL, LTX_SPATIAL),
        return_dict=False,
    )


def ltx_tokens(shape) -> int:
    f, h, w = ltx_latent(*shape[1:])
    return shape[0] * f * h * w


def prefill(model, ids, logits_to_keep=1):
    return model(input_ids=ids, use_cache=False, logits_to_keep=logits_to_keep).logits


def cache_kw(model) -> str:
    """The forward's name for the cache: transformers 5.24 renamed `past_key_values` to `cache`
    (the old name still works, with a warning); an unknown keyword would be swallowed by
    **kwargs and silently run without a cache."""
    import inspect

    params = inspect.signature(type(getattr(model, "_orig_mod", model)).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def static_cache(model, batch: int, max_len: int):
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_len)


def decode_steps(model, ids, steps: int, cache=None):
    """Logits of `steps` decode steps after a static-cache prefill of `ids` (the tokens fed are
    fixed, so every model sees the same sequence)."""
    batch, length = ids.shape
    cache = cache or static_cache(model, batch, length + steps)
    pos = torch.arange(length, device=ids.device)[None].expand(batch, -1)
    kw = {cache_kw(model): cache, "use_cache": True}
    model(input_ids=ids, position_ids=pos, logits_to_keep=1, **kw)
    out = []
    for i in range(steps):
        tok = ids[:, i : i + 1]
        pos = torch.full((batch, 1), length + i, device=ids.device)
        out.append(model(input_ids=tok, position_ids=pos, **kw).logits)
    return torch.cat(out, dim=1)


# ---- the kit in a model ----


class Kit:
    """The loaded kernels and the ways they reach a model (module docstring)."""

    def __init__(self, kit: dict, spec: Spec):
        self.kit = kit
        self.spec = spec
        self.routes: dict = {}
        self._stack = contextlib.ExitStack()
        self._flash_hub = False

    def close(self):
        self._stack.close()

    def attach(self, model, *, device: str, training: bool = False, only=None) -> dict:
        """Map the loaded kernels (those of them named in `only`, if given) into `model` (a
        twin), for training (backward) or inference; return, and keep as `routes`, where each
        went."""
        from kernels import Mode

        # A twin may serve the eager and the compiled kit configurations: ask for both.
        mode = (Mode.TRAINING if training else Mode.INFERENCE) | Mode.TORCH_COMPILE
        names = [k for k in self.kit if only is None or k in only]
        self.routes = {}
        for name in ("rmsnorm", "activation"):
            if name in names:
                pkg = self.kit[name]
                if not hasattr(pkg, "attach_layers"):
                    raise SystemExit(f"the loaded {name} build has no attach_layers: rebuild it")
                self.routes[name] = pkg.attach_layers(model, mode=mode, device=device)
        if "rope" in names:
            self.routes["rope"] = (
                f"{self.spec.module}.{self.spec.rope_attr} -> rope.{self.spec.rope_kit} "
                "(swapped while a kit configuration runs)"
            )
        if "attention" in names:
            if self.spec.kind == "lm":
                self._attention_transformers(model)
            else:
                self._attention_diffusers(model)
        return self.routes

    def _attention_transformers(self, model):
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

        AttentionInterface.register(ATTENTION_NAME, transformers_attention(self.kit["attention"]))
        AttentionMaskInterface.register(ATTENTION_NAME, flash_attention_mask)
        model.set_attn_implementation(ATTENTION_NAME)
        self.routes["attention"] = (
            f"AttentionInterface '{ATTENTION_NAME}': transformers_attention_forward; "
            "static-cache steps: flash_attn_with_kvcache"
        )

    def _attention_diffusers(self, model):
        ad = importlib.import_module("diffusers.models.attention_dispatch")
        if not self._flash_hub:  # one registry swap serves every twin
            self._stack.enter_context(diffusers_flash_hub(ad))
            self._flash_hub = True
        # set_attention_backend also makes the backend diffusers' process-wide default, which
        # the untouched model (whose processors name none) would then use too: put it back.
        active = ad._AttentionBackendRegistry._active_backend
        model.set_attention_backend("flash_hub")
        ad._AttentionBackendRegistry.set_active_backend(active)
        fn = ad._HUB_KERNELS_REGISTRY[ad.AttentionBackendName.FLASH_HUB].kernel_fn
        if fn is not self.kit["attention"].flash_attn_func:
            raise RuntimeError(f"diffusers' flash_hub resolved {fn!r}, not the kit's kernel")
        self.routes["attention"] = f"diffusers flash_hub backend -> {ORG}/attention"

    @contextlib.contextmanager
    def rope(self, kernels=None):
        """The model module's rotary function swapped for the kit's while the block runs (when
        the kit has rope, and `kernels`, if given, names it)."""
        if "rope" not in self.kit or (kernels is not None and "rope" not in kernels):
            yield
            return
        module = importlib.import_module(self.spec.module)
        original = getattr(module, self.spec.rope_attr)
        setattr(module, self.spec.rope_attr, getattr(self.kit["rope"], self.spec.rope_kit))
        try:
            yield
        finally:
            setattr(module, self.spec.rope_attr, original)


def transformers_attention(attn):
    """The attention function registered with transformers (module docstring): the kit's
    transformers_attention_forward, and for a query that attends to a longer unpadded cache the
    kit's flash_attn_with_kvcache with the valid length of each row from position_ids."""

    def forward(module, query, key, value, attention_mask, scaling=None, **kwargs):
        position_ids = kwargs.get("position_ids")
        if attention_mask is None and key.shape[2] > query.shape[2] and position_ids is not None:
            if kwargs.get("sliding_window") or kwargs.get("softcap"):
                raise NotImplementedError(
                    "e2e: the static-cache path covers full causal attention (Llama, Qwen3), "
                    "not sliding windows or softcapping"
                )
            seqlens = (position_ids[:, -1] + 1).to(torch.int32).expand(query.shape[0])
            out = attn.flash_attn_with_kvcache(
                query.transpose(1, 2),
                key.transpose(1, 2),
                value.transpose(1, 2),
                cache_seqlens=seqlens.contiguous(),
                softmax_scale=scaling,
                causal=True,
            )
            return out, None
        return attn.transformers_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, **kwargs
        )

    return forward


@contextlib.contextmanager
def diffusers_flash_hub(ad):
    """diffusers' flash_hub backend pointed at our repo id (LOCAL_KERNELS resolves it to the
    build) and loaded by diffusers' own loader; the registry is restored on exit."""
    name = ad.AttentionBackendName.FLASH_HUB
    saved_registry, saved_trust = ad._HUB_KERNELS_REGISTRY, ad.DIFFUSERS_TRUST_REMOTE_KERNELS
    registry = dict(saved_registry)
    registry[name] = dataclasses.replace(
        registry[name],
        repo_id=f"{ORG}/attention",
        revision=None,
        version=1,
        kernel_fn=None,
        wrapped_forward_fn=None,
        wrapped_backward_fn=None,
    )
    ad._HUB_KERNELS_REGISTRY = registry
    ad.DIFFUSERS_TRUST_REMOTE_KERNELS = True  # a local build: no publisher lookup on the Hub
    try:
        ad._maybe_download_kernel_for_backend(name)
        yield
    finally:
        ad._HUB_KERNELS_REGISTRY, ad.DIFFUSERS_TRUST_REMOTE_KERNELS = saved_registry, saved_trust


# ---- the check ----


def errors(got: torch.Tensor, want: torch.Tensor) -> dict:
    d = (got.double() - want.double()).abs()
    return {"max": float(d.max()), "mean": float(d.mean())}


def compare(name: str, ref32, ref16, kit_out, k: float = K) -> dict:
    spread = errors(ref16, ref32)
    ours = errors(kit_out, ref32)
    tol = {s: k * spread[s] for s in spread}
    return {
        "name": name,
        "bf16_vs_fp32": spread,
        "kit_vs_fp32": ours,
        "kit_vs_bf16": errors(kit_out, ref16),
        "tolerance": tol,
        "passed": all(ours[s] <= tol[s] for s in tol),
    }


def outputs(spec: Spec, model, inputs: dict, *, decode: int = 4) -> dict[str, torch.Tensor]:
    """What the check compares: prefill logits (all positions) and decode-step logits, or the
    denoiser output."""
    with torch.no_grad():
        if spec.kind == "lm":
            ids = inputs["ids"]
            out = {"prefill": prefill(model, ids, logits_to_keep=0).float()}
            if decode:
                out["decode"] = decode_steps(model, ids, decode).float()
            return out
        return {"denoise": model(**inputs["ltx"])[0].float()}


def check_inputs(spec: Spec, model, shape, dtype, device, prompt_tokens) -> dict:
    if spec.kind == "lm":
        return {"ids": lm_ids(model.config, shape[0], shape[1], device)}
    return {"ltx": ltx_inputs(model, shape, dtype, device, prompt_tokens)}


def run_check(spec, model32, kit: Kit, shape, dtype, device, prompt_tokens, decode=4):
    """(cases, model in `dtype`, kernelized twin): the module docstring's check."""
    case_names = {
        "prefill": f"prefill {'x'.join(map(str, shape))}",
        "decode": f"decode {decode} steps after {'x'.join(map(str, shape))}",
        "denoise": f"denoise {'x'.join(map(str, shape))}",
    }
    inputs32 = check_inputs(spec, model32, shape, torch.float32, device, prompt_tokens)
    ref32 = outputs(spec, model32, inputs32, decode=decode)
    model = model32.to(dtype)
    inputs = check_inputs(spec, model, shape, dtype, device, prompt_tokens)
    ref16 = outputs(spec, model, inputs, decode=decode)
    kit_model = twin(model)
    kit.attach(kit_model, device=device)
    with kit.rope(), counting(kit, spec) as calls:
        ours = outputs(spec, kit_model, inputs, decode=decode)
    expect_calls(kit, spec, kit_model, calls)
    cases = [compare(case_names[key], ref32[key], ref16[key], ours[key]) for key in ref32]
    return cases, model, kit_model, ref32


def int4_twin(model, quant, group_size: int):
    """A twin of `model` whose gated MLPs are the quant package's QuantizedGatedMLP (gate and up
    in one kernel with the activation in its epilogue, then down) and whose other linears, all
    but lm_head, are int4 QuantizedLinear (round to nearest, symmetric, groups of `group_size`);
    and the report of replace_linear_with_quantized (what was replaced, what was left and why)."""
    q_model = twin(model)
    report = quant.replace_linear_with_quantized(
        q_model, "int4", skip=("lm_head",), group_size=group_size, fuse_gated_mlp=True
    )
    if not report.num_replaced:
        raise SystemExit(f"--quant int4 replaced no linear: {report}")
    return q_model, report


def dequantized_weight(quant, layer) -> torch.Tensor:
    """The float32 weight [N, K] that an int4 QuantizedLinear multiplies by: (q - z) s, exact in
    float32 (a 5-bit integer times a 16-bit scale)."""
    codes = quant.int4_unpack(layer.weight).float()  # [K, N]
    s = layer.weight_scale.float().repeat_interleave(layer.group_size, 0)
    z = 8.0
    if layer.weight_zero is not None:
        z = layer.weight_zero.float().repeat_interleave(layer.group_size, 0)
    w = (codes - z) * s
    if layer.perm is not None:
        unsorted = torch.empty_like(w)
        unsorted[layer.perm.long()] = w
        w = unsorted
    return w.t().contiguous()


def run_check_int4(spec, model32, quant, group_size, shape, dtype, device, decode=4):
    """(cases, model in `dtype`, its int4 twin, report): the int4 twin against the float32 model
    that holds its dequantized weights, within K times the error of that model in `dtype` (the
    same comparison as the kit's check, with the int4 weights as the model's own)."""
    model = model32.to(dtype)  # in place: model32 is the `dtype` model from here on
    q_model, report = int4_twin(model, quant, group_size)
    deq = copy.deepcopy(model).float()  # tensors of its own: `model` stays as it is
    with torch.no_grad():
        for name in report.replaced:
            layer = q_model.get_submodule(name)
            if isinstance(layer, quant.QuantizedGatedMLP):  # its gate / up / down projections
                gate, up = quant.unpack_gate_up(dequantized_weight(quant, layer.gate_up))
                weights = {"gate_proj": gate, "up_proj": up}
                weights["down_proj"] = dequantized_weight(quant, layer.down)
                for attr, w in weights.items():
                    deq.get_submodule(f"{name}.{attr}").weight.copy_(w)
            else:
                deq.get_submodule(name).weight.copy_(dequantized_weight(quant, layer))
    label = "x".join(map(str, shape))
    inputs = check_inputs(spec, model, shape, dtype, device, 0)
    ref32 = outputs(spec, deq, inputs, decode=decode)
    deq16 = deq.to(dtype)
    ref16 = outputs(spec, deq16, inputs, decode=decode)
    del deq, deq16
    ours = outputs(spec, q_model, inputs, decode=decode)
    names = {
        "prefill": f"int4 prefill {label}",
        "decode": f"int4 decode {decode} steps after {label}",
    }
    cases = [compare(names[key], ref32[key], ref16[key], ours[key]) for key in ref32]
    return cases, model, q_model, report


@contextlib.contextmanager
def counting(kit: Kit, spec: Spec):
    """Counts the calls that reach the kit's rope and attention entry points (check only)."""
    calls = {"rope": 0, "attention": 0}
    saved = []

    def counted(obj, attr, key):
        """Wrap obj.attr with a counter under `key` (None: only save it for restoring)."""
        fn = getattr(obj, attr)
        saved.append((obj, attr, fn))
        if key is None:
            return

        def wrapper(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)

        setattr(obj, attr, wrapper)

    if "rope" in kit.kit:
        module = importlib.import_module(spec.module)
        counted(module, spec.rope_attr, "rope")
    if "attention" in kit.kit:
        if spec.kind == "lm":
            from transformers import AttentionInterface

            counted(AttentionInterface, "_global_mapping", None)  # restored as a whole
            mapping = dict(AttentionInterface._global_mapping)
            fn = mapping[ATTENTION_NAME]

            def attention(*args, **kwargs):
                calls["attention"] += 1
                return fn(*args, **kwargs)

            mapping[ATTENTION_NAME] = attention
            AttentionInterface._global_mapping = mapping
        else:
            ad = importlib.import_module("diffusers.models.attention_dispatch")
            cfg = ad._HUB_KERNELS_REGISTRY[ad.AttentionBackendName.FLASH_HUB]
            counted(cfg, "kernel_fn", "attention")
    try:
        yield calls
    finally:
        for obj, attr, fn in reversed(saved):
            setattr(obj, attr, fn)


def expect_calls(kit: Kit, spec: Spec, model, calls: dict) -> None:
    """The kit's rope and attention ran in every layer (the swap and registration took effect)."""
    if spec.kind == "lm":
        layers = model.config.num_hidden_layers
        rope_min, attention_min = layers, layers
    else:
        layers = model.config.num_layers
        rope_min, attention_min = 2 * layers, 2 * layers  # q and k rotated; self + cross attention
    if "rope" in kit.kit and calls["rope"] < rope_min:
        raise RuntimeError(f"the kit's rope ran {calls['rope']} times, expected >= {rope_min}")
    if "attention" in kit.kit and calls["attention"] < attention_min:
        raise RuntimeError(
            f"the kit's attention ran {calls['attention']} times, expected >= {attention_min}"
        )


# ---- timing ----


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


# Caching-allocator counters whose growth over the timed calls means cudaMalloc / cudaFree
# inside them (a cudaFree waits for the device) or a retry after freeing the cache.
ALLOCATOR_COUNTERS = (
    "num_alloc_retries",
    "num_device_alloc",
    "num_device_free",
    "num_sync_all_streams",
)


def allocator_counters() -> dict:
    stats = torch.cuda.memory_stats()
    return {k: stats.get(k, 0) for k in ALLOCATOR_COUNTERS}


def synchronizing_calls(fn) -> dict:
    """One call of `fn` under torch.cuda's sync debug mode: how many synchronizing CUDA
    operations it made, and where (file:line of the Python frame that made them, first five)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    found = [w for w in caught if "synchroniz" in str(w.message)]
    places = list(dict.fromkeys(f"{Path(w.filename).name}:{w.lineno}" for w in found))
    return {"count": len(found), "where": places[:5]}


def time_calls(fn, device: str, warmup: int, iters: int, between=None) -> dict:
    """time_interleaved for one function: its row (its first call's exception is raised)."""
    row = time_interleaved({"": fn}, device, warmup, iters, between={"": between})[""]
    if isinstance(row, Exception):
        raise row
    return row


def time_interleaved(calls: dict, device: str, warmup: int, iters: int, between=None,
                     scopes=None, graphs=None) -> dict:  # fmt: skip
    """Each function of `calls` (name -> fn) timed: first_call_s (compile + run when compiled),
    then per-call times after warm-up, one call of each function in turn (the order rotating
    every round), so that clock and thermal drift over the run weigh on every configuration
    alike: timed one after the other, compile and compile+kit at Qwen3-8B 8 x 2048 (380 ms a
    call) drifted by more than the kit changes (results/e2e/NOTES.md). CUDA events around each
    call on the GPU, perf_counter on the CPU. `between` (name -> fn or None) runs untimed
    before each call of that name (e.g. advancing a decode position); `scopes` (name -> context manager factory) is entered around
    each call of that name, outside the timed window; `graphs` counts compiled graphs (each
    row's `new_graphs` is what its calls added).

    `host_ms` is the time until each call returns to Python, before the wait for the GPU: below
    median_ms the GPU had the host's work queued ahead of it; near median_ms the host was the
    bound or waited for the GPU inside the call. On CUDA `allocator` is the growth of the
    caching allocator's counters over the timed calls and `syncs` the synchronizing operations
    of one more call (synchronizing_calls).

    Returns name -> row, or name -> the exception its first call raised (that function is then
    left out; the others are still timed)."""
    cuda = device == "cuda"
    scopes = scopes or {}
    state = {name: {"times": [], "host": [], "new_graphs": 0} for name in calls}
    if cuda:
        for s in state.values():
            s["allocator"] = dict.fromkeys(ALLOCATOR_COUNTERS, 0)

    def run(name, timed: bool):
        s = state[name]
        with scopes.get(name, contextlib.nullcontext)():
            if between and between.get(name):
                between[name]()
            count = graphs() if graphs else 0
            if not timed:
                calls[name]()
            elif cuda:
                before = allocator_counters()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                t0 = time.perf_counter()
                calls[name]()
                s["host"].append(1000 * (time.perf_counter() - t0))
                b.record()
                b.synchronize()
                s["times"].append(a.elapsed_time(b))
                after = allocator_counters()
                for k in ALLOCATOR_COUNTERS:
                    s["allocator"][k] += after[k] - before[k]
            else:
                t0 = time.perf_counter()
                calls[name]()
                s["times"].append(1000 * (time.perf_counter() - t0))
                s["host"].append(s["times"][-1])
            if graphs:
                s["new_graphs"] += graphs() - count

    failed = {}
    for name in calls:
        start = time.perf_counter()
        try:
            run(name, timed=False)
            sync(device)
        except Exception as e:  # noqa: BLE001 (one failing configuration must not lose the others)
            failed[name] = e
            continue
        state[name]["first"] = time.perf_counter() - start
        for _ in range(warmup):
            run(name, timed=False)
        sync(device)
    names = [n for n in calls if n not in failed]
    for r in range(iters if names else 0):
        turn = r % len(names)
        for name in names[turn:] + names[:turn]:
            run(name, timed=True)
    rows = dict(failed)
    for name in names:
        s = state[name]
        rows[name] = {
            "median_ms": statistics.median(s["times"]),
            "min_ms": min(s["times"]),
            "times_ms": [round(t, 4) for t in s["times"]],
            "host_ms": round(statistics.median(s["host"]), 4),
            "first_call_s": round(s["first"], 3),
        }
        if graphs:
            rows[name]["new_graphs"] = s["new_graphs"]
        if cuda:
            rows[name]["allocator"] = s["allocator"]
            with scopes.get(name, contextlib.nullcontext)():
                if between and between.get(name):
                    between[name]()
                rows[name]["syncs"] = synchronizing_calls(calls[name])
    return {name: rows[name] for name in calls}


# ---- profile ----


def profile_families(fn) -> dict:
    """GPU time per op family of one call of `fn` (after the caller's warm-up; CUDA only), with
    scripts/profile_tools.py's classifier of kernel names (ours, PyTorch's, inductor's)."""
    from profile_tools import family_table
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels: dict[str, tuple[float, int]] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        # A kernel's own interval (device_time_total is 0 unless the profiler was told the
        # device through use_device; the interval does not depend on that).
        us, launches = kernels.get(event.name, (0.0, 0))
        kernels[event.name] = (us + event.time_range.elapsed_us(), launches + 1)
    return family_table(kernels)


# ---- environment ----


def git_state() -> tuple[str, bool]:
    """The commit and whether tracked files differ; KERNELS_COMMIT names it where .git is absent
    or stale (a copy of the tree on another machine)."""
    if os.environ.get("KERNELS_COMMIT"):
        commit = os.environ["KERNELS_COMMIT"]
        return commit.removesuffix("-dirty"), commit.endswith("-dirty")
    try:

        def git(*args):
            return subprocess.run(
                ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()

        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False


def environment(device: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def ver(pkg):
        try:
            return version(pkg)
        except PackageNotFoundError:
            return None

    commit, dirty = git_state()
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": ver("transformers"),
        "diffusers": ver("diffusers"),
        "kernels": ver("kernels"),
        "python": platform.python_version(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env["device"] = props.name
        env["capability"] = f"{props.major}.{props.minor}"
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            env["driver"] = None
    else:
        env["device"] = platform.processor() or platform.machine()
    return env


def config_dict(model) -> dict:
    cfg = model.config
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    return json.loads(json.dumps(d, default=str))


# ---- the run ----

DEFAULTS = {
    # (prefill shapes, decode shapes (batch x context), check shape)
    ("lm", "full"): ("1x2048,8x2048,1x16384", "1x2048", "1x2048"),
    ("lm", "tiny"): ("1x32,4x32", "1x32", "1x32"),
    # batch x frames x height x width (pixels)
    ("dit", "full"): ("2x49x512x768", "", "2x49x512x768"),
    ("dit", "tiny"): ("1x17x64x64", "", "1x17x64x64"),
}
PROMPT_TOKENS = {"full": 128, "tiny": 8}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(SPECS), required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--size", choices=["tiny", "full"], default="tiny")
    p.add_argument("--out", type=Path, help="results JSON (rewritten after each measurement)")
    p.add_argument(
        "--shapes",
        help="prefill (LM) or denoise (ltx: BxFRAMESxHxW) shapes, comma-separated ('' for none)",
    )
    p.add_argument("--decode", help="decode shapes batch x context, comma-separated ('' for none)")
    p.add_argument(
        "--train", default="", help="training-step shapes batch x length (language models)"
    )
    p.add_argument("--check-shape", help="shape of the check's input")
    p.add_argument(
        "--configs",
        help=f"subset of {','.join(CONFIGS)} (with --quant int4: of {','.join(INT4_CONFIGS)})",
    )
    p.add_argument("--kernels", help=f"kit kernels to map in (default {','.join(KERNELS)})")
    p.add_argument(
        "--compile-kernels",
        default=",".join(COMPILE_KERNELS),
        help="those of --kernels that compile+kit maps in ('all': every one; default "
        f"{','.join(COMPILE_KERNELS)}: COMPILE_KERNELS says why)",
    )
    p.add_argument("--skip-check", action="store_true", help="time without checking first")
    p.add_argument("--check-only", action="store_true", help="check, then stop")
    # Three timed calls gave medians 40% off on the LTX step (74 ms against 52 ms in a rerun):
    # two warm-up calls and ten timed ones settle it at a few seconds per configuration.
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=10, help="timed calls per prefill / denoise shape")
    p.add_argument("--decode-iters", type=int, default=16, help="timed decode steps per shape")
    p.add_argument(
        "--budget-s",
        type=float,
        default=540.0,
        help="start no new measurement after this many seconds (the GPU lease allows 600 per "
        "call); what is left is recorded in errors and the document stays incomplete",
    )
    p.add_argument("--no-profile", action="store_true")
    p.add_argument(
        "--compile-scope",
        choices=["blocks", "model"],
        default="blocks",
        help="prefill / denoise compilation: each repeated block (default) or the whole model",
    )
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument(
        "--quant",
        choices=["none", "int4"],
        default="none",
        help="int4: time the model against its int4 weight-only twin (INT4_CONFIGS; decode "
        "only unless --shapes names prefill shapes) instead of against the kit",
    )
    p.add_argument("--group-size", type=int, default=128, help="int4 quantization group size")
    return p.parse_args(argv)


class Results:
    """The results document, written to `path` (if any) whenever it changes."""

    def __init__(self, path: Path | None, doc: dict):
        self.path, self.doc = path, doc
        self.save()

    def save(self):
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.doc, indent=1) + "\n")
            tmp.replace(self.path)


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.start = time.perf_counter()
    spec = SPECS[args.model]
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU visible")
    dtype = getattr(torch, args.dtype or "bfloat16")
    int4 = args.quant == "int4"
    if int4 and spec.kind != "lm":
        raise SystemExit("--quant int4 takes a language model (llama, qwen3)")
    if int4 and (args.kernels is not None or args.train):
        raise SystemExit("--quant int4 times the int4 twin alone: no --kernels, no --train")
    names = ["quant"] if int4 else [k for k in (args.kernels or ",".join(KERNELS)).split(",") if k]
    allowed = INT4_CONFIGS if int4 else CONFIGS
    configs = [c for c in (args.configs or ",".join(allowed)).split(",") if c]
    for c in configs:
        if c not in allowed:
            raise SystemExit(f"unknown configuration {c!r}; one of {allowed}")
    compile_names = [] if int4 else compile_kernels(args.compile_kernels, names)
    if "compile+kit" in configs and not compile_names:
        raise SystemExit(
            f"--compile-kernels {args.compile_kernels!r} names none of --kernels "
            f"{','.join(names)!r}: compile+kit would map nothing (pass --compile-kernels all)"
        )
    prefill_default, decode_default, check_default = DEFAULTS[(spec.kind, args.size)]
    if int4:
        prefill_default = ""  # int4 is decode-first: M > 16 converts the weight per 16 tokens
    shapes = [
        parse_shape(s)
        for s in (args.shapes if args.shapes is not None else prefill_default).split(",")
        if s
    ]
    decodes = [
        parse_shape(s)
        for s in (args.decode if args.decode is not None else decode_default).split(",")
        if s and spec.kind == "lm"
    ]
    trains = [parse_shape(x) for x in args.train.split(",") if x and spec.kind == "lm"]
    check_shape = parse_shape(args.check_shape or check_default)
    prompt_tokens = PROMPT_TOKENS[args.size]

    kit_modules = load_kit(names)
    kit = Kit(kit_modules, spec)
    doc = {
        "schema": "e2e/1",
        "complete": False,
        "model": spec.name,
        "size": args.size,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "environment": environment(device),
        "kit": {k: build_info(m) for k, m in kit_modules.items()},
        "kit_compile": None if int4 else compile_names,
        "quant": None,  # --quant int4: {"quant", "group_size", "replaced", "skipped"}
        "configs": configs,
        "model_config": {},
        "routes": {},
        "check": None,
        "measurements": [],
        "speedups": [],
        "profile": None,
        "errors": [],
        "wall_s": {},
    }
    results = Results(args.out, doc)
    try:
        t0 = time.perf_counter()
        model32 = build_model(spec, args.size, device)
        doc["model_config"] = config_dict(model32)
        doc["wall_s"]["build"] = round(time.perf_counter() - t0, 1)
        print(f"[e2e] {spec.cls} ({args.size}) built on {device} in {doc['wall_s']['build']} s")
        if int4:
            if args.skip_check:
                model = model32.to(dtype)
                kit_model, report = int4_twin(model, kit_modules["quant"], args.group_size)
            else:
                cases, model, kit_model, report = run_check_int4(
                    spec, model32, kit_modules["quant"], args.group_size, check_shape, dtype,
                    device, decode=4 if decodes else 0,
                )  # fmt: skip
                doc["check"] = {"passed": all(c["passed"] for c in cases), "k": K, "cases": cases}
            doc["quant"] = {
                "quant": "int4",
                "group_size": args.group_size,
                "replaced": len(report.replaced),
                "skipped": dict(report.skipped),
            }
            ref32 = None
        elif args.skip_check:
            model = model32.to(dtype)
            kit_model = twin(model)
            kit.attach(kit_model, device=device)
            ref32 = None
        else:
            # The decode case runs where decode is measured (--decode "" leaves both out).
            cases, model, kit_model, ref32 = run_check(
                spec, model32, kit, check_shape, dtype, device, prompt_tokens,
                decode=4 if decodes else 0,
            )  # fmt: skip
            doc["check"] = {"passed": all(c["passed"] for c in cases), "k": K, "cases": cases}
        if doc["check"] is not None:
            for c in doc["check"]["cases"]:
                print(
                    f"[e2e] check {c['name']}: kit-fp32 max {c['kit_vs_fp32']['max']:.3e} "
                    f"mean {c['kit_vs_fp32']['mean']:.3e}; tolerance ({K:g} x bf16-fp32) max "
                    f"{c['tolerance']['max']:.3e} mean {c['tolerance']['mean']:.3e}: "
                    f"{'ok' if c['passed'] else 'FAILED'}"
                )
        del model32
        doc["wall_s"]["check"] = round(time.perf_counter() - t0 - doc["wall_s"]["build"], 1)
        doc["routes"] = dict(kit.routes)

        def kit_twin(routes_key, only, training=False):
            """A twin of `model` (the same weights) with the kit's `only` kernels attached; where
            they went in doc[routes_key]."""
            kernelized = twin(model)
            doc[routes_key] = kit.attach(kernelized, device=device, training=training, only=only)
            return kernelized

        # One model object per configuration and use (the timed calls interleave, and
        # compiled() wraps a model's blocks in place), all sharing the untouched weights.
        makers = {
            "eager": lambda: model,
            "compile": lambda: twin(model),
            "eager+kit": lambda: kit_model,
            "compile+kit": lambda: kit_twin("routes_compile", compile_names),
            "eager+int4": lambda: kit_model,
            "compile+int4": lambda: twin(kit_model),
        }
        bases = {c: makers[c]() for c in allowed}
        train_bases = {}
        if trains:  # the kit's training layers (and its attention where it trains)
            makers["eager+kit"] = lambda: kit_twin("routes_train", names, training=True)
            makers["compile+kit"] = lambda: kit_twin(
                "routes_train_compile", compile_names, training=True
            )
            train_bases = {c: makers[c]() for c in CONFIGS}
        results.save()
        if doc["check"] is not None and not doc["check"]["passed"]:
            raise SystemExit(
                "[e2e] check failed: no measurement of a model that computes otherwise"
            )
        if args.check_only:
            doc["complete"] = True
            return doc
        kit_kernels = {"eager+kit": names, "compile+kit": compile_names}
        measure(
            args, spec, model, bases, kit, kit_kernels, configs, shapes, decodes, ref32,
            prompt_tokens, dtype, device, doc, results, trains=trains, train_bases=train_bases,
        )  # fmt: skip
        doc["complete"] = True
        return doc
    finally:
        doc["wall_s"]["total"] = round(time.perf_counter() - args.start, 1)
        results.save()
        kit.close()
        if doc["measurements"]:
            import e2e_table

            print(e2e_table.render(doc))


def first_shape_reference(spec, ref32, shape):
    """The check's float32 output restricted to what the first timed shape returns, when that
    shape is the check's: last-position logits, or the whole denoiser output."""
    if ref32 is None:
        return None
    if spec.kind == "lm":
        ref = ref32["prefill"]
        return ref[:, -1:] if tuple(ref.shape[:2]) == tuple(shape) else None
    ref = ref32["denoise"]
    return (
        ref if ref.shape[0] == shape[0] and ref.shape[1] == ltx_tokens(shape) // shape[0] else None
    )


def measure(args, spec, model, bases, kit, kit_kernels, configs, shapes, decodes, ref32,
            prompt_tokens, dtype, device, doc, results, trains=(), train_bases=None):  # fmt: skip
    """Times each configuration on its model of `bases` (`train_bases` for training steps);
    `model` is the untouched one, `kit_kernels` the kernels each kit configuration maps in.
    Prefill / denoise, training and the eager decode steps interleave the configurations call
    by call (time_interleaved); the compiled decode steps run one configuration after the
    other, each with CUDA graphs of its own."""
    # Regional compilation reuses one compiled block for every layer; should guards still tell
    # the layers apart, each compiles rather than silently falling back to eager after the
    # default limit of 8 ("graphs" in the JSON shows it). The compiled configurations share
    # the blocks' code, so their graphs add up in one cache.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

    # The kit's rotary swap around each call of a kit configuration (Kit.rope).
    scopes = {c: (lambda c=c: kit.rope(kit_kernels[c])) for c in configs if c.endswith("+kit")}
    measure_forward(args, spec, model, bases, configs, shapes, ref32, prompt_tokens, dtype, device,
                    doc, results, scopes)  # fmt: skip
    measure_decode(args, model, bases, configs, decodes, device, doc, results, scopes)
    if trains:
        measure_train(args, spec, train_bases, configs, trains, device, doc, results, scopes)
    doc["speedups"] = speedups(doc["measurements"], "int4" if doc.get("quant") else "kit")
    results.save()


def compiled_models(stack, bases, configs, spec, scope) -> dict:
    """Each configuration's model of `bases`, the compile ones under compiled() until `stack`
    closes."""
    return {
        c: stack.enter_context(compiled(bases[c], spec, scope))
        if c.startswith("compile")
        else bases[c]
        for c in configs
    }


def graph_count() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def measure_forward(args, spec, model, bases, configs, shapes, ref32, prompt_tokens, dtype, device,
                    doc, results, scopes):  # fmt: skip
    """Prefill (language models) or one denoising step (LTX) at each shape, the configurations
    interleaved; compiled ones under compiled() for the whole phase."""
    ref_first = first_shape_reference(spec, ref32, shapes[0]) if shapes else None
    spread = None
    if ref_first is not None and doc["check"]:
        spread = doc["check"]["cases"][0]["bf16_vs_fp32"]
    phase = "prefill" if spec.kind == "lm" else "denoise"
    torch._dynamo.reset()
    graphs = dict.fromkeys(configs, 0)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        fwds = compiled_models(stack, bases, configs, spec, args.compile_scope)
        for i, shape in enumerate(shapes):
            label = "x".join(map(str, shape))
            if over_budget(args, doc, results, f"{phase} {label}"):
                continue
            if spec.kind == "lm":
                ids = lm_ids(model.config, shape[0], shape[1], device)
                tokens = shape[0] * shape[1]
            else:
                inputs = ltx_inputs(model, shape, dtype, device, prompt_tokens)
                tokens = ltx_tokens(shape)
            outs = {c: {} for c in configs}

            def call_of(config):
                fwd, out = fwds[config], outs[config]
                if spec.kind == "lm":
                    return lambda: out.update(y=prefill(fwd, ids))
                return lambda: out.update(y=fwd(**inputs)[0])

            calls = {c: call_of(c) for c in configs}
            length = shape[1] if spec.kind == "lm" else tokens // shape[0]
            rows = timed_rows(calls, args, device, scopes, graphs, doc, results,
                              phase, label, shape[0], length)  # fmt: skip
            for config, row in rows.items():
                if i == 0 and ref_first is not None and spread is not None:
                    row["agreement"] = agreement(outs[config]["y"], ref_first, spread, spec)
                record(doc, results, row)
            if i == 0 and "eager+kit" in rows and device == "cuda" and not args.no_profile:
                try:
                    with scopes["eager+kit"]():
                        families = profile_families(calls["eager+kit"])
                    doc["profile"] = {"config": "eager+kit", "phase": phase, "shape": label}
                    doc["profile"].update(families)
                    results.save()
                except Exception as e:  # noqa: BLE001
                    fail(doc, results, f"eager+kit {phase} {label} profile", e)


def measure_decode(args, model, bases, configs, decodes, device, doc, results, scopes):
    """ms per decode step. The eager configurations take turns step by step (time_interleaved:
    a host-bound eager step follows the host's speed, which drifted by a third within one run);
    the compile configurations, the whole model under reduce-overhead (CUDA graphs over a full
    step), run one after the other, each recording graphs of its own."""
    from torch._dynamo.utils import counters

    eager = [c for c in configs if not c.startswith("compile")]
    for shape in decodes:
        label = "x".join(map(str, shape))
        if not eager or over_budget(args, doc, results, f"decode {label}"):
            continue
        with torch.no_grad():
            steps = {c: decode_setup(bases[c], model, shape, args, device) for c in eager}
            calls = {c: call for c, (call, _) in steps.items()}
            advances = {c: advance for c, (_, advance) in steps.items()}
            # reduce-overhead's two recording calls are warm-up here too: the same step count
            rows = timed_rows(calls, args, device, scopes, dict.fromkeys(eager, 0), doc, results,
                              "decode", label, shape[0], shape[1], between=advances,
                              warmup=args.warmup + 2, iters=args.decode_iters)  # fmt: skip
        for row in rows.values():
            del row["tokens_per_s"]
            record(doc, results, row)
    for config in [c for c in configs if c.startswith("compile")]:
        torch._dynamo.reset()
        counters.clear()
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            if config in scopes:
                stack.enter_context(scopes[config]())
            for shape in decodes:
                label = "x".join(map(str, shape))
                if over_budget(args, doc, results, f"{config} decode {label}"):
                    continue
                try:
                    step = torch.compile(bases[config], mode="reduce-overhead", dynamic=False)
                    call, advance = decode_setup(step, model, shape, args, device)
                    row = time_calls(call, device, args.warmup + 2, args.decode_iters, advance)
                    row.update(phase="decode", shape=label, batch=shape[0], length=shape[1])
                    row["config"] = config
                    row["graphs"] = counters["stats"]["unique_graphs"]
                    row["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
                    record(doc, results, row)
                except Exception as e:  # noqa: BLE001
                    fail(doc, results, f"{config} decode {label}", e)


def measure_train(args, spec, train_bases, configs, trains, device, doc, results, scopes):
    """One training step (forward, causal-LM loss, backward into every parameter's grad,
    cleared before each step; no optimizer) at each shape, the configurations interleaved;
    regional compilation as for prefill. The twins share their parameters, so each step starts
    from the same state."""
    torch._dynamo.reset()
    graphs = dict.fromkeys(configs, 0)
    bases = {c: train_bases[c] for c in configs}
    params = [p for p in next(iter(bases.values())).parameters() if p.requires_grad]
    with contextlib.ExitStack() as stack:
        steps = compiled_models(stack, bases, configs, spec, args.compile_scope)
        for base in bases.values():
            base.train()
            stack.callback(base.train, False)
        stack.callback(lambda: [setattr(p, "grad", None) for p in params])
        for shape in trains:
            label = "x".join(map(str, shape))
            if over_budget(args, doc, results, f"train {label}"):
                continue
            ids = lm_ids(bases[configs[0]].config, shape[0], shape[1], device, seed=4)

            def call_of(config):
                step = steps[config]

                def call():
                    for p in params:
                        p.grad = None
                    step(input_ids=ids, labels=ids).loss.backward()

                return call

            calls = {c: call_of(c) for c in configs}
            rows = timed_rows(calls, args, device, scopes, graphs, doc, results,
                              "train", label, shape[0], shape[1])  # fmt: skip
            for row in rows.values():
                record(doc, results, row)


def timed_rows(calls, args, device, scopes, graphs, doc, results, phase, label, batch, length,
               between=None, warmup=None, iters=None):  # fmt: skip
    """time_interleaved over the configurations' `calls` at one shape (`args`' warm-up and
    timed calls unless given): their rows, labelled (tokens per second; for the compiled ones
    the graphs so far, added up in `graphs`). A configuration that fails is recorded in the
    errors and left out; a failure of the rounds loses the shape, not the run."""
    warmup = args.warmup if warmup is None else warmup
    iters = args.iters if iters is None else iters
    try:
        timed = time_interleaved(calls, device, warmup, iters, between=between,
                                 scopes=scopes, graphs=graph_count)  # fmt: skip
    except Exception as e:  # noqa: BLE001 (a failed shape must not lose the others)
        fail(doc, results, f"{phase} {label}", e)
        return {}
    rows = {}
    for config, row in timed.items():
        if isinstance(row, Exception):
            fail(doc, results, f"{config} {phase} {label}", row)
            continue
        row.update(phase=phase, shape=label, batch=batch, length=length, config=config)
        row["tokens_per_s"] = batch * length / (row["median_ms"] / 1000)
        graphs[config] += row.pop("new_graphs")
        if config.startswith("compile"):
            row["graphs"] = graphs[config]
        rows[config] = row
    return rows


def compile_kernels(value: str, names: list) -> list:
    """The kernels of `names` that compile+kit maps in, from --compile-kernels."""
    if value == "all":
        return list(names)
    chosen = [k for k in value.split(",") if k]
    unknown = [k for k in chosen if k not in KERNELS]
    if unknown:
        raise SystemExit(f"--compile-kernels: unknown {unknown}; known: {', '.join(KERNELS)}")
    return [k for k in names if k in chosen]


def over_budget(args, doc, results, what: str) -> bool:
    elapsed = time.perf_counter() - args.start
    if elapsed <= args.budget_s:
        return False
    doc["errors"].append(f"{what}: not measured, {elapsed:.0f} s > --budget-s {args.budget_s:g}")
    results.save()
    print(f"[e2e] {what}: skipped (time budget)")
    return True


def agreement(y, ref, spread, spec) -> dict:
    """A timed configuration's output on the check's input against the float32 reference."""
    if spec.kind == "lm":
        y = y[:, -1:]
    got = errors(y.float(), ref)
    tol = {s: K * spread[s] for s in spread}
    # Last-position logits only: the spread of all positions bounds the mean loosely; the max
    # is the meaningful test here.
    return {"vs_fp32": got, "tolerance": tol, "passed": got["max"] <= tol["max"]}


def decode_setup(step, prefill_model, shape, args, device):
    """`step` set up to decode one token per call at `shape` = batch x context: the cache is
    filled by the untouched model (eager). Returns (call, advance): one step, and the position
    move before the next (untimed)."""
    batch, context = shape
    # reduce-overhead records on the 3rd call; one more step for time_calls' sync check on CUDA
    steps = 1 + args.warmup + 2 + args.decode_iters + 1
    cache = static_cache(prefill_model, batch, context + steps + 1)
    ids = lm_ids(prefill_model.config, batch, context, device, seed=3)
    pos0 = torch.arange(context, device=device)[None].expand(batch, -1)
    kw = {cache_kw(prefill_model): cache, "use_cache": True}
    prefill_model(input_ids=ids, position_ids=pos0, logits_to_keep=1, **kw)
    tok = ids[:, -1:].clone()
    pos = torch.full((batch, 1), context - 1, device=device)

    def advance():
        pos.add_(1)

    def call():
        step(input_ids=tok, position_ids=pos, **kw)

    return call, advance


def record(doc, results, row):
    doc["measurements"].append(row)
    doc["speedups"] = speedups(doc["measurements"], "int4" if doc.get("quant") else "kit")
    results.save()
    extra = f", {row['tokens_per_s']:.0f} tok/s" if "tokens_per_s" in row else ""
    if "syncs" in row:  # CUDA: where the host time went (time_calls)
        grown = {k: v for k, v in row["allocator"].items() if v}
        extra += f", host {row['host_ms']:.3f} ms, syncs {row['syncs']['count']}"
        extra += f" {row['syncs']['where']}" if row["syncs"]["where"] else ""
        extra += f", allocator {grown}" if grown else ""
    print(
        f"[e2e] {row['config']:<12} {row['phase']:<8} {row['shape']:<14} "
        f"median {row['median_ms']:.3f} ms{extra} (first call {row['first_call_s']:.1f} s)"
    )


def fail(doc, results, what, e):
    print(f"[e2e] {what}: FAILED {type(e).__name__}: {e}", file=sys.stderr)
    traceback.print_exc()
    doc["errors"].append(f"{what}: {type(e).__name__}: {str(e)[:500]}")
    results.save()
    if isinstance(e, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()


def speedups(rows, variant: str = "kit") -> list[dict]:
    """Per phase and shape, the ratios of the variant's configurations ("kit", or "int4" for
    --quant int4) to eager and compile: `<v>_vs_eager`, `compile_<v>_vs_compile` and
    `compile_<v>_vs_eager` (above 1: the variant is faster)."""
    by = {(r["phase"], r["shape"], r["config"]): r["median_ms"] for r in rows}
    out = []
    for phase, shape in dict.fromkeys((r["phase"], r["shape"]) for r in rows):
        t = {c: by.get((phase, shape, c)) for c in ("eager", "compile", f"eager+{variant}",
                                                    f"compile+{variant}")}  # fmt: skip
        entry = {"phase": phase, "shape": shape}
        for key, num, den in (
            (f"{variant}_vs_eager", "eager", f"eager+{variant}"),
            (f"compile_{variant}_vs_compile", "compile", f"compile+{variant}"),
            (f"compile_{variant}_vs_eager", "eager", f"compile+{variant}"),
        ):
            entry[key] = t[num] / t[den] if t[num] and t[den] else None
        out.append(entry)
    return out


if __name__ == "__main__":
    doc = main()
    sys.exit(0 if doc.get("complete") and not doc.get("errors") else 1)
