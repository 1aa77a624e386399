// attention_bwd_kernel.cuh: the attention backward on sm_80+ tensor cores (mma.sync m16n8k16,
// fp32 accumulation), the gradients of attention_params.h's forward:
//   p = exp(l - lse),  l = z - slope |diag - j|,  z = softcap tanh(s / softcap) (or s),
//   s = scale <q_i, k_j>,  D_i = <dO_i, O_i>,  dp = <dO_i, v_j>,  ds = p (dp - D_i) dz/ds,
//   dV_j = sum_i p dO_i,  dK_j = scale sum_i ds q_i,  dQ_i = scale sum_j ds k_j.
// Three kernels, none with atomics, so every result is deterministic:
//   attn_bwd_dsum:  D = rowsum(dO * O) in fp32, one warp per (row, head);
//   attn_bwd_dkdv:  one CTA per (64-key block, kv head, sequence); each of its 4 warps owns 16 keys
//                   and accumulates their dK and dV in registers over every query block of
//                   every query head of the group (GQA reduced in place). S^T = K Q^T and
//                   dP^T = V dO^T are its C fragments, which become the A fragments of
//                   dV += P^T dO and dK += dS^T Q;
//   attn_bwd_dq:    one CTA per (64-query block, query head, sequence), the forward's loop over
//                   key blocks with dP = dO V^T next to S = Q K^T, and dQ += dS K.
// dQ recomputes S and dP (7 GEMMs in all against the 5 of a dQ accumulated with atomics): the
// price of determinism without a workspace of fp32 partial sums.
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
constexpr int64_t kUnbounded = -1;

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

// Rows [row0, row0 + 64) x the head dim of a [rows][D] tensor into a swizzled tile with
// cp.async; rows at or past `rows` and chunks past head_dim are zero-filled without a read.
template <int D, typename T>
__device__ __forceinline__ void load_tile(uint32_t tile, const T* base, int64_t row_stride,
                                          int64_t row0, int64_t rows, int head_dim, int tid) {
  constexpr int kChunks = D / 8;
  for (int c = tid; c < kBlockRows * kChunks; c += kThreads) {
    const int r = c / kChunks, chunk = c % kChunks;
    const bool valid = row0 + r < rows && chunk * 8 < head_dim;
    const T* src = valid ? base + (row0 + r) * row_stride + chunk * 8 : base;
    cp_async_16(tile + tile_offset<D>(r, chunk), src, valid);
  }
}

// p and ds of one score element (module comment), from the raw dot products q.k and dO.v.
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

__device__ __forceinline__ bool visible(int64_t diag, int64_t j, int64_t len_k, Band w) {
  return j < len_k && (w.left < 0 || j >= diag - w.left) && (w.right < 0 || j <= diag + w.right);
}

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

// acc += A (k = the 64 tile rows) times the tile at t_lane as the B operand ([k][D] rows read
// transposed; lane address of (lane % 16, lane / 16)).
template <typename T, int D>
__device__ __forceinline__ void product_with_rows(float (&acc)[D / 8][4],
                                                  const float (&c)[kBlockRows / 8][4],
                                                  uint32_t t_lane) {
  using Rows = SwizzledRows<D>;
#pragma unroll
  for (int ks = 0; ks < kBlockRows / 16; ++ks) {
    uint32_t a[4];
    a_fragment<T>(a, c, ks);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, Rows::at(t_lane, ks * 16, dp));
      mma_16816<T>(acc[2 * dp], a, b[0], b[1]);
      mma_16816<T>(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// Rows g and g + 8 of this warp's 16 (first row `row0`, `rows` valid) of acc * scale, columns
// 8 dt + 2t and + 1 up to head_dim, into base (row stride in elements).
template <typename T, int D>
__device__ __forceinline__ void store_rows(T* base, int64_t row_stride,
                                           const float (&acc)[D / 8][4], float scale, int64_t row0,
                                           int64_t rows, int head_dim, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t r = row0 + g + half * 8;
    if (r >= rows) continue;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const int col = dt * 8 + 2 * t;
      if (col >= head_dim) continue;
      *reinterpret_cast<uint32_t*>(base + r * row_stride + col) =
          pack2<T>(acc[dt][2 * half] * scale, acc[dt][2 * half + 1] * scale);
    }
  }
}

