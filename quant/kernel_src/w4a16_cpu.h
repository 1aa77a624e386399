// w4a16_cpu.h: the int4 weight-only ops on the CPU (w4a16_cpu.cpp), the formulas of
// w4a16_params.h; preconditions are checked by torch-ext/.
#pragma once

#include "w4a16_params.h"

namespace quant {
namespace cpu {

void w4_pack(const W4PackParams& p);
void w4_unpack(const W4PackParams& p);
void w4a16_gemm(const W4A16GemmParams& p);

}  // namespace cpu
}  // namespace quant
