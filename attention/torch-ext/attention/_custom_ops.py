"""Custom ops of the attention kernel: fakes of the C++ ops, the allocating forward op with its
(raising) autograd registration, and the shape checks the fakes share.

The C++ ops (torch-ext/torch_binding.cpp) validate everything on real tensors. Under
torch.compile they run on fake tensors, where only their fakes below run: those repeat the
checks that decide the output shapes (dtype, device, ranks, head counts, strides), with the
same messages, so a bad call fails at trace time too; value checks (cu_seqlens, block tables)
need real data and happen when the compiled graph runs.
"""

from typing import Optional, Tuple

import torch

from ._eager_path import OpRoutes
from ._ops import add_op_namespace_prefix, ops

# float64 runs on the CPU only (gradient checks); CUDA takes CUDA_DTYPES.
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CUDA_DTYPES = (torch.float16, torch.bfloat16)
# CUDA takes any head dim up to this (attention_ops.cpp: multiples of 8 run the next instantiated
# size, others zero-padded copies); the CPU any positive one.
CUDA_MAX_HEAD_DIM = 256


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _check_device(
    op: str, name: str, t: torch.Tensor, ref: torch.Tensor, ref_name: str = "q"
) -> None:
    torch._check(
        t.device == ref.device,
        lambda: (
            f"{op}: {name} must be on the device of {ref_name} (expected {ref.device}, got {t.device})"
        ),
    )


def _unit_last_stride(t: torch.Tensor) -> bool:
    return t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1


def _check_int32(
    op: str, name: str, t: torch.Tensor, q: torch.Tensor, shape_text: str, dims: int = 1
) -> None:
    _check_device(op, name, t, q)
    torch._check(
        t.dtype == torch.int32, lambda: f"{op}: {name} must be int32, got {_dtype_name(t.dtype)}"
    )
    torch._check(
        t.dim() == dims, lambda: f"{op}: {name} must have shape {shape_text}, got {list(t.shape)}"
    )


