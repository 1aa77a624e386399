"""`kernels benchmark` workloads for the newkernel kernel.

    kernels benchmark open-kernels/newkernel@v1     # from the Hub
    kernels benchmark newkernel                     # a local kernel folder (its build/)

Each workload allocates its bf16 input and `self.out` in `setup_<w>`, times only the kernel call
(the out-param fast path) in `benchmark_<w>`, and returns the fp32 reference of the kernel's own
`_reference` module, rounded to bf16, in `verify_<w>`. The runner compares with atol=1e-2: the
inputs are scaled so that |out| stays below 2, where one bf16 ulp (2**-7) is within it.
Replace the shapes with the ones of the models the kernel is for; the runner's timer includes
launch overhead, so publish the numbers of benchmarks/sweep.py.
"""

import torch
from kernels.benchmark import Benchmark

DECODE_TOKENS = 32
PREFILL_TOKENS = 4096
HIDDEN = 4096
ALPHA = 0.5
INPUT_SCALE = 0.25


class ScaleBenchmark(Benchmark):
    """``alpha * x`` on [tokens, 4096] bf16."""

    seed = 0

    def _inputs(self, tokens: int) -> None:
        self.x = INPUT_SCALE * torch.randn(tokens, HIDDEN, device=self.device, dtype=torch.bfloat16)
        self.out = torch.empty_like(self.x)

    def _reference(self) -> torch.Tensor:
        return self.kernel._reference.scale(self.x, ALPHA).to(self.out.dtype)

    def setup_decode(self):
        self._inputs(DECODE_TOKENS)

    def benchmark_decode(self):
        self.kernel.scale(self.x, ALPHA, out=self.out)

    def verify_decode(self) -> torch.Tensor:
        return self._reference()

    def setup_prefill(self):
        self._inputs(PREFILL_TOKENS)

    def benchmark_prefill(self):
        self.kernel.scale(self.x, ALPHA, out=self.out)

    def verify_prefill(self) -> torch.Tensor:
        return self._reference()
