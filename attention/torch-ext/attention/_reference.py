"""Package-private reference attention in plain PyTorch, used by benchmarks/benchmark.py's verify
step (a benchmark script cannot import tests/; it reaches this module as `self.kernel._reference`).

It computes kernel_src/attention_params.h's math for one sequence with an explicit softmax, one
query head at a time, so the memory is one [S_q, S_k] score matrix (64 MiB in float32 at 4K x 4K),
not one per head. For checking, not for use."""

from typing import Optional, Tuple

import torch


def visible(
    len_q: int, len_k: int, causal: bool, window_size=(-1, -1), device=None
) -> torch.Tensor:
    """[len_q, len_k] bool: key j visible from query i (masks aligned to the bottom-right corner)."""
    i = torch.arange(len_q, device=device)[:, None]
    j = torch.arange(len_k, device=device)[None, :]
    diag = i + len_k - len_q
    left, right = (-1 if w is None else w for w in window_size)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    ok = torch.ones(len_q, len_k, dtype=torch.bool, device=device)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size=(-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    dtype: torch.dtype = torch.float32,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q [S_q, H, D], k / v [S_k, H_kv, D] (H a multiple of H_kv), alibi_slopes [H]
    -> (out [S_q, H, D], lse [H, S_q]) in `dtype`. A row with no visible key: out 0, lse +inf."""
    sq, h, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    mask = visible(sq, sk, causal, window_size, q.device)
    dist = None
    if alibi_slopes is not None:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        dist = (i + sk - sq - j).abs().to(dtype)
    out = torch.zeros((sq, h, d), dtype=dtype, device=q.device)
    lse = torch.empty((h, sq), dtype=dtype, device=q.device)
    for head in range(h):
        kv = head // (h // hk)
        s = (q[:, head].to(dtype) @ k[:, kv].to(dtype).T) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        if dist is not None:
            s = s - alibi_slopes[head].to(dtype) * dist
        s = s.masked_fill(~mask, float("-inf"))
        lse[head] = torch.logsumexp(s, dim=-1)
        out[:, head] = torch.exp(s - lse[head][:, None]).nan_to_num(0.0) @ v[:, kv].to(dtype)
    lse = lse.masked_fill(~mask.any(dim=-1)[None, :], float("inf"))
    return out, lse
