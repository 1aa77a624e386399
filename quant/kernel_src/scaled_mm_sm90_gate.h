// scaled_mm_sm90_gate.h: the gate pass of the Hopper gated form at decode sizes
// (scaled_mm_sm90.cu): out[m, n] = act(y[m, gate column]) * y[m, up column], y the [M, 2N]
// product over the packed weight (pack_gate_up's blocks of kGateBlock columns, gate first).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "scaled_mm_params.h"

namespace quant {
namespace cuda {
namespace sm90 {

// y: [p.m, 2 * p.n] of p.out_dtype, rows `ldy` elements apart; writes p.d (p.ldd) only.
cudaError_t gate_packed_product(const ScaledMmParams& p, const void* y, int64_t ldy,
                                cudaStream_t stream);

}  // namespace sm90
}  // namespace cuda
}  // namespace quant
