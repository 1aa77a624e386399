// scaled_mm_sm80_operands.h: the per-operand entry point of the mma.sync scaled GEMMs. Each
// operand's instances live in their own translation unit (scaled_mm_sm80_int8.cu,
// scaled_mm_sm80_fp8.cu, explicit instantiations of run_operand) so the two sets of CUTLASS
// kernels compile in parallel. Called by scaled_mm_sm80.cu after its checks.
#pragma once

#include <cuda_runtime_api.h>

#include "scaled_mm_params.h"

namespace quant {
namespace cuda {
namespace sm80 {

// Enqueues the kernel of p.out_dtype and p.m's tile; defined in scaled_mm_sm80_gemm.cuh.
template <GemmOperand kOperand>
cudaError_t run_operand(const ScaledMmParams& p, int device, cudaStream_t stream);

extern template cudaError_t run_operand<GemmOperand::kInt8>(const ScaledMmParams&, int,
                                                            cudaStream_t);
extern template cudaError_t run_operand<GemmOperand::kFp8E4m3>(const ScaledMmParams&, int,
                                                               cudaStream_t);

}  // namespace sm80
}  // namespace cuda
}  // namespace quant
