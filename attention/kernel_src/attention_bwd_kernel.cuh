// attention_bwd_kernel.cuh: the attention backward on sm_80+ tensor cores (mma.sync m16n8k16,
// fp32 accumulation), the gradients of attention_params.h's forward:
//   p = exp(l - lse),  l = z - slope |diag - j|,  z = softcap tanh(s / softcap) (or s),
//   s = scale <q_i, k_j>,  D_i = <dO_i, O_i>,  dp = <dO_i, v_j>,  ds = p (dp - D_i) dz/ds,
//   dV_j = sum_i p dO_i,  dK_j = scale sum_i ds q_i,  dQ_i = scale sum_j ds k_j.
// The kernels (building blocks: attention_bwd_tile.cuh), launched by attention_bwd_launch.cuh:
//   attn_bwd_dsum:  D = rowsum(dO * O) in fp32, one warp per (row, head);
//   attn_bwd_dkdv:  one CTA per (64-key block, kv head, sequence); each of its 4 warps owns 16 keys
//                   (past head dim 128, 8 warps: two a slab, half the columns each; DkDvWarps)
//                   and accumulates their dK and dV in registers over every query block of
//                   every query head of the group (GQA reduced in place). S^T = K Q^T and
//                   dP^T = V dO^T are its C fragments, which become the A fragments of
//                   dV += P^T dO and dK += dS^T Q. With kAtomicDq it also adds dQ = dS K into
//                   an fp32 workspace with atomics (FlashAttention-2's single pass);
//   attn_bwd_dq:    one CTA per (64-query block, query head, sequence), the forward's loop over
//                   key blocks with dP = dO V^T next to S = Q K^T, and dQ += dS K;
//   attn_bwd_dq_convert: the workspace of the atomic dQ, scaled and rounded into dq.
// Two schedules, chosen by AttnBwdParams::dq_accum (flash-attn's `deterministic`):
//   deterministic (null):  dsum, dkdv, dq: no atomics, the same bits on every run; 7 GEMMs, since
//                          the dQ pass recomputes S and dP;
//   not (workspace set):   dsum, dkdv<kAtomicDq>, dq_convert: 5 GEMMs and an fp32 workspace; dq's
//                          sums run in a varying order.
// dK and dV are the same bits in both.
// The dK/dV and dQ passes keep kStages shared-memory stages of the tiles they stream (Q / dO and
// the lse, D rows in the dK/dV pass, K / V in the dQ pass). With two, the next step's cp.async
// loads are issued before this step's math, so a step waits for a load issued a whole step
// earlier instead of its own. One stage (the next step's loads issued after this step's math) is
// the fallback where two do not fit a block's shared memory (attention_bwd_launch.cuh picks).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention_bwd_tile.cuh"
#include "attention_params.h"

