// attention_tile.cuh: per-CTA building blocks of the CUDA attention kernels: tile order and
// sequence coordinates, key-tile ranges, cp.async tile loads (Q, K/V, paged K/V), masks and score
// modifiers on the C fragments of S. Device code; the forward kernel (attention_fwd_kernel.cuh)
// composes them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention_cuda_mma.cuh"
#include "attention_fwd_args.h"
#include "attention_fwd_config.h"

namespace attention {
namespace cuda {

using detail::Chunk16;
using detail::cp_async_16;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::dynamic_smem;
using detail::fast_exp2;
using detail::fast_log2;
using detail::fast_tanh;
using detail::FastDivU32;
using detail::ldmatrix_x4;
using detail::ldmatrix_x4_trans;
using detail::mma_16816;
using detail::pack2;
using detail::shfl_idx;
using detail::shfl_xor;
using detail::smem_u32;
using detail::tile_offset;

// ---------------------------------------------------------------------------------------------
// Per-CTA tile order, sequence coordinates and key-tile range.
// ---------------------------------------------------------------------------------------------
// Tile order. CTAs start in linear grid order (x fastest), and x counts a (head, sequence)'s query
// tiles from the last (its key range is the longest under a causal mask) down to the first. In
// that order the grid ends on the heavy tiles of its last pairs, and under a causal mask the
// last wave runs them on a few SMs while the others idle. With tile_group = G > 1 the grid's
// linear index runs over groups of G consecutive pairs, and within a group over tile ranks
// first: the heaviest tile of each of the G pairs, then the next, so that the light tiles come
// last (longest processing time first). G is sized so that the group's K/V stays in L2.
struct TileCoords {
  int x;     // the split and query-tile rank, as blockIdx.x in grid order
  int head;  // grid y
  int seq;   // grid z (within this launch's batch chunk)
};

template <class Cfg>
__device__ __forceinline__ TileCoords tile_coords(const FwdArgs& a) {
  if constexpr (Cfg::kWarpsN > 1) {  // decode tiles: grid order (Plan::decode)
    return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
            static_cast<int>(blockIdx.z)};
  } else {
    // Branch-free multiply-shift divisions (tile_group = 1 gives the grid order back): the
    // coordinates stay uniform values. A launch has < 2^31 CTAs (attn_fwd).
    const int group_size = static_cast<int>(a.tile_group);
    const int linear =
        static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    const int group = a.group_ctas_div.div(linear);
    const int in_group = linear - group * static_cast<int>(gridDim.x) * group_size;
    const int rank = a.tile_group_div.div(in_group);
    const int pair = group * group_size + (in_group - rank * group_size);
    const int seq = a.heads_grid_div.div(pair);
    return {rank, pair - seq * static_cast<int>(gridDim.y), seq};
  }
}

struct Seq {
  int len_q, len_k;
  int q_start;             // varlen: first packed row of the sequence
  int64_t q_off, out_off;  // element offsets of the sequence (row 0, head 0)
  int64_t k_off, v_off;    // of key row 0 of the kv head (paged: head offset only)
  const int32_t* blocks;   // paged: the sequence's block-table row
};

__device__ __forceinline__ Seq sequence(const FwdArgs& a, int b, int head) {
  Seq s;
  s.q_start = 0;
  s.len_q = a.seqlen_q;
  if (a.cu_seqlens_q != nullptr) {
    s.q_start = __ldg(a.cu_seqlens_q + b);
    s.len_q = __ldg(a.cu_seqlens_q + b + 1) - s.q_start;
  }
  // Keys: seqused_k[b], else the cu_seqlens_k difference, else seqlen_k less the left padding;
  // with leftpad_k they are rows [pad, pad + len_k) (attention_cpu.cpp reads it the same way;
  // flash_attn_with_kvcache's cache_seqlens - cache_leftpad is the seqused_k to pass).
  const int pad = a.leftpad_k != nullptr ? __ldg(a.leftpad_k + b) : 0;
  int len_k = a.seqlen_k - pad;
  if (a.seqused_k != nullptr) {
    len_k = __ldg(a.seqused_k + b);
  } else if (a.cu_seqlens_k != nullptr) {
    len_k = __ldg(a.cu_seqlens_k + b + 1) - __ldg(a.cu_seqlens_k + b);
  }
  s.len_k = len_k > 0 ? len_k : 0;
  const int64_t hk = static_cast<int64_t>(head) * a.qpack / a.group;
  if (a.cu_seqlens_q != nullptr) {
    s.q_off = static_cast<int64_t>(s.q_start) * a.q_row_stride;
    s.out_off = static_cast<int64_t>(s.q_start) * a.out_row_stride;
  } else {
    s.q_off = static_cast<int64_t>(b) * a.q_batch_stride;
    s.out_off = static_cast<int64_t>(b) * a.out_batch_stride;
  }
  s.blocks = nullptr;
  if (a.block_table != nullptr) {
    s.blocks = a.block_table + static_cast<int64_t>(b) * a.block_table_batch_stride;
    s.k_off = 0;
    s.v_off = 0;
  } else if (a.cu_seqlens_k != nullptr) {
    const int64_t k0 = __ldg(a.cu_seqlens_k + b);
    s.k_off = k0 * a.k_row_stride;
    s.v_off = k0 * a.v_row_stride;
  } else {
    const int64_t kb = a.kv_batch_idx != nullptr ? __ldg(a.kv_batch_idx + b) : b;
    s.k_off = kb * a.k_batch_stride + static_cast<int64_t>(pad) * a.k_row_stride;
    s.v_off = kb * a.v_batch_stride + static_cast<int64_t>(pad) * a.v_row_stride;
  }
  s.k_off += hk * a.k_head_stride;
  s.v_off += hk * a.v_head_stride;
  return s;
}

// Key tiles [begin, end) of a CTA whose packed rows start at m0, and the tiles that need a mask:
// n < mask_lo (a key left of some row's window) or n >= mask_hi (a key right of some row's
// diagonal/window or past len_k). Row i sees keys [d_i - left, d_i + right] with the diagonal
// d_i = i + len_k - len_q; the tile's rows span the diagonals [dmin, dmax].
struct KeyRange {
  int begin, end, mask_lo, mask_hi;
};

template <class Cfg>
__device__ __forceinline__ KeyRange key_range(const FwdArgs& a, const Seq& s, int m0, int rows,
                                              int split) {
  constexpr int64_t BN = Cfg::kBlockN;
  const int last = (m0 + Cfg::kBlockM < rows ? m0 + Cfg::kBlockM : rows) - 1;
  const int64_t off = static_cast<int64_t>(s.len_k) - s.len_q;
  const int64_t dmin = a.qpack_div.div(m0) + off;
  const int64_t dmax = a.qpack_div.div(last) + off;
  const int64_t n_total = ceil_div(s.len_k, BN);
  int64_t begin = max64(0, floor_div(dmin - a.win_left, BN));
  int64_t end = min64(n_total, floor_div(dmax + a.win_right, BN) + 1);
  KeyRange r;
  r.mask_hi =
      static_cast<int>(max64(-1, min64(s.len_k / BN, floor_div(dmin + a.win_right + 1, BN))));
  r.mask_lo = static_cast<int>(max64(-1, min64(n_total, ceil_div_signed(dmax - a.win_left, BN))));
  if (a.num_splits > 1 && end > begin) {
    const int64_t per = ceil_div(end - begin, a.num_splits);
    begin += per * split;
    end = min64(end, begin + per);
  }
  r.begin = static_cast<int>(begin);
  r.end = static_cast<int>(end > begin ? end : begin);
  return r;
}

// Packed row m of the CTA's head -> (query index, q head).
__device__ __forceinline__ void row_coords(const FwdArgs& a, int head, int m, int* i, int* h) {
  const int iq = a.qpack_div.div(m);
  *i = iq;
  *h = head * a.qpack + (m - iq * a.qpack);
}

__device__ __forceinline__ int64_t lse_index(const FwdArgs& a, const Seq& s, int b, int h, int i) {
  return a.cu_seqlens_q != nullptr ? static_cast<int64_t>(h) * a.lse_head_stride + s.q_start + i
                                   : static_cast<int64_t>(b) * a.lse_batch_stride +
                                         static_cast<int64_t>(h) * a.lse_head_stride + i;
}

__device__ __forceinline__ int64_t accum_row(const FwdArgs& a, int split, int b, int h, int i) {
  return ((static_cast<int64_t>(split) * a.batch + b) * a.heads_q + h) * a.seqlen_q + i;
}

// ---------------------------------------------------------------------------------------------
// Tile loads (cp.async, zero fill past the sequence ends). A tile row is kChunksPerRow 16-byte
// chunks; thread tid owns chunk tid % kChunksPerRow of rows tid / kChunksPerRow + p x
// kRowsPerPass (the first kRowsPerPass x kChunksPerRow threads take part), so a warp reads
// whole rows (coalesced) and a thread walks its rows with one pointer increment per pass
// instead of holding a 64-bit address per row.
// ---------------------------------------------------------------------------------------------
template <class Cfg>
struct RowSplit {
  static constexpr int kRowsPerPass = Cfg::kThreads / Cfg::kChunksPerRow;
  static constexpr int kActive = kRowsPerPass * Cfg::kChunksPerRow;
  static constexpr int kQPasses = (Cfg::kBlockM + kRowsPerPass - 1) / kRowsPerPass;
  static_assert(kRowsPerPass >= 1, "a row per pass at least");
};

template <typename T, class Cfg>
__device__ __forceinline__ void load_q(const FwdArgs& a, const Seq& s, int head, int m0, int rows,
                                       uint32_t sq, int tid) {
  using RS = RowSplit<Cfg>;
  if (RS::kActive < Cfg::kThreads && tid >= RS::kActive) return;
  const int r0 = tid / Cfg::kChunksPerRow;
  const int ch = tid % Cfg::kChunksPerRow;
  const T* q = static_cast<const T*>(a.q);
#pragma unroll
  for (int p = 0; p < RS::kQPasses; ++p) {
    const int row = r0 + p * RS::kRowsPerPass;
    if (Cfg::kBlockM % RS::kRowsPerPass != 0 && row >= Cfg::kBlockM) break;
    const int m = m0 + row;
    const bool valid = m < rows;
    const T* src = q;
    if (valid) {
      int i, h;
      row_coords(a, head, m, &i, &h);
      src = q + (s.q_off + i * a.q_row_stride + h * a.q_head_stride + ch * 8);
    }
    cp_async_16(sq + tile_offset<Cfg::kHeadDim>(row, ch), src, valid);
  }
}

// K and V rows [n * kBlockN, (n + 1) * kBlockN) into one stage (prefill tiles: every thread of
// the CTA), or only the K or only the V rows (the one-stage pipeline). Paged: each row through
// its block id (the same translation serves K and V), a read-only block-table load (L1-resident).
template <typename T, class Cfg, bool kLoadK = true, bool kLoadV = true>
__device__ __forceinline__ void load_kv(const FwdArgs& a, const Seq& s, int n, uint32_t sk,
                                        uint32_t sv, int tid) {
  using RS = RowSplit<Cfg>;
  constexpr int RPP = RS::kRowsPerPass;
  constexpr int kPasses = (Cfg::kBlockN + RPP - 1) / RPP;
  if (RS::kActive < Cfg::kThreads && tid >= RS::kActive) return;
  const int r0 = tid / Cfg::kChunksPerRow;
  const int ch = tid % Cfg::kChunksPerRow;
  const int j0 = n * Cfg::kBlockN + r0;
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  if (s.blocks != nullptr) {
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int row = r0 + p * RPP;
      if (Cfg::kBlockN % RPP != 0 && row >= Cfg::kBlockN) break;
      const int j = j0 + p * RPP;
      const bool valid = j < s.len_k;
      const T* ksrc = k;
      const T* vsrc = v;
      if (valid) {
        const int page = a.page_div.div(j);
        const int64_t in_page = j - page * a.page_block_size;
        const int64_t block = __ldg(s.blocks + page);
        ksrc = k + (s.k_off + block * a.k_batch_stride + in_page * a.k_row_stride + ch * 8);
        vsrc = v + (s.v_off + block * a.v_batch_stride + in_page * a.v_row_stride + ch * 8);
      }
      const uint32_t off = tile_offset<Cfg::kHeadDim>(row, ch);
      if constexpr (kLoadK) cp_async_16(sk + off, ksrc, valid);
      if constexpr (kLoadV) cp_async_16(sv + off, vsrc, valid);
    }
  } else {
    const T* kp = k + (s.k_off + static_cast<int64_t>(j0) * a.k_row_stride + ch * 8);
    const T* vp = v + (s.v_off + static_cast<int64_t>(j0) * a.v_row_stride + ch * 8);
    const int64_t kstep = RPP * a.k_row_stride;
    const int64_t vstep = RPP * a.v_row_stride;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int row = r0 + p * RPP;
      if (Cfg::kBlockN % RPP != 0 && row >= Cfg::kBlockN) break;
      const bool valid = j0 + p * RPP < s.len_k;
      const uint32_t off = tile_offset<Cfg::kHeadDim>(row, ch);
      if constexpr (kLoadK) cp_async_16(sk + off, valid ? kp : k, valid);
      if constexpr (kLoadV) cp_async_16(sv + off, valid ? vp : v, valid);
      kp += kstep;
      vp += vstep;
    }
  }
}