// Explicit conversions (builds may define __CUDA_NO_HALF_CONVERSIONS__).
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// ---------------------------------------------------------------------------------------------
// D = rowsum(dO * O): one warp per (packed row, head); dsum has lse's layout.
// ---------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(256)
    attn_bwd_dsum_kernel(AttnBwdParams p, float* dsum, int64_t rows_per_batch, int64_t n_items) {
  const AttnFwdParams& f = p.fwd;
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (item >= n_items) return;
  const int64_t h = item % f.heads_q;
  const int64_t packed = item / f.heads_q;  // dense: b * seqlen_q + i; varlen: the packed row
  const bool varlen = f.cu_seqlens_q != nullptr;
  const int64_t b = varlen ? 0 : packed / rows_per_batch,
                i = varlen ? packed : packed % rows_per_batch;
  const T* o = static_cast<const T*>(f.out) + b * f.out_batch_stride + i * f.out_row_stride +
               h * f.out_head_stride;
  const T* d = static_cast<const T*>(p.dout) + b * p.dout_batch_stride + i * p.dout_row_stride +
               h * p.dout_head_stride;
  float acc = 0.0f;
  for (int c = lane; c < f.head_dim; c += 32) acc += to_float(o[c]) * to_float(d[c]);
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) acc += shfl_xor(acc, m);
  if (lane == 0) dsum[b * f.lse_batch_stride + h * f.lse_head_stride + i] = acc;
}

