// rmsnorm_cuda.h: host launchers of the CUDA RMSNorm kernels (no Torch headers).
//
// Preconditions, checked by the caller (torch-ext/): pointers on the current device, hidden > 0
// or rows == 0, dtype rules of rmsnorm_params.h, eps > 0, no overlap between written and read
// tensors except the aliasings the params allow. Each launcher returns the launch status
// (cudaGetLastError()) and launches nothing when rows == 0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "rmsnorm_params.h"

namespace rmsnorm {
namespace cuda {

cudaError_t rms_norm_fwd(const RmsNormFwdParams& params, cudaStream_t stream);

// Floats of fp32 workspace rms_norm_bwd needs for its reductions (0 when it needs none).
// Depends only on the sizes, which reductions are requested and the current device.
int64_t rms_norm_bwd_workspace_floats(const RmsNormBwdParams& params);

cudaError_t rms_norm_bwd(const RmsNormBwdParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace rmsnorm
