"""`kernels benchmark` workloads for the rope kernel (rotary embeddings of named models).

    kernels benchmark open-kernels/rope@v1     # from the Hub
    kernels benchmark rope                     # a local kernel folder (its build/)

Each workload allocates its inputs and `self.out` in `setup_<w>`, times one kernel call in
`benchmark_<w>` and returns, in `verify_<w>`, an fp32 reference computed here in plain torch
(the `reference_*` functions below, which follow kernel_src/rope_params.h: fp32 math, rounded
once) cast to the output dtype. The runner compares with atol=1e-2 and rtol=1e-5, so the
activations are scaled by 0.2: a rotation keeps |out| <= sqrt(2) * max|x| < 2, where one bf16 ulp
is 2**-7 < 1e-2, and the kernel and the reference (both fp32 math, rounded once, but possibly in
another order or with an FMA) differ by at most that ulp.

In-place workloads (vLLM `rotary_embedding` on views of a fused qkv buffer) mutate their inputs:
`setup_<w>` keeps copies of the original q and k and `verify_<w>` computes the reference from
those copies. The runner calls `benchmark_<w>` exactly once before verifying, so `self.out` (the
query view) holds one application. `verify_<w>` also checks the key and that v was not touched,
and raises if either is wrong (the runner compares only `self.out`).

Shapes from the model configs: Llama-3-8B (32 query heads, 8 kv heads, head_dim 128, theta
500000), Gemma-2-9B-like head_dim 256 (16 / 8 heads), GPT-J-6B (16 heads, head_dim 256,
interleaved pairs, rotary_dim 64: partial rotary); decode = 32 tokens (one step of a 32-sequence batch), prefill = 4096 tokens (one
4K prompt). The runner's timer includes launch overhead; benchmarks/sweep.py times the same ops
against eager PyTorch and torch.compile in the same run.
"""

import torch
from kernels.benchmark import Benchmark

DECODE_TOKENS = 32
PREFILL_TOKENS = 4096
MAX_POSITIONS = 8192
INPUT_SCALE = 0.2  # |out| < 2: see the module docstring


# ---- fp32 references (kernel_src/rope_params.h); also used by sweep.py ----


def cos_sin_cache(max_pos, rot_dim, device, base=500000.0, dtype=torch.float32):
    """vLLM's cos_sin_cache [max_pos, rot_dim] = cat(cos, sin), computed in fp32 as vLLM does."""
    inv_freq = 1.0 / (
        base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim)
    )
    t = torch.arange(max_pos, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)


