"""`kernels benchmark` workloads for the activation kernel (gated MLP activations of named models).

    kernels benchmark open-kernels/activation@v1     # from the Hub
    kernels benchmark activation                     # a local kernel folder (its build/)

Each workload allocates its bf16 input and `self.out` in `setup_<w>`, times only the kernel call
(the out-param fast path) in `benchmark_<w>`, and returns the fp32 reference of the kernel's own
`_reference` module, cast to bf16, in `verify_<w>`. The runner compares with atol=1e-2, so inputs
are scaled by 0.25: |out| stays below 2, where one bf16 ulp is 2**-7 < 1e-2, and the kernel
(fp32 math, rounded once) and the reference (fp32, cast once) may differ by at most that ulp.

Shapes: tokens x (2 * intermediate_size) with intermediate sizes from the model configs:
Llama-3-8B 14336, Llama-2-7B 11008 (SiLU-and-mul), gpt-oss-20b 2880 (interleaved SwiGLU);
decode = 32 tokens (one step of a 32-sequence batch), prefill = 4096 tokens (one 4K prompt).
The runner's timer includes launch overhead; see benchmarks/sweep.py for published numbers.
"""

import torch
from kernels.benchmark import Benchmark

DECODE_TOKENS = 32
PREFILL_TOKENS = 4096
INPUT_SCALE = 0.25


def _gated_inputs(bench, tokens: int, intermediate: int) -> None:
    """bench.x: [tokens, 2 * intermediate] bf16 input; bench.out: [tokens, intermediate]."""
    bench.x = INPUT_SCALE * torch.randn(
        tokens, 2 * intermediate, device=bench.device, dtype=torch.bfloat16
    )
    bench.out = torch.empty(tokens, intermediate, device=bench.device, dtype=torch.bfloat16)


class SiluAndMulBenchmark(Benchmark):
    """silu(x[..., :d]) * x[..., d:], the SwiGLU MLP activation of Llama-family models."""

    seed = 0

    def _reference(self) -> torch.Tensor:
        return self.kernel._reference.silu_and_mul(self.x, compute_dtype=torch.float32).to(
            self.out.dtype
        )

    # Llama-3-8B, intermediate_size 14336
    def setup_llama3_8b_decode(self):
        _gated_inputs(self, DECODE_TOKENS, 14336)

    def benchmark_llama3_8b_decode(self):
        self.kernel.silu_and_mul(self.out, self.x)

    def verify_llama3_8b_decode(self) -> torch.Tensor:
        return self._reference()

    def setup_llama3_8b_prefill(self):
        _gated_inputs(self, PREFILL_TOKENS, 14336)

    def benchmark_llama3_8b_prefill(self):
        self.kernel.silu_and_mul(self.out, self.x)

    def verify_llama3_8b_prefill(self) -> torch.Tensor:
        return self._reference()

    # Llama-2-7B, intermediate_size 11008
    def setup_llama2_7b_decode(self):
        _gated_inputs(self, DECODE_TOKENS, 11008)

    def benchmark_llama2_7b_decode(self):
        self.kernel.silu_and_mul(self.out, self.x)

    def verify_llama2_7b_decode(self) -> torch.Tensor:
        return self._reference()

    def setup_llama2_7b_prefill(self):
        _gated_inputs(self, PREFILL_TOKENS, 11008)

    def benchmark_llama2_7b_prefill(self):
        self.kernel.silu_and_mul(self.out, self.x)

    def verify_llama2_7b_prefill(self) -> torch.Tensor:
        return self._reference()


class SwigluOAIAndMulBenchmark(Benchmark):
    """gpt-oss SwiGLU on interleaved gate/up columns (alpha 1.702, limit 7.0)."""

    seed = 0

    def _reference(self) -> torch.Tensor:
        return self.kernel._reference.swigluoai_and_mul(self.x, compute_dtype=torch.float32).to(
            self.out.dtype
        )

    # gpt-oss-20b, intermediate_size 2880 (per expert)
    def setup_gpt_oss_20b_decode(self):
        _gated_inputs(self, DECODE_TOKENS, 2880)

    def benchmark_gpt_oss_20b_decode(self):
        self.kernel.swigluoai_and_mul(self.out, self.x)

    def verify_gpt_oss_20b_decode(self) -> torch.Tensor:
        return self._reference()

    def setup_gpt_oss_20b_prefill(self):
        _gated_inputs(self, PREFILL_TOKENS, 2880)

    def benchmark_gpt_oss_20b_prefill(self):
        self.kernel.swigluoai_and_mul(self.out, self.x)

    def verify_gpt_oss_20b_prefill(self) -> torch.Tensor:
        return self._reference()
