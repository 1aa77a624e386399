// newkernel_params.h: the torch-free contract between the Torch-facing layer (torch-ext/) and the
// CPU and CUDA implementations (kernel_src/): plain pointers, element strides and sizes only.
//
// Every tensor is seen as `rows` rows of `n` elements with unit stride along a row and any row
// stride (in elements), so views into wider buffers need no copy.
#pragma once

#include <cstdint>

namespace newkernel {

// Element type of every tensor of one call (all tensors of a call share it).
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

// out[r, i] = alpha * input[r, i], computed in fp32 (fp64 for kFloat64) and rounded once.
struct ScaleParams {
  void* out;          // [rows, n], row stride out_row_stride
  const void* input;  // [rows, n], row stride input_row_stride
  int64_t rows;
  int64_t n;
  int64_t out_row_stride;
  int64_t input_row_stride;
  float alpha;
};

}  // namespace newkernel
