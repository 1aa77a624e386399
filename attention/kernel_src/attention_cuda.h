// attention_cuda.h: host launcher of the CUDA attention forward (no Torch headers).
//
// One entry for every form of the forward (attention_params.h): padded or varlen batches,
// seqused_k / kv_batch_idx / leftpad_k key ranges, paged K/V, MQA/GQA, causal and sliding
// windows, softcap, ALiBi, lse, and split-KV (flash-decoding) with its merge (a combine kernel,
// or inside a thread-block cluster on sm_90+). Two paths behind it: stage 1, the mma.sync kernels
// of every capability, and on capability 9.0 the Hopper kernel (wgmma, TMA) for the params its
// rule admits (attention_sm90.h: fixed-length fp16 / bf16 prefill at head dim 64, 96, 128, 192
// or 256, causal or not, without softcap, ALiBi, windows or splits), unless params.allow_hopper
// is false.
// Preconditions, checked by the caller (torch-ext/): pointers on the current device, the shape and
// stride rules of attention_params.h, q/k/v/out fp16 or bf16 of one dtype, head_dim a multiple of 8
// up to 256 (the caller pads other head dims), the int32 index arrays in range (the kernels trust
// their values, except a key length past the rows of its sequence: that sequence reads no key,
// gets NaN out and lse, and is reported to params.errors, device_errors.h), out not overlapping
// q/k/v. Besides those, the kernels move q/k/v/out in 16-byte chunks: every base pointer must be
// 16-byte aligned and every batch/row/head stride a multiple of 8 elements (16 bytes); lse,
// out_accum and lse_accum 8-byte aligned. attn_fwd checks the params
// for internal consistency (cudaErrorInvalidValue when they are not, including a violated
// alignment, before anything is launched), enqueues its kernels on `stream` and returns the launch
// status; it launches nothing when there is no query row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention_params.h"

namespace attention {
namespace cuda {

// Split rows of the fp32 workspace that attn_fwd needs for `params` on the current device: 0 when
// it needs none (the Hopper path, a single split, or the splits of each tile merged inside a
// thread-block cluster, decode tiles on sm_90+), else the split count (params.num_splits when >= 1, capped at 128 and
// at the number of key tiles, or the occupancy heuristic's choice), and the caller passes
// out_accum [splits, batch, heads_q, seqlen_q, head_dim] and lse_accum [splits, batch, heads_q,
// seqlen_q] (fp32, contiguous) for that many splits. Pass num_splits unchanged to attn_fwd (0
// stays 0: the choice is deterministic for the same params and device). Returns -1 when the
// params are invalid (attn_fwd would return cudaErrorInvalidValue).
int64_t attn_fwd_accum_splits(const AttnFwdParams& params);

// Whether attn_fwd would use params.tile_counter (one zeroed int32 of the caller's) on the current
// device: the Hopper kernel's causal calls (their tiles differ in length). false for invalid params.
bool attn_fwd_tile_counter_needed(const AttnFwdParams& params);

cudaError_t attn_fwd(const AttnFwdParams& params, cudaStream_t stream);

// The backward (attention_bwd.cu, sm_80+ mma.sync): params.dq / dk / dv of params.fwd's attention
// for params.dout; deterministic (no atomics) unless params.dq_accum is set (AttnBwdParams in
// attention_params.h). Dense or varlen (cu_seqlens_q / cu_seqlens_k), MQA/GQA, causal, windows,
// softcap and ALiBi; no paged K/V, seqused_k, kv_batch_idx or leftpad_k. The forward's
// preconditions above hold for q/k/v/out/dout/dq/dk/dv alike, plus head_dim at most
// attn_bwd_max_head_dim(), lse given (the forward's, fp32) and `dsum` a workspace of fp32 laid
// out as lse ([batch, heads_q, seqlen_q] or [heads_q, total_q], lse's strides), which receives
// rowsum(dout * out). q_rows: rows of q (batch * seqlen_q, or total_q when varlen). Every row of
// dq, dk and dv inside a sequence is written; packed rows outside every sequence are not (with
// dq_accum, dq's get the workspace's zeros). Returns cudaErrorInvalidValue for params outside
// these rules, before any launch.
cudaError_t attn_bwd(const AttnBwdParams& params, float* dsum, int64_t q_rows, cudaStream_t stream);

// The largest head dim attn_bwd takes on the current device: 256 where a block's shared memory
// holds its head-dim-256 tiles (sm_80, sm_90: 163 KB and more), else 128 (sm_86, sm_89, sm_120:
// 99 KB).
int64_t attn_bwd_max_head_dim();

// The Hopper backward (attention_sm90.h: wgmma, TMA; fp16 / bf16 at head dims 40 to 256, dense or
// varlen, causal or not, GQA; dQ added by bulk reductions up to head dim 128, so not
// deterministic). Returns the floats of
// fp32 workspace it needs for `params` on the current device: nonzero exactly when it takes them
// (capability 9.0, params.fwd.allow_hopper, sm90::bwd_supports). Callers that do not need the same
// bits on every run call attn_bwd_hopper with that workspace (any contents, 16-byte aligned)
// where this is nonzero, and attn_bwd otherwise.
int64_t attn_bwd_hopper_workspace(const AttnBwdParams& params);
cudaError_t attn_bwd_hopper(const AttnBwdParams& params, float* workspace, cudaStream_t stream);

}  // namespace cuda
}  // namespace attention
