// torch_binding.h: Torch-facing launchers of the activation ops (defined in activation_ops.cpp,
// registered in torch_binding.cpp).
//
// Every op writes into a caller-provided tensor and returns nothing. enable_pdl: programmatic
// dependent launch on CUDA (nullopt: the kernel's default; ignored on CPU; pdl_request.h). Tensors share one dtype
// (float32, float16, bfloat16 or float64) and one device. `...` is any number of leading
// dimensions (none included); the written tensor needs a unit last-dimension stride and leading
// dimensions that collapse into one row stride, read tensors may have any strides.
// Gated ops split the last dimension of `input` (width 2 * d) into two halves, except
// swigluoai_and_mul, which reads gate = input[..., 0::2] and up = input[..., 1::2].
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

// ---- gated forward: out = act(x1) * x2 ----
void silu_and_mul(at::Tensor& out,          // [..., d]
                  const at::Tensor& input,  // [..., 2 * d]
                  std::optional<bool> enable_pdl);
void mul_and_silu(at::Tensor& out,          // [..., d]
                  const at::Tensor& input,  // [..., 2 * d]
                  std::optional<bool> enable_pdl);
void gelu_and_mul(at::Tensor& out,          // [..., d]
                  const at::Tensor& input,  // [..., 2 * d]
                  std::optional<bool> enable_pdl);
void gelu_tanh_and_mul(at::Tensor& out,          // [..., d]
                       const at::Tensor& input,  // [..., 2 * d]
                       std::optional<bool> enable_pdl);
void fatrelu_and_mul(at::Tensor& out,          // [..., d]
                     const at::Tensor& input,  // [..., 2 * d]
                     double threshold, std::optional<bool> enable_pdl);
void swigluoai_and_mul(at::Tensor& out,          // [..., d]
                       const at::Tensor& input,  // [..., 2 * d], gate/up interleaved
                       double alpha, double limit, std::optional<bool> enable_pdl);

// ---- unary forward: out = act(input) ----
void gelu(at::Tensor& out,          // [..., n]
          const at::Tensor& input,  // [..., n]
          std::optional<bool> enable_pdl);
void gelu_tanh(at::Tensor& out,          // [..., n]
               const at::Tensor& input,  // [..., n]
               std::optional<bool> enable_pdl);
void silu(at::Tensor& out,          // [..., n]
          const at::Tensor& input,  // [..., n]
          std::optional<bool> enable_pdl);
void gelu_fast(at::Tensor& out,          // [..., n]
               const at::Tensor& input,  // [..., n]
               std::optional<bool> enable_pdl);
void gelu_new(at::Tensor& out,          // [..., n]
              const at::Tensor& input,  // [..., n]
              std::optional<bool> enable_pdl);
void gelu_quick(at::Tensor& out,          // [..., n]
                const at::Tensor& input,  // [..., n]
                std::optional<bool> enable_pdl);

// ---- gated backward: grad_input = d(sum(grad_out * op(input))) / d input ----
void silu_and_mul_bwd(at::Tensor& grad_input,      // [..., 2 * d]
                      const at::Tensor& grad_out,  // [..., d]
                      const at::Tensor& input,     // [..., 2 * d]
                      std::optional<bool> enable_pdl);
void mul_and_silu_bwd(at::Tensor& grad_input,      // [..., 2 * d]
                      const at::Tensor& grad_out,  // [..., d]
                      const at::Tensor& input,     // [..., 2 * d]
                      std::optional<bool> enable_pdl);
void gelu_and_mul_bwd(at::Tensor& grad_input,      // [..., 2 * d]
                      const at::Tensor& grad_out,  // [..., d]
                      const at::Tensor& input,     // [..., 2 * d]
                      std::optional<bool> enable_pdl);
void gelu_tanh_and_mul_bwd(at::Tensor& grad_input,      // [..., 2 * d]
                           const at::Tensor& grad_out,  // [..., d]
                           const at::Tensor& input,     // [..., 2 * d]
                           std::optional<bool> enable_pdl);
void fatrelu_and_mul_bwd(at::Tensor& grad_input,      // [..., 2 * d]
                         const at::Tensor& grad_out,  // [..., d]
                         const at::Tensor& input,     // [..., 2 * d]
                         double threshold, std::optional<bool> enable_pdl);
void swigluoai_and_mul_bwd(at::Tensor& grad_input,      // [..., 2 * d], gate/up interleaved
                           const at::Tensor& grad_out,  // [..., d]
                           const at::Tensor& input,     // [..., 2 * d], gate/up interleaved
                           double alpha, double limit, std::optional<bool> enable_pdl);

// ---- unary backward: grad_input = grad_out * act'(input) ----
void gelu_bwd(at::Tensor& grad_input,      // [..., n]
              const at::Tensor& grad_out,  // [..., n]
              const at::Tensor& input,     // [..., n]
              std::optional<bool> enable_pdl);
void gelu_tanh_bwd(at::Tensor& grad_input,      // [..., n]
                   const at::Tensor& grad_out,  // [..., n]
                   const at::Tensor& input,     // [..., n]
                   std::optional<bool> enable_pdl);
void silu_bwd(at::Tensor& grad_input,      // [..., n]
              const at::Tensor& grad_out,  // [..., n]
              const at::Tensor& input,     // [..., n]
              std::optional<bool> enable_pdl);
void gelu_fast_bwd(at::Tensor& grad_input,      // [..., n]
                   const at::Tensor& grad_out,  // [..., n]
                   const at::Tensor& input,     // [..., n]
                   std::optional<bool> enable_pdl);
void gelu_new_bwd(at::Tensor& grad_input,      // [..., n]
                  const at::Tensor& grad_out,  // [..., n]
                  const at::Tensor& input,     // [..., n]
                  std::optional<bool> enable_pdl);
void gelu_quick_bwd(at::Tensor& grad_input,      // [..., n]
                    const at::Tensor& grad_out,  // [..., n]
                    const at::Tensor& input,     // [..., n]
                    std::optional<bool> enable_pdl);