// Paged K/V: the block id of key row r of tile n (0 past len_k, where no copy reads it).
template <class Cfg>
__device__ __forceinline__ int32_t page_block_of_row(const FwdArgs& a, const Seq& s, int n, int r) {
  const int j = n * Cfg::kBlockN + r;
  return j < s.len_k ? __ldg(s.blocks + a.page_div.div(j)) : 0;
}

// Decode tiles: warp wn alone loads and reads the K/V rows of its keys [key_w, key_w +
// kWarpKeys) of every tile, so that its pipeline needs no CTA barrier and it refills a stage as
// soon as it has consumed it (kStages tiles in flight while it waits, not kStages - 1). Lanes run
// over the 16-byte chunks of a row, then over rows. Paged: lane r holds the block id of key row
// key_w + r (lane_block, loaded by the kernel a tile ahead) and hands it out by a shuffle.
template <class Cfg>
struct WarpRowSplit {
  static constexpr int kRowsPerPass = 32 / Cfg::kChunksPerRow;
  static constexpr int kActive = kRowsPerPass * Cfg::kChunksPerRow;  // lanes with a chunk
  static constexpr int kPasses = (Cfg::kWarpKeys + kRowsPerPass - 1) / kRowsPerPass;
};

template <typename T, class Cfg>
__device__ __forceinline__ void load_kv_warp(const FwdArgs& a, const Seq& s, int n, int key_w,
                                             uint32_t sk, uint32_t sv, int32_t lane_block,
                                             int lane) {
  using WS = WarpRowSplit<Cfg>;
  constexpr int RPP = WS::kRowsPerPass;
  const bool active = WS::kActive == 32 || lane < WS::kActive;
  const int r0 = lane / Cfg::kChunksPerRow;  // first key row (within the warp's keys) of the lane
  const int ch = lane % Cfg::kChunksPerRow;
  const int j0 = n * Cfg::kBlockN + key_w + r0;
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  // Rows that step by the row stride from the lane's first one: a contiguous cache, or pages of
  // a multiple of kWarpKeys rows (vLLM's 16, 32, ..., 256), where the warp's rows of a tile lie in
  // one page, whose block id lane 0 holds.
  const T* kp;
  const T* vp;
  if (s.blocks == nullptr) {
    if (!active) return;
    kp = k + (s.k_off + static_cast<int64_t>(j0) * a.k_row_stride + ch * 8);
    vp = v + (s.v_off + static_cast<int64_t>(j0) * a.v_row_stride + ch * 8);
  } else if (a.page_block_size % Cfg::kWarpKeys == 0) {
    const int32_t blk = shfl_idx(lane_block, 0);
    if (!active) return;
    const int j_w = n * Cfg::kBlockN + key_w;  // the warp's first key
    const int64_t in_page = j_w - a.page_div.div(j_w) * a.page_block_size + r0;
    kp = k + (s.k_off + blk * a.k_batch_stride + in_page * a.k_row_stride + ch * 8);
    vp = v + (s.v_off + blk * a.v_batch_stride + in_page * a.v_row_stride + ch * 8);
  } else {
    // Any other page size: every row through its own block id (a shuffle is a collective:
    // every lane takes part).
    int32_t block[WS::kPasses];
#pragma unroll
    for (int p = 0; p < WS::kPasses; ++p) {
      const int r = r0 + p * RPP;
      block[p] = shfl_idx(lane_block, r < Cfg::kWarpKeys ? r : Cfg::kWarpKeys - 1);
    }
    if (!active) return;
#pragma unroll
    for (int p = 0; p < WS::kPasses; ++p) {
      if (Cfg::kWarpKeys % RPP != 0 && r0 + p * RPP >= Cfg::kWarpKeys) break;
      const int j = j0 + p * RPP;
      const bool valid = j < s.len_k;
      const T* ksrc = k;
      const T* vsrc = v;
      if (valid) {
        const int64_t in_page = j - a.page_div.div(j) * a.page_block_size;
        ksrc = k + (s.k_off + block[p] * a.k_batch_stride + in_page * a.k_row_stride + ch * 8);
        vsrc = v + (s.v_off + block[p] * a.v_batch_stride + in_page * a.v_row_stride + ch * 8);
      }
      const uint32_t off = tile_offset<Cfg::kHeadDim>(key_w + r0 + p * RPP, ch);
      cp_async_16(sk + off, ksrc, valid);
      cp_async_16(sv + off, vsrc, valid);
    }
    return;
  }
  const int64_t kstep = RPP * a.k_row_stride;
  const int64_t vstep = RPP * a.v_row_stride;
#pragma unroll
  for (int p = 0; p < WS::kPasses; ++p) {
    if (Cfg::kWarpKeys % RPP != 0 && r0 + p * RPP >= Cfg::kWarpKeys) break;
    const bool valid = j0 + p * RPP < s.len_k;
    const uint32_t off = tile_offset<Cfg::kHeadDim>(key_w + r0 + p * RPP, ch);
    cp_async_16(sk + off, valid ? kp : k, valid);
    cp_async_16(sv + off, valid ? vp : v, valid);
    kp += kstep;
    vp += vstep;
  }
}

