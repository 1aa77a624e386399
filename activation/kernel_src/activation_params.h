// activation_params.h: the torch-free contract between the Torch-facing layer (torch-ext/) and the
// CPU and CUDA implementations (kernel_src/). Plain pointers, element strides and sizes only.
//
// Every tensor is seen as a 2-D matrix of `rows` rows with unit stride along the last dimension
// and an arbitrary row stride (in elements), so views into wider buffers need no copy.
// Gated ops read an input row of width 2*d and write an output row of width d.
#pragma once

#include <cstdint>

#include "pdl_request.h"

namespace activation {

// Element type of every tensor of one call (all tensors of a call share it).
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

// out[r, i] = f(x[r, i])
enum class UnaryAct : int { kSilu, kGelu, kGeluTanh, kGeluFast, kGeluNew, kGeluQuick };

// Gated: out[r, i] = g(x1, x2) with, for the split layout, x1 = x[r, i] and x2 = x[r, d + i]:
//   kSiluAndMul      silu(x1) * x2          kMulAndSilu     x1 * silu(x2)
//   kGeluAndMul      gelu(x1) * x2          kGeluTanhAndMul gelu_tanh(x1) * x2
//   kFatreluAndMul   fatrelu(x1, t) * x2
// and for the interleaved gpt-oss layout, gate = x[r, 2i], up = x[r, 2i + 1]:
//   kSwigluOaiAndMul swigluoai(gate, up; alpha, limit)
enum class GatedAct : int {
  kSiluAndMul,
  kMulAndSilu,
  kGeluAndMul,
  kGeluTanhAndMul,
  kFatreluAndMul,
  kSwigluOaiAndMul,
};

// Scalar parameters of the gated ops; each op reads only its own.
struct GatedActScalars {
  float threshold = 0.0f;  // kFatreluAndMul
  float alpha = 1.702f;    // kSwigluOaiAndMul
  float limit = 7.0f;      // kSwigluOaiAndMul
};

struct UnaryActFwdParams {
  void* out;          // [rows, n], row stride out_row_stride
  const void* input;  // [rows, n], row stride input_row_stride
  int64_t rows;
  int64_t n;
  int64_t out_row_stride;
  int64_t input_row_stride;
  pdl::Request pdl_request = pdl::Request::kDefault;  // enable_pdl (pdl_request.h)
};

struct UnaryActBwdParams {
  void* grad_input;      // [rows, n]
  const void* grad_out;  // [rows, n]
  const void* input;     // [rows, n]
  int64_t rows;
  int64_t n;
  int64_t grad_input_row_stride;
  int64_t grad_out_row_stride;
  int64_t input_row_stride;
  pdl::Request pdl_request = pdl::Request::kDefault;  // enable_pdl (pdl_request.h)
};

struct GatedActFwdParams {
  void* out;          // [rows, d]
  const void* input;  // [rows, 2 * d]
  int64_t rows;
  int64_t d;
  int64_t out_row_stride;
  int64_t input_row_stride;
  GatedActScalars scalars;
  pdl::Request pdl_request = pdl::Request::kDefault;  // enable_pdl (pdl_request.h)
};

struct GatedActBwdParams {
  void* grad_input;      // [rows, 2 * d]
  const void* grad_out;  // [rows, d]
  const void* input;     // [rows, 2 * d]
  int64_t rows;
  int64_t d;
  int64_t grad_input_row_stride;
  int64_t grad_out_row_stride;
  int64_t input_row_stride;
  GatedActScalars scalars;
  pdl::Request pdl_request = pdl::Request::kDefault;  // enable_pdl (pdl_request.h)
};

}  // namespace activation
