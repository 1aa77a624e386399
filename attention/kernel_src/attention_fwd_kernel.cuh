// attention_fwd_kernel.cuh: the CUDA attention forward kernel (attn_fwd_kernel), as named stages
// over one CTA's (query tile, head, sequence, split): prologue loads, S = Q K^T, masks and score
// modifiers, online softmax, O += P V, the key-split warps' merge and the epilogues (output rows,
// split partial rows, or the merge of the splits inside a cluster). Device code; instantiated by
// the generated attention_fwd_hdim*_*.cu files, launched by attention_cuda.cu.
//
// Design (FlashAttention-2: one CTA per (query tile, head, sequence, split); K/V streamed through
// shared memory in tiles; softmax online in registers; O in registers until the end):
// - MMA: mma.sync.aligned.m16n8k16 (fp16/bf16 in, fp32 accumulate), operands from shared memory
//   with ldmatrix(.trans) (attention_cuda_mma.cuh: fragment layouts and the 16-byte-chunk XOR
//   swizzle that keeps ldmatrix and cp.async free of bank conflicts). S = Q K^T per warp; its C
//   fragments, exponentiated and packed to 16 bits, are the A fragments of O += P V directly.
// - Tiles (TileConfig, attention_fwd_config.h; 4 warps = 128 threads unless noted):
//     prefill  D   32/64:  128 x 64 keys, 2 MMA row tiles per warp, Q in registers, 2 stages
//              D   96:     128 x 64, Q re-read from shared memory, 2 stages
//              D  128:     128 x 32, 3 stages (128 x 64 where two 96 KB CTAs fit: sm_90, sm_100)
//              D 192:      64 x 32, one row tile per warp, Q in registers, 2 stages (128 x 64 over
//                          8 warps where 144 KB fit: sm_80, sm_90, sm_100)
//              D 256:      64 x 64, one row tile per warp, one stage (K and V in alternation)
//     decode   D <= 128:   16 rows x 64 keys, the 4 warps split the keys (16 each) and merge
//              D 192/256:  16 rows x 32 keys over 2 warps (64 threads)
//   Shared memory 17-96 KB per CTA (opted in above 48 KB), within the 99 KB of sm_86/89/120; the
//   wide tiles (below) only where the device's opt-in holds them.
//   Decode tiles are taken when seqlen_q x (q heads per kv head) <= 32 rows.
// - Pipeline: cp.async (16-byte, L2-only, zero fill past the sequence ends) into kStages K/V
//   stages. Prefill: per tile one wait + __syncthreads that both publishes tile `it` and retires
//   the stage of tile it - 1, which then receives tile it + kStages - 1 while tile `it` is
//   computed. One stage (head_dim 256): a K and a V buffer, the V of tile `it` copied while S of
//   tile `it` is computed and the K of tile it + 1 while P V of tile `it` is, one barrier before
//   each (FlashAttention-2's pipeline: 64-key tiles in the shared memory of two 32-key stages).
//   Decode: each warp copies the K/V rows of its own keys and alone reads them, so it
//   waits for its copies with a __syncwarp instead of a CTA barrier and refills a stage as soon
//   as it has consumed it: kStages tiles in flight, not kStages - 1 (load_kv_warp). Tiles run
//   from the last key tile down, so the partial and diagonal tiles come first.
// - CTA order (tile_coords): under a causal mask or a window the query tiles of a (head, sequence)
//   pair differ in work, and a grid that ends on heavy tiles idles SMs in its last wave. Prefill
//   grids are walked in groups of pairs whose K/V fits in half of L2, heaviest tile rank first
//   across the group, so the light tiles come last (figures: benchmarks/NOTES.md, "Figures behind
//   the kernel design").
// - Masks: per CTA, uniform thresholds (KeyRange) say which tiles touch the window edge, the
//   causal diagonal or len_k; only those run the per-element mask (a uniform branch). Fully
//   invisible tiles are never loaded.
// - Softmax: scores stay raw dot products and the scale is folded into the exponent,
//   p = exp2(s * scale log2 e - max * scale log2 e) (one FFMA + ex2.approx per score); with
//   softcap or ALiBi a second build turns scores into log2 units first (tanh.approx, slope).
//   Row maxima by a quad butterfly; rows with nothing visible yet keep max = -inf and exponentiate
//   against 0 (never -inf - -inf). O is rescaled only when a row max of the warp moved (a warp
//   vote; the running sums always are). lse = (max c + log2 l) ln 2.
// - GQA packing: when the query tile would be mostly empty (decode, or seqlen_q < tile rows), the
//   q heads of one kv head are packed into the rows (row m -> query m / group, head m % group):
//   one CTA reads each K/V tile once for the whole group, which is what makes decode bound by
//   the K/V stream rather than by latency.
// - Paged K/V: every K/V tile row goes through the block table (j / page_block_size by a
//   multiply-shift; the block id shared by the K and V row), so any page size works at the same
//   cost; no assumption that a tile stays in one page. Decode tiles load the block id of a row
//   one tile before its copies, into the register of the lane that owns the row, which hands it
//   to the copying lanes by a shuffle: the dependent block-table load never delays the copies.
//   Pages of a multiple of 16 rows (vLLM's sizes) hold a warp's 16 keys of a tile whole: one
//   block id per warp, then rows step as in a contiguous cache (benchmarks/NOTES.md).
// - Split-KV (flash-decoding): num_splits > 1 divides each CTA's visible key tiles evenly; each
//   split writes O / l (fp32) and its lse to out_accum / lse_accum (an empty split only writes
//   lse = -inf), and attn_fwd_combine_kernel merges them with log-sum-exp weights, one CTA per
//   output row (its warps take interleaved splits). plan_splits picks the count when asked: no
//   split when the grid already covers 2 waves of resident CTAs; decode tiles with fewer CTAs
//   than SMs (contiguous cache) or at most SMs / 8 (paged): one CTA per SM; else the smallest
//   count within 85% of the best wave efficiency. At least 2 key tiles per split (one-CTA-per-SM
//   decode grids: 1, once the range has 4), at most 128.
//   Small decode grids on sm_90+ (contiguous cache, at most 4 splits, one CTA per SM) merge the
//   splits inside a thread-block cluster instead (merge_splits_in_cluster, plan_cluster: a tile's
//   splits are one cluster and read each other's partial states from shared memory), with no
//   workspace and no second kernel.
// - Epilogue: O / l rounded and staged in shared memory (the Q area), then 16-byte row stores;
//   lse from the quad's first lane.
// - Head dims: instances for 32, 64, 96, 128, 192 and 256; any other multiple of 8 runs the next
//   larger one with the caller's head dim in FwdArgs::head_dim. Q's columns past it are zeros, so
//   K's add nothing to the scores (attention_tile.cuh, "Tile loads"), and no store writes them
//   (out, and the split workspace, whose rows are head_dim wide). The work is the instance's,
//   about padded / actual times that of the head dim (benchmarks/NOTES.md).
// - Programmatic dependent launch on sm_90+ (the ops' enable_pdl; pdl.cuh): both kernels
//   launch with PDL, the first one too (faster after a GEMM as well, unlike the short elementwise
//   kernels of this repository). Both wait for their predecessor before the first global access
//   and release their dependents; they read their (__grid_constant__) parameters, and the combine
//   its row's indices, first, while they wait (wait_and_release_after_params; benchmarks/NOTES.md).
// - Registers per thread and local memory per instance: benchmarks/NOTES.md (rerun with
//   nvcc -Xptxas -v on the generated attention_fwd_*.cu files).
// - Tile shapes and launch heuristics live in TileConfig / LaunchConfig (attention_fwd_config.h)
//   and the plan_* functions of attention_cuda.cu only.
//
// Why this shape: mma.sync rather than wgmma/TMA keeps one kernel for every capability from 8.0
// to 12.0 (a Hopper-specific kernel can come later behind the same params). Two 16-row tiles per
// warp (prefill, head_dim <= 128) halve the K/V shared-memory traffic per MMA compared with one
// (FlashAttention-2's 128-row tiles over 4 warps do the same); the decode tiles
// trade the row split for a key split so that GQA decode issues 4x fewer MMAs per K/V byte.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attention_cuda_mma.cuh"
#include "attention_fwd_args.h"
#include "attention_fwd_config.h"
#include "attention_tile.cuh"
#include "device_errors.cuh"
#include "pdl.cuh"

