"""flash-attn's ``flash_attn.bert_padding`` helpers: move between padded ``[B, S, ...]`` batches
and the packed ``[total, ...]`` rows the varlen functions take (plain PyTorch)."""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

__all__ = ["index_first_axis", "pad_input", "unpad_input"]


def index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows ``indices`` of ``x [N, ...]`` (``x[indices]``)."""
    return x[indices]


def unpad_input(
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor,
    unused_mask: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """``hidden_states [B, S, ...]``, ``attention_mask [B, S]`` (true / 1 = token) ->
    ``(rows [total, ...], indices [total], cu_seqlens int32 [B + 1], max_seqlen, seqused int32
    [B])``. ``unused_mask`` marks rows that are kept (allocated) but not counted in ``seqused``."""
    mask = (
        attention_mask.bool()
        if unused_mask is None
        else (attention_mask.bool() | unused_mask.bool())
    )
    seqlens = mask.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    rows = hidden_states.reshape(-1, *hidden_states.shape[2:])[indices]
    return rows, indices, cu_seqlens, max_seqlen, used


def pad_input(
    hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int
) -> torch.Tensor:
    """Inverse of ``unpad_input``: rows ``[total, ...]`` back to ``[batch, seqlen, ...]`` with
    zeros where the mask was false."""
    out = hidden_states.new_zeros((batch * seqlen, *hidden_states.shape[1:]))
    out[indices] = hidden_states
    return out.view(batch, seqlen, *hidden_states.shape[1:])
