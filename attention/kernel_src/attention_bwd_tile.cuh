// attention_bwd_tile.cuh: per-CTA building blocks of the CUDA attention backward on sm_80+ tensor
// cores (mma.sync m16n8k16, fp32 accumulation): the launch's tile constants, sequence rows and
// the visibility band, cp.async tile loads, p and ds of one score element, the warp's products
// on swizzled shared-memory tiles, the stores of its gradient rows and the atomic adds of dQ.
// Device code; the backward kernels (attention_bwd_kernel.cuh) compose them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention_cuda_mma.cuh"
#include "attention_params.h"

namespace attention {
namespace cuda {
namespace bwd {

using namespace detail;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockRows = 64;  // keys per dK/dV CTA, queries per dQ CTA, and of each loop tile

// The dK/dV pass's warps. A warp owns 16 keys (a slab) and the dK, dV columns of one part of the
// head dim: past 128 the accumulators of a whole row (2 x D / 8 floats a thread) would not fit in
// registers, so two warps share a slab, each with half the columns (and its own copy of the slab's
// S^T and dP^T, which both halves need).
template <int D>
struct DkDvWarps {
  static constexpr int kParts = D > 128 ? 2 : 1;
  static constexpr int kCols = D / kParts;
  static constexpr int kThreads = kWarps * kParts * 32;
  static_assert(kParts == 1 || kCols % 64 == 0, "column parts start on a swizzle period");

