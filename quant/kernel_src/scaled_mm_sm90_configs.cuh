// scaled_mm_sm90_configs.cuh: the tile configurations of the Hopper scaled GEMMs, picked by
// scaled_mm_sm90.cu per M bucket and, where a bucket's tiles would leave SMs idle, by the SM
// count; each a template on the operand type: K tiles are given in bytes, so 16-bit operands get
// half the elements of fp8 / int8 ones. Measured choices: benchmarks/NOTES.md.
//
// fp8 accumulates as vLLM's Hopper kernels and cuBLAS's fast-accumulation mode do (the
// FP8FastAccum schedules): the tensor cores' own accumulator runs over all of K. CUTLASS's
// default fp8 mainloop instead promotes partial sums into float32 every 4 k-steps, which needs
// a second accumulator per thread and ran at 0.77-0.98x cuBLAS's exact mode at M >= 128 (H200).
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

template <class AB>
constexpr bool kFp8 = cute::is_same_v<AB, cutlass::float_e4m3_t>;

using Cluster1x1 = cute::Shape<cute::_1, cute::_1, cute::_1>;
// Pairs of CTAs along M share the weight tile through TMA multicast.
using Cluster2x1 = cute::Shape<cute::_2, cute::_1, cute::_1>;

// Two consumer warpgroups, each on its own tile, overlapping one's epilogue with the other's
// mainloop; a persistent grid.
template <class AB, class Cluster = Cluster1x1>
struct PingpongConfig {
  using ClusterShape = Cluster;
  using KernelSchedule =
      cute::conditional_t<kFp8<AB>, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum,
                          cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  template <class SchedulerArgs>
  static void tune(SchedulerArgs&, const ScaledMmParams&) {}
};

// Two consumer warpgroups sharing one tile (64 rows each), CTA pairs along M.
template <class AB>
struct CooperativeConfig {
  using ClusterShape = Cluster2x1;
  using KernelSchedule =
      cute::conditional_t<kFp8<AB>, cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                          cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  template <class SchedulerArgs>
  static void tune(SchedulerArgs&, const ScaledMmParams&) {}
};

// Decode, M <= 16: swapped, so the weight fills the 64-row wgmma and the tokens a 16-wide tile.
// 512-byte K tiles: with one tile per CTA the per-stage pipeline overhead sets the pace (7.9 ->
// 7.4 us from 128 to 512 bytes at 1 x 4096 x 4096 fp8). Stream-K on a cooperative 128 x 16 tile
// (which splits K over idle SMs) took 13.4 us.
template <class AB>
struct ConfigM16 : PingpongConfig<AB> {
  using TileShape = cute::Shape<cute::_64, cute::_16, KTile<AB, 512>>;
  static constexpr bool kSwapAB = true;
};

// 16 < M <= 64: swapped, the tokens in a 64-wide tile.
template <class AB>
struct ConfigM64 : PingpongConfig<AB> {
  using TileShape = cute::Shape<cute::_64, cute::_64, KTile<AB, 256>>;
  static constexpr bool kSwapAB = true;
};

// 64 < M <= 128.
template <class AB>
struct ConfigM128 : PingpongConfig<AB, cute::conditional_t<kFp8<AB>, Cluster2x1, Cluster1x1>> {
  using TileShape = cute::Shape<cute::_64, cute::_128, KTile<AB, 128>>;
  static constexpr bool kSwapAB = false;
};

// fp8, 64 < M <= 128, where ConfigM128 would leave half the SMs without a tile (N = 4096 at
// M = 128: 64 tiles for 132 SMs): half-width tiles (8.4 instead of 10.2 us at 128 x 4096 x 4096,
// 21.4 instead of 25.5 at 128 x 4096 x 14336; 10.8 against 12.4 the other way at N = 6144).
template <class AB>
struct ConfigM128Narrow : PingpongConfig<AB, Cluster2x1> {
  using TileShape = cute::Shape<cute::_64, cute::_64, KTile<AB, 128>>;
  static constexpr bool kSwapAB = false;
};

// M > 128 (int8: below 2048). fp8 runs pingpong 128 x 128 tiles: as fast as cooperative
// 256 x 128 or 128 x 256 ones without an activation, unslowed by one, and 3-8% faster than
// cooperative 128 x 128 at M = 512.
template <class AB>
struct ConfigM2K : cute::conditional_t<kFp8<AB>, PingpongConfig<AB>, CooperativeConfig<AB>> {
  using TileShape = cute::Shape<cute::_128, cute::_128, KTile<AB, 128>>;
  static constexpr bool kSwapAB = false;
  // fp8 at M >= 4096: tiles scheduled in groups of 4, so that SMs working at the same time share
  // weight and activation panels in L2 (8192^3: 891 instead of 1046 us; 8192 x 28672 x 4096: 1560
  // instead of 1781; neutral at M = 2048).
  template <class SchedulerArgs>
  static void tune(SchedulerArgs& args, const ScaledMmParams& p) {
    if (kFp8<AB> && p.m >= 4096) args.max_swizzle_size = 4;
  }
};

// fp8, M > 128, where 128 x 128 tiles would leave much of the last wave empty and 128 x 192 ones
// fill it (512 x 6144 x 4096: 192 tiles for 132 SMs, 26.8 us; 128 of these, 22.9). Cooperative:
// a pingpong warpgroup would hold 192 accumulators per thread.
template <class AB>
struct ConfigM2KWide : CooperativeConfig<AB> {
  using ClusterShape = Cluster1x1;
  using TileShape = cute::Shape<cute::_128, cute::_192, KTile<AB, 128>>;
  static constexpr bool kSwapAB = false;
};

// int8, M >= 2048: 128 x 256 tiles.
template <class AB>
struct ConfigLarge : CooperativeConfig<AB> {
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
// block wide (2 * kGateBlock = 128 columns of the packed weight). fp8 follows the plain form's
// tiles (64 x 128 up to M = 128, then 128 x 128 pingpong): one cooperative 128-row tile left half
// the SMs idle at M = 128 (80 us for 128 x 28672 x 4096 against 51 us unfused).
struct GatedConfig {};
template <class AB>
struct ConfigGatedM128 : PingpongConfig<AB, cute::conditional_t<kFp8<AB>, Cluster2x1, Cluster1x1>>,
                         GatedConfig {
  using TileShape = cute::Shape<cute::_64, cute::_128, KTile<AB, 128>>;
  static constexpr bool kSwapAB = false;
};
template <class AB>
struct ConfigGated : cute::conditional_t<kFp8<AB>, PingpongConfig<AB>, CooperativeConfig<AB>>,
                     GatedConfig {
  using TileShape = cute::Shape<cute::_128, cute::_128, KTile<AB, 128>>;
  static constexpr bool kSwapAB = false;
};

}  // namespace sm90
}  // namespace cuda
}  // namespace quant
