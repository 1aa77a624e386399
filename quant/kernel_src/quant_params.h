// quant_params.h: the torch-free contract between the Torch-facing layer (torch-ext/) and the CPU
// and CUDA implementations of the quantize ops (kernel_src/). Plain pointers, strides, sizes.
//
// The input is a matrix of `rows` rows of `hidden` elements (unit stride along a row, any row
// stride), the quantized output a matrix of the same size with its own row stride. Scales are
// float32. The rounding rules (vLLM's) are spelled out once, in quant_math.h.
#pragma once

#include <cstdint>

namespace quant {

// Element type of the input (the unquantized activations).
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// The row matrices every op reads and writes.
struct Rows {
  const void* input;  // [rows, hidden], row stride input_row_stride (elements)
  void* out;          // [rows, hidden] fp8 e4m3fn or int8 bytes, row stride out_row_stride
  int64_t rows;
  int64_t hidden;
  int64_t input_row_stride;
  int64_t out_row_stride;
};

// static_scaled_fp8_quant: out = fp8(clamp(x * (1 / scale[0]))).
struct StaticFp8Params {
  Rows m;
  const float* scale;  // [1]
};

// dynamic_scaled_fp8_quant: scale[0] = max(amax(|x|) / 448, min_scale), then as the static op.
struct DynamicFp8Params {
  Rows m;
  float* scale;  // [1], written
};

// dynamic_per_token_scaled_fp8_quant: per row, s = max(min(amax, scale_ub) / 448, min_scale),
// out = fp8(clamp(x / s)).
struct PerTokenFp8Params {
  Rows m;
  float* scale;           // [rows], written
  const float* scale_ub;  // [1] or nullptr
};

// static_scaled_int8_quant: out = sat8(rn(x / scale[0]) [+ azp[0]]).
struct StaticInt8Params {
  Rows m;
  const float* scale;  // [1]
  const int32_t* azp;  // [1] or nullptr (symmetric)
};

// dynamic_scaled_int8_quant, per row. Symmetric (azp == nullptr): s = amax / 127,
// out = sat8(rn(x * (127 / amax))). Asymmetric: s = (max - min) / 255,
// azp = rn(-128 - min / s), out = sat8(rn(x / s) + azp).
struct DynamicInt8Params {
  Rows m;
  float* scale;  // [rows], written
  int32_t* azp;  // [rows], written, or nullptr (symmetric)
};

// per_token_group_fp8_quant: each row is split into groups of group_size elements; per group,
// s = max(amax, eps) / fp8_max (rounded up to a power of two when scale_ue8m0),
// out = fp8(clamp(x / s, fp8_min, fp8_max)).
struct GroupFp8Params {
  Rows m;
  float*
      scale;  // scale of group g of row r at scale[r * scale_row_stride + g * scale_group_stride]
  int64_t scale_row_stride;
  int64_t scale_group_stride;
  int64_t group_size;
  float eps;
  float fp8_min;
  float fp8_max;
  bool scale_ue8m0;
};

}  // namespace quant
