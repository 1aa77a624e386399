// quant_ops.cpp: the Torch-facing layer of the quantize ops (prototypes: torch_binding.h).
//
// For each op it validates the tensors (dtypes, devices, shapes, strides, overlap) with messages
// that name the op and the argument and print expected vs. got, maps them onto the row matrices
// of quant_params.h, and runs the CPU implementation (-DCPU_KERNEL builds) or launches the CUDA
// kernels on the current stream of the input's device under a device guard (-DCUDA_KERNEL).
// fp8 ops need a GPU of capability 8.9 or newer (the first with fp8 conversions and GEMMs).
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "quant_params.h"
#include "torch_binding.h"
#include "torch_checks.h"

#if defined(CPU_KERNEL)
#include "quant_cpu.h"
#endif
#if defined(CUDA_KERNEL)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "quant_cuda.h"
#endif

namespace {

using quant::DType;
using quant::Rows;
using torch_checks::dtype_name;
using torch_checks::present;

DType check_input(const char* op, const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 1, op,
              ": input must have at least one dimension [..., hidden], got a 0-d tensor");
  const std::optional<DType> dtype = torch_checks::to_dtype<DType>(input.scalar_type());
  TORCH_CHECK(dtype.has_value(), op, ": input must be float32, float16 or bfloat16, got ",
              dtype_name(input.scalar_type()));
  return *dtype;
}

void check_dtype(const char* op, const char* name, const at::Tensor& t, at::ScalarType expected) {
  TORCH_CHECK(t.scalar_type() == expected, op, ": ", name, " must be ", dtype_name(expected),
              ", got ", dtype_name(t.scalar_type()));
}

// A scale / zero-point tensor: dtype, device of input, `numel` elements, contiguous when written.
void check_aux(const char* op, const char* name, const at::Tensor& t, at::ScalarType dtype,
               int64_t numel, const char* what, const at::Tensor& input, bool written) {
  check_dtype(op, name, t, dtype);
  torch_checks::check_device_of(op, name, t, "input", input);
  TORCH_CHECK(t.numel() == numel, op, ": ", name, " must have ", numel, " element(s) (", what,
              "), got shape ", t.sizes());
  TORCH_CHECK(!written || t.is_contiguous(), op, ": ", name, " must be contiguous, got strides ",
              t.strides());
}

// The output matrix and the input matrix of one call (input read through a copy if needed).
struct Call {
  DType dtype;
  Rows m;
  at::Tensor input;  // keeps a contiguous copy alive
};

Call prepare(const char* op, at::Tensor& result, const char* result_name, at::ScalarType out_type,
             const at::Tensor& input) {
  Call c;
  c.dtype = check_input(op, input);
  check_dtype(op, result_name, result, out_type);
  torch_checks::check_device_of(op, result_name, result, "input", input);
  torch_checks::check_shape(op, result_name, result, input.sizes(), "the input shape");
  const int64_t out_stride = torch_checks::written_row_stride(op, result_name, result);
  torch_checks::check_no_overlap(op, result_name, result, "input", input);
  c.input = torch_checks::readable(input);
  const int64_t hidden = input.size(-1);
  c.m.input = c.input.const_data_ptr();
  c.m.out = result.mutable_data_ptr();
  c.m.hidden = hidden;
  c.m.rows = 1;  // from the leading dimensions: rows of width 0 still get their scales
  for (int64_t d = 0; d + 1 < input.dim(); ++d) c.m.rows *= input.size(d);
  c.m.input_row_stride = torch_checks::read_row_stride(c.input);
  c.m.out_row_stride = out_stride;
  return c;
}

#if defined(CUDA_KERNEL)
void check_fp8_device(const char* op, const at::Device& device) {
  if (!device.is_cuda()) return;
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device.index());
  TORCH_CHECK(prop->major * 10 + prop->minor >= 89, op,
              ": float8_e4m3fn needs a GPU of compute capability 8.9 or newer, got ", prop->major,
              ".", prop->minor, " (", prop->name, ")");
}
#endif

