// torch_binding.cpp: op schemas and device implementations of the quant kernel.
//
// The schemas are vLLM's (`torch.ops._C` of vllm-project/vllm csrc/torch_bindings.cpp): out-param
// ops that mutate `result` / `output_q` and the dynamic scales, and return nothing. Launchers:
// torch_binding.h.
#include <torch/library.h>

#include "registration.h"
#include "torch_binding.h"

#if defined(CUDA_KERNEL)
#define QUANT_IMPL(name) ops.impl(#name, c10::kCUDA, &name)
#elif defined(CPU_KERNEL)
#define QUANT_IMPL(name) ops.impl(#name, c10::kCPU, &name)
#else
#error "quant: compile with -DCPU_KERNEL or -DCUDA_KERNEL"
#endif

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale) -> ()");
  QUANT_IMPL(static_scaled_fp8_quant);
  ops.def("dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale) -> ()");
  QUANT_IMPL(dynamic_scaled_fp8_quant);
  ops.def(
      "dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale, "
      "Tensor? scale_ub) -> ()");
  QUANT_IMPL(dynamic_per_token_scaled_fp8_quant);
  ops.def(
      "static_scaled_int8_quant(Tensor! result, Tensor input, Tensor scale, Tensor? azp) -> ()");
  QUANT_IMPL(static_scaled_int8_quant);
  ops.def(
      "dynamic_scaled_int8_quant(Tensor! result, Tensor input, Tensor! scale, Tensor!? azp) "
      "-> ()");
  QUANT_IMPL(dynamic_scaled_int8_quant);
  ops.def(
      "per_token_group_fp8_quant(Tensor input, Tensor! output_q, Tensor! output_s, int "
      "group_size, float eps, float fp8_min, float fp8_max, bool scale_ue8m0) -> ()");
  QUANT_IMPL(per_token_group_fp8_quant);

  // Scaled GEMMs: vLLM's schemas for the first four, then ours (scaled_mm_ops.cpp). The ops
  // without tensors have one implementation for every device.
  ops.def(
      "cutlass_scaled_mm(Tensor! out, Tensor a, Tensor b, Tensor a_scales, Tensor b_scales, "
      "Tensor? bias) -> ()");
  QUANT_IMPL(cutlass_scaled_mm);
  ops.def(
      "cutlass_scaled_mm_azp(Tensor! out, Tensor a, Tensor b, Tensor a_scales, Tensor b_scales, "
      "Tensor azp_adj, Tensor? azp, Tensor? bias) -> ()");
  QUANT_IMPL(cutlass_scaled_mm_azp);
  ops.def("cutlass_scaled_mm_supports_fp8(int cuda_device_capability) -> bool",
          &cutlass_scaled_mm_supports_fp8);
  ops.def("cutlass_scaled_mm_supports_block_fp8(int cuda_device_capability) -> bool",
          &cutlass_scaled_mm_supports_block_fp8);
  ops.def(
      "cutlass_scaled_mm_act(Tensor! out, Tensor a, Tensor b, Tensor a_scales, Tensor b_scales, "
      "Tensor? bias, str activation) -> ()");
  QUANT_IMPL(cutlass_scaled_mm_act);
  ops.def("_set_scaled_mm_path(str path) -> ()", &_set_scaled_mm_path);
  ops.def("linear_act(Tensor! out, Tensor x, Tensor weight, Tensor? bias, str activation) -> ()");
  QUANT_IMPL(linear_act);
  ops.def(
      "scaled_mm_gated(Tensor! out, Tensor a, Tensor b, Tensor? a_scales, Tensor? b_scales, "
      "Tensor? bias, str activation) -> ()");
  QUANT_IMPL(scaled_mm_gated);

  // int4 weight-only GEMM and its weight layout (w4a16_ops.cpp), ours.
  ops.def("int4_pack(Tensor! packed, Tensor codes) -> ()");
  QUANT_IMPL(int4_pack);
  ops.def("int4_unpack(Tensor! codes, Tensor packed) -> ()");
  QUANT_IMPL(int4_unpack);
  ops.def(
      "w4a16_gemm(Tensor! out, Tensor a, Tensor b, Tensor scales, Tensor? zeros, Tensor? perm, "
      "Tensor? bias, str activation) -> ()");
  QUANT_IMPL(w4a16_gemm);
  ops.def(
      "w4a16_gemm_gated(Tensor! out, Tensor a, Tensor b, Tensor scales, Tensor? zeros, "
      "Tensor? perm, Tensor? bias, str activation) -> ()");
  QUANT_IMPL(w4a16_gemm_gated);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
