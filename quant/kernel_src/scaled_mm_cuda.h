// scaled_mm_cuda.h: host launchers of the CUDA scaled GEMMs (no Torch headers).
//
// Preconditions, checked by the caller (torch-ext/): pointers on the current device, 16-byte
// aligned rows (n, k multiples of 16), scales and zero-point terms contiguous, the operand
// supported by the device (scaled_mm_supported). Each launcher enqueues on `stream` and returns
// the launch status; nothing is launched for an empty M. Nothing allocates (the caller provides
// `workspace` of scaled_mm_workspace_size bytes) and nothing synchronizes with the host, so every
// call can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "scaled_mm_params.h"

namespace quant {
namespace cuda {

// Which kernel family serves a call. kAuto picks the best for the device; kTensorCoreSm80 forces
// the mma.sync kernels (sm_80 / sm_89 family) on any GPU that runs them, so a Hopper machine can
// test and time them.
enum class GemmPath : int { kAuto = 0, kTensorCoreSm80 = 1 };

// Whether this build has kernels for `operand` (or blockwise fp8) on a GPU of capability
// major * 10 + minor.
bool scaled_mm_supported(int capability, GemmOperand operand);
bool block_scaled_mm_supported(int capability);

size_t scaled_mm_workspace_size(const ScaledMmParams& p, int device, GemmPath path);
cudaError_t scaled_mm(const ScaledMmParams& p, void* workspace, int device, GemmPath path,
                      cudaStream_t stream);

size_t block_scaled_mm_workspace_size(const BlockScaledMmParams& p, int device);
cudaError_t block_scaled_mm(const BlockScaledMmParams& p, void* workspace, int device,
                            cudaStream_t stream);

}  // namespace cuda
}  // namespace quant
