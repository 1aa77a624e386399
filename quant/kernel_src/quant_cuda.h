// quant_cuda.h: host launchers of the CUDA quantize kernels (no Torch headers).
//
// Each launcher enqueues its kernels on `stream` and returns the launch status
// (cudaGetLastError()); nothing is launched when there is no element. Preconditions, checked by
// the caller (torch-ext/): pointers on the current device, hidden > 0 or rows == 0, unit stride
// along rows, scales contiguous float32, fp8 ops on a device of capability 8.9 or newer.
// Nothing allocates and nothing synchronizes with the host, so every launcher can be captured
// in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include "quant_params.h"

namespace quant {
namespace cuda {

cudaError_t static_scaled_fp8_quant(DType dtype, const StaticFp8Params& p, cudaStream_t stream);
// Two kernels: a global amax reduction into p.scale (atomic max on the float's bits), then the
// static quantize pass reading that scale.
cudaError_t dynamic_scaled_fp8_quant(DType dtype, const DynamicFp8Params& p, cudaStream_t stream);
cudaError_t dynamic_per_token_scaled_fp8_quant(DType dtype, const PerTokenFp8Params& p,
                                               cudaStream_t stream);
cudaError_t static_scaled_int8_quant(DType dtype, const StaticInt8Params& p, cudaStream_t stream);
cudaError_t dynamic_scaled_int8_quant(DType dtype, const DynamicInt8Params& p, cudaStream_t stream);
cudaError_t per_token_group_fp8_quant(DType dtype, const GroupFp8Params& p, cudaStream_t stream);

}  // namespace cuda
}  // namespace quant
