// newkernel_cpu.h: the CPU implementation of the newkernel ops (multithreaded through ATen's
// thread pool, so torch.set_num_threads applies). Same contract as the CUDA launchers.
#pragma once

#include "newkernel_params.h"

namespace newkernel {
namespace cpu {

void scale(DType dtype, const ScaleParams& params);

}  // namespace cpu
}  // namespace newkernel