namespace attention {
namespace cuda {

// ---------------------------------------------------------------------------------------------
// Split-KV merge inside a thread-block cluster (decode tiles on sm_90+, FwdArgs::cluster_merge):
// the num_splits CTAs of one (query tile, head, sequence) form a cluster, cluster rank = split.
// Each leaves its normalized partial output and lse in its own shared memory (kPartial*; a split
// without a visible key only lse = -inf); after a cluster barrier the cluster's threads merge the
// tile, each (row, 4 columns) item reading its num_splits partial states across the cluster, with
// the combine kernel's log-sum-exp weights, and write out and lse. No partial rows in global
// memory, no second kernel and no kernel boundary before the merge; plan_cluster says where that
// was measured to pay.
// ---------------------------------------------------------------------------------------------
template <typename T, class Cfg>
__device__ __forceinline__ void merge_splits_in_cluster(const FwdArgs& a, const Seq& s, int b,
                                                        int head, int m0, int rows, int split) {
  constexpr int kItemsPerRow = Cfg::kHeadDim / 4;
  const uint32_t partial = smem_u32(dynamic_smem());
  detail::cluster_sync();  // every split's partial state is in place
  const int n = a.num_splits;
  const int items = (rows - m0 < Cfg::kBlockM ? rows - m0 : Cfg::kBlockM) * kItemsPerRow;
  // Items interleaved over the cluster (item = thread x splits + rank): the few rows of a GQA
  // decode tile are spread over every CTA rather than piled on the first.
  for (int item = static_cast<int>(threadIdx.x) * n + split; item < items;
       item += Cfg::kThreads * n) {
    const int r = item / kItemsPerRow;
    const int col = (item - r * kItemsPerRow) * 4;
    // Every load at once (one DSMEM round trip). The row of a split without a visible key holds
    // anything: its weight 0 selects it out below rather than multiplying it.
    float w[kClusterMergeMaxSplits];
    float4 x[kClusterMergeMaxSplits];
#pragma unroll
    for (int sp = 0; sp < kClusterMergeMaxSplits; ++sp) {
      if (sp < n) {
        const uint32_t remote = detail::cluster_map(partial, static_cast<uint32_t>(sp));
        w[sp] = detail::cluster_load_f32(remote + Cfg::kPartialLseOffset + 4 * r);
        x[sp] = detail::cluster_load_f32x4(remote + Cfg::kPartialOOffset +
                                           4 * (r * Cfg::kPartialStride + col));
      }
    }
    float mx = -kInf;
#pragma unroll
    for (int sp = 0; sp < kClusterMergeMaxSplits; ++sp) {
      if (sp < n) mx = fmaxf(mx, w[sp]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int sp = 0; sp < kClusterMergeMaxSplits; ++sp) {
      if (sp < n) {
        // All -inf: every weight 0. A NaN lse (a NaN score in that split) is not in mx (fmaxf
        // drops it) but gives a NaN weight, sum and inv: the row and its lse come out NaN.
        w[sp] = w[sp] == -kInf ? 0.0f : expf(w[sp] - mx);
        sum += w[sp];
      }
    }
    const float inv = sum != 0.0f ? 1.0f / sum : 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int sp = 0; sp < kClusterMergeMaxSplits; ++sp) {
      if (sp < n && w[sp] != 0.0f) {
        const float ws = w[sp] * inv;
        acc.x = fmaf(ws, x[sp].x, acc.x);
        acc.y = fmaf(ws, x[sp].y, acc.y);
        acc.z = fmaf(ws, x[sp].z, acc.z);
        acc.w = fmaf(ws, x[sp].w, acc.w);
      }
    }
    int i, h;
    row_coords(a, head, m0 + r, &i, &h);
    uint2 packed;
    packed.x = pack2<T>(acc.x, acc.y);
    packed.y = pack2<T>(acc.z, acc.w);
    if (col < a.head_dim) {  // columns past the caller's head dim are not out's
      *reinterpret_cast<uint2*>(static_cast<T*>(a.out) + s.out_off + i * a.out_row_stride +
                                h * a.out_head_stride + col) = packed;
    }
    if (a.lse != nullptr && col == 0)
      a.lse[lse_index(a, s, b, h, i)] = sum != 0.0f ? mx + logf(sum) : kInf;
  }
  detail::cluster_sync();  // no CTA exits while another may still read its partial state
}

// A row's lse from its running max (scaled to log2 units by c) and sum: (max c + log2 l) ln 2, or
// `empty` for a row without a visible key, l = 0 (+inf for out's lse, -inf for a split's partial
// state). A NaN score (NaN in q or in a visible key) makes l NaN, and the lse NaN: fmaxf drops NaN
// from the running max, so l is where NaN is seen.
__device__ __forceinline__ float row_lse(float row_max, float l, float c, float empty) {
  return l != 0.0f ? (row_max * c + fast_log2(l)) * kLn2 : empty;
}

// One row of a split's normalized partial output for a merge (merge_splits_in_cluster, the
// combine kernel): the lane's 2 columns of every 8-column tile of O / l below `cols` (the
// instance's head dim in shared memory, the caller's in the workspace), fp32, at row_out.
template <class Cfg>
__device__ __forceinline__ void store_partial_row(const float (&o)[Cfg::kDTiles][4], int hf,
                                                  float l, int lane, int cols, float* row_out) {
  const float inv = l != 0.0f ? 1.0f / l : 0.0f;  // NaN l: NaN row (row_lse)
  float* dst = row_out + 2 * (lane & 3);
#pragma unroll
  for (int dt = 0; dt < Cfg::kDTiles; ++dt) {
    if (dt * 8 < cols) {
      *reinterpret_cast<float2*>(dst + dt * 8) =
          make_float2(o[dt][2 * hf] * inv, o[dt][2 * hf + 1] * inv);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward stages. Per thread, a CTA's softmax state is O (kMTiles x kDTiles C fragments), and per
// row half (hf: rows g and g + 8 of a 16-row MMA tile) the running max and sum. Per-lane ldmatrix
// rows (attention_cuda_mma.cuh): the A pattern (Q, and V read with .trans) takes matrices
// (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) as registers
// 0..3; the B pattern (K) takes (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7),
// (keys 8-15, d 8-15), the b[0], b[1] of two adjacent n-tiles.
// ---------------------------------------------------------------------------------------------
template <class Cfg>
using OFrag = float[Cfg::kMTiles][Cfg::kDTiles][4];
template <class Cfg>
using RowState = float[Cfg::kMTiles][2];
template <class Cfg>
using SFrag = float[Cfg::kMTiles][Cfg::kNTiles][4];

// Q fragments in registers as configured, except in the softcap / ALiBi build above head_dim
// 128 (the 48 registers of Q at 192 pushed ptxas into spills there; Q is re-read instead).
template <class Cfg, bool kScoreMod>
constexpr bool kQInRegsFor = Cfg::kQInRegs && !(kScoreMod && Cfg::kHeadDim > 128);

// Split merge in the cluster: decode tiles on sm_90+ (the launcher sets cluster_merge only there).
template <class Cfg>
constexpr bool cluster_build() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return Cfg::kWarpsN > 1;
#else
  return false;
#endif
}

// Bad input the host cannot see without a sync: a seqused_k past the key rows the sequence has
// (seqlen_k less its left padding, its cu_seqlens_k difference, or, paged, seqlen_k = the rows of
// its block-table row). Such a sequence reads no key: its CTAs write NaN (store_empty_tile).
// Checked apart from sequence(), on the early-exit path only: inside sequence() the extra value
// changed ptxas's register allocation of the main loops (more spills on sm_80).
__device__ __forceinline__ int rows_of_sequence(const FwdArgs& a, int b) {
  if (a.cu_seqlens_k != nullptr) return __ldg(a.cu_seqlens_k + b + 1) - __ldg(a.cu_seqlens_k + b);
  return a.seqlen_k - (a.leftpad_k != nullptr ? __ldg(a.leftpad_k + b) : 0);
}

// Reports it (device_errors.cuh; the first report wins): the first thread of each of the
// sequence's CTAs that has query rows.
__device__ __forceinline__ void report_keys_past_rows(const FwdArgs& a, const Seq& s, int b) {
  report_device_error(a.errors, a.error_op,
                      a.block_table != nullptr ? DeviceErrorCode::kKeysPastBlockTable
                                               : DeviceErrorCode::kKeysPastCache,
                      b, 0, s.len_k, rows_of_sequence(a, b));
}

// A CTA without a key in range: out = 0 and lse = +inf (a split: lse = -inf, out_accum never
// read; a split merging in its cluster still takes part in the merge). A sequence that overflows
// its rows (bad input, reported) gets NaN instead, in out and in every lse (a NaN partial lse
// makes the merged row NaN), so that its result is never silently wrong.
template <typename T, class Cfg>
__device__ __forceinline__ void store_empty_tile(const FwdArgs& a, const Seq& s, int b, int head,
                                                 int m0, int rows, int split, bool split_out,
                                                 int tid, bool overflow) {
  constexpr int BM = Cfg::kBlockM;
  const float nan = __int_as_float(0x7fc00000);
  if constexpr (cluster_build<Cfg>()) {
    if (a.cluster_merge) {  // no visible key: lse = -inf, and the CTA takes part in the merge
      float* lse_part = reinterpret_cast<float*>(dynamic_smem() + Cfg::kPartialLseOffset);
      for (int r = tid; r < BM; r += Cfg::kThreads) lse_part[r] = overflow ? nan : -kInf;
      merge_splits_in_cluster<T, Cfg>(a, s, b, head, m0, rows, split);
      return;
    }
  }
  for (int r = tid; r < BM; r += Cfg::kThreads) {
    const int m = m0 + r;
    if (m >= rows) break;
    int i, h;
    row_coords(a, head, m, &i, &h);
    if (split_out) {
      a.lse_accum[accum_row(a, split, b, h, i)] = overflow ? nan : -kInf;
    } else if (a.lse != nullptr) {
      a.lse[lse_index(a, s, b, h, i)] = overflow ? nan : kInf;
    }
  }
  if (!split_out) {
    // fp16 / bf16 quiet NaN in both halves of each word (0: the empty row's out).
    const uint32_t fill = !overflow                        ? 0u
                          : std::is_same<T, __half>::value ? 0x7e007e00u
                                                           : 0x7fc07fc0u;
    for (int c = tid; c < BM * Cfg::kChunksPerRow; c += Cfg::kThreads) {
      const int r = c / Cfg::kChunksPerRow;
      const int ch = c % Cfg::kChunksPerRow;
      const int m = m0 + r;
      if (m >= rows) break;
      if (!chunk_in_head(a, ch)) continue;
      int i, h;
      row_coords(a, head, m, &i, &h);
      *reinterpret_cast<Chunk16*>(static_cast<T*>(a.out) + s.out_off + i * a.out_row_stride +
                                  h * a.out_head_stride + ch * 8) =
          Chunk16{{fill, fill, fill, fill}};
    }
  }
}

// Prologue, after Q: the first K/V tiles (from the last tile down): kStages - 1 of them for
// prefill tiles (the CTA refills a stage after the barrier that retires it), the K of the first
// tile with one stage (kSplitKV), all kStages for decode tiles (each warp refills its share of
// a stage once it has consumed it), and the decode lane's block id of tile kStages (next_block).
// lane_block_of(t): the decode lane's block id of tile t (attn_fwd_kernel).
template <typename T, class Cfg, class LaneBlockOf>
__device__ __forceinline__ void load_kv_prologue(const FwdArgs& a, const Seq& s, const KeyRange& kr,
                                                 int n_tiles, uint32_t skv, int key_w, int tid,
                                                 int lane, const LaneBlockOf& lane_block_of,
                                                 int32_t& next_block) {
  constexpr bool kDecode = Cfg::kWarpsN > 1;
  if constexpr (kDecode) {
    int32_t block[Cfg::kStages];
#pragma unroll
    for (int st = 0; st < Cfg::kStages; ++st) block[st] = lane_block_of(st);
    next_block = lane_block_of(Cfg::kStages);
#pragma unroll
    for (int st = 0; st < Cfg::kStages; ++st) {
      if (st < n_tiles) {
        load_kv_warp<T, Cfg>(a, s, kr.end - 1 - st, key_w, skv + st * Cfg::kStageBytes,
                             skv + st * Cfg::kStageBytes + Cfg::kTileBytes, block[st], lane);
      }
      cp_async_commit();
    }
  } else if constexpr (Cfg::kSplitKV) {
    // n_tiles >= 1 here (an empty key range returned above).
    load_kv<T, Cfg, true, false>(a, s, kr.end - 1, skv, skv + Cfg::kTileBytes, tid);
    cp_async_commit();
  } else {
#pragma unroll
    for (int st = 0; st < Cfg::kStages - 1; ++st) {
      if (st < n_tiles) {
        load_kv<T, Cfg>(a, s, kr.end - 1 - st, skv + st * Cfg::kStageBytes,
                        skv + st * Cfg::kStageBytes + Cfg::kTileBytes, tid);
      }
      cp_async_commit();
    }
  }
}

// Q, copied by every thread: published by a barrier once this thread's copies have landed
// (prefill tiles re-reading Q from shared memory have it published by the loop's first barrier),
// then its fragments loaded into registers where kQRegs.
template <class Cfg, bool kQRegs>
__device__ __forceinline__ void load_q_fragments(
    uint32_t (&qreg)[kQRegs ? Cfg::kMTiles : 1][kQRegs ? Cfg::kKSteps : 1][4], uint32_t q_lane) {
  constexpr bool kDecode = Cfg::kWarpsN > 1;
  constexpr int kAhead = kDecode ? Cfg::kStages : Cfg::kStages - 1;  // tiles issued before tile 0
  using Rows = detail::SwizzledRows<Cfg::kHeadDim>;
  if constexpr (kQRegs || kDecode) {
    cp_async_wait<kAhead>();
    __syncthreads();
  }
  if constexpr (kQRegs) {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int ks = 0; ks < Cfg::kKSteps; ++ks) {
        ldmatrix_x4(qreg[mt][ks], Rows::at(q_lane, mt * 16, ks));
      }
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void init_softmax_state(OFrag<Cfg>& o, RowState<Cfg>& row_max,
                                                   RowState<Cfg>& row_sum) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < Cfg::kDTiles; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
    }
    row_max[mt][0] = row_max[mt][1] = -kInf;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }
}

// Start of iteration `it` (key tile n): wait until the tile has landed and, for prefill tiles,
// refill the stage that the barrier retires.
template <typename T, class Cfg>
__device__ __forceinline__ void wait_kv_tile(const FwdArgs& a, const Seq& s, const KeyRange& kr,
                                             int it, int n, int n_tiles, int stage, uint32_t skv,
                                             int tid) {
  if constexpr (Cfg::kWarpsN > 1) {
    // Tile `it` has landed (this lane's copies; the warp's after the __syncwarp): the warp
    // reads only the rows that its own lanes copied.
    cp_async_wait<Cfg::kStages - 1>();
    __syncwarp();
  } else if constexpr (Cfg::kSplitKV) {
    // K of tile `it` has landed (this thread's copies; Q too at it = 0), and every thread is
    // done with the V of tile it - 1: one barrier publishes the one and frees the other.
    cp_async_wait<0>();
    __syncthreads();
    load_kv<T, Cfg, false, true>(a, s, n, skv, skv + Cfg::kTileBytes, tid);
    cp_async_commit();
  } else {
    // Tile `it` has landed (this thread's copies), and every thread is done with tile it - 1:
    // one barrier publishes the one and frees the other's stage for tile it + kStages - 1.
    cp_async_wait<Cfg::kStages - 2>();
    __syncthreads();
    const int ahead = it + Cfg::kStages - 1;
    if (ahead < n_tiles) {
      int st = stage + Cfg::kStages - 1;
      if (st >= Cfg::kStages) st -= Cfg::kStages;
      load_kv<T, Cfg>(a, s, kr.end - 1 - ahead, skv + st * Cfg::kStageBytes,
                      skv + st * Cfg::kStageBytes + Cfg::kTileBytes, tid);
    }
    cp_async_commit();
  }
}

// S = Q K^T over the warp's rows and keys. Decode tiles (one 16 x 16 block of S per warp, two
// accumulators) alternate the k-steps between two sets of accumulators, which halves the
// chain of dependent MMAs: one warp per SM sub-partition at batch 1 waits on every link.
template <typename T, class Cfg, bool kQRegs>
__device__ __forceinline__ void compute_scores(
    SFrag<Cfg>& sc, const uint32_t (&qreg)[kQRegs ? Cfg::kMTiles : 1][kQRegs ? Cfg::kKSteps : 1][4],
    uint32_t q_lane, uint32_t k_lane) {
  constexpr int kMT = Cfg::kMTiles;
  constexpr int kChains = Cfg::kWarpsN > 1 ? 2 : 1;
  using Rows = detail::SwizzledRows<Cfg::kHeadDim>;
  float sc_odd[kMT][Cfg::kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[mt][nt][e] = sc_odd[mt][nt][e] = 0.0f;
    }
  }
#pragma unroll
  for (int ks = 0; ks < Cfg::kKSteps; ++ks) {
    uint32_t qa[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      if constexpr (kQRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) qa[mt][e] = qreg[mt][ks][e];
      } else {
        ldmatrix_x4(qa[mt], Rows::at(q_lane, mt * 16, ks));
      }
    }
    auto& acc = kChains > 1 && ks % 2 == 1 ? sc_odd : sc;
#pragma unroll
    for (int np = 0; np < Cfg::kNTiles / 2; ++np) {
      uint32_t kb[4];
      ldmatrix_x4(kb, Rows::at(k_lane, np * 16, ks));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mma_16816<T>(acc[mt][2 * np], qa[mt], kb[0], kb[1]);
        mma_16816<T>(acc[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
      }
    }
  }
  if constexpr (kChains > 1) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mt][nt][e] += sc_odd[mt][nt][e];
      }
    }
  }
}