// Runs `cpu(params)` or launches `cuda(params, stream)` on the input's device.
template <typename Params, typename Cpu, typename Cuda>
void run(const char* op, const at::Device& device, const Params& params, Cpu cpu, Cuda cuda,
         bool fp8) {
#if defined(CPU_KERNEL)
  if (device.is_cpu()) {
    cpu(params);
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (device.is_cuda()) {
    if (fp8) check_fp8_device(op, device);
    const c10::cuda::CUDAGuard device_guard(device);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const cudaError_t err = cuda(params, stream);
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
    return;
  }
#endif
  (void)cpu;
  (void)cuda;
  (void)params;
  (void)fp8;
  TORCH_CHECK(false, op, ": no implementation for device ", device, " in this build");
}

#if defined(CPU_KERNEL)
#define QUANT_CPU(fn) [&](const auto& p) { quant::cpu::fn(c.dtype, p); }
#else
#define QUANT_CPU(fn) [](const auto&) {}
#endif
#if defined(CUDA_KERNEL)
#define QUANT_CUDA(fn) [&](const auto& p, cudaStream_t s) { return quant::cuda::fn(c.dtype, p, s); }
#else
#define QUANT_CUDA(fn) [](const auto&, auto) { return 0; }
#endif

}  // namespace

void static_scaled_fp8_quant(at::Tensor& result, const at::Tensor& input, const at::Tensor& scale) {
  const char* op = "static_scaled_fp8_quant";
  Call c = prepare(op, result, "result", at::kFloat8_e4m3fn, input);
  check_aux(op, "scale", scale, at::kFloat, 1, "a per-tensor scale", input, false);
  const quant::StaticFp8Params p{c.m, scale.const_data_ptr<float>()};
  run(op, input.device(), p, QUANT_CPU(static_scaled_fp8_quant),
      QUANT_CUDA(static_scaled_fp8_quant), true);
}

void dynamic_scaled_fp8_quant(at::Tensor& result, const at::Tensor& input, at::Tensor& scale) {
  const char* op = "dynamic_scaled_fp8_quant";
  Call c = prepare(op, result, "result", at::kFloat8_e4m3fn, input);
  check_aux(op, "scale", scale, at::kFloat, 1, "a per-tensor scale", input, true);
  torch_checks::check_no_overlap(op, "scale", scale, "input", input);
  const quant::DynamicFp8Params p{c.m, scale.mutable_data_ptr<float>()};
  run(op, input.device(), p, QUANT_CPU(dynamic_scaled_fp8_quant),
      QUANT_CUDA(dynamic_scaled_fp8_quant), true);
}

void dynamic_per_token_scaled_fp8_quant(at::Tensor& result, const at::Tensor& input,
                                        at::Tensor& scale,
                                        const std::optional<at::Tensor>& scale_ub) {
  const char* op = "dynamic_per_token_scaled_fp8_quant";
  Call c = prepare(op, result, "result", at::kFloat8_e4m3fn, input);
  check_aux(op, "scale", scale, at::kFloat, c.m.rows, "one per token", input, true);
  torch_checks::check_no_overlap(op, "scale", scale, "input", input);
  const float* ub = nullptr;
  if (present(scale_ub)) {
    check_aux(op, "scale_ub", *scale_ub, at::kFloat, 1, "an upper bound of amax", input, false);
    ub = scale_ub->const_data_ptr<float>();
  }
  const quant::PerTokenFp8Params p{c.m, scale.mutable_data_ptr<float>(), ub};
  run(op, input.device(), p, QUANT_CPU(dynamic_per_token_scaled_fp8_quant),
      QUANT_CUDA(dynamic_per_token_scaled_fp8_quant), true);
}

