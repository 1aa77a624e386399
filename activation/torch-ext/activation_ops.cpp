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
// (no in-place calls); for two strided views of one buffer this check is conservative and
// rejects views whose address ranges interleave even when no element is shared.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "activation_params.h"
#include "torch_binding.h"

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

// ---- validation ----

// The dtype as Python names it without the "torch." prefix ("float32", "bfloat16", "int64").
// c10::getDtypeNames returns std::string by value in Torch 2.11 and static views in 2.13: copy,
// as a view into the 2.11 temporary dangles (it garbled these messages on CUDA).
std::string dtype_name(at::ScalarType t) { return std::string(c10::getDtypeNames(t).first); }

DType check_dtype(const char* op, const char* name, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kDouble:
      return DType::kFloat64;
    default:
      TORCH_CHECK(false, op, ": ", name, " must be float32, float16, bfloat16 or float64, got ",
                  dtype_name(t.scalar_type()));
  }
}

// `t` must have the dtype and device of `ref`.
void check_like(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " must have the dtype of ",
              ref_name, " (expected ", dtype_name(ref.scalar_type()), ", got ",
              dtype_name(t.scalar_type()), ")");
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " must be on the device of ", ref_name,
              " (expected ", ref.device(), ", got ", t.device(), ")");
}

void check_shape(const char* op, const char* name, const at::Tensor& t,
                 at::IntArrayRef expected, const char* what) {
  TORCH_CHECK(t.sizes() == expected, op, ": ", name, " must have shape ", expected, " (", what,
              "), got ", t.sizes());
}

// Width of the last dimension; a 0-d tensor is one row of one element.
int64_t last_dim(const at::Tensor& t) { return t.dim() == 0 ? 1 : t.size(-1); }

// Element stride between consecutive rows when the leading dimensions of `t` collapse into one,
// else nullopt. Size-1 dimensions do not constrain the layout.
std::optional<int64_t> collapsed_row_stride(const at::Tensor& t) {
  std::optional<int64_t> stride;  // stride of the innermost non-trivial leading dimension
  int64_t next = 0;               // stride the next outer non-trivial dimension must have
  for (int64_t i = t.dim() - 2; i >= 0; --i) {
    if (t.size(i) == 1) {
      continue;
    }
    if (stride && t.stride(i) != next) {
      return std::nullopt;
    }
    if (!stride) {
      stride = t.stride(i);
    }
    next = t.stride(i) * t.size(i);
  }
  return stride ? *stride : last_dim(t);  // at most one row: any stride works
}

bool unit_last_stride(const at::Tensor& t) {
  return t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1;
}

// Checks that the written tensor `t` fits the 2-D view and returns its row stride.
int64_t written_row_stride(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(unit_last_stride(t), op, ": ", name,
              " must have stride 1 along its last dimension, got strides ", t.strides());
  const std::optional<int64_t> stride = collapsed_row_stride(t);
  TORCH_CHECK(stride.has_value(), op, ": ", name,
              " must have leading dimensions that collapse into one row stride (e.g. a "
              "contiguous tensor or a row slice of one), got shape ",
              t.sizes(), " and strides ", t.strides());
  const int64_t width = last_dim(t);
  const int64_t rows = width == 0 ? 0 : t.numel() / width;
  TORCH_CHECK(rows <= 1 || *stride >= width, op, ": ", name,
              " rows must not overlap (expected a row stride >= ", width, ", got ", *stride, ")");
  return *stride;
}

// The read tensor `t` itself when it fits the 2-D view, else a contiguous copy.
at::Tensor readable(const at::Tensor& t) {
  if (unit_last_stride(t) && collapsed_row_stride(t).has_value()) {
    return t;
  }
  return t.contiguous();
}

int64_t read_row_stride(const at::Tensor& t) { return collapsed_row_stride(t).value(); }

// [first, last] byte addresses spanned by a non-empty tensor (strides are never negative).
std::pair<uintptr_t, uintptr_t> byte_span(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t i = 0; i < t.dim(); ++i) {
    last += (t.size(i) - 1) * t.stride(i);
  }
  const auto first = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  return {first, first + static_cast<uintptr_t>((last + 1) * t.element_size()) - 1};
}

