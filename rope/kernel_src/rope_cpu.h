// rope_cpu.h: the C++ CPU implementation of the rotary embedding (no Torch headers except ATen's
// parallel_for and c10's error macros in the .cpp). Same contract as rope_cuda.h: rope_params.h.
#pragma once

#include "rope_params.h"

namespace rope {
namespace cpu {

// Rotates params.q (and params.k) as rope_params.h specifies. Checks every table row before it
// writes anything and throws c10::Error (TORCH_CHECK), naming `positions`, `seqlen_offset(s)` or
// `cu_seqlens`, when a row is outside [0, table_rows) or cu_seqlens is malformed; in that case
// no output element has been written.
void rope_forward(const RopeParams& params);

}  // namespace cpu
}  // namespace rope
