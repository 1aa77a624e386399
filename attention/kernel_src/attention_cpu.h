// attention_cpu.h: the C++ CPU implementation of the attention forward (attention_params.h).
//
// Same contract as the CUDA backend (attention_cuda.h): every field of AttnFwdParams, with
// float32, float16 and bfloat16 q/k/v/out (and float64, the CPU only) and any head_dim > 0. Preconditions, checked by the
// caller (torch-ext/attention_ops.cpp): pointers on the CPU, shapes and strides as
// attention_params.h lays them out, and the values of the int32 index arrays (cu_seqlens,
// seqused_k, block_table, kv_batch_idx, leftpad_k) in range; attn_fwd throws c10::Error
// (TORCH_CHECK) when the params are inconsistent in themselves, before writing anything.
#pragma once

#include <cstdint>

#include "attention_params.h"

namespace attention {
namespace cpu {

// Split-KV count the CPU backend uses for `params`: always 1. The key range of a query tile is
// swept in one pass with an online softmax; splitting it would only help a GPU's occupancy, so
// num_splits (any value) is accepted and ignored, and out_accum / lse_accum are never touched.
int64_t attn_fwd_num_splits(const AttnFwdParams& params);

// Computes params.out (and params.lse, if set) as attention_params.h specifies, on ATen's thread
// pool (at::parallel_for; torch.set_num_threads applies).
void attn_fwd(const AttnFwdParams& params);

// Computes params.dq, dk and dv (attention_params.h, AttnBwdParams), one task per (sequence, kv
// head) on ATen's thread pool; each task writes only its own rows, so the result does not depend
// on the thread count.
void attn_bwd(const AttnBwdParams& params);

}  // namespace cpu
}  // namespace attention
