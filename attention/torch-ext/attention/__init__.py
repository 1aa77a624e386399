"""Attention kernels (forward and backward) with flash-attn 2's and FlashAttention-3's Python APIs,
vLLM's paged KV-cache writers, and the entry points transformers and diffusers load from a Hub
kernel.

Math (kernel_src/attention_params.h): per query row i and visible key j, s_j = softmax_scale *
<q_i, k_j>, optionally softcapped (softcap * tanh(s_j / softcap)) and biased by ALiBi
(-slope * |i + len_k - len_q - j|); causal and sliding-window masks are bottom-right aligned
(flash-attn >= 2.1); out_i = softmax(s) @ v in fp32, rounded once; softmax_lse = log sum exp(s)
(natural log). MQA / GQA: query head h reads kv head h // (heads_q // heads_kv). A row that sees
no key gives out = 0 and lse = +inf.

* flash-attn 2 (forward): ``flash_attn_func``, ``flash_attn_varlen_func`` (packed sequences,
  optional paged K/V through ``block_table`` and ``seqused_k``), ``flash_attn_qkvpacked_func``,
  ``flash_attn_kvpacked_func``, ``flash_attn_varlen_qkvpacked_func``,
  ``flash_attn_varlen_kvpacked_func``, ``flash_attn_with_kvcache`` (appends new k/v into the
  cache, optional rotary embedding, cache_batch_idx, cache_leftpad, block_table, num_splits); the
  C++ entry points ``ops.fwd``, ``ops.varlen_fwd``, ``ops.fwd_kvcache``, ``ops.bwd`` and
  ``ops.varlen_bwd``; ``bert_padding``.
* vLLM: ``reshape_and_cache`` (paged layout) and ``reshape_and_cache_flash`` (flash layout).
* transformers: ``attn_implementation="<org>/attention"`` finds ``flash_attn_varlen_func`` /
  ``flash_attn_func`` / ``flash_attn_with_kvcache`` (kernels >= 0.18.2); with older kernels,
  register ``transformers_attention_forward`` through ``AttentionInterface`` (see the card).
* diffusers: the ``flash_hub`` / ``flash_varlen_hub`` backends call ``flash_attn_func`` /
  ``flash_attn_varlen_func`` and ``flash_attn_interface._flash_attn_forward`` /
  ``_flash_attn_varlen_forward`` (also exported as ``_wrapped_flash_attn_forward``);
  ``use_with_diffusers()`` makes them, and the ``_flash_3_hub`` / ``_flash_3_varlen_hub``
  backends through ``fa3``, use this package (diffusers itself would load
  ``kernels-community/flash-attn2`` version 3 and ``kernels-community/flash-attn3``).
* FlashAttention-3: ``fa3`` has FA3's ``flash_attn_func`` / ``flash_attn_varlen_func`` (its
  parameters and return convention) and its private ``_flash_attn_forward`` /
  ``_flash_attn_backward``.

dtypes: float16 and bfloat16 on CUDA (head_dim up to 256), float32 too on the CPU (any
head_dim). ``dropout_p > 0`` raises NotImplementedError. A backward runs through the dense and
varlen functions (on CUDA for head dims up to 256; 128 on GPUs with 99 KB of shared memory a
block: sm_86, sm_89, sm_120); their
``deterministic`` (default False, as in flash-attn) picks the CUDA backward: False adds dQ into
an fp32 workspace in a varying order (faster; on H100 / H200 the Hopper kernel takes head dims 40
to 256), True gives the same bits on every run. The KV-cache and paged forms are
inference-only. Every function traces with ``torch.compile(fullgraph=True)``.
"""

import os
from typing import List, Optional, Tuple, Union

import torch

from . import _custom_ops, _reference, bert_padding, fa3, flash_attn_interface
from ._ops import ops
from .flash_attn_interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__all__ = [
    # vLLM (listed first: these are also the names of their ops)
    "reshape_and_cache",
    "reshape_and_cache_flash",
    # flash-attn 2
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "flash_attn_interface",
    "bert_padding",
    # FlashAttention-3's API
    "fa3",
    # CUDA index errors found on the device
    "check_kvcache_errors",
    # transformers AttentionInterface
    "transformers_attention_forward",
    "use_with_diffusers",
]