  // The lane address of column part `part` of a swizzled [rows][D] tile, from that of column 0.
  // The swizzle repeats every 64 columns, so a part that starts on a multiple of 64 has the
  // pattern of column 0, shifted.
  __device__ __forceinline__ static uint32_t column_part(uint32_t lane_addr, int part) {
    return lane_addr + static_cast<uint32_t>(part * kCols * 2);
  }
};

// Shared memory of the dK/dV pass (attention_bwd_kernel.cuh): K, V tiles of [64][D], then per
// stage Q, dO tiles and the lse, D rows of the query tile, then (kAtomicDq) the dS^T tile. 16-bit
// elements: fp16 and bf16 take the same bytes.
template <int D, bool kAtomicDq, int kStages_>
struct DkDvSmem {
  static constexpr int kStages = kStages_;
  static constexpr int kTileBytes = kBlockRows * D * 2;
  static constexpr int kStageBytes = 2 * kTileBytes;     // Q, dO
  static constexpr int kRowsBytes = 2 * kBlockRows * 4;  // lse, D
  static constexpr int kDsBytes = kAtomicDq ? kBlockRows * kBlockRows * 2 : 0;
  static constexpr int kBytes = 2 * kTileBytes + kStages * (kStageBytes + kRowsBytes) + kDsBytes;
};

// Shared memory of the dQ pass: Q, dO tiles of [64][D], then per stage K, V tiles.
template <int D, int kStages_>
struct DqSmem {
  static constexpr int kStages = kStages_;
  static constexpr int kTileBytes = kBlockRows * D * 2;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K, V
  static constexpr int kBytes = 2 * kTileBytes + kStages * kStageBytes;
};

// One sequence's rows: first row in the (packed) tensor and length, for queries and keys.
struct SeqRows {
  int64_t q0, len_q, k0, len_k;
};

__device__ __forceinline__ SeqRows seq_rows(const AttnFwdParams& f, int b) {
  SeqRows s{0, f.seqlen_q, 0, f.seqlen_k};
  if (f.cu_seqlens_q != nullptr) {
    s.q0 = f.cu_seqlens_q[b];
    s.len_q = f.cu_seqlens_q[b + 1] - s.q0;
  }
  if (f.cu_seqlens_k != nullptr) {
    s.k0 = f.cu_seqlens_k[b];
    s.len_k = f.cu_seqlens_k[b + 1] - s.k0;
  }
  return s;
}

// The visibility band of the launch: key j is seen by query i (diag = i + len_k - len_q) when
// diag - left <= j <= diag + right, each side unbounded when negative.
struct Band {
  int64_t left, right;
};

__host__ __device__ __forceinline__ Band band_of(const AttnFwdParams& f) {
  Band w{f.window_left, f.window_right};
  if (f.causal) w.right = 0;  // causal is the window's right side at 0 (also under a wider one)
  return w;
}

__device__ __forceinline__ bool visible(int64_t diag, int64_t j, int64_t len_k, Band w) {
  return j < len_k && (w.left < 0 || j >= diag - w.left) && (w.right < 0 || j <= diag + w.right);
}

// Rows [row0, row0 + 64) x the head dim of a [rows][D] tensor into a swizzled tile with
// cp.async by threads [0, kLoaders); rows at or past `rows` and chunks past head_dim are
// zero-filled without a read.
template <int D, int kLoaders = kThreads, typename T>
__device__ __forceinline__ void load_tile(uint32_t tile, const T* base, int64_t row_stride,
                                          int64_t row0, int64_t rows, int head_dim, int tid) {
  constexpr int kChunks = D / 8;
  for (int c = tid; c < kBlockRows * kChunks; c += kLoaders) {
    const int r = c / kChunks, chunk = c % kChunks;
    const bool valid = row0 + r < rows && chunk * 8 < head_dim;
    const T* src = valid ? base + (row0 + r) * row_stride + chunk * 8 : base;
    cp_async_16(tile + tile_offset<D>(r, chunk), src, valid);
  }
}

// p and ds of one score element (attention_bwd_kernel.cuh's formulas), from the raw dot
// products q.k and dO.v.
struct ScoreMath {
  float softcap, softcap_scale;  // softcap 0: none; softcap_scale = scale / softcap
  float slope;
  __device__ __forceinline__ void eval(float qk, float dov, float lse, float dsum, int64_t diag,
                                       int64_t j, float scale, float& p, float& ds) const {
    float z = qk * scale, dz = 1.0f;
    if (softcap > 0.0f) {
      const float t = fast_tanh(qk * softcap_scale);
      z = softcap * t;
      dz = 1.0f - t * t;
    }
    if (slope != 0.0f) z -= slope * static_cast<float>(diag >= j ? diag - j : j - diag);
    p = fast_exp2((z - lse) * 1.4426950408889634f);
    ds = p * (dov - dsum) * dz;
  }
};

// c0 = A0 B0^T and c1 = A1 B1^T over the head dim, zeroed first: A0 / A1 the 16 rows of this
// warp (lane addresses a0 / a1 of (lane % 16, lane / 16)), B0 / B1 the 64 rows of a tile as the
// n dimension (lane addresses b0 / b1 of ((lane % 8) + 8 (lane / 16), (lane / 8) % 2)).
template <typename T, int D>
__device__ __forceinline__ void two_products(float (&c0)[kBlockRows / 8][4],
                                             float (&c1)[kBlockRows / 8][4], uint32_t a0,
                                             uint32_t b0, uint32_t a1, uint32_t b1) {
  using Rows = SwizzledRows<D>;
#pragma unroll
  for (int nt = 0; nt < kBlockRows / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) c0[nt][e] = c1[nt][e] = 0.0f;
  }
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t x0[4], x1[4];
    ldmatrix_x4(x0, Rows::at(a0, 0, ks));
    ldmatrix_x4(x1, Rows::at(a1, 0, ks));
#pragma unroll
    for (int np = 0; np < kBlockRows / 16; ++np) {
      uint32_t y0[4], y1[4];
      ldmatrix_x4(y0, Rows::at(b0, np * 16, ks));
      ldmatrix_x4(y1, Rows::at(b1, np * 16, ks));
      mma_16816<T>(c0[2 * np], x0, y0[0], y0[1]);
      mma_16816<T>(c0[2 * np + 1], x0, y0[2], y0[3]);
      mma_16816<T>(c1[2 * np], x1, y1[0], y1[1]);
      mma_16816<T>(c1[2 * np + 1], x1, y1[2], y1[3]);
    }
  }
}

// The A fragment of k-step ks from C fragments: n-tiles 2 ks and 2 ks + 1, rounded to T.
template <typename T>
__device__ __forceinline__ void a_fragment(uint32_t (&a)[4], const float (&c)[kBlockRows / 8][4],
                                           int ks) {
  a[0] = pack2<T>(c[2 * ks][0], c[2 * ks][1]);
  a[1] = pack2<T>(c[2 * ks][2], c[2 * ks][3]);
  a[2] = pack2<T>(c[2 * ks + 1][0], c[2 * ks + 1][1]);
  a[3] = pack2<T>(c[2 * ks + 1][2], c[2 * ks + 1][3]);
}

// acc += A (k = the 64 tile rows) times kCols columns of the tile at t_lane as the B operand
// ([k][D] rows read transposed; lane address of (lane % 16, lane / 16), at the first column).
template <typename T, int D, int kCols = D>
__device__ __forceinline__ void product_with_rows(float (&acc)[kCols / 8][4],
                                                  const float (&c)[kBlockRows / 8][4],
                                                  uint32_t t_lane) {
  using Rows = SwizzledRows<D>;
#pragma unroll
  for (int ks = 0; ks < kBlockRows / 16; ++ks) {
    uint32_t a[4];
    a_fragment<T>(a, c, ks);
#pragma unroll
    for (int dp = 0; dp < kCols / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, Rows::at(t_lane, ks * 16, dp));
      mma_16816<T>(acc[2 * dp], a, b[0], b[1]);
      mma_16816<T>(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// Rows g and g + 8 of this warp's 16 (first row `row0`, `rows` valid) of acc * scale, columns
// 8 dt + 2t and + 1 below `cols`, into base (row stride in elements; base at acc's first column).
template <typename T, int kCols>
__device__ __forceinline__ void store_rows(T* base, int64_t row_stride,
                                           const float (&acc)[kCols / 8][4], float scale,
                                           int64_t row0, int64_t rows, int cols, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t r = row0 + g + half * 8;
    if (r >= rows) continue;
#pragma unroll
    for (int dt = 0; dt < kCols / 8; ++dt) {
      const int col = dt * 8 + 2 * t;
      if (col >= cols) continue;
      *reinterpret_cast<uint32_t*>(base + r * row_stride + col) =
          pack2<T>(acc[dt][2 * half] * scale, acc[dt][2 * half + 1] * scale);
    }
  }
}

// dQ of one dK/dV step (query rows i0.., head h) from the dS^T tile at `ds` ([64 keys][64
// queries], swizzled rows of 64) and the K tile (lane address k_t of (lane % 16, lane / 16), at
// column col0): the 16 queries of `slab` times kCols columns from col0, 16 columns at a time (8
// accumulators live, so that the dK / dV accumulators of the caller keep their registers), each
// added to the fp32 dq_accum rows [q_rows][heads_q][head_dim] with atomics; rows past the
// sequence are skipped.
template <typename T, int D, int kCols = D>
__device__ __forceinline__ void add_dq_of_step(const AttnBwdParams& p, uint32_t ds, uint32_t k_t,
                                               int col0, int64_t h, int64_t i0, const SeqRows& s,
                                               int64_t batch, int slab, int lane) {
  using Rows = SwizzledRows<D>;
  using DsRows = SwizzledRows<kBlockRows>;
  const AttnFwdParams& f = p.fwd;
  const int g = lane / 4, t = lane % 4;
  // A = dS (queries x keys) by transposed reads of dS^T: rows (lane % 8) + 8 (lane / 16) of a
  // 16-key step, query chunk 2 slab + (lane / 8) % 2.
  const uint32_t ds_lane = ds + DsRows((lane % 8) + (lane / 16) * 8, (lane / 8) % 2, 0).base;
  uint32_t a[kBlockRows / 16][4];
#pragma unroll
  for (int ks = 0; ks < kBlockRows / 16; ++ks)
    ldmatrix_x4_trans(a[ks], DsRows::at(ds_lane, ks * 16, slab));
  const int64_t row0 = (batch * f.seqlen_q + s.q0 + i0 + slab * 16) * f.heads_q + h;
  const int64_t row_stride = f.heads_q * f.head_dim;  // dq_accum: [q_rows][heads_q][head_dim]
#pragma unroll
  for (int dp = 0; dp < kCols / 16; ++dp) {
    float acc[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kBlockRows / 16; ++ks) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, Rows::at(k_t, ks * 16, dp));
      mma_16816<T>(acc[0], a[ks], b[0], b[1]);
      mma_16816<T>(acc[1], a[ks], b[2], b[3]);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + half * 8;
      if (i0 + slab * 16 + r >= s.len_q) continue;
      float* row = p.dq_accum + row0 * f.head_dim + r * row_stride;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int col = col0 + dp * 16 + nt * 8 + 2 * t;
        if (col >= f.head_dim) continue;
        atomicAdd(row + col, acc[nt][2 * half]);
        atomicAdd(row + col + 1, acc[nt][2 * half + 1]);
      }
    }
  }
}

// Explicit conversions (builds may define __CUDA_NO_HALF_CONVERSIONS__).
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

}  // namespace bwd
}  // namespace cuda
}  // namespace attention