def reference_rotary_embedding(positions, x, head_size, cache, is_neox=True):
    """vLLM rotary_embedding of one of query/key (x [..., H * D]), out of place: fp32 math,
    rounded once to x's dtype. Rows of `cache` gathered by `positions`; channels from
    rot_dim = cache.shape[-1] on pass through."""
    rot = cache.shape[-1]
    xs = x.float().reshape(*positions.shape, -1, head_size)
    cos, sin = cache.float()[positions.long()].unsqueeze(-2).chunk(2, dim=-1)  # [..., 1, rot/2]
    r, rest = xs[..., :rot], xs[..., rot:]
    if is_neox:
        a, b = r[..., : rot // 2], r[..., rot // 2 :]
    else:
        a, b = r[..., 0::2], r[..., 1::2]
    na, nb = a * cos - b * sin, b * cos + a * sin
    if is_neox:
        r = torch.cat([na, nb], dim=-1)
    else:
        r = torch.stack([na, nb], dim=-1).flatten(-2)
    return torch.cat([r, rest], dim=-1).reshape(x.shape).to(x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def reference_transformers(q, cos, sin, unsqueeze_dim=1):
    """transformers' q * cos + rotate_half(q) * sin, in fp32, rounded once."""
    cos, sin = cos.float().unsqueeze(unsqueeze_dim), sin.float().unsqueeze(unsqueeze_dim)
    return (q.float() * cos + rotate_half(q.float()) * sin).to(q.dtype)


def check_close(what, got, want):
    """One bf16 ulp of |want| (2**-8 relative, two roundings of nearly equal fp32 values may
    differ by one ulp) plus a floor of 2**-8 * rms(want) for elements that cancel."""
    got, want = got.float(), want.float()
    eps = torch.finfo(torch.bfloat16).eps
    err = (got - want).abs()
    ok = err <= eps * want.abs() + eps * want.pow(2).mean().sqrt()
    if not bool(ok.all()):
        raise AssertionError(f"{what}: max error {err.max().item()}")


# ---- vLLM rotary_embedding, in place on a fused qkv buffer ----


def _fused_qkv(bench, tokens, q_heads, kv_heads, head_dim, rot_dim, is_neox=True):
    """bench.qkv [tokens, (q_heads + 2 kv_heads) * head_dim] bf16, q/k/v column views of it (the
    layout vLLM's attention layers hand to rotary_embedding), positions, cos_sin_cache (fp32)."""
    dtype = torch.bfloat16
    q_size, kv_size = q_heads * head_dim, kv_heads * head_dim
    bench.head_dim, bench.is_neox = head_dim, is_neox
    bench.qkv = INPUT_SCALE * torch.randn(
        tokens, q_size + 2 * kv_size, device=bench.device, dtype=dtype
    )
    bench.q, bench.k, bench.v = bench.qkv.split([q_size, kv_size, kv_size], dim=-1)
    bench.positions = torch.randint(0, MAX_POSITIONS, (tokens,), device=bench.device)
    bench.cache = cos_sin_cache(MAX_POSITIONS, rot_dim, bench.device)
    bench.qkv0 = bench.qkv.clone()
    bench.out = bench.q


class RotaryEmbeddingBenchmark(Benchmark):
    """vLLM `rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)`, in place on
    the q and k column views of a fused qkv projection output (bf16, cos_sin_cache fp32)."""

    seed = 0

    def _run(self):
        self.kernel.rotary_embedding(
            self.positions, self.q, self.k, self.head_dim, self.cache, self.is_neox
        )

    def _verify(self):
        q0, k0, v0 = self.qkv0.split([self.q.shape[-1], self.k.shape[-1], self.v.shape[-1]], dim=-1)
        k_ref = reference_rotary_embedding(
            self.positions, k0, self.head_dim, self.cache, self.is_neox
        )
        check_close("key", self.k, k_ref)
        if not torch.equal(self.v, v0):
            raise AssertionError("value columns of the fused qkv buffer changed")
        return reference_rotary_embedding(
            self.positions, q0, self.head_dim, self.cache, self.is_neox
        )

    # Llama-3-8B: 32 / 8 heads, head_dim 128
    def setup_llama3_8b_decode(self):
        _fused_qkv(self, DECODE_TOKENS, 32, 8, 128, 128)

    def benchmark_llama3_8b_decode(self):
        self._run()

    def verify_llama3_8b_decode(self):
        return self._verify()

    def setup_llama3_8b_prefill(self):
        _fused_qkv(self, PREFILL_TOKENS, 32, 8, 128, 128)

    def benchmark_llama3_8b_prefill(self):
        self._run()

    def verify_llama3_8b_prefill(self):
        return self._verify()

    # head_dim 256 (Gemma-2-9B-like: 16 / 8 heads)
    def setup_head256_prefill(self):
        _fused_qkv(self, PREFILL_TOKENS, 16, 8, 256, 256)

    def benchmark_head256_prefill(self):
        self._run()

    def verify_head256_prefill(self):
        return self._verify()

    # GPT-J-6B: interleaved pairs, partial rotary (rotary_dim 64 of head_dim 256), 16 heads
    def setup_gptj_partial_prefill(self):
        _fused_qkv(self, PREFILL_TOKENS, 16, 16, 256, 64, is_neox=False)

    def benchmark_gptj_partial_prefill(self):
        self._run()

    def verify_gptj_partial_prefill(self):
        return self._verify()


# ---- transformers apply_rotary_pos_emb form, out of place ----


class TransformersRotaryBenchmark(Benchmark):
    """`apply_rotary_transformers(q, k, cos, sin)`: transformers' layout (q [B, H, S, D], the
    transposed view of a projection output), full cos/sin [B, S, D] in bf16 as LlamaRotaryEmbedding
    returns them; new q and k. `self.out` is the rotated q; verify also checks k."""

    seed = 0

    def _setup(self, batch, seqlen, q_heads, kv_heads, head_dim):
        dtype = torch.bfloat16
        self.q = (
            INPUT_SCALE
            * torch.randn(batch, seqlen, q_heads, head_dim, device=self.device, dtype=dtype)
        ).transpose(1, 2)
        self.k = (
            INPUT_SCALE
            * torch.randn(batch, seqlen, kv_heads, head_dim, device=self.device, dtype=dtype)
        ).transpose(1, 2)
        cache = cos_sin_cache(seqlen, head_dim, self.device)
        cos, sin = cache.chunk(2, dim=-1)
        self.cos = torch.cat([cos, cos], dim=-1).to(dtype).expand(batch, seqlen, head_dim)
        self.sin = torch.cat([sin, sin], dim=-1).to(dtype).expand(batch, seqlen, head_dim)
        self.out, self.k_out = None, None

    def _run(self):
        self.out, self.k_out = self.kernel.apply_rotary_transformers(
            self.q, self.k, self.cos, self.sin
        )

    def _verify(self):
        check_close("key", self.k_out, reference_transformers(self.k, self.cos, self.sin))
        return reference_transformers(self.q, self.cos, self.sin)

    def setup_llama3_8b_prefill(self):
        self._setup(1, PREFILL_TOKENS, 32, 8, 128)

    def benchmark_llama3_8b_prefill(self):
        self._run()

    def verify_llama3_8b_prefill(self):
        return self._verify()

    def setup_llama3_8b_batch8_1k(self):
        self._setup(8, PREFILL_TOKENS // 4, 32, 8, 128)  # 8 sequences of 1K tokens

    def benchmark_llama3_8b_batch8_1k(self):
        self._run()

    def verify_llama3_8b_batch8_1k(self):
        return self._verify()
