// newkernel_cuda.h: host launchers of the CUDA kernels of newkernel (no Torch headers).
//
// Each launcher enqueues its kernel on `stream` and returns the launch status
// (cudaGetLastError()); it launches nothing when there is no element to process.
// Preconditions, checked by the caller (torch-ext/): pointers on the current device, unit stride
// along a row, output not overlapping the input.
#pragma once

#include <cuda_runtime_api.h>

#include "newkernel_params.h"

namespace newkernel {
namespace cuda {

cudaError_t scale(DType dtype, const ScaleParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace newkernel
