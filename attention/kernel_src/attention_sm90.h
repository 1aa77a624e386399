// attention_sm90.h: the Hopper (sm_90a) attention forward behind attn_fwd and backward behind
// attn_bwd (attention_cuda.h), no Torch or CUTLASS headers. The kernels (wgmma, TMA, warp
// specialization) are attention_sm90_fwd.cuh and attention_sm90_bwd.cuh; attention_sm90.cu and its generated instances are built for 9.0a only
// ([kernel.attention_cuda_sm90] of build.toml), while their host functions are called from the
// portable launcher, which takes this path on capability 9.0 when params.allow_hopper is set and
// supports() holds.
#pragma once

#include <cuda_runtime_api.h>

#include "attention_params.h"

namespace attention {
namespace cuda {
namespace sm90 {

// Whether the Hopper forward computes `p` (attention_params.h semantics), for params that attn_fwd
// accepts (attention_cuda.h's preconditions). True exactly when all of these hold:
//   - dtype float16 or bfloat16; head_dim a multiple of 8 from 40 to 256 (it runs on the instance
//     of 64, 96, 128, 192 or 256 at or above it, reading its tensors as zero-padded);
//   - fixed-length batches, or varlen ones with both cu_seqlens_q and cu_seqlens_k (total_q and
//     total_k set); no seqused_k, kv_batch_idx, leftpad_k or block_table;
//   - any mask and score modifier: causal or not, sliding windows, softcap, ALiBi;
//   - num_splits 0 or 1 (0, the backend's choice, is no split: this path never splits the keys);
//   - seqlen_q >= 64: decode-sized queries stay on the stage-1 decode and split-KV kernels;
//   - batch, heads_q, heads_kv, seqlen_q, seqlen_k, total_q and total_k fit in int32, and so do
//     the number of
//     64-row query tiles, batch * heads_q * ceil(seqlen_q / 64), and 2 * (seqlen_q + seqlen_k);
//   - q/k/v strides, in bytes, below 2^40 and nonzero along every dimension of more than one
//     index (the kernel loads them through TMA descriptors; a broadcast view, stride 0, stays
//     on stage 1).
// A pure host function (no CUDA call): attn_fwd and attn_fwd_accum_splits decide alike.
bool supports(const AttnFwdParams& p);

// Enqueues the forward of `p` (supports(p) true) on `stream` for a device of `sm_count` SMs and
// `l2_bytes` of L2 (they set the tile order) and returns the launch status. It launches without
// PDL whatever p.pdl_request asks, and reports nothing to p.errors (no key length to check: the
// keys of a sequence are seqlen_k rows, or its cu_seqlens_k difference).
cudaError_t fwd(const AttnFwdParams& p, int sm_count, int64_t l2_bytes, cudaStream_t stream);

// Whether the Hopper backward (attention_sm90_bwd.cuh) computes `p` (attention_params.h
// semantics). True exactly when all of these hold:
//   - dtype float16 or bfloat16; head_dim a multiple of 8 from 40 to 256 (it runs on the
//     instance of 64, 128 or 256 at or above it, reading its tensors as zero-padded);
//   - fixed-length batches, or varlen ones with both cu_seqlens_q and cu_seqlens_k (no seqused_k,
//     kv_batch_idx, leftpad_k or block_table), and no score modifier (softcap 0, no ALiBi);
//     causal or not, with or without a sliding window (any window_left / window_right);
//   - fwd.lse set; heads_q a multiple of heads_kv;
//   - batch, heads and lengths (total_q / total_k too) fit in int32, batch * heads_q <= 65535,
//     ceil(seqlen_k / 64) and ceil(seqlen_q / 128) <= 65535 (varlen: seqlen_q / seqlen_k the
//     longest sequence's);
//   - q, k, v and dout strides TMA-addressable (as above); out and dout 16-byte aligned with
//     strides of multiples of 8 elements; dq, dk and dv 4-byte aligned with even strides.
// Up to head dim 128 it adds dQ with atomics, so its dq may differ in the last bits from call to
// call: deterministic calls take the mma.sync backward (attention_cuda.h).
bool bwd_supports(const AttnBwdParams& p);

// The fp32 workspace bwd() needs on a device of sm_count SMs, in floats: batch * heads_q *
// round_up(seqlen_q, 128) * (accumulator + 2) (the dQ accumulator, lse and D), plus 2 * splits *
// batch * heads_kv * seqlen_k * instance when few CTAs lead the kernel to split each GQA group
// over `splits` of them (the dK / dV partials); instance: the kernel's head dim, 64, 128 or 256;
// accumulator: the instance up to 128, 0 at 256 (its dQ pass needs none).
int64_t bwd_workspace_floats(const AttnBwdParams& p, int sm_count);

// Enqueues the backward of `p` (bwd_supports(p) true) on `stream` for a device of sm_count SMs,
// using `workspace` (bwd_workspace_floats(p, sm_count) floats, any contents, 16-byte aligned),
// and returns the launch status.
cudaError_t bwd(const AttnBwdParams& p, int sm_count, float* workspace, cudaStream_t stream);

}  // namespace sm90
}  // namespace cuda
}  // namespace attention
