// activation_cuda.h: host launchers of the CUDA activation kernels (no Torch headers).
//
// Each launcher enqueues one kernel on `stream` and returns the launch status
// (cudaGetLastError()); it launches nothing when there is no element to process.
// Preconditions, checked by the caller (torch-ext/): pointers on the current device, d/n > 0 or
// rows == 0, unit stride along the last dimension, non-overlapping input and output.
#pragma once

#include <cuda_runtime_api.h>

#include "activation_params.h"

namespace activation {
namespace cuda {

cudaError_t unary_act_fwd(UnaryAct act, DType dtype, const UnaryActFwdParams& params,
                          cudaStream_t stream);
cudaError_t unary_act_bwd(UnaryAct act, DType dtype, const UnaryActBwdParams& params,
                          cudaStream_t stream);
cudaError_t gated_act_fwd(GatedAct act, DType dtype, const GatedActFwdParams& params,
                          cudaStream_t stream);
cudaError_t gated_act_bwd(GatedAct act, DType dtype, const GatedActBwdParams& params,
                          cudaStream_t stream);

}  // namespace cuda
}  // namespace activation
