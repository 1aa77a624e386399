"""Fake kernels, the differentiable custom op and autograd for the C++ rope ops (private).

The C++ library (torch_binding.cpp) defines ops that return nothing: `rotary_embedding` and
`batched_rotary_embedding` (vLLM, in place), `rope_inplace` and `rope_out` (the general forms of
kernel_src/rope_params.h) and `apply_rotary` (kernels-community, out-param halves). This module
adds:

* a fake kernel for each of them, so that torch.compile (fullgraph) traces the calls. The fakes
  check what the C++ layer checks about dtypes, devices, shapes and rot_dim, with messages that
  start with the op name and name the argument (RuntimeError through torch._check), so bad
  calls fail at trace time too. Strides, overlaps and row values are checked at run time only;
* the allocating custom op `rope_functional` (over `rope_out`) with its fake and its autograd
  formula: the gradient w.r.t. q and k is the same op with `transpose` flipped (the adjoint);
  gradients w.r.t. cos and sin, when they require grad, come from a plain PyTorch formula in
  fp32 (`table_grads`: correct, not fast);
* `rope`, the differentiable entry point of the Python API (out of place, or in place through
  the mutating op when autograd is not involved), and the convention helpers `transformers_rope`
  and `ltx_rope` that `__init__.py` and `layers.py` call.

Shapes are symbolic-friendly (no Python branching on token counts), so compiled graphs do not
specialize on the number of tokens.
"""

from typing import Optional, Tuple

import torch

from . import _reference
from ._eager_path import OpRoutes
from ._ops import add_op_namespace_prefix, ops

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int64, torch.int32)


def _dtype_name(dtype: torch.dtype) -> str:
    """The dtype without the "torch." prefix, as the C++ messages print it."""
    return str(dtype).replace("torch.", "")


# ---- checks shared by the fakes (RuntimeError through torch._check, like the C++ layer) ----


def _check_device(op: str, name: str, t: torch.Tensor, ref: torch.Tensor, ref_name: str) -> None:
    torch._check(
        t.device == ref.device,
        lambda: (
            f"{op}: {name} must be on the device of {ref_name} (expected {ref.device}, got {t.device})"
        ),
    )


def _check_dtype(op: str, name: str, t: torch.Tensor, ref: torch.Tensor, ref_name: str) -> None:
    torch._check(
        t.dtype == ref.dtype,
        lambda: (
            f"{op}: {name} must have the dtype of {ref_name} (expected {_dtype_name(ref.dtype)}, got "
            f"{_dtype_name(t.dtype)})"
        ),
    )


def _check_shape(op: str, name: str, t: torch.Tensor, ref: torch.Tensor, ref_name: str) -> None:
    torch._check(
        tuple(t.shape) == tuple(ref.shape),
        lambda: (
            f"{op}: {name} must have the shape of {ref_name} {list(ref.shape)}, got {list(t.shape)}"
        ),
    )


