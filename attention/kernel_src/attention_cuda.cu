// attention_cuda.cu: CUDA kernels and host launcher of the attention forward (attention_cuda.h).
//
// What it computes (attention_params.h, flash-attn 2 semantics): for every sequence b, query
// head h and query row i, out_i = softmax_j(s_ij) v_j over the visible keys j, with
// s_ij = scale <q_i, k_j> (then softcap * tanh(s / softcap), then - slope |d_i - j| for ALiBi),
// visibility bottom-right aligned (d_i = i + len_k - len_q; causal: j <= d_i; window:
// d_i - left <= j <= d_i + right; j < len_k), and lse_i = log sum_j exp(s_ij). A row without a
// visible key gets out = 0 and lse = +inf. q/k/v/out fp16 or bf16 (one dtype), fp32 softmax and
// accumulation, out rounded once; head_dim 32, 64, 96, 128, 192, 256. GQA/MQA map query head h
// to kv head h / (heads_q / heads_kv).
// Layout: [batch, seqlen, heads, head_dim] views with unit stride along head_dim and any batch /
// row / head strides that keep 16-byte chunks (multiples of 8 elements, 16-byte aligned bases;
// attention_cuda.h); varlen q/k packed along the rows and delimited by cu_seqlens; K/V rows
// through kv_batch_idx and leftpad_k (keys at rows [pad, pad + len_k), len_k = seqused_k[b] or
// seqlen_k - pad, as attention_cpu.cpp), or through a block table (paged: any page size >= 1).
//
// Design (FlashAttention-2: one CTA per (query tile, head, sequence, split); K/V streamed through
// shared memory in tiles; softmax online in registers; O in registers until the end):
// - MMA: mma.sync.aligned.m16n8k16 (fp16/bf16 in, fp32 accumulate), operands from shared memory
//   with ldmatrix(.trans) (attention_cuda_mma.cuh: fragment layouts and the 16-byte-chunk XOR
//   swizzle that keeps ldmatrix and cp.async free of bank conflicts). S = Q K^T per warp; its C
//   fragments, exponentiated and packed to 16 bits, are the A fragments of O += P V directly.
// - Tiles (TileConfig, instances below; 4 warps = 128 threads unless noted):
//     prefill  D   32/64:  128 x 64 keys, 2 MMA row tiles per warp, Q in registers, 2 stages
//              D   96:     128 x 64, Q re-read from shared memory, 2 stages
//              D  128:     128 x 32, 3 stages (see the config comment for 128 x 64)
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
//   across the group, so the light tiles come last (H200, bf16, causal, x SDPA flash: D128 2K
//   0.967 -> 0.995, 8K 1.017 -> 1.068; D256 2K 0.920 -> 0.943; D64 2K 0.926 -> 0.961).
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
//   block id per warp, then rows step as in a contiguous cache (H200, B64 x 16K keys: 5% faster,
//   a single CTA's stream 1.5x).
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
// - Programmatic dependent launch on sm_90+ (ATTENTION_PDL=0 disables; pdl.cuh): both kernels
//   launch with PDL, the first one too (faster after a GEMM as well, unlike the short elementwise
//   kernels of this repository). Both wait for their predecessor before the first global access
//   and release their dependents; they read their (__grid_constant__) parameters, and the combine
//   its row's indices, first, while they wait (wait_and_release_after_params: 0.35-0.4 us per
//   batch-1 decode call, H100).
// - Registers per thread (nvcc 13.0, ranges over sm_80 / sm_90a / sm_120; softcap / ALiBi build
//   in parentheses): prefill D32 197-198 (217-238), D64 239-245 (247-255), D96 252-255
//   (254-255), D128 246-254 (252-255) with 32-key tiles, D192 241-255 (201-233) and 244-254
//   (222-231) with 128 x 64 tiles, D256 249-255 (249-255); decode D32 79-104 (93-119), D64
//   114-127 (120-128), D96 148-163 (152-168), D128 167-168 (168, the 3-CTA cap), D192 199-244
//   (202-247), D256 236-255 (240-255). Local memory (cuobjdump):
//   the 64-key D128 tile of sm_90 / sm_100 spills 40-104 bytes and reloads 4-16 values per K/V tile
//   in its main loop (a measured net gain, see Prefill128Wide); the D256 tile of sm_80 / sm_90
//   spills 8-32 bytes and reloads 1-6 values per K/V tile (sm_120: none), against 256 MMAs per warp
//   and tile; the sm_120 softcap / ALiBi D96 build does one local access per K/V tile; every other
//   main loop has none. A few values live in local memory around the loop (stored before it,
//   reloaded after) in the sm_120 softcap / ALiBi builds of prefill D64 / D128 and decode D64.
// - Tile shapes and launch heuristics live in TileConfig / LaunchConfig / plan_* only.
//
// Why this shape: mma.sync rather than wgmma/TMA keeps one kernel for every capability from 8.0
// to 12.0 (a Hopper-specific kernel can come later behind the same params). Two 16-row tiles per
// warp (prefill, head_dim <= 128) halve the K/V shared-memory traffic per MMA compared with one
// (FlashAttention-2's 128-row tiles over 4 warps do the same); the decode tiles
// trade the row split for a key split so that GQA decode issues 4x fewer MMAs per K/V byte.
// Checked without a GPU: a host emulation (.exp/attn_emul, not part of the build) compiles this
// file as C++ and runs every thread as a fiber, warps in lockstep at each mma / ldmatrix /
// shuffle / vote, cp.async landing late or early, against a float64 reference.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attention_cuda.h"
#include "attention_cuda_mma.cuh"
#include "attention_params.h"
#include "pdl.cuh"

