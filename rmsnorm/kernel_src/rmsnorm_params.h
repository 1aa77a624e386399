// rmsnorm_params.h: the torch-free contract between the Torch-facing layer (torch-ext/) and the
// CPU and CUDA implementations (kernel_src/). Plain pointers, element strides and sizes only.
//
// Every activation tensor is a [rows, hidden] matrix with unit stride along `hidden` and an
// arbitrary row stride (in elements), so views into wider buffers need no copy. Vectors
// (weight, rstd) are contiguous.
//
// Forward, per row (all math in fp32; round_X(v) rounds v to dtype X, to nearest even):
//   r      = fused add ? round_in(input + residual) : input      (residual_out <- r)
//   rstd   = 1 / sqrt(mean(r^2) + eps)                             (rstd[row] <- rstd, optional)
//   n      = r * rstd;  n' = round_norm ? round_{norm_dtype}(n) : n
//   w'     = weight ? weight_offset + weight : 1                  (offset 1: Gemma's 1 + w)
//   y      = n' * w'
//   modulated: y = y * (1 + scale[b]) + shift[b],  b = row / rows_per_sample
//   out    = round_out(y)
// LlamaRMSNorm / vLLM: round_norm, norm_dtype = in_dtype, offset 0. Gemma: no round_norm,
// offset 1. Modulated (diffusion adaptive norms): no round_norm, offset 0.
//
// Backward (the roundings pass gradients straight through, as autograd does for .to()):
//   gy = grad_out * (modulated ? 1 + scale[b] : 1);  gn = gy * w'
//   grad_input = round_in(rstd * (gn - n * mean(gn * n)) + grad_residual)   (grad_residual opt.)
//   grad_weight[i]    = sum over rows of gy * n'           (rounded once to weight_dtype)
//   grad_scale[b, i]  = sum over rows of sample b of grad_out * n' * w'
//   grad_shift[b, i]  = sum over rows of sample b of grad_out
// rstd is recomputed from `input` (the tensor that was normalized: r for the fused add).
#pragma once

#include <cstdint>

#include "pdl_request.h"

namespace rmsnorm {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Dtype rules (checked by torch-ext/): input, residual, residual_out, scale, shift, grad_input,
// grad_residual, grad_scale and grad_shift have in_dtype; weight and grad_weight have
// weight_dtype, which is in_dtype or kFloat32; out and grad_out have out_dtype, which is in_dtype
// or kFloat32.
struct RmsNormFwdParams {
  int64_t rows = 0;
  int64_t hidden = 0;
  DType in_dtype = DType::kFloat32;
  DType weight_dtype = DType::kFloat32;
  DType out_dtype = DType::kFloat32;

  void* out = nullptr;  // [rows, hidden], out_dtype; may alias input (in place)
  int64_t out_stride = 0;
  const void* input = nullptr;  // [rows, hidden]
  int64_t input_stride = 0;

  // Fused residual add: both set or both null. residual_out may alias residual (vLLM's in-place
  // form writes residual <- input + residual).
  const void* residual = nullptr;  // [rows, hidden]
  int64_t residual_stride = 0;
  void* residual_out = nullptr;  // [rows, hidden]
  int64_t residual_out_stride = 0;

  const void* weight = nullptr;  // [hidden] or null (w' = 1)
  float weight_offset = 0.0f;

  // Modulation: both set or both null; [batch, hidden] with batch = rows / rows_per_sample.
  const void* scale = nullptr;
  int64_t scale_stride = 0;
  const void* shift = nullptr;
  int64_t shift_stride = 0;
  int64_t rows_per_sample = 1;

  float* rstd = nullptr;  // [rows] fp32, optional output
  float eps = 1e-6f;
  bool round_norm = false;
  DType norm_dtype = DType::kFloat32;

  pdl::Request pdl_request = pdl::Request::kDefault;  // enable_pdl (pdl_request.h)
};

struct RmsNormBwdParams {
  int64_t rows = 0;
  int64_t hidden = 0;
  DType in_dtype = DType::kFloat32;
  DType weight_dtype = DType::kFloat32;
  DType out_dtype = DType::kFloat32;  // dtype of grad_out

  void* grad_input = nullptr;  // [rows, hidden]; may alias grad_out or grad_residual
  int64_t grad_input_stride = 0;
  const void* grad_out = nullptr;  // [rows, hidden]
  int64_t grad_out_stride = 0;
  const void* input = nullptr;  // [rows, hidden]: the tensor that was normalized
  int64_t input_stride = 0;
  const void* grad_residual = nullptr;  // [rows, hidden] or null: gradient reaching residual_out
  int64_t grad_residual_stride = 0;

  const void* weight = nullptr;  // [hidden] or null
  float weight_offset = 0.0f;
  const void* scale = nullptr;  // [batch, hidden] or null (not modulated)
  int64_t scale_stride = 0;
  int64_t rows_per_sample = 1;

  // Reductions, each optional. grad_scale and grad_shift need `scale` (a modulated forward).
  void* grad_weight = nullptr;  // [hidden], weight_dtype
  void* grad_scale = nullptr;   // [batch, hidden], in_dtype
  int64_t grad_scale_stride = 0;
  void* grad_shift = nullptr;  // [batch, hidden], in_dtype
  int64_t grad_shift_stride = 0;

  // fp32 scratch for the reductions: rms_norm_bwd_workspace_floats(params) floats, allocated by
  // the caller (CUDA); the CPU implementation allocates its own and ignores this.
  float* workspace = nullptr;

  float eps = 1e-6f;
  bool round_norm = false;
  DType norm_dtype = DType::kFloat32;

  pdl::Request pdl_request = pdl::Request::kDefault;  // enable_pdl (pdl_request.h)
};

}  // namespace rmsnorm