def check_attention(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    kv_batch_idx: Optional[torch.Tensor] = None,
    leftpad_k: Optional[torch.Tensor] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    names: Optional[dict] = None,
) -> None:
    """The shape, dtype, device and stride rules of torch-ext/attention_ops.cpp (`check`)."""
    n = {
        "q": "q",
        "k": "k",
        "v": "v",
        "out": "out",
        "cu_seqlens_q": "cu_seqlens_q",
        "cu_seqlens_k": "cu_seqlens_k",
        "seqused_k": "seqused_k",
        "block_table": "block_table",
        "kv_batch_idx": "kv_batch_idx",
        "leftpad_k": "leftpad_k",
        "alibi_slopes": "alibi_slopes",
    }
    n.update(names or {})
    if q.device.type == "cuda":
        torch._check(
            q.dtype in CUDA_DTYPES,
            lambda: (
                f"{op}: {n['q']} must be float16 or bfloat16 on CUDA, got {_dtype_name(q.dtype)}"
            ),
        )
    else:
        torch._check(
            q.dtype in KERNEL_DTYPES,
            lambda: (
                f"{op}: {n['q']} must be float32, float16, bfloat16 or float64, got "
                f"{_dtype_name(q.dtype)}"
            ),
        )
    for key in ("k", "v", "out"):
        t = {"k": k, "v": v, "out": out}[key]
        if t is None:
            continue
        _check_device(op, n[key], t, q, n["q"])
        torch._check(
            t.dtype == q.dtype,
            lambda: (
                f"{op}: {n[key]} must have the dtype of {n['q']} (expected {_dtype_name(q.dtype)}, got "
                f"{_dtype_name(t.dtype)})"
            ),
        )
    varlen_q = cu_seqlens_q is not None
    if varlen_q:
        torch._check(
            q.dim() == 3,
            lambda: (
                f"{op}: {n['q']} must have shape [total_q, num_heads, head_dim] with {n['cu_seqlens_q']}, got "
                f"{list(q.shape)}"
            ),
        )
        _check_int32(op, n["cu_seqlens_q"], cu_seqlens_q, q, "[batch + 1]")
        batch = cu_seqlens_q.shape[0] - 1
    else:
        torch._check(
            q.dim() == 4,
            lambda: (
                f"{op}: {n['q']} must have shape [batch, seqlen_q, num_heads, head_dim], got {list(q.shape)}"
            ),
        )
        batch = q.shape[0]
    if block_table is not None and cu_seqlens_k is not None:
        # flash-attn's paged varlen call: cu_seqlens_k holds the key lengths
        _check_int32(op, n["cu_seqlens_k"], cu_seqlens_k, q, "[batch + 1]")
        torch._check(
            cu_seqlens_k.shape[0] == batch + 1,
            lambda: (
                f"{op}: {n['cu_seqlens_k']} must have shape [{batch + 1}] ([batch + 1]), got "
                f"{list(cu_seqlens_k.shape)}"
            ),
        )
        cu_seqlens_k = None
    if block_table is not None:
        torch._check(
            k.dim() == 4,
            lambda: (
                f"{op}: {n['k']} must be a paged cache [num_blocks, block_size, num_heads_k, head_dim] with "
                f"{n['block_table']}, got {list(k.shape)}"
            ),
        )
        _check_int32(op, n["block_table"], block_table, q, "[batch, max_blocks_per_seq]", dims=2)
        torch._check(
            block_table.shape[0] == batch,
            lambda: (
                f"{op}: {n['block_table']} must have shape [batch = {batch}, max_blocks_per_seq], got "
                f"{list(block_table.shape)}"
            ),
        )
    elif cu_seqlens_k is not None:
        torch._check(
            k.dim() == 3,
            lambda: (
                f"{op}: {n['k']} must have shape [total_k, num_heads_k, head_dim] with {n['cu_seqlens_k']}, got "
                f"{list(k.shape)}"
            ),
        )
        _check_int32(op, n["cu_seqlens_k"], cu_seqlens_k, q, "[batch + 1]")
        torch._check(
            cu_seqlens_k.shape[0] == batch + 1,
            lambda: (
                f"{op}: {n['cu_seqlens_k']} must have shape [{batch + 1}] ([batch + 1]), got "
                f"{list(cu_seqlens_k.shape)}"
            ),
        )
    else:
        torch._check(
            k.dim() == 4,
            lambda: (
                f"{op}: {n['k']} must have shape [batch, seqlen_k, num_heads_k, head_dim], got {list(k.shape)}"
            ),
        )
        if kv_batch_idx is None:
            torch._check(
                k.shape[0] == batch,
                lambda: (
                    f"{op}: {n['k']} must have the batch size of {n['q']} ({batch}), got shape {list(k.shape)}"
                ),
            )
    torch._check(
        tuple(v.shape) == tuple(k.shape),
        lambda: (
            f"{op}: {n['v']} must have the shape of {n['k']} {list(k.shape)}, got {list(v.shape)}"
        ),
    )
    heads_q, heads_kv, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    torch._check(
        heads_kv > 0 and heads_q % heads_kv == 0,
        lambda: (
            f"{op}: the number of heads of {n['q']} ({heads_q}) must be a multiple of that of {n['k']} and "
            f"{n['v']} ({heads_kv})"
        ),
    )
    torch._check(
        k.shape[-1] == head_dim,
        lambda: (
            f"{op}: {n['k']} must have the head_dim of {n['q']} ({head_dim}), got shape {list(k.shape)}"
        ),
    )
    if q.device.type == "cuda":
        torch._check(
            0 < head_dim <= CUDA_MAX_HEAD_DIM,
            lambda: (
                f"{op}: head_dim {head_dim} of {n['q']} is not supported on CUDA (supported: 1 to "
                f"{CUDA_MAX_HEAD_DIM})"
            ),
        )
    else:
        torch._check(
            head_dim > 0,
            lambda: f"{op}: head_dim of {n['q']} must be > 0, got shape {list(q.shape)}",
        )
    for key in ("q", "k", "v", "out"):
        t = {"q": q, "k": k, "v": v, "out": out}[key]
        if t is None:
            continue
        torch._check(
            _unit_last_stride(t),
            lambda: (
                f"{op}: {n[key]} must have stride 1 along its last dimension (head_dim), got strides "
                f"{list(t.stride())}"
            ),
        )
    if out is not None:
        torch._check(
            tuple(out.shape) == tuple(q.shape),
            lambda: (
                f"{op}: {n['out']} must have the shape of {n['q']} {list(q.shape)}, got {list(out.shape)}"
            ),
        )
    for key, t in (
        ("seqused_k", seqused_k),
        ("kv_batch_idx", kv_batch_idx),
        ("leftpad_k", leftpad_k),
    ):
        if t is not None:
            _check_int32(op, n[key], t, q, f"[{batch}]")
            torch._check(
                t.shape[0] == batch,
                lambda: f"{op}: {n[key]} must have shape [{batch}], got {list(t.shape)}",
            )
    if alibi_slopes is not None:
        _check_device(op, n["alibi_slopes"], alibi_slopes, q)
        torch._check(
            alibi_slopes.dtype == torch.float32,
            lambda: (
                f"{op}: {n['alibi_slopes']} must be float32, got {_dtype_name(alibi_slopes.dtype)}"
            ),
        )
        torch._check(
            (alibi_slopes.dim() == 1 and alibi_slopes.shape[0] == heads_q)
            or (alibi_slopes.dim() == 2 and tuple(alibi_slopes.shape) == (batch, heads_q)),
            lambda: (
                f"{op}: {n['alibi_slopes']} must have shape [num_heads = {heads_q}] or [batch = {batch}, "
                f"num_heads = {heads_q}], got {list(alibi_slopes.shape)}"
            ),
        )