namespace attention {
namespace cuda {
namespace bwd {

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

// Position in the dK/dV pass's steps: step = head * q_blocks + block.
struct StepCursor {
  int step = 0, head = 0, block = 0;
  __device__ __forceinline__ void advance(int q_blocks) {
    ++step;
    if (++block == q_blocks) {
      block = 0;
      ++head;
    }
  }
};

// ---------------------------------------------------------------------------------------------
// dK, dV of 64 keys (blockIdx.x) of kv head blockIdx.y of sequence blockIdx.z. Shared memory: K,
// V tiles of [64][D], then per stage Q, dO tiles and the lse, D rows of the query tile. The steps
// are (query head of the group, query block) pairs.
// kAtomicDq: each step also adds its dQ = dS K (64 queries x D) into p.dq_accum (fp32) with
// atomics, FlashAttention-2's single pass (5 GEMMs instead of the 7 of a separate dQ pass; the
// order of the adds varies from run to run). dS^T goes through a [64 keys][64 queries] tile of
// shared memory, whose transposed reads give the A operand with the queries as rows. dK and dV
// are the same bits either way: the extra work only reads what their math reads.
// ---------------------------------------------------------------------------------------------
template <typename T, int D, bool kAtomicDq, int kStages_>
__global__ void __launch_bounds__(DkDvWarps<D>::kThreads)
    attn_bwd_dkdv_kernel(AttnBwdParams p, const float* dsum) {
  using Smem = DkDvSmem<D, kAtomicDq, kStages_>;
  using Warps = DkDvWarps<D>;
  constexpr int kStages = Smem::kStages;
  constexpr int kQTiles = kBlockRows / 8;  // n-tiles of S^T (queries)
  constexpr int kCols = Warps::kCols;      // dK / dV columns of a warp
  constexpr int kDTiles = kCols / 8;       // its n-tiles of dK / dV
  constexpr int kLoaders = Warps::kThreads;
  using Rows = SwizzledRows<D>;
  const AttnFwdParams& f = p.fwd;
  const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, t = lane % 4;
  // This warp's 16 keys (slab) and its dK / dV columns [col0, col0 + kCols) (part: a
  // compile-time 0 where the columns are not split).
  const int warp = tid / 32;
  const int slab = Warps::kParts == 1 ? warp : warp % kWarps;
  const int part = Warps::kParts == 1 ? 0 : warp / kWarps, col0 = part * kCols;
  const int b = blockIdx.z, hk = blockIdx.y;
  const SeqRows s = seq_rows(f, b);
  const int64_t key0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  if (key0 >= s.len_k) return;
  const Band w = band_of(f);
  const int64_t shift = s.len_k - s.len_q;
  const bool varlen_q = f.cu_seqlens_q != nullptr, varlen_k = f.cu_seqlens_k != nullptr;

  uint8_t* smem = dynamic_smem();
  const uint32_t sk = smem_u32(smem), sv = sk + Smem::kTileBytes, sq0 = sv + Smem::kTileBytes;
  const uint32_t rows0 = sk + 2 * Smem::kTileBytes + kStages * Smem::kStageBytes;
  const float* s_rows = reinterpret_cast<const float*>(smem + (rows0 - sk));
  const uint32_t sds = rows0 + kStages * Smem::kRowsBytes;  // dS^T (kAtomicDq)

  const int64_t kb = varlen_k ? 0 : b;
  const T* kbase = static_cast<const T*>(f.k) + kb * f.k_batch_stride + s.k0 * f.k_row_stride +
                   hk * f.k_head_stride;
  const T* vbase = static_cast<const T*>(f.v) + kb * f.v_batch_stride + s.k0 * f.v_row_stride +
                   hk * f.v_head_stride;
  const int head_dim = static_cast<int>(f.head_dim);
  load_tile<D, kLoaders>(sk, kbase, f.k_row_stride, key0, s.len_k, head_dim, tid);
  load_tile<D, kLoaders>(sv, vbase, f.v_row_stride, key0, s.len_k, head_dim, tid);
  cp_async_commit();

  // Lane addresses: A operands (K, V rows of this warp) and transposed B operands (Q, dO rows
  // as the k dimension) use (lane % 16, lane / 16); plain B operands (Q, dO rows as n) use
  // ((lane % 8) + 8 (lane / 16), (lane / 8) % 2) (attention_cuda_mma.cuh). Q / dO addresses are
  // those of stage 0; a stage adds a multiple of the tile size, clear of the swizzle's bits. The
  // transposed B operands of the dK / dV / dQ products start at this warp's first column.
  const int lr_a = lane % 16, lc_a = lane / 16;
  const int lr_b = (lane % 8) + (lane / 16) * 8, lc_b = (lane / 8) % 2;
  const uint32_t k_a = sk + Rows(lr_a, lc_a, static_cast<uint32_t>(slab * 16 * D * 2)).base;
  const uint32_t v_a = sv + Rows(lr_a, lc_a, static_cast<uint32_t>(slab * 16 * D * 2)).base;
  const uint32_t q_b = sq0 + Rows(lr_b, lc_b, 0).base;
  const uint32_t do_b = q_b + Smem::kTileBytes;
  const uint32_t q_t = Warps::column_part(sq0 + Rows(lr_a, lc_a, 0).base, part);
  // K rows as the k dimension (dQ = dS K)
  const uint32_t k_t = Warps::column_part(sk + Rows(lr_a, lc_a, 0).base, part);
  const uint32_t do_t = q_t + Smem::kTileBytes;

  float dk[kDTiles][4], dv[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;
  }

  // Queries that see any key of this block: [i_lo, i_hi), in query blocks [qb_lo, qb_hi).
  const int64_t key_last = (key0 + kBlockRows < s.len_k ? key0 + kBlockRows : s.len_k) - 1;
  int64_t i_lo = 0, i_hi = s.len_q;
  if (w.right >= 0) i_lo = key0 - shift - w.right > 0 ? key0 - shift - w.right : 0;
  if (w.left >= 0) {
    const int64_t last = key_last + w.left - shift + 1;
    i_hi = last < i_hi ? last : i_hi;
  }
  const int64_t qb_lo = i_lo / kBlockRows;
  const int q_blocks =
      i_hi > i_lo ? static_cast<int>((i_hi + kBlockRows - 1) / kBlockRows - qb_lo) : 0;
  const int group = static_cast<int>(f.heads_q / f.heads_kv);
  const int steps = q_blocks * group;
  const int64_t qb = varlen_q ? 0 : b;
  const float scale = f.softmax_scale;
  ScoreMath math{};
  math.softcap = f.softcap;
  math.softcap_scale = f.softcap > 0.0f ? scale / f.softcap : 0.0f;

  // Steps: every query block of the group's first head, then of its second, ... `loading` is
  // the step whose tiles are issued next, `computing` the one the math is on.
  StepCursor loading{}, computing{};
  // The Q, dO tiles and lse, D rows of `loading` into its stage (a commit group of their own,
  // empty past the last step, so that the wait counts stay uniform).
  const auto issue = [&]() {
    if (loading.step < steps) {
      const int stage = loading.step % kStages;
      const int64_t h = hk * group + loading.head, i0 = (qb_lo + loading.block) * kBlockRows;
      const uint32_t sq = sq0 + stage * Smem::kStageBytes;
      load_tile<D, kLoaders>(sq,
                             static_cast<const T*>(f.q) + qb * f.q_batch_stride +
                                 s.q0 * f.q_row_stride + h * f.q_head_stride,
                             f.q_row_stride, i0, s.len_q, head_dim, tid);
      load_tile<D, kLoaders>(sq + Smem::kTileBytes,
                             static_cast<const T*>(p.dout) + qb * p.dout_batch_stride +
                                 s.q0 * p.dout_row_stride + h * p.dout_head_stride,
                             p.dout_row_stride, i0, s.len_q, head_dim, tid);
      // The first 128 threads: the lse and D rows. Rows past the sequence read as 0: no element
      // of theirs is visible (p = ds = 0 there).
      if (tid < 2 * kBlockRows) {
        const int r = tid % kBlockRows;
        const float* src = tid < kBlockRows ? f.lse : dsum;
        const int64_t at = qb * f.lse_batch_stride + h * f.lse_head_stride + s.q0 + i0 + r;
        cp_async_4(rows0 + stage * Smem::kRowsBytes + tid * 4, i0 + r < s.len_q ? src + at : src,
                   i0 + r < s.len_q);
      }
    }
    cp_async_commit();
    loading.advance(q_blocks);
  };

  issue();  // the first step's tiles
  for (; computing.step < steps; computing.advance(q_blocks)) {
    if constexpr (kStages > 1) issue();  // the next step's tiles, into the other stage
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const int stage = computing.step % kStages;
    const uint32_t stage_off = stage * Smem::kStageBytes;
    const float* s_lse = s_rows + stage * 2 * kBlockRows;
    const float* s_dsum = s_lse + kBlockRows;
    const int64_t h = hk * group + computing.head, i0 = (qb_lo + computing.block) * kBlockRows;
    math.slope = f.alibi_slopes != nullptr ? f.alibi_slopes[b * f.alibi_batch_stride + h] : 0.0f;

    // S^T (16 keys x 64 queries) and dP^T.
    float st[kQTiles][4], dpt[kQTiles][4];
    two_products<T, D>(st, dpt, k_a, q_b + stage_off, v_a, do_b + stage_off);
    // P^T into st, dS^T into dpt (element (key, query)).
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = nt * 8 + 2 * t + (e & 1);
        const int64_t i = i0 + qi, j = key0 + slab * 16 + g + (e >= 2 ? 8 : 0);
        const int64_t diag = i + shift;
        float pv = 0.0f, dsv = 0.0f;
        if (i < s.len_q && visible(diag, j, s.len_k, w)) {
          math.eval(st[nt][e], dpt[nt][e], s_lse[qi], s_dsum[qi], diag, j, scale, pv, dsv);
        }
        st[nt][e] = pv;
        dpt[nt][e] = dsv;
      }
    }
    if (kAtomicDq && part == 0) {
      // This slab's 16 rows of dS^T, rounded to T as the products round them.
#pragma unroll
      for (int nt = 0; nt < kQTiles; ++nt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = slab * 16 + g + half * 8;
          st_shared_u32(sds + tile_offset<kBlockRows>(row, nt) + 4 * t,
                        pack2<T>(dpt[nt][2 * half], dpt[nt][2 * half + 1]));
        }
      }
    }
    // dV += P^T dO and dK += dS^T Q: 16-query k-steps.
    product_with_rows<T, D, kCols>(dv, st, do_t + stage_off);
    product_with_rows<T, D, kCols>(dk, dpt, q_t + stage_off);
    if constexpr (kAtomicDq) {
      __syncthreads();  // every slab's dS^T rows are written
      // dQ of the query slab with this warp's index, in its column part.
      add_dq_of_step<T, D, kCols>(p, sds, k_t, col0, h, i0, s, varlen_q ? 0 : b, slab, lane);
    }
    __syncthreads();  // this stage's (and dS^T's) readers are done before a later step refills it
    if constexpr (kStages == 1) issue();  // the next step's tiles, into the stage just read
  }
  cp_async_wait<0>();  // K / V without a step, and the trailing empty groups