// Modifiers and masks of key tile n (masks on boundary tiles only: a uniform branch).
template <class Cfg, bool kScoreMod>
__device__ __forceinline__ void mask_scores(SFrag<Cfg>& sc, const FwdArgs& a, const Seq& s,
                                            const KeyRange& kr, int b, int head, int m0, int rows,
                                            int row0, int n, int key_w, int lane) {
  const int key0 = n * Cfg::kBlockN + key_w;
  const bool masked = n >= kr.mask_hi || n < kr.mask_lo;
  if constexpr (kScoreMod) apply_score_mod<Cfg>(sc, a, s, b, head, m0, rows, row0, key0, lane);
  if (masked) {
    int diag[Cfg::kMTiles][2];
    row_diagonals<Cfg>(a, s, m0, row0, lane, diag);
    apply_mask<Cfg>(sc, diag, a, s.len_k, key0, lane);
  }
}

// Online softmax: new row maxima (quad butterfly), P = exp2(S c - max c) in place, the
// running sums rescaled by exp2((old max - new max) c), and O too unless no row max of the
// warp moved (a warp vote; after the first tiles of a row the usual case, and then every
// correction is exactly 1).
template <class Cfg>
__device__ __forceinline__ void online_softmax(SFrag<Cfg>& sc, OFrag<Cfg>& o,
                                               RowState<Cfg>& row_max, RowState<Cfg>& row_sum,
                                               float c) {
  constexpr int kMT = Cfg::kMTiles;
  float corr[kMT][2];
  bool moved = false;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = row_max[mt][hf];
#pragma unroll
      for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
        mx = fmaxf(mx, fmaxf(sc[mt][nt][2 * hf], sc[mt][nt][2 * hf + 1]));
      }
      mx = fmaxf(mx, shfl_xor(mx, 1));
      mx = fmaxf(mx, shfl_xor(mx, 2));
      // A row with nothing visible yet keeps max -inf; exponents are then taken against 0,
      // so that -inf - -inf never appears (p = 0, correction 0 on zero accumulators).
      const float m_use = mx == -kInf ? 0.0f : mx;
      corr[mt][hf] = fast_exp2((row_max[mt][hf] - m_use) * c);
      moved |= mx != row_max[mt][hf];
      row_max[mt][hf] = mx;
      const float mc = m_use * c;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = fast_exp2(fmaf(sc[mt][nt][2 * hf + e], c, -mc));
          sc[mt][nt][2 * hf + e] = p;
          sum += p;
        }
      }
      row_sum[mt][hf] = fmaf(row_sum[mt][hf], corr[mt][hf], sum);
    }
  }
  if (detail::warp_any(moved)) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int dt = 0; dt < Cfg::kDTiles; ++dt) {
        o[mt][dt][0] *= corr[mt][0];
        o[mt][dt][1] *= corr[mt][0];
        o[mt][dt][2] *= corr[mt][1];
        o[mt][dt][3] *= corr[mt][1];
      }
    }
  }
}

