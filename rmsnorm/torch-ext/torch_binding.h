// torch_binding.h: Torch-facing launchers of the rmsnorm ops (defined in rmsnorm_ops.cpp,
// registered in torch_binding.cpp). Semantics: kernel_src/rmsnorm_params.h.
//
// `...` is any number of leading dimensions (none included); hidden = the last dimension.
// Written tensors need a unit last-dimension stride and leading dimensions that collapse into
// one row stride; read tensors may have any strides (read through a copy when they do not fit).
// float32, float16, bfloat16; weight may be float32 with half-precision input. enable_pdl (every
// op): programmatic dependent launch on CUDA (nullopt: each launch's default; pdl_request.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <optional>

void rms_norm(at::Tensor& out,                          // [..., hidden]
              const at::Tensor& input,                  // [..., hidden]
              const std::optional<at::Tensor>& weight,  // [hidden]
              double epsilon, std::optional<bool> enable_pdl);
void fused_add_rms_norm(at::Tensor& input,                        // [..., hidden], in/out
                        at::Tensor& residual,                     // [..., hidden], in/out
                        const std::optional<at::Tensor>& weight,  // [hidden]
                        double epsilon, std::optional<bool> enable_pdl);
void gemma_rms_norm(at::Tensor& out,                          // [..., hidden]
                    const at::Tensor& input,                  // [..., hidden]
                    const std::optional<at::Tensor>& weight,  // [hidden]
                    double epsilon, std::optional<bool> enable_pdl);
void gemma_fused_add_rms_norm(at::Tensor& input,                        // [..., hidden]
                              at::Tensor& residual,                     // [..., hidden]
                              const std::optional<at::Tensor>& weight,  // [hidden]
                              double epsilon, std::optional<bool> enable_pdl);
void rms_norm_modulate(at::Tensor& out,                          // [B, ..., hidden]
                       const at::Tensor& input,                  // [B, ..., hidden]
                       const std::optional<at::Tensor>& weight,  // [hidden]
                       const at::Tensor& scale,                  // [B, hidden] or [B, 1, hidden]
                       const at::Tensor& shift,                  // [B, hidden] or [B, 1, hidden]
                       double epsilon, std::optional<bool> enable_pdl);

void rms_norm_fwd(at::Tensor& out,                                // [..., hidden]
                  const at::Tensor& input,                        // [..., hidden]
                  const std::optional<at::Tensor>& weight,        // [hidden]
                  const std::optional<at::Tensor>& residual,      // [..., hidden]
                  const std::optional<at::Tensor>& residual_out,  // [..., hidden]
                  const std::optional<at::Tensor>& scale,         // [B, (1,) hidden]
                  const std::optional<at::Tensor>& shift,         // [B, (1,) hidden]
                  const std::optional<at::Tensor>& rstd,          // [...] float32
                  double epsilon, double weight_offset, std::optional<at::ScalarType> norm_dtype,
                  std::optional<bool> enable_pdl);

void rms_norm_bwd(at::Tensor& grad_input,                          // [..., hidden]
                  const std::optional<at::Tensor>& grad_weight,    // [hidden]
                  const std::optional<at::Tensor>& grad_scale,     // [B, (1,) hidden]
                  const std::optional<at::Tensor>& grad_shift,     // [B, (1,) hidden]
                  const at::Tensor& grad_out,                      // [..., hidden]
                  const at::Tensor& input,                         // [..., hidden]
                  const std::optional<at::Tensor>& weight,         // [hidden]
                  const std::optional<at::Tensor>& grad_residual,  // [..., hidden]
                  const std::optional<at::Tensor>& scale,          // [B, (1,) hidden]
                  double epsilon, double weight_offset, std::optional<at::ScalarType> norm_dtype,
                  std::optional<bool> enable_pdl);
