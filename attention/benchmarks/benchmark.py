"""`kernels benchmark` workloads for the attention kernel (prefill and decode of named models).

    kernels benchmark open-kernels/attention@v1     # from the Hub
    kernels benchmark attention                     # a local kernel folder (its build/)

Each workload allocates its inputs and `self.out` in `setup_<w>`, times one kernel call in
`benchmark_<w>` and returns, in `verify_<w>`, a float32 reference in plain torch (the package's
private `_reference.attention`, reached as `self.kernel._reference`: one head at a time, so a
4K-token prefill needs a 64 MiB score matrix, not 4 GiB) cast to the output dtype. The runner compares with atol=1e-2 and rtol=1e-5: v is drawn with
standard deviation 0.25, so every output (a convex combination of rows of v) stays below 2 in
magnitude, where one bf16 ulp is at most 2**-7 < 1e-2, and the kernel and the reference (both
fp32 accumulation, rounded once) differ by at most about that ulp. The decode workloads read the
cache without appending to it, so repeated calls are identical.

Shapes from the model configs: Llama-3-8B (32 query heads, 8 kv heads, head_dim 128);
Gemma-2-9B-like head_dim 256 (16 / 8 heads); prefill = one 4K prompt (causal), or 4 ragged
prompts packed (varlen); decode = 16 sequences of a 4K context, one query token each, from a
contiguous cache, a paged cache of 16-token blocks (vLLM's default) or 256-token blocks. The
runner's timer includes launch overhead; benchmarks/sweep.py times the same calls against
PyTorch's SDPA backends in the same run.
"""

import torch
from kernels.benchmark import Benchmark

DTYPE = torch.bfloat16
PREFILL_TOKENS = 4096
DECODE_BATCH = 16
DECODE_CONTEXT = 4096
Q_SCALE, V_SCALE = 1.0, 0.25  # see the module docstring


def _reference(bench, q, k, v):
    """float32 causal attention of one sequence, [S_q, H, D]."""
    return bench.kernel._reference.attention(q, k, v, causal=True)[0]


def _qkv(bench, batch, sq, sk, hq, hk, d):
    dev = bench.device
    bench.q = Q_SCALE * torch.randn(batch, sq, hq, d, device=dev, dtype=DTYPE)
    bench.k = torch.randn(batch, sk, hk, d, device=dev, dtype=DTYPE)
    bench.v = V_SCALE * torch.randn(batch, sk, hk, d, device=dev, dtype=DTYPE)


class PrefillBenchmark(Benchmark):
    """`flash_attn_func(q, k, v, causal=True)` and `flash_attn_varlen_func` over packed prompts."""

    seed = 0

    def _dense(self):
        self.out = self.kernel.flash_attn_func(self.q, self.k, self.v, causal=True)

    def _verify_dense(self):
        return torch.stack(
            [_reference(self, self.q[b], self.k[b], self.v[b]) for b in range(self.q.shape[0])]
        ).to(DTYPE)

    # Llama-3-8B: 32 / 8 heads, head_dim 128, one 4K prompt
    def setup_llama3_8b_4k(self):
        _qkv(self, 1, PREFILL_TOKENS, PREFILL_TOKENS, 32, 8, 128)

    def benchmark_llama3_8b_4k(self):
        self._dense()

    def verify_llama3_8b_4k(self):
        return self._verify_dense()

    # head_dim 256 (Gemma-2-9B-like: 16 / 8 heads)
    def setup_head256_4k(self):
        _qkv(self, 1, PREFILL_TOKENS, PREFILL_TOKENS, 16, 8, 256)

    def benchmark_head256_4k(self):
        self._dense()

    def verify_head256_4k(self):
        return self._verify_dense()

    # 4 ragged Llama-3-8B prompts packed into one varlen call
    def setup_llama3_8b_varlen(self):
        lens = [PREFILL_TOKENS // 2, PREFILL_TOKENS // 4 + 3, PREFILL_TOKENS // 8 - 5, 17]
        self.lens = lens
        total = sum(lens)
        _qkv(self, 1, total, total, 32, 8, 128)
        self.q, self.k, self.v = self.q[0], self.k[0], self.v[0]
        self.cu = torch.tensor(
            [0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=self.device
        )
        self.out = None

    def benchmark_llama3_8b_varlen(self):
        self.out = self.kernel.flash_attn_varlen_func(
            self.q, self.k, self.v, self.cu, self.cu, max(self.lens), max(self.lens), causal=True
        )

    def verify_llama3_8b_varlen(self):
        parts = [
            _reference(self, q, k, v)
            for q, k, v in zip(
                self.q.split(self.lens), self.k.split(self.lens), self.v.split(self.lens)
            )
        ]
        return torch.cat(parts).to(DTYPE)


class DecodeBenchmark(Benchmark):
    """`flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=...)`: one new token per sequence
    over a Llama-3-8B cache (32 / 8 heads, head_dim 128), contiguous or paged."""

    seed = 0

    def _setup(self, block_size=None):
        dev, b, ctx = self.device, DECODE_BATCH, DECODE_CONTEXT
        self.q = Q_SCALE * torch.randn(b, 1, 32, 128, device=dev, dtype=DTYPE)
        lens = torch.randint(ctx // 2, ctx + 1, (b,))
        lens[0] = ctx
        self.lens = lens.tolist()
        self.seqlens = lens.to(dtype=torch.int32, device=dev)
        k = torch.randn(b, ctx, 8, 128, device=dev, dtype=DTYPE)
        v = V_SCALE * torch.randn(b, ctx, 8, 128, device=dev, dtype=DTYPE)
        self.k_logical, self.v_logical = k, v
        if block_size is None:
            self.k_cache, self.v_cache, self.table = k, v, None
        else:
            per_seq = ctx // block_size
            perm = torch.randperm(b * per_seq, device=dev)
            self.table = perm.view(b, per_seq).to(torch.int32)
            self.k_cache = torch.empty(b * per_seq, block_size, 8, 128, device=dev, dtype=DTYPE)
            self.v_cache = torch.empty_like(self.k_cache)
            self.k_cache[perm] = k.view(b * per_seq, block_size, 8, 128)
            self.v_cache[perm] = v.view(b * per_seq, block_size, 8, 128)
        self.out = None

    def _run(self):
        self.out = self.kernel.flash_attn_with_kvcache(
            self.q,
            self.k_cache,
            self.v_cache,
            cache_seqlens=self.seqlens,
            block_table=self.table,
            causal=True,
        )

    def _verify(self):
        outs = [
            _reference(self, self.q[b], self.k_logical[b, :n], self.v_logical[b, :n])
            for b, n in enumerate(self.lens)
        ]
        return torch.stack(outs).to(DTYPE)

    def setup_llama3_8b_contiguous(self):
        self._setup()

    def benchmark_llama3_8b_contiguous(self):
        self._run()

    def verify_llama3_8b_contiguous(self):
        return self._verify()

    def setup_llama3_8b_paged16(self):
        self._setup(block_size=16)

    def benchmark_llama3_8b_paged16(self):
        self._run()

    def verify_llama3_8b_paged16(self):
        return self._verify()

    def setup_llama3_8b_paged256(self):
        self._setup(block_size=256)

    def benchmark_llama3_8b_paged256(self):
        self._run()

    def verify_llama3_8b_paged256(self):
        return self._verify()
