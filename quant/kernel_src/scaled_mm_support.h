// scaled_mm_support.h: which scaled GEMMs a CUDA build of this kernel has, by GPU compute
// capability (major * 10 + minor). One rule for the CUDA dispatcher (scaled_mm_supported) and for
// the CPU build's cutlass_scaled_mm_supports_* ops, so both builds answer the same question alike.
//
// int8 needs the integer mma tiles of sm_80 (no Turing kernels are built), fp8 the e4m3 mma of sm_89; the blockwise fp8 kernels are
// Hopper CUTLASS 3.x kernels (sm_90a instructions), which no other capability runs.
#pragma once

#include "scaled_mm_params.h"

namespace quant {

constexpr int kInt8MinCapability = 80;
constexpr int kFp8MinCapability = 89;
constexpr int kBlockFp8Capability = 90;

constexpr bool scaled_mm_capability_supports(int capability, GemmOperand operand) {
  return capability >= (operand == GemmOperand::kInt8 ? kInt8MinCapability : kFp8MinCapability);
}

constexpr bool block_scaled_mm_capability_supports(int capability) {
  return capability == kBlockFp8Capability;
}

}  // namespace quant