void static_scaled_int8_quant(at::Tensor& result, const at::Tensor& input, const at::Tensor& scale,
                              const std::optional<at::Tensor>& azp) {
  const char* op = "static_scaled_int8_quant";
  Call c = prepare(op, result, "result", at::kChar, input);
  check_aux(op, "scale", scale, at::kFloat, 1, "a per-tensor scale", input, false);
  const int32_t* azp_ptr = nullptr;
  if (present(azp)) {
    check_aux(op, "azp", *azp, at::kInt, 1, "a per-tensor zero point", input, false);
    azp_ptr = azp->const_data_ptr<int32_t>();
  }
  const quant::StaticInt8Params p{c.m, scale.const_data_ptr<float>(), azp_ptr};
  run(op, input.device(), p, QUANT_CPU(static_scaled_int8_quant),
      QUANT_CUDA(static_scaled_int8_quant), false);
}

void dynamic_scaled_int8_quant(at::Tensor& result, const at::Tensor& input, at::Tensor& scale,
                               std::optional<at::Tensor> azp) {
  const char* op = "dynamic_scaled_int8_quant";
  Call c = prepare(op, result, "result", at::kChar, input);
  check_aux(op, "scale", scale, at::kFloat, c.m.rows, "one per token", input, true);
  torch_checks::check_no_overlap(op, "scale", scale, "input", input);
  int32_t* azp_ptr = nullptr;
  if (present(azp)) {
    check_aux(op, "azp", *azp, at::kInt, c.m.rows, "one per token", input, true);
    torch_checks::check_no_overlap(op, "azp", *azp, "scale", scale);
    azp_ptr = azp->mutable_data_ptr<int32_t>();
  }
  const quant::DynamicInt8Params p{c.m, scale.mutable_data_ptr<float>(), azp_ptr};
  run(op, input.device(), p, QUANT_CPU(dynamic_scaled_int8_quant),
      QUANT_CUDA(dynamic_scaled_int8_quant), false);
}

void per_token_group_fp8_quant(const at::Tensor& input, at::Tensor& output_q, at::Tensor& output_s,
                               int64_t group_size, double eps, double fp8_min, double fp8_max,
                               bool scale_ue8m0) {
  const char* op = "per_token_group_fp8_quant";
  TORCH_CHECK(group_size > 0, op, ": group_size must be positive, got ", group_size);
  check_input(op, input);
  const int64_t hidden = input.size(-1);
  TORCH_CHECK(hidden % group_size == 0, op,
              ": group_size must divide the last dimension of input (", hidden, "), got ",
              group_size);
  TORCH_CHECK(eps > 0.0, op, ": eps must be positive, got ", eps);
  TORCH_CHECK(fp8_min < fp8_max, op, ": fp8_min must be below fp8_max, got ", fp8_min, " and ",
              fp8_max);
  Call c = prepare(op, output_q, "output_q", at::kFloat8_e4m3fn, input);
  check_dtype(op, "output_s", output_s, at::kFloat);
  torch_checks::check_device_of(op, "output_s", output_s, "input", input);
  std::vector<int64_t> s_shape(input.sizes().begin(), input.sizes().end());
  s_shape.back() = hidden / group_size;
  torch_checks::check_shape(op, "output_s", output_s, s_shape,
                            "the input shape with the last dimension divided by group_size");
  torch_checks::check_no_overlap(op, "output_s", output_s, "input", input);
  torch_checks::check_no_overlap(op, "output_s", output_s, "output_q", output_q);
  const std::optional<int64_t> s_row = torch_checks::collapsed_row_stride(output_s);
  TORCH_CHECK(s_row.has_value(), op,
              ": output_s must have leading dimensions that collapse into one row stride (row- or "
              "column-major scales), got strides ",
              output_s.strides());
  quant::GroupFp8Params p;
  p.m = c.m;
  p.scale = output_s.mutable_data_ptr<float>();
  p.scale_row_stride = *s_row;
  p.scale_group_stride = output_s.stride(-1);
  p.group_size = group_size;
  p.eps = static_cast<float>(eps);
  p.fp8_min = static_cast<float>(fp8_min);
  p.fp8_max = static_cast<float>(fp8_max);
  p.scale_ue8m0 = scale_ue8m0;
  run(op, input.device(), p, QUANT_CPU(per_token_group_fp8_quant),
      QUANT_CUDA(per_token_group_fp8_quant), true);
}