# ---- outputs ----


def output_like(q: torch.Tensor) -> torch.Tensor:
    """An output like q: q's strides when q is dense (flash-attn's empty_like), else contiguous.
    The same rule as torch-ext/attention_ops.cpp `output_like`."""
    if q.is_contiguous() or (q.dim() > 0 and _dense(q)):
        return torch.empty_like(q)
    return q.new_empty(q.shape)


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense (a permutation of a contiguous tensor)."""
    dims = sorted((t.stride(i), t.shape[i]) for i in range(t.dim()) if t.shape[i] != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def lse_like(q: torch.Tensor, varlen: bool) -> torch.Tensor:
    """softmax_lse: [batch, num_heads, seqlen_q], or [num_heads, total_q] for varlen q."""
    if varlen:
        return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def check_sinks(op: str, s_aux: Optional[torch.Tensor], q: torch.Tensor) -> None:
    """s_aux: None, or one floating-point logit per query head on q's device."""
    if s_aux is None:
        return
    if not isinstance(s_aux, torch.Tensor):
        raise TypeError(f"{op}: s_aux must be a tensor or None, got {type(s_aux).__name__}")
    heads = q.shape[-2]
    if s_aux.dim() != 1 or s_aux.shape[0] != heads:
        raise ValueError(
            f"{op}: s_aux must have shape [{heads}] (one sink logit per query head), "
            f"got {list(s_aux.shape)}"
        )
    if not s_aux.is_floating_point():
        raise TypeError(f"{op}: s_aux must be a floating-point tensor, got {s_aux.dtype}")
    if s_aux.device != q.device:
        raise ValueError(f"{op}: s_aux is on {s_aux.device}, q on {q.device}")


