// torch_binding.cpp: op schemas and device implementations of the rmsnorm kernel.
//
// Public ops follow vLLM (rms_norm, fused_add_rms_norm and the Gemma forms: out-param or in
// place, return nothing). rms_norm_fwd / rms_norm_bwd are the general forms behind the Python
// functional API, its autograd formulas and the layers. Launchers: torch_binding.h; semantics:
// kernel_src/rmsnorm_params.h.
#include <torch/library.h>

#include "registration.h"
#include "torch_binding.h"

#if defined(CUDA_KERNEL)
#define RMSNORM_IMPL(name) ops.impl(#name, c10::kCUDA, &name)
#elif defined(CPU_KERNEL)
#define RMSNORM_IMPL(name) ops.impl(#name, c10::kCPU, &name)
#else
#error "rmsnorm: compile with -DCPU_KERNEL or -DCUDA_KERNEL"
#endif

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // out = round(round(input * rstd) * weight): LlamaRMSNorm / vLLM casting.
  ops.def(
      "rms_norm(Tensor! out, Tensor input, Tensor? weight, float epsilon, "
      "bool? enable_pdl=None) -> ()");
  RMSNORM_IMPL(rms_norm);
  // residual <- input + residual; input <- rms_norm(residual) (vLLM, in place).
  ops.def(
      "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon, "
      "bool? enable_pdl=None) -> ()");
  RMSNORM_IMPL(fused_add_rms_norm);
  // out = round(input * rstd * (1 + weight)), fp32 throughout (Gemma).
  ops.def(
      "gemma_rms_norm(Tensor! out, Tensor input, Tensor? weight, float epsilon, "
      "bool? enable_pdl=None) -> ()");
  RMSNORM_IMPL(gemma_rms_norm);
  ops.def(
      "gemma_fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, "
      "float epsilon, bool? enable_pdl=None) -> ()");
  RMSNORM_IMPL(gemma_fused_add_rms_norm);
  // out = round(input * rstd * weight * (1 + scale) + shift), scale/shift per sample.
  ops.def(
      "rms_norm_modulate(Tensor! out, Tensor input, Tensor? weight, Tensor scale, Tensor shift, "
      "float epsilon, bool? enable_pdl=None) -> ()");
  RMSNORM_IMPL(rms_norm_modulate);

  // General forward: every option of RmsNormFwdParams. norm_dtype None: no rounding of n.
  ops.def(
      "rms_norm_fwd(Tensor(a!) out, Tensor input, Tensor? weight, Tensor? residual, "
      "Tensor(b!)? residual_out, Tensor? scale, Tensor? shift, Tensor(c!)? rstd, float epsilon, "
      "float weight_offset, ScalarType? norm_dtype, bool? enable_pdl=None) -> ()");
  RMSNORM_IMPL(rms_norm_fwd);
  // General backward (RmsNormBwdParams).
  ops.def(
      "rms_norm_bwd(Tensor(a!) grad_input, Tensor(b!)? grad_weight, Tensor(c!)? grad_scale, "
      "Tensor(d!)? grad_shift, Tensor grad_out, Tensor input, Tensor? weight, "
      "Tensor? grad_residual, Tensor? scale, float epsilon, float weight_offset, "
      "ScalarType? norm_dtype, bool? enable_pdl=None) -> ()");
  RMSNORM_IMPL(rms_norm_bwd);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
