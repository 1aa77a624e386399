// rmsnorm_cpu.h: the C++ CPU implementation of the RMSNorm ops (no Torch headers except
// ATen's parallel_for in the .cpp). Same contract and preconditions as rmsnorm_cuda.h.
#pragma once

#include "rmsnorm_params.h"

namespace rmsnorm {
namespace cpu {

void rms_norm_fwd(const RmsNormFwdParams& params);
void rms_norm_bwd(const RmsNormBwdParams& params);  // allocates its own reduction scratch

}  // namespace cpu
}  // namespace rmsnorm
