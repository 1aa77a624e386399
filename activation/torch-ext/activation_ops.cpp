// activation_ops.cpp: the Torch-facing layer of the activation ops (prototypes: torch_binding.h).
//
// For each op it validates the tensors (dtype, device, shapes, strides, overlap) with messages
// that name the op and the argument and print expected vs. got, maps each tensor onto the
// row-strided 2-D view of activation_params.h, and runs the CPU implementation
// (activation::cpu, -DCPU_KERNEL builds) or launches the CUDA kernel on the current stream of the
// input's device (activation::cuda, -DCUDA_KERNEL builds).
//
// Layout rules: a written tensor (out, grad_input) needs unit stride along its last dimension and
// leading dimensions that collapse into one row stride; anything else is an error, since writing
// into a copy would lose the result. A read tensor (input, grad_out) that does not fit the 2-D
// view is read through a contiguous copy. Written tensors must not share memory with read ones
// (no in-place calls). The test is exact (torch_checks::may_overlap): two strided views of one
// buffer whose elements interleave without sharing a byte (even and odd columns) are accepted.
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "activation_params.h"
#include "torch_binding.h"
#include "torch_checks.h"

#if defined(CPU_KERNEL)
#include "activation_cpu.h"
#endif
#if defined(CUDA_KERNEL)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "activation_cuda.h"
#endif

namespace {

using activation::DType;
using activation::GatedAct;
using activation::GatedActBwdParams;
using activation::GatedActFwdParams;
using activation::GatedActScalars;
using activation::UnaryAct;
using activation::UnaryActBwdParams;
using activation::UnaryActFwdParams;

// ---- validation (the shared checks and row views: torch_checks.h) ----

using torch_checks::check_shape;
using torch_checks::dtype_name;
using torch_checks::last_dim;
using torch_checks::read_row_stride;
using torch_checks::readable;
using torch_checks::written_row_stride;

DType check_dtype(const char* op, const char* name, const at::Tensor& t) {
  if (t.scalar_type() == at::kDouble) {
    return DType::kFloat64;
  }
  const std::optional<DType> dtype = torch_checks::to_dtype<DType>(t.scalar_type());
  TORCH_CHECK(dtype.has_value(), op, ": ", name,
              " must be float32, float16, bfloat16 or float64, got ", dtype_name(t.scalar_type()));
  return *dtype;
}

// `t` must have the dtype and device of `ref`.
void check_like(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                const at::Tensor& ref) {
  torch_checks::check_dtype_of(op, name, t, ref_name, ref);
  torch_checks::check_device_of(op, name, t, ref_name, ref);
}

// The kernels do not run in place: a written tensor must not share memory with a read one
// (torch_checks::may_overlap: exact, also for strided views of one buffer).
void check_no_overlap(const char* op, const char* name, const at::Tensor& written,
                      const char* read_name, const at::Tensor& read) {
  torch_checks::check_no_overlap(op, name, written, read_name, read,
                                 " (in-place calls are not supported)");
}

std::vector<int64_t> halved_last_dim(const at::Tensor& t) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape.back() /= 2;
  return shape;
}

// Gated ops read [..., 2 * d]: at least one dimension, even width.
int64_t gated_half_width(const char* op, const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 1, op, ": input must have at least one dimension, got a 0-d tensor");
  const int64_t width = input.size(-1);
  TORCH_CHECK(width % 2 == 0, op, ": input last dimension must be even (2 * d), got ", width);
  return width / 2;
}

// ---- device dispatch ----

#if defined(CPU_KERNEL)
void run_cpu(UnaryAct act, DType dtype, const UnaryActFwdParams& p) {
  activation::cpu::unary_act_fwd(act, dtype, p);
}
void run_cpu(UnaryAct act, DType dtype, const UnaryActBwdParams& p) {
  activation::cpu::unary_act_bwd(act, dtype, p);
}
void run_cpu(GatedAct act, DType dtype, const GatedActFwdParams& p) {
  activation::cpu::gated_act_fwd(act, dtype, p);
}
void run_cpu(GatedAct act, DType dtype, const GatedActBwdParams& p) {
  activation::cpu::gated_act_bwd(act, dtype, p);
}
#endif

#if defined(CUDA_KERNEL)
cudaError_t run_cuda(UnaryAct act, DType dtype, const UnaryActFwdParams& p, cudaStream_t s) {
  return activation::cuda::unary_act_fwd(act, dtype, p, s);
}
cudaError_t run_cuda(UnaryAct act, DType dtype, const UnaryActBwdParams& p, cudaStream_t s) {
  return activation::cuda::unary_act_bwd(act, dtype, p, s);
}
cudaError_t run_cuda(GatedAct act, DType dtype, const GatedActFwdParams& p, cudaStream_t s) {
  return activation::cuda::gated_act_fwd(act, dtype, p, s);
}
cudaError_t run_cuda(GatedAct act, DType dtype, const GatedActBwdParams& p, cudaStream_t s) {
  return activation::cuda::gated_act_bwd(act, dtype, p, s);
}
#endif