namespace attention {
namespace cuda {
namespace {

using detail::Chunk16;
using detail::FastDivU32;
using detail::cp_async_16;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::dynamic_smem;
using detail::fast_exp2;
using detail::fast_log2;
using detail::fast_tanh;
using detail::ldmatrix_x4;
using detail::ldmatrix_x4_trans;
using detail::mma_16816;
using detail::pack2;
using detail::shfl_idx;
using detail::shfl_xor;
using detail::smem_u32;
using detail::tile_offset;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kInf = std::numeric_limits<float>::infinity();
// An absent window side: far beyond any key index, small enough that index +/- it stays exact
// in int64 (the mask and tile-range formulas need no branch on it).
constexpr int64_t kUnbounded = int64_t(1) << 40;

// ---------------------------------------------------------------------------------------------
// Launch configuration: the only place where the tile shapes and launch heuristics live.
// ---------------------------------------------------------------------------------------------
// One CTA computes a tile of kBlockM (packed) query rows against the key range of its split,
// kBlockN keys per step. Its kWarpsM x kWarpsN warps split the rows (prefill: kWarpsM = 4) or
// the keys of every K/V tile (decode: kWarpsN > 1, the partial softmax states of the warps are
// merged at the end). kStages K/V tiles are in shared memory (cp.async pipeline).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarpsM_, int kWarpsN_, int kStages_,
          bool kQInRegs_, int kMinBlocksPerSm_>
struct TileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kWarps = kWarpsM * kWarpsN;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStages = kStages_;
  static constexpr bool kQInRegs = kQInRegs_;   // Q fragments loaded once (else per K tile)
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;  // register cap (launch bounds)
  static constexpr int kMTiles = kBlockM / (16 * kWarpsM);  // 16-row MMA tiles per warp
  static constexpr int kWarpKeys = kBlockN / kWarpsN;       // keys of a K/V tile per warp
  static constexpr int kNTiles = kWarpKeys / 8;             // S n-tiles per warp
  static constexpr int kKSteps = kHeadDim / 16;             // k-steps of S = Q K^T
  static constexpr int kDTiles = kHeadDim / 8;              // O n-tiles
  static constexpr int kPSteps = kWarpKeys / 16;            // k-steps of O += P V
  static constexpr int kChunksPerRow = kHeadDim / 8;        // 16-byte chunks per row
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kTileBytes = kBlockN * kHeadDim * 2;  // one K or V tile
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kSmemBytes = kQBytes + kStages * kStageBytes;
  // One stage (prefill only): one K and one V buffer, filled in alternation (FlashAttention-2's
  // pipeline): V of tile `it` lands while S of tile `it` is computed, K of tile it + 1 while
  // P V of tile `it` is. Twice the keys per tile in the shared memory of two 32-key stages.
  static constexpr bool kSplitKV = kStages == 1;
  static constexpr int kORegs = kMTiles * kDTiles * 4;     // O accumulator floats per thread
  // Cross-warp merge (kWarpsN > 1), in the K/V area once the last tile is consumed: the O
  // fragments of warps 1 .. kWarpsN-1, then per-warp row max and row sum.
  static constexpr int kMergeBytes = (kWarpsN - 1) * kORegs * 32 * 4 + 2 * kWarpsN * kBlockM * 4;
  // Split merge in a cluster (decode tiles, merge_splits_in_cluster), past the merge scratch: the
  // CTA's lse per row, then its normalized partial output, kBlockM rows of kPartialStride fp32.
  // 8 floats of padding per row make the epilogue's float2 stores conflict-free (a half warp's 4
  // rows x 4 column pairs land in 32 distinct banks).
  static constexpr int kPartialStride = kHeadDim + 8;
  static constexpr int kPartialLseOffset = kQBytes + (kMergeBytes + 15) / 16 * 16;
  static constexpr int kPartialOOffset = kPartialLseOffset + kBlockM * 4;
  static constexpr int kPartialEnd = kPartialOOffset + kBlockM * kPartialStride * 4;

  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head_dim");
  static_assert(kBlockM % (16 * kWarpsM) == 0 && kMTiles >= 1, "whole 16-row tiles per warp");
  static_assert(kWarpKeys % 16 == 0, "whole 16-key steps per warp");
  static_assert(kStages >= 2 || kWarpsN == 1, "decode tiles double-buffer K/V");
  static_assert(kWarpsN == 1 || (kWarpKeys <= 32 && kChunksPerRow <= 32), "a lane per key row");
  static_assert(kWarpsN == 1 || kMergeBytes <= kStages * kStageBytes, "merge scratch fits");
  static_assert(kWarpsN == 1 || (kPartialEnd <= kSmemBytes && kPartialOOffset % 16 == 0),
                "partial state fits, 16-byte aligned rows");
  static_assert(kSmemBytes <= 227 * 1024, "fits the largest opt-in limit (sm_90/100)");
};

// Prefill: the warps (4; 8 in the 128-row head-dim-192 tile) split the query rows. Two 16-row MMA
// tiles per warp for head_dim <= 128: every K/V fragment loaded with ldmatrix feeds 4 MMAs, which
// keeps shared-memory traffic at 160-190 B per m16n8k16 (the H100 serves about 128 B/clk/SM and
// issues an m16n8k16 every ~1.5 clk/SM at the mma.sync peak); one tile per warp above that, to stay
// within 255 registers. Q stays in registers for head_dim <= 64 (32 registers); for 96/128 it is
// re-read from shared memory per K/V tile (the O and S accumulators take 96-128 + 32-64 registers).
// Head dims 128 and 192 take a wider tile where the device's shared memory holds it (the *Wide
// instances, picked at run time; every other instance fits the 99 KB opt-in of sm_86/89/120).
// Head dim 128: 64-key tiles (FlashAttention-2's shape) where two 96 KB CTAs fit per SM (sm_90,
// sm_100), else 32-key tiles in 3 stages (80 KB: two CTAs per SM on sm_80 too). ptxas (13.0,
// sm_90a) spills 56-80 bytes per thread of the 64-key build and none of the 32-key one, yet the
// 64-key tile was 3-8% faster on an H200 (bf16, S 2K / 8K, causal and not: 0.92-0.97x -> 0.99-1.03x
// SDPA's flash backend); tiles of 64 rows or 8 warps were slower (.exp A/B, session notes).
// Head dim 256: 64-key tiles in one stage (kSplitKV), 96 KB (two CTAs per SM on sm_90 / sm_100, one
// on sm_80 and sm_86/89/120, as before). Against 32-key tiles in 2 stages (the same 96 KB; the
// per-tile softmax, barrier and loop work is spread over half the keys) 5-7% faster on an H200
// (bf16, in one process, x SDPA flash: S 2K 0.91-0.94 -> 0.97-1.00, causal 0.97 -> 1.02, 8K causal
// 0.95-0.98 -> 1.00-1.03, 16K 0.96 -> 1.01, S 512 0.89 -> 0.94); 128 x 64 tiles over 8 warps in 2
// stages (192 KB, sm_90 only) gained only 1-5%, 128 x 32 over 8 warps lost 10%. Head dim 192: 128 x
// 64 over 8 warps in 2 stages (144 KB, one CTA per SM; FlashAttention-2's tile shape for 192) where
// that fits (sm_80, sm_90, sm_100), 5-6% faster on an H200 than 64 x 32 over 4 warps (x SDPA flash:
// S 2K 0.88 -> 0.92, causal 0.90 -> 0.93, 8K 0.89 -> 0.94, 8K causal 0.91 -> 0.96, S 512 0.83 ->
// 0.89), which stays elsewhere (72 KB); in one stage (96 KB) 128 x 64 lost 4-10%, 64 x 64 about 1%,
// and re-reading Q from shared memory 3-8%.
// Shared memory: 24 / 48 / 72 / 80 (96) / 72 (144) / 96 KB.
using Prefill32 = TileConfig<32, 128, 64, 4, 1, 2, true, 2>;
using Prefill64 = TileConfig<64, 128, 64, 4, 1, 2, true, 2>;
using Prefill96 = TileConfig<96, 128, 64, 4, 1, 2, false, 2>;
using Prefill128 = TileConfig<128, 128, 32, 4, 1, 3, false, 2>;
using Prefill128Wide = TileConfig<128, 128, 64, 4, 1, 2, false, 2>;
using Prefill192 = TileConfig<192, 64, 32, 4, 1, 2, true, 2>;
using Prefill192Wide = TileConfig<192, 128, 64, 8, 1, 2, true, 1>;
using Prefill256 = TileConfig<256, 64, 64, 4, 1, 1, false, 2>;
// Decode: one 16-row tile (seqlen_q x the q heads of a kv head, packed) shared by all warps,
// which split each K/V tile's keys: a warp computes 16 x 16 scores and a 16 x D product per
// tile instead of 64 x 64 with 60 rows of padding, so the MMA work per K/V byte is 4x smaller
// and the kernel stays bound by the K/V stream. Two stages of 64 keys: 32 KB per tile at
// head_dim 128, 68 KB per CTA, three CTAs per SM on sm_90; each warp keeps both of its stages
// in flight while it waits (up to 192 KB of K/V per SM, against about 40-60 KB that an H200's
// 4.8 TB/s x ~1.2 us latency / 132 SMs asks for; a single CTA streams 26-35% faster than with
// one stage in flight behind a CTA barrier, H200 bf16 num_splits 1). The register cap of 3 CTAs
// per SM (168) matches. Head dim 192/256: 32-key tiles over 2 warps (54 / 72 KB).
// Rejected for head dim 128 at batch 1-8 (H100, bf16, GQA 32/8, 1K-32K keys, against this tile in
// the same session): 4 stages in flight (132 KB, one CTA per SM) at 0.87-1.02x its speed, 8 warps
// over 128-key tiles at 0.79-1.02x (B1 x 4K: 7.96 -> 8.71 / 8.92 us). Batch-1 calls are not short
// of bytes in flight or of warps per SM; see attn_fwd_combine_kernel for where their time goes.
using Decode32 = TileConfig<32, 16, 64, 1, 4, 2, true, 4>;
using Decode64 = TileConfig<64, 16, 64, 1, 4, 2, true, 4>;
using Decode96 = TileConfig<96, 16, 64, 1, 4, 2, true, 3>;
using Decode128 = TileConfig<128, 16, 64, 1, 4, 2, true, 3>;
using Decode192 = TileConfig<192, 16, 32, 1, 2, 2, false, 4>;
using Decode256 = TileConfig<256, 16, 32, 1, 2, 2, false, 3>;
// The instances every capability can take fit the 99 KB opt-in of sm_86/89/120.
template <class... Cfg> constexpr bool fit_99kb() {
  return ((Cfg::kSmemBytes <= 99 * 1024) && ...);
}
static_assert(fit_99kb<Prefill32, Prefill64, Prefill96, Prefill128, Prefill192, Prefill256,
                       Decode32, Decode64, Decode96, Decode128, Decode192, Decode256>(),
              "shared memory of the instances that every capability takes");

struct LaunchConfig {
  // Packed query rows (seqlen_q x q heads per kv head) up to which the decode tiles are used.
  static constexpr int kDecodeMaxRows = 32;
  // Split-KV: at most this many splits (the combine kernel holds 4 per lane) ...
  static constexpr int kMaxSplits = 128;
  // ... of at least this many key tiles each (a split pays a Q load and a partial-output row;
  // one-CTA-per-SM decode grids: 1, once a key range has 2 x this many; plan_splits).
  static constexpr int kMinTilesPerSplit = 2;
  // No split once the grid covers this many waves of resident CTAs.
  static constexpr int kNoSplitWaves = 2;
  // Splits: the smallest count whose wave efficiency is within this factor of the best.
  static constexpr double kSplitEfficiency = 0.85;
  static constexpr int kCombineWarps = 4;  // per output row (one CTA)
  static constexpr int kCombineUnroll = 4;  // split rows loaded at once per warp
  static constexpr int64_t kMaxGridYZ = 65535;
  // Tile order: the (head, sequence) pairs of a heaviest-first group keep their K/V within
  // this fraction of L2 (1 / kTileGroupL2Share).
  static constexpr int kTileGroupL2Share = 2;
};

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Floor / ceiling of a / b for any sign of a, b > 0.
__host__ __device__ __forceinline__ int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
__host__ __device__ __forceinline__ int64_t ceil_div_signed(int64_t a, int64_t b) {
  return -floor_div(-a, b);
}
__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// ---------------------------------------------------------------------------------------------
// Kernel arguments (attention_params.h, resolved by the launcher).
// ---------------------------------------------------------------------------------------------
struct FwdArgs {
  const void* q;    // [batch, seqlen_q, heads_q, D] (varlen: [1, total_q, heads_q, D])
  const void* k;    // [batch_k, seqlen_k, heads_kv, D] / packed / [num_blocks, page, heads_kv, D]
  const void* v;    // as k
  void* out;        // as q
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t out_batch_stride, out_row_stride, out_head_stride;
  float* lse;       // [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]) or null
  int64_t lse_batch_stride, lse_head_stride;
  const int32_t* cu_seqlens_q;  // [batch + 1] or null
  const int32_t* cu_seqlens_k;  // [batch + 1] or null
  const int32_t* seqused_k;     // [batch] or null
  const int32_t* kv_batch_idx;  // [batch] or null
  const int32_t* leftpad_k;     // [batch] or null
  const int32_t* block_table;   // [batch, max_blocks] or null (not paged)
  int64_t block_table_batch_stride;
  FastDivU32 page_div;          // j / page_block_size
  int page_block_size;
  int seqlen_q, seqlen_k;       // padded / maximum lengths
  int batch, batch_base;        // sequences; first sequence of this launch
  int heads_q, group;           // group = heads_q / heads_kv
  int qpack;                    // q heads packed into the rows of a tile: group or 1
  FastDivU32 qpack_div;         // packed row -> query index
  int m_blocks, num_splits;
  int cluster_merge;            // 1: the splits of a tile are one cluster and merge there
  uint32_t tile_group;          // pairs per heaviest-first group (tile_coords); 1: grid order
  FastDivU32 group_ctas_div;    // linear CTA index -> group (gridDim.x * tile_group CTAs each)
  FastDivU32 tile_group_div;    // CTA index in a group -> tile rank
  FastDivU32 heads_grid_div;    // pair -> sequence (gridDim.y pairs each)
  float scale_log2;             // softmax_scale * log2(e)
  float softcap_scale;          // softmax_scale / softcap
  float softcap_log2;           // softcap * log2(e); 0: no softcap
  const float* alibi;           // [heads_q] or [batch, heads_q] or null
  int64_t alibi_batch_stride;
  int64_t win_left, win_right;  // kUnbounded for an absent side (causal: right = 0)
  float* out_accum;             // [splits, batch, heads_q, seqlen_q, D] when num_splits > 1
                                // and not cluster_merge
  float* lse_accum;             // [splits, batch, heads_q, seqlen_q]
};

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

template <class Cfg> __device__ __forceinline__ TileCoords tile_coords(const FwdArgs& a) {
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
  int q_start;                 // varlen: first packed row of the sequence
  int64_t q_off, out_off;      // element offsets of the sequence (row 0, head 0)
  int64_t k_off, v_off;        // of key row 0 of the kv head (paged: head offset only)
  const int32_t* blocks;       // paged: the sequence's block-table row
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
  r.mask_hi = static_cast<int>(max64(-1, min64(s.len_k / BN, floor_div(dmin + a.win_right + 1, BN))));
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
  return a.cu_seqlens_q != nullptr
             ? static_cast<int64_t>(h) * a.lse_head_stride + s.q_start + i
             : static_cast<int64_t>(b) * a.lse_batch_stride + static_cast<int64_t>(h) * a.lse_head_stride + i;
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
template <class Cfg> struct RowSplit {
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
template <class Cfg> struct WarpRowSplit {
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
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = a.softcap_log2 * fast_tanh(s[mt][nt][e] * a.softcap_scale);
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
// The most splits that merge in a cluster: where clusters were measured to pay (plan_cluster),
// and the merge's unroll bound, so that the decode instances hold no registers for more (an
// unroll over 16 took D32 decode from 89 to 128 registers, sm_90a). A portable cluster size.
constexpr int kClusterMergeMaxSplits = 4;

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
  for (int item = static_cast<int>(threadIdx.x) * n + split; item < items; item += Cfg::kThreads * n) {
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
        w[sp] = w[sp] == -kInf ? 0.0f : expf(w[sp] - mx);  // all -inf: every weight 0
        sum += w[sp];
      }
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
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
    *reinterpret_cast<uint2*>(static_cast<T*>(a.out) + s.out_off + i * a.out_row_stride +
                              h * a.out_head_stride + col) = packed;
    if (a.lse != nullptr && col == 0) a.lse[lse_index(a, s, b, h, i)] = sum > 0.0f ? mx + logf(sum) : kInf;
  }
  detail::cluster_sync();  // no CTA exits while another may still read its partial state
}

// A row's lse from its running max (scaled to log2 units by c) and sum: (max c + log2 l) ln 2, or
// `empty` for a row without a visible key (+inf for out's lse, -inf for a split's partial state).
__device__ __forceinline__ float row_lse(float row_max, float l, float c, float empty) {
  return l > 0.0f ? (row_max * c + fast_log2(l)) * kLn2 : empty;
}

// One row of a split's normalized partial output for a merge (merge_splits_in_cluster, the
// combine kernel): the lane's 2 columns of every 8-column tile of O / l, fp32, at row_out.
template <class Cfg>
__device__ __forceinline__ void store_partial_row(const float (&o)[Cfg::kDTiles][4], int hf, float l,
                                                  int lane, float* row_out) {
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  float* dst = row_out + 2 * (lane & 3);
#pragma unroll
  for (int dt = 0; dt < Cfg::kDTiles; ++dt) {
    *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][2 * hf] * inv, o[dt][2 * hf + 1] * inv);
  }
}

// ---------------------------------------------------------------------------------------------
// The forward kernel: one (query tile, head, sequence, split) per CTA; see the file header.
// kScoreMod: softcap / ALiBi build (scores turned into log2 units per element); else the scale
// is folded into the exponent (one FFMA per score) and masks are the only modifier.
// ---------------------------------------------------------------------------------------------
template <typename T, class Cfg, bool kScoreMod>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    attn_fwd_kernel(const __grid_constant__ FwdArgs a) {
  constexpr int D = Cfg::kHeadDim;
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  constexpr int kMT = Cfg::kMTiles;
  // Q fragments in registers as configured, except in the softcap / ALiBi build above head_dim
  // 128 (the 48 registers of Q at 192 pushed ptxas into spills there; Q is re-read instead).
  constexpr bool kQRegs = Cfg::kQInRegs && !(kScoreMod && D > 128);
  // Decode tiles read their parameters while they wait (a decode call is latency-bound); prefill
  // tiles keep the plain wait (their calls are long, and it moved ptxas's register allocation).
  if constexpr (Cfg::kWarpsN > 1) {
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
  const int m0 = m_block * BM;
  if (m0 >= rows) return;
  const KeyRange kr = key_range<Cfg>(a, s, m0, rows, split);
  const bool split_out = a.num_splits > 1;
  // Split merge in the cluster: decode tiles on sm_90+ (the launcher sets cluster_merge only there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kClusterBuild = Cfg::kWarpsN > 1;
#else
  constexpr bool kClusterBuild = false;
#endif

  if (kr.begin >= kr.end) {
    if constexpr (kClusterBuild) {
      if (a.cluster_merge) {  // no visible key: lse = -inf, and the CTA takes part in the merge
        float* lse_part = reinterpret_cast<float*>(dynamic_smem() + Cfg::kPartialLseOffset);
        for (int r = tid; r < BM; r += Cfg::kThreads) lse_part[r] = -kInf;
        merge_splits_in_cluster<T, Cfg>(a, s, b, head, m0, rows, split);
        return;
      }
    }
    // No key in range: out = 0 and lse = +inf (a split: lse = -inf, out_accum never read).
    for (int r = tid; r < BM; r += Cfg::kThreads) {
      const int m = m0 + r;
      if (m >= rows) break;
      int i, h;
      row_coords(a, head, m, &i, &h);
      if (split_out) {
        a.lse_accum[accum_row(a, split, b, h, i)] = -kInf;
      } else if (a.lse != nullptr) {
        a.lse[lse_index(a, s, b, h, i)] = kInf;
      }
    }
    if (!split_out) {
      for (int c = tid; c < BM * Cfg::kChunksPerRow; c += Cfg::kThreads) {
        const int r = c / Cfg::kChunksPerRow;
        const int ch = c % Cfg::kChunksPerRow;
        const int m = m0 + r;
        if (m >= rows) break;
        int i, h;
        row_coords(a, head, m, &i, &h);
        *reinterpret_cast<Chunk16*>(static_cast<T*>(a.out) + s.out_off + i * a.out_row_stride +
                                    h * a.out_head_stride + ch * 8) = Chunk16{{0, 0, 0, 0}};
      }
    }
    return;
  }

  uint8_t* smem = dynamic_smem();
  const uint32_t sq = smem_u32(smem);
  const uint32_t skv = sq + Cfg::kQBytes;

  // Per-lane ldmatrix rows (attention_cuda_mma.cuh): the A pattern (Q, and V read with .trans)
  // takes matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
  // as registers 0..3; the B pattern (K) takes (keys 0-7, d 0-7), (keys 0-7, d 8-15),
  // (keys 8-15, d 0-7), (keys 8-15, d 8-15), the b[0], b[1] of two adjacent n-tiles.
  const int row0 = wm * kMT * 16;              // first local row of the warp
  const int key_w = wn * Cfg::kWarpKeys;       // first key of the warp within a tile
  const int lr_a = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int lr_b = (lane & 7) + (lane >> 4) * 8;
  using Rows = detail::SwizzledRows<D>;
  const uint32_t q_lane = sq + Rows(lr_a, lane >> 4, static_cast<uint32_t>(row0 * D * 2)).base;
  const uint32_t k_base = Rows(lr_b, (lane >> 3) & 1, static_cast<uint32_t>(key_w * D * 2)).base;
  const uint32_t v_base = Rows(lr_a, lane >> 4, static_cast<uint32_t>(key_w * D * 2)).base;

  // Prologue: Q, then the first K/V tiles (from the last tile down): kStages - 1 of them for
  // prefill tiles (the CTA refills a stage after the barrier that retires it), the K of the first
  // tile with one stage (kSplitKV), all kStages for decode tiles (each warp refills its share of
  // a stage once it has consumed it).
  constexpr bool kDecode = Cfg::kWarpsN > 1;
  constexpr int kAhead = kDecode ? Cfg::kStages : Cfg::kStages - 1;  // tiles issued before tile 0
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

  // Q, copied by every thread: published by a barrier once this thread's copies have landed
  // (prefill tiles re-reading Q from shared memory have it published by the loop's first barrier).
  if constexpr (kQRegs || kDecode) {
    cp_async_wait<kAhead>();
    __syncthreads();
  }
  uint32_t qreg[kQRegs ? kMT : 1][kQRegs ? Cfg::kKSteps : 1][4];
  if constexpr (kQRegs) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int ks = 0; ks < Cfg::kKSteps; ++ks) {
        ldmatrix_x4(qreg[mt][ks], Rows::at(q_lane, mt * 16, ks));
      }
    }
  }

  // Exponent multiplier: the scores are raw dot products (fast build) or log2 units (mods).
  const float c = kScoreMod ? 1.0f : a.scale_log2;

  float o[kMT][Cfg::kDTiles][4];
  float row_max[kMT][2];
  float row_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < Cfg::kDTiles; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
    }
    row_max[mt][0] = row_max[mt][1] = -kInf;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }

  int stage = 0;
  for (int it = 0; it < n_tiles; ++it) {
    const int n = kr.end - 1 - it;
    if constexpr (kDecode) {
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
    const uint32_t sk = skv + stage * Cfg::kStageBytes;
    const uint32_t k_lane = sk + k_base;
    const uint32_t v_lane = sk + Cfg::kTileBytes + v_base;

    // S = Q K^T over the warp's rows and keys. Decode tiles (one 16 x 16 block of S per warp, two
    // accumulators) alternate the k-steps between two sets of accumulators, which halves the
    // chain of dependent MMAs: one warp per SM sub-partition at batch 1 waits on every link.
    constexpr int kChains = kDecode ? 2 : 1;
    float sc[kMT][Cfg::kNTiles][4];
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

    // Modifiers and masks (masks on boundary tiles only: a uniform branch).
    const int key0 = n * BN + key_w;
    const bool masked = n >= kr.mask_hi || n < kr.mask_lo;
    if constexpr (kScoreMod) apply_score_mod<Cfg>(sc, a, s, b, head, m0, rows, row0, key0, lane);
    if (masked) {
      int diag[kMT][2];
      row_diagonals<Cfg>(a, s, m0, row0, lane, diag);
      apply_mask<Cfg>(sc, diag, a, s.len_k, key0, lane);
    }

    // Online softmax: new row maxima (quad butterfly), P = exp2(S c - max c) in place, the
    // running sums rescaled by exp2((old max - new max) c), and O too unless no row max of the
    // warp moved (a warp vote; after the first tiles of a row the usual case, and then every
    // correction is exactly 1).
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

    if constexpr (Cfg::kSplitKV) {
      // V of tile `it` has landed, and every thread is done with its K: K of tile it + 1 lands
      // while P V runs.
      cp_async_wait<0>();
      __syncthreads();
      if (it + 1 < n_tiles) {
        load_kv<T, Cfg, true, false>(a, s, n - 1, skv, skv + Cfg::kTileBytes, tid);
      }
      cp_async_commit();
    }

    // O += P V: the C fragments of two S n-tiles are the A fragment of a 16-key step.
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

  // Row sums: the quad's partial sums.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      row_sum[mt][hf] += shfl_xor(row_sum[mt][hf], 1);
      row_sum[mt][hf] += shfl_xor(row_sum[mt][hf], 2);
    }
  }

  // Key-split warps: merge the (max, sum, O) states of the rows into warp 0 (log-sum-exp).
  if constexpr (Cfg::kWarpsN > 1) {
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
              o[mt][dt][e] += red_o[(((w - 1) * kMT + mt) * Cfg::kDTiles * 4 + dt * 4 + e) * 32 + lane];
            }
          }
        }
      }
    }
  }

  // Epilogue: rows of warps wn == 0. out = O / l (0 for l = 0), lse = (max c + log2 l) ln 2.
  const bool owner = wn == 0;
  if constexpr (kClusterBuild) {
    if (a.cluster_merge) {
      if (owner) {
        float* lse_part = reinterpret_cast<float*>(smem + Cfg::kPartialLseOffset);
        float* o_part = reinterpret_cast<float*>(smem + Cfg::kPartialOOffset);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int r = row0 + mt * 16 + hf * 8 + (lane >> 2);
            const float l = row_sum[mt][hf];
            store_partial_row<Cfg>(o[mt], hf, l, lane, o_part + r * Cfg::kPartialStride);
            if ((lane & 3) == 0) lse_part[r] = row_lse(row_max[mt][hf], l, c, -kInf);
          }
        }
      }
      merge_splits_in_cluster<T, Cfg>(a, s, b, head, m0, rows, split);
      return;
    }
  }
  if (split_out) {
    if (owner) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int m = m0 + row0 + mt * 16 + hf * 8 + (lane >> 2);
          if (m < rows) {
            int i, h;
            row_coords(a, head, m, &i, &h);
            const int64_t idx = accum_row(a, split, b, h, i);
            const float l = row_sum[mt][hf];
            store_partial_row<Cfg>(o[mt], hf, l, lane, a.out_accum + idx * D);
            if ((lane & 3) == 0) a.lse_accum[idx] = row_lse(row_max[mt][hf], l, c, -kInf);
          }
        }
      }
    }
    return;
  }

  // The lanes of a warp may still be reading their Q rows (ldmatrix of the last tile) when
  // others start staging output over them: converge the warp first (racecheck's intra-warp hazard).
  if constexpr (!kQRegs) __syncwarp();
  if (owner) {
    // Stage the rounded tile in the Q area: a warp writes only rows that it alone read from
    // there (prefill), or rows that every warp finished reading before the merge (decode).
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = row0 + mt * 16 + hf * 8 + (lane >> 2);
        const float l = row_sum[mt][hf];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
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
  T* out = static_cast<T*>(a.out);
  const int r0 = tid / Cfg::kChunksPerRow;
  const int ch = tid % Cfg::kChunksPerRow;
#pragma unroll
  for (int p = 0; p < RS::kQPasses; ++p) {
    const int r = r0 + p * RS::kRowsPerPass;
    if (BM % RS::kRowsPerPass != 0 && r >= BM) break;
    const int m = m0 + r;
    if (m < rows) {
      int i, h;
      row_coords(a, head, m, &i, &h);
      *reinterpret_cast<Chunk16*>(out + s.out_off + i * a.out_row_stride + h * a.out_head_stride + ch * 8) =
          *reinterpret_cast<const Chunk16*>(smem + tile_offset<D>(r, ch));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Split-KV combine: one CTA per output row (b, h, i). lse = log(sum_s exp(lse_s)),
// out = sum_s exp(lse_s - lse) out_s; splits with lse_s = -inf (no visible key) are skipped (their
// out_accum rows, never written, get weight 0); a row with no split left gets out = 0, lse = +inf.
// The warps take interleaved splits, kCombineUnroll independent row loads at a time, and warp 0
// adds up their partial rows: a single warp walking the splits one dependent L2 load after
// another cost about 0.4 us per split (H200), which at batch 1 was a third of the decode time.
// The first rows are loaded together with the split lse values (one L2 round trip, not two).
// At batch 1 the combine is a quarter of the call: without it (timing only) B1 x 4K keys took 5.96
// instead of 8.00 us (H100, bf16, GQA 32/8, D128, 16 splits). Merging in the split kernel instead,
// by the CTA whose arrival completes a per-tile count in the workspace (a tagged word, so that it
// needs no zeroing), was slower at batch 1-2 and even to 8% slower at batch 8 (B1 x 4K 8.51 ->
// 11.22 us, B1 x 1K 6.74 -> 9.13 us; benchmarks/NOTES.md): the last CTA's fence, atomic arrival and
// reads of the other splits' rows are several dependent L2 round trips of about 0.6 us each, more
// than this kernel's launch (overlapped by PDL) and its one round trip.
// ---------------------------------------------------------------------------------------------
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
      w[t] = (mx == -kInf || w[t] == -kInf) ? 0.0f : expf(w[t] - mx);
      sum += w[t];
    }
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) sum += shfl_xor(sum, d);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    if (sum > 0.0f) lse_row = mx + logf(sum);
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
           (a.cu_seqlens_q != nullptr ? static_cast<int64_t>(q_start + i) * a.out_row_stride
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
    const int64_t li = a.cu_seqlens_q != nullptr
                           ? static_cast<int64_t>(h) * a.lse_head_stride + q_start + i
                           : b * a.lse_batch_stride + static_cast<int64_t>(h) * a.lse_head_stride + i;
    a.lse[li] = lse_row;
  }
}

