"""`kernels benchmark` workloads for the rmsnorm kernel (RMSNorm of named models, forward and backward).

    kernels benchmark open-kernels/rmsnorm@v1     # from the Hub
    kernels benchmark rmsnorm                     # a local kernel folder (its build/)

Each workload allocates its inputs and `self.out` in `setup_<w>`, times one kernel call in
`benchmark_<w>` and returns, in `verify_<w>`, an fp32 reference computed here in plain torch
(the `reference_*` functions below, which follow kernel_src/rmsnorm_params.h) and rounded once to
the output dtype. The runner compares with atol=1e-2 and rtol=1e-5, so outputs are kept below 1
in magnitude, where one bf16 ulp is at most 2**-8: the weights are scaled by 0.1 (Gemma: 1 + w =
0.1), the backward's upstream gradient by 0.1. The kernel and the reference then differ only by
the order of the fp32 sum of squares, which can move a rounding by one ulp.

In-place workloads (the fused residual add) mutate their inputs: `setup_<w>` keeps copies of the
original tensors and `verify_<w>` computes the reference from those copies. The runner calls
`benchmark_<w>` exactly once before verifying, so `self.out` (the normalized input) and the
residual hold one application. `verify_<w>` also checks the residual and, for the backward, the
weight gradient, and raises if either is wrong (the runner compares only `self.out`).

Shapes: tokens x hidden with hidden sizes from the model configs: Llama-3-8B 4096, Llama-3-70B
8192, Gemma-2-9B 3584; decode = 32 tokens (one step of a 32-sequence batch), prefill = 4096 tokens
(one 4K prompt). The runner's timer includes launch overhead; benchmarks/sweep.py times the
same ops against F.rms_norm, torch.compile and LLaMA-style eager in the same run.
"""

import torch
from kernels.benchmark import Benchmark

EPS = 1e-6
DECODE_TOKENS = 32
PREFILL_TOKENS = 4096
WEIGHT_SCALE = 0.1  # |out| < 1: see the module docstring
GRAD_SCALE = 0.1


# ---- fp32 references (kernel_src/rmsnorm_params.h); also used by sweep.py ----


def reference_rms_norm(x, weight, eps=EPS, *, weight_offset=0.0, round_norm=True):
    """round(n' * (weight_offset + w)), n = x * rstd in fp32, n' = round_norm ? round(n) : n.

    round_norm=True, offset 0: LlamaRMSNorm / vLLM `rms_norm`; round_norm=False, offset 1: Gemma."""
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if round_norm:
        n = n.to(x.dtype).float()
    w = weight.float() + weight_offset if weight is not None else 1.0
    return (n * w).to(x.dtype)


def reference_fused_add_rms_norm(x, residual, weight, eps=EPS, **kwargs):
    """(normalized, new residual): r = round(x + residual), then reference_rms_norm(r)."""
    r = (x.float() + residual.float()).to(x.dtype)
    return reference_rms_norm(r, weight, eps, **kwargs), r


def reference_rms_norm_backward(grad_out, x, weight, eps=EPS):
    """(dinput, dweight) in fp32 for out = x * rstd * weight; the roundings of the forward pass
    gradients straight through, as autograd does for `.to()`."""
    xf = x.detach().float().requires_grad_()
    wf = weight.detach().float().requires_grad_()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * wf
    dx, dw = torch.autograd.grad(out, (xf, wf), grad_out.float())
    return dx, dw


def relative_error(got, want):
    """||got - want|| / ||want|| in fp32 (for reductions such as the weight gradient)."""
    want = want.float()
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-30)).item()


def _weight(hidden, device, dtype, offset=0.0):
    """WEIGHT_SCALE * (1 + 0.1 * N(0, 1)) - offset: the effective weight (offset + w) stays near
    WEIGHT_SCALE, so |out| < 1."""
    w = WEIGHT_SCALE * (1 + 0.1 * torch.randn(hidden, device=device)) - offset
    return w.to(dtype)


def _norm_inputs(bench, tokens, hidden, *, residual=False, weight_offset=0.0):
    """bench.x [tokens, hidden] bf16, bench.weight, bench.out; bench.residual and copies of the
    inputs (bench.x0, bench.residual0) for the in-place fused add."""
    dtype = torch.bfloat16
    bench.x = torch.randn(tokens, hidden, device=bench.device, dtype=dtype)
    bench.weight = _weight(hidden, bench.device, dtype, offset=weight_offset)
    if residual:
        bench.residual = torch.randn(tokens, hidden, device=bench.device, dtype=dtype)
        bench.x0, bench.residual0 = bench.x.clone(), bench.residual.clone()
        bench.out = bench.x  # fused_add_rms_norm writes the normalized value into its input
    else:
        bench.out = torch.empty_like(bench.x)


def _check_residual(bench, want):
    """The new residual is one fp32 add rounded once: equal to the reference but for a double
    rounding (fp32, then bf16) that an add of far-apart magnitudes may hit: allow one ulp."""
    got, want = bench.residual.float(), want.float()
    if not torch.allclose(got, want, rtol=torch.finfo(bench.residual.dtype).eps, atol=0.0):
        err = (got - want).abs().max().item()
        raise AssertionError(f"residual != round(x + residual): max err {err}")