// Runs `act` with `params` on `device`, the device of every tensor of the call.
template <typename Act, typename Params>
void launch(const char* op, const at::Device& device, Act act, DType dtype, const Params& params) {
#if defined(CPU_KERNEL)
  if (device.is_cpu()) {
    run_cpu(act, dtype, params);
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard device_guard(device);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const cudaError_t err = run_cuda(act, dtype, params, stream);
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
    return;
  }
#endif
  TORCH_CHECK(false, op, ": no implementation for device ", device, " in this build");
}

// ---- the four op families ----

void unary_fwd(const char* op, UnaryAct act, at::Tensor& out, const at::Tensor& input,
               pdl::Request pdl_request) {
  const DType dtype = check_dtype(op, "input", input);
  check_like(op, "out", out, "input", input);
  check_shape(op, "out", out, input.sizes(), "the input shape");
  if (out.numel() == 0) {
    return;
  }
  const int64_t out_stride = written_row_stride(op, "out", out);
  check_no_overlap(op, "out", out, "input", input);
  const at::Tensor in = readable(input);
  const int64_t n = last_dim(input);
  UnaryActFwdParams params;
  params.out = out.mutable_data_ptr();
  params.input = in.const_data_ptr();
  params.rows = input.numel() / n;
  params.n = n;
  params.out_row_stride = out_stride;
  params.input_row_stride = read_row_stride(in);
  params.pdl_request = pdl_request;
  launch(op, input.device(), act, dtype, params);
}

void unary_bwd(const char* op, UnaryAct act, at::Tensor& grad_input, const at::Tensor& grad_out,
               const at::Tensor& input, pdl::Request pdl_request) {
  const DType dtype = check_dtype(op, "input", input);
  check_like(op, "grad_out", grad_out, "input", input);
  check_like(op, "grad_input", grad_input, "input", input);
  check_shape(op, "grad_out", grad_out, input.sizes(), "the input shape");
  check_shape(op, "grad_input", grad_input, input.sizes(), "the input shape");
  if (grad_input.numel() == 0) {
    return;
  }
  const int64_t grad_input_stride = written_row_stride(op, "grad_input", grad_input);
  check_no_overlap(op, "grad_input", grad_input, "grad_out", grad_out);
  check_no_overlap(op, "grad_input", grad_input, "input", input);
  const at::Tensor go = readable(grad_out);
  const at::Tensor in = readable(input);
  const int64_t n = last_dim(input);
  UnaryActBwdParams params;
  params.grad_input = grad_input.mutable_data_ptr();
  params.grad_out = go.const_data_ptr();
  params.input = in.const_data_ptr();
  params.rows = input.numel() / n;
  params.n = n;
  params.grad_input_row_stride = grad_input_stride;
  params.grad_out_row_stride = read_row_stride(go);
  params.input_row_stride = read_row_stride(in);
  params.pdl_request = pdl_request;
  launch(op, input.device(), act, dtype, params);
}

void gated_fwd(const char* op, GatedAct act, at::Tensor& out, const at::Tensor& input,
               const GatedActScalars& scalars, pdl::Request pdl_request) {
  const DType dtype = check_dtype(op, "input", input);
  check_like(op, "out", out, "input", input);
  const int64_t d = gated_half_width(op, input);
  check_shape(op, "out", out, halved_last_dim(input),
              "the input shape with the last dimension halved");
  if (out.numel() == 0) {
    return;
  }
  const int64_t out_stride = written_row_stride(op, "out", out);
  check_no_overlap(op, "out", out, "input", input);
  const at::Tensor in = readable(input);
  GatedActFwdParams params;
  params.out = out.mutable_data_ptr();
  params.input = in.const_data_ptr();
  params.rows = out.numel() / d;
  params.d = d;
  params.out_row_stride = out_stride;
  params.input_row_stride = read_row_stride(in);
  params.scalars = scalars;
  params.pdl_request = pdl_request;
  launch(op, input.device(), act, dtype, params);
}

void gated_bwd(const char* op, GatedAct act, at::Tensor& grad_input, const at::Tensor& grad_out,
               const at::Tensor& input, const GatedActScalars& scalars, pdl::Request pdl_request) {
  const DType dtype = check_dtype(op, "input", input);
  check_like(op, "grad_out", grad_out, "input", input);
  check_like(op, "grad_input", grad_input, "input", input);
  const int64_t d = gated_half_width(op, input);
  check_shape(op, "grad_out", grad_out, halved_last_dim(input),
              "the input shape with the last dimension halved");
  check_shape(op, "grad_input", grad_input, input.sizes(), "the input shape");
  if (grad_input.numel() == 0) {
    return;
  }
  const int64_t grad_input_stride = written_row_stride(op, "grad_input", grad_input);
  check_no_overlap(op, "grad_input", grad_input, "grad_out", grad_out);
  check_no_overlap(op, "grad_input", grad_input, "input", input);
  const at::Tensor go = readable(grad_out);
  const at::Tensor in = readable(input);
  GatedActBwdParams params;
  params.grad_input = grad_input.mutable_data_ptr();
  params.grad_out = go.const_data_ptr();
  params.input = in.const_data_ptr();
  params.rows = grad_out.numel() / d;
  params.d = d;
  params.grad_input_row_stride = grad_input_stride;
  params.grad_out_row_stride = read_row_stride(go);
  params.input_row_stride = read_row_stride(in);
  params.scalars = scalars;
  params.pdl_request = pdl_request;
  launch(op, input.device(), act, dtype, params);
}