def _check_core(
    op: str,
    q: torch.Tensor,
    q_out: torch.Tensor,
    k: Optional[torch.Tensor],
    k_out: Optional[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: Optional[torch.Tensor],
    seqlen_offsets: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    seqlen_offset: int,
    rot_dim: int,
    full_table: bool,
    names: Tuple[str, str, str, str] = ("q", "q_out", "k", "k_out"),
    table_names: Tuple[str, str] = ("cos", "sin"),
    rot_name: str = "rot_dim",
    positions_name: str = "positions",
) -> None:
    """The checks of rope_ops.cpp `run` on 4-D views (q [B, S, Hq, D], cos [TB, R, TH, W])."""
    nq, nqo, nk, nko = names
    ncos, nsin = table_names
    torch._check(
        q.dim() == 4,
        lambda: f"{op}: {nq} must have 4 dimensions [B, S, Hq, D], got shape {list(q.shape)}",
    )
    torch._check(
        q.dtype in KERNEL_DTYPES,
        lambda: f"{op}: {nq} must be float32, float16 or bfloat16, got {_dtype_name(q.dtype)}",
    )
    batch, seqlen, heads_q, head_dim = q.shape
    _check_device(op, nqo, q_out, q, nq)
    _check_dtype(op, nqo, q_out, q, nq)
    _check_shape(op, nqo, q_out, q, nq)
    torch._check(
        (k is None) == (k_out is None),
        lambda: (
            f"{op}: {nk} and {nko} must be given together or not at all, got {nk if k is not None else nko} only"
        ),
    )
    heads_k = None
    if k is not None:
        torch._check(
            k.dim() == 4,
            lambda: f"{op}: {nk} must have 4 dimensions [B, S, Hk, D], got shape {list(k.shape)}",
        )
        _check_device(op, nk, k, q, nq)
        _check_dtype(op, nk, k, q, nq)
        torch._check(
            k.shape[0] == batch and k.shape[1] == seqlen and k.shape[3] == head_dim,
            lambda: (
                f"{op}: {nk} must have shape [{batch}, {seqlen}, Hk, {head_dim}] (the batch, sequence and "
                f"head_dim of {nq}), got {list(k.shape)}"
            ),
        )
        _check_device(op, nko, k_out, q, nq)
        _check_dtype(op, nko, k_out, k, nk)
        _check_shape(op, nko, k_out, k, nk)
        heads_k = k.shape[2]
    torch._check(
        rot_dim > 0 and rot_dim % 2 == 0 and rot_dim <= head_dim,
        lambda: f"{op}: {rot_name} must be even, > 0 and <= head_dim ({head_dim}), got {rot_dim}",
    )
    _check_device(op, ncos, cos, q, nq)
    _check_device(op, nsin, sin, q, nq)
    torch._check(
        cos.dim() == 4,
        lambda: f"{op}: {ncos} must have 4 dimensions [TB, R, TH, W], got shape {list(cos.shape)}",
    )
    _check_shape(op, nsin, sin, cos, ncos)
    _check_dtype(op, nsin, sin, cos, ncos)
    torch._check(
        cos.dtype == torch.float32 or cos.dtype == q.dtype,
        lambda: (
            f"{op}: {ncos} must be float32 or have the dtype of {nq} ({_dtype_name(q.dtype)}), got {_dtype_name(cos.dtype)}"
        ),
    )
    width = rot_dim if full_table else rot_dim // 2
    torch._check(
        cos.shape[0] == 1 or cos.shape[0] == batch,
        lambda: (
            f"{op}: {ncos} must have 1 or B = {batch} entries along its first dimension (one table for all "
            f"sequences or one per sequence), got shape {list(cos.shape)}"
        ),
    )
    torch._check(
        cos.shape[2] == 1 or (cos.shape[2] == heads_q and (heads_k is None or heads_k == heads_q)),
        lambda: (
            f"{op}: {ncos} must have 1 entry along its third dimension (one table for all heads) or one per "
            f"head of {nq}"
            + (f" and {nk}" if k is not None else "")
            + f", got shape {list(cos.shape)}"
        ),
    )
    torch._check(
        cos.shape[3] == width,
        lambda: (
            f"{op}: {ncos} must have {width} columns ("
            + ("rot_dim: one per rotated channel" if full_table else "rot_dim / 2: one per pair")
            + f", rot_dim = {rot_dim}), got shape {list(cos.shape)}"
        ),
    )
    torch._check(
        positions is None or cu_seqlens is None,
        lambda: f"{op}: give {positions_name} or cu_seqlens, not both",
    )
    if positions is not None:
        _check_device(op, positions_name, positions, q, nq)
        torch._check(
            positions.dtype in _INDEX_DTYPES,
            lambda: (
                f"{op}: {positions_name} must be int64 or int32, got {_dtype_name(positions.dtype)}"
            ),
        )
        torch._check(
            positions.dim() == 2 and positions.shape[0] == batch and positions.shape[1] == seqlen,
            lambda: (
                f"{op}: {positions_name} must have shape [{batch}, {seqlen}] ([B, S]), got {list(positions.shape)}"
            ),
        )
        torch._check(
            seqlen_offsets is None and seqlen_offset == 0,
            lambda: (
                f"{op}: {positions_name} give the table rows; seqlen_offsets and seqlen_offset "
                f"({seqlen_offset}) must be None and 0 with it"
            ),
        )
    expected_offsets = batch
    if cu_seqlens is not None:
        _check_device(op, "cu_seqlens", cu_seqlens, q, nq)
        torch._check(
            cu_seqlens.dtype == torch.int32,
            lambda: f"{op}: cu_seqlens must be int32, got {_dtype_name(cu_seqlens.dtype)}",
        )
        torch._check(
            cu_seqlens.dim() == 1 and cu_seqlens.shape[0] >= 1,
            lambda: (
                f"{op}: cu_seqlens must have shape [num_seqs + 1], got {list(cu_seqlens.shape)}"
            ),
        )
        torch._check(
            batch == 1,
            lambda: (
                f"{op}: with cu_seqlens (varlen), {nq} must hold the packed tokens as [1, total_tokens, H, D], "
                f"got shape {list(q.shape)}"
            ),
        )
        expected_offsets = cu_seqlens.shape[0] - 1
    if seqlen_offsets is not None:
        _check_device(op, "seqlen_offsets", seqlen_offsets, q, nq)
        torch._check(
            seqlen_offsets.dtype == torch.int32,
            lambda: f"{op}: seqlen_offsets must be int32, got {_dtype_name(seqlen_offsets.dtype)}",
        )
        torch._check(
            seqlen_offsets.dim() == 1 and seqlen_offsets.shape[0] == expected_offsets,
            lambda: (
                f"{op}: seqlen_offsets must have shape [{expected_offsets}] (one offset per "
                + ("sequence of cu_seqlens" if cu_seqlens is not None else "batch")
                + f"), got {list(seqlen_offsets.shape)}"
            ),
        )


def _vllm_view(
    op: str, name: str, t: torch.Tensor, positions: torch.Tensor, head_size: int
) -> torch.Tensor:
    """query / key of the vLLM convention as a [B, S, H, D] view (rope_ops.cpp `vllm_view`)."""
    lead = positions.dim()
    torch._check(
        t.dim() == lead + 1 or t.dim() == lead + 2,
        lambda: (
            f"{op}: {name} must have shape "
            + (
                "[T, H * head_size] or [T, H, head_size]"
                if lead == 1
                else "[B, S, H * head_size] or [B, S, H, head_size]"
            )
            + f" (the leading dimensions of positions, {list(positions.shape)}), got {list(t.shape)}"
        ),
    )
    torch._check(
        tuple(t.shape[:lead]) == tuple(positions.shape),
        lambda: (
            f"{op}: {name} must have the leading dimensions of positions {list(positions.shape)}, got shape {list(t.shape)}"
        ),
    )
    if t.dim() == lead + 1:
        torch._check(
            t.shape[-1] % head_size == 0,
            lambda: (
                f"{op}: {name}.size(-1) = {t.shape[-1]} must be a multiple of head_size = {head_size} ([..., H * head_size])"
            ),
        )
        v = t.unflatten(-1, (t.shape[-1] // head_size, head_size))
    else:
        torch._check(
            t.shape[-1] == head_size,
            lambda: (
                f"{op}: {name} must have head_size = {head_size} channels per head ([..., H, head_size]), got shape {list(t.shape)}"
            ),
        )
        v = t
    return v.unsqueeze(0) if lead == 1 else v


def _check_vllm(op, positions, query, key, head_size, cos_sin_cache, positions_name="positions"):
    torch._check(head_size > 0, lambda: f"{op}: head_size must be > 0, got {head_size}")
    torch._check(
        positions.dim() in (1, 2),
        lambda: f"{op}: positions must have shape [T] or [B, S], got {list(positions.shape)}",
    )
    torch._check(
        cos_sin_cache.dim() == 2,
        lambda: (
            f"{op}: cos_sin_cache must have shape [max_position, rot_dim] (cat(cos, sin)), got {list(cos_sin_cache.shape)}"
        ),
    )
    rot_dim = cos_sin_cache.shape[1]
    torch._check(
        rot_dim > 0 and rot_dim % 2 == 0 and rot_dim <= head_size,
        lambda: (
            f"{op}: cos_sin_cache must have an even number of columns rot_dim (cat(cos, sin)), > 0 and <= "
            f"head_size = {head_size}, got shape {list(cos_sin_cache.shape)}"
        ),
    )
    q4 = _vllm_view(op, "query", query, positions, head_size)
    k4 = None if key is None else _vllm_view(op, "key", key, positions, head_size)
    half = rot_dim // 2
    cos = cos_sin_cache[:, :half][None, :, None, :]
    sin = cos_sin_cache[:, half:][None, :, None, :]
    pos2 = positions.unsqueeze(0) if positions.dim() == 1 else positions
    _check_core(
        op,
        q4,
        q4,
        k4,
        k4,
        cos,
        sin,
        pos2,
        None,
        None,
        0,
        rot_dim,
        False,
        names=("query", "query", "key", "key"),
        table_names=("cos_sin_cache", "cos_sin_cache"),
        rot_name="rot_dim (cos_sin_cache.size(1))",
        positions_name=positions_name,
    )


# ---- fakes of the C++ ops (they return nothing: validate only) ----


@torch.library.register_fake(add_op_namespace_prefix("rotary_embedding"))
def _rotary_embedding_fake(
    positions, query, key, head_size, cos_sin_cache, is_neox, enable_pdl=None
):
    _check_vllm("rotary_embedding", positions, query, key, head_size, cos_sin_cache)


@torch.library.register_fake(add_op_namespace_prefix("batched_rotary_embedding"))
def _batched_rotary_embedding_fake(
    positions,
    query,
    key,
    head_size,
    cos_sin_cache,
    is_neox,
    rot_dim,
    cos_sin_cache_offsets,
    enable_pdl=None,
):
    op = "batched_rotary_embedding"
    torch._check(
        cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == rot_dim,
        lambda: (
            f"{op}: cos_sin_cache must have shape [max_position, rot_dim = {rot_dim}], got {list(cos_sin_cache.shape)}"
        ),
    )
    torch._check(
        positions.dtype in _INDEX_DTYPES,
        lambda: f"{op}: positions must be int64 or int32, got {_dtype_name(positions.dtype)}",
    )
    _check_device(op, "cos_sin_cache_offsets", cos_sin_cache_offsets, positions, "positions")
    torch._check(
        cos_sin_cache_offsets.dtype in _INDEX_DTYPES,
        lambda: (
            f"{op}: cos_sin_cache_offsets must be int64 or int32, got {_dtype_name(cos_sin_cache_offsets.dtype)}"
        ),
    )
    torch._check(
        cos_sin_cache_offsets.numel() == positions.numel(),
        lambda: (
            f"{op}: cos_sin_cache_offsets must hold one offset per token ({positions.numel()}, the elements of "
            f"positions), got shape {list(cos_sin_cache_offsets.shape)}"
        ),
    )
    _check_vllm(
        op, positions, query, key, head_size, cos_sin_cache, "positions + cos_sin_cache_offsets"
    )


@torch.library.register_fake(add_op_namespace_prefix("rope_inplace"))
def _rope_inplace_fake(
    q,
    k,
    cos,
    sin,
    positions,
    seqlen_offsets,
    cu_seqlens,
    seqlen_offset,
    rot_dim,
    interleaved,
    full_table,
    transpose,
    enable_pdl=None,
):
    _check_core(
        "rope_inplace",
        q,
        q,
        k,
        k,
        cos,
        sin,
        positions,
        seqlen_offsets,
        cu_seqlens,
        seqlen_offset,
        rot_dim,
        full_table,
        names=("q", "q", "k", "k"),
    )


@torch.library.register_fake(add_op_namespace_prefix("rope_out"))
def _rope_out_fake(
    q_out,
    q,
    k_out,
    k,
    cos,
    sin,
    positions,
    seqlen_offsets,
    cu_seqlens,
    seqlen_offset,
    rot_dim,
    interleaved,
    full_table,
    transpose,
    enable_pdl=None,
):
    _check_core(
        "rope_out",
        q,
        q_out,
        k,
        k_out,
        cos,
        sin,
        positions,
        seqlen_offsets,
        cu_seqlens,
        seqlen_offset,
        rot_dim,
        full_table,
    )


@torch.library.register_fake(add_op_namespace_prefix("apply_rotary"))
def _apply_rotary_fake(x1, x2, cos, sin, out1, out2, conj, enable_pdl=None):
    op = "apply_rotary"
    torch._check(
        x1.dtype in KERNEL_DTYPES or x1.dtype == torch.float64,
        lambda: (
            f"{op}: x1 must be float32, float16, bfloat16 or float64, got {_dtype_name(x1.dtype)}"
        ),
    )
    torch._check(
        x1.dim() >= 1, lambda: f"{op}: x1 must have at least one dimension, got a 0-d tensor"
    )
    for name, t in (("x2", x2), ("out1", out1), ("out2", out2)):
        _check_device(op, name, t, x1, "x1")
        _check_dtype(op, name, t, x1, "x1")
        _check_shape(op, name, t, x1, "x1")
    for name, t in (("cos", cos), ("sin", sin)):
        _check_device(op, name, t, x1, "x1")
        torch._check(
            t.dtype.is_floating_point,
            lambda: f"{op}: {name} must be a floating-point tensor, got {_dtype_name(t.dtype)}",
        )
        torch._check(
            t.dim() <= x1.dim()
            and all(t.shape[-i] == 1 or t.shape[-i] == x1.shape[-i] for i in range(1, t.dim() + 1)),
            lambda: (
                f"{op}: {name} must broadcast to the shape of x1 {list(x1.shape)}, got {list(t.shape)}"
            ),
        )


# ---- the allocating, differentiable custom op ----


def _empty_like(t: torch.Tensor) -> torch.Tensor:
    """An output for `t`: its layout (empty_like keeps a dense tensor's strides, so a [B, S, H, D]
    view of a [B, H, S, D] tensor gives a [B, H, S, D]-contiguous result, as eager PyTorch does),
    or contiguous when that layout has no unit stride along head_dim."""
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    return torch.empty_like(t)


@torch.library.custom_op(
    add_op_namespace_prefix("rope_functional"),
    mutates_args=(),
    schema="(Tensor q, Tensor? k, Tensor cos, Tensor sin, Tensor? positions, Tensor? seqlen_offsets, "
    "Tensor? cu_seqlens, int seqlen_offset, int rot_dim, bool interleaved, bool full_table, bool transpose, "
    "bool? enable_pdl=None) -> (Tensor, Tensor?)",
)
def _rope_functional(
    q,
    k,
    cos,
    sin,
    positions,
    seqlen_offsets,
    cu_seqlens,
    seqlen_offset,
    rot_dim,
    interleaved,
    full_table,
    transpose,
    enable_pdl=None,
):
    return _rope_allocating(
        q,
        k,
        cos,
        sin,
        positions,
        seqlen_offsets,
        cu_seqlens,
        seqlen_offset,
        rot_dim,
        interleaved,
        full_table,
        transpose,
        enable_pdl,
    )


def _rope_allocating(
    q,
    k,
    cos,
    sin,
    positions,
    seqlen_offsets,
    cu_seqlens,
    seqlen_offset,
    rot_dim,
    interleaved,
    full_table,
    transpose,
    enable_pdl=None,
):
    """New outputs (q's and k's layouts) written by the out-param op: the body of rope_functional,
    and the eager inference path of `rope`, which skips the custom op's dispatch layers."""
    q_out = _empty_like(q)
    k_out = None if k is None else _empty_like(k)
    ops.rope_out(
        q_out,
        q,
        k_out,
        k,
        cos,
        sin,
        positions,
        seqlen_offsets,
        cu_seqlens,
        seqlen_offset,
        rot_dim,
        interleaved,
        full_table,
        transpose,
        enable_pdl,
    )
    return q_out, k_out


@torch.library.register_fake(add_op_namespace_prefix("rope_functional"))
def _rope_functional_fake(
    q,
    k,
    cos,
    sin,
    positions,
    seqlen_offsets,
    cu_seqlens,
    seqlen_offset,
    rot_dim,
    interleaved,
    full_table,
    transpose,
    enable_pdl=None,
):
    q_out = _empty_like(q) if q.dim() == 4 else q.new_empty(q.shape)
    k_out = None if k is None else (_empty_like(k) if k.dim() == 4 else k.new_empty(k.shape))
    _check_core(
        "rope_functional",
        q,
        q_out,
        k,
        k_out,
        cos,
        sin,
        positions,
        seqlen_offsets,
        cu_seqlens,
        seqlen_offset,
        rot_dim,
        full_table,
        names=("q", "q", "k", "k"),
    )
    return q_out, k_out


def table_grads(
    q: torch.Tensor,
    k: Optional[torch.Tensor],
    grad_q: torch.Tensor,
    grad_k: Optional[torch.Tensor],
    table: torch.Tensor,
    positions: Optional[torch.Tensor],
    seqlen_offsets: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    seqlen_offset: int,
    rot_dim: int,
    interleaved: bool,
    full_table: bool,
    transpose: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. cos and sin ``[TB, R, TH, W]`` (fp32, the table's shape) of the rotation
    of q (and k) whose outputs received ``grad_q`` (``grad_k``). Plain PyTorch, fp32.

    Per pair, forward ``a' = a ca - b sa, b' = b cb + a sb``: d/dca = ga a, d/dsa = -ga b,
    d/dcb = gb b, d/dsb = gb a; transpose ``a' = a ca + b sb, b' = b cb - a sa``: d/dca = ga a,
    d/dsb = ga b, d/dcb = gb b, d/dsa = -gb a. A half table has ca = cb, sa = sb (the two terms
    add up); a table shared by heads (TH = 1) or sequences (TB = 1) sums over them, and tokens
    that share a row add into it (index_put_ with accumulate).
    """
    batch, seqlen = q.shape[0], q.shape[1]
    table_batch, table_rows, table_heads, width = table.shape
    grad_cos = None
    grad_sin = None
    for x, g in ((q, grad_q), (k, grad_k)):
        if x is None or g is None:
            continue
        a, b = _reference.pairs(x.float(), rot_dim, interleaved)
        ga, gb = _reference.pairs(g.float(), rot_dim, interleaved)
        dca, dcb = ga * a, gb * b
        if transpose:
            dsa, dsb = -gb * a, ga * b
        else:
            dsa, dsb = -ga * b, gb * a
        if full_table:
            dcos = _reference.join_pairs(dca, dcb, interleaved)
            dsin = _reference.join_pairs(dsa, dsb, interleaved)
        else:
            dcos, dsin = dca + dcb, dsa + dsb
        if table_heads == 1:
            dcos = dcos.sum(dim=2, keepdim=True)
            dsin = dsin.sum(dim=2, keepdim=True)
        grad_cos = dcos if grad_cos is None else grad_cos + dcos
        grad_sin = dsin if grad_sin is None else grad_sin + dsin
    token_rows = _reference.rows(
        batch, seqlen, q.device, positions, seqlen_offsets, cu_seqlens, seqlen_offset
    )
    if table_batch == 1:
        tb = torch.zeros_like(token_rows)
    else:
        tb = torch.arange(batch, device=q.device).unsqueeze(1).expand(batch, seqlen)
    out = []
    for grad in (grad_cos, grad_sin):
        acc = torch.zeros(
            (table_batch, table_rows, table_heads, width), dtype=torch.float32, device=q.device
        )
        if grad is not None:
            acc = acc.index_put(
                (tb, token_rows), grad.expand(batch, seqlen, table_heads, width), accumulate=True
            )
        out.append(acc)
    return out[0], out[1]


def _setup_context(ctx, inputs, output) -> None:
    (
        q,
        k,
        cos,
        sin,
        positions,
        seqlen_offsets,
        cu_seqlens,
        seqlen_offset,
        rot_dim,
        interleaved,
        full_table,
        transpose,
        enable_pdl,
    ) = inputs
    need_table = ctx.needs_input_grad[2] or ctx.needs_input_grad[3]
    # q and k themselves are kept only for the gradients of the tables.
    ctx.save_for_backward(
        cos,
        sin,
        positions,
        seqlen_offsets,
        cu_seqlens,
        q if need_table else None,
        k if need_table else None,
    )
    ctx.options = (seqlen_offset, rot_dim, interleaved, full_table, transpose, enable_pdl)
    ctx.has_k = k is not None
    ctx.out_meta = [(t.shape, t.dtype, t.device) for t in output if t is not None]


def _backward_through(rotate):
    """rope_functional's backward formula, the gradients of q and k (the inverse rotation)
    computed by `rotate`: the op (what AOT autograd traces) or, in eager autograd, its body."""

    def backward(ctx, grad_q_out, grad_k_out):
        cos, sin, positions, seqlen_offsets, cu_seqlens, q, k = ctx.saved_tensors
        seqlen_offset, rot_dim, interleaved, full_table, transpose, enable_pdl = ctx.options
        need_q, need_k, need_cos, need_sin = ctx.needs_input_grad[:4]
        # A gradient the engine did not materialize (an output unused by the loss) is zero.
        if grad_q_out is None:
            shape, dtype, device = ctx.out_meta[0]
            grad_q_out = torch.zeros(shape, dtype=dtype, device=device)
        if ctx.has_k and grad_k_out is None:
            shape, dtype, device = ctx.out_meta[1]
            grad_k_out = torch.zeros(shape, dtype=dtype, device=device)
        grad_q = grad_k = grad_cos = grad_sin = None
        if need_q or need_k:
            gk = grad_k_out if need_k else None
            grad_q, grad_k = rotate(
                grad_q_out,
                gk,
                cos,
                sin,
                positions,
                seqlen_offsets,
                cu_seqlens,
                seqlen_offset,
                rot_dim,
                interleaved,
                full_table,
                not transpose,
                enable_pdl,
            )
            grad_q = grad_q if need_q else None
        if need_cos or need_sin:
            gc, gs = table_grads(
                q,
                k if ctx.has_k else None,
                grad_q_out,
                grad_k_out if ctx.has_k else None,
                cos,
                positions,
                seqlen_offsets,
                cu_seqlens,
                seqlen_offset,
                rot_dim,
                interleaved,
                full_table,
                transpose,
            )
            grad_cos = gc.to(cos.dtype) if need_cos else None
            grad_sin = gs.to(sin.dtype) if need_sin else None
        return (
            grad_q,
            grad_k,
            grad_cos,
            grad_sin,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )

    return backward


_rope_routes = OpRoutes(
    "RopeEager",
    _rope_functional,
    _rope_allocating,
    _setup_context,
    _backward_through,
    _rope_functional,
    _rope_allocating,
)


# ---- the differentiable entry point of the Python API ----


def _requires_grad(*tensors: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def rope(
    q: torch.Tensor,
    k: Optional[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    rot_dim: int,
    positions: Optional[torch.Tensor] = None,
    seqlen_offsets: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    seqlen_offset: int = 0,
    interleaved: bool = False,
    full_table: bool = False,
    inplace: bool = False,
    enable_pdl: Optional[bool] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rotates q ``[B, S, Hq, D]`` (and k ``[B, S, Hk, D]``) with tables ``[TB, R, TH, W]``.

    Out of place: returns new tensors (differentiable w.r.t. q, k, cos and sin). In place:
    rotates q and k and returns them; without autograd the kernel writes them directly, with
    autograd (an input requires grad) the result is computed out of place and copied in with
    ``copy_``, which records the in-place update for backward (flash-attn's ``inplace=True``).
    ``enable_pdl``: programmatic dependent launch on CUDA (None: the kernel's default).
    """
    args = (
        positions,
        seqlen_offsets,
        cu_seqlens,
        int(seqlen_offset),
        int(rot_dim),
        bool(interleaved),
        bool(full_table),
    )
    if not inplace:
        return _rope_routes.pick(q, k, cos, sin)(q, k, cos, sin, *args, False, enable_pdl)
    if not _requires_grad(q, k, cos, sin):
        ops.rope_inplace(q, k, cos, sin, *args, False, enable_pdl)
        return q, k
    # The table gradient needs q and k as they were: rotate copies (q/k are overwritten below).
    table_grad = cos.requires_grad or sin.requires_grad
    q_src = q.clone() if table_grad else q
    k_src = k.clone() if table_grad and k is not None else k
    route = _rope_routes.pick(q_src, k_src, cos, sin)
    q_new, k_new = route(q_src, k_src, cos, sin, *args, False, enable_pdl)
    q.copy_(q_new)
    if k is not None:
        k.copy_(k_new)
    return q, k


def _leaf_like(t: torch.Tensor) -> bool:
    """A leaf that requires grad, or a view of one: autograd refuses to mark it dirty."""
    if t.is_leaf:
        return t.requires_grad
    base = t._base
    return base is not None and base.is_leaf and base.requires_grad


class FlashInplace(torch.autograd.Function):
    """flash-attn's in-place forms under autograd (``apply_rotary_emb(..., inplace=True)``,
    ``apply_rotary_emb_qkv_``, ``apply_rotary_emb_kv_``), with flash-attn's semantics.

    ``forward(x, split, options, *tables)``: ``split(t)`` gives the ``(q, k or None)`` 4-D views
    of ``t`` to rotate, one pair per ``(cos, sin)`` of ``tables``; ``options`` holds
    ``(rot_dims, seqlen_offsets, cu_seqlens, seqlen_offset, interleaved, enable_pdl)``. The
    kernel rotates the views of ``x`` in place and ``x`` is returned, as flash-attn's
    autograd.Functions do. Like flash-attn this works on a leaf that requires grad (or a view
    of one): ``x`` is then not marked dirty, and the returned tensor (an alias of ``x``)
    carries the rotation into the graph. Any other ``x`` is marked dirty, so ``x`` itself
    records the rotation and tensors saved from it before the call are protected by the
    version check. Backward: the transposed rotation of the same views of the gradient
    (flash-attn's ``conjugate=True``), everything else passed through; gradients w.r.t. the
    tables, when they require grad, from ``table_grads`` on a copy of the unrotated views.
    """

    @staticmethod
    def forward(ctx, x, split, options, *tables):
        rot_dims, seqlen_offsets, cu_seqlens, seqlen_offset, interleaved, enable_pdl = options
        need_table = any(ctx.needs_input_grad[3:])
        groups = split(x)
        originals = []
        for (q, k), i, rot_dim in zip(groups, range(0, len(tables), 2), rot_dims):
            if need_table:
                originals.append((q.clone(), None if k is None else k.clone()))
            ops.rope_inplace(
                q,
                k,
                tables[i],
                tables[i + 1],
                None,
                seqlen_offsets,
                cu_seqlens,
                seqlen_offset,
                rot_dim,
                interleaved,
                False,
                False,
                enable_pdl,
            )
        ctx.split = split
        ctx.options = options
        ctx.originals = originals
        ctx.save_for_backward(*tables)
        if not _leaf_like(x):
            ctx.mark_dirty(x)
        return x

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        rot_dims, seqlen_offsets, cu_seqlens, seqlen_offset, interleaved, enable_pdl = ctx.options
        tables = ctx.saved_tensors
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.clone(memory_format=torch.contiguous_format)
            for (gq, gk), i, rot_dim in zip(ctx.split(grad_x), range(0, len(tables), 2), rot_dims):
                ops.rope_inplace(
                    gq,
                    gk,
                    tables[i],
                    tables[i + 1],
                    None,
                    seqlen_offsets,
                    cu_seqlens,
                    seqlen_offset,
                    rot_dim,
                    interleaved,
                    False,
                    True,
                    enable_pdl,
                )
        grad_tables = [None] * len(tables)
        if ctx.originals:
            for j, ((gq, gk), (q, k)) in enumerate(zip(ctx.split(grad), ctx.originals)):
                cos, sin = tables[2 * j], tables[2 * j + 1]
                gc, gs = table_grads(
                    q,
                    k,
                    gq,
                    gk,
                    cos,
                    None,
                    seqlen_offsets,
                    cu_seqlens,
                    seqlen_offset,
                    rot_dims[j],
                    interleaved,
                    False,
                    False,
                )
                if ctx.needs_input_grad[3 + 2 * j]:
                    grad_tables[2 * j] = gc.to(cos.dtype)
                if ctx.needs_input_grad[4 + 2 * j]:
                    grad_tables[2 * j + 1] = gs.to(sin.dtype)
        return (grad_x, None, None, *grad_tables)


def table_dtype(
    cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos/sin in a dtype the kernel reads: theirs when both have float32 or `dtype`, else
    float32 (exact for float16 / bfloat16 tables; a float64 table is rounded to float32)."""
    if cos.dtype == sin.dtype and cos.dtype in (torch.float32, dtype):
        return cos, sin
    return cos.to(torch.float32), sin.to(torch.float32)


def _broadcast_rows(table: torch.Tensor, seqlen) -> torch.Tensor:
    """A [TB, S or 1, TH, W] table with one row per position s (a size-1 row axis broadcasts)."""
    if table.shape[1] == 1:
        return table.expand(table.shape[0], seqlen, table.shape[2], table.shape[3])
    return table


def _check_table_rows(op: str, name: str, table: torch.Tensor, batch, seqlen) -> None:
    """A [TB, S, W] table of the transformers / diffusers conventions broadcasts over x."""
    if table.shape[0] not in (1, batch) or table.shape[1] not in (1, seqlen):
        raise ValueError(
            f"{op}: {name} must have shape [1 or B = {batch}, 1 or S = {seqlen}, channels], got {list(table.shape)}"
        )


def _promoted(op: str, **named: torch.Tensor) -> torch.dtype:
    """``promote_types`` of the named tensors, each of a kernel dtype (else a ValueError naming it)."""
    dtype = None
    for name, t in named.items():
        if t.dtype not in KERNEL_DTYPES:
            raise ValueError(
                f"{op}: {name} must be float32, float16 or bfloat16, got {_dtype_name(t.dtype)}"
            )
        dtype = t.dtype if dtype is None else torch.promote_types(dtype, t.dtype)
    return dtype


def transformers_rope(
    q: torch.Tensor,
    k: Optional[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
    op: str = "apply_rotary_transformers",
    enable_pdl: Optional[bool] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """transformers ``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin`` with the full
    cos/sin (per-channel table, NeoX pairs), fp32 math and one rounding to the result dtype
    ``promote_types(q, cos, sin)`` (what eager PyTorch returns). q/k ``[B, H, S, D]``
    (unsqueeze_dim=1) or ``[B, S, H, D]`` (unsqueeze_dim=2); cos/sin ``[B or 1, S or 1, R]``;
    ``R < D``: partial rotary (the first R channels rotated, the rest passed through)."""
    if q.dim() != 4:
        raise ValueError(
            f"{op}: q must have 4 dimensions ([B, H, S, D] or [B, S, H, D]), got shape {list(q.shape)}"
        )
    if k is not None and k.dim() != 4:
        raise ValueError(
            f"{op}: k must have 4 dimensions ([B, H, S, D] or [B, S, H, D]), got shape {list(k.shape)}"
        )
    if cos.dim() != 3 or tuple(sin.shape) != tuple(cos.shape):
        raise ValueError(
            f"{op}: cos and sin must have one shape [B or 1, S, rot_dim], got {list(cos.shape)} and {list(sin.shape)}"
        )
    dim = unsqueeze_dim + 4 if unsqueeze_dim < 0 else unsqueeze_dim
    if dim not in (1, 2):
        raise ValueError(
            f"{op}: unsqueeze_dim must be 1 (q/k [B, H, S, D]) or 2 (q/k [B, S, H, D]), got {unsqueeze_dim}"
        )
    rot_dim = cos.shape[-1]
    if rot_dim % 2 != 0 or rot_dim > q.shape[-1] or rot_dim <= 0:
        raise ValueError(
            f"{op}: cos must have an even number of channels rot_dim, > 0 and <= head_dim = {q.shape[-1]}, "
            f"got shape {list(cos.shape)}"
        )
    to4 = (lambda t: t.transpose(1, 2)) if dim == 1 else (lambda t: t)
    seq_axis = 3 - dim  # [B, H, S, D]: 2; [B, S, H, D]: 1
    batch, seqlen = q.shape[0], q.shape[seq_axis]
    if k is not None and (
        k.shape[0] != batch or k.shape[seq_axis] != seqlen or k.shape[-1] != q.shape[-1]
    ):
        raise ValueError(
            f"{op}: k must have the batch, sequence length and head_dim of q, got shapes {list(k.shape)} and "
            f"{list(q.shape)} (unsqueeze_dim={unsqueeze_dim})"
        )
    _check_table_rows(op, "cos", cos, batch, seqlen)
    cos4 = _broadcast_rows(cos.unsqueeze(2), seqlen)
    sin4 = _broadcast_rows(sin.unsqueeze(2), seqlen)

    def one(x, other, dtype):
        c, s = table_dtype(cos4, sin4, dtype)
        y, y_other = rope(
            to4(x.to(dtype)),
            None if other is None else to4(other.to(dtype)),
            c,
            s,
            rot_dim=rot_dim,
            full_table=True,
            enable_pdl=enable_pdl,
        )
        return to4(y), None if y_other is None else to4(y_other)

    q_dtype = _promoted(op, q=q, cos=cos, sin=sin)
    k_dtype = q_dtype if k is None else _promoted(op, k=k, cos=cos, sin=sin)
    if k_dtype == q_dtype:
        return one(q, k, q_dtype)
    return one(q, None, q_dtype)[0], one(k, None, k_dtype)[0]


def ltx_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    op: str = "apply_rotary_emb_ltx",
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """diffusers LTX-Video ``apply_rotary_emb(x, (cos, sin))``: interleaved pairs, per-channel
    tables, fp32 math, one rounding to x's dtype. x ``[B, S, C]``; cos/sin ``[B or 1, S or 1, C]``
    or ``[B or 1, S or 1, D]`` with D even dividing C (one head's table for all C / D heads)."""
    if x.dim() != 3:
        raise ValueError(f"{op}: x must have shape [B, S, C], got {list(x.shape)}")
    if cos.dim() != 3 or tuple(sin.shape) != tuple(cos.shape):
        raise ValueError(
            f"{op}: freqs must be (cos, sin) of one shape [B or 1, S, C] (or [B or 1, S, head_dim]), "
            f"got {list(cos.shape)} and {list(sin.shape)}"
        )
    channels = x.shape[-1]
    width = cos.shape[-1]
    if width <= 0 or width % 2 != 0 or channels % width != 0:
        raise ValueError(
            f"{op}: cos/sin must have C = {channels} channels or an even number of channels dividing C, "
            f"got shape {list(cos.shape)}"
        )
    if x.dtype not in KERNEL_DTYPES:
        raise ValueError(
            f"{op}: x must be float32, float16 or bfloat16, got {_dtype_name(x.dtype)}"
        )
    _check_table_rows(op, "cos", cos, x.shape[0], x.shape[1])
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        x = x.contiguous()
    x4 = x.unflatten(-1, (channels // width, width))
    c, s = table_dtype(
        _broadcast_rows(cos.unsqueeze(2), x.shape[1]),
        _broadcast_rows(sin.unsqueeze(2), x.shape[1]),
        x.dtype,
    )
    y, _ = rope(
        x4, None, c, s, rot_dim=width, interleaved=True, full_table=True, enable_pdl=enable_pdl
    )
    return y.flatten(-2)
