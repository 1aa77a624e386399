// attention_fwd_combine_kernel.cuh: the split-KV combine kernel of the CUDA attention forward
// (device code; instantiated in attention_fwd_combine.cu, launched by attention_cuda.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_fwd_args.h"
#include "attention_fwd_config.h"
#include "attention_tile.cuh"
#include "pdl.cuh"

namespace attention {
namespace cuda {

// ---------------------------------------------------------------------------------------------
// Split-KV combine: one CTA per output row (b, h, i). lse = log(sum_s exp(lse_s)),
// out = sum_s exp(lse_s - lse) out_s; splits with lse_s = -inf (no visible key) are skipped (their
// out_accum rows, never written, get weight 0); a row with no split left gets out = 0, lse = +inf.
// The warps take interleaved splits, kCombineUnroll independent row loads at a time, and warp 0
// adds up their partial rows (a single warp walking the splits one dependent L2 load after another
// was far slower). The first rows are loaded together with the split lse values (one L2 round
// trip, not two). Where a batch-1 decode call's time goes, and why merging in the split kernel
// instead (last CTA to arrive) lost: benchmarks/NOTES.md.
// ---------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(32 * LaunchConfig::kCombineWarps)
    attn_fwd_combine_kernel(const __grid_constant__ CombineArgs a) {
  constexpr int kPerLane = LaunchConfig::kMaxSplits / 32;
  constexpr int kWarps = LaunchConfig::kCombineWarps;
  constexpr int kUnroll = LaunchConfig::kCombineUnroll;
  CombineSmem& sm = *reinterpret_cast<CombineSmem*>(dynamic_smem());
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t row = blockIdx.x;  // the grid has exactly one CTA per row
  const int64_t total = static_cast<int64_t>(a.batch) * a.heads_q * a.seqlen_q;
  const int i = static_cast<int>(row % a.seqlen_q);
  const int64_t bh = row / a.seqlen_q;
  const int h = static_cast<int>(bh % a.heads_q);
  const int b = static_cast<int>(bh / a.heads_q);
  // The divisions above (64-bit) are done while the grid waits for its predecessor.
  pdl::wait_and_release_after_params(static_cast<uint64_t>(i ^ h ^ b) ^ total, a);
  int len_q = a.seqlen_q, q_start = 0;
  if (a.cu_seqlens_q != nullptr) {
    q_start = __ldg(a.cu_seqlens_q + b);
    len_q = __ldg(a.cu_seqlens_q + b + 1) - q_start;
  }
  if (i >= len_q) return;  // the whole CTA: padding row of a varlen batch
  const int64_t split_stride = total;

  // Every warp: the rows of its splits warp, warp + kWarps, ... in groups of kUnroll independent
  // loads. The first group is loaded before the weights are known, so that its L2 round trip
  // overlaps warp 0's loads of the split lse values (at most kWarps x kUnroll splits, the usual
  // count, take one round trip instead of two). A split without a visible key never wrote its
  // row: such a row may hold anything, and its weight 0 selects it out below rather than
  // multiplying it. Later groups load only rows of nonzero weight.
  float4 x[kUnroll][2];
  const auto load_group = [&](int sp0, bool speculative) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int sp = sp0 + u * kWarps;
      const bool wanted = sp < a.num_splits && (speculative || sm.weight[sp] != 0.0f);
      const float* src = a.out_accum + (sp * split_stride + row) * a.head_dim;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int d0 = 4 * lane + 128 * k;
        x[u][k] = wanted && d0 < a.head_dim ? *reinterpret_cast<const float4*>(src + d0)
                                            : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  };
  load_group(warp, true);

  // Warp 0: the weights and the row's lse.
  float lse_row = kInf;
  if (warp == 0) {
    float w[kPerLane];
    float mx = -kInf;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int sp = lane + 32 * t;
      w[t] = sp < a.num_splits ? a.lse_accum[sp * split_stride + row] : -kInf;
      mx = fmaxf(mx, w[t]);
    }
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) mx = fmaxf(mx, shfl_xor(mx, d));
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      // A split without a visible key (lse -inf) weighs 0. A NaN lse (a NaN score in that split)
      // is not in mx (fmaxf drops it) but gives a NaN weight (also when every other split is
      // empty, mx = -inf), so that sum, the weights, the row and its lse come out NaN.
      w[t] = w[t] == -kInf ? 0.0f : expf(w[t] - mx);
      sum += w[t];
    }
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) sum += shfl_xor(sum, d);
    const float inv = sum != 0.0f ? 1.0f / sum : 0.0f;
    if (sum != 0.0f) lse_row = mx + logf(sum);
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) sm.weight[lane + 32 * t] = w[t] * inv;
  }
  __syncthreads();

  float4 acc[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
  for (int sp0 = warp; sp0 < a.num_splits; sp0 += kWarps * kUnroll) {
    if (sp0 != warp) load_group(sp0, false);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int sp = sp0 + u * kWarps;
      const float ws = sp < a.num_splits ? sm.weight[sp] : 0.0f;
      if (ws == 0.0f) continue;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        acc[k].x = fmaf(ws, x[u][k].x, acc[k].x);
        acc[k].y = fmaf(ws, x[u][k].y, acc[k].y);
        acc[k].z = fmaf(ws, x[u][k].z, acc[k].z);
        acc[k].w = fmaf(ws, x[u][k].w, acc[k].w);
      }
    }
  }
  if (warp > 0) {
#pragma unroll
    for (int k = 0; k < 2; ++k) sm.partial[warp - 1][k][lane] = acc[k];
  }
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int w = 0; w < kWarps - 1; ++w) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float4 p = sm.partial[w][k][lane];
      acc[k].x += p.x;
      acc[k].y += p.y;
      acc[k].z += p.z;
      acc[k].w += p.w;
    }
  }
  T* out = static_cast<T*>(a.out) +
           (a.cu_seqlens_q != nullptr
                ? static_cast<int64_t>(q_start + i) * a.out_row_stride
                : b * a.out_batch_stride + static_cast<int64_t>(i) * a.out_row_stride) +
           static_cast<int64_t>(h) * a.out_head_stride;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int d0 = 4 * lane + 128 * k;
    if (d0 < a.head_dim) {
      uint2 packed;
      packed.x = pack2<T>(acc[k].x, acc[k].y);
      packed.y = pack2<T>(acc[k].z, acc[k].w);
      *reinterpret_cast<uint2*>(out + d0) = packed;
    }
  }
  if (a.lse != nullptr && lane == 0) {
    const int64_t li =
        a.cu_seqlens_q != nullptr
            ? static_cast<int64_t>(h) * a.lse_head_stride + q_start + i
            : b * a.lse_batch_stride + static_cast<int64_t>(h) * a.lse_head_stride + i;
    a.lse[li] = lse_row;
  }
}

}  // namespace cuda
}  // namespace attention