// One stage (kSplitKV): V of tile `it` has landed, and every thread is done with its K: K of tile
// it + 1 (key tile n - 1) lands while P V runs.
template <typename T, class Cfg>
__device__ __forceinline__ void load_next_k(const FwdArgs& a, const Seq& s, int it, int n,
                                            int n_tiles, uint32_t skv, int tid) {
  cp_async_wait<0>();
  __syncthreads();
  if (it + 1 < n_tiles) {
    load_kv<T, Cfg, true, false>(a, s, n - 1, skv, skv + Cfg::kTileBytes, tid);
  }
  cp_async_commit();
}

// O += P V: the C fragments of two S n-tiles are the A fragment of a 16-key step.
template <typename T, class Cfg>
__device__ __forceinline__ void accumulate_pv(OFrag<Cfg>& o, const SFrag<Cfg>& sc,
                                              uint32_t v_lane) {
  constexpr int kMT = Cfg::kMTiles;
  using Rows = detail::SwizzledRows<Cfg::kHeadDim>;
#pragma unroll
  for (int ps = 0; ps < Cfg::kPSteps; ++ps) {
    uint32_t pa[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      pa[mt][0] = pack2<T>(sc[mt][2 * ps][0], sc[mt][2 * ps][1]);
      pa[mt][1] = pack2<T>(sc[mt][2 * ps][2], sc[mt][2 * ps][3]);
      pa[mt][2] = pack2<T>(sc[mt][2 * ps + 1][0], sc[mt][2 * ps + 1][1]);
      pa[mt][3] = pack2<T>(sc[mt][2 * ps + 1][2], sc[mt][2 * ps + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < Cfg::kDTiles / 2; ++dp) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, Rows::at(v_lane, ps * 16, dp));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mma_16816<T>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
        mma_16816<T>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
      }
    }
  }
}

