// attention_cuda.h: host launcher of the CUDA attention forward (no Torch headers).
//
// One entry for every form of the forward (attention_params.h): padded or varlen batches,
// seqused_k / kv_batch_idx / leftpad_k key ranges, paged K/V, MQA/GQA, causal and sliding
// windows, softcap, ALiBi, lse, and split-KV (flash-decoding) with its combine pass.
// Preconditions, checked by the caller (torch-ext/): pointers on the current device, the shape
// and stride rules of attention_params.h, q/k/v/out fp16 or bf16 of one dtype, head_dim one of
// 32, 64, 96, 128, 192, 256, the int32 index arrays in range (the kernels trust their values),
// out not overlapping q/k/v. Besides those, the kernels move q/k/v/out in 16-byte chunks: every
// base pointer must be 16-byte aligned and every batch/row/head stride a multiple of 8
// elements (16 bytes); lse, out_accum and lse_accum 8-byte aligned. attn_fwd checks the params
// for internal consistency (cudaErrorInvalidValue when they are not, including a violated
// alignment, before anything is launched), enqueues its kernels on `stream` and returns the
// launch status; it launches nothing when there is no query row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention_params.h"

namespace attention {
namespace cuda {

// Number of KV splits attn_fwd uses for `params` on the current device (>= 1): params.num_splits
// when it is >= 1 (capped at 128 and at the number of key tiles), else the occupancy heuristic
// (fill the SMs with batch x kv-head x query-tile CTAs times splits). When the result is > 1 the
// caller passes out_accum [splits, batch, heads_q, seqlen_q, head_dim] and lse_accum [splits,
// batch, heads_q, seqlen_q] (fp32, contiguous) for that many splits, and passes num_splits
// unchanged (0 stays 0: the choice is deterministic for the same params and device). Returns 0
// when the params are invalid (attn_fwd would return cudaErrorInvalidValue).
int64_t attn_fwd_num_splits(const AttnFwdParams& params);

cudaError_t attn_fwd(const AttnFwdParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace attention