// ---------------------------------------------------------------------------------------------
// dK, dV of 64 keys (blockIdx.x) of kv head blockIdx.y of sequence blockIdx.z.
// Shared memory: K, V, Q, dO tiles of [64][D] and lse, D of the query tile.
// ---------------------------------------------------------------------------------------------
template <typename T, int D>
struct DkDvSmem {
  static constexpr int kTileBytes = kBlockRows * D * 2;
  static constexpr int kBytes = 4 * kTileBytes + 2 * kBlockRows * 4;
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dkdv_kernel(AttnBwdParams p, const float* dsum) {
  constexpr int kQTiles = kBlockRows / 8;  // n-tiles of S^T (queries)
  constexpr int kDTiles = D / 8;           // n-tiles of dK / dV
  using Rows = SwizzledRows<D>;
  const AttnFwdParams& f = p.fwd;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.z, hk = blockIdx.y;
  const SeqRows s = seq_rows(f, b);
  const int64_t key0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  if (key0 >= s.len_k) return;
  const Band w = band_of(f);
  const int64_t shift = s.len_k - s.len_q;
  const bool varlen_q = f.cu_seqlens_q != nullptr, varlen_k = f.cu_seqlens_k != nullptr;

  uint8_t* smem = dynamic_smem();
  const uint32_t sk = smem_u32(smem), sv = sk + DkDvSmem<T, D>::kTileBytes,
                 sq = sv + DkDvSmem<T, D>::kTileBytes, sdo = sq + DkDvSmem<T, D>::kTileBytes;
  float* s_lse = reinterpret_cast<float*>(smem + 4 * DkDvSmem<T, D>::kTileBytes);
  float* s_dsum = s_lse + kBlockRows;

  const int64_t kb = varlen_k ? 0 : b;
  const T* kbase = static_cast<const T*>(f.k) + kb * f.k_batch_stride + s.k0 * f.k_row_stride +
                   hk * f.k_head_stride;
  const T* vbase = static_cast<const T*>(f.v) + kb * f.v_batch_stride + s.k0 * f.v_row_stride +
                   hk * f.v_head_stride;
  const int head_dim = static_cast<int>(f.head_dim);
  load_tile<D>(sk, kbase, f.k_row_stride, key0, s.len_k, head_dim, tid);
  load_tile<D>(sv, vbase, f.v_row_stride, key0, s.len_k, head_dim, tid);
  cp_async_commit();

  // Lane addresses: A operands (K, V rows of this warp) and transposed B operands (Q, dO rows
  // as the k dimension) use (lane % 16, lane / 16); plain B operands (Q, dO rows as n) use
  // ((lane % 8) + 8 (lane / 16), (lane / 8) % 2) (attention_cuda_mma.cuh).
  const int lr_a = lane % 16, lc_a = lane / 16;
  const int lr_b = (lane % 8) + (lane / 16) * 8, lc_b = (lane / 8) % 2;
  const uint32_t k_a = sk + Rows(lr_a, lc_a, static_cast<uint32_t>(warp * 16 * D * 2)).base;
  const uint32_t v_a = sv + Rows(lr_a, lc_a, static_cast<uint32_t>(warp * 16 * D * 2)).base;
  const uint32_t q_b = sq + Rows(lr_b, lc_b, 0).base, do_b = sdo + Rows(lr_b, lc_b, 0).base;
  const uint32_t q_t = sq + Rows(lr_a, lc_a, 0).base, do_t = sdo + Rows(lr_a, lc_a, 0).base;

  float dk[kDTiles][4], dv[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;
  }

  // Queries that see any key of this block: [i_lo, i_hi).
  const int64_t key_last = (key0 + kBlockRows < s.len_k ? key0 + kBlockRows : s.len_k) - 1;
  int64_t i_lo = 0, i_hi = s.len_q;
  if (w.right >= 0) i_lo = key0 - shift - w.right > 0 ? key0 - shift - w.right : 0;
  if (w.left >= 0) {
    const int64_t last = key_last + w.left - shift + 1;
    i_hi = last < i_hi ? last : i_hi;
  }
  const int64_t qblock_lo = i_lo / kBlockRows;
  const int group = static_cast<int>(f.heads_q / f.heads_kv);
  const float scale = f.softmax_scale;
  ScoreMath math{};
  math.softcap = f.softcap;
  math.softcap_scale = f.softcap > 0.0f ? scale / f.softcap : 0.0f;

  for (int gi = 0; gi < group; ++gi) {
    const int64_t h = static_cast<int64_t>(hk) * group + gi;
    math.slope = f.alibi_slopes != nullptr ? f.alibi_slopes[b * f.alibi_batch_stride + h] : 0.0f;
    const int64_t qb = varlen_q ? 0 : b;
    const T* qbase = static_cast<const T*>(f.q) + qb * f.q_batch_stride + s.q0 * f.q_row_stride +
                     h * f.q_head_stride;
    const T* dobase = static_cast<const T*>(p.dout) + qb * p.dout_batch_stride +
                      s.q0 * p.dout_row_stride + h * p.dout_head_stride;
    const int64_t lse_off = qb * f.lse_batch_stride + h * f.lse_head_stride + s.q0;
    for (int64_t i0 = qblock_lo * kBlockRows; i0 < i_hi; i0 += kBlockRows) {
      __syncthreads();  // the previous tile's readers are done
      load_tile<D>(sq, qbase, f.q_row_stride, i0, s.len_q, head_dim, tid);
      load_tile<D>(sdo, dobase, p.dout_row_stride, i0, s.len_q, head_dim, tid);
      cp_async_commit();
      if (tid < kBlockRows) {
        const bool valid = i0 + tid < s.len_q;
        // A row past the sequence gets lse = +inf: p = 0 there.
        s_lse[tid] = valid ? f.lse[lse_off + i0 + tid] : __int_as_float(0x7f800000);
        s_dsum[tid] = valid ? dsum[lse_off + i0 + tid] : 0.0f;
      }
      cp_async_wait<0>();
      __syncthreads();

      // S^T (16 keys x 64 queries) and dP^T.
      float st[kQTiles][4], dpt[kQTiles][4];
      two_products<T, D>(st, dpt, k_a, q_b, v_a, do_b);
      // P^T into st, dS^T into dpt (element (key, query)).
#pragma unroll
      for (int nt = 0; nt < kQTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = nt * 8 + 2 * t + (e & 1);
          const int64_t i = i0 + qi, j = key0 + warp * 16 + g + (e >= 2 ? 8 : 0);
          const int64_t diag = i + shift;
          float pv = 0.0f, dsv = 0.0f;
          if (i < s.len_q && visible(diag, j, s.len_k, w)) {
            math.eval(st[nt][e], dpt[nt][e], s_lse[qi], s_dsum[qi], diag, j, scale, pv, dsv);
          }
          st[nt][e] = pv;
          dpt[nt][e] = dsv;
        }
      }
      // dV += P^T dO and dK += dS^T Q: 16-query k-steps.
      product_with_rows<T, D>(dv, st, do_t);
      product_with_rows<T, D>(dk, dpt, q_t);
    }
  }
  if (qblock_lo * kBlockRows >= i_hi) cp_async_wait<0>();  // K/V loads still pending