// Row sums: the quad's partial sums.
template <class Cfg>
__device__ __forceinline__ void reduce_row_sums(RowState<Cfg>& row_sum) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      row_sum[mt][hf] += shfl_xor(row_sum[mt][hf], 1);
      row_sum[mt][hf] += shfl_xor(row_sum[mt][hf], 2);
    }
  }
}

// Key-split warps (kWarpsN > 1): merge the (max, sum, O) states of the rows into warp 0
// (log-sum-exp), through the K/V area once every warp is done with the last tile.
template <class Cfg>
__device__ __forceinline__ void merge_key_split_warps(uint8_t* smem, OFrag<Cfg>& o,
                                                      RowState<Cfg>& row_max,
                                                      RowState<Cfg>& row_sum, float c, int row0,
                                                      int wn, int lane) {
  constexpr int BM = Cfg::kBlockM;
  constexpr int kMT = Cfg::kMTiles;
  float* red_o = reinterpret_cast<float*>(smem + Cfg::kQBytes);
  float* red_m = red_o + (Cfg::kWarpsN - 1) * Cfg::kORegs * 32;
  float* red_l = red_m + Cfg::kWarpsN * BM;
  __syncthreads();  // every warp is done with the last K/V tile
  if ((lane & 3) == 0) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = row0 + mt * 16 + hf * 8 + (lane >> 2);
        red_m[wn * BM + r] = row_max[mt][hf];
        red_l[wn * BM + r] = row_sum[mt][hf];
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = row0 + mt * 16 + hf * 8 + (lane >> 2);
      float mx = -kInf;
#pragma unroll
      for (int w = 0; w < Cfg::kWarpsN; ++w) mx = fmaxf(mx, red_m[w * BM + r]);
      const float m_use = mx == -kInf ? 0.0f : mx;
      float total = 0.0f;
#pragma unroll
      for (int w = 0; w < Cfg::kWarpsN; ++w) {
        total += red_l[w * BM + r] * fast_exp2((red_m[w * BM + r] - m_use) * c);
      }
      const float corr = fast_exp2((row_max[mt][hf] - m_use) * c);
#pragma unroll
      for (int dt = 0; dt < Cfg::kDTiles; ++dt) {
        o[mt][dt][2 * hf] *= corr;
        o[mt][dt][2 * hf + 1] *= corr;
      }
      row_max[mt][hf] = mx;
      row_sum[mt][hf] = total;
    }
  }
  if (wn > 0) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int dt = 0; dt < Cfg::kDTiles; ++dt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          red_o[(((wn - 1) * kMT + mt) * Cfg::kDTiles * 4 + dt * 4 + e) * 32 + lane] = o[mt][dt][e];
        }
      }
    }
  }
  __syncthreads();
  if (wn == 0) {
#pragma unroll 1
    for (int w = 1; w < Cfg::kWarpsN; ++w) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < Cfg::kDTiles; ++dt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            o[mt][dt][e] +=
                red_o[(((w - 1) * kMT + mt) * Cfg::kDTiles * 4 + dt * 4 + e) * 32 + lane];
          }
        }
      }
    }
  }
}

