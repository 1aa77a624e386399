// attention_fwd_args.h: the kernel arguments of the CUDA attention forward (FwdArgs) and of its
// split-KV combine (CombineArgs, CombineSmem), resolved by the host launcher (attention_cuda.cu).
#pragma once

#include <cstdint>

#include "attention_cuda_mma.cuh"
#include "attention_fwd_config.h"
#include "device_errors.h"

namespace attention {
namespace cuda {

using detail::FastDivU32;

// ---------------------------------------------------------------------------------------------
// Kernel arguments (attention_params.h, resolved by the launcher).
// ---------------------------------------------------------------------------------------------
struct FwdArgs {
  const void* q;  // [batch, seqlen_q, heads_q, D] (varlen: [1, total_q, heads_q, D])
  const void* k;  // [batch_k, seqlen_k, heads_kv, D] / packed / [num_blocks, page, heads_kv, D]
  const void* v;  // as k
  void* out;      // as q
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t out_batch_stride, out_row_stride, out_head_stride;
  float* lse;  // [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]) or null
  int64_t lse_batch_stride, lse_head_stride;
  const int32_t* cu_seqlens_q;  // [batch + 1] or null
  const int32_t* cu_seqlens_k;  // [batch + 1] or null
  const int32_t* seqused_k;     // [batch] or null
  const int32_t* kv_batch_idx;  // [batch] or null
  const int32_t* leftpad_k;     // [batch] or null
  const int32_t* block_table;   // [batch, max_blocks] or null (not paged)
  int64_t block_table_batch_stride;
  FastDivU32 page_div;  // j / page_block_size
  int page_block_size;
  int seqlen_q, seqlen_k;  // padded / maximum lengths
  int batch, batch_base;   // sequences; first sequence of this launch
  int heads_q, group;      // group = heads_q / heads_kv
  // The caller's head dim, a multiple of 8 up to the instance's kHeadDim, and its last 16-byte
  // chunk (head_dim / 8 - 1): the columns past it are zeros in Q (they add nothing to Q K^T) and
  // never stored (attention_tile.cuh, "Tile loads").
  int head_dim, last_chunk;
  int qpack;             // q heads packed into the rows of a tile: group or 1
  FastDivU32 qpack_div;  // packed row -> query index
  int m_blocks, num_splits;
  int cluster_merge;          // 1: the splits of a tile are one cluster and merge there
  uint32_t tile_group;        // pairs per heaviest-first group (tile_coords); 1: grid order
  FastDivU32 group_ctas_div;  // linear CTA index -> group (gridDim.x * tile_group CTAs each)
  FastDivU32 tile_group_div;  // CTA index in a group -> tile rank
  FastDivU32 heads_grid_div;  // pair -> sequence (gridDim.y pairs each)
  float scale_log2;           // softmax_scale * log2(e)
  float softcap_scale;        // softmax_scale / softcap
  float softcap_log2;         // softcap * log2(e); 0: no softcap
  const float* alibi;         // [heads_q] or [batch, heads_q] or null
  int64_t alibi_batch_stride;
  int64_t win_left, win_right;  // kUnbounded for an absent side (causal: right = 0)
  float* out_accum;             // [splits, batch, heads_q, seqlen_q, head_dim] when
                                // num_splits > 1 and not cluster_merge
  float* lse_accum;             // [splits, batch, heads_q, seqlen_q]
  DeviceErrorRecord* errors;    // device_errors.h (null: not reported)
  DeviceErrorOp error_op;
};

// Split-KV combine (attention_fwd_combine_kernel.cuh).
struct CombineArgs {
  const float* out_accum;  // [splits, batch, heads_q, seqlen_q, D]
  const float* lse_accum;  // [splits, batch, heads_q, seqlen_q]
  void* out;
  int64_t out_batch_stride, out_row_stride, out_head_stride;
  float* lse;
  int64_t lse_batch_stride, lse_head_stride;
  const int32_t* cu_seqlens_q;
  int batch, heads_q, seqlen_q, head_dim, num_splits;
};

struct CombineSmem {
  static constexpr int kWarps = LaunchConfig::kCombineWarps;
  float weight[LaunchConfig::kMaxSplits];  // exp(lse_s - lse), 0 for skipped splits
  float4 partial[kWarps - 1][2][32];       // rows of warps 1.., 4 channels per lane (D <= 256)
};

}  // namespace cuda
}  // namespace attention