// ---------------------------------------------------------------------------------------------
// Scores: masks and score modifiers on the C fragments of S.
// Element (mt, nt, e) of a thread: local row mt * 16 + (e / 2) * 8 + g of the warp's rows, key
// key0 + nt * 8 + 2 t + e % 2.
// ---------------------------------------------------------------------------------------------
template <class Cfg>
__device__ __forceinline__ void row_diagonals(const FwdArgs& a, const Seq& s, int m0, int row0,
                                              int lane, int (&diag)[Cfg::kMTiles][2]) {
  const int off = s.len_k - s.len_q;
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      diag[mt][hf] = a.qpack_div.div(m0 + row0 + mt * 16 + hf * 8 + (lane >> 2)) + off;
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void apply_mask(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4],
                                           const int (&diag)[Cfg::kMTiles][2], const FwdArgs& a,
                                           int len_k, int key0, int lane) {
  const int j0 = key0 + 2 * (lane & 3);
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int lo = static_cast<int>(max64(0, diag[mt][hf] - a.win_left));
      const int hi = static_cast<int>(min64(len_k - 1, diag[mt][hf] + a.win_right));
#pragma unroll
      for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + nt * 8 + e;
          if (j < lo || j > hi) s[mt][nt][2 * hf + e] = -kInf;
        }
      }
    }
  }
}

