// quant_cpu.h: the CPU implementation of the quantize ops (quant_cpu.cpp). Same params and
// rounding rules (quant_math.h) as the CUDA kernels; preconditions are checked by torch-ext/.
#pragma once

#include "quant_params.h"

namespace quant {
namespace cpu {

void static_scaled_fp8_quant(DType dtype, const StaticFp8Params& p);
void dynamic_scaled_fp8_quant(DType dtype, const DynamicFp8Params& p);
void dynamic_per_token_scaled_fp8_quant(DType dtype, const PerTokenFp8Params& p);
void static_scaled_int8_quant(DType dtype, const StaticInt8Params& p);
void dynamic_scaled_int8_quant(DType dtype, const DynamicInt8Params& p);
void per_token_group_fp8_quant(DType dtype, const GroupFp8Params& p);

}  // namespace cpu
}  // namespace quant