# ---- vLLM paged KV cache ----


def _scale(x) -> Optional[torch.Tensor]:
    """vLLM passes k_scale / v_scale as tensors (current) or floats (older); both are unused with
    kv_cache_dtype "auto", the only one supported."""
    return x if isinstance(x, torch.Tensor) else None


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: Union[torch.Tensor, float, None] = None,
    v_scale: Union[torch.Tensor, float, None] = None,
) -> None:
    """vLLM ``reshape_and_cache``: writes token t's ``key [T, H, D]`` / ``value`` rows into cache
    slot ``slot_mapping[t]`` (int64 or int32; ``-1`` skips the token; only the first
    ``slot_mapping.size(0)`` tokens are written) of vLLM's paged layout: ``key_cache
    [num_blocks, H, D // x, block_size, x]``, ``value_cache [num_blocks, H, D, block_size]``
    (slot s = block s // block_size, row s % block_size). Values are copied bit for bit;
    ``kv_cache_dtype`` must be ``"auto"`` (fp8 caches are not supported) and the scales are
    unused. A slot past the cache raises, on CUDA at the next call (the kernel skips it and
    records the error: ``check_kvcache_errors``)."""
    ops.reshape_and_cache(
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        kv_cache_dtype,
        _scale(k_scale),
        _scale(v_scale),
    )


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: Union[torch.Tensor, float, None] = None,
    v_scale: Union[torch.Tensor, float, None] = None,
) -> None:
    """vLLM ``reshape_and_cache_flash``: as ``reshape_and_cache`` with both caches in the flash
    layout ``[num_blocks, block_size, H, D]`` (any strides with unit stride along D: views of a
    ``[2, num_blocks, block_size, H, D]`` or ``[num_blocks, 2, ...]`` KV tensor work). This is
    the layout ``flash_attn_with_kvcache`` and ``flash_attn_varlen_func`` read with a
    ``block_table``."""
    ops.reshape_and_cache_flash(
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        kv_cache_dtype,
        _scale(k_scale),
        _scale(v_scale),
    )


# ---- index errors found by the CUDA kernels ----


@torch.compiler.disable
def check_kvcache_errors(device: Union[torch.device, str, int, None] = None) -> None:
    """Synchronizes a CUDA device and raises the RuntimeError of an index value its kernels found
    out of range since the last check, if any (then clears it): a KV-cache row past the cache or
    past the sequence's ``block_table`` row (``flash_attn_with_kvcache`` appending to a full
    cache, a ``cache_seqlens`` / ``seqused_k`` longer than the cache), a block id, batch index,
    rotary row or ``slot_mapping`` slot outside its tensor.

    On CUDA the ops never read index values on the host (that would synchronize, and a CUDA graph
    capture forbids it): the kernels check them, skip the out-of-range reads and writes (the
    affected sequence's attention output is NaN) and record the first error per device; the
    next call of these ops on the device raises it, or this function, e.g. after replaying a
    CUDA graph. On the CPU the same values raise at once, and this function does nothing.
    ``device``: a CUDA device or its index (default: the current one, if any); not callable
    inside a graph capture.
    """
    if device is None:
        if not torch.cuda.is_available():
            return
        index = torch.cuda.current_device()
    elif isinstance(device, int):
        index = device  # a CUDA device index, checked by the op
    else:
        device = torch.device(device)
        if device.type != "cuda":
            return
        index = device.index if device.index is not None else torch.cuda.current_device()
    ops.check_kvcache_errors(index)


# ---- transformers AttentionInterface ----


def _unpad(x: torch.Tensor, mask: torch.Tensor):
    """Rows of x [B, S, ...] where mask [B, S] is true, with their flat indices, cu_seqlens (int32)
    and the longest sequence."""
    lengths = mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu = torch.nn.functional.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))
    return (
        x.reshape(-1, *x.shape[2:])[indices],
        indices,
        cu,
        int(lengths.max().item()) if lengths.numel() else 0,
    )