// Softcap and ALiBi, turning raw dot products into scores in log2 units:
//   softcap: softcap * tanh(x * scale / softcap) * log2(e), else x * scale * log2(e)
//   alibi:   - slope * log2(e) * |d_i - j|
// Each modifier is one uniform branch around its element loop (per-element selects would make
// ptxas compute both sides).
template <class Cfg>
__device__ __forceinline__ void apply_score_mod(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4],
                                                const FwdArgs& a, const Seq& sq, int b, int head,
                                                int m0, int rows, int row0, int key0, int lane) {
  if (a.softcap_log2 != 0.0f) {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[mt][nt][e] = a.softcap_log2 * fast_tanh(s[mt][nt][e] * a.softcap_scale);
      }
    }
  } else {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= a.scale_log2;
      }
    }
  }
  if (a.alibi != nullptr) {
    // Slopes and diagonals of the thread's rows, per tile (L1-resident loads) rather than held
    // in registers across the loop.
    int diag[Cfg::kMTiles][2];
    float slope[Cfg::kMTiles][2];
    row_diagonals<Cfg>(a, sq, m0, row0, lane, diag);
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int m = m0 + row0 + mt * 16 + hf * 8 + (lane >> 2);
        int i, h;
        row_coords(a, head, m < rows ? m : m0, &i, &h);
        slope[mt][hf] = __ldg(a.alibi + b * a.alibi_batch_stride + h) * kLog2e;
      }
    }
    const int j0 = key0 + 2 * (lane & 3);
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int dist = diag[mt][e >> 1] - (j0 + nt * 8 + (e & 1));
          s[mt][nt][e] -= slope[mt][e >> 1] * static_cast<float>(dist < 0 ? -dist : dist);
        }
      }
    }
  }
}

}  // namespace cuda
}  // namespace attention
