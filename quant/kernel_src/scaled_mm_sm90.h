// scaled_mm_sm90.h: the Hopper (sm_90a) scaled GEMMs: warp-specialized wgmma + TMA kernels made
// from CUTLASS 3.x collectives (scaled_mm_sm90_gemm.cuh), one tile configuration per M bucket.
// The dispatcher (scaled_mm_cuda.cu) uses them on devices of capability 9.0. Preconditions:
// scaled_mm_cuda.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "scaled_mm_params.h"

namespace quant {
namespace cuda {
namespace sm90 {

size_t workspace_size(const ScaledMmParams& p, int sm_count);
cudaError_t scaled_mm(const ScaledMmParams& p, void* workspace, int sm_count, cudaStream_t stream);

size_t block_workspace_size(const BlockScaledMmParams& p, int sm_count);
cudaError_t block_scaled_mm(const BlockScaledMmParams& p, void* workspace, int sm_count,
                            cudaStream_t stream);

}  // namespace sm90
}  // namespace cuda
}  // namespace quant