def transformers_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    is_causal: Optional[bool] = None,
    s_aux: Optional[torch.Tensor] = None,
    **kwargs,
) -> Tuple[torch.Tensor, None]:
    """An attention function for transformers' ``AttentionInterface`` (the contract of its
    ``flash_attention_forward``): ``query [B, H, S_q, D]``, ``key`` / ``value [B, H_kv, S_k, D]``
    (the model's layout, cache included), ``attention_mask`` the 2-D padding mask transformers'
    ``flash_attention_2`` mask function returns (``None`` without padding); returns
    ``(attn_output [B, S_q, H, D], None)``.

    Register it together with that mask function::

        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import flash_attention_mask
        AttentionInterface.register("open_kernels_attention", kernel.transformers_attention_forward)
        AttentionMaskInterface.register("open_kernels_attention", flash_attention_mask)
        model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="open_kernels_attention")

    Semantics follow transformers' flash-attention path: causal (bottom-right aligned, so cached
    decoding works), ``sliding_window`` as ``window_size = (sliding_window - 1, sliding_window -
    1)`` when the keys outnumber it, ``softcap``, padded batches unpadded into packed sequences
    (left or right padding; for a chunk of several new tokens after a cache, left padding as
    transformers assumes), packed sequences from ``cu_seq_lens_q/k`` + ``max_length_q/k``
    keyword arguments. float32 activations on CUDA run in bfloat16 (or the autocast dtype) and
    are cast back. ``deterministic`` (keyword; None or absent: the environment variable
    ``FLASH_ATTENTION_DETERMINISTIC=1``, as transformers reads it) picks the backward's dQ as in
    ``flash_attn_func``. Attention sinks (``s_aux``, gpt-oss) as in ``flash_attn_func``. dropout > 0
    raises NotImplementedError.
    """
    op = "transformers_attention_forward"
    if dropout and module is not None and module.training:
        raise NotImplementedError(
            f"{op}: dropout = {dropout} is not implemented (forward-only kernel)"
        )
    causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, S, H, D] views
    dtype = q.dtype
    if q.device.type == "cuda" and dtype == torch.float32:
        target = (
            torch.get_autocast_dtype("cuda")
            if torch.is_autocast_enabled("cuda")
            else torch.bfloat16
        )
        q, k, v = q.to(target), k.to(target), v.to(target)
    batch, q_len = q.shape[0], q.shape[1]
    kv_len = k.shape[1]
    window = (-1, -1)
    if sliding_window is not None and kv_len > sliding_window:
        window = (sliding_window - 1, sliding_window - 1)
    deterministic = kwargs.get("deterministic")
    if deterministic is None:
        deterministic = os.environ.get("FLASH_ATTENTION_DETERMINISTIC", "0") == "1"
    options = dict(
        softmax_scale=scaling,
        causal=causal,
        window_size=window,
        softcap=softcap or 0.0,
        deterministic=bool(deterministic),
        s_aux=s_aux,
    )

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    if attention_mask is not None:
        mask = attention_mask.to(torch.bool)
        if k.shape[1] > mask.shape[-1]:  # static cache longer than the mask: the mask's keys only
            k, v = k[:, : mask.shape[-1]], v[:, : mask.shape[-1]]
            kv_len = k.shape[1]
        k_unpad, _, cu_k, max_k = _unpad(k, mask)
        v_unpad = v.reshape(-1, *v.shape[2:])[
            torch.nonzero(mask.flatten(), as_tuple=False).flatten()
        ]
        if q_len == kv_len:
            q_unpad, indices_q, cu_q, max_q = _unpad(q, mask)
        elif q_len == 1:
            q_unpad = q.reshape(batch, *q.shape[2:])
            indices_q = torch.arange(batch, device=q.device)
            cu_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
            max_q = 1
        else:
            q_unpad, indices_q, cu_q, max_q = _unpad(q, mask[:, -q_len:])
        out_unpad = flash_attn_varlen_func(
            q_unpad, k_unpad, v_unpad, cu_q, cu_k, max_q, max_k, **options
        )
        out = out_unpad.new_zeros((batch * q_len, *out_unpad.shape[1:]))
        out[indices_q] = out_unpad
        out = out.view(batch, q_len, *out_unpad.shape[1:])
    elif all(x is not None for x in (cu_q, cu_k, max_q, max_k)):
        q2, k2, v2 = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
        out = flash_attn_varlen_func(
            q2, k2, v2, cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k, **options
        ).view(batch, q_len, *q.shape[2:])
    else:
        out = flash_attn_func(q, k, v, **options)
    return out.to(dtype), None