class RmsNormBenchmark(Benchmark):
    """vLLM `rms_norm(out, x, weight, eps)`: LlamaRMSNorm casting (normalized value rounded to the
    input dtype, then multiplied by the weight)."""

    seed = 0

    def _reference(self):
        return reference_rms_norm(self.x, self.weight)

    # Llama-3-8B, hidden 4096
    def setup_llama3_8b_decode(self):
        _norm_inputs(self, DECODE_TOKENS, 4096)

    def benchmark_llama3_8b_decode(self):
        self.kernel.rms_norm(self.out, self.x, self.weight, EPS)

    def verify_llama3_8b_decode(self):
        return self._reference()

    def setup_llama3_8b_prefill(self):
        _norm_inputs(self, PREFILL_TOKENS, 4096)

    def benchmark_llama3_8b_prefill(self):
        self.kernel.rms_norm(self.out, self.x, self.weight, EPS)

    def verify_llama3_8b_prefill(self):
        return self._reference()

    # Llama-3-70B, hidden 8192
    def setup_llama3_70b_prefill(self):
        _norm_inputs(self, PREFILL_TOKENS, 8192)

    def benchmark_llama3_70b_prefill(self):
        self.kernel.rms_norm(self.out, self.x, self.weight, EPS)

    def verify_llama3_70b_prefill(self):
        return self._reference()


class FusedAddRmsNormBenchmark(Benchmark):
    """vLLM `fused_add_rms_norm(x, residual, weight, eps)`, in place: residual <- x + residual,
    x <- rms_norm(residual). `self.out` is `x`."""

    seed = 0

    def _reference(self):
        out, residual = reference_fused_add_rms_norm(self.x0, self.residual0, self.weight)
        _check_residual(self, residual)
        return out

    def setup_llama3_8b_decode(self):
        _norm_inputs(self, DECODE_TOKENS, 4096, residual=True)

    def benchmark_llama3_8b_decode(self):
        self.kernel.fused_add_rms_norm(self.x, self.residual, self.weight, EPS)

    def verify_llama3_8b_decode(self):
        return self._reference()

    def setup_llama3_8b_prefill(self):
        _norm_inputs(self, PREFILL_TOKENS, 4096, residual=True)

    def benchmark_llama3_8b_prefill(self):
        self.kernel.fused_add_rms_norm(self.x, self.residual, self.weight, EPS)

    def verify_llama3_8b_prefill(self):
        return self._reference()


class GemmaRmsNormBenchmark(Benchmark):
    """Gemma: out = x * rstd * (1 + weight), fp32 throughout, rounded once. Gemma-2-9B, hidden 3584."""

    seed = 0

    def setup_gemma2_9b_decode(self):
        _norm_inputs(self, DECODE_TOKENS, 3584, weight_offset=1.0)

    def benchmark_gemma2_9b_decode(self):
        self.kernel.gemma_rms_norm(self.out, self.x, self.weight, EPS)

    def verify_gemma2_9b_decode(self):
        return reference_rms_norm(self.x, self.weight, weight_offset=1.0, round_norm=False)

    def setup_gemma2_9b_prefill(self):
        _norm_inputs(self, PREFILL_TOKENS, 3584, weight_offset=1.0)

    def benchmark_gemma2_9b_prefill(self):
        self.kernel.gemma_rms_norm(self.out, self.x, self.weight, EPS)

    def verify_gemma2_9b_prefill(self):
        return reference_rms_norm(self.x, self.weight, weight_offset=1.0, round_norm=False)

    # gemma_fused_add_rms_norm, in place like fused_add_rms_norm
    def setup_gemma2_9b_fused_add_prefill(self):
        _norm_inputs(self, PREFILL_TOKENS, 3584, residual=True, weight_offset=1.0)

    def benchmark_gemma2_9b_fused_add_prefill(self):
        self.kernel.gemma_fused_add_rms_norm(self.x, self.residual, self.weight, EPS)

    def verify_gemma2_9b_fused_add_prefill(self):
        out, residual = reference_fused_add_rms_norm(
            self.x0, self.residual0, self.weight, weight_offset=1.0, round_norm=False
        )
        _check_residual(self, residual)
        return out


class RmsNormBackwardBenchmark(Benchmark):
    """`apply_rms_norm_backward(grad, x, weight, None, None, eps)` -> [dinput, dweight] (rstd
    recomputed from x). `self.out` is dinput; verify also checks dweight."""

    seed = 0

    def _setup(self, tokens, hidden):
        dtype = torch.bfloat16
        self.x = torch.randn(tokens, hidden, device=self.device, dtype=dtype)
        self.weight = (1 + 0.1 * torch.randn(hidden, device=self.device)).to(dtype)
        self.grad = GRAD_SCALE * torch.randn(tokens, hidden, device=self.device, dtype=dtype)
        self.out = torch.empty_like(self.x)
        self.dweight = None

    def _run(self):
        self.out, self.dweight = self.kernel.apply_rms_norm_backward(
            self.grad, self.x, self.weight, None, None, EPS
        )

    def _reference(self):
        dx, dw = reference_rms_norm_backward(self.grad, self.x, self.weight)
        # dweight sums `tokens` products: compare as a whole, against 2 bf16 ulps.
        err = relative_error(self.dweight, dw)
        if not err <= 2 * torch.finfo(self.dweight.dtype).eps:
            raise AssertionError(f"dweight: relative error {err}")
        return dx.to(self.out.dtype)

    # Llama-3-8B / -70B training step on one 4K sequence
    def setup_llama3_8b_train(self):
        self._setup(PREFILL_TOKENS, 4096)

    def benchmark_llama3_8b_train(self):
        self._run()

    def verify_llama3_8b_train(self):
        return self._reference()

    def setup_llama3_70b_train(self):
        self._setup(PREFILL_TOKENS, 8192)

    def benchmark_llama3_70b_train(self):
        self._run()

    def verify_llama3_70b_train(self):
        return self._reference()
