// rope_cuda.h: host launcher of the CUDA rotary embedding kernels (no Torch headers).
//
// One entry for every form of the op (rope_params.h): q and optionally k, NeoX or interleaved
// pairs, half or full tables, the three row modes, and the transpose (backward) as a flag.
// Preconditions, checked by the caller (torch-ext/): pointers on the current device, the shape,
// dtype and stride rules of rope_params.h, no overlap between written and read tensors other
// than out == in. rope_forward checks the params for internal consistency as a backstop
// (cudaErrorInvalidValue when they are not), enqueues one kernel on `stream` and returns the
// launch status (cudaGetLastError()); it launches nothing when there is no token or no head.
// Rows outside [0, table_rows), and varlen tokens in no sequence of cu_seqlens, are found on the
// device: the kernel prints the offending value and stops with a device-side assertion naming
// positions, seqlen_offset(s) or cu_seqlens (cudaErrorAssert, seen at the next synchronization;
// a trap on Windows), and never reads outside the table or cu_seqlens.
#pragma once

#include <cuda_runtime_api.h>

#include "rope_params.h"

namespace rope {
namespace cuda {

cudaError_t rope_forward(const RopeParams& p, cudaStream_t stream);

}  // namespace cuda
}  // namespace rope