def use_with_diffusers() -> List[str]:
    """Make diffusers' ``flash_hub`` and ``flash_varlen_hub`` attention backends call this
    package, and its ``_flash_3_hub`` and ``_flash_3_varlen_hub`` backends this package's ``fa3``
    (FlashAttention-3's API), in this process; returns the backend names.

    diffusers hard-codes the kernel those backends load (``kernels-community/flash-attn2``,
    ``version=3``, and ``kernels-community/flash-attn3``, after a Hub query of the publisher's
    trust unless ``DIFFUSERS_TRUST_REMOTE_KERNELS=true``) and loads it only while its backend
    entry still lacks the functions. This fills each entry with the functions its attribute paths
    name, resolved on this package or on ``fa3`` (the same lookup diffusers does on the kernel it
    downloads), so ``set_attention_backend("flash_hub")`` then loads nothing: no repository,
    version or network is involved. Call it before ``set_attention_backend`` /
    ``attention_backend``; it replaces a kernel loaded earlier. Raises RuntimeError when the
    installed diffusers has no flash_hub / flash_varlen_hub entries (the FA3 ones are filled
    where they exist).
    """
    import sys

    try:
        from diffusers.models import attention_dispatch as ad

        names = [ad.AttentionBackendName.FLASH_HUB, ad.AttentionBackendName.FLASH_VARLEN_HUB]
        configs = [ad._HUB_KERNELS_REGISTRY[name] for name in names]
    except (ImportError, AttributeError, KeyError) as exc:
        raise RuntimeError(
            "use_with_diffusers: this diffusers has no flash_hub / flash_varlen_hub kernel "
            f"registry to fill (written against diffusers 0.42): {exc}"
        ) from exc
    package = sys.modules[__name__]
    targets = [package] * len(names)
    for fa3_name in ("_FLASH_3_HUB", "_FLASH_3_VARLEN_HUB"):
        name = getattr(ad.AttentionBackendName, fa3_name, None)
        if name in ad._HUB_KERNELS_REGISTRY:
            names.append(name)
            configs.append(ad._HUB_KERNELS_REGISTRY[name])
            targets.append(fa3)

    def resolve(target, path: str):
        for attr in path.split("."):
            target = getattr(target, attr)
        return target

    for config, target in zip(configs, targets):
        config.kernel_fn = resolve(target, config.function_attr)
        if config.wrapped_forward_attr is not None:
            config.wrapped_forward_fn = resolve(target, config.wrapped_forward_attr)
        if config.wrapped_backward_attr is not None:
            config.wrapped_backward_fn = resolve(target, config.wrapped_backward_attr)
    return [name.value for name in names]


# An error raised through a public function names it, not the op it reached (_public_errors.py):
# the flash-attn functions wherever users reach them (this package, flash_attn_interface).
from . import _public_errors  # noqa: E402
from ._ops import add_op_namespace_prefix  # noqa: E402

_public_errors.wrap_public(
    [vars(flash_attn_interface), globals()],
    [
        *flash_attn_interface.__all__,
        "_flash_attn_forward",
        "_flash_attn_varlen_forward",
        "_wrapped_flash_attn_forward",
        "_wrapped_flash_attn_varlen_forward",
    ],
    add_op_namespace_prefix,
)
_public_errors.wrap_public(
    [vars(fa3)],
    [*fa3.__all__, "_flash_attn_forward", "_flash_attn_backward"],
    add_op_namespace_prefix,
)
_public_errors.wrap_public([globals()], __all__, add_op_namespace_prefix)
