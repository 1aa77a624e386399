// scaled_mm_sm80_gemm.cuh: one mma.sync scaled GEMM kernel (CUTLASS 2.x GemmUniversal with the
// visitor epilogue of scaled_mm_sm80_epilogue.cuh) and its host launcher, per operand, output
// dtype and tile. Included by the per-operand translation units only.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/default_gemm_universal_with_visitor.h>
#include <cutlass/gemm/threadblock/threadblock_swizzle.h>

#include <atomic>
#include <climits>
#include <cstdint>

#include "scaled_mm_params.h"
#include "scaled_mm_sm80_epilogue.cuh"
#include "scaled_mm_sm80_operands.h"
#include "scaled_mm_sm80_tiles.h"

namespace quant {
namespace cuda {
namespace sm80 {

// Operand element, accumulator, instruction and lowest architecture of each operand: int8 uses
// the sm_80 integer mma (exact int32 accumulation, saturating as vLLM's kernels do: unreachable
// for K < 2^17), fp8 e4m3 the sm_89 one with a float32 accumulator.
template <GemmOperand kOperand>
struct OperandTraits;

template <>
struct OperandTraits<GemmOperand::kInt8> {
  using Element = int8_t;
  using Accumulator = int32_t;
  using Arch = cutlass::arch::Sm80;
  using MathOp = cutlass::arch::OpMultiplyAddSaturate;
  static constexpr int kMinCudaArch = 800;
};

template <>
struct OperandTraits<GemmOperand::kFp8E4m3> {
  using Element = cutlass::float_e4m3_t;
  using Accumulator = float;
  using Arch = cutlass::arch::Sm89;
  using MathOp = cutlass::arch::OpMultiplyAdd;
  static constexpr int kMinCudaArch = 890;
};

#if defined(__CUDA_ARCH__)
constexpr int kCompiledCudaArch = __CUDA_ARCH__;
#else
constexpr int kCompiledCudaArch = 0;
#endif

// The kernel entry point. Its body is compiled only for architectures that have the operand's
// instructions; every other architecture of the fat binary gets a trap (the host never launches
// it there: supported() says no).
template <typename GemmKernel, int kMinCudaArch>
__global__ void __launch_bounds__(GemmKernel::kThreadCount)
    scaled_mm_sm80_kernel(typename GemmKernel::Params params) {
  if constexpr (kCompiledCudaArch >= kMinCudaArch) {
    extern __shared__ int4 shared_memory[];
    auto& storage = *reinterpret_cast<typename GemmKernel::SharedStorage*>(shared_memory);
    GemmKernel::invoke(params, storage);
  } else {
    __trap();
  }
}

template <GemmOperand kOperand, typename ElementOutput, typename Tile>
struct ScaledMmSm80 {
  using Traits = OperandTraits<kOperand>;
  using Element = typename Traits::Element;
  // 16-byte global accesses for A, B and D: n and k multiples of 16 give aligned rows.
  static constexpr int kAlignmentAB = 16;
  static constexpr int kAlignmentD = 16 / sizeof(ElementOutput);
  static constexpr int kEpilogueStages = 1;

  using OutputTileThreadMap = cutlass::epilogue::threadblock::OutputTileThreadLayout<
      typename Tile::Threadblock, typename Tile::Warp, ElementOutput, kAlignmentD, kEpilogueStages>;
  using Epilogue = ScaledEpilogue<kOperand, ElementOutput, OutputTileThreadMap>;

  using GemmKernel = typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
      Element, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, kAlignmentAB, Element,
      cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, kAlignmentAB, ElementOutput,
      cutlass::layout::RowMajor, kAlignmentD, typename Traits::Accumulator, float,
      cutlass::arch::OpClassTensorOp, typename Traits::Arch, typename Tile::Threadblock,
      typename Tile::Warp, cutlass::gemm::GemmShape<16, 8, 32>, typename Epilogue::Callbacks,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<Tile::kSwizzle>, Tile::kStages,
      typename Traits::MathOp, kEpilogueStages>::GemmKernel;

  static constexpr int kSharedBytes = int(sizeof(typename GemmKernel::SharedStorage));

  static typename GemmKernel::Arguments arguments(const ScaledMmParams& p) {
    const cutlass::gemm::GemmCoord problem(int(p.m), int(p.n), int(p.k));
    // C is not read (the tree has no source tensor) and D is written by the tree's store node.
    return typename GemmKernel::Arguments(cutlass::gemm::GemmUniversalMode::kGemm, problem,
                                          /*batch_count=*/1, Epilogue::arguments(p), p.a, p.b,
                                          /*ptr_C=*/nullptr, /*ptr_D=*/nullptr, 0, 0, 0, 0, p.lda,
                                          p.ldb, /*ldc=*/0, /*ldd=*/0);
  }

  // Raises the kernel's dynamic shared memory limit once per device (above 48 KiB it must be
  // opted into; the attribute is per device context, not per stream, so graphs are unaffected).
  static cudaError_t allow_shared_memory(int device) {
    static std::atomic<bool> done[kMaxDevices];
    if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
    if (done[device].load(std::memory_order_acquire)) return cudaSuccess;
    const cudaError_t err =
        cudaFuncSetAttribute(scaled_mm_sm80_kernel<GemmKernel, Traits::kMinCudaArch>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
    if (err == cudaSuccess) done[device].store(true, std::memory_order_release);
    return err;
  }

  static cudaError_t run(const ScaledMmParams& p, int device, cudaStream_t stream) {
    const typename GemmKernel::Arguments args = arguments(p);
    if (GemmKernel::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    const cudaError_t err = allow_shared_memory(device);
    if (err != cudaSuccess) return err;
    // The occupancy and SM count only matter to stream-K swizzles; this one is data parallel.
    const typename GemmKernel::Params params(args, /*device_sms=*/0, /*sm_occupancy=*/0);
    const dim3 grid =
        typename GemmKernel::ThreadblockSwizzle().get_grid_shape(params.grid_tiled_shape);
    scaled_mm_sm80_kernel<GemmKernel, Traits::kMinCudaArch>
        <<<grid, GemmKernel::kThreadCount, kSharedBytes, stream>>>(params);
    return cudaGetLastError();
  }
};

// ScaledMmSm80 with the operand and output dtype bound, for run_for_rows.
template <GemmOperand kOperand, typename ElementOutput>
struct KernelFor {
  template <typename Tile>
  using Kernel = ScaledMmSm80<kOperand, ElementOutput, Tile>;
};

}  // namespace sm80
}  // namespace cuda
}  // namespace quant

namespace quant {
namespace cuda {
namespace sm80 {

// All kernels of one operand: the output dtype picks the instance set, p.m the tile. Explicitly
// instantiated by the operand's translation unit.
template <GemmOperand kOperand>
cudaError_t run_operand(const ScaledMmParams& p, int device, cudaStream_t stream) {
  switch (p.out_dtype) {
    case DType::kBFloat16:
      return run_for_rows<kOperand, KernelFor<kOperand, cutlass::bfloat16_t>::template Kernel>(
          p.m, p, device, stream);
    case DType::kFloat16:
      return run_for_rows<kOperand, KernelFor<kOperand, cutlass::half_t>::template Kernel>(
          p.m, p, device, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace sm80
}  // namespace cuda
}  // namespace quant
