// attention_sm90.h: the Hopper (sm_90a) attention forward behind attn_fwd (attention_cuda.h), no
// Torch or CUTLASS headers. The kernel (wgmma, TMA, warp specialization) is
// attention_sm90_fwd.cuh; attention_sm90.cu and its generated instances are built for 9.0a only
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
//   - dtype float16 or bfloat16; head_dim exactly 64, 96, 128, 192 or 256;
//   - fixed-length batches: no cu_seqlens_q, cu_seqlens_k, seqused_k, kv_batch_idx, leftpad_k
//     or block_table;
//   - no score modifier: softcap == 0, alibi_slopes null;
//   - no sliding window: window_left < 0, and window_right < 0 unless causal (a causal call
//     carries window_right 0, which the causal mask implies);
//   - num_splits 0 or 1 (0, the backend's choice, is no split: this path never splits the keys);
//   - seqlen_q >= 64: decode-sized queries stay on the stage-1 decode and split-KV kernels;
//   - batch, heads_q, heads_kv, seqlen_q and seqlen_k fit in int32, and so does the number of
//     64-row query tiles, batch * heads_q * ceil(seqlen_q / 64);
//   - q/k/v strides, in bytes, below 2^40 and nonzero along every dimension of more than one
//     index (the kernel loads them through TMA descriptors; a broadcast view, stride 0, stays
//     on stage 1).
// A pure host function (no CUDA call): attn_fwd and attn_fwd_accum_splits decide alike.
bool supports(const AttnFwdParams& p);

// Enqueues the forward of `p` (supports(p) true) on `stream` for a device of `sm_count` SMs and
// returns the launch status. It launches without PDL whatever p.pdl_request asks, and reports
// nothing to p.errors (a fixed-length batch has no key length to check).
cudaError_t fwd(const AttnFwdParams& p, int sm_count, cudaStream_t stream);

}  // namespace sm90
}  // namespace cuda
}  // namespace attention
