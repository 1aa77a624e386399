// w4a16_params.h: the torch-free contract between the Torch-facing layer (torch-ext/) and the CPU
// and CUDA int4 weight-only ops: plain pointers, sizes and strides in elements.
//
// The weight is packed as w4a16_layout.h defines. Its codes are unsigned 4-bit q; a weight is
// w = (q - z) * s, with s and z per group of group_size consecutive k (of the packed order) and
// per column n, both in the activations' dtype: z from `zeros` (AWQ), or 8 without it (GPTQ's
// symmetric uint4b8). w is never rounded: (q - z) is a small integer and s has at most 11
// significant bits, so w and every product with an activation are exact in float32, and the
// only roundings are those of the float32 sum and the final one to dtype.
#pragma once

#include <cstdint>

#include "quant_params.h"
#include "scaled_mm_params.h"

namespace quant {

// S[m, n] = sum_k A[m, perm[k]] * w[k, n] + bias[n], the products summed in float32; perm
// (act-order checkpoints, GPTQ's g_idx sorted) maps the packed weight's row k to A's column
// (without it row k reads column k). N is the weight's columns. D, rounded once to dtype:
//   plain: D[m, n] = act(S[m, n]), N columns;
//   gated: the weight holds gate and up projections in alternating blocks of 64 columns (gate
//     block j, then up block j: pack_gate_up's order; scales, zeros and bias the same), and
//     D[m, 64 j + c] = act(S[m, 128 j + c]) * S[m, 128 j + 64 + c], N / 2 columns.
struct W4A16GemmParams {
  DType dtype;          // kFloat16 or kBFloat16: A, scales, zeros, bias and D
  const void* a;        // A[m, k] at a[m * lda + k]
  const int32_t* b;     // packed weight, int32 [K / 16, 2 N]
  const void* scales;   // s[g, n] at scales[g * N + n], g = k / group_size
  const void* zeros;    // z[g, n] at zeros[g * N + n] (integers 0..15), or nullptr: z = 8
  const int32_t* perm;  // [K] or nullptr
  const void* bias;     // [N] or nullptr
  void* d;              // D[m, j] at d[m * ldd + j]
  int64_t m, n, k;      // n a multiple of 64 (gated: of 128), k of 16 (checked by torch-ext/)
  int64_t group_size;   // divides k, a multiple of 16
  int64_t lda, ldd;
  Activation activation;
  bool gated;
};

// Pack / unpack between codes[k, n] (uint8 values 0..15, row-major K x N, ld elements apart) and
// the packed layout.
struct W4PackParams {
  uint8_t* codes;   // pack: read; unpack: written
  int32_t* packed;  // pack: written; unpack: read
  int64_t k, n;     // k a multiple of 16, n of 64
  int64_t ld;       // row stride of codes
};

}  // namespace quant
