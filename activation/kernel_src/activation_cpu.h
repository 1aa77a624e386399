// activation_cpu.h: the CPU implementation of the activation ops (multithreaded through ATen's
// thread pool, so torch.set_num_threads applies). Same contract as the CUDA launchers.
#pragma once

#include "activation_params.h"

namespace activation {
namespace cpu {

void unary_act_fwd(UnaryAct act, DType dtype, const UnaryActFwdParams& params);
void unary_act_bwd(UnaryAct act, DType dtype, const UnaryActBwdParams& params);
void gated_act_fwd(GatedAct act, DType dtype, const GatedActFwdParams& params);
void gated_act_bwd(GatedAct act, DType dtype, const GatedActBwdParams& params);

}  // namespace cpu
}  // namespace activation
