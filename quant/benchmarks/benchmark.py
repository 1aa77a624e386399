"""`kernels benchmark` workloads for the quant kernel (activation quantization of named models).

    kernels benchmark open-kernels/quant@v1     # from the Hub
    kernels benchmark quant                     # a local kernel folder (its build/)

Each workload allocates its bf16 input in `setup_<w>`, times only the quantize call in
`benchmark_<w>`, and in `verify_<w>` returns the package's `_reference` result. The runner
compares `self.out` with it using allclose(atol=1e-2), which needs float tensors: `self.out` is
the dequantized output (q * scale), computed by the benchmark call itself, and the reference is
dequantized the same way. The kernel and the reference round alike, so they agree exactly.

Shapes: Llama-3-8B activations (hidden 4096): decode = 32 tokens, prefill = 4096 tokens.
The runner's timer includes launch overhead and the dequantization; see benchmarks/sweep.py
for published numbers.
"""

import torch
from kernels.benchmark import Benchmark

HIDDEN = 4096
DECODE_TOKENS = 32
PREFILL_TOKENS = 4096


def _dequant_groups(q: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    return (q.float().unflatten(-1, (-1, group)) * scales.unsqueeze(-1)).flatten(-2)


class _Llama3Workloads:
    """The decode and prefill workloads of one quantize call (a mixin: the runner collects only
    the Benchmark subclasses below). Subclasses define _run (the timed call, which sets
    self.out) and _verify (the reference)."""

    seed = 0

    def _setup(self, tokens: int) -> None:
        self.x = torch.randn(tokens, HIDDEN, device=self.device, dtype=torch.bfloat16)

    def setup_llama3_8b_decode(self):
        self._setup(DECODE_TOKENS)

    def benchmark_llama3_8b_decode(self):
        self._run()

    def verify_llama3_8b_decode(self) -> torch.Tensor:
        return self._verify()

    def setup_llama3_8b_prefill(self):
        self._setup(PREFILL_TOKENS)

    def benchmark_llama3_8b_prefill(self):
        self._run()

    def verify_llama3_8b_prefill(self) -> torch.Tensor:
        return self._verify()


class PerTokenFp8Benchmark(_Llama3Workloads, Benchmark):
    """Dynamic per-token fp8 (vLLM scaled_fp8_quant(use_per_token_if_dynamic=True))."""

    def _run(self) -> None:
        q, scale = self.kernel.scaled_fp8_quant(self.x, use_per_token_if_dynamic=True)
        self.out = q.float() * scale

    def _verify(self) -> torch.Tensor:
        q, scale = self.kernel._reference.per_token_fp8(self.x)
        return q.float() * scale


class GroupFp8Benchmark(_Llama3Workloads, Benchmark):
    """Per-token-group fp8 with groups of 128 (DeepSeek-V3-style block-scaled activations)."""

    def _run(self) -> None:
        q, scales = self.kernel.per_token_group_quant_fp8(self.x, 128)
        self.out = _dequant_groups(q, scales, 128)

    def _verify(self) -> torch.Tensor:
        q, scales = self.kernel._reference.group_fp8(self.x, 128)
        return _dequant_groups(q, scales, 128)