// ---------------------------------------------------------------------------------------------
// Host side: device properties, kernel table, plan, validation, launch.
// ---------------------------------------------------------------------------------------------
constexpr int kMaxDevices = 64;

struct DeviceInfo {
  int sms;
  int smem_optin;  // bytes of shared memory one CTA may opt into
  int l2_bytes;
  int cc_major;
  int smem_per_sm;  // shared memory of an SM (all its CTAs together)
};

cudaError_t device_info(DeviceInfo* info) {
  static std::atomic<int> sms_of[kMaxDevices] = {};
  static std::atomic<int> smem_optin_of[kMaxDevices] = {};
  static std::atomic<int> l2_bytes_of[kMaxDevices] = {};
  static std::atomic<int> cc_major_of[kMaxDevices] = {};
  static std::atomic<int> smem_per_sm_of[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  int sms = sms_of[device].load(std::memory_order_relaxed);
  int smem_optin = smem_optin_of[device].load(std::memory_order_relaxed);
  int l2_bytes = l2_bytes_of[device].load(std::memory_order_relaxed);
  int cc_major = cc_major_of[device].load(std::memory_order_relaxed);
  int smem_per_sm = smem_per_sm_of[device].load(std::memory_order_relaxed);
  if (sms == 0 || smem_optin == 0 || l2_bytes == 0 || cc_major == 0 || smem_per_sm == 0) {
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    if (err != cudaSuccess) return err;
    if (sms <= 0 || smem_optin <= 0 || l2_bytes <= 0 || cc_major <= 0 || smem_per_sm <= 0) {
      return cudaErrorInvalidDevice;
    }
    sms_of[device].store(sms, std::memory_order_relaxed);
    smem_optin_of[device].store(smem_optin, std::memory_order_relaxed);
    l2_bytes_of[device].store(l2_bytes, std::memory_order_relaxed);
    cc_major_of[device].store(cc_major, std::memory_order_relaxed);
    smem_per_sm_of[device].store(smem_per_sm, std::memory_order_relaxed);
  }
  info->sms = sms;
  info->smem_optin = smem_optin;
  info->l2_bytes = l2_bytes;
  info->cc_major = cc_major;
  info->smem_per_sm = smem_per_sm;
  return cudaSuccess;
}

using FwdKernelFn = void (*)(FwdArgs);

struct KernelInfo {
  FwdKernelFn fn;
  int threads, smem, block_m, block_n;
  cudaError_t (*prepare)(int* ctas_per_sm);  // opt-in smem once per device; occupancy
  // Clusters of `size` CTAs of `smem` bytes each that can be resident at once (0: none).
  cudaError_t (*max_clusters)(int size, int smem, int* count);
};

// Opts the instance into its shared memory once per device and returns its resident CTAs per
// SM (cached: both are per-device properties).
template <typename T, class Cfg, bool kScoreMod> cudaError_t prepare_kernel(int* ctas_per_sm) {
  static std::atomic<int> occupancy_of[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  int occ = occupancy_of[device].load(std::memory_order_relaxed);
  if (occ == 0) {
    const FwdKernelFn fn = attn_fwd_kernel<T, Cfg, kScoreMod>;
    err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, Cfg::kThreads, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
    if (occ <= 0) return cudaErrorInvalidConfiguration;
    occupancy_of[device].store(occ, std::memory_order_relaxed);
  }
  *ctas_per_sm = occ;
  return cudaSuccess;
}

// Resident clusters of `size` CTAs of the instance with `smem` bytes of dynamic shared memory each
// (cached per device and size: a caller passes the same smem for both; sm_90+ only, where the
// instance is also opted into that much shared memory).
template <typename T, class Cfg, bool kScoreMod> cudaError_t max_clusters(int size, int smem, int* count) {
  static std::atomic<int> count_of[kMaxDevices][kClusterMergeMaxSplits + 1] = {};  // count + 1; 0: unknown
  *count = 0;
  if (size < 1 || size > kClusterMergeMaxSplits) return cudaSuccess;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  int cached = count_of[device][size].load(std::memory_order_relaxed);
  if (cached == 0) {
    int occ = 0;
    err = prepare_kernel<T, Cfg, kScoreMod>(&occ);  // the shared-memory opt-in
    if (err != cudaSuccess) return err;
    const FwdKernelFn fn = attn_fwd_kernel<T, Cfg, kScoreMod>;
    if (smem > Cfg::kSmemBytes) err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(size));
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(size);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    int n = 0;
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveClusters(&n, fn, &config);
    if (err != cudaSuccess) {  // a device or size without such clusters: none, not a failure
      (void)cudaGetLastError();
      n = 0;
    }
    cached = n + 1;
    count_of[device][size].store(cached, std::memory_order_relaxed);
  }
  *count = cached - 1;
  return cudaSuccess;
}

template <typename T, class Cfg, bool kScoreMod> KernelInfo kernel_info() {
  return KernelInfo{attn_fwd_kernel<T, Cfg, kScoreMod>, Cfg::kThreads, Cfg::kSmemBytes,
                    Cfg::kBlockM, Cfg::kBlockN, prepare_kernel<T, Cfg, kScoreMod>,
                    max_clusters<T, Cfg, kScoreMod>};
}

// Head dim 128 takes the 64-key tile where two of its CTAs fit in an SM's shared memory, head dim
// 192 its 128-row tile where one CTA fits.
bool prefill128_wide(const DeviceInfo& dev) { return 2 * Prefill128Wide::kSmemBytes <= dev.smem_optin; }
bool prefill192_wide(const DeviceInfo& dev) { return Prefill192Wide::kSmemBytes <= dev.smem_optin; }

template <typename T, bool kScoreMod> bool prefill_kernel(int64_t head_dim, const DeviceInfo& dev, KernelInfo* k) {
  switch (head_dim) {
    case 32: *k = kernel_info<T, Prefill32, kScoreMod>(); return true;
    case 64: *k = kernel_info<T, Prefill64, kScoreMod>(); return true;
    case 96: *k = kernel_info<T, Prefill96, kScoreMod>(); return true;
    case 128:
      *k = prefill128_wide(dev) ? kernel_info<T, Prefill128Wide, kScoreMod>() : kernel_info<T, Prefill128, kScoreMod>();
      return true;
    case 192:
      *k = prefill192_wide(dev) ? kernel_info<T, Prefill192Wide, kScoreMod>()
                                : kernel_info<T, Prefill192, kScoreMod>();
      return true;
    case 256: *k = kernel_info<T, Prefill256, kScoreMod>(); return true;
    default: return false;
  }
}

// Decode tiles have a fast build too although at 16 rows the per-score work is hidden by the K/V
// stream: a decode call at batch 1 is bound by the latency of its instruction stream (one warp per
// SM sub-partition), and the modifier build's longer one cost 0.15-0.2 us of an 8-10 us call
// (H100, batch 1, 1K-4K keys).
template <typename T, bool kScoreMod> bool decode_kernel(int64_t head_dim, KernelInfo* k) {
  switch (head_dim) {
    case 32: *k = kernel_info<T, Decode32, kScoreMod>(); return true;
    case 64: *k = kernel_info<T, Decode64, kScoreMod>(); return true;
    case 96: *k = kernel_info<T, Decode96, kScoreMod>(); return true;
    case 128: *k = kernel_info<T, Decode128, kScoreMod>(); return true;
    case 192: *k = kernel_info<T, Decode192, kScoreMod>(); return true;
    case 256: *k = kernel_info<T, Decode256, kScoreMod>(); return true;
    default: return false;
  }
}

// The kernel of one dtype and score-modifier build, with decode or prefill tiles.
template <typename T, bool kScoreMod>
bool pick_kernel(bool decode, int64_t head_dim, const DeviceInfo& dev, KernelInfo* k) {
  return decode ? decode_kernel<T, kScoreMod>(head_dim, k)
                : prefill_kernel<T, kScoreMod>(head_dim, dev, k);
}

struct Plan {
  KernelInfo kernel;
  int qpack;        // q heads per kv head packed into the rows (1: none)
  int heads_grid;   // grid y: heads_q / qpack
  int m_blocks;     // query tiles per (sequence, head)
  int num_splits;
  int cluster;      // CTAs per cluster: num_splits when the splits merge in a cluster, else 1
  int smem;         // dynamic shared memory per CTA of the launch (kernel.smem or more)
  bool decode;      // decode tiles (kWarpsN > 1): always in grid order
};

bool aligned_to(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Internal consistency of the params (attention_params.h; attention_cuda.h lists what the
// caller checks). True when there is work to do or nothing at all (*empty).
bool params_ok(const AttnFwdParams& p, bool* empty) {
  constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
  *empty = false;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return false;
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.heads_q < 0 || p.heads_kv < 0) return false;
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) {
    *empty = true;
    return true;
  }
  switch (p.head_dim) {
    case 32: case 64: case 96: case 128: case 192: case 256: break;
    default: return false;
  }
  if (p.heads_kv < 1 || p.heads_q % p.heads_kv != 0) return false;
  if (p.heads_q > LaunchConfig::kMaxGridYZ || p.batch > kMax32 || p.seqlen_q > kMax32 ||
      p.seqlen_k > kMax32) {
    return false;
  }
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.out == nullptr) return false;
  // 16-byte chunks of q/k/v/out: aligned bases, strides in whole chunks.
  for (const void* ptr : {p.q, p.k, p.v, static_cast<const void*>(p.out)}) {
    if (!aligned_to(ptr, 16)) return false;
  }
  // (A stride along a dimension of extent 1 is never used. Extents not known here count as 2,
  // i.e. the stride is always checked: the rows of packed varlen q/k (total rows, not the
  // per-sequence maximum) and the K/V batches addressed through kv_batch_idx.)
  const bool paged_kv = p.block_table != nullptr;
  const bool varlen_q = p.cu_seqlens_q != nullptr;
  const int64_t q_batches = varlen_q ? 1 : p.batch;
  const int64_t q_rows = varlen_q ? 2 : p.seqlen_q;
  const int64_t kv_rows = paged_kv ? p.page_block_size : p.cu_seqlens_k != nullptr ? 2 : p.seqlen_k;
  const int64_t kv_batches = paged_kv ? (p.num_blocks > 0 ? p.num_blocks : 2)
                             : p.cu_seqlens_k != nullptr ? 1
                             : p.kv_batch_idx != nullptr ? 2
                                                          : p.batch;
  const struct {
    int64_t stride, extent;
  } strides[] = {{p.q_batch_stride, q_batches},    {p.q_row_stride, q_rows},
                 {p.q_head_stride, p.heads_q},      {p.out_batch_stride, q_batches},
                 {p.out_row_stride, q_rows},        {p.out_head_stride, p.heads_q},
                 {p.k_batch_stride, kv_batches},    {p.k_row_stride, kv_rows},
                 {p.k_head_stride, p.heads_kv},     {p.v_batch_stride, kv_batches},
                 {p.v_row_stride, kv_rows},         {p.v_head_stride, p.heads_kv}};
  for (const auto& st : strides) {
    if (st.extent > 1 && st.stride % 8 != 0) return false;
  }
  if (p.lse != nullptr && !aligned_to(p.lse, 4)) return false;
  if (paged_kv) {
    if (p.page_block_size < 1 || p.page_block_size > kMax32 || p.leftpad_k != nullptr ||
        p.kv_batch_idx != nullptr) {
      return false;
    }
  }
  if (p.leftpad_k != nullptr && p.cu_seqlens_k != nullptr) return false;
  if (p.softcap < 0.0f || !(p.softmax_scale == p.softmax_scale)) return false;
  if (p.window_left < -1 || p.window_right < -1) return false;
  if (p.num_splits < 0) return false;
  return true;
}

