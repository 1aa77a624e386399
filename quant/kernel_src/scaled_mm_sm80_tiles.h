// scaled_mm_sm80_tiles.h: the tile configurations of the mma.sync scaled GEMMs, one per M bucket.
//
// Both operands are one byte wide (K tile in elements equals bytes). The shapes are starting
// points chosen from the usual Ampere int8 / Ada fp8 sizes, NOT yet measured: decode rows get a
// short, wide tile and a deep pipeline (the GEMM streams B once, so the win is keeping more of B
// in flight), larger M square 128-row tiles. To be timed on an H100 through
// GemmPath::kTensorCoreSm80 and retuned.
//
// int8   bucket     threadblock (M x N x K)  warp           warps  stages  shared memory
//        M <= 16    16 x 128 x 128           16 x 32 x 128    4      4       72 KiB
//        M <= 64    64 x 128 x 128           32 x 64 x 128    4      3       72 KiB
//        M <= 128   128 x 128 x 64           64 x 64 x 64     4      4       64 KiB
//        M > 128    128 x 256 x 64           64 x 64 x 64     8      3       72 KiB
//
// fp8    bucket     threadblock (M x N x K)  warp           warps  stages  shared memory
//        M <= 16    16 x 128 x 128           16 x 32 x 128    4      4       72 KiB
//        M <= 64    64 x 128 x 64            32 x 64 x 64     4      4       48 KiB
//        M <= 128   128 x 128 x 64           64 x 32 x 64     8      4       64 KiB
//        M > 128    128 x 128 x 64           64 x 32 x 64     8      4       64 KiB, swizzled
//
// fp8 uses smaller warp tiles than int8: with the int8 warp shapes the sm_89 fp8 mainloop needs
// more than 255 registers and spilled (ptxas: 640 bytes for 64 x 64 x 64 warps). With these
// shapes sm_89 has no spills (92-220 registers); sm_90a ptxas still spills 40-52 bytes in the
// three larger fp8 tiles (it is a forced fallback there; shrink the warps if timing shows it).
#pragma once

#include <cutlass/gemm/gemm.h>

#include <cstdint>

#include "scaled_mm_params.h"

namespace quant {
namespace cuda {
namespace sm80 {

constexpr int kMaxDevices = 64;

template <int TbM, int TbN, int TbK, int WarpM, int WarpN, int WarpK, int Stages, int Swizzle>
struct TileConfig {
  using Threadblock = cutlass::gemm::GemmShape<TbM, TbN, TbK>;
  using Warp = cutlass::gemm::GemmShape<WarpM, WarpN, WarpK>;
  static constexpr int kStages = Stages;
  // Threadblock rasterization: consecutive blocks walk this many tiles down M before moving
  // along N, so a wave reuses B tiles from L2 (1 when M fits in a tile anyway).
  static constexpr int kSwizzle = Swizzle;
};

// The tile of each M bucket, per operand (table above).
template <GemmOperand kOperand>
struct Tiles;

template <>
struct Tiles<GemmOperand::kInt8> {
  using Decode = TileConfig<16, 128, 128, 16, 32, 128, 4, 1>;
  using M64 = TileConfig<64, 128, 128, 32, 64, 128, 3, 1>;
  using M128 = TileConfig<128, 128, 64, 64, 64, 64, 4, 1>;
  using Large = TileConfig<128, 256, 64, 64, 64, 64, 3, 4>;
};

template <>
struct Tiles<GemmOperand::kFp8E4m3> {
  using Decode = TileConfig<16, 128, 128, 16, 32, 128, 4, 1>;
  using M64 = TileConfig<64, 128, 64, 32, 64, 64, 4, 1>;
  using M128 = TileConfig<128, 128, 64, 64, 32, 64, 4, 1>;
  using Large = TileConfig<128, 128, 64, 64, 32, 64, 4, 4>;
};

// Runs `Kernel<Tile>::run(args...)` with the operand's tile for m rows.
template <GemmOperand kOperand, template <class> class Kernel, typename... Args>
auto run_for_rows(int64_t m, Args&&... args) {
  using T = Tiles<kOperand>;
  if (m <= 16) return Kernel<typename T::Decode>::run(args...);
  if (m <= 64) return Kernel<typename T::M64>::run(args...);
  if (m <= 128) return Kernel<typename T::M128>::run(args...);
  return Kernel<typename T::Large>::run(args...);
}

}  // namespace sm80
}  // namespace cuda
}  // namespace quant