  T* dkbase = static_cast<T*>(p.dk) + kb * p.dk_batch_stride + s.k0 * p.dk_row_stride +
              hk * p.dk_head_stride;
  T* dvbase = static_cast<T*>(p.dv) + kb * p.dv_batch_stride + s.k0 * p.dv_row_stride +
              hk * p.dv_head_stride;
  const int64_t my_keys = key0 + slab * 16;
  store_rows<T, kCols>(dkbase + col0, p.dk_row_stride, dk, scale, my_keys, s.len_k, head_dim - col0,
                       lane);
  store_rows<T, kCols>(dvbase + col0, p.dv_row_stride, dv, 1.0f, my_keys, s.len_k, head_dim - col0,
                       lane);
}

// ---------------------------------------------------------------------------------------------
// dQ of 64 queries (blockIdx.x) of query head blockIdx.y of sequence blockIdx.z (the
// deterministic schedule). Shared memory: Q, dO tiles of [64][D], then per stage K, V tiles (one
// key block a step).
// ---------------------------------------------------------------------------------------------
template <typename T, int D, int kStages_>
__global__ void __launch_bounds__(kThreads) attn_bwd_dq_kernel(AttnBwdParams p, const float* dsum) {
  using Smem = DqSmem<D, kStages_>;
  constexpr int kStages = Smem::kStages;
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
  const uint32_t sq = smem_u32(smem), sdo = sq + Smem::kTileBytes, sk0 = sdo + Smem::kTileBytes;
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

  // K / V addresses are those of stage 0; a stage adds a multiple of the tile size.
  const int lr_a = lane % 16, lc_a = lane / 16;
  const int lr_b = (lane % 8) + (lane / 16) * 8, lc_b = (lane / 8) % 2;
  const uint32_t q_a = sq + Rows(lr_a, lc_a, static_cast<uint32_t>(warp * 16 * D * 2)).base;
  const uint32_t do_a = sdo + Rows(lr_a, lc_a, static_cast<uint32_t>(warp * 16 * D * 2)).base;
  const uint32_t k_b = sk0 + Rows(lr_b, lc_b, 0).base;
  const uint32_t v_b = k_b + Smem::kTileBytes;
  const uint32_t k_t = sk0 + Rows(lr_a, lc_a, 0).base;

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
  // Keys any query of this block sees: [j_lo, j_hi), in key blocks from kb_lo.
  const int64_t q_last = (q0 + kBlockRows < s.len_q ? q0 + kBlockRows : s.len_q) - 1;
  int64_t j_lo = 0, j_hi = s.len_k;
  if (w.left >= 0) j_lo = q0 + shift - w.left > 0 ? q0 + shift - w.left : 0;
  if (w.right >= 0) {
    const int64_t last = q_last + shift + w.right + 1;
    j_hi = last < j_hi ? last : j_hi;
  }
  const int64_t kb_lo = j_lo / kBlockRows;
  const int steps =
      j_hi > j_lo ? static_cast<int>((j_hi + kBlockRows - 1) / kBlockRows - kb_lo) : 0;
  // The K, V tiles of key block kb_lo + step into its stage (a commit group of its own, empty
  // past the last step).
  const auto issue = [&](int step) {
    if (step < steps) {
      const uint32_t sk = sk0 + (step % kStages) * Smem::kStageBytes;
      const int64_t k0 = (kb_lo + step) * kBlockRows;
      load_tile<D>(sk, kbase, f.k_row_stride, k0, s.len_k, head_dim, tid);
      load_tile<D>(sk + Smem::kTileBytes, vbase, f.v_row_stride, k0, s.len_k, head_dim, tid);
    }
    cp_async_commit();
  };

  issue(0);
  for (int step = 0; step < steps; ++step) {
    if constexpr (kStages > 1) issue(step + 1);  // the next step's tiles, into the other stage
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const uint32_t stage_off = (step % kStages) * Smem::kStageBytes;
    const int64_t k0 = (kb_lo + step) * kBlockRows;

    float sc[kKTiles][4], dp[kKTiles][4];
    two_products<T, D>(sc, dp, q_a, k_b + stage_off, do_a, v_b + stage_off);
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
    product_with_rows<T, D>(dq, dp, k_t + stage_off);
    __syncthreads();  // this stage's readers are done before a later step refills it
    if constexpr (kStages == 1) issue(step + 1);  // into the stage just read
  }
  cp_async_wait<0>();  // Q / dO without a step, and the trailing empty groups

  T* dqbase = static_cast<T*>(p.dq) + qb * p.dq_batch_stride + s.q0 * p.dq_row_stride +
              h * p.dq_head_stride;
  store_rows<T, D>(dqbase, p.dq_row_stride, dq, scale, q0 + warp * 16, s.len_q, head_dim, lane);
}