// Kernel family, packing and tiles for the params (no split decision).
bool plan_tiles(const AttnFwdParams& p, const DeviceInfo& dev, Plan* plan) {
  const int64_t group = p.heads_q / p.heads_kv;
  const bool score_mod = p.softcap > 0.0f || p.alibi_slopes != nullptr;
  const bool bf16 = p.dtype == DType::kBFloat16;
  int64_t qpack = 1;
  bool decode = false;
  if (p.seqlen_q * group <= LaunchConfig::kDecodeMaxRows) {
    qpack = group;  // decode: the q heads of a kv head share its K/V tiles
    decode = true;
  }
  if (!decode && group > 1) {
    KernelInfo probe;
    if (!prefill_kernel<__half, false>(p.head_dim, dev, &probe)) return false;
    if (p.seqlen_q < probe.block_m) qpack = group;  // fill the query tile with the group's heads
  }
  using Pick = bool (*)(bool, int64_t, const DeviceInfo&, KernelInfo*);
  const Pick pick = bf16 ? (score_mod ? pick_kernel<__nv_bfloat16, true>
                                     : pick_kernel<__nv_bfloat16, false>)
                         : (score_mod ? pick_kernel<__half, true> : pick_kernel<__half, false>);
  KernelInfo k;
  const bool ok = pick(decode, p.head_dim, dev, &k);
  if (!ok) return false;
  plan->kernel = k;
  plan->decode = decode;
  plan->qpack = static_cast<int>(qpack);
  plan->heads_grid = static_cast<int>(p.heads_q / qpack);
  const int64_t rows = p.seqlen_q * qpack;
  if (rows > std::numeric_limits<int32_t>::max() - 256) return false;
  plan->m_blocks = static_cast<int>(ceil_div(rows, k.block_m));
  plan->num_splits = 1;
  plan->cluster = 1;
  plan->smem = k.smem;
  return true;
}