// Epilogue, cluster merge: the owner warp's rows of O / l and their lse into the CTA's partial
// state (kPartial*), then the merge of the cluster's splits.
template <typename T, class Cfg>
__device__ __forceinline__ void store_cluster_partial(const FwdArgs& a, const Seq& s, uint8_t* smem,
                                                      const OFrag<Cfg>& o,
                                                      const RowState<Cfg>& row_max,
                                                      const RowState<Cfg>& row_sum, float c,
                                                      bool owner, int b, int head, int m0, int rows,
                                                      int split, int row0, int lane) {
  if (owner) {
    float* lse_part = reinterpret_cast<float*>(smem + Cfg::kPartialLseOffset);
    float* o_part = reinterpret_cast<float*>(smem + Cfg::kPartialOOffset);
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = row0 + mt * 16 + hf * 8 + (lane >> 2);
        const float l = row_sum[mt][hf];
        store_partial_row<Cfg>(o[mt], hf, l, lane, Cfg::kHeadDim, o_part + r * Cfg::kPartialStride);
        if ((lane & 3) == 0) lse_part[r] = row_lse(row_max[mt][hf], l, c, -kInf);
      }
    }
  }
  merge_splits_in_cluster<T, Cfg>(a, s, b, head, m0, rows, split);
}

