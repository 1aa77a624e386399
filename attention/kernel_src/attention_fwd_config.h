// attention_fwd_config.h: tile shapes (TileConfig and its instances) and launch constants
// (LaunchConfig) of the CUDA attention forward, shared by the kernels and the host launcher.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

namespace attention {
namespace cuda {

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
  static constexpr bool kQInRegs = kQInRegs_;  // Q fragments loaded once (else per K tile)
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
  static constexpr int kORegs = kMTiles * kDTiles * 4;  // O accumulator floats per thread
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
// instances, picked at run time; every other instance fits the 99 KB opt-in of sm_86/89/120):
// head dim 128 64-key tiles (FlashAttention-2's shape) where two 96 KB CTAs fit per SM (sm_90,
// sm_100), else 32-key tiles in 3 stages (80 KB); head dim 192 128 x 64 over 8 warps (144 KB, one
// CTA per SM) where that fits (sm_80, sm_90, sm_100), else 64 x 32 over 4 warps (72 KB). Head dim
// 256: 64-key tiles in one stage (kSplitKV), 96 KB. Each shape was the fastest measured against
// its alternatives, spills included: benchmarks/NOTES.md, "Tile shapes", rerun with
// python attention/benchmarks/sweep.py.
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
// in flight while it waits. The register cap of 3 CTAs per SM (168) matches. Head dim 192/256:
// 32-key tiles over 2 warps (54 / 72 KB). Deeper and wider decode tiles were slower
// (benchmarks/NOTES.md, "Rejected: deeper or wider decode tiles").
using Decode32 = TileConfig<32, 16, 64, 1, 4, 2, true, 4>;
using Decode64 = TileConfig<64, 16, 64, 1, 4, 2, true, 4>;
using Decode96 = TileConfig<96, 16, 64, 1, 4, 2, true, 3>;
using Decode128 = TileConfig<128, 16, 64, 1, 4, 2, true, 3>;
using Decode192 = TileConfig<192, 16, 32, 1, 2, 2, false, 4>;
using Decode256 = TileConfig<256, 16, 32, 1, 2, 2, false, 3>;
// The instances every capability can take fit the 99 KB opt-in of sm_86/89/120.
template <class... Cfg>
constexpr bool fit_99kb() {
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
  static constexpr int kCombineWarps = 4;   // per output row (one CTA)
  static constexpr int kCombineUnroll = 4;  // split rows loaded at once per warp
  static constexpr int64_t kMaxGridYZ = 65535;
  // Tile order: the (head, sequence) pairs of a heaviest-first group keep their K/V within
  // this fraction of L2 (1 / kTileGroupL2Share).
  static constexpr int kTileGroupL2Share = 2;
};

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
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

// The (head, sequence) pairs of one tile group in both forward kernels' heaviest-first tile
// orders (plan_tile_group in attention_cuda.cu, tile_group in attention_sm90.cu): the largest
// divisor of `pairs` (no short last group) whose K/V fit in 1 / kTileGroupL2Share of `l2_bytes`,
// a pair's K/V being its kv head's keys and values (fp16 / bf16) shared by the `heads_per_kv`
// query heads of the group that read them. At least 1.
inline int64_t tile_group_pairs(int64_t pairs, int64_t heads_per_kv, int64_t seqlen_k,
                                int64_t head_dim, int64_t l2_bytes) {
  const int64_t kv_bytes = max64(1, 4 * seqlen_k * head_dim / max64(1, heads_per_kv));
  const int64_t budget = l2_bytes / LaunchConfig::kTileGroupL2Share;
  int64_t g = max64(1, min64(pairs, budget / kv_bytes));
  while (pairs % g != 0) --g;
  return g;
}

// The most splits that merge in a cluster: where clusters were measured to pay (plan_cluster),
// and the merge's unroll bound, so that the decode instances hold no registers for more (an
// unroll over 16 took D32 decode from 89 to 128 registers, sm_90a). A portable cluster size.
constexpr int kClusterMergeMaxSplits = 4;

}  // namespace cuda
}  // namespace attention
