// scaled_mm_sm90_configs.cuh: the tile configurations of the Hopper scaled GEMMs, one per M
// bucket (scaled_mm_sm90.cu picks them). Measured choices: benchmarks/NOTES.md.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "scaled_mm_params.h"

namespace quant {
namespace cuda {
namespace sm90 {

// The shared parts: a persistent data-parallel grid, no scheduler tuning.
struct PingpongConfig {
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  template <class SchedulerArgs>
  static void tune(SchedulerArgs&, const ScaledMmParams&) {}
};

// Decode, M <= 16: swapped, so the weight fills the 64-row wgmma and the tokens a 16-wide tile.
struct ConfigM16 : PingpongConfig {
  using TileShape = cute::Shape<cute::_64, cute::_16, cute::_256>;
  static constexpr bool kSwapAB = true;
};

// 16 < M <= 64: swapped, the tokens in a 64-wide tile.
struct ConfigM64 : PingpongConfig {
  using TileShape = cute::Shape<cute::_64, cute::_64, cute::_256>;
  static constexpr bool kSwapAB = true;
};

// 64 < M <= 128.
struct ConfigM128 : PingpongConfig {
  using TileShape = cute::Shape<cute::_64, cute::_128, cute::_128>;
  static constexpr bool kSwapAB = false;
};

// 128 < M < 2048: two consumer warpgroups alternate on 128 x 128 tiles, pairs of CTAs along M
// share the weight tile through TMA multicast.
struct ConfigM2K : PingpongConfig {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  static constexpr bool kSwapAB = false;
};

// M >= 2048: both consumer warpgroups share one 128 x 256 tile.
struct ConfigLarge {
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_128>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  static constexpr bool kSwapAB = false;
  template <class SchedulerArgs>
  static void tune(SchedulerArgs&, const ScaledMmParams&) {}
};

// Blockwise fp8: the blockwise-scaling mainloop needs the cooperative schedule; its 128-wide N
// tile matches the weight's scale blocks.
struct ConfigBlock {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};

}  // namespace sm90
}  // namespace cuda
}  // namespace quant