// Epilogue, split-KV: the owner warp's rows of O / l (fp32) and their lse into the workspace
// (out_accum, lse_accum) for the combine kernel.
template <class Cfg>
__device__ __forceinline__ void store_split_partial(const FwdArgs& a, const OFrag<Cfg>& o,
                                                    const RowState<Cfg>& row_max,
                                                    const RowState<Cfg>& row_sum, float c,
                                                    bool owner, int b, int head, int m0, int rows,
                                                    int split, int row0, int lane) {
  if (owner) {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int m = m0 + row0 + mt * 16 + hf * 8 + (lane >> 2);
        if (m < rows) {
          int i, h;
          row_coords(a, head, m, &i, &h);
          const int64_t idx = accum_row(a, split, b, h, i);
          const float l = row_sum[mt][hf];
          store_partial_row<Cfg>(o[mt], hf, l, lane, a.head_dim, a.out_accum + idx * a.head_dim);
          if ((lane & 3) == 0) a.lse_accum[idx] = row_lse(row_max[mt][hf], l, c, -kInf);
        }
      }
    }
  }
}

// Epilogue: out = O / l (0 for l = 0, NaN for NaN l) rounded once and staged in shared memory (the Q area), then
// 16-byte row stores; lse = (max c + log2 l) ln 2 from the quad's first lane.
template <typename T, class Cfg, bool kQRegs>
__device__ __forceinline__ void store_output(const FwdArgs& a, const Seq& s, uint8_t* smem,
                                             const OFrag<Cfg>& o, const RowState<Cfg>& row_max,
                                             const RowState<Cfg>& row_sum, float c, bool owner,
                                             int b, int head, int m0, int rows, int row0, int tid,
                                             int lane) {
  constexpr int D = Cfg::kHeadDim;
  constexpr int BM = Cfg::kBlockM;
  // The lanes of a warp may still be reading their Q rows (ldmatrix of the last tile) when
  // others start staging output over them: converge the warp first (racecheck's intra-warp hazard).
  if constexpr (!kQRegs) __syncwarp();
  if (owner) {
    // Stage the rounded tile in the Q area: a warp writes only rows that it alone read from
    // there (prefill), or rows that every warp finished reading before the merge (decode).
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = row0 + mt * 16 + hf * 8 + (lane >> 2);
        const float l = row_sum[mt][hf];
        const float inv = l != 0.0f ? 1.0f / l : 0.0f;  // NaN l: NaN row (row_lse)
#pragma unroll
        for (int dt = 0; dt < Cfg::kDTiles; ++dt) {
          *reinterpret_cast<uint32_t*>(smem + tile_offset<D>(r, dt) + 4 * (lane & 3)) =
              pack2<T>(o[mt][dt][2 * hf] * inv, o[mt][dt][2 * hf + 1] * inv);
        }
        const int m = m0 + r;
        if (a.lse != nullptr && (lane & 3) == 0 && m < rows) {
          int i, h;
          row_coords(a, head, m, &i, &h);
          a.lse[lse_index(a, s, b, h, i)] = row_lse(row_max[mt][hf], l, c, kInf);
        }
      }
    }
  }
  __syncthreads();
  using RS = RowSplit<Cfg>;
  if (RS::kActive < Cfg::kThreads && tid >= RS::kActive) return;
  const int ch = tid % Cfg::kChunksPerRow;
  if (!chunk_in_head(a, ch)) return;  // a column past the caller's head dim
  T* out = static_cast<T*>(a.out);
  const int r0 = tid / Cfg::kChunksPerRow;