// ---------------------------------------------------------------------------------------------
// dQ = scale * dq_accum, rounded to T into p.dq (any strides): two columns per thread, over the
// rows [q_rows][heads_q] of the accumulator (dense: b * seqlen_q + i; varlen: the packed row).
// ---------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(256)
    attn_bwd_dq_convert_kernel(AttnBwdParams p, int64_t rows_per_batch, int64_t n_pairs) {
  const AttnFwdParams& f = p.fwd;
  const int64_t pairs_per_row = f.head_dim / 2;  // head_dim is a multiple of 8
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < n_pairs;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = 2 * (item % pairs_per_row), rh = item / pairs_per_row;
    const int64_t h = rh % f.heads_q, packed = rh / f.heads_q;
    const bool varlen = f.cu_seqlens_q != nullptr;
    const int64_t b = varlen ? 0 : packed / rows_per_batch,
                  i = varlen ? packed : packed % rows_per_batch;
    const float2 v = *reinterpret_cast<const float2*>(p.dq_accum + rh * f.head_dim + c);
    T* dst = static_cast<T*>(p.dq) + b * p.dq_batch_stride + i * p.dq_row_stride +
             h * p.dq_head_stride + c;
    *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v.x * f.softmax_scale, v.y * f.softmax_scale);
  }
}

}  // namespace bwd
}  // namespace cuda
}  // namespace attention
