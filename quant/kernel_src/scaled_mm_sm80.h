// scaled_mm_sm80.h: the mma.sync scaled GEMMs (CUTLASS 2.x style; scaled_mm_sm80*.cu): int8 on
// sm_80 and newer (sm_75 has no kernel yet: supported() says no), fp8 e4m3 on sm_89 and newer.
// The dispatcher (scaled_mm_cuda.cu) uses them below sm_90 and wherever the Hopper kernels do not
// apply. Preconditions: scaled_mm_cuda.h; a call they cannot serve (alignment, sizes beyond int,
// a zero point with fp8) returns cudaErrorInvalidValue without launching.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "scaled_mm_params.h"

namespace quant {
namespace cuda {
namespace sm80 {

bool supported(int capability, GemmOperand operand);
size_t workspace_size(const ScaledMmParams& p, int device);
cudaError_t scaled_mm(const ScaledMmParams& p, void* workspace, int device, cudaStream_t stream);

}  // namespace sm80
}  // namespace cuda
}  // namespace quant
