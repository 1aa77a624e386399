// w4a16_cuda.h: host launchers of the CUDA int4 weight-only ops (no Torch headers), the formulas
// of w4a16_params.h. Preconditions, checked by the caller (torch-ext/): pointers on the current
// device, the shapes and strides of w4a16_params.h, capability 8.0 or newer (mma.sync bf16).
// Nothing synchronizes with the host; the GEMM's workspace comes from the caller, so every
// launcher can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "w4a16_params.h"

namespace quant {
namespace cuda {

cudaError_t w4_pack(const W4PackParams& p, cudaStream_t stream);
cudaError_t w4_unpack(const W4PackParams& p, cudaStream_t stream);

// How a GEMM is cut: `splits` CTAs share each 16 x 64 output tile's K (their float32 partials
// meet in the workspace, summed in split order by the last to finish: the same bits every run).
struct W4A16Plan {
  int splits;
  size_t workspace_bytes;
};
W4A16Plan w4a16_plan(const W4A16GemmParams& p, int sm_count);
// workspace: plan.workspace_bytes, 16-byte aligned (nullptr when 0); its counters are zeroed on
// the stream before the kernel.
cudaError_t w4a16_gemm(const W4A16GemmParams& p, const W4A16Plan& plan, void* workspace,
                       cudaStream_t stream);

}  // namespace cuda
}  // namespace quant