def with_sinks(
    out: torch.Tensor, lse: torch.Tensor, s_aux: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of attention whose softmax has one more logit per query head, s_aux[h] (a sink:
    gpt-oss's learned logit with no value; FA3's s_aux), from the kernel's (out, lse) without it.
    With Z = exp(lse), the sink adds exp(s_aux) to each row's sum: lse' = log(Z + exp(s_aux))
    and out' = out * Z / (Z + exp(s_aux)), computed in float32 from lse, so a large sink cannot
    overflow. out (the caller's: a kernel's fresh output) is rescaled in place. A row without
    visible keys (lse +inf by the kernels' convention) gets out 0 and lse' = s_aux. out is
    [B, S, H, D] with lse [B, H, S], or packed [T, H, D] with lse [H, T]. lse is float32
    (flash-attn's), so in float64 the result is as exact as float32."""
    work = torch.promote_types(out.dtype, torch.float32)
    sink = s_aux.to(work).view(-1, 1)
    lse = lse.to(work).masked_fill(lse == float("inf"), float("-inf"))
    lse_sinks = torch.logaddexp(lse, sink)
    keep = torch.exp(lse - lse_sinks).transpose(-1, -2).unsqueeze(-1)
    # In place on the kernel's fresh output: one pass that multiplies in float32 and rounds once.
    return out.mul_(keep), lse_sinks.float()


def sink_grad(
    grad_out: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, s_aux: torch.Tensor
) -> torch.Tensor:
    """d loss / d s_aux from with_sinks' (out, lse): the sink's probability in a row is
    exp(s_aux - lse), its value 0, so its softmax gradient is -exp(s_aux - lse) * rowsum(grad_out
    * out), summed over the rows of each head."""
    work = torch.promote_types(out.dtype, torch.float32)
    rowdot = (grad_out.to(work) * out.to(work)).sum(-1).transpose(-1, -2)  # lse's layout
    d = -torch.exp(s_aux.to(work).view(-1, 1) - lse) * rowdot
    return d.movedim(-2, 0).reshape(s_aux.shape[0], -1).sum(1).to(s_aux.dtype)


# ---- fakes of the C++ ops ----


@torch.library.register_fake(add_op_namespace_prefix("attn_fwd"))
def _attn_fwd_fake(
    out,
    q,
    k,
    v,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    seqused_k,
    block_table,
    kv_batch_idx,
    leftpad_k,
    alibi_slopes,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale,
    softcap,
    causal,
    window_left,
    window_right,
    num_splits,
    enable_pdl=None,
):
    check_attention(
        "attn_fwd",
        q,
        k,
        v,
        out,
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_k,
        block_table,
        kv_batch_idx,
        leftpad_k,
        alibi_slopes,
    )


def check_backward(op, dq, dk, dv, dout, q, k, v, out, cu_seqlens_q, cu_seqlens_k, alibi_slopes):
    """The checks of the backward ops' fakes: the forward's call, then each gradient against the
    tensor it is the gradient of."""
    check_attention(
        op, q, k, v, out, cu_seqlens_q, cu_seqlens_k, None, None, None, None, alibi_slopes
    )
    for name, grad, of_name, of in (
        ("dout", dout, "out", out),
        ("dq", dq, "q", q),
        ("dk", dk, "k", k),
        ("dv", dv, "v", v),
    ):
        torch._check(
            grad is None or (grad.shape == of.shape and grad.dtype == of.dtype),
            lambda: f"{op}: {name} must have the shape and dtype of {of_name}",
        )


@torch.library.register_fake(add_op_namespace_prefix("attn_bwd"))
def _attn_bwd_fake(
    dq,
    dk,
    dv,
    dout,
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    alibi_slopes,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale,
    softcap,
    causal,
    window_left,
    window_right,
    deterministic,
):
    check_backward(
        "attn_bwd", dq, dk, dv, dout, q, k, v, out, cu_seqlens_q, cu_seqlens_k, alibi_slopes
    )


def _low_level_grads(dq, dk, dv, q, k, v, varlen):
    """(dq, dk, dv, softmax_d) of bwd / varlen_bwd: the given gradients, else new ones."""
    return (
        dq if dq is not None else torch.empty_like(q),
        dk if dk is not None else torch.empty_like(k),
        dv if dv is not None else torch.empty_like(v),
        lse_like(q, varlen),
    )


@torch.library.register_fake(add_op_namespace_prefix("bwd"))
def _bwd_fake(dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes, *options):
    check_backward("bwd", dq, dk, dv, dout, q, k, v, out, None, None, alibi_slopes)
    return _low_level_grads(dq, dk, dv, q, k, v, False)


@torch.library.register_fake(add_op_namespace_prefix("varlen_bwd"))
def _varlen_bwd_fake(
    dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *options
):
    check_backward(
        "varlen_bwd", dq, dk, dv, dout, q, k, v, out, cu_seqlens_q, cu_seqlens_k, alibi_slopes
    )
    return _low_level_grads(dq, dk, dv, q, k, v, True)


@torch.library.register_fake(add_op_namespace_prefix("fwd"))
def _fwd_fake(
    q,
    k,
    v,
    out,
    alibi_slopes,
    p_dropout,
    softmax_scale,
    is_causal,
    window_size_left,
    window_size_right,
    softcap,
    return_softmax,
    gen,
    enable_pdl=None,
):
    check_attention("fwd", q, k, v, out, alibi_slopes=alibi_slopes)
    return out if out is not None else output_like(q), lse_like(q, False)


@torch.library.register_fake(add_op_namespace_prefix("varlen_fwd"))
def _varlen_fwd_fake(
    q,
    k,
    v,
    out,
    cu_seqlens_q,
    cu_seqlens_k,
    seqused_k,
    leftpad_k,
    block_table,
    alibi_slopes,
    max_seqlen_q,
    max_seqlen_k,
    p_dropout,
    softmax_scale,
    zero_tensors,
    is_causal,
    window_size_left,
    window_size_right,
    softcap,
    return_softmax,
    gen,
    enable_pdl=None,
):
    check_attention(
        "varlen_fwd",
        q,
        k,
        v,
        out,
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_k,
        block_table,
        None,
        leftpad_k,
        alibi_slopes,
    )
    return out if out is not None else output_like(q), lse_like(q, True)


KVCACHE_NAMES = {
    "k": "k_cache",
    "v": "v_cache",
    "seqused_k": "cache_seqlens",
    "kv_batch_idx": "cache_batch_idx",
    "leftpad_k": "cache_leftpad",
}


@torch.library.register_fake(add_op_namespace_prefix("fwd_kvcache"))
def _fwd_kvcache_fake(
    q,
    k_cache,
    v_cache,
    k,
    v,
    cache_seqlens,
    rotary_cos,
    rotary_sin,
    cache_batch_idx,
    cache_leftpad,
    block_table,
    alibi_slopes,
    out,
    softmax_scale,
    is_causal,
    window_size_left,
    window_size_right,
    softcap,
    rotary_interleaved,
    num_splits,
    enable_pdl=None,
):
    check_attention(
        "fwd_kvcache",
        q,
        k_cache,
        v_cache,
        out,
        None,
        None,
        cache_seqlens,
        block_table,
        cache_batch_idx,
        cache_leftpad,
        alibi_slopes,
        names=KVCACHE_NAMES,
    )
    return out if out is not None else output_like(q), lse_like(q, False)


def _check_cache_write(op, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype):
    if kv_cache_dtype != "auto":
        raise NotImplementedError(
            f"{op}: kv_cache_dtype '{kv_cache_dtype}' is not supported (only 'auto': the caches have the dtype of key)"
        )
    torch._check(
        key.dim() == 3,
        lambda: (
            f"{op}: key must have shape [num_tokens, num_heads, head_size], got {list(key.shape)}"
        ),
    )
    for name, t in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        _check_device(op, name, t, key, "key")
        torch._check(
            t.dtype == key.dtype,
            lambda: (
                f"{op}: {name} must have the dtype of key (expected {_dtype_name(key.dtype)}, got {_dtype_name(t.dtype)})"
            ),
        )
    torch._check(
        slot_mapping.dtype in (torch.int64, torch.int32),
        lambda: f"{op}: slot_mapping must be int64 or int32, got {_dtype_name(slot_mapping.dtype)}",
    )


@torch.library.register_fake(add_op_namespace_prefix("reshape_and_cache"))
def _reshape_and_cache_fake(
    key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale
):
    _check_cache_write(
        "reshape_and_cache", key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype
    )


@torch.library.register_fake(add_op_namespace_prefix("reshape_and_cache_flash"))
def _reshape_and_cache_flash_fake(
    key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale
):
    _check_cache_write(
        "reshape_and_cache_flash", key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype
    )


# ---- the allocating forward op behind the Python API ----


def _attn_func_body(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    seqused_k,
    block_table,
    kv_batch_idx,
    leftpad_k,
    alibi_slopes,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale,
    softcap,
    causal,
    window_left,
    window_right,
    num_splits,
    enable_pdl=None,
    deterministic=False,
    s_aux=None,
):
    # deterministic is the backward's (_backward_through below); the forward is deterministic anyway.
    out = output_like(q)
    lse = lse_like(q, cu_seqlens_q is not None)
    ops.attn_fwd(
        out,
        q,
        k,
        v,
        lse,
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_k,
        block_table,
        kv_batch_idx,
        leftpad_k,
        alibi_slopes,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        softcap,
        causal,
        window_left,
        window_right,
        num_splits,
        enable_pdl,
    )
    if s_aux is not None:
        return with_sinks(out, lse, s_aux)
    return out, lse


# The allocating op: what torch.compile and dispatch modes see. Eager calls take its body, under
# its autograd formula where autograd records them (_attn_func_routes).
_attn_func = torch.library.custom_op(
    add_op_namespace_prefix("attn_func"),
    _attn_func_body,
    mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? seqused_k, "
    "Tensor? block_table, Tensor? kv_batch_idx, Tensor? leftpad_k, Tensor? alibi_slopes, int max_seqlen_q, "
    "int max_seqlen_k, float softmax_scale, float softcap, bool causal, int window_left, int window_right, "
    "int num_splits, bool? enable_pdl=None, bool deterministic=False, Tensor? s_aux=None) -> (Tensor, Tensor)",
)


@torch.library.register_fake(add_op_namespace_prefix("attn_func"))
def _attn_func_fake(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    seqused_k,
    block_table,
    kv_batch_idx,
    leftpad_k,
    alibi_slopes,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale,
    softcap,
    causal,
    window_left,
    window_right,
    num_splits,
    enable_pdl=None,
    deterministic=False,
    s_aux=None,
):
    check_sinks("attn_func", s_aux, q)
    check_attention(
        "attn_func",
        q,
        k,
        v,
        None,
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_k,
        block_table,
        kv_batch_idx,
        leftpad_k,
        alibi_slopes,
    )
    return output_like(q), lse_like(q, cu_seqlens_q is not None)


INFERENCE_ONLY_MESSAGE = (
    "attention: the backward pass does not cover seqused_k, block_table, kv_batch_idx or leftpad_k "
    "(KV-cache and paged forms are inference-only); run them under torch.no_grad()"
)


@torch.library.custom_op(add_op_namespace_prefix("attn_backward_unsupported"), mutates_args=())
def _attn_backward_unsupported(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of attn_func where there is none (the KV-cache and paged forms): raises when
    it runs. An op rather than a bare raise, so that torch.compile (whose AOT autograd traces the
    backward while compiling the forward) still compiles a forward whose inputs require grad; the
    compiled backward raises when it runs. It takes grad_out so that the partitioner cannot move
    it into the forward graph. (Where the C++ backward cannot run, as for a CUDA head dim past
    what the device's shared memory holds, attn_bwd itself raises NotImplementedError, saying
    why.)"""
    raise NotImplementedError(INFERENCE_ONLY_MESSAGE)


@torch.library.register_fake(add_op_namespace_prefix("attn_backward_unsupported"))
def _attn_backward_unsupported_fake(grad_out, q, k, v):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attn_func_backward_body(grad_out, q, k, v, out, *lse_and_options):
    """(dq, dk, dv) of attn_func through the C++ attn_bwd, whose arguments after out are this
    op's (deterministic last: on CUDA, False adds dQ into a workspace in a varying order, True
    runs a dQ pass)."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ops.attn_bwd(dq, dk, dv, grad_out.contiguous(), q, k, v, out, *lse_and_options)
    return dq, dk, dv


_attn_func_backward = torch.library.custom_op(
    add_op_namespace_prefix("attn_func_backward"),
    _attn_func_backward_body,
    mutates_args=(),
    schema="(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? cu_seqlens_q, "
    "Tensor? cu_seqlens_k, Tensor? alibi_slopes, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
    "float softcap, bool causal, int window_left, int window_right, bool deterministic) -> "
    "(Tensor, Tensor, Tensor)",
)


@torch.library.register_fake(add_op_namespace_prefix("attn_func_backward"))
def _attn_func_backward_fake(grad_out, q, k, v, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# attn_func's inputs, by position (its schema above).
_CU_Q, _CU_K, _SEQUSED, _TABLE, _KV_IDX, _LEFTPAD, _ALIBI = range(3, 10)
_MAX_Q, _MAX_K, _SCALE, _SOFTCAP, _CAUSAL, _LEFT, _RIGHT = range(10, 17)
_DETERMINISTIC = 19  # after num_splits and enable_pdl, which only the forward takes
_SINKS = 20


def _backward_through(attn_backward):
    """attn_func's backward formula, its gradients computed by `attn_backward`: the custom op
    (what AOT autograd traces) or, in eager autograd, that op's body."""

    def backward(ctx, grad_out, grad_lse):
        # The gradient of lse is not propagated (flash-attn's backward ignores it too). With
        # sinks, out and lse are those of the softmax that includes them (with_sinks), which is
        # all the kernels' backward needs for dq, dk and dv.
        q, k, v, out, lse, cu_q, cu_k, alibi, sinks = ctx.saved_tensors
        if ctx.paged:
            dq, dk, dv = _attn_backward_unsupported(grad_out, q, k, v)
        else:
            dq, dk, dv = attn_backward(
                grad_out, q, k, v, out, lse, *ctx.optional(cu_q, cu_k, alibi), *ctx.scalars
            )
        d_sinks = sink_grad(grad_out, out, lse, sinks) if ctx.has_sinks else None
        return (dq, dk, dv) + (None,) * 17 + (d_sinks,)

    return backward


def _setup_context(ctx, inputs, output):
    present = [inputs[i] is not None for i in (_CU_Q, _CU_K, _ALIBI)]
    placeholder = inputs[0].new_empty(0)  # save_for_backward takes tensors, not None
    optional = (_CU_Q, _CU_K, _ALIBI, _SINKS)
    saved = [inputs[i] if inputs[i] is not None else placeholder for i in optional]
    ctx.save_for_backward(*inputs[:3], *output, *saved)
    ctx.has_sinks = inputs[_SINKS] is not None
    ctx.optional = lambda *ts: [t if p else None for t, p in zip(ts, present)]
    ctx.paged = any(inputs[i] is not None for i in (_SEQUSED, _TABLE, _KV_IDX, _LEFTPAD))
    ctx.scalars = [inputs[i] for i in (*range(_MAX_Q, _RIGHT + 1), _DETERMINISTIC)]


# attn_func's autograd formula and the route of each call (_eager_path.OpRoutes): eager autograd
# takes the op's body and formula, the gradients computed by the backward op's body (its op
# under create_graph).
_attn_func_routes = OpRoutes(
    "AttnFuncEager",
    _attn_func,
    _attn_func_body,
    _setup_context,
    _backward_through,
    _attn_func_backward,
    _attn_func_backward_body,
)


def attention(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    kv_batch_idx: Optional[torch.Tensor] = None,
    leftpad_k: Optional[torch.Tensor] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    softmax_scale: Optional[float] = None,
    softcap: float = 0.0,
    causal: bool = False,
    window_size=(-1, -1),
    num_splits: int = 0,
    dropout_p: float = 0.0,
    enable_pdl: Optional[bool] = None,
    deterministic: bool = False,
    s_aux: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, softmax_lse) of the general forward, differentiable through attn_bwd (the paged and
    KV-cache forms raise NotImplementedError in the backward: inference-only). ``deterministic``
    is the backward's: on CUDA False (flash-attn's default) adds dQ into a workspace in a varying
    order, True computes it in a pass of its own, the same bits on every run; the CPU is
    deterministic either way. ``s_aux``: attention sinks (with_sinks), differentiable too."""
    if dropout_p is not None and float(dropout_p) > 0.0:
        raise NotImplementedError(
            f"{op}: dropout_p = {dropout_p} is not implemented: this kernel is forward-only without dropout "
            "(pass dropout_p=0.0; transformers does so in eval mode)"
        )
    left, right = window(op, window_size)
    scale = softmax_scale_of(q, softmax_scale)
    check_sinks(op, s_aux, q)
    tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, kv_batch_idx)
    forward = _attn_func_routes.pick(*tensors, leftpad_k, alibi_slopes, s_aux)
    return forward(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_k,
        block_table,
        kv_batch_idx,
        leftpad_k,
        alibi_slopes,
        as_int(max_seqlen_q),
        as_int(max_seqlen_k),
        scale,
        float(softcap or 0.0),
        bool(causal),
        left,
        right,
        int(num_splits),
        enable_pdl,
        bool(deterministic),
        s_aux,
    )


def as_int(x) -> int:
    """max_seqlen as an int (transformers may pass a 0-d tensor)."""
    return int(x.item()) if isinstance(x, torch.Tensor) else int(x)


def softmax_scale_of(q: torch.Tensor, softmax_scale: Optional[float]) -> float:
    """softmax_scale, or flash-attn's default head_dim ** -0.5 with q's own head dim (also where
    CUDA pads it). A head dim of 0 gets 1.0 here, so that the op's check names q."""
    if softmax_scale is not None:
        return float(softmax_scale)
    return q.shape[-1] ** -0.5 if q.shape[-1] > 0 else 1.0


def window(op: str, window_size) -> Tuple[int, int]:
    """flash-attn's window_size (left, right): -1 (or None, FA3 / FA4 style) = unbounded."""
    if window_size is None:
        return -1, -1
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(
            f"{op}: window_size must be a pair (left, right), got {window_size!r}"
        ) from None
    left = -1 if left is None or left < 0 else int(left)
    right = -1 if right is None or right < 0 else int(right)
    return left, right
