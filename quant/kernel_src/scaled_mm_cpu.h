// scaled_mm_cpu.h: the CPU scaled GEMMs (scaled_mm_cpu.cpp), same params and formulas as the
// CUDA kernels (scaled_mm_params.h); preconditions are checked by torch-ext/.
#pragma once

#include "scaled_mm_params.h"

namespace quant {
namespace cpu {

void scaled_mm(const ScaledMmParams& p);
void block_scaled_mm(const BlockScaledMmParams& p);

}  // namespace cpu
}  // namespace quant
