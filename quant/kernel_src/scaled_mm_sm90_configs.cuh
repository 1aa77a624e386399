// scaled_mm_sm90_configs.cuh: the tile configurations of the Hopper scaled GEMMs, one per M
// bucket (scaled_mm_sm90.cu picks them), each a template on the operand type: tiles span 128
// bytes of K (one 128-byte swizzle row), so 16-bit operands get half the elements of fp8 / int8
// ones. fp8 also needs it: CUTLASS promotes its partial sums every 4 wgmma k-steps of 32, so a K
// tile of 256 fp8 elements (8 k-steps) is rejected by can_implement. Measured choices:
// benchmarks/NOTES.md.
//
// fp8 accumulates exactly (CUTLASS promotes the tensor cores' partial sums into float32 every
// four k-steps), which keeps a second accumulator per thread: a warpgroup's share of a tile stays
// at 64 x 128 so the two fit in registers without spilling (ptxas reports spills at 128 x 128).
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/numeric_size.h"
#include "scaled_mm_params.h"

namespace quant {
namespace cuda {
namespace sm90 {

// `kBytes` of K in elements of AB.
template <class AB, int kBytes>
using KTile = cute::Int<kBytes * 8 / cutlass::sizeof_bits<AB>::value>;

// Two consumer warpgroups, each on its own tile, overlapping one's epilogue with the other's
// mainloop; a persistent grid; no scheduler tuning.
struct PingpongConfig {
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  template <class SchedulerArgs>
  static void tune(SchedulerArgs&, const ScaledMmParams&) {}
};

// Two consumer warpgroups sharing one tile (64 rows each); pairs of CTAs along M share the weight
// tile through TMA multicast.
struct CooperativeConfig {
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  template <class SchedulerArgs>
  static void tune(SchedulerArgs&, const ScaledMmParams&) {}
};

// Decode, M <= 16: swapped, so the weight fills the 64-row wgmma and the tokens a 16-wide tile.
// (A cooperative 128 x 16 tile on the stream-K scheduler, which also splits K, took 17.4 us at
// M = 1 for 6144 x 4096 on an H100, slower than this tile's 64-wide sibling at M = 64.)
template <class AB>
struct ConfigM16 : PingpongConfig {
  using TileShape = cute::Shape<cute::_64, cute::_16, KTile<AB, 128>>;
  static constexpr bool kSwapAB = true;
};

// 16 < M <= 64: swapped, the tokens in a 64-wide tile.
template <class AB>
struct ConfigM64 : PingpongConfig {
  using TileShape = cute::Shape<cute::_64, cute::_64, KTile<AB, 128>>;
  static constexpr bool kSwapAB = true;
};

// 64 < M <= 128.
template <class AB>
struct ConfigM128 : PingpongConfig {
  using TileShape = cute::Shape<cute::_64, cute::_128, KTile<AB, 128>>;
  static constexpr bool kSwapAB = false;
};

// 128 < M < 2048.
template <class AB>
struct ConfigM2K : CooperativeConfig {
  using TileShape = cute::Shape<cute::_128, cute::_128, KTile<AB, 128>>;
  static constexpr bool kSwapAB = false;
};

// M >= 2048: 128 x 256 tiles where the accumulators fit (not fp8: see the top).
template <class AB>
struct ConfigLarge : CooperativeConfig {
  using TileShape = cute::Shape<cute::_128, cute::_256, KTile<AB, 128>>;
  static constexpr bool kSwapAB = false;
};

// Blockwise fp8: the blockwise-scaling mainloop needs the cooperative schedule; its 128-wide N
// tile matches the weight's scale blocks.
template <class AB>
struct ConfigBlock {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};

// Gated MLP form (scaled_mm_sm90_gated.cuh): never swapped, tiles one gate block and its up
// block wide (2 * kGateBlock = 128 columns of the packed weight).
struct GatedConfig {};
template <class AB>
struct ConfigGatedM64 : PingpongConfig, GatedConfig {
  using TileShape = cute::Shape<cute::_64, cute::_128, KTile<AB, 128>>;
  static constexpr bool kSwapAB = false;
};
template <class AB>
struct ConfigGated : CooperativeConfig, GatedConfig {
  using TileShape = cute::Shape<cute::_128, cute::_128, KTile<AB, 128>>;
  static constexpr bool kSwapAB = false;
};

}  // namespace sm90
}  // namespace cuda
}  // namespace quant