// The kernels do not run in place: a written tensor must not share memory with a read one. ATen
// answers exactly for dense tensors; for strided views of one buffer it cannot ("too hard"), and
// then any overlap of the address spans is rejected (conservative).
void check_no_overlap(const char* op, const char* name, const at::Tensor& written,
                      const char* read_name, const at::Tensor& read) {
  if (written.numel() == 0 || read.numel() == 0) {
    return;
  }
  bool overlap = false;
  switch (at::get_overlap_status(written, read)) {
    case at::MemOverlapStatus::Full:
    case at::MemOverlapStatus::Partial:
      overlap = true;
      break;
    case at::MemOverlapStatus::No:
      overlap = false;
      break;
    case at::MemOverlapStatus::TooHard: {
      const auto w = byte_span(written);
      const auto r = byte_span(read);
      overlap = written.is_alias_of(read) && w.first <= r.second && r.first <= w.second;
      break;
    }
    default:
      TORCH_CHECK(false, op, ": unexpected memory overlap status");
  }
  TORCH_CHECK(!overlap, op, ": ", name, " must not share memory with ", read_name,
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

void unary_fwd(const char* op, UnaryAct act, at::Tensor& out, const at::Tensor& input) {
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
  launch(op, input.device(), act, dtype, params);
}

void unary_bwd(const char* op, UnaryAct act, at::Tensor& grad_input, const at::Tensor& grad_out,
               const at::Tensor& input) {
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
  launch(op, input.device(), act, dtype, params);
}

void gated_fwd(const char* op, GatedAct act, at::Tensor& out, const at::Tensor& input,
               const GatedActScalars& scalars) {
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
  launch(op, input.device(), act, dtype, params);
}

void gated_bwd(const char* op, GatedAct act, at::Tensor& grad_input, const at::Tensor& grad_out,
               const at::Tensor& input, const GatedActScalars& scalars) {
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
#define ACTIVATION_GATED_OP(name, act)                                                  \
  void name(at::Tensor& out, const at::Tensor& input) {                                 \
    gated_fwd(#name, GatedAct::act, out, input, GatedActScalars{});                     \
  }                                                                                     \
  void name##_bwd(at::Tensor& grad_input, const at::Tensor& grad_out,                   \
                  const at::Tensor& input) {                                            \
    gated_bwd(#name "_bwd", GatedAct::act, grad_input, grad_out, input, GatedActScalars{}); \
  }

// Unary ops: `name` and `name_bwd`.
#define ACTIVATION_UNARY_OP(name, act)                                                  \
  void name(at::Tensor& out, const at::Tensor& input) {                                 \
    unary_fwd(#name, UnaryAct::act, out, input);                                        \
  }                                                                                     \
  void name##_bwd(at::Tensor& grad_input, const at::Tensor& grad_out,                   \
                  const at::Tensor& input) {                                            \
    unary_bwd(#name "_bwd", UnaryAct::act, grad_input, grad_out, input);                \
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

void fatrelu_and_mul(at::Tensor& out, const at::Tensor& input, double threshold) {
  gated_fwd("fatrelu_and_mul", GatedAct::kFatreluAndMul, out, input, fatrelu_scalars(threshold));
}

void fatrelu_and_mul_bwd(at::Tensor& grad_input, const at::Tensor& grad_out,
                         const at::Tensor& input, double threshold) {
  gated_bwd("fatrelu_and_mul_bwd", GatedAct::kFatreluAndMul, grad_input, grad_out, input,
            fatrelu_scalars(threshold));
}

void swigluoai_and_mul(at::Tensor& out, const at::Tensor& input, double alpha, double limit) {
  gated_fwd("swigluoai_and_mul", GatedAct::kSwigluOaiAndMul, out, input,
            swigluoai_scalars(alpha, limit));
}

void swigluoai_and_mul_bwd(at::Tensor& grad_input, const at::Tensor& grad_out,
                           const at::Tensor& input, double alpha, double limit) {
  gated_bwd("swigluoai_and_mul_bwd", GatedAct::kSwigluOaiAndMul, grad_input, grad_out, input,
            swigluoai_scalars(alpha, limit));
}