// ATTENTION_CLUSTER_MERGE=0 turns the cluster merge off (read once per process; A/B runs, tests).
bool cluster_merge_allowed() {
  static const bool allowed = [] {
    const char* value = std::getenv("ATTENTION_CLUSTER_MERGE");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return allowed;
}

// Whether a plan for these params could merge its splits in a cluster at all (plan_cluster adds the
// split count, grid and residency conditions): a contiguous cache on sm_90+, merge not turned off.
bool cluster_merge_capable(const AttnFwdParams& p, const DeviceInfo& dev) {
  return p.block_table == nullptr && dev.cc_major >= 9 && cluster_merge_allowed();
}

// Splits for a plan: params.num_splits when given, else the wave-efficiency heuristic.
cudaError_t plan_splits(const AttnFwdParams& p, const DeviceInfo& dev, Plan* plan) {
  const int64_t n_blocks = ceil_div(p.seqlen_k, plan->kernel.block_n);
  const int64_t cap = min64(LaunchConfig::kMaxSplits, max64(1, n_blocks));
  if (p.num_splits >= 1) {
    plan->num_splits = static_cast<int>(min64(p.num_splits, cap));
    return cudaSuccess;
  }
  int occ = 0;
  cudaError_t err = plan->kernel.prepare(&occ);
  if (err != cudaSuccess) return err;
  const int64_t slots = static_cast<int64_t>(dev.sms) * occ;
  const int64_t ctas = p.batch * plan->heads_grid * plan->m_blocks;
  plan->num_splits = 1;
  if (ctas >= LaunchConfig::kNoSplitWaves * slots) return cudaSuccess;
  const int64_t max_splits = min64(cap, n_blocks / LaunchConfig::kMinTilesPerSplit);
  if (max_splits <= 1) return cudaSuccess;
  // Decode tiles, small grids: one CTA per SM. Each warp keeps both of its stages in flight
  // (load_kv_warp), so one CTA streams about 47 GB/s (H200, bf16, head_dim 128: 64 CTAs without
  // split read 3 TB/s), more than an SM's share of the DRAM bandwidth, and more CTAs only add
  // split overhead. Contiguous caches, fewer CTAs than SMs: at batch 1-16 x GQA 32/8 x 4K-32K keys
  // 3-7% faster than filling every resident slot (H200; H100 within 1-4% of the best count).
  // Paged caches only up to SMs / 8 CTAs (batch 1-2 there: 2-11% faster on H100 and H200); from
  // batch 4 one CTA per SM lost 3-4% on the H200, so larger paged grids fill every slot.
  // A split of such a grid may be a single key tile, once there are 4 tiles or more: with the SMs
  // otherwise idle, more CTAs beat longer streams (bf16, GQA 32/8, D128, H100 / H200: B1 x 256
  // keys, 4 splits instead of 2, 5.56 -> 5.17 / 5.29 -> 4.84 us; B1 x 1K, 16 instead of 8, 6.35 ->
  // 6.21 / 6.42 -> 6.19; B1 x 512 paged, 8 instead of 4, 6.08 -> 5.81 / 6.22 -> 5.84). Except where
  // that would take a contiguous cache past the cluster merge's bound on sm_90+: 4 splits merged in
  // clusters beat 8 through the combine kernel (B2 x 512: 5.97 vs 6.23 / 5.51 vs 6.25 us). Below 4
  // tiles no split stays best (B1 x 128: 4.35 us, 2 splits 5.02, H100).
  const int64_t one_per_sm_below = p.block_table == nullptr ? dev.sms : dev.sms / 8 + 1;
  if (plan->decode && ctas < one_per_sm_below) {
    const int64_t per_sm = dev.sms / ctas;
    const int64_t two_tile_splits = min64(max_splits, per_sm);
    const int64_t one_tile_splits = min64(cap, per_sm);
    const bool keep_cluster = cluster_merge_capable(p, dev) && two_tile_splits <= kClusterMergeMaxSplits &&
                              one_tile_splits > kClusterMergeMaxSplits;
    plan->num_splits = static_cast<int>(keep_cluster ? two_tile_splits : one_tile_splits);
    return cudaSuccess;
  }
  // Wave efficiency of s splits: CTAs / (waves rounded up x slots). The smallest s within
  // kSplitEfficiency of the best (fewer splits: less combine traffic, longer K/V streams).
  double best = 0.0;
  for (int64_t sp = 1; sp <= max_splits; ++sp) {
    const double waves = static_cast<double>(ctas * sp) / static_cast<double>(slots);
    const double eff = waves / std::ceil(waves);
    if (eff > best) best = eff;
  }
  for (int64_t sp = 1; sp <= max_splits; ++sp) {
    const double waves = static_cast<double>(ctas * sp) / static_cast<double>(slots);
    if (waves / std::ceil(waves) >= LaunchConfig::kSplitEfficiency * best) {
      plan->num_splits = static_cast<int>(sp);
      break;
    }
  }
  return cudaSuccess;
}

// Whether the splits of a plan merge in a cluster (merge_splits_in_cluster) instead of the combine
// kernel: decode tiles on sm_90+ reading a contiguous cache, 2 to kClusterMergeMaxSplits splits, a
// grid of at most one CTA per SM (as plan_splits sizes small decode grids), every cluster resident
// at once, and cluster_merge_allowed(). The launch asks for more than half of an SM's shared memory
// per CTA, so that each CTA has an SM of its own, as the combine path's grid has. Without that (3
// CTAs fit per SM, and a cluster must sit in one GPC; where the scheduler put them was not
// measured) batch-1 decode in clusters was 10-20% slower than with the combine kernel. bf16, GQA
// 32/8, D128, against the combine kernel: contiguous B8 (2 splits) x 1K-16K keys 3-17% faster on
// the H200 (1K: 11.45 -> 9.78 us) and 3-6% on the H100, B4 (4 splits) even to 5% faster; B2 (8
// splits) even on both; B1 x 1K (8 splits) 2% faster on the H200 but 7% slower on the H100 (6.51 ->
// 6.96 us), hence at most 4 splits (kClusterMergeMaxSplits). (8 clusters of 16 at one CTA per SM,
// B1 x 4K and up, were never resident on an H200.) Paged caches (B1-B2) were even or slower (H200,
// B2 x 4K, 16-row pages: 11.3 -> 11.9 us).
cudaError_t plan_cluster(const AttnFwdParams& p, const DeviceInfo& dev, Plan* plan) {
  plan->cluster = 1;
  const int64_t clusters = p.batch * plan->heads_grid * plan->m_blocks;
  if (!plan->decode || !cluster_merge_capable(p, dev) || plan->num_splits < 2 ||
      plan->num_splits > kClusterMergeMaxSplits || clusters * plan->num_splits > dev.sms) {
    return cudaSuccess;
  }
  const int smem = std::max(plan->kernel.smem, dev.smem_per_sm / 2 + 1024);
  if (smem > dev.smem_optin) return cudaSuccess;
  int resident = 0;
  const cudaError_t err = plan->kernel.max_clusters(plan->num_splits, smem, &resident);
  if (err != cudaSuccess) return err;
  if (clusters <= resident) {
    plan->cluster = plan->num_splits;
    plan->smem = smem;
  }
  return cudaSuccess;
}

// Tile order (tile_coords): heaviest tiles first over groups of (head, sequence) pairs when the
// query tiles of a pair differ in work (a causal mask or a window) and there is no split; a group
// holds as many pairs as keep their K/V within a fraction of L2 (the pairs of a group run
// together, and each reads its K/V once per query tile).
uint32_t plan_tile_group(const AttnFwdParams& p, const DeviceInfo& dev, const Plan& plan,
                         int64_t grid_x, int64_t grid_z) {
  const bool uneven = p.causal || p.window_left >= 0 || p.window_right >= 0;
  const int64_t pairs = static_cast<int64_t>(plan.heads_grid) * grid_z;
  if (!uneven || plan.decode || plan.num_splits > 1 || plan.m_blocks < 2 || pairs < 2) return 1;
  // K/V bytes of one grid pair: its kv head's keys and values, shared by the grid heads of the
  // kv head (GQA) when they are in the same group.
  const int64_t heads_per_kv = max64(1, plan.heads_grid / p.heads_kv);
  const int64_t kv_bytes = max64(1, 4 * p.seqlen_k * p.head_dim / heads_per_kv);
  const int64_t budget = static_cast<int64_t>(dev.l2_bytes) / LaunchConfig::kTileGroupL2Share;
  // The largest group within the budget that divides the pairs (no short last group).
  int64_t g = max64(1, min64(pairs, budget / kv_bytes));
  while (pairs % g != 0) --g;
  return static_cast<uint32_t>(g);
}

FwdArgs make_args(const AttnFwdParams& p, const Plan& plan) {
  FwdArgs a{};
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.out = p.out;
  a.q_batch_stride = p.q_batch_stride;
  a.q_row_stride = p.q_row_stride;
  a.q_head_stride = p.q_head_stride;
  a.k_batch_stride = p.k_batch_stride;
  a.k_row_stride = p.k_row_stride;
  a.k_head_stride = p.k_head_stride;
  a.v_batch_stride = p.v_batch_stride;
  a.v_row_stride = p.v_row_stride;
  a.v_head_stride = p.v_head_stride;
  a.out_batch_stride = p.out_batch_stride;
  a.out_row_stride = p.out_row_stride;
  a.out_head_stride = p.out_head_stride;
  a.lse = p.lse;
  a.lse_batch_stride = p.lse_batch_stride;
  a.lse_head_stride = p.lse_head_stride;
  a.cu_seqlens_q = p.cu_seqlens_q;
  a.cu_seqlens_k = p.cu_seqlens_k;
  a.seqused_k = p.seqused_k;
  a.kv_batch_idx = p.kv_batch_idx;
  a.leftpad_k = p.leftpad_k;
  a.block_table = p.block_table;
  a.block_table_batch_stride = p.block_table_batch_stride;
  a.page_block_size = p.block_table != nullptr ? static_cast<int>(p.page_block_size) : 1;
  a.page_div = FastDivU32::make(static_cast<uint32_t>(a.page_block_size));
  a.seqlen_q = static_cast<int>(p.seqlen_q);
  a.seqlen_k = static_cast<int>(p.seqlen_k);
  a.batch = static_cast<int>(p.batch);
  a.batch_base = 0;
  a.heads_q = static_cast<int>(p.heads_q);
  a.group = static_cast<int>(p.heads_q / p.heads_kv);
  a.qpack = plan.qpack;
  a.qpack_div = FastDivU32::make(static_cast<uint32_t>(plan.qpack));
  a.m_blocks = plan.m_blocks;
  a.num_splits = plan.num_splits;
  a.cluster_merge = plan.cluster > 1 ? 1 : 0;
  a.heads_grid_div = FastDivU32::make(static_cast<uint32_t>(plan.heads_grid));
  a.scale_log2 = p.softmax_scale * kLog2e;
  a.softcap_scale = p.softcap > 0.0f ? p.softmax_scale / p.softcap : 0.0f;
  a.softcap_log2 = p.softcap > 0.0f ? p.softcap * kLog2e : 0.0f;
  a.alibi = p.alibi_slopes;
  a.alibi_batch_stride = p.alibi_batch_stride;
  // causal is the window (left, 0); an absent side is unbounded.
  a.win_left = p.window_left >= 0 ? p.window_left : kUnbounded;
  a.win_right = p.causal ? 0 : (p.window_right >= 0 ? p.window_right : kUnbounded);
  a.out_accum = p.out_accum;
  a.lse_accum = p.lse_accum;
  return a;
}

// The forward kernel's launch: PDL by default, after any kernel (unlike the short elementwise
// kernels, a decode call after a cuBLAS GEMM was faster with it: H100, B1 x 4K keys 16.8 vs
// 17.1 us, B8 55.1 vs 55.4), and clusters of plan.cluster CTAs along grid x when the splits
// merge in a cluster. (pdl::launch takes no cluster attribute; this is the one launch that needs
// both.)
cudaError_t launch_fwd(const Plan& plan, dim3 grid, const FwdArgs& args, pdl::Request pdl_request,
                       cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(plan.kernel.threads);
  config.dynamicSmemBytes = static_cast<size_t>(plan.smem);
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (pdl::enabled(pdl_request, pdl::ByDefault::kPdl)) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (plan.cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = static_cast<unsigned>(plan.cluster);
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  config.attrs = attrs;
  config.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&config, plan.kernel.fn, args);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public entry points (attention_cuda.h).
// ---------------------------------------------------------------------------------------------
int64_t attn_fwd_accum_splits(const AttnFwdParams& p) {
  bool empty = false;
  if (!params_ok(p, &empty)) return -1;
  if (empty) return 0;
  DeviceInfo dev;
  if (device_info(&dev) != cudaSuccess) return -1;
  Plan plan;
  if (!plan_tiles(p, dev, &plan)) return -1;
  if (plan_splits(p, dev, &plan) != cudaSuccess) return -1;
  if (plan_cluster(p, dev, &plan) != cudaSuccess) return -1;
  return plan.num_splits > 1 && plan.cluster == 1 ? plan.num_splits : 0;
}

cudaError_t attn_fwd(const AttnFwdParams& p, cudaStream_t stream) {
  bool empty = false;
  if (!params_ok(p, &empty)) return cudaErrorInvalidValue;
  if (empty) return cudaSuccess;
  DeviceInfo dev;
  cudaError_t err = device_info(&dev);
  if (err != cudaSuccess) return err;
  Plan plan;
  if (!plan_tiles(p, dev, &plan)) return cudaErrorInvalidValue;
  err = plan_splits(p, dev, &plan);
  if (err != cudaSuccess) return err;
  err = plan_cluster(p, dev, &plan);
  if (err != cudaSuccess) return err;
  if (plan.num_splits > 1 && plan.cluster == 1) {
    if (p.out_accum == nullptr || p.lse_accum == nullptr || !aligned_to(p.out_accum, 16) ||
        !aligned_to(p.lse_accum, 4)) {
      return cudaErrorInvalidValue;
    }
  }
  int occ = 0;
  err = plan.kernel.prepare(&occ);  // opt-in shared memory (cached per device)
  if (err != cudaSuccess) return err;
  FwdArgs args = make_args(p, plan);
  const int64_t grid_x = static_cast<int64_t>(plan.m_blocks) * plan.num_splits;
  // Fewer than 2^31 CTAs per launch (tile_coords' index math); batch chunks within grid z.
  const int64_t pair_ctas = grid_x * plan.heads_grid;
  if (pair_ctas > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  const int64_t max_chunk =
      min64(LaunchConfig::kMaxGridYZ, std::numeric_limits<int32_t>::max() / pair_ctas);
  for (int64_t base = 0; base < p.batch; base += max_chunk) {
    const int64_t chunk = min64(p.batch - base, max_chunk);
    args.batch_base = static_cast<int>(base);
    // The tile group depends on the chunk's pair count.
    args.tile_group = plan_tile_group(p, dev, plan, grid_x, chunk);
    args.group_ctas_div = FastDivU32::make(static_cast<uint32_t>(grid_x) * args.tile_group);
    args.tile_group_div = FastDivU32::make(args.tile_group);
    const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(plan.heads_grid),
                    static_cast<unsigned>(chunk));
    err = launch_fwd(plan, grid, args, p.pdl_request, stream);
    if (err != cudaSuccess) return err;
  }
  if (plan.num_splits == 1 || plan.cluster > 1) return cudaSuccess;

  CombineArgs c{};
  c.out_accum = p.out_accum;
  c.lse_accum = p.lse_accum;
  c.out = p.out;
  c.out_batch_stride = p.out_batch_stride;
  c.out_row_stride = p.out_row_stride;
  c.out_head_stride = p.out_head_stride;
  c.lse = p.lse;
  c.lse_batch_stride = p.lse_batch_stride;
  c.lse_head_stride = p.lse_head_stride;
  c.cu_seqlens_q = p.cu_seqlens_q;
  c.batch = static_cast<int>(p.batch);
  c.heads_q = static_cast<int>(p.heads_q);
  c.seqlen_q = static_cast<int>(p.seqlen_q);
  c.head_dim = static_cast<int>(p.head_dim);
  c.num_splits = plan.num_splits;
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  if (rows > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows));  // one CTA per output row
  const dim3 block(32 * LaunchConfig::kCombineWarps);
  constexpr size_t kSmem = sizeof(CombineSmem);
  constexpr auto kPdl = pdl::ByDefault::kPdl;  // the combine follows the split kernel
  return p.dtype == DType::kBFloat16
             ? pdl::launch(p.pdl_request, kPdl, attn_fwd_combine_kernel<__nv_bfloat16>, grid,
                           block, kSmem, stream, c)
             : pdl::launch(p.pdl_request, kPdl, attn_fwd_combine_kernel<__half>, grid, block,
                           kSmem, stream, c);
}

}  // namespace cuda
}  // namespace attention