  T* dkbase = static_cast<T*>(p.dk) + kb * p.dk_batch_stride + s.k0 * p.dk_row_stride +
              hk * p.dk_head_stride;
  T* dvbase = static_cast<T*>(p.dv) + kb * p.dv_batch_stride + s.k0 * p.dv_row_stride +
              hk * p.dv_head_stride;
  const int64_t my_keys = key0 + warp * 16;
  store_rows<T, D>(dkbase, p.dk_row_stride, dk, scale, my_keys, s.len_k, head_dim, lane);
  store_rows<T, D>(dvbase, p.dv_row_stride, dv, 1.0f, my_keys, s.len_k, head_dim, lane);
}

// ---------------------------------------------------------------------------------------------
// dQ of 64 queries (blockIdx.x) of query head blockIdx.y of sequence blockIdx.z.
// Shared memory: Q, dO, K, V tiles of [64][D].
// ---------------------------------------------------------------------------------------------
template <typename T, int D>
struct DqSmem {
  static constexpr int kTileBytes = kBlockRows * D * 2;
  static constexpr int kBytes = 4 * kTileBytes;
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attn_bwd_dq_kernel(AttnBwdParams p, const float* dsum) {
  constexpr int kKTiles = kBlockRows / 8;  // n-tiles of S (keys)
  constexpr int kDTiles = D / 8;
  using Rows = SwizzledRows<D>;
  const AttnFwdParams& f = p.fwd;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.z;
  const int64_t h = blockIdx.y;
  const SeqRows s = seq_rows(f, b);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  if (q0 >= s.len_q) return;
  const Band w = band_of(f);
  const int64_t shift = s.len_k - s.len_q;
  const bool varlen_q = f.cu_seqlens_q != nullptr, varlen_k = f.cu_seqlens_k != nullptr;
  const int64_t hk = h / (f.heads_q / f.heads_kv);

  uint8_t* smem = dynamic_smem();
  const uint32_t sq = smem_u32(smem), sdo = sq + DqSmem<T, D>::kTileBytes,
                 sk = sdo + DqSmem<T, D>::kTileBytes, sv = sk + DqSmem<T, D>::kTileBytes;
  const int64_t qb = varlen_q ? 0 : b, kb = varlen_k ? 0 : b;
  const T* qbase = static_cast<const T*>(f.q) + qb * f.q_batch_stride + s.q0 * f.q_row_stride +
                   h * f.q_head_stride;
  const T* dobase = static_cast<const T*>(p.dout) + qb * p.dout_batch_stride +
                    s.q0 * p.dout_row_stride + h * p.dout_head_stride;
  const T* kbase = static_cast<const T*>(f.k) + kb * f.k_batch_stride + s.k0 * f.k_row_stride +
                   hk * f.k_head_stride;
  const T* vbase = static_cast<const T*>(f.v) + kb * f.v_batch_stride + s.k0 * f.v_row_stride +
                   hk * f.v_head_stride;
  const int head_dim = static_cast<int>(f.head_dim);
  load_tile<D>(sq, qbase, f.q_row_stride, q0, s.len_q, head_dim, tid);
  load_tile<D>(sdo, dobase, p.dout_row_stride, q0, s.len_q, head_dim, tid);
  cp_async_commit();

  const int lr_a = lane % 16, lc_a = lane / 16;
  const int lr_b = (lane % 8) + (lane / 16) * 8, lc_b = (lane / 8) % 2;
  const uint32_t q_a = sq + Rows(lr_a, lc_a, static_cast<uint32_t>(warp * 16 * D * 2)).base;
  const uint32_t do_a = sdo + Rows(lr_a, lc_a, static_cast<uint32_t>(warp * 16 * D * 2)).base;
  const uint32_t k_b = sk + Rows(lr_b, lc_b, 0).base, v_b = sv + Rows(lr_b, lc_b, 0).base;
  const uint32_t k_t = sk + Rows(lr_a, lc_a, 0).base;

  // This thread's two query rows (g, g + 8 of the warp's 16): lse (+inf past the sequence) and D.
  const int64_t lse_off = qb * f.lse_batch_stride + h * f.lse_head_stride + s.q0;
  float row_lse[2], row_dsum[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = q0 + warp * 16 + g + half * 8;
    row_lse[half] = i < s.len_q ? f.lse[lse_off + i] : __int_as_float(0x7f800000);
    row_dsum[half] = i < s.len_q ? dsum[lse_off + i] : 0.0f;
  }
  const float scale = f.softmax_scale;
  ScoreMath math{};
  math.softcap = f.softcap;
  math.softcap_scale = f.softcap > 0.0f ? scale / f.softcap : 0.0f;
  math.slope = f.alibi_slopes != nullptr ? f.alibi_slopes[b * f.alibi_batch_stride + h] : 0.0f;

  float dq[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[dt][e] = 0.0f;
  }
  // Keys any query of this block sees: [j_lo, j_hi).
  const int64_t q_last = (q0 + kBlockRows < s.len_q ? q0 + kBlockRows : s.len_q) - 1;
  int64_t j_lo = 0, j_hi = s.len_k;
  if (w.left >= 0) j_lo = q0 + shift - w.left > 0 ? q0 + shift - w.left : 0;
  if (w.right >= 0) {
    const int64_t last = q_last + shift + w.right + 1;
    j_hi = last < j_hi ? last : j_hi;
  }
  for (int64_t k0 = j_lo / kBlockRows * kBlockRows; k0 < j_hi; k0 += kBlockRows) {
    __syncthreads();  // the previous K / V tile's readers are done
    load_tile<D>(sk, kbase, f.k_row_stride, k0, s.len_k, head_dim, tid);
    load_tile<D>(sv, vbase, f.v_row_stride, k0, s.len_k, head_dim, tid);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float sc[kKTiles][4], dp[kKTiles][4];
    two_products<T, D>(sc, dp, q_a, k_b, do_a, v_b);
    // dS into dp (element (query, key)).
#pragma unroll
    for (int nt = 0; nt < kKTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e >= 2 ? 1 : 0;
        const int64_t i = q0 + warp * 16 + g + half * 8, j = k0 + nt * 8 + 2 * t + (e & 1);
        const int64_t diag = i + shift;
        float pv = 0.0f, dsv = 0.0f;
        if (i < s.len_q && visible(diag, j, s.len_k, w)) {
          math.eval(sc[nt][e], dp[nt][e], row_lse[half], row_dsum[half], diag, j, scale, pv, dsv);
        }
        dp[nt][e] = dsv;
      }
    }
    // dQ += dS K: 16-key k-steps, K rows transposed as the B operand.
    product_with_rows<T, D>(dq, dp, k_t);
  }
  if (j_lo / kBlockRows * kBlockRows >= j_hi) cp_async_wait<0>();  // Q / dO loads still pending

  T* dqbase = static_cast<T*>(p.dq) + qb * p.dq_batch_stride + s.q0 * p.dq_row_stride +
              h * p.dq_head_stride;
  store_rows<T, D>(dqbase, p.dq_row_stride, dq, scale, q0 + warp * 16, s.len_q, head_dim, lane);
}

}  // namespace bwd
}  // namespace cuda
}  // namespace attention