GatedActScalars fatrelu_scalars(double threshold) {
  GatedActScalars s;
  s.threshold = static_cast<float>(threshold);
  return s;
}

GatedActScalars swigluoai_scalars(double alpha, double limit) {
  GatedActScalars s;
  s.alpha = static_cast<float>(alpha);
  s.limit = static_cast<float>(limit);
  return s;
}

}  // namespace

// ---- the ops of torch_binding.h ----

// Gated ops without scalar parameters: `name` and `name_bwd`.
#define ACTIVATION_GATED_OP(name, act)                                                           \
  void name(at::Tensor& out, const at::Tensor& input, std::optional<bool> enable_pdl) {          \
    gated_fwd(#name, GatedAct::act, out, input, GatedActScalars{}, pdl::request_of(enable_pdl)); \
  }                                                                                              \
  void name##_bwd(at::Tensor& grad_input, const at::Tensor& grad_out, const at::Tensor& input,   \
                  std::optional<bool> enable_pdl) {                                              \
    gated_bwd(#name "_bwd", GatedAct::act, grad_input, grad_out, input, GatedActScalars{},       \
              pdl::request_of(enable_pdl));                                                      \
  }

// Unary ops: `name` and `name_bwd`.
#define ACTIVATION_UNARY_OP(name, act)                                                         \
  void name(at::Tensor& out, const at::Tensor& input, std::optional<bool> enable_pdl) {        \
    unary_fwd(#name, UnaryAct::act, out, input, pdl::request_of(enable_pdl));                  \
  }                                                                                            \
  void name##_bwd(at::Tensor& grad_input, const at::Tensor& grad_out, const at::Tensor& input, \
                  std::optional<bool> enable_pdl) {                                            \
    unary_bwd(#name "_bwd", UnaryAct::act, grad_input, grad_out, input,                        \
              pdl::request_of(enable_pdl));                                                    \
  }

ACTIVATION_GATED_OP(silu_and_mul, kSiluAndMul)
ACTIVATION_GATED_OP(mul_and_silu, kMulAndSilu)
ACTIVATION_GATED_OP(gelu_and_mul, kGeluAndMul)
ACTIVATION_GATED_OP(gelu_tanh_and_mul, kGeluTanhAndMul)

ACTIVATION_UNARY_OP(gelu, kGelu)
ACTIVATION_UNARY_OP(gelu_tanh, kGeluTanh)
ACTIVATION_UNARY_OP(silu, kSilu)
ACTIVATION_UNARY_OP(gelu_fast, kGeluFast)
ACTIVATION_UNARY_OP(gelu_new, kGeluNew)
ACTIVATION_UNARY_OP(gelu_quick, kGeluQuick)

void fatrelu_and_mul(at::Tensor& out, const at::Tensor& input, double threshold,
                     std::optional<bool> enable_pdl) {
  gated_fwd("fatrelu_and_mul", GatedAct::kFatreluAndMul, out, input, fatrelu_scalars(threshold),
            pdl::request_of(enable_pdl));
}

void fatrelu_and_mul_bwd(at::Tensor& grad_input, const at::Tensor& grad_out,
                         const at::Tensor& input, double threshold,
                         std::optional<bool> enable_pdl) {
  gated_bwd("fatrelu_and_mul_bwd", GatedAct::kFatreluAndMul, grad_input, grad_out, input,
            fatrelu_scalars(threshold), pdl::request_of(enable_pdl));
}

void swigluoai_and_mul(at::Tensor& out, const at::Tensor& input, double alpha, double limit,
                       std::optional<bool> enable_pdl) {
  gated_fwd("swigluoai_and_mul", GatedAct::kSwigluOaiAndMul, out, input,
            swigluoai_scalars(alpha, limit), pdl::request_of(enable_pdl));
}

void swigluoai_and_mul_bwd(at::Tensor& grad_input, const at::Tensor& grad_out,
                           const at::Tensor& input, double alpha, double limit,
                           std::optional<bool> enable_pdl) {
  gated_bwd("swigluoai_and_mul_bwd", GatedAct::kSwigluOaiAndMul, grad_input, grad_out, input,
            swigluoai_scalars(alpha, limit), pdl::request_of(enable_pdl));
}