#pragma unroll
  for (int p = 0; p < RS::kQPasses; ++p) {
    const int r = r0 + p * RS::kRowsPerPass;
    if (BM % RS::kRowsPerPass != 0 && r >= BM) break;
    const int m = m0 + r;
    if (m < rows) {
      int i, h;
      row_coords(a, head, m, &i, &h);
      *reinterpret_cast<Chunk16*>(out + s.out_off + i * a.out_row_stride + h * a.out_head_stride +
                                  ch * 8) =
          *reinterpret_cast<const Chunk16*>(smem + tile_offset<D>(r, ch));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The forward kernel: one (query tile, head, sequence, split) per CTA.
// kScoreMod: softcap / ALiBi build (scores turned into log2 units per element); else the scale
// is folded into the exponent (one FFMA per score) and masks are the only modifier.
// ---------------------------------------------------------------------------------------------
template <typename T, class Cfg, bool kScoreMod>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    attn_fwd_kernel(const __grid_constant__ FwdArgs a) {
  constexpr int D = Cfg::kHeadDim;
  constexpr bool kQRegs = kQInRegsFor<Cfg, kScoreMod>;
  constexpr bool kDecode = Cfg::kWarpsN > 1;
  // Decode tiles read their parameters while they wait (a decode call is latency-bound); prefill
  // tiles keep the plain wait (their calls are long, and it moved ptxas's register allocation).
  if constexpr (kDecode) {
    pdl::wait_and_release_after_params(0, a);
  } else {
    pdl::wait_and_release();
  }

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp % Cfg::kWarpsM;
  const int wn = warp / Cfg::kWarpsM;
  const TileCoords tc = tile_coords<Cfg>(a);
  const int split = static_cast<int>(tc.x % static_cast<unsigned>(a.num_splits));
  const int m_block = a.m_blocks - 1 - static_cast<int>(tc.x / static_cast<unsigned>(a.num_splits));
  const int head = tc.head;
  const int b = a.batch_base + tc.seq;
  const Seq s = sequence(a, b, head);
  const int rows = s.len_q * a.qpack;
  const int m0 = m_block * Cfg::kBlockM;
  if (m0 >= rows) return;
  const bool split_out = a.num_splits > 1;
  if (a.seqused_k != nullptr && s.len_k > rows_of_sequence(a, b)) {
    store_empty_tile<T, Cfg>(a, s, b, head, m0, rows, split, split_out, tid, true);
    if (tid == 0) report_keys_past_rows(a, s, b);
    return;
  }
  const KeyRange kr = key_range<Cfg>(a, s, m0, rows, split);
  if (kr.begin >= kr.end) {
    store_empty_tile<T, Cfg>(a, s, b, head, m0, rows, split, split_out, tid, false);
    return;
  }

  uint8_t* smem = dynamic_smem();
  const uint32_t sq = smem_u32(smem);
  const uint32_t skv = sq + Cfg::kQBytes;
  const int row0 = wm * Cfg::kMTiles * 16;  // first local row of the warp
  const int key_w = wn * Cfg::kWarpKeys;    // first key of the warp within a tile
  const int lr_a = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int lr_b = (lane & 7) + (lane >> 4) * 8;
  using Rows = detail::SwizzledRows<D>;
  const uint32_t q_lane = sq + Rows(lr_a, lane >> 4, static_cast<uint32_t>(row0 * D * 2)).base;
  const uint32_t k_base = Rows(lr_b, (lane >> 3) & 1, static_cast<uint32_t>(key_w * D * 2)).base;
  const uint32_t v_base = Rows(lr_a, lane >> 4, static_cast<uint32_t>(key_w * D * 2)).base;

  load_q<T, Cfg>(a, s, head, m0, rows, sq, tid);
  cp_async_commit();
  const int n_tiles = kr.end - kr.begin;
  // Decode, paged: the block id of key row key_w + lane of tile t (lanes < kWarpKeys), loaded one
  // tile before its copies are issued (load_kv_warp); the dependent block-table load is then off
  // their critical path (it doubled the per-CTA time of a long decode split when it was not).
  const bool lane_has_row = kDecode && s.blocks != nullptr && lane < Cfg::kWarpKeys;
  const auto lane_block_of = [&](int t) -> int32_t {
    if (!lane_has_row || t >= n_tiles) return 0;
    return page_block_of_row<Cfg>(a, s, kr.end - 1 - t, key_w + lane);
  };
  int32_t next_block = 0;  // decode: lane_block_of(it + kStages) during iteration it
  load_kv_prologue<T, Cfg>(a, s, kr, n_tiles, skv, key_w, tid, lane, lane_block_of, next_block);
  uint32_t qreg[kQRegs ? Cfg::kMTiles : 1][kQRegs ? Cfg::kKSteps : 1][4];
  load_q_fragments<Cfg, kQRegs>(qreg, q_lane);

  // Exponent multiplier: the scores are raw dot products (fast build) or log2 units (mods).
  const float c = kScoreMod ? 1.0f : a.scale_log2;
  float o[Cfg::kMTiles][Cfg::kDTiles][4];
  float row_max[Cfg::kMTiles][2];
  float row_sum[Cfg::kMTiles][2];
  init_softmax_state<Cfg>(o, row_max, row_sum);

  int stage = 0;
  for (int it = 0; it < n_tiles; ++it) {
    const int n = kr.end - 1 - it;
    wait_kv_tile<T, Cfg>(a, s, kr, it, n, n_tiles, stage, skv, tid);
    const uint32_t sk = skv + stage * Cfg::kStageBytes;
    const uint32_t k_lane = sk + k_base;
    const uint32_t v_lane = sk + Cfg::kTileBytes + v_base;
    float sc[Cfg::kMTiles][Cfg::kNTiles][4];
    compute_scores<T, Cfg, kQRegs>(sc, qreg, q_lane, k_lane);
    mask_scores<Cfg, kScoreMod>(sc, a, s, kr, b, head, m0, rows, row0, n, key_w, lane);
    online_softmax<Cfg>(sc, o, row_max, row_sum, c);
    if constexpr (Cfg::kSplitKV) load_next_k<T, Cfg>(a, s, it, n, n_tiles, skv, tid);
    accumulate_pv<T, Cfg>(o, sc, v_lane);
    if constexpr (kDecode) {
      // Every lane is done with the stage of tile it: the warp refills it with tile it + kStages.
      __syncwarp();
      const int ahead = it + Cfg::kStages;
      if (ahead < n_tiles) {
        load_kv_warp<T, Cfg>(a, s, kr.end - 1 - ahead, key_w, skv + stage * Cfg::kStageBytes,
                             skv + stage * Cfg::kStageBytes + Cfg::kTileBytes, next_block, lane);
      }
      cp_async_commit();
      next_block = lane_block_of(ahead + 1);
    }
    stage = stage + 1 == Cfg::kStages ? 0 : stage + 1;
  }

  reduce_row_sums<Cfg>(row_sum);
  if constexpr (kDecode) merge_key_split_warps<Cfg>(smem, o, row_max, row_sum, c, row0, wn, lane);

  // Epilogue: rows of warps wn == 0.
  const bool owner = wn == 0;
  if constexpr (cluster_build<Cfg>()) {
    if (a.cluster_merge) {
      store_cluster_partial<T, Cfg>(a, s, smem, o, row_max, row_sum, c, owner, b, head, m0, rows,
                                    split, row0, lane);
      return;
    }
  }
  if (split_out) {
    store_split_partial<Cfg>(a, o, row_max, row_sum, c, owner, b, head, m0, rows, split, row0,
                             lane);
    return;
  }
  store_output<T, Cfg, kQRegs>(a, s, smem, o, row_max, row_sum, c, owner, b, head, m0, rows, row0,
                               tid, lane);
}

}  // namespace cuda
}  // namespace attention
